/** Small building blocks of the sidebar: collapsible sections, usage bars, error notes. */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import {
  caretDownIcon,
  caretRightIcon,
  classes,
  HTMLSelect,
  type IHTMLSelectProps
} from '@jupyterlab/ui-components';
import * as React from 'react';

import type { Level } from '../quota';

export function Section(props: {
  id: string;
  title: string;
  open: boolean;
  onToggle: () => void;
  /** Shown at the right of the header, e.g. a count. */
  badge?: string;
  /** The badge as a warning (`--jp-warn-color*`). */
  badgeWarn?: boolean;
  /** The badge's data-testid. */
  badgeTestid?: string;
  children?: React.ReactNode;
}): JSX.Element {
  const Caret = props.open ? caretDownIcon : caretRightIcon;
  return (
    <section
      className={`lf-section${props.open ? ' lf-open' : ''}`}
      data-testid={`lf-section-${props.id}`}
    >
      <button
        type="button"
        className="lf-section-header"
        data-testid={`lf-section-toggle-${props.id}`}
        aria-expanded={props.open}
        onClick={props.onToggle}
      >
        <Caret.react tag="span" className="lf-caret" />
        <span className="lf-section-title">{props.title}</span>
        {props.badge ? (
          <span
            className={classes('lf-section-badge', props.badgeWarn && 'lf-section-badge-warn')}
            data-testid={props.badgeTestid}
          >
            {props.badge}
          </span>
        ) : null}
      </button>
      {props.open ? <div className="lf-section-body">{props.children}</div> : null}
    </section>
  );
}

/** A usage bar: `fraction` of it filled, coloured by level. */
export function Bar(props: {
  label: string;
  fraction: number;
  level: Level;
  /** e.g. "1.5 of 4 cores" */
  text: string;
  testid?: string;
}): JSX.Element {
  const pct = Math.round(Math.min(Math.max(props.fraction, 0), 1) * 100);
  const bounded = props.level !== 'unlimited';
  return (
    <div
      className={`lf-bar lf-level-${props.level}`}
      role="progressbar"
      aria-label={props.label}
      aria-valuemin={0}
      aria-valuemax={100}
      aria-valuenow={bounded ? pct : undefined}
      aria-valuetext={props.text}
      data-testid={props.testid}
      data-level={props.level}
      title={`${props.label}: ${props.text}`}
    >
      <div className="lf-bar-fill" style={{ width: `${bounded ? pct : 0}%` }} />
    </div>
  );
}

export function ErrorNote(props: { message?: string | null; testid?: string }): JSX.Element | null {
  if (!props.message) {
    return null;
  }
  return (
    <div className="lf-error" role="alert" data-testid={props.testid}>
      {props.message}
    </div>
  );
}

export function Empty(props: { children: React.ReactNode; testid?: string }): JSX.Element {
  return (
    <div className="lf-empty" data-testid={props.testid}>
      {props.children}
    </div>
  );
}

/** A labelled row of a definition list. */
export function Item(props: {
  label: string;
  testid: string;
  children: React.ReactNode;
}): JSX.Element {
  return (
    <>
      <dt>{props.label}</dt>
      <dd data-testid={props.testid}>{props.children}</dd>
    </>
  );
}

/**
 * A form field: label above its input, then an optional hint and an error.  The hint's id is
 * `${htmlFor}-help`: give the input `aria-describedby` with it.
 */
export function Field(props: {
  label: string;
  htmlFor?: string;
  error?: string;
  help?: string;
  /** In a `.lf-field-row`: a field that wants more room (a select) than a number input. */
  wide?: boolean;
  children: React.ReactNode;
}): JSX.Element {
  return (
    <div
      className={classes(
        'lf-field',
        props.error && 'lf-field-invalid',
        props.wide && 'lf-field-wide'
      )}
    >
      <label htmlFor={props.htmlFor}>{props.label}</label>
      {props.children}
      {props.help ? (
        <div className="lf-field-help" id={props.htmlFor ? `${props.htmlFor}-help` : undefined}>
          {props.help}
        </div>
      ) : null}
      {props.error ? <div className="lf-field-error">{props.error}</div> : null}
    </div>
  );
}

/** The label an option shows. */
function optionLabel(
  options: IHTMLSelectProps['options'],
  value: IHTMLSelectProps['value']
): string | undefined {
  for (const o of options ?? []) {
    const opt = typeof o === 'object' ? o : { value: o };
    if (String(opt.value) === String(value)) {
      return opt.label ?? String(opt.value);
    }
  }
  return undefined;
}

/**
 * JupyterLab's `HTMLSelect`, as wide as its field: a long choice ends in an ellipsis before
 * the arrow (the whole of it is the select's tooltip) instead of running under it.
 */
export function Select(props: IHTMLSelectProps): JSX.Element {
  const { className, title, ...rest } = props;
  return (
    <HTMLSelect
      {...rest}
      className={classes('lf-select', className)}
      title={title ?? optionLabel(props.options, props.value)}
      // centred in the 28px-high select (the caret is 16px), clear of the right edge
      iconProps={{ top: '6px', right: '6px' }}
    />
  );
}

/** Runs an action, keeping its error (in words) and a busy flag for the button. */
export function useAction(): [
  boolean,
  string | null,
  (fn: () => Promise<unknown>) => Promise<boolean>,
  (e: string | null) => void
] {
  const [busy, setBusy] = React.useState(false);
  const [error, setError] = React.useState<string | null>(null);
  const run = async (fn: () => Promise<unknown>) => {
    setBusy(true);
    setError(null);
    try {
      await fn();
      return true;
    } catch (e) {
      setError((e as Error).message);
      return false;
    } finally {
      setBusy(false);
    }
  };
  return [busy, error, run, setError];
}

/**
 * Scroll to an element (and focus its first field) when `wanted()` says so: a form the Start
 * section or a command opened somewhere down the panel.  `wanted` is asked after each render
 * that has the element, and says yes once (`FleetStore.takeReveal`).
 */
export function useReveal(ref: React.RefObject<HTMLElement>, wanted: () => boolean): void {
  React.useEffect(() => {
    const el = ref.current;
    if (!el || !wanted()) {
      return;
    }
    el.scrollIntoView?.({ block: 'start' });
    el.querySelector<HTMLElement>('input:not([type=hidden]):not([type=checkbox])')?.focus({
      preventScroll: true
    });
  });
}

/** Ask before something that cannot be undone; true when the person agreed. */
export type Confirm = (title: string, body: string, label: string) => Promise<boolean>;

/** JupyterLab's dialog: Cancel, and a warning button with `label`. */
export const confirmDialog: Confirm = async (title, body, label) =>
  (
    await showDialog({
      title,
      body,
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label })]
    })
  ).button.accept;

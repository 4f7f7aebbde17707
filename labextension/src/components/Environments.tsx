/**
 * "My Environments": my environments and my projects' (`labfleet/api/environments` through the
 * session's proxy to the labfleet service) with their owner, base, status and size; build one
 * from a registered base and a requirements.txt (and apt.txt), follow its build log while it
 * runs, delete one.  The list comes with the panel's poll while the section is open; an open log
 * of a build that runs is followed every 2 s (what came after the bytes already read:
 * `?offset=`), and no more once the build is READY or FAILED.
 */
import { Button, InputGroup } from '@jupyterlab/ui-components';
import * as React from 'react';

import {
  baseImages,
  EMPTY_ENVIRONMENT_FORM,
  ENV_LOG_CHUNK_BYTES,
  ENV_LOG_KEEP_BYTES,
  ENV_LOG_POLL_MS,
  environmentBody,
  environmentBuilding,
  environmentMeta,
  environmentStatusClass,
  environmentStatusText,
  type IEnvironmentForm,
  logEnded,
  LogFollower
} from '../environments';
import { formatBytes } from '../format';
import type { FleetStore } from '../store';
import type { IEnvironment } from '../types';
import { type Confirm, confirmDialog, Empty, ErrorNote, Field, Select, useAction } from './common';

/** Whether the log is where someone can see it: the page shown, the panel not hidden. */
function onScreen(el: HTMLElement | null): boolean {
  if (typeof document !== 'undefined' && document.visibilityState === 'hidden') {
    return false;
  }
  return !el?.closest('.lm-mod-hidden');
}

/**
 * An environment's build log, as far as the build got: read when shown, then what came after
 * it every `pollMs` while the build waits or runs (not while the panel or the page is hidden),
 * once more when it ends.  It keeps the last 256 KiB (saying the start was cut), and scrolls with
 * the log unless scrolled up.
 */
function BuildLog(props: { store: FleetStore; env: IEnvironment; pollMs: number }): JSX.Element {
  const { store, env } = props;
  const building = environmentBuilding(env.status);
  const follower = React.useRef<LogFollower | null>(null);
  if (follower.current === null) {
    follower.current = new LogFollower(ENV_LOG_KEEP_BYTES, ENV_LOG_CHUNK_BYTES);
  }
  const [view, setView] = React.useState<{ text: string; cut: boolean } | null>(null);
  const [error, setError] = React.useState<string | null>(null);
  const box = React.useRef<HTMLDivElement>(null);
  const pre = React.useRef<HTMLPreElement>(null);
  const stick = React.useRef(true);
  // A build that started again writes its log anew: read it from the start.  (`X-Log-Size` says
  // so too, where the answer carries it; the session's proxy may not pass it on.)
  const startedAt = env.started_at ?? null;
  const followedStart = React.useRef<string | null | undefined>(undefined);
  React.useEffect(() => {
    const follow = follower.current!;
    if (followedStart.current !== undefined && followedStart.current !== startedAt) {
      follow.restart();
    }
    followedStart.current = startedAt;
    let alive = true;
    let timer: ReturnType<typeof setTimeout> | null = null;
    let askedStatus = false;
    const tick = async () => {
      timer = null;
      let again = building;
      let more = false;
      if (onScreen(box.current)) {
        try {
          // Read on while there is more (a long log comes a chunk at a time), a few rounds a tick.
          more = true;
          for (let round = 0; more && round < 8; round++) {
            const piece = await store.api.environmentLogFrom(env.id, follow.offset, follow.chunk);
            if (!alive) {
              return;
            }
            more = follow.take(piece);
            setView({ text: follow.text, cut: follow.cut });
          }
          setError(null);
          // The build's last line came before the poll saw its status move: ask for it now.
          if (building && !askedStatus && logEnded(follow.text)) {
            askedStatus = true;
            void store.fetch('environments');
          }
        } catch (e) {
          if (!alive) {
            return;
          }
          setError((e as Error).message);
          more = false;
          const status = (e as { status?: number }).status ?? 0;
          // Gone (deleted) or not mine: asking again changes nothing.
          again = again && !(status >= 400 && status < 500);
        }
      }
      if (alive && (again || more)) {
        timer = setTimeout(() => void tick(), more ? 0 : props.pollMs);
      }
    };
    void tick();
    return () => {
      alive = false;
      if (timer !== null) {
        clearTimeout(timer);
      }
    };
  }, [env.id, building, startedAt]);
  React.useLayoutEffect(() => {
    const el = pre.current;
    if (el && stick.current) {
      el.scrollTop = el.scrollHeight;
    }
  }, [view?.text]);
  return (
    <div className="lf-env-log" data-testid="lf-env-log" data-live={building} ref={box}>
      <ErrorNote message={error} testid="lf-env-log-error" />
      {view === null ? (
        error ? null : (
          <Empty>Loading…</Empty>
        )
      ) : view.text ? (
        <>
          {view.cut ? (
            <div className="lf-dim lf-small" data-testid="lf-env-log-cut">
              The start of the log was cut: its last {formatBytes(ENV_LOG_KEEP_BYTES)} are shown.
            </div>
          ) : null}
          <pre
            className="lf-log"
            data-testid="lf-env-log-text"
            ref={pre}
            tabIndex={0}
            aria-label={`Build log of ${env.name}`}
            onScroll={ev => {
              const el = ev.currentTarget;
              stick.current = el.scrollTop + el.clientHeight >= el.scrollHeight - 4;
            }}
          >
            {view.text}
          </pre>
        </>
      ) : (
        <Empty testid="lf-env-log-empty">
          {building ? 'Nothing yet: the build has not started.' : 'No log: nothing was built.'}
        </Empty>
      )}
      {building ? (
        <div className="lf-dim lf-small">
          Refreshed every {props.pollMs / 1000} s while the build runs.
        </div>
      ) : null}
    </div>
  );
}

function EnvironmentItem(props: {
  store: FleetStore;
  env: IEnvironment;
  confirm: Confirm;
  logPollMs: number;
}): JSX.Element {
  const { store, env } = props;
  const [showLog, setShowLog] = React.useState(false);
  const [busy, error, run] = useAction();
  const reason = (env.status_reason ?? '').trim();
  const remove = async () => {
    const agreed = await props.confirm(
      `Delete environment ${env.name}?`,
      environmentBuilding(env.status)
        ? 'Its build stops. This cannot be undone.'
        : 'Sessions can no longer start from it; its image goes unless another environment has it. This cannot be undone.',
      'Delete'
    );
    if (agreed) {
      await run(() => store.deleteEnvironment(env.id));
    }
  };
  return (
    <li
      className="lf-environment"
      data-testid={`lf-env-${env.name}`}
      data-env-id={env.id}
      data-status={env.status}
      data-owner={env.owner}
    >
      <div className="lf-session-head">
        <span className="lf-session-name">{env.name}</span>
        <span
          className={environmentStatusClass(env.status)}
          data-testid="lf-env-status"
          title={environmentStatusText(env)}
        >
          {env.status}
        </span>
      </div>
      <div className="lf-dim lf-session-meta" data-testid="lf-env-meta">
        {environmentMeta(env, store.user)}
      </div>
      {reason ? (
        <div
          className={env.status === 'FAILED' ? 'lf-error lf-small' : 'lf-dim lf-small'}
          data-testid="lf-env-reason"
        >
          {reason}
        </div>
      ) : null}
      <ErrorNote message={error} testid="lf-env-error" />
      {showLog ? <BuildLog store={store} env={env} pollMs={props.logPollMs} /> : null}
      <div className="lf-actions">
        <Button
          small
          minimal={showLog}
          data-testid="lf-env-log-toggle"
          aria-expanded={showLog}
          title={`The build log of ${env.name}`}
          onClick={() => setShowLog(!showLog)}
        >
          {showLog ? 'Hide log' : 'Log'}
        </Button>
        <Button
          small
          className="lf-danger"
          data-testid="lf-env-delete"
          aria-label={`Delete environment ${env.name}`}
          disabled={busy}
          onClick={() => void remove()}
        >
          Delete
        </Button>
      </div>
    </li>
  );
}

function BuildForm(props: { store: FleetStore; onDone: (name: string) => void }): JSX.Element {
  const { store } = props;
  const [form, setForm] = React.useState<IEnvironmentForm>(EMPTY_ENVIRONMENT_FORM);
  const [busy, error, run, setError] = useAction();
  React.useEffect(() => {
    void store.loadLaunchOptions();
  }, []);
  const options = store.data.launchOptions;
  const projects = options?.projects.map(p => p.name) ?? [];
  const bases = baseImages(options, form.project);
  const base = bases.some(b => b.value === form.base) ? form.base : (bases[0]?.value ?? '');
  const set =
    (key: keyof IEnvironmentForm) =>
    (ev: React.ChangeEvent<HTMLInputElement | HTMLSelectElement | HTMLTextAreaElement>) =>
      setForm({ ...form, [key]: ev.currentTarget.value });
  const submit = async (ev: React.FormEvent) => {
    ev.preventDefault();
    let body;
    try {
      body = environmentBody({ ...form, base });
    } catch (err) {
      setError((err as Error).message);
      return;
    }
    if (await run(() => store.createEnvironment(body))) {
      props.onDone(body.name);
    }
  };
  const textarea = (key: 'requirements' | 'apt', id: string, placeholder: string, rows = 4) => (
    <textarea
      id={id}
      className="lf-textarea"
      data-testid={id}
      rows={rows}
      spellCheck={false}
      value={form[key]}
      placeholder={placeholder}
      aria-describedby={`${id}-help`}
      onChange={set(key)}
    />
  );
  return (
    <form className="lf-form" data-testid="lf-env-form" onSubmit={submit}>
      <NameAndOwnerFields
        prefix="lf-env"
        name={form.name}
        project={form.project}
        projects={projects}
        placeholder="e.g. my-torch"
        onName={set('name')}
        onProject={set('project')}
      />
      <Field label="Base image" htmlFor="lf-env-base">
        <Select
          id="lf-env-base"
          data-testid="lf-env-base"
          value={base}
          onChange={set('base')}
          options={bases.length ? bases : [{ value: '', label: options ? 'no base' : 'loading…' }]}
        />
      </Field>
      {options && !bases.length ? (
        <div className="lf-dim lf-small" data-testid="lf-env-no-base">
          No registered image you may build on{form.project ? ` in project ${form.project}` : ''}.
        </div>
      ) : null}
      <Field
        label="requirements.txt"
        htmlFor="lf-env-requirements"
        help="pip packages, one a line; from the site's package index."
      >
        {textarea('requirements', 'lf-env-requirements', 'e.g.\nnumpy==2.1.3\npandas')}
      </Field>
      <details className="lf-details" data-testid="lf-env-more">
        <summary>Debian packages too</summary>
        <Field
          label="apt.txt"
          htmlFor="lf-env-apt"
          help="One a line (name or name=version); installed first."
        >
          {textarea('apt', 'lf-env-apt', 'e.g.\nffmpeg', 3)}
        </Field>
      </details>
      <ErrorNote message={error ?? store.errors.launchOptions} testid="lf-env-form-error" />
      <div className="lf-actions">
        <Button
          type="submit"
          small
          className="lf-primary"
          data-testid="lf-env-submit"
          disabled={busy || !base}
        >
          {busy ? 'Asking…' : 'Build'}
        </Button>
      </div>
    </form>
  );
}

/** The name and owner (personal, or one of my projects) of a new environment: the build form's
 * and Save as environment's. `prefix` names their ids and test ids (`<prefix>-name`, `<prefix>-project`). */
export function NameAndOwnerFields(props: {
  prefix: string;
  name: string;
  project: string;
  projects: string[];
  placeholder: string;
  onName: (ev: React.ChangeEvent<HTMLInputElement>) => void;
  onProject: (ev: React.ChangeEvent<HTMLSelectElement>) => void;
}): JSX.Element {
  const { prefix } = props;
  return (
    <>
      <Field
        label="Name"
        htmlFor={`${prefix}-name`}
        help="Lower-case letters, digits, - and _; sessions offer it by this name."
      >
        <InputGroup
          id={`${prefix}-name`}
          data-testid={`${prefix}-name`}
          value={props.name}
          placeholder={props.placeholder}
          aria-describedby={`${prefix}-name-help`}
          onChange={props.onName}
        />
      </Field>
      <Field label="Owner" htmlFor={`${prefix}-project`}>
        <Select
          id={`${prefix}-project`}
          data-testid={`${prefix}-project`}
          value={props.project}
          onChange={props.onProject}
          options={[
            { value: '', label: 'personal (mine)' },
            ...props.projects.map(p => ({ value: p, label: `project ${p}` }))
          ]}
        />
      </Field>
    </>
  );
}

export function Environments(props: {
  store: FleetStore;
  /** Ask before deleting; JupyterLab's dialog unless given. */
  confirm?: Confirm;
  /** How often an open log of a running build is asked again (ms; tests). */
  logPollMs?: number;
}): JSX.Element {
  const { store } = props;
  const confirm = props.confirm ?? confirmDialog;
  const logPollMs = props.logPollMs ?? ENV_LOG_POLL_MS;
  const envs = store.data.environments;
  const [building, setBuilding] = React.useState(false);
  const [asked, setAsked] = React.useState<string | null>(null);
  const justAsked = asked ? (envs ?? []).find(e => e.name === asked) : undefined;
  return (
    <div className="lf-environments" data-testid="lf-environments">
      <ErrorNote message={store.errors.environments} testid="lf-error-environments" />
      {envs === null ? (
        store.errors.environments ? null : (
          <Empty>Loading…</Empty>
        )
      ) : envs.length ? (
        <ul className="lf-list" data-testid="lf-environments-list">
          {envs.map(e => (
            <EnvironmentItem
              key={e.id}
              store={store}
              env={e}
              confirm={confirm}
              logPollMs={logPollMs}
            />
          ))}
        </ul>
      ) : (
        <Empty testid="lf-environments-empty">
          No environments yet: build one from a base image and a requirements.txt.
        </Empty>
      )}
      {justAsked && environmentBuilding(justAsked.status) ? (
        <div className="lf-info" data-testid="lf-env-asked">
          Environment {justAsked.name} is {justAsked.status}: its log shows the build. Once READY,
          new sessions offer it as an image.
        </div>
      ) : null}
      {building ? (
        <BuildForm
          store={store}
          onDone={name => {
            setBuilding(false);
            setAsked(name);
          }}
        />
      ) : null}
      <div className="lf-actions">
        <Button
          small
          minimal={building}
          data-testid="lf-env-build-toggle"
          aria-expanded={building}
          onClick={() => {
            setAsked(null);
            setBuilding(!building);
          }}
        >
          {building ? 'Cancel' : 'Build an environment…'}
        </Button>
      </div>
    </div>
  );
}

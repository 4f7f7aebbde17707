/**
 * "Save as environment…" in the This session section: the session the Lab runs in (its id from the
 * session info) committed into a new environment of mine or of a project of mine, by name.  A
 * refusal (not a running Docker or Swarm session of mine, a name taken, a limit reached) shows
 * inline in the service's words and changes nothing; once asked, My Environments opens and lists
 * the new one, and the note here says how it stands as the list does (QUEUED, BUILDING, READY,
 * FAILED).
 */
import { Button } from '@jupyterlab/ui-components';
import * as React from 'react';

import {
  EMPTY_SAVE_AS_FORM,
  environmentStatusText,
  type ISaveAsForm,
  saveAsBody
} from '../environments';
import type { FleetStore } from '../store';
import type { IEnvironment } from '../types';
import { ErrorNote, useAction } from './common';
import { NameAndOwnerFields } from './Environments';

function SaveAsForm(props: {
  store: FleetStore;
  sessionId: string;
  onCancel: () => void;
  onDone: (env: IEnvironment) => void;
}): JSX.Element {
  const { store } = props;
  const [form, setForm] = React.useState<ISaveAsForm>(EMPTY_SAVE_AS_FORM);
  const [busy, error, run, setError] = useAction();
  React.useEffect(() => {
    void store.loadLaunchOptions();
  }, []);
  const projects = store.data.launchOptions?.projects.map(p => p.name) ?? [];
  const set =
    (key: keyof ISaveAsForm) => (ev: React.ChangeEvent<HTMLInputElement | HTMLSelectElement>) =>
      setForm({ ...form, [key]: ev.currentTarget.value });
  const submit = async (ev: React.FormEvent) => {
    ev.preventDefault();
    let body;
    try {
      body = saveAsBody(form, props.sessionId);
    } catch (err) {
      setError((err as Error).message);
      return;
    }
    let made: IEnvironment | null = null;
    if (
      await run(async () => {
        made = await store.saveAsEnvironment(body);
      })
    ) {
      props.onDone(made!);
    }
  };
  return (
    <form className="lf-form" data-testid="lf-save-env-form" onSubmit={submit}>
      <div className="lf-dim lf-small" data-testid="lf-save-env-help">
        This session&apos;s container becomes an image: its files and what was installed in it, with
        the base image&apos;s settings (none of the session&apos;s variables). Only a running Docker
        or Swarm session can be saved.
      </div>
      <NameAndOwnerFields
        prefix="lf-save-env"
        name={form.name}
        project={form.project}
        projects={projects}
        placeholder="e.g. my-setup"
        onName={set('name')}
        onProject={set('project')}
      />
      <ErrorNote message={error} testid="lf-save-env-error" />
      <div className="lf-actions">
        <Button
          type="submit"
          small
          className="lf-primary"
          data-testid="lf-save-env-submit"
          disabled={busy}
        >
          {busy ? 'Saving…' : 'Save'}
        </Button>
        <Button small minimal data-testid="lf-save-env-cancel" onClick={props.onCancel}>
          Cancel
        </Button>
      </div>
    </form>
  );
}

/**
 * The form (while `open`) and, once saved, how the new environment stands; the button that opens
 * the form is beside "Stop this session" (ThisSession.tsx).
 */
export function SaveAsEnvironment(props: {
  store: FleetStore;
  /** The session's id (`ISessionInfo.id`). */
  sessionId: string;
  open: boolean;
  onClose: () => void;
}): JSX.Element | null {
  const { store } = props;
  const [saved, setSaved] = React.useState<IEnvironment | null>(null);
  // How it stands, as My Environments lists it (its status moves with the list's poll).
  const listed = saved ? (store.data.environments ?? []).find(e => e.id === saved.id) : undefined;
  const now = listed ?? saved;
  if (!props.open && !now) {
    return null;
  }
  return (
    <div className="lf-save-env" data-testid="lf-save-env">
      {props.open ? (
        <SaveAsForm
          store={store}
          sessionId={props.sessionId}
          onCancel={props.onClose}
          onDone={env => {
            setSaved(env);
            props.onClose();
          }}
        />
      ) : now ? (
        <div
          className={now.status === 'FAILED' ? 'lf-error' : 'lf-info'}
          data-testid="lf-save-env-saved"
          data-status={now.status}
        >
          Saved as {now.name}: {environmentStatusText(now)}. See My Environments.
        </div>
      ) : null}
    </div>
  );
}

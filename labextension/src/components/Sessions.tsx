/** "Sessions": all my sessions (every project) with open / stop, and the "New session" form. */
import { Button } from '@jupyterlab/ui-components';
import * as React from 'react';

import { sessionDisplayName, sessionStatusLabel } from '../sessions';
import { formatSlots } from '../slots';
import type { FleetStore } from '../store';
import type { ISessionSummary } from '../types';
import { Empty, ErrorNote, useReveal } from './common';
import { NewSessionForm } from './NewSessionForm';

function statusClass(status: string): string {
  return `lf-status lf-status-${(status || 'unknown').toLowerCase()}`;
}

function SessionItem(props: {
  session: ISessionSummary;
  onOpen: (s: ISessionSummary) => void;
  onStop: (s: ISessionSummary) => Promise<void>;
}): JSX.Element {
  const s = props.session;
  const [error, setError] = React.useState<string | null>(null);
  const [busy, setBusy] = React.useState(false);
  const stop = async () => {
    setBusy(true);
    setError(null);
    try {
      await props.onStop(s);
    } catch (e) {
      setError((e as Error).message);
    } finally {
      setBusy(false);
    }
  };
  return (
    <li
      className={`lf-session-item${s.current ? ' lf-current' : ''}`}
      data-testid={`lf-session-${s.name === '' ? '~' : s.name}`}
      data-status={s.status}
    >
      <div className="lf-session-head">
        <span className="lf-session-name">
          {sessionDisplayName(s.name)}
          {s.current ? <span className="lf-dim"> (this session)</span> : null}
        </span>
        <span className={statusClass(s.status)} data-testid="lf-session-status">
          {sessionStatusLabel(s)}
        </span>
      </div>
      <div className="lf-session-meta lf-dim">
        {[s.project, s.type, s.image, formatSlots(s.slots)].filter(Boolean).join(' · ')}
      </div>
      <ErrorNote message={error} testid="lf-session-error" />
      <div className="lf-actions">
        {s.url && !s.current ? (
          <Button
            small
            data-testid="lf-session-open"
            disabled={s.status !== 'RUNNING'}
            onClick={() => props.onOpen(s)}
          >
            Open
          </Button>
        ) : null}
        {s.endpoint ? (
          // A serving replica: the controller would only start it again; the endpoint is scaled.
          <span className="lf-dim lf-small" data-testid="lf-session-replica">
            replica of endpoint {s.endpoint}: scale it under Serving
          </span>
        ) : (
          <Button
            small
            className="lf-danger"
            data-testid="lf-session-stop"
            disabled={busy}
            onClick={() => void stop()}
          >
            {busy ? 'Stopping…' : 'Stop'}
          </Button>
        )}
      </div>
    </li>
  );
}

export function Sessions(props: {
  store: FleetStore;
  onOpen: (s: ISessionSummary) => void;
  /** Asks first; resolves when stopped or cancelled, rejects with the service's error. */
  onStop: (s: ISessionSummary) => Promise<void>;
}): JSX.Element {
  const { store } = props;
  const list = store.data.sessions;
  const error = store.errors.sessions;
  const [started, setStarted] = React.useState<string | null>(null);
  const formRef = React.useRef<HTMLDivElement>(null);
  // Opened from the Start section (or the command): the form comes into view.
  useReveal(formRef, () => store.takeReveal('new-session'));
  // The note stays only until the new session is listed: from then on its row says how it stands.
  const listed = started !== null && !!list?.some(s => s.name === started);
  React.useEffect(() => {
    if (listed) {
      setStarted(null);
    }
  }, [listed]);
  return (
    <div className="lf-sessions" data-testid="lf-sessions">
      <ErrorNote message={error} testid="lf-error-sessions" />
      {list === null ? (
        error ? null : (
          <Empty>Loading…</Empty>
        )
      ) : list.length ? (
        <ul className="lf-list" data-testid="lf-sessions-list">
          {list.map(s => (
            <SessionItem
              key={`${s.name}:${s.id ?? ''}`}
              session={s}
              onOpen={props.onOpen}
              onStop={props.onStop}
            />
          ))}
        </ul>
      ) : (
        <Empty>No sessions.</Empty>
      )}
      {started && !listed ? (
        <div className="lf-info" data-testid="lf-ns-started">
          Session {started} was asked for: it shows above as it starts.
        </div>
      ) : null}
      {store.newSessionOpen ? (
        <div ref={formRef} className="lf-reveal">
          <NewSessionForm
            store={store}
            onDone={name => {
              setStarted(name);
              store.newSessionOpen = false;
            }}
            onCancel={() => {
              store.newSessionOpen = false;
            }}
          />
        </div>
      ) : (
        <div className="lf-actions">
          <Button
            small
            className="lf-primary"
            data-testid="lf-new-session-toggle"
            onClick={() => {
              setStarted(null);
              store.newSessionOpen = true;
            }}
          >
            New session…
          </Button>
        </div>
      )}
    </div>
  );
}

/**
 * "This session": what runs here, on which devices, for how long, "Save as environment…" (its
 * container committed into a new environment) and a stop button; in the last minutes before an
 * idle reclamation, a warning with a countdown first.
 */
import { Button } from '@jupyterlab/ui-components';
import * as React from 'react';

import { formatDuration } from '../format';
import { timeLeftLevel, timeLeftNow } from '../sessions';
import { deviceLabel, formatSlots, gpuShareLabel } from '../slots';
import type { FleetStore } from '../store';
import { Empty, ErrorNote, Item } from './common';
import { IdleWarning } from './IdleWarning';
import { SaveAsEnvironment } from './SaveAsEnvironment';

export function ThisSession(props: { store: FleetStore; onStop: () => void }): JSX.Element {
  const { store } = props;
  const s = store.data.session;
  const error = store.errors.session;
  const [saving, setSaving] = React.useState(false);
  if (!s) {
    return (
      <>
        <ErrorNote message={error} testid="lf-error-session" />
        {error ? null : <Empty>Loading…</Empty>}
      </>
    );
  }
  const elapsed = (store.now() - store.sessionReceivedAt) / 1000;
  const left = timeLeftNow(s.time_left, elapsed);
  const uptime = s.uptime === null ? null : s.uptime + Math.max(elapsed, 0);
  const level = timeLeftLevel(left, s.max_lifetime);
  return (
    <div className="lf-this-session" data-testid="lf-this-session">
      <ErrorNote message={error} testid="lf-error-session" />
      <IdleWarning store={store} />
      <dl className="lf-facts">
        <Item label="Project" testid="lf-this-project">
          {s.project ?? '–'}
        </Item>
        <Item label="Type" testid="lf-this-type">
          {s.type}
          {s.status && s.status !== 'RUNNING' ? ` (${s.status})` : ''}
        </Item>
        <Item label="Image" testid="lf-this-image">
          {s.image ?? '–'}
        </Item>
        <Item label="Resources" testid="lf-this-resources">
          {formatSlots(s.slots)}
          {s.resource_group ? ` in ${s.resource_group}` : ''}
        </Item>
        <Item label="Devices" testid="lf-this-devices">
          {s.devices?.length ? (
            <ul className="lf-devices">
              {s.devices.map(d => (
                <li key={d.uuid ?? d.index} className="lf-device">
                  {deviceLabel(d)}
                </li>
              ))}
            </ul>
          ) : (
            'no GPU'
          )}
        </Item>
        {s.gpu_share ? (
          <Item label="GPU share" testid="lf-this-gpu-share">
            {gpuShareLabel(s.gpu_share)}
          </Item>
        ) : null}
        <Item label="Uptime" testid="lf-this-uptime">
          {uptime === null ? '–' : formatDuration(uptime)}
        </Item>
        <Item label="Time left" testid="lf-this-time-left">
          <span className={`lf-level-text lf-level-${level}`}>{formatDuration(left)}</span>
        </Item>
      </dl>
      {s.service && s.service !== 'ok' ? (
        <div className="lf-note" data-testid="lf-this-service">
          The labfleet service did not answer: {s.service}
        </div>
      ) : null}
      {s.runner ? (
        <div className="lf-note" data-testid="lf-this-runner">
          {s.type} command: {s.runner.state ?? 'unknown'}
          {s.runner.exit_code !== null && s.runner.exit_code !== undefined
            ? ` (exit code ${s.runner.exit_code})`
            : ''}
        </div>
      ) : null}
      {s.inference?.url ? (
        <div className="lf-note" data-testid="lf-this-inference">
          Endpoint {s.inference.ready ? 'ready' : 'starting'}: <code>{s.inference.url}</code>
        </div>
      ) : null}
      {s.id ? (
        <SaveAsEnvironment
          store={store}
          sessionId={s.id}
          open={saving}
          onClose={() => setSaving(false)}
        />
      ) : null}
      <div className="lf-actions">
        {s.id && !saving ? (
          <Button
            small
            data-testid="lf-save-env-toggle"
            title="Save this session's container as a new environment"
            onClick={() => setSaving(true)}
          >
            Save as environment…
          </Button>
        ) : null}
        <Button
          className="lf-danger"
          data-testid="lf-stop-this"
          small
          onClick={props.onStop}
          title="Stop this session (asks first)"
        >
          Stop this session
        </Button>
      </div>
    </div>
  );
}

/**
 * "Quota": used / left per slot for me (my keypair), this session's project and my domain; and
 * beside what the quota allows, what the fleet can give one session now in each resource group I
 * may use (the launch options' `free_now`, this session's group first).
 */
import * as React from 'react';

import { formatQuotaRow, quotaRows } from '../quota';
import { freeNowLines } from '../sessions';
import { slotLabel } from '../slots';
import type { FleetStore } from '../store';
import type { IQuotaScope } from '../types';
import { Bar, Empty, ErrorNote } from './common';

function Scope(props: {
  id: string;
  title: string;
  scope: IQuotaScope | null;
  warnRatio: number;
}): JSX.Element {
  const rows = props.scope ? quotaRows(props.scope, props.warnRatio) : [];
  return (
    <div className="lf-quota-scope" data-testid={`lf-quota-${props.id}`}>
      <div className="lf-subtitle">{props.title}</div>
      {!props.scope ? (
        <Empty>not known</Empty>
      ) : !rows.length ? (
        <Empty>no limits</Empty>
      ) : (
        rows.map(r => {
          const text = formatQuotaRow(r);
          return (
            <div
              className="lf-quota-row"
              key={r.slot}
              data-slot={r.slot}
              data-testid={`lf-quota-${props.id}-${r.slot}`}
            >
              <div className="lf-quota-label">
                <span>{slotLabel(r.slot)}</span>
                <span className={`lf-quota-text lf-level-text lf-level-${r.level}`}>{text}</span>
              </div>
              <Bar
                label={`${props.title} ${slotLabel(r.slot)}`}
                fraction={r.fraction}
                level={r.level}
                text={text}
              />
            </div>
          );
        })
      )}
    </div>
  );
}

/** What one session could get now in each resource group, beside what the quota allows. */
function FreeNow(props: { store: FleetStore }): JSX.Element | null {
  const { store } = props;
  const opts = store.data.launchOptions;
  const error = store.errors.launchOptions;
  if (!opts && !error) {
    return null; // asked with the quota: a moment
  }
  const lines = freeNowLines(opts?.resource_groups, store.data.session?.resource_group);
  return (
    <div
      className="lf-quota-scope"
      data-testid="lf-quota-free"
      title="What one session could get now: the most one node of the group has free. The quota says what you may still ask."
    >
      <div className="lf-subtitle">Fleet</div>
      {!opts ? (
        <Empty testid="lf-quota-free-unknown">free capacity not known: {error}</Empty>
      ) : !lines.length ? (
        <Empty>no resource group to use</Empty>
      ) : (
        lines.map(l => (
          <div
            className="lf-dim"
            key={l.group}
            data-group={l.group}
            data-own={l.own ? 'true' : undefined}
            data-testid={`lf-quota-free-${l.group}`}
          >
            {l.text}
          </div>
        ))
      )}
    </div>
  );
}

export function Quota(props: { store: FleetStore }): JSX.Element {
  const { store } = props;
  const q = store.data.quota;
  const error = store.errors.quota;
  const domain = store.data.session?.domain;
  return (
    <div className="lf-quota" data-testid="lf-quota">
      <ErrorNote message={error} testid="lf-error-quota" />
      {!q ? (
        error ? null : (
          <Empty>Loading…</Empty>
        )
      ) : (
        <>
          <Scope id="keypair" title="Me" scope={q.keypair} warnRatio={store.warnRatio} />
          <Scope
            id="project"
            title={`Project ${q.project_name ?? ''}`.trim()}
            scope={q.project}
            warnRatio={store.warnRatio}
          />
          <Scope
            id="domain"
            title={`Domain ${domain ?? ''}`.trim()}
            scope={q.domain}
            warnRatio={store.warnRatio}
          />
        </>
      )}
      <FreeNow store={store} />
    </div>
  );
}

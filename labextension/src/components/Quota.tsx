/** "Quota": used / left per slot for me (my keypair), this session's project and my domain. */
import * as React from 'react';

import { formatQuotaRow, quotaRows } from '../quota';
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
    </div>
  );
}

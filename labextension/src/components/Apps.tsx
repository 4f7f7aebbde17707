/** "Apps": the app services of this session, each opening in a new tab through the proxy. */
import { Button, launchIcon } from '@jupyterlab/ui-components';
import * as React from 'react';

import type { FleetStore } from '../store';
import type { IApp } from '../types';
import { Empty, ErrorNote } from './common';

export function Apps(props: { store: FleetStore; onOpen: (app: IApp) => void }): JSX.Element {
  const { store } = props;
  const apps = store.data.apps;
  const error = store.errors.apps;
  return (
    <div className="lf-apps" data-testid="lf-apps">
      <ErrorNote message={error} testid="lf-error-apps" />
      {apps === null ? (
        error ? null : (
          <Empty>Loading…</Empty>
        )
      ) : apps.length ? (
        <ul className="lf-list lf-app-list">
          {apps.map(a => (
            <li key={a.name} className="lf-app">
              <Button
                small
                minimal
                className="lf-app-button"
                data-testid={`lf-app-${a.name}`}
                title={`Open ${a.title} in a new tab`}
                onClick={() => props.onOpen(a)}
              >
                <launchIcon.react tag="span" className="lf-app-icon" />
                <span>{a.title || a.name}</span>
                {a.source === 'image' ? <span className="lf-dim"> (image port)</span> : null}
              </Button>
            </li>
          ))}
        </ul>
      ) : (
        <Empty>No apps in this session.</Empty>
      )}
    </div>
  );
}

/**
 * The "Fleet" sidebar: one ReactWidget with collapsible sections, refreshed by a poll that
 * stands by while the panel or the browser tab is hidden.
 */
import { ReactWidget, ToolbarButtonComponent, refreshIcon } from '@jupyterlab/ui-components';
import { Poll } from '@lumino/polling';
import type { Message } from '@lumino/messaging';
import * as React from 'react';

import { AnnouncementBanner } from './components/Announcement';
import { Apps } from './components/Apps';
import { Section } from './components/common';
import { Environments } from './components/Environments';
import { Folders } from './components/Folders';
import { Quota } from './components/Quota';
import { Serving } from './components/Serving';
import { Sessions } from './components/Sessions';
import { Start } from './components/Start';
import { ThisSession } from './components/ThisSession';
import { Usage } from './components/Usage';
import { fleetIcon } from './icons';
import type { IdleWatch } from './idle';
import { idleWarning } from './idlewarning';
import type { FleetStore, SectionId } from './store';
import type { IApp, ISessionSummary } from './types';

/** What the panel asks the application to do (index.ts: dialogs, tabs, the file browser). */
export interface IFleetActions {
  /** Ask, then stop the session this page runs in. */
  stopThisSession(): Promise<void>;
  /** Ask, then stop another session; rejects with the service's error. */
  stopSession(s: ISessionSummary): Promise<void>;
  openSession(s: ISessionSummary): void;
  /** Show a path (relative to the Lab root) in the file browser. */
  openFolder(path: string): void;
  openApp(app: IApp): void;
  /** Open a file (or show a folder) at a path relative to the Lab root; default: `openFolder`. */
  openPath?(path: string): void;
  /** Open a URL in a new browser tab (the Hub's import page); default: `window.open`. */
  openTab?(url: string): void;
  /** Open the Chat panel of a serving endpoint. */
  openChat?(endpoint: string): void;
  /** Open the Model Store (shared model folders). */
  openModelStore?(): void;
}

const TITLES: Record<SectionId, string> = {
  start: 'Start',
  session: 'This session',
  quota: 'Quota',
  usage: 'Usage',
  sessions: 'Sessions',
  environments: 'My Environments',
  folders: 'Folders',
  apps: 'Apps',
  serving: 'Serving'
};

function count(list: unknown[] | null): string | undefined {
  return list ? String(list.length) : undefined;
}

export function FleetPanel(props: {
  store: FleetStore;
  actions: IFleetActions;
  onRefresh: () => void;
}): JSX.Element {
  const { store, actions } = props;
  const d = store.data;
  const idle = idleWarning(d.session?.idle, store.idleSecondsLeft());
  const section = (id: SectionId, badge: string | undefined, body: React.ReactNode) => (
    <Section
      id={id}
      title={TITLES[id]}
      open={store.isOpen(id)}
      onToggle={() => store.toggle(id)}
      badge={badge}
      badgeWarn={id === 'session' && idle !== null}
      badgeTestid={`lf-section-badge-${id}`}
    >
      {body}
    </Section>
  );
  const pending = (d.invitations ?? []).filter(
    i => i.state === 'pending' && i.invitee === store.user
  ).length;
  return (
    <div className="lf-panel" data-testid="lf-sidebar">
      <div className="lf-header">
        <span className="lf-header-title">Fleet</span>
        <ToolbarButtonComponent
          icon={refreshIcon}
          tooltip="Refresh"
          onClick={props.onRefresh}
          dataset={{ testid: 'lf-refresh' }}
        />
      </div>
      <AnnouncementBanner announcement={d.announcement} />
      {section(
        'start',
        store.imports.running ? 'importing…' : undefined,
        <Start
          store={store}
          onOpenPath={path => (actions.openPath ?? actions.openFolder)(path)}
          onOpenTab={url =>
            actions.openTab ? actions.openTab(url) : window.open(url, '_blank', 'noopener')
          }
        />
      )}
      {section(
        'session',
        idle ? idle.short : (d.session?.status ?? undefined),
        <ThisSession store={store} onStop={() => void actions.stopThisSession()} />
      )}
      {section('quota', undefined, <Quota store={store} />)}
      {section('usage', undefined, <Usage store={store} />)}
      {section(
        'sessions',
        count(d.sessions),
        <Sessions store={store} onOpen={actions.openSession} onStop={actions.stopSession} />
      )}
      {section('environments', count(d.environments), <Environments store={store} />)}
      {section(
        'folders',
        pending
          ? `${count(d.folders) ?? ''} · ${pending} invited`.replace(/^ · /, '')
          : count(d.folders),
        <Folders store={store} onOpen={actions.openFolder} />
      )}
      {section('apps', count(d.apps), <Apps store={store} onOpen={actions.openApp} />)}
      {section(
        'serving',
        count(d.endpoints),
        <Serving
          store={store}
          onChat={actions.openChat ? name => actions.openChat?.(name) : undefined}
          onModelStore={actions.openModelStore ? () => actions.openModelStore?.() : undefined}
        />
      )}
    </div>
  );
}

export class FleetSidebar extends ReactWidget {
  /**
   * @param idle the idle countdown: its ticks redraw the panel in the last minutes before an
   *   idle reclamation.
   */
  constructor(store: FleetStore, actions: IFleetActions, intervalMs: number, idle?: IdleWatch) {
    super();
    this.store = store;
    this._actions = actions;
    this.id = 'labfleet-sidebar';
    this.addClass('lf-sidebar');
    this.title.icon = fleetIcon;
    this.title.caption =
      'Fleet: start (import from a URL), this session, quotas, usage, sessions, my environments, folders, apps, serving';
    // Focusable (not in the tab order) so that opening the panel from the keyboard (status
    // bar item, command palette) puts focus into it.
    this.node.tabIndex = -1;
    store.changed.connect(() => this.update(), this);
    idle?.changed.connect(() => this.update(), this);
    this._poll = new Poll({
      factory: () => store.refresh(),
      frequency: { interval: intervalMs, backoff: true, max: 10 * intervalMs },
      name: '@labfleet/labextension:sidebar',
      // No requests while nobody looks: the panel is collapsed or the tab is in the background.
      standby: () => !this.isVisible || 'when-hidden'
    });
  }

  readonly store: FleetStore;

  /** The refresh interval (settings). */
  set intervalMs(ms: number) {
    this._poll.frequency = { ...this._poll.frequency, interval: ms, max: 10 * ms };
  }

  /** Ask for everything the open sections show now, the slow-changing usage included. */
  refresh(): Promise<void> {
    this.store.invalidate();
    return this._poll.refresh();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._poll.dispose();
    super.dispose();
  }

  protected onActivateRequest(msg: Message): void {
    super.onActivateRequest(msg);
    if (this.isAttached && !this.node.contains(document.activeElement)) {
      this.node.focus();
    }
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    void this._poll.refresh();
  }

  protected render(): JSX.Element {
    return (
      <FleetPanel
        store={this.store}
        actions={this._actions}
        onRefresh={() => void this.refresh()}
      />
    );
  }

  private _actions: IFleetActions;
  private _poll: Poll;
}

/**
 * The status bar item: this session's GPU, CPU and memory use, with a tooltip per device; in
 * the last minutes before an idle reclamation, a countdown to it as well.
 * The whole item is one button (mouse, Enter, Space) that opens the Fleet panel.
 */
import { ReactWidget } from '@jupyterlab/ui-components';
import { Poll } from '@lumino/polling';
import * as React from 'react';

import type { FleetAPI } from './api';
import { fleetIcon } from './icons';
import type { IdleWatch } from './idle';
import type { IIdleWarning } from './idlewarning';
import { quotaLevel } from './quota';
import { usageSummary, usageTooltip } from './usage';
import type { IUsage } from './types';

export class UsageStatus extends ReactWidget {
  /**
   * @param onActivate what a click, Enter or Space on the item does (index.ts: run the
   *   command that opens the Fleet panel).
   * @param idle the idle countdown, shown in its last minutes.
   */
  constructor(api: FleetAPI, intervalMs: number, onActivate: () => void, idle?: IdleWatch) {
    super();
    this._api = api;
    this._onActivate = onActivate;
    this._idle = idle ?? null;
    idle?.changed.connect(() => this.update(), this);
    // jp-mod-highlighted: the status bar's own hover look for items that do something.
    this.addClass('lf-statusbar');
    this.addClass('jp-mod-highlighted');
    // The widget's node (the status bar's whole item, padding included) is the button, so a
    // click anywhere on the item counts, not only on its text.
    const node = this.node;
    node.tabIndex = 0;
    node.setAttribute('role', 'button');
    node.setAttribute('aria-label', UsageStatus.ariaLabel(null, null));
    node.addEventListener('click', this._onClick);
    node.addEventListener('keydown', this._onKeyDown);
    this._poll = new Poll({
      factory: () => this._load(),
      frequency: { interval: intervalMs, backoff: true, max: 10 * intervalMs },
      name: '@labfleet/labextension:usage',
      standby: 'when-hidden'
    });
    void this._poll.refresh();
  }

  /** What a screen reader says for the item: what it does, then what it shows. */
  static ariaLabel(
    usage: IUsage | null,
    error: string | null,
    idle: IIdleWarning | null = null
  ): string {
    const what = error
      ? `usage unavailable: ${error}`
      : usage
        ? `usage ${usageSummary(usage)}`
        : 'no usage yet';
    // Minutes, not the seconds that tick: the label is not re-read every second.
    const warn = idle
      ? idle.secondsLeft > 0
        ? `; stopped for inactivity in about ${Math.max(1, Math.round(idle.secondsLeft / 60))} min`
        : '; about to be stopped for inactivity'
      : '';
    return `Open the Fleet panel (labfleet ${what}${warn})`;
  }

  set intervalMs(ms: number) {
    this._poll.frequency = { ...this._poll.frequency, interval: ms, max: 10 * ms };
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this.node.removeEventListener('click', this._onClick);
    this.node.removeEventListener('keydown', this._onKeyDown);
    this._poll.dispose();
    super.dispose();
  }

  protected render(): JSX.Element {
    const u = this._usage;
    const idle = this._idle?.warning ?? null;
    const tooltip = this._error ? `labfleet usage: ${this._error}` : usageTooltip(u);
    this.node.setAttribute('aria-label', UsageStatus.ariaLabel(u, this._error, idle));
    // The busiest device's memory decides the colour: a session near its share's limit
    // is about to be stopped by the framework's allocator.
    const level = (u?.gpus ?? []).reduce<string>((worst, g) => {
      const cap = g.memory_limit ?? g.memory_total;
      const l = cap ? quotaLevel(g.memory_used ?? 0, cap) : 'ok';
      return l === 'over' || (l === 'warn' && worst !== 'over') ? l : worst;
    }, 'ok');
    return (
      <div
        className={`lf-statusbar-item lf-level-text lf-level-${this._error ? 'none' : level}`}
        data-testid="lf-statusbar"
        title={tooltip}
      >
        <fleetIcon.react tag="span" className="lf-statusbar-icon" />
        <span>{this._error ? 'labfleet: –' : usageSummary(u)}</span>
        {idle ? (
          <span
            className="lf-statusbar-idle"
            data-testid="lf-statusbar-idle"
            title={`${idle.title}. ${idle.why}`}
          >
            {idle.short}
          </span>
        ) : null}
      </div>
    );
  }

  private async _load(): Promise<void> {
    try {
      this._usage = await this._api.usage();
      this._error = null;
    } catch (e) {
      this._error = (e as Error).message;
    }
    this.update();
  }

  private _onClick = (event: MouseEvent): void => {
    if (event.button !== 0) {
      return;
    }
    this._onActivate();
  };

  private _onKeyDown = (event: KeyboardEvent): void => {
    if (event.target !== this.node || event.altKey || event.ctrlKey || event.metaKey) {
      return;
    }
    if (event.key === 'Enter' || event.key === ' ' || event.key === 'Spacebar') {
      // Space would scroll the page; neither key should reach JupyterLab's shortcuts.
      event.preventDefault();
      event.stopPropagation();
      this._onActivate();
    }
  };

  private _api: FleetAPI;
  private _idle: IdleWatch | null;
  private _onActivate: () => void;
  private _poll: Poll;
  private _usage: IUsage | null = null;
  private _error: string | null = null;
}

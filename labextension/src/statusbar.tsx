/** The status bar item: this session's GPU, CPU and memory use, with a tooltip per device. */
import { ReactWidget } from '@jupyterlab/ui-components';
import { Poll } from '@lumino/polling';
import * as React from 'react';

import type { FleetAPI } from './api';
import { fleetIcon } from './icons';
import { quotaLevel, usageSummary, usageTooltip } from './model';
import type { IUsage } from './types';

export class UsageStatus extends ReactWidget {
  constructor(api: FleetAPI, intervalMs: number, onClick: () => void) {
    super();
    this._api = api;
    this._onClick = onClick;
    this.addClass('lf-statusbar');
    this._poll = new Poll({
      factory: () => this._load(),
      frequency: { interval: intervalMs, backoff: true, max: 10 * intervalMs },
      name: '@labfleet/labextension:usage',
      standby: 'when-hidden'
    });
    void this._poll.refresh();
  }

  set intervalMs(ms: number) {
    this._poll.frequency = { ...this._poll.frequency, interval: ms, max: 10 * ms };
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._poll.dispose();
    super.dispose();
  }

  protected render(): JSX.Element {
    const u = this._usage;
    const tooltip = this._error ? `labfleet usage: ${this._error}` : usageTooltip(u);
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
        onClick={this._onClick}
      >
        <fleetIcon.react tag="span" className="lf-statusbar-icon" />
        <span>{this._error ? 'labfleet: –' : usageSummary(u)}</span>
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

  private _api: FleetAPI;
  private _onClick: () => void;
  private _poll: Poll;
  private _usage: IUsage | null = null;
  private _error: string | null = null;
}

/**
 * "Warn first": the countdown to this session's idle reclamation and its notifications.
 *
 * The deadline is the session info's `idle.reclaim_at` (the store's, whoever fetched it); the
 * countdown is counted here from it and the clock, one tick a second in the last
 * `IDLE_WARN_S` seconds only (no request per tick).  At 5 and at 1 minute before it a
 * JupyterLab notification says so, each once per deadline (again only after the deadline moved
 * further away than its mark), with an "I'm still here" action.
 *
 * The sidebar asks for the session info while it is open; a slow poll of its own keeps the
 * info fresh for the status bar and the notifications while it is closed, and one more request
 * checks the deadline before a notification goes out.
 */
import { Notification } from '@jupyterlab/apputils';
import type { IDisposable } from '@lumino/disposable';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import {
  IDLE_NOTIFY_S,
  IDLE_WARN_S,
  idleNotificationDue,
  idleNotificationText,
  idleWarning,
  type IIdleWarning
} from './idlewarning';
import type { FleetStore } from './store';

/** How often the session info is asked for while no one else asks (ms). */
export const IDLE_REFRESH_MS = 30_000;

/** A notification goes out on session info at most this old (ms); else it is asked for first. */
export const IDLE_CONFIRM_MS = 10_000;

/** What the watch needs of JupyterLab's notifications (tests may pass their own). */
export interface INotifier {
  warning(message: string, options: Notification.IOptions<any>): string;
  error(message: string, options: Notification.IOptions<any>): string;
  dismiss(id: string): void;
}

const LAB_NOTIFIER: INotifier = {
  warning: (message, options) => Notification.warning(message, options),
  error: (message, options) => Notification.error(message, options),
  dismiss: id => Notification.dismiss(id)
};

export interface IIdleWatchOptions {
  notifier?: INotifier;
  /** The session info's refresh interval while nobody else refreshes it (ms). */
  refreshMs?: number;
}

export class IdleWatch implements IDisposable {
  constructor(store: FleetStore, options: IIdleWatchOptions = {}) {
    this.store = store;
    this._notifier = options.notifier ?? LAB_NOTIFIER;
    const refreshMs = options.refreshMs ?? IDLE_REFRESH_MS;
    store.changed.connect(this._update, this);
    this._poll = new Poll({
      factory: async () => {
        const asked = store.askedAt('session');
        if (asked === null || store.now() - asked >= refreshMs - 1000) {
          await store.fetch('session');
        }
      },
      frequency: { interval: refreshMs, backoff: true, max: 10 * refreshMs },
      name: '@labfleet/labextension:idle',
      standby: 'when-hidden'
    });
    this._update();
    void this._poll.refresh();
  }

  readonly store: FleetStore;

  /** Emitted on every tick of the countdown and whenever the warning changes. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** The warning to show now; null outside the last `IDLE_WARN_S` seconds. */
  get warning(): IIdleWarning | null {
    return idleWarning(this.store.data.session?.idle, this.store.idleSecondsLeft());
  }

  /** The notifications' thresholds (seconds) already given for the present deadline. */
  get notified(): number[] {
    return [...this._fired.keys()].sort((a, b) => b - a);
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  /** "I'm still here" from a notification: a failure becomes a notification of its own. */
  async stillHere(): Promise<void> {
    try {
      await this.store.stillHere();
    } catch (e) {
      this._notifier.error(
        `Could not tell the labfleet service that you are still here: ${(e as Error).message}`,
        { autoClose: false }
      );
    }
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._clearTimer();
    this._poll.dispose();
    this.store.changed.disconnect(this._update, this);
    Signal.clearData(this);
  }

  /** Re-judge now: notifications, then the next tick. */
  private _update(): void {
    if (this._disposed) {
      return;
    }
    const left = this.store.idleSecondsLeft();
    this._rearm(left);
    this._notify(left);
    this._schedule(left);
    this._changed.emit();
  }

  /** A deadline that moved past a mark (or went) gives that mark's notification again. */
  private _rearm(left: number | null): void {
    for (const [mark, id] of [...this._fired.entries()]) {
      if (left === null || left > mark) {
        this._fired.delete(mark);
        if (id) {
          this._notifier.dismiss(id);
        }
      }
    }
  }

  private _notify(left: number | null): void {
    const mark = idleNotificationDue(left, [...this._fired.keys()]);
    if (mark === null || left === null) {
      return;
    }
    // Before telling the user, make sure the deadline still stands (activity may have moved it):
    // on an answer from the last few seconds, else after asking again (its answer re-judges).
    const store = this.store;
    const now = store.now();
    if (now - store.sessionReceivedAt > IDLE_CONFIRM_MS) {
      if (store.isFetching('session')) {
        return;
      }
      const asked = store.askedAt('session');
      if (asked === null || now - asked > IDLE_CONFIRM_MS) {
        void store.fetch('session');
        return;
      }
      // Asked lately and not answered: warn on what is known.
    }
    const idle = this.store.data.session?.idle;
    const deadline = this.store.idleDeadline();
    if (!idle || deadline === null) {
      return;
    }
    const id = this._notifier.warning(
      idleNotificationText(left, new Date(deadline), idle.only_when_queue_waiting === true),
      {
        autoClose: false,
        actions: [
          {
            label: "I'm still here",
            caption: 'Count as activity now: the idle timer starts again',
            displayType: 'accent',
            callback: () => void this.stillHere()
          }
        ]
      }
    );
    // This one says what the earlier ones said, closer: they go; every mark up to it is given.
    for (const [other, otherId] of this._fired.entries()) {
      if (otherId) {
        this._notifier.dismiss(otherId);
        this._fired.set(other, '');
      }
    }
    for (const m of IDLE_NOTIFY_S) {
      if (m >= mark && !this._fired.has(m)) {
        this._fired.set(m, m === mark ? id : '');
      }
    }
  }

  /** A tick at the next whole second of the countdown inside the window, else at its start. */
  private _schedule(left: number | null): void {
    this._clearTimer();
    if (left === null) {
      return;
    }
    let ms: number;
    if (left >= IDLE_WARN_S) {
      // Just inside the window: the countdown starts below 10:00.
      ms = (left - IDLE_WARN_S) * 1000 + 1;
    } else if (left > 0) {
      // The countdown shows whole seconds rounded up: it changes when `left` reaches one.
      const frac = (left * 1000) % 1000;
      ms = Math.max(frac === 0 ? 1000 : frac, 1);
    } else {
      return; // due: the poll tells what happened
    }
    this._timer = setTimeout(() => {
      this._timer = null;
      this._update();
    }, ms);
  }

  private _clearTimer(): void {
    if (this._timer !== null) {
      clearTimeout(this._timer);
      this._timer = null;
    }
  }

  private _notifier: INotifier;
  private _poll: Poll;
  private _timer: ReturnType<typeof setTimeout> | null = null;
  /** mark (s) → the id of its notification ('' when closed or never shown). */
  private _fired = new Map<number, string>();
  private _disposed = false;
  private _changed = new Signal<this, void>(this);
}

/**
 * One import from the Start section, followed to its end: `POST labfleet/api/imports`, then
 * `GET labfleet/api/imports/<id>` every second until it is done or failed.  It lives in the
 * store, so that collapsing the section (or re-rendering the panel) loses nothing.
 */
import { ISignal, Signal } from '@lumino/signaling';

import { FleetAPI, LabfleetError } from './api';
import { importFinished } from './imports';
import type { IImportCreate, IImportJob } from './types';

/** How often a running import is asked about (ms). */
export const IMPORT_POLL_MS = 1000;

export interface IImportRunOptions {
  intervalMs?: number;
  /** Called once when a job ends (done or failed), e.g. to list a new folder. */
  onFinished?: (job: IImportJob) => void;
}

export class ImportRun {
  constructor(api: FleetAPI, options: IImportRunOptions = {}) {
    this._api = api;
    this._intervalMs = options.intervalMs ?? IMPORT_POLL_MS;
    this._onFinished = options.onFinished;
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** The job as the service last answered it; null before an import or after `clear`. */
  get job(): IImportJob | null {
    return this._job;
  }

  /** What the last import asked for (its branch and path to open go into the Hub's link). */
  get request(): IImportCreate | null {
    return this._request;
  }

  /** The service's refusal of the import, or why asking about it failed; null: none. */
  get error(): string | null {
    return this._error;
  }

  /** Whether the request that starts an import is on its way. */
  get starting(): boolean {
    return this._starting;
  }

  /** Whether the job runs and is being asked about. */
  get running(): boolean {
    return this._following;
  }

  /**
   * Start an import; resolves true when the service took it (202), false when it refused it
   * (`error` has its words).  An import still followed is let go (the service goes on with it).
   */
  async start(body: IImportCreate): Promise<boolean> {
    this._stop();
    const run = ++this._run;
    this._request = body;
    this._job = null;
    this._error = null;
    this._starting = true;
    this._changed.emit();
    try {
      const job = await this._api.startImport(body);
      if (run !== this._run) {
        return false;
      }
      this._job = job;
      this._follow(run);
      return true;
    } catch (e) {
      if (run === this._run) {
        this._error = (e as Error).message;
      }
      return false;
    } finally {
      if (run === this._run) {
        this._starting = false;
        this._changed.emit();
      }
    }
  }

  /** Forget the job (the form is ready for another). */
  clear(): void {
    this._stop();
    this._run++;
    this._job = null;
    this._request = null;
    this._error = null;
    this._starting = false;
    this._changed.emit();
  }

  dispose(): void {
    this._stop();
    this._run++;
    Signal.clearData(this);
  }

  /** Ask again in a second, unless the job is over. */
  private _follow(run: number): void {
    const job = this._job;
    if (!job || run !== this._run) {
      return;
    }
    if (importFinished(job.status)) {
      this._following = false;
      this._onFinished?.(job);
      return;
    }
    this._following = true;
    this._timer = setTimeout(() => void this._poll(run, job.id), this._intervalMs);
  }

  private async _poll(run: number, id: string): Promise<void> {
    this._timer = null;
    let keepAsking = true;
    try {
      const job = await this._api.getImport(id);
      if (run !== this._run) {
        return;
      }
      this._job = job;
      this._error = null;
    } catch (e) {
      if (run !== this._run) {
        return;
      }
      this._error = (e as Error).message;
      // A 4xx (the service forgot the job, or it is not ours): asking again changes nothing.
      const status = e instanceof LabfleetError ? e.status : 0;
      keepAsking = !(status >= 400 && status < 500);
    }
    if (keepAsking) {
      this._follow(run);
    } else {
      this._following = false;
    }
    this._changed.emit();
  }

  private _stop(): void {
    this._following = false;
    if (this._timer !== null) {
      clearTimeout(this._timer);
      this._timer = null;
    }
  }

  private _api: FleetAPI;
  private _intervalMs: number;
  private _onFinished?: (job: IImportJob) => void;
  private _job: IImportJob | null = null;
  private _request: IImportCreate | null = null;
  private _error: string | null = null;
  private _starting = false;
  private _following = false;
  private _run = 0;
  private _timer: ReturnType<typeof setTimeout> | null = null;
  private _changed = new Signal<this, void>(this);
}

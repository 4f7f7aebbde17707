/**
 * My Environments, the pure parts: which launch-option images are bases to build on, how an
 * environment's row reads (owner, base, size, status), the build form (and Save as environment's)
 * checked into the body `POST /api/environments` takes, and the build log followed by byte offset
 * as the section shows it.
 */
import { formatBytes } from './format';
import type {
  IEnvironment,
  IEnvironmentCreate,
  IEnvironmentSave,
  ILaunchOptions,
  ILogPiece
} from './types';

/** Launch-option images named so are my environments (offered for sessions), not bases. */
export const ENV_IMAGE_PREFIX = 'env:';

/** How often an open log of a build that runs is asked again (ms). */
export const ENV_LOG_POLL_MS = 2000;

/** How much of a build log is asked for at a time (`?tail=` with `?offset=`, bytes). */
export const ENV_LOG_CHUNK_BYTES = 1024 * 1024;

/** How much of the end of a build log the section keeps and shows (bytes). */
export const ENV_LOG_KEEP_BYTES = 256 * 1024;

/** The recipe files the form offers, by field. */
export const REQUIREMENTS_FILE = 'requirements.txt';
export const APT_FILE = 'apt.txt';

/** Whether the environment waits for or runs its build (its log grows, its status moves). */
export function environmentBuilding(status: string | null | undefined): boolean {
  return status === 'QUEUED' || status === 'BUILDING';
}

/** The status pill's colours (base.css): READY ok, QUEUED and BUILDING waiting, FAILED error. */
export function environmentStatusClass(status: string | null | undefined): string {
  switch (status) {
    case 'READY':
      return 'lf-status lf-status-running';
    case 'QUEUED':
    case 'BUILDING':
      return 'lf-status lf-status-pending';
    case 'FAILED':
      return 'lf-status lf-status-error';
    default:
      return 'lf-status';
  }
}

export interface IBaseChoice {
  value: string;
  label: string;
}

/**
 * The registered images an environment may be built on: the launch options' images, less my
 * environments (`env:...`).  With `project` ("" for a personal environment) only those usable
 * there: in that project, or (personal) in any of my projects.
 */
export function baseImages(
  options: Pick<ILaunchOptions, 'images'> | null | undefined,
  project?: string
): IBaseChoice[] {
  return (options?.images ?? [])
    .filter(i => !i.name.startsWith(ENV_IMAGE_PREFIX))
    .filter(i => {
      if (project === undefined) {
        return true;
      }
      const where = i.projects ?? [];
      return project ? where.includes(project) : where.length > 0;
    })
    .map(i => ({ value: i.name, label: i.display_name || i.name }));
}

/** Whose an environment is: `personal` (mine), `personal (bob)`, `project acme/ml`. */
export function ownerText(
  env: Pick<IEnvironment, 'owner_kind' | 'owner' | 'project'>,
  me = ''
): string {
  if (env.owner_kind === 'project' || env.project) {
    return `project ${env.project ?? env.owner.replace(/^project:/, '')}`;
  }
  const who = env.owner.replace(/^user:/, '');
  return !who || who === me ? 'personal' : `personal (${who})`;
}

/** The row's line under its name: owner · base · size (the size once there is an image). */
export function environmentMeta(
  env: Pick<IEnvironment, 'owner_kind' | 'owner' | 'project' | 'base' | 'size_bytes'>,
  me = ''
): string {
  const size = env.size_bytes > 0 ? formatBytes(env.size_bytes) : '';
  return [ownerText(env, me), env.base, size].filter(Boolean).join(' · ');
}

/** The status with its reason where it says why it FAILED: `FAILED: the Docker engine ...`. */
export function environmentStatusText(env: Pick<IEnvironment, 'status' | 'status_reason'>): string {
  const reason = (env.status_reason ?? '').trim();
  return env.status === 'FAILED' && reason ? `FAILED: ${reason}` : env.status;
}

/** The build form, as typed. */
export interface IEnvironmentForm {
  name: string;
  base: string;
  /** `domain/project`; "": personal. */
  project: string;
  requirements: string;
  apt: string;
}

export const EMPTY_ENVIRONMENT_FORM: IEnvironmentForm = {
  name: '',
  base: '',
  project: '',
  requirements: '',
  apt: ''
};

/**
 * The body of `POST /api/environments` from the form: the name and base as chosen, the project
 * only for a project environment, the files that have any text (as typed).  Throws an Error
 * saying what is missing; everything else the service judges, in its own words.
 */
export function environmentBody(form: IEnvironmentForm): IEnvironmentCreate {
  const name = form.name.trim();
  if (!name) {
    throw new Error('give the environment a name');
  }
  if (!form.base) {
    throw new Error('choose a base image');
  }
  const files: Record<string, string> = {};
  if (form.requirements.trim()) {
    files[REQUIREMENTS_FILE] = form.requirements;
  }
  if (form.apt.trim()) {
    files[APT_FILE] = form.apt;
  }
  const body: IEnvironmentCreate = { name, base: form.base, files };
  if (form.project) {
    body.project = form.project;
  }
  return body;
}

/** Bytes of `text` in UTF-8. */
export function utf8Length(text: string): number {
  let n = 0;
  for (const ch of text) {
    const c = ch.codePointAt(0) ?? 0;
    n += c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
  }
  return n;
}

/** The offset to ask a log from next: this one plus the BYTES that came (UTF-8 for a string). */
export function nextLogOffset(offset: number, got: Uint8Array | string): number {
  return offset + (typeof got === 'string' ? utf8Length(got) : got.byteLength);
}

/** Whether the log began again: its size now (`X-Log-Size`) is less than where it was read to. */
export function logRestarted(offset: number, size: number | null): boolean {
  return size !== null && size < offset;
}

const NEWLINE = 0x0a;

/**
 * A build log followed by byte offset: each answer to `?offset=<offset>` is added with `take`,
 * and `text` is the end of the log as far as it was read, at most `keep` bytes of it (whole lines;
 * `cut` says the start was cut).  Bytes are decoded as a stream, so a character split between two
 * answers comes out whole.  A log that began again (its size less than the offset) is read again
 * from 0; one far longer than `keep` is read from its last `keep` bytes on (its size known).
 * Where no size comes (`X-Log-Size` absent), `restart` is the caller's to call.
 */
export class LogFollower {
  constructor(
    readonly keep = ENV_LOG_KEEP_BYTES,
    readonly chunk = ENV_LOG_CHUNK_BYTES
  ) {}

  /** Where to ask from next (bytes). */
  offset = 0;
  /** The end of the log as far as it was read (at most `keep` bytes). */
  text = '';
  /** Whether the start of the log is not in `text`. */
  cut = false;
  /** How many times the log began again while followed. */
  restarts = 0;

  /**
   * Add what `?offset=<this.offset>` answered.  Returns whether to ask again at once: there is
   * more (the log is longer than what was read, or the answer was a full chunk of a log whose size
   * is not known), or the offset moved (the log began again, or its end is far ahead).
   */
  take(piece: ILogPiece): boolean {
    const { bytes, size } = piece;
    if (logRestarted(this.offset, size)) {
      this.restart();
      return true;
    }
    const next = nextLogOffset(this.offset, bytes);
    if (size !== null && size - next >= this.keep) {
      // All that came is older than the last `keep` bytes: read those instead.
      this._from(size - this.keep, true);
      return true;
    }
    let text = this._decoder.decode(bytes, { stream: true });
    if (this._partialLine) {
      // Read from the middle of a line (or of a character): it starts at the next line.
      const nl = text.indexOf('\n');
      this._partialLine = nl < 0;
      text = nl < 0 ? '' : text.slice(nl + 1);
    }
    this.text += text;
    this.offset = next;
    this._trim();
    return size !== null ? size > this.offset : bytes.byteLength >= this.chunk;
  }

  /** Read the log again from its start (it began again: a new build of the same environment). */
  restart(): void {
    this._from(0, false);
    this.restarts += 1;
  }

  private _from(offset: number, cut: boolean): void {
    this.offset = offset;
    this.text = '';
    this.cut = cut;
    this._partialLine = cut && offset > 0;
    this._decoder = new TextDecoder('utf-8');
  }

  /** Keep the last `keep` bytes of `text`, from a line's start where one is in them. */
  private _trim(): void {
    // A UTF-16 code unit is at most 3 bytes of UTF-8: no need to count a short text.
    if (this.text.length * 3 <= this.keep) {
      return;
    }
    const bytes = new TextEncoder().encode(this.text);
    if (bytes.length <= this.keep) {
      return;
    }
    let start = bytes.length - this.keep;
    const nl = bytes.indexOf(NEWLINE, start - 1);
    if (nl >= 0 && nl < bytes.length - 1) {
      start = nl + 1;
    } else {
      // No line starts there: cut at a character's first byte.
      while (start < bytes.length && (bytes[start] & 0xc0) === 0x80) {
        start += 1;
      }
    }
    this.text = new TextDecoder('utf-8').decode(bytes.subarray(start));
    this.cut = true;
  }

  private _decoder = new TextDecoder('utf-8');
  private _partialLine = false;
}

/** Whether the log's last line is the build's last word (READY or FAILED): the status moved. */
export function logEnded(text: string): boolean {
  const lines = text.trimEnd().split('\n');
  return /^labfleet: (READY|FAILED)\b/.test(lines[lines.length - 1] ?? '');
}

/** The Save as environment form, as typed. */
export interface ISaveAsForm {
  name: string;
  /** `domain/project`; "": personal. */
  project: string;
}

export const EMPTY_SAVE_AS_FORM: ISaveAsForm = { name: '', project: '' };

/**
 * The body of `POST /api/environments` that saves the session `sessionId` as an environment:
 * the name as typed (trimmed), the session, the project only for a project environment.  Throws
 * an Error saying what is missing; the service judges the rest (a session that is not mine or
 * not running, a name taken, a limit reached) in its own words.
 */
export function saveAsBody(
  form: ISaveAsForm,
  sessionId: string | null | undefined
): IEnvironmentSave {
  const name = form.name.trim();
  if (!name) {
    throw new Error('give the environment a name');
  }
  if (!sessionId) {
    throw new Error('the labfleet service does not know this session: it cannot be saved');
  }
  const body: IEnvironmentSave = { name, session: sessionId };
  if (form.project) {
    body.project = form.project;
  }
  return body;
}

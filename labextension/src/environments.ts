/**
 * My Environments, the pure parts: which launch-option images are bases to build on, how an
 * environment's row reads (owner, base, size, status), the build form checked into the body
 * `POST /api/environments` takes, and the build log as the section shows it.
 */
import { formatBytes } from './format';
import type { IEnvironment, IEnvironmentCreate, ILaunchOptions } from './types';

/** Launch-option images named so are my environments (offered for sessions), not bases. */
export const ENV_IMAGE_PREFIX = 'env:';

/** How often an open log of a build that runs is asked again (ms). */
export const ENV_LOG_POLL_MS = 2000;

/** How much of the end of a build log is asked for (`?tail=`, bytes). */
export const ENV_LOG_TAIL_BYTES = 64 * 1024;

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

/**
 * A log as asked with `?tail=<tailBytes>`: when the answer fills the tail, the file is longer and
 * the first line is cut: it goes, and `cut` says so.
 */
export function logView(
  text: string,
  tailBytes = ENV_LOG_TAIL_BYTES
): { text: string; cut: boolean } {
  if (utf8Length(text) < tailBytes) {
    return { text, cut: false };
  }
  const nl = text.indexOf('\n');
  return { text: nl >= 0 ? text.slice(nl + 1) : text, cut: true };
}

/** Whether the log's last line is the build's last word (READY or FAILED): the status moved. */
export function logEnded(text: string): boolean {
  const lines = text.trimEnd().split('\n');
  return /^labfleet: (READY|FAILED)\b/.test(lines[lines.length - 1] ?? '');
}

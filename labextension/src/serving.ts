/**
 * Model serving, the pure parts: how an endpoint reads (status, healthy replicas), the deploy
 * form checked into the body `POST /api/endpoints` takes, a replica count for scaling, the curl
 * line that calls an endpoint with a token, and how an endpoint's tokens read in their list.
 */
import { formatNumber, parseMem, toNumber } from './format';
import type { Level } from './quota';
import { GPU_QUANTUM } from './slots';
import type { IEndpoint, IEndpointCreate, IEndpointToken, Slots } from './types';

/** The service's bound on replicas per endpoint. */
export const MAX_REPLICAS = 64;

/** An endpoint name as the router's path takes it (openapi.yaml `/serve/{endpoint}/`). */
export const ENDPOINT_NAME_RE = /^[a-z0-9]([a-z0-9_-]{0,38}[a-z0-9])?$/;

/** `1 of 2 healthy`: replicas that carry traffic, of those asked for. */
export function healthyText(e: Pick<IEndpoint, 'healthy_replicas' | 'replicas'>): string {
  return `${e.healthy_replicas ?? 0} of ${e.replicas ?? 0} healthy`;
}

/** The service's `status_reason`, unless it only repeats the healthy count shown beside it. */
export function reasonText(
  e: Pick<IEndpoint, 'status_reason' | 'healthy_replicas' | 'replicas'>
): string {
  const reason = e.status_reason ?? '';
  return reason === `${e.healthy_replicas ?? 0} of ${e.replicas ?? 0} replicas healthy`
    ? ''
    : reason;
}

/** Whether an endpoint is still coming up (its replicas are being started). */
export function endpointStarting(status: string | null | undefined): boolean {
  return status === 'PENDING' || status === 'DEPLOYING';
}

/** The colour of an endpoint's status: READY ok, DEGRADED warn, going away none. */
export function endpointLevel(status: string | null | undefined): Level {
  switch (status) {
    case 'READY':
      return 'ok';
    case 'DEGRADED':
      return 'over';
    case 'DESTROYING':
    case 'DESTROYED':
      return 'none';
    default:
      return 'warn';
  }
}

/** Whether the service takes a change (scale, token) of an endpoint in this state. */
export function endpointChangeable(status: string | null | undefined): boolean {
  return status !== 'DESTROYING' && status !== 'DESTROYED';
}

/** `12 requests, 1 error, 3.5 ms on average`. */
export function requestsText(e: Pick<IEndpoint, 'requests' | 'errors' | 'latency_ms_avg'>): string {
  const n = e.requests ?? 0;
  const errors = e.errors ?? 0;
  let text = `${n} request${n === 1 ? '' : 's'}, ${errors} error${errors === 1 ? '' : 's'}`;
  if (e.latency_ms_avg !== null && e.latency_ms_avg !== undefined) {
    text += `, ${formatNumber(e.latency_ms_avg, 1)} ms on average`;
  }
  return text;
}

/** The endpoint's URL as a caller outside the browser needs it: absolute, on the Hub's host. */
export function absoluteUrl(url: string, origin: string): string {
  if (/^https?:\/\//.test(url)) {
    return url;
  }
  return origin.replace(/\/+$/, '') + (url.startsWith('/') ? url : `/${url}`);
}

/** A shell-safe single-quoted word. */
function shellQuote(s: string): string {
  return /^[A-Za-z0-9_./:@%+=,-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`;
}

/** `curl -H "Authorization: Bearer <token>" <url>`: what calls the endpoint from a shell. */
export function curlLine(url: string, token: string | null): string {
  const auth = token ? `-H "Authorization: Bearer ${token}" ` : '';
  return `curl ${auth}${shellQuote(url)}`;
}

/** Why a replica count is not one the service takes; null when it is. */
export function replicasProblem(value: string, minimum = 0): string | null {
  const text = value.trim();
  if (!/^\d+$/.test(text)) {
    return 'replicas must be a whole number';
  }
  const n = Number(text);
  if (n < minimum || n > MAX_REPLICAS) {
    return `replicas must be between ${minimum} and ${MAX_REPLICAS}`;
  }
  return null;
}

/** Why an endpoint name is not one the service takes; null when it is. */
export function endpointNameProblem(name: string, taken: string[] = []): string | null {
  const n = name.trim();
  if (!n) {
    return 'give the endpoint a name';
  }
  if (!ENDPOINT_NAME_RE.test(n)) {
    return 'a name of lower-case letters, digits, - and _ (at most 40, starting and ending with a letter or digit)';
  }
  if (taken.includes(n)) {
    return `you have an endpoint ${n}: choose another name, or delete it first`;
  }
  return null;
}

/** The deploy form, as typed. */
export interface IDeployForm {
  name: string;
  project: string;
  folder: string;
  replicas: string;
  cpu: string;
  mem: string;
  gpuShares: string;
  openToPublic: boolean;
}

export const EMPTY_DEPLOY_FORM: IDeployForm = {
  name: '',
  project: '',
  folder: '',
  replicas: '1',
  cpu: '1',
  mem: '1g',
  gpuShares: '',
  openToPublic: false
};

/**
 * The form as the body of `POST /api/endpoints` (slots per replica); throws an Error with a
 * sentence for the first thing wrong.
 */
export function deployBody(form: IDeployForm, taken: string[] = []): IEndpointCreate {
  const nameProblem = endpointNameProblem(form.name, taken);
  if (nameProblem) {
    throw new Error(nameProblem);
  }
  if (!form.project) {
    throw new Error('choose a project');
  }
  if (!form.folder) {
    throw new Error('choose a model folder (a folder whose use is "model")');
  }
  const replicasWrong = replicasProblem(form.replicas, 1);
  if (replicasWrong) {
    throw new Error(replicasWrong);
  }
  const slots: Slots = {};
  if (form.cpu.trim()) {
    const cpu = toNumber(form.cpu.trim());
    if (cpu === null || cpu <= 0) {
      throw new Error(`CPU must be a number of cores above 0, not "${form.cpu}"`);
    }
    slots.cpu = cpu;
  }
  if (form.mem.trim()) {
    slots.mem = parseMem(form.mem, 'memory');
  }
  if (form.gpuShares.trim()) {
    const g = toNumber(form.gpuShares.trim());
    if (g === null || g <= 0) {
      throw new Error(`GPU must be a share of a GPU above 0 (e.g. 0.25), not "${form.gpuShares}"`);
    }
    const steps = g / GPU_QUANTUM;
    if (Math.abs(steps - Math.round(steps)) > 1e-6) {
      throw new Error(`GPU must be a multiple of ${GPU_QUANTUM}, not ${form.gpuShares}`);
    }
    slots['gpu.shares'] = Number((Math.round(steps) * GPU_QUANTUM).toFixed(2));
  }
  const body: IEndpointCreate = {
    name: form.name.trim(),
    project: form.project,
    model_folder: form.folder,
    replicas: Number(form.replicas.trim()),
    slots
  };
  if (form.openToPublic) {
    body.open_to_public = true;
  }
  return body;
}

/** Whether an endpoint answers a chat now (the Chat button): it has a healthy replica. */
export function endpointChattable(status: string | null | undefined): boolean {
  return status === 'READY' || status === 'DEGRADED';
}

/** `2026-11-24 07:03 UTC` from the service's ISO time (naive times are UTC); `never` for none. */
export function formatStamp(iso: string | null | undefined, none = 'never'): string {
  if (!iso) {
    return none;
  }
  const zoned = /(Z|[+-]\d\d:?\d\d)$/.test(iso) ? iso : `${iso}Z`;
  const t = Date.parse(zoned);
  if (Number.isNaN(t)) {
    return iso;
  }
  return `${new Date(t).toISOString().slice(0, 16).replace('T', ' ')} UTC`;
}

export type TokenState = 'valid' | 'revoked' | 'expired';

/** A token's state: revoked wins over expired; `valid` is the service's own judgement. */
export function tokenState(t: Pick<IEndpointToken, 'valid' | 'revoked_at'>): TokenState {
  if (t.revoked_at) {
    return 'revoked';
  }
  return t.valid ? 'valid' : 'expired';
}

/** What the list says of a token, the secret aside (the service does not keep it). */
export function tokenMeta(
  t: Pick<IEndpointToken, 'created_at' | 'created_by' | 'expires_at' | 'last_used' | 'requests'>
): string {
  const n = t.requests ?? 0;
  return [
    `created ${formatStamp(t.created_at, '?')}${t.created_by ? ` by ${t.created_by}` : ''}`,
    `expires ${formatStamp(t.expires_at)}`,
    `last used ${formatStamp(t.last_used)}`,
    `${n} request${n === 1 ? '' : 's'}`
  ].join(' · ');
}

/** The tokens worth listing (in force, newest first) and how many revoked or expired are not. */
export function listedTokens(tokens: IEndpointToken[]): {
  shown: IEndpointToken[];
  hidden: number;
} {
  const shown = tokens.filter(t => tokenState(t) === 'valid').sort((a, b) => b.id - a.id);
  return { shown, hidden: tokens.length - shown.length };
}

/**
 * The Model Store's cards, the pure parts and the request: a card as `GET api/model-store` answers
 * it, the query's path, search, the endpoint name a folder suggests, what a card says of its model
 * and README, and the deploy form it starts from.  The panel (components/ModelStore.tsx) and the
 * plugin (modelstore.ts) both use these; this module imports neither.
 */
import type { FleetAPI } from './api';
import { EMPTY_DEPLOY_FORM, ENDPOINT_NAME_RE, type IDeployForm } from './serving';

/** A card of the store, as `GET /api/model-store` answers it (openapi.yaml `/model-store`). */
export interface IModelCard {
  id: string;
  name: string;
  /** The owning project, DOMAIN/PROJECT; null for the caller's own folder. */
  project: string | null;
  /** `project:DOMAIN/PROJECT`, or `user:NAME` for the caller's own folder. */
  owner?: string;
  host: string;
  permission: string | null;
  /** The caller may serve it (a monitor or an admin may see folders they cannot mount). */
  can_deploy: boolean;
  title: string;
  summary: string;
  readme: string | null;
  readme_truncated: boolean;
  readme_error: string | null;
  has_definition: boolean;
  model: { name: string; port: number } | null;
  definition_error: string | null;
}

export interface IModelStoreQuery {
  search?: string;
  project?: string;
}

/** `api/model-store?...`: the path under `labfleet/` (FleetAPI.request) of a store query. */
export function modelStorePath(query: IModelStoreQuery = {}): string {
  const params = new URLSearchParams();
  for (const key of ['search', 'project'] as const) {
    const value = query[key]?.trim();
    if (value) {
      params.set(key, value);
    }
  }
  const q = params.toString();
  return q ? `api/model-store?${q}` : 'api/model-store';
}

/** The store's cards, through the session's proxy (the same base URL and XSRF as FleetAPI's). */
export function fetchModelStore(
  api: FleetAPI,
  query: IModelStoreQuery = {}
): Promise<IModelCard[]> {
  return api.request<IModelCard[]>(modelStorePath(query));
}

/** The cards whose folder name or title holds `search` (ignoring case): the service's own rule. */
export function filterCards(cards: IModelCard[], search: string): IModelCard[] {
  const needle = search.trim().toLowerCase();
  if (!needle) {
    return cards;
  }
  return cards.filter(
    c => c.name.toLowerCase().includes(needle) || c.title.toLowerCase().includes(needle)
  );
}

const MAX_ENDPOINT_NAME = 40;

function trimName(name: string, max: number): string {
  return name.slice(0, max).replace(/[^a-z0-9]+$/, '');
}

/**
 * An endpoint name from a folder's (`Echo.Model_v2` -> `echo-model_v2`): what the service takes
 * (lower case, at most 40, letters or digits at both ends), `-2`, `-3`... when `taken`.
 */
export function endpointNameFor(folder: string, taken: string[] = []): string {
  const base =
    trimName(
      folder
        .toLowerCase()
        .replace(/[^a-z0-9_-]+/g, '-')
        .replace(/-{2,}/g, '-')
        .replace(/^[^a-z0-9]+/, ''),
      MAX_ENDPOINT_NAME
    ) || 'model';
  if (!taken.includes(base)) {
    return base;
  }
  for (let i = 2; ; i++) {
    const suffix = `-${i}`;
    const name = trimName(base, MAX_ENDPOINT_NAME - suffix.length) + suffix;
    if (!taken.includes(name) && ENDPOINT_NAME_RE.test(name)) {
      return name;
    }
  }
}

/**
 * The deploy dialog's start: the name from the folder, its project (for the user's own folder, the
 * first of `projects`, the user's), its id, 1 replica.
 */
export function deployFormFor(
  card: IModelCard,
  taken: string[] = [],
  projects: string[] = []
): IDeployForm {
  return {
    ...EMPTY_DEPLOY_FORM,
    name: endpointNameFor(card.name, taken),
    project: card.project ?? projects[0] ?? '',
    folder: card.id,
    replicas: '1'
  };
}

/** Whose folder a card is: its project, or "your folder". */
export function cardOwnerText(card: IModelCard): string {
  return card.project ?? 'your folder';
}

/** What a card says of its model: `echo · port 8000`, or why it has none. */
export function modelText(card: IModelCard): { text: string; ok: boolean } {
  if (card.model) {
    const name = card.model.name ? `${card.model.name} · ` : '';
    return { text: `${name}port ${card.model.port}`, ok: true };
  }
  if (card.definition_error) {
    return { text: card.definition_error, ok: false };
  }
  return { text: 'no model-definition.yaml', ok: false };
}

/** Why Deploy is off for a card (what creating the endpoint would refuse); null when it is on. */
export function deployBlocker(card: IModelCard): string | null {
  if (!card.can_deploy) {
    return 'You cannot mount this folder in a session, so you cannot serve it.';
  }
  if (!card.has_definition) {
    return 'This folder has no model-definition.yaml: add one to serve it.';
  }
  if (!card.model) {
    return 'Its model-definition.yaml has a problem: fix it to serve it.';
  }
  return null;
}

/** What the README view says above (or instead of) the README. */
export function readmeNotes(card: IModelCard): string[] {
  const notes: string[] = [];
  if (card.readme_error) {
    notes.push(card.readme_error);
  } else if (card.readme === null) {
    notes.push('This folder has no README.md.');
  }
  if (card.readme_truncated) {
    notes.push('README.md is longer than 64 KiB: only its start is shown.');
  }
  return notes;
}

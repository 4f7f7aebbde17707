/**
 * Import & Run: the Hub's import links (plain, Markdown and HTML badges), the badge itself, an
 * import job's status in words and where its result lies in this Lab.  Pure: no DOM, no requests.
 *
 * A link `<hub>/hub/labfleet/import?url=...` asks the Hub to import what the URL points at into
 * a folder of the person who follows it and to open it in a session (found or started); the
 * sidebar's Start section imports into a folder from this Lab (`POST /api/imports`).
 */
import type {
  IImportCreate,
  IImportJob,
  IImportReport,
  IMountedFolder,
  ISessionInfo
} from './types';

/** Where the Hub is, as people outside this page reach it. */
export interface IHubLocation {
  /** `scheme://host[:port]`, no trailing slash. */
  origin: string;
  /** The Hub's prefix: its base URL and `hub/` (JupyterHub's `hub_prefix`), e.g. `/hub/`. */
  prefix: string;
}

/**
 * The Hub's location from JupyterHub's page config: `hubHost` (set when the Hub is on another
 * host than this page, e.g. with subdomains) and `hubPrefix`; else this page's origin.
 */
export function hubLocation(
  hubHost: string | null | undefined,
  hubPrefix: string | null | undefined,
  pageOrigin: string
): IHubLocation {
  const origin = (hubHost || pageOrigin || '').replace(/\/+$/, '');
  let prefix = hubPrefix || '/hub/';
  if (!prefix.startsWith('/')) {
    prefix = `/${prefix}`;
  }
  if (!prefix.endsWith('/')) {
    prefix = `${prefix}/`;
  }
  return { origin, prefix };
}

/** The Hub's base URL (`/`, or `/base/` behind a prefix): its prefix less the `hub/`. */
export function hubBase(hub: IHubLocation): string {
  return hub.prefix.replace(/hub\/$/, '') || '/';
}

/** The query parameters of an import link, in the order they are written. */
export const IMPORT_LINK_FIELDS = [
  'url',
  'branch',
  'open',
  'folder',
  'project',
  'image',
  'gpu',
  'resource_group'
] as const;

export type ImportLinkField = (typeof IMPORT_LINK_FIELDS)[number];

export type ImportLinkParams = Partial<Record<ImportLinkField, string | number | null>>;

/**
 * The Hub's import link: `<origin><prefix>labfleet/import?url=...`; empty parameters are left
 * out, the others encoded as a query string (URLSearchParams).
 */
export function importLink(hub: IHubLocation, params: ImportLinkParams): string {
  const query = new URLSearchParams();
  for (const key of IMPORT_LINK_FIELDS) {
    const value = params[key];
    if (value === undefined || value === null) {
      continue;
    }
    const text = String(value).trim();
    if (text) {
      query.set(key, text);
    }
  }
  const qs = query.toString();
  return `${hub.origin}${hub.prefix}labfleet/import${qs ? `?${qs}` : ''}`;
}

/** The badge image the labfleet service serves (`<base>services/labfleet/static/badge.svg`). */
export function badgeUrl(hub: IHubLocation): string {
  return `${hub.origin}${hubBase(hub)}services/labfleet/static/badge.svg`;
}

export const BADGE_ALT = 'Run on labfleet';

/** A URL inside Markdown's `(...)`: spaces and parentheses would end it. */
function markdownUrl(url: string): string {
  return url.replace(/ /g, '%20').replace(/\(/g, '%28').replace(/\)/g, '%29');
}

/** Text for an HTML attribute value in double quotes. */
export function escapeAttribute(text: string): string {
  return text
    .replace(/&/g, '&amp;')
    .replace(/"/g, '&quot;')
    .replace(/</g, '&lt;')
    .replace(/>/g, '&gt;');
}

/** `[![Run on labfleet](<badge>)](<link>)` */
export function badgeMarkdown(link: string, badge: string): string {
  return `[![${BADGE_ALT}](${markdownUrl(badge)})](${markdownUrl(link)})`;
}

/** `<a href="<link>"><img src="<badge>" alt="Run on labfleet"></a>` */
export function badgeHtml(link: string, badge: string): string {
  return `<a href="${escapeAttribute(link)}"><img src="${escapeAttribute(badge)}" alt="${BADGE_ALT}"></a>`;
}

/**
 * The badge, "Run on | labfleet", as an SVG document (the shape of the usual README badges):
 * what `services/labfleet/static/badge.svg` serves, and the dialog's preview.
 */
export function badgeSvg(): string {
  const left = 'Run on';
  const right = 'labfleet';
  // Verdana 11px: the texts' widths, pinned with textLength so that every renderer fits them.
  const lw = 39;
  const rw = 41;
  const pad = 5;
  const a = lw + 2 * pad;
  const b = rw + 2 * pad;
  const w = a + b;
  const text = (x: number, s: string, len: number) =>
    `<text x="${x}" y="15" fill="#010101" fill-opacity=".3" textLength="${len}" lengthAdjust="spacingAndGlyphs">${s}</text>` +
    `<text x="${x}" y="14" textLength="${len}" lengthAdjust="spacingAndGlyphs">${s}</text>`;
  return (
    `<svg xmlns="http://www.w3.org/2000/svg" width="${w}" height="20" role="img" aria-label="${left}: ${right}">` +
    `<title>${left}: ${right}</title>` +
    '<linearGradient id="s" x2="0" y2="100%"><stop offset="0" stop-color="#bbb" stop-opacity=".1"/>' +
    '<stop offset="1" stop-opacity=".1"/></linearGradient>' +
    `<clipPath id="r"><rect width="${w}" height="20" rx="3" fill="#fff"/></clipPath>` +
    `<g clip-path="url(#r)"><rect width="${a}" height="20" fill="#555"/>` +
    `<rect x="${a}" width="${b}" height="20" fill="#0b6e99"/>` +
    `<rect width="${w}" height="20" fill="url(#s)"/></g>` +
    '<g fill="#fff" text-anchor="middle" font-family="Verdana,Geneva,DejaVu Sans,sans-serif" font-size="11">' +
    text(a / 2, left, lw) +
    text(a + b / 2, right, rw) +
    '</g></svg>'
  );
}

/** The badge as a `data:` URI (a preview that needs no request). */
export function badgeDataUri(): string {
  return `data:image/svg+xml;charset=utf-8,${encodeURIComponent(badgeSvg())}`;
}

// ------------------------------------------------------------ an import job

/** Whether the job is over (done or failed): no need to ask again. */
export function importFinished(status: string): boolean {
  return status === 'done' || status === 'failed';
}

const KIND_WORDS: Record<string, string> = {
  notebook: 'the notebook',
  repository: 'the repository',
  archive: 'the archive'
};

/** Where the job stands, in a line: "Fetching the repository…", "Imported into folder x". */
export function importStatusText(
  job: Pick<IImportJob, 'status' | 'kind' | 'folder' | 'resync'>
): string {
  const folder = job.folder?.name ? `folder ${job.folder.name}` : 'the folder';
  switch (job.status) {
    case 'fetching':
      return `Fetching ${KIND_WORDS[job.kind] ?? 'it'}…`;
    case 'writing':
      return `Writing into ${folder}…`;
    case 'done':
      return job.resync ? `Re-synced in ${folder}` : `Imported into ${folder}`;
    case 'failed':
      return 'The import failed';
    default:
      return String(job.status);
  }
}

export const REPORT_KEYS: (keyof IImportReport)[] = ['updated', 'kept', 'renamed'];

/** The report's counts: "2 updated, 1 kept, 0 renamed". */
export function reportSummary(report: Partial<IImportReport> | null | undefined): string {
  return REPORT_KEYS.map(k => `${(report?.[k] ?? []).length} ${k}`).join(', ');
}

/** How many files the report names. */
export function reportTotal(report: Partial<IImportReport> | null | undefined): number {
  return REPORT_KEYS.reduce((n, k) => n + (report?.[k] ?? []).length, 0);
}

/**
 * Where this session mounts the folder, relative to the Lab's root (`vfolders/<name>`), or null
 * when it does not mount it.  The mounted folders' list (with their paths) first, else the
 * session info's mounts; by id where the folder's is known, else by name.
 */
export function mountPathOf(
  folder: { id: string | null; name: string },
  mounted: Pick<IMountedFolder, 'id' | 'name' | 'path'>[] | null | undefined,
  mounts: ISessionInfo['mounts'] | null | undefined,
  mountDir = 'vfolders'
): string | null {
  const same = (id: string | undefined, name: string) =>
    folder.id ? id === folder.id : name === folder.name;
  const m = (mounted ?? []).find(x => same(x.id, x.name));
  if (m) {
    return m.path || `${mountDir}/${m.name}`;
  }
  const s = (mounts ?? []).find(x => same(x.vfolder ?? x.id, x.name));
  return s ? `${mountDir}/${s.name}` : null;
}

/** A path inside a folder, relative to the Lab's root: `vfolders/x` and `nb/a.ipynb`. */
export function labPath(mountPath: string, relative: string | null | undefined): string {
  const rel = (relative ?? '').replace(/^(\.\/|\/)+/, '').replace(/\/+$/, '');
  const base = mountPath.replace(/\/+$/, '');
  return rel && rel !== '.' ? `${base}/${rel}` : base;
}

/** What the Start section's form asks for, as `POST /api/imports` takes it: trimmed, empties out. */
export function importRequest(form: {
  url: string;
  folder?: string;
  branch?: string;
  open?: string;
}): IImportCreate {
  const body: IImportCreate = { url: form.url.trim() };
  for (const key of ['folder', 'branch', 'open'] as const) {
    const v = (form[key] ?? '').trim();
    if (v) {
      body[key] = v;
    }
  }
  return body;
}

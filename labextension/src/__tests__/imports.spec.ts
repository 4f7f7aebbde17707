/** Import & Run's pure parts: the Hub's links, the badges, a job's words, where its result lies. */
import {
  badgeDataUri,
  badgeHtml,
  badgeMarkdown,
  badgeSvg,
  badgeUrl,
  hubBase,
  hubLocation,
  importFinished,
  importLink,
  importRequest,
  importStatusText,
  labPath,
  mountPathOf,
  reportSummary,
  reportTotal
} from '../imports';

const HUB = hubLocation('', '/hub/', 'https://hub.example.org');

describe('hubLocation', () => {
  it("is this page's origin and the Hub's prefix", () => {
    expect(HUB).toEqual({ origin: 'https://hub.example.org', prefix: '/hub/' });
    expect(hubBase(HUB)).toBe('/');
  });

  it('takes the Hub host when the Hub is elsewhere, and a prefix behind a base URL', () => {
    const hub = hubLocation('https://hub.example.org/', '/lab/hub', 'https://alice.example.org');
    expect(hub).toEqual({ origin: 'https://hub.example.org', prefix: '/lab/hub/' });
    expect(hubBase(hub)).toBe('/lab/');
  });

  it('defaults to /hub/', () => {
    expect(hubLocation(undefined, undefined, 'http://127.0.0.1:8000').prefix).toBe('/hub/');
  });
});

describe('importLink', () => {
  it('writes the given parameters in order, encoded, and leaves the empty ones out', () => {
    expect(
      importLink(HUB, {
        open: 'notebooks/intro to ml.ipynb',
        url: 'https://github.com/org/repo?x=1&y=(2)',
        branch: ' main ',
        folder: '',
        gpu: 0.5,
        project: null
      })
    ).toBe(
      'https://hub.example.org/hub/labfleet/import?url=https%3A%2F%2Fgithub.com%2Forg%2Frepo%3Fx%3D1%26y%3D%282%29' +
        '&branch=main&open=notebooks%2Fintro+to+ml.ipynb&gpu=0.5'
    );
  });

  it('round-trips through URLSearchParams', () => {
    const link = importLink(HUB, { url: 'git://example.org/a b#c', folder: 'my data' });
    const q = new URL(link).searchParams;
    expect(q.get('url')).toBe('git://example.org/a b#c');
    expect(q.get('folder')).toBe('my data');
    expect([...q.keys()]).toEqual(['url', 'folder']);
  });

  it('has no query without parameters', () => {
    expect(importLink(HUB, {})).toBe('https://hub.example.org/hub/labfleet/import');
  });
});

describe('badges', () => {
  const link = importLink(HUB, { url: 'https://github.com/org/repo', branch: 'main' });
  const badge = badgeUrl(HUB);

  it("point to the service's static badge", () => {
    expect(badge).toBe('https://hub.example.org/services/labfleet/static/badge.svg');
    expect(badgeUrl(hubLocation('', '/base/hub/', 'http://h'))).toBe(
      'http://h/base/services/labfleet/static/badge.svg'
    );
  });

  it('in Markdown', () => {
    expect(badgeMarkdown(link, badge)).toBe(`[![Run on labfleet](${badge})](${link})`);
    // Nothing in a URL ends Markdown's parentheses early.
    expect(badgeMarkdown('http://h/a (b)', badge)).toBe(
      `[![Run on labfleet](${badge})](http://h/a%20%28b%29)`
    );
  });

  it('in HTML, attributes escaped', () => {
    expect(badgeHtml(link, badge)).toBe(
      `<a href="${link.replace(/&/g, '&amp;')}"><img src="${badge}" alt="Run on labfleet"></a>`
    );
    expect(badgeHtml('http://h/?a="<x>"', badge)).toContain(
      'href="http://h/?a=&quot;&lt;x&gt;&quot;"'
    );
  });

  it('as an SVG that says "Run on | labfleet"', () => {
    const svg = badgeSvg();
    expect(svg.startsWith('<svg xmlns="http://www.w3.org/2000/svg"')).toBe(true);
    expect(svg).toContain('>Run on</text>');
    expect(svg).toContain('>labfleet</text>');
    const doc = new DOMParser().parseFromString(svg, 'image/svg+xml');
    expect(doc.getElementsByTagName('parsererror')).toHaveLength(0);
    expect(doc.documentElement.getAttribute('aria-label')).toBe('Run on: labfleet');
    expect(decodeURIComponent(badgeDataUri().split(',')[1])).toBe(svg);
  });
});

describe('an import job in words', () => {
  const job = (status: string, extra = {}) => ({
    status,
    kind: 'repository',
    folder: { id: 'f1', name: 'repo' },
    resync: false,
    ...extra
  });

  it('says where it stands', () => {
    expect(importStatusText(job('fetching'))).toBe('Fetching the repository…');
    expect(importStatusText(job('fetching', { kind: 'notebook' }))).toBe('Fetching the notebook…');
    expect(importStatusText(job('writing'))).toBe('Writing into folder repo…');
    expect(importStatusText(job('done'))).toBe('Imported into folder repo');
    expect(importStatusText(job('done', { resync: true }))).toBe('Re-synced in folder repo');
    expect(importStatusText(job('failed'))).toBe('The import failed');
    expect(importFinished('writing')).toBe(false);
    expect(importFinished('done')).toBe(true);
    expect(importFinished('failed')).toBe(true);
  });

  it('counts the report', () => {
    const report = { updated: ['a.ipynb', 'b.py'], kept: ['c.ipynb'], renamed: [] };
    expect(reportSummary(report)).toBe('2 updated, 1 kept, 0 renamed');
    expect(reportTotal(report)).toBe(3);
    expect(reportSummary(null)).toBe('0 updated, 0 kept, 0 renamed');
  });

  it('asks for what the form says, trimmed, empties left out', () => {
    expect(
      importRequest({ url: ' https://x/r.git ', folder: '', branch: ' dev ', open: '' })
    ).toEqual({ url: 'https://x/r.git', branch: 'dev' });
  });
});

describe('where the result lies in this Lab', () => {
  const mounted = [
    { id: 'f1', name: 'data', path: 'vfolders/data' },
    { id: 'f2', name: 'repo', path: 'vfolders/repo' }
  ];

  it('finds the mount by the folder id, in the mounted list first', () => {
    expect(mountPathOf({ id: 'f2', name: 'repo' }, mounted, [])).toBe('vfolders/repo');
    // Another folder of that name (a project's) is not this one.
    expect(mountPathOf({ id: 'f9', name: 'repo' }, mounted, [])).toBeNull();
  });

  it("else in the session info's mounts (vfolder is the id)", () => {
    const mounts = [{ vfolder: 'f3', name: 'models', permission: 'ro' }];
    expect(mountPathOf({ id: 'f3', name: 'models' }, null, mounts)).toBe('vfolders/models');
    expect(mountPathOf({ id: 'f4', name: 'models' }, null, mounts)).toBeNull();
  });

  it('by name when the job knows no id yet', () => {
    expect(mountPathOf({ id: null, name: 'data' }, mounted, null)).toBe('vfolders/data');
    expect(mountPathOf({ id: null, name: 'new' }, mounted, null)).toBeNull();
  });

  it('joins the path inside the folder', () => {
    expect(labPath('vfolders/repo', 'notebooks/a.ipynb')).toBe('vfolders/repo/notebooks/a.ipynb');
    expect(labPath('vfolders/repo/', '/a.ipynb')).toBe('vfolders/repo/a.ipynb');
    expect(labPath('vfolders/repo', '')).toBe('vfolders/repo');
    expect(labPath('vfolders/repo', '.')).toBe('vfolders/repo');
    expect(labPath('vfolders/repo', 'dir/')).toBe('vfolders/repo/dir');
  });
});

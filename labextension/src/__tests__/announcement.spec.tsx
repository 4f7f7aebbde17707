/**
 * The announcement banner at the top of the Fleet panel: it follows the service's answer through
 * the store (published, replaced, cleared), shows the text as text in the level's colours, and
 * stays out of the way when there is none or the service cannot say.
 */
import * as React from 'react';
import { act } from 'react';
import { createRoot, Root } from 'react-dom/client';

import { FleetAPI, LabfleetError } from '../api';
import { FleetPanel, IFleetActions } from '../sidebar';
import { FleetStore } from '../store';
import type { IAnnouncementAnswer } from '../types';

const actions: IFleetActions = {
  stopThisSession: jest.fn(async () => undefined),
  stopSession: jest.fn(async () => undefined),
  openSession: jest.fn(),
  openFolder: jest.fn(),
  openApp: jest.fn()
};

/** A FleetAPI whose announcement is what `answer` holds now; everything else answers empty. */
function fakeApi(state: { answer: IAnnouncementAnswer | Error }): {
  api: FleetAPI;
  asked: string[];
} {
  const asked: string[] = [];
  const api = Object.create(FleetAPI.prototype) as FleetAPI;
  (api as any).request = async (path: string) => {
    asked.push(path);
    if (path === 'api/announcement') {
      if (state.answer instanceof Error) {
        throw state.answer;
      }
      return state.answer;
    }
    return path === 'session' ? { id: 's1', name: 'work', user: 'alice', project: 'acme/ml' } : [];
  };
  return { api, asked };
}

let container: HTMLDivElement;
let root: Root;

beforeAll(() => {
  (globalThis as any).IS_REACT_ACT_ENVIRONMENT = true;
});

beforeEach(() => {
  container = document.createElement('div');
  document.body.appendChild(container);
  root = createRoot(container);
});

afterEach(() => {
  act(() => root.unmount());
  container.remove();
});

function render(store: FleetStore): void {
  act(() => {
    root.render(<FleetPanel store={store} actions={actions} onRefresh={() => undefined} />);
  });
}

const banner = () =>
  container.querySelector('[data-testid="lf-announcement"]') as HTMLElement | null;

describe('the announcement banner', () => {
  it('shows the announcement at the top of the panel, as text, and follows the service', async () => {
    const state: { answer: IAnnouncementAnswer | Error } = {
      answer: {
        announcement: {
          id: 1,
          text: 'Maintenance <b>Friday</b> 18:00 UTC\nSave your work.',
          level: 'warning',
          published_at: '2026-11-24T10:00:00+00:00'
        }
      }
    };
    const { api, asked } = fakeApi(state);
    const store = new FleetStore(api, { user: 'alice', serverName: 'work' });
    await store.refresh();
    render(store);
    expect(asked).toContain('api/announcement');
    let b = banner();
    expect(b).not.toBeNull();
    // Escaped: the tags are text, not markup; the line break is kept for pre-line.
    expect(b!.textContent).toBe('Maintenance <b>Friday</b> 18:00 UTC\nSave your work.');
    expect(b!.querySelector('b')).toBeNull();
    expect(b!.getAttribute('data-level')).toBe('warning');
    expect(b!.getAttribute('role')).toBe('alert');
    expect(b!.className).toBe('lf-announcement lf-announcement-warning');
    expect(b!.style.whiteSpace).toBe('pre-line');
    // Above the first section, right under the panel's header
    const panel = container.querySelector('[data-testid="lf-sidebar"]')!;
    expect(panel.children[1]).toBe(b);

    // A new one replaces it, at the next refresh (every section closed: still asked)
    for (const s of ['session', 'quota', 'usage', 'sessions', 'folders', 'apps'] as const) {
      store.toggle(s, false);
    }
    state.answer = {
      announcement: { id: 2, text: 'All good again.', level: 'info', published_at: null }
    };
    await store.refresh();
    render(store);
    b = banner();
    expect(b!.textContent).toBe('All good again.');
    expect(b!.getAttribute('data-level')).toBe('info');
    expect(b!.getAttribute('role')).toBe('status');
    expect(b!.className).toBe('lf-announcement lf-announcement-info');

    // Cleared: the banner goes
    state.answer = { announcement: null };
    await store.refresh();
    render(store);
    expect(banner()).toBeNull();
  });

  it('shows nothing when there is none, or the service cannot say', async () => {
    const state: { answer: IAnnouncementAnswer | Error } = { answer: { announcement: null } };
    const { api } = fakeApi(state);
    const store = new FleetStore(api, { user: 'alice', serverName: 'work' });
    await store.refresh();
    render(store);
    expect(banner()).toBeNull();
    state.answer = new LabfleetError('no such endpoint: /services/labfleet/api/announcement', 404);
    await store.refresh();
    render(store);
    expect(banner()).toBeNull();
    expect(store.errors.announcement).toContain('no such endpoint');
    // The panel itself is there, with its sections
    expect(container.querySelector('[data-testid="lf-section-session"]')).not.toBeNull();
  });

  it('asks the service through the session proxy', () => {
    const api = new FleetAPI({ baseUrl: 'http://hub/user/alice/work/' } as any);
    expect(api.url('api/announcement')).toBe(
      'http://hub/user/alice/work/labfleet/api/announcement'
    );
  });
});

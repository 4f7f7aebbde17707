/**
 * The Serving section: the pure parts (how an endpoint reads, the deploy form's body, the curl
 * line, how tokens read) and the section rendered in jsdom from a store filled by a fake API: the
 * list with its routes, scale, delete (after a second click), a token shown once with its curl
 * line, the token list with Revoke (after the confirm), Chat and Model Store, deploy.
 */
import * as React from 'react';
import { act } from 'react';
import { createRoot, Root } from 'react-dom/client';

import { FleetAPI, LabfleetError } from '../api';
import { Serving } from '../components/Serving';
import {
  absoluteUrl,
  curlLine,
  deployBody,
  EMPTY_DEPLOY_FORM,
  endpointChangeable,
  endpointChattable,
  endpointLevel,
  endpointNameProblem,
  healthyText,
  reasonText,
  formatStamp,
  listedTokens,
  replicasProblem,
  requestsText,
  tokenMeta,
  tokenState
} from '../serving';
import { FleetStore } from '../store';
import type { IEndpoint, IEndpointToken } from '../types';

function token(over: Partial<IEndpointToken> = {}): IEndpointToken {
  return {
    id: 3,
    note: '',
    rate_limit: 600,
    created_by: 'alice',
    created_at: '2026-11-24T07:03:35.123456',
    expires_at: null,
    last_used: null,
    revoked_at: null,
    valid: true,
    requests: 0,
    latency_ms_avg: null,
    ...over
  };
}

function endpoint(over: Partial<IEndpoint> = {}): IEndpoint {
  return {
    id: 'e1',
    name: 'echo',
    owner: 'alice',
    project: 'acme/ml',
    domain: 'acme',
    model_folder: { id: 'f1', name: 'echo-model' },
    image: null,
    resource_group: null,
    slots: { cpu: 0.5, 'gpu.shares': 0.25 },
    replicas: 2,
    active_replicas: 2,
    healthy_replicas: 1,
    status: 'DEGRADED',
    status_reason: '1 of 2 replicas healthy',
    open_to_public: false,
    url: '/services/labfleet/serve/echo/',
    requests: 12,
    errors: 1,
    latency_ms_avg: 3.456,
    last_error: '',
    created_at: null,
    routes: [
      {
        id: 1,
        server: 'echo-r0',
        session_id: 's1',
        address: '127.0.0.1:4000',
        status: 'RUNNING',
        health: 'HEALTHY',
        traffic: 'ACTIVE',
        failures: 0,
        last_error: null,
        created_at: null,
        ready_at: null,
        checked_at: null,
        ended_at: null
      },
      {
        id: 2,
        server: 'echo-r1',
        session_id: 's2',
        address: '127.0.0.1:4001',
        status: 'PROVISIONING',
        health: 'UNHEALTHY',
        traffic: 'INACTIVE',
        failures: 3,
        last_error: 'health check: connection refused',
        created_at: null,
        ready_at: null,
        checked_at: null,
        ended_at: null
      }
    ],
    ...over
  };
}

describe('serving, pure', () => {
  it('reads tokens', () => {
    expect(formatStamp('2026-11-24T07:03:35.123456')).toBe('2026-11-24 07:03 UTC');
    expect(formatStamp('2026-11-24T08:03:35+01:00')).toBe('2026-11-24 07:03 UTC');
    expect(formatStamp(null)).toBe('never');
    expect(formatStamp('soon')).toBe('soon');
    expect(tokenMeta(token({ requests: 1, last_used: '2026-11-24T09:00:00Z' }))).toBe(
      'created 2026-11-24 07:03 UTC by alice · expires never · last used 2026-11-24 09:00 UTC · 1 request'
    );
    expect(tokenState(token())).toBe('valid');
    expect(tokenState(token({ valid: false }))).toBe('expired');
    expect(tokenState(token({ valid: false, revoked_at: '2026-11-24T08:00:00' }))).toBe('revoked');
    const { shown, hidden } = listedTokens([
      token({ id: 1 }),
      token({ id: 2, valid: false, revoked_at: 'x' }),
      token({ id: 5 })
    ]);
    expect(shown.map(t => t.id)).toEqual([5, 1]);
    expect(hidden).toBe(1);
    expect(endpointChattable('READY')).toBe(true);
    expect(endpointChattable('DEGRADED')).toBe(true);
    expect(endpointChattable('DEPLOYING')).toBe(false);
  });

  it('reads an endpoint', () => {
    const e = endpoint();
    expect(healthyText(e)).toBe('1 of 2 healthy');
    expect(requestsText(e)).toBe('12 requests, 1 error, 3.5 ms on average');
    expect(requestsText({ requests: 1, errors: 0, latency_ms_avg: null })).toBe(
      '1 request, 0 errors'
    );
    expect(endpointLevel('READY')).toBe('ok');
    expect(endpointLevel('DEGRADED')).toBe('over');
    expect(endpointLevel('PENDING')).toBe('warn');
    expect(endpointChangeable('READY')).toBe(true);
    expect(endpointChangeable('DESTROYING')).toBe(false);
    // The reason shows only when it says more than the count
    expect(reasonText(e)).toBe('');
    expect(reasonText({ ...e, status_reason: 'echo-r1 failed its health check' })).toBe(
      'echo-r1 failed its health check'
    );
  });

  it('makes the curl line with an absolute URL', () => {
    const url = absoluteUrl('/services/labfleet/serve/echo/', 'https://hub.example/');
    expect(url).toBe('https://hub.example/services/labfleet/serve/echo/');
    expect(absoluteUrl('http://x/y', 'https://hub.example')).toBe('http://x/y');
    expect(curlLine(url, 'lfsrv_1_abc')).toBe(
      'curl -H "Authorization: Bearer lfsrv_1_abc" https://hub.example/services/labfleet/serve/echo/'
    );
    expect(curlLine('https://h/a b', null)).toBe("curl 'https://h/a b'");
  });

  it('checks names and replica counts', () => {
    expect(endpointNameProblem('my-llm')).toBeNull();
    expect(endpointNameProblem('')).toContain('name');
    expect(endpointNameProblem('My LLM')).toContain('lower-case');
    expect(endpointNameProblem('a'.repeat(41))).toContain('at most 40');
    expect(endpointNameProblem('echo', ['echo'])).toContain('you have an endpoint echo');
    expect(replicasProblem('0')).toBeNull();
    expect(replicasProblem('0', 1)).toBe('replicas must be between 1 and 64');
    expect(replicasProblem('65')).toBe('replicas must be between 0 and 64');
    expect(replicasProblem('1.5')).toBe('replicas must be a whole number');
  });

  it('turns the deploy form into the body the service takes', () => {
    const form = {
      ...EMPTY_DEPLOY_FORM,
      name: ' echo ',
      project: 'acme/ml',
      folder: 'echo-model',
      replicas: '2',
      cpu: '0.5',
      mem: '512m',
      gpuShares: '0.25'
    };
    expect(deployBody(form)).toEqual({
      name: 'echo',
      project: 'acme/ml',
      model_folder: 'echo-model',
      replicas: 2,
      slots: { cpu: 0.5, mem: 512 * 2 ** 20, 'gpu.shares': 0.25 }
    });
    expect(deployBody({ ...form, cpu: '', mem: '', gpuShares: '', openToPublic: true })).toEqual({
      name: 'echo',
      project: 'acme/ml',
      model_folder: 'echo-model',
      replicas: 2,
      slots: {},
      open_to_public: true
    });
    expect(() => deployBody({ ...form, folder: '' })).toThrow('choose a model folder');
    expect(() => deployBody({ ...form, replicas: '0' })).toThrow('between 1 and 64');
    expect(() => deployBody({ ...form, gpuShares: '0.255' })).toThrow('multiple of 0.01');
    expect(() => deployBody({ ...form, mem: 'lots' })).toThrow('memory must be a size');
    expect(() => deployBody({ ...form, cpu: '-1' })).toThrow('CPU must be');
    expect(() => deployBody(form, ['echo'])).toThrow('you have an endpoint echo');
  });
});

// ------------------------------------------------------------ the section in jsdom

let container: HTMLDivElement;
let root: Root;
let store: FleetStore;
let calls: [string, ...unknown[]][];
let endpoints: IEndpoint[];
let refuse: string | null;
let tokens: IEndpointToken[];
let confirmed: boolean;
let asked: string[];
let chats: string[];
let stores: number;

function fakeApi(): FleetAPI {
  const api = Object.create(FleetAPI.prototype) as FleetAPI;
  const answer = async (name: string, ...args: unknown[]) => {
    calls.push([name, ...args]);
    if (refuse) {
      throw new LabfleetError(refuse, 409);
    }
  };
  Object.assign(api, {
    endpoints: async () => endpoints,
    launchOptions: async () => ({
      user: 'alice',
      projects: [{ name: 'acme/ml', left: {} }],
      images: [],
      resource_groups: [],
      vfolders: [
        { id: 'f0', name: 'data', usage_mode: 'general', mountable: true },
        { id: 'f1', name: 'echo-model', usage_mode: 'model', mountable: true }
      ]
    }),
    quota: async () => null,
    scaleEndpoint: async (name: string, n: number) => answer('scale', name, n),
    deleteEndpoint: async (name: string) => answer('delete', name),
    createEndpoint: async (body: any) => {
      await answer('create', body);
      endpoints = [...endpoints, endpoint({ id: 'e2', name: body.name, status: 'PENDING' })];
    },
    createEndpointToken: async (name: string) => {
      await answer('token', name);
      tokens = [...tokens, token({ id: 7 })];
      return { id: 7, token: 'lfsrv_7_secret', valid: true };
    },
    endpointTokens: async (name: string) => {
      calls.push(['tokens', name]);
      return tokens;
    },
    revokeEndpointToken: async (name: string, id: number) => {
      await answer('revoke', name, id);
      tokens = tokens.map(t => (t.id === id ? { ...t, valid: false, revoked_at: 'now' } : t));
    }
  });
  return api;
}

const byTestId = (id: string) => container.querySelector(`[data-testid="${id}"]`);

function render(): void {
  act(() => {
    root.render(
      <Serving
        store={store}
        origin="https://hub.example"
        onChat={name => chats.push(name)}
        onModelStore={() => stores++}
        confirm={async title => {
          asked.push(title);
          return confirmed;
        }}
      />
    );
  });
}

async function click(id: string, within: Element | null = container): Promise<void> {
  await act(async () => {
    (within?.querySelector(`[data-testid="${id}"]`) as HTMLButtonElement).click();
    // the action's promise chain (request, refresh, state) settles before the test looks
    await new Promise(resolve => setTimeout(resolve, 0));
  });
}

/** Type into a controlled input as React sees it. */
function type(el: Element | null, value: string): void {
  const input = el as HTMLInputElement;
  const setter = Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value')!.set!;
  act(() => {
    setter.call(input, value);
    input.dispatchEvent(new Event('input', { bubbles: true }));
  });
}

beforeAll(() => {
  (globalThis as any).IS_REACT_ACT_ENVIRONMENT = true;
});

beforeEach(async () => {
  calls = [];
  refuse = null;
  endpoints = [endpoint()];
  tokens = [
    token({ id: 3, note: 'Chat panel', requests: 2 }),
    token({ id: 2, valid: false, revoked_at: '2026-11-24T08:00:00' })
  ];
  confirmed = true;
  asked = [];
  chats = [];
  stores = 0;
  container = document.createElement('div');
  document.body.appendChild(container);
  root = createRoot(container);
  store = new FleetStore(fakeApi(), { user: 'alice', serverName: 'work', now: () => 1000 });
  await store.fetch('endpoints');
  store.changed.connect(render);
  render();
});

afterEach(() => {
  act(() => root.unmount());
  container.remove();
});

describe('Serving section', () => {
  it('lists endpoints with status, healthy replicas and routes', () => {
    const item = byTestId('lf-endpoint-echo');
    expect(item?.getAttribute('data-status')).toBe('DEGRADED');
    expect(byTestId('lf-endpoint-meta')?.textContent).toBe(
      '1 of 2 healthy · acme/ml · echo-model · 0.5 cores, 0.25 GPU'
    );
    expect(byTestId('lf-endpoint-url')?.getAttribute('href')).toBe(
      'https://hub.example/services/labfleet/serve/echo/'
    );
    const r1 = byTestId('lf-route-echo-r1');
    expect(r1?.getAttribute('data-health')).toBe('UNHEALTHY');
    expect(r1?.querySelector('[data-testid="lf-route-error"]')?.textContent).toBe(
      'health check: connection refused'
    );
    expect(byTestId('lf-route-echo-r0')?.getAttribute('data-traffic')).toBe('ACTIVE');
  });

  it('says when there is none', async () => {
    endpoints = [];
    await act(() => store.fetch('endpoints'));
    expect(byTestId('lf-endpoints-empty')?.textContent).toContain('No endpoints yet');
  });

  it('scales, and shows a refusal in the service’s words', async () => {
    type(byTestId('lf-endpoint-replicas'), '3');
    await click('lf-endpoint-scale');
    expect(calls).toEqual([['scale', 'echo', 3]]);
    expect(byTestId('lf-endpoint-note')?.textContent).toBe('Scaled to 3 replicas.');
    refuse = 'your user policy allows at most 2 replicas per endpoint';
    type(byTestId('lf-endpoint-replicas'), '5');
    await click('lf-endpoint-scale');
    expect(byTestId('lf-endpoint-error')?.textContent).toBe(refuse);
    type(byTestId('lf-endpoint-replicas'), 'x');
    await click('lf-endpoint-scale');
    expect(byTestId('lf-endpoint-error')?.textContent).toBe('replicas must be a whole number');
  });

  it('deletes after a second click', async () => {
    await click('lf-endpoint-delete');
    expect(calls).toEqual([]);
    expect(byTestId('lf-endpoint-delete')?.textContent).toBe('Really delete?');
    await click('lf-endpoint-delete');
    expect(calls).toEqual([['delete', 'echo']]);
  });

  it('shows a new token once, in a curl line', async () => {
    await click('lf-endpoint-new-token');
    expect(calls).toEqual([['token', 'echo']]);
    expect(byTestId('lf-endpoint-curl')?.textContent).toBe(
      'curl -H "Authorization: Bearer lfsrv_7_secret" https://hub.example/services/labfleet/serve/echo/'
    );
    await click('lf-endpoint-token-close');
    expect(byTestId('lf-endpoint-token')).toBeNull();
    expect(container.textContent).not.toContain('lfsrv_7_secret');
  });

  it('lists tokens in force, and revokes one after the confirm', async () => {
    expect(byTestId('lf-endpoint-tokens')).toBeNull();
    await click('lf-endpoint-tokens-toggle');
    expect(calls).toEqual([['tokens', 'echo']]);
    const row = byTestId('lf-token-3');
    expect(row?.textContent).toContain('Token 3 · Chat panel');
    expect(row?.querySelector('[data-testid="lf-token-meta"]')?.textContent).toBe(
      'created 2026-11-24 07:03 UTC by alice · expires never · last used never · 2 requests'
    );
    expect(byTestId('lf-token-2')).toBeNull();
    expect(byTestId('lf-tokens-hidden')?.textContent).toBe('1 revoked or expired not shown.');
    // Cancelled: nothing revoked
    confirmed = false;
    await click('lf-token-revoke', row);
    expect(asked).toEqual(['Revoke token 3 of echo?']);
    expect(calls).toEqual([['tokens', 'echo']]);
    confirmed = true;
    await click('lf-token-revoke', row);
    expect(calls).toEqual([
      ['tokens', 'echo'],
      ['revoke', 'echo', 3],
      ['tokens', 'echo']
    ]);
    expect(byTestId('lf-token-3')).toBeNull();
    expect(byTestId('lf-tokens-empty')?.textContent).toContain('No token in force');
    // A new token shows in the list (its value only in the curl line, once)
    await click('lf-endpoint-new-token');
    expect(byTestId('lf-token-7')).not.toBeNull();
    expect(byTestId('lf-endpoint-tokens')?.textContent).not.toContain('lfsrv_7_secret');
    // A refusal shows in the service's words
    refuse = 'endpoint echo has no token 7';
    await click('lf-token-revoke', byTestId('lf-token-7'));
    expect(byTestId('lf-tokens-error')?.textContent).toBe(refuse);
  });

  it('opens the Chat panel of a ready endpoint, and the Model Store', async () => {
    await click('lf-endpoint-open-chat');
    expect(chats).toEqual(['echo']);
    await click('lf-open-model-store');
    expect(stores).toBe(1);
    endpoints = [endpoint({ status: 'DEPLOYING' })];
    await act(() => store.fetch('endpoints'));
    expect(byTestId('lf-endpoint-open-chat')).toBeNull();
  });

  it('has no actions for an endpoint going away', async () => {
    endpoints = [endpoint({ status: 'DESTROYING' })];
    await act(() => store.fetch('endpoints'));
    expect(byTestId('lf-endpoint-scale')).toBeNull();
    expect(byTestId('lf-endpoint-delete')).toBeNull();
  });

  it('deploys a model folder', async () => {
    await click('lf-deploy-toggle');
    await act(() => store.loadLaunchOptions());
    // Only model folders are offered
    const folders = Array.from(
      (byTestId('lf-deploy-folder') as HTMLElement).querySelectorAll('option'),
      o => o.value
    );
    expect(folders).toEqual(['echo-model']);
    type(byTestId('lf-deploy-name'), 'llm');
    type(byTestId('lf-deploy-gpu'), '0.25');
    await click('lf-deploy-submit');
    expect(calls).toEqual([
      [
        'create',
        {
          name: 'llm',
          project: 'acme/ml',
          model_folder: 'echo-model',
          replicas: 1,
          slots: { cpu: 1, mem: 2 ** 30, 'gpu.shares': 0.25 }
        }
      ]
    ]);
    expect(byTestId('lf-endpoint-deployed')?.textContent).toContain('Endpoint llm is deploying');
    // A name taken is refused before anything is sent
    await click('lf-deploy-toggle');
    type(byTestId('lf-deploy-name'), 'echo');
    await click('lf-deploy-submit');
    expect(calls.length).toBe(1);
    expect(byTestId('lf-deploy-error')?.textContent).toContain('you have an endpoint echo');
  });
});

/**
 * The Model Store: its pure parts (the request's path, search, the endpoint name a folder
 * suggests, what a card says of its model and README, the deploy form), the request through the
 * session's proxy, and the panel in jsdom: cards, search, the README as text, the deploy dialog
 * posting what the service takes and showing its refusal.
 */
import { ServerConnection } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';
import * as React from 'react';
import { act } from 'react';
import { createRoot, Root } from 'react-dom/client';

import { FleetAPI, LabfleetError } from '../api';
import { ModelStore } from '../components/ModelStore';
import {
  cardOwnerText,
  deployBlocker,
  deployFormFor,
  endpointNameFor,
  fetchModelStore,
  filterCards,
  type IModelCard,
  modelStorePath,
  modelText,
  readmeNotes
} from '../modelcards';
import { deployBody, ENDPOINT_NAME_RE } from '../serving';
import type { IEndpoint, IEndpointCreate } from '../types';

function card(over: Partial<IModelCard> = {}): IModelCard {
  return {
    id: 'f-echo',
    name: 'echo-model',
    project: 'acme/ml',
    host: 'local',
    permission: 'rw',
    can_deploy: true,
    title: 'Echo model',
    summary: 'Says it back.',
    readme: '# Echo model\n\nSays it back.\n\n<script>alert(1)</script>',
    readme_truncated: false,
    readme_error: null,
    has_definition: true,
    model: { name: 'echo', port: 8000 },
    definition_error: null,
    ...over
  };
}

describe('pure parts', () => {
  it('builds the path with only the given query', () => {
    expect(modelStorePath()).toBe('api/model-store');
    expect(modelStorePath({ search: '  ', project: '' })).toBe('api/model-store');
    expect(modelStorePath({ search: 'bert & co', project: 'acme/ml' })).toBe(
      'api/model-store?search=bert+%26+co&project=acme%2Fml'
    );
  });

  it('searches names and titles, ignoring case, like the service', () => {
    const cards = [card(), card({ id: 'b', name: 'bert', title: 'Sentiment', summary: 'echo' })];
    expect(filterCards(cards, '').length).toBe(2);
    expect(filterCards(cards, ' ECHO ').map(c => c.id)).toEqual(['f-echo']);
    expect(filterCards(cards, 'senti').map(c => c.id)).toEqual(['b']);
    expect(filterCards(cards, 'gpt')).toEqual([]);
  });

  it('suggests an endpoint name the service takes, free of those taken', () => {
    expect(endpointNameFor('echo-model')).toBe('echo-model');
    expect(endpointNameFor('Echo.Model_v2')).toBe('echo-model_v2');
    expect(endpointNameFor('.hidden..')).toBe('hidden');
    expect(endpointNameFor('___')).toBe('model');
    expect(endpointNameFor('echo', ['echo', 'echo-2'])).toBe('echo-3');
    const long = endpointNameFor('x'.repeat(64), ['x'.repeat(40)]);
    expect(long).toBe(`${'x'.repeat(38)}-2`);
    for (const name of ['A', 'a.b.c', 'Z'.repeat(64), '9-lives_', long]) {
      expect(endpointNameFor(name)).toMatch(ENDPOINT_NAME_RE);
    }
  });

  it("deploys the user's own folder (no project) in the first of the user's projects", () => {
    const own = card({ project: null, owner: 'user:alice' });
    expect(cardOwnerText(own)).toBe('your folder');
    expect(cardOwnerText(card())).toBe('acme/ml');
    expect(deployFormFor(own, [], ['acme/ml', 'acme/cv']).project).toBe('acme/ml');
    expect(deployFormFor(card(), [], ['acme/cv']).project).toBe('acme/ml');
  });

  it('starts the deploy form from the card: name, its project, its folder id, 1 replica', () => {
    const form = deployFormFor(card(), ['echo-model']);
    expect(form).toMatchObject({
      name: 'echo-model-2',
      project: 'acme/ml',
      folder: 'f-echo',
      replicas: '1'
    });
    expect(deployBody({ ...form, gpuShares: '0.25' })).toEqual({
      name: 'echo-model-2',
      project: 'acme/ml',
      model_folder: 'f-echo',
      replicas: 1,
      slots: { cpu: 1, mem: 1024 ** 3, 'gpu.shares': 0.25 }
    });
  });

  it('says what a card has of a model, and when Deploy is off', () => {
    expect(modelText(card())).toEqual({ text: 'echo · port 8000', ok: true });
    expect(modelText(card({ model: { name: '', port: 80 } })).text).toBe('port 80');
    const broken = card({
      model: null,
      definition_error: 'model-definition.yaml: port is missing'
    });
    expect(modelText(broken)).toEqual({ text: broken.definition_error, ok: false });
    const none = card({ model: null, has_definition: false });
    expect(modelText(none).text).toBe('no model-definition.yaml');
    expect(deployBlocker(card())).toBeNull();
    expect(deployBlocker(card({ can_deploy: false }))).toMatch(/cannot mount/);
    expect(deployBlocker(none)).toMatch(/no model-definition.yaml/);
    expect(deployBlocker(broken)).toMatch(/has a problem/);
  });

  it('notes a missing, unreadable or truncated README', () => {
    expect(readmeNotes(card())).toEqual([]);
    expect(readmeNotes(card({ readme: null }))).toEqual(['This folder has no README.md.']);
    expect(
      readmeNotes(card({ readme: null, readme_error: 'README.md is not UTF-8 text' }))
    ).toEqual(['README.md is not UTF-8 text']);
    expect(readmeNotes(card({ readme_truncated: true }))[0]).toMatch(/longer than 64 KiB/);
  });
});

describe('the request', () => {
  it('goes through the session proxy with the query, and carries the service refusal', async () => {
    const seen: string[] = [];
    const fetchFn = async (input: RequestInfo | URL, init?: RequestInit) => {
      const req = input instanceof Request ? input : new Request(input as string, init);
      seen.push(`${req.method} ${req.url}`);
      if (req.url.includes('project=bad')) {
        return new Response(
          JSON.stringify({ status: 400, message: 'project must be DOMAIN/PROJECT' }),
          {
            status: 400
          }
        );
      }
      return new Response(JSON.stringify([card()]), { status: 200 });
    };
    const api = new FleetAPI(
      ServerConnection.makeSettings({
        baseUrl: 'http://127.0.0.1:8000/user/alice/work/',
        token: '',
        fetch: fetchFn as typeof fetch
      })
    );
    expect((await fetchModelStore(api, { search: 'echo' }))[0].id).toBe('f-echo');
    // (JupyterLab adds a cache-busting number to a GET's query)
    expect(seen[0]).toMatch(
      /^GET http:\/\/127\.0\.0\.1:8000\/user\/alice\/work\/labfleet\/api\/model-store\?search=echo(&\d+)?$/
    );
    await expect(fetchModelStore(api, { project: 'bad' })).rejects.toEqual(
      new LabfleetError('project must be DOMAIN/PROJECT', 400)
    );
  });
});

// ------------------------------------------------------------------ the panel in jsdom

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

function byTestId(id: string, within: ParentNode = container): HTMLElement | null {
  return within.querySelector(`[data-testid="${id}"]`);
}

async function click(el: Element | null): Promise<void> {
  expect(el).not.toBeNull();
  await act(async () => {
    (el as HTMLElement).click();
  });
}

function type(el: Element | null, value: string): void {
  const input = (el?.tagName === 'INPUT' ? el : el?.querySelector('input')) as HTMLInputElement;
  const setter = Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value')!.set!;
  act(() => {
    setter.call(input, value);
    input.dispatchEvent(new Event('input', { bubbles: true }));
  });
}

async function render(
  cards: IModelCard[],
  deploy: (body: IEndpointCreate) => Promise<IEndpoint>,
  notices: string[] = [],
  renderMarkdown?: (markdown: string) => Promise<Widget>
): Promise<void> {
  await act(async () => {
    root.render(
      React.createElement(ModelStore, {
        load: async () => cards,
        endpointNames: async () => ['echo-model'],
        deploy,
        notify: m => notices.push(m),
        renderMarkdown
      })
    );
  });
}

const refuse = async (): Promise<IEndpoint> => {
  throw new Error('not called');
};

describe('the panel', () => {
  const cards = [
    card(),
    card({
      id: 'f-b',
      name: 'broken',
      title: 'broken',
      summary: '',
      readme: null,
      model: null,
      definition_error: 'model-definition.yaml: port is missing'
    })
  ];

  it('shows a card per model and filters them as one types', async () => {
    await render(cards, refuse);
    const echo = byTestId('lf-ms-card-echo-model')!;
    expect(byTestId('lf-ms-card-open', echo)!.textContent).toBe('Echo model');
    expect(byTestId('lf-ms-card-project', echo)!.textContent).toBe('acme/ml · echo-model');
    expect(byTestId('lf-ms-card-summary', echo)!.textContent).toBe('Says it back.');
    expect(byTestId('lf-ms-model', echo)!.textContent).toBe('Model: echo · port 8000');
    const broken = byTestId('lf-ms-card-broken')!;
    expect((byTestId('lf-ms-deploy', broken) as HTMLButtonElement).disabled).toBe(true);
    expect(byTestId('lf-ms-model', broken)!.dataset.ok).toBe('false');
    type(byTestId('lf-ms-search'), 'BROK');
    expect(byTestId('lf-ms-card-echo-model')).toBeNull();
    type(byTestId('lf-ms-search'), 'nothing');
    expect(byTestId('lf-ms-empty')!.textContent).toBe('No model matches "nothing".');
  });

  it('opens a README as text, never as HTML, and goes back', async () => {
    await render(cards, refuse);
    await click(byTestId('lf-ms-card-echo-model'));
    const readme = byTestId('lf-ms-readme')!;
    expect(readme.tagName).toBe('PRE');
    expect(readme.textContent).toContain('<script>alert(1)</script>');
    expect(container.querySelector('script')).toBeNull();
    expect(byTestId('lf-ms-detail-meta')!.textContent).toContain('Project acme/ml');
    await click(byTestId('lf-ms-back'));
    expect(byTestId('lf-ms-grid')).not.toBeNull();
    await click(byTestId('lf-ms-card-open', byTestId('lf-ms-card-broken')!));
    expect(byTestId('lf-ms-readme-note')!.textContent).toBe('This folder has no README.md.');
  });

  it('shows the rendered README widget, and lets it go when leaving', async () => {
    const made: Widget[] = [];
    const renderMarkdown = async (markdown: string) => {
      const w = new Widget();
      w.node.textContent = `rendered ${markdown.length} characters`;
      made.push(w);
      return w;
    };
    await render(cards, refuse, [], renderMarkdown);
    await click(byTestId('lf-ms-card-echo-model'));
    expect(byTestId('lf-ms-readme')!.textContent).toBe(
      `rendered ${cards[0].readme!.length} characters`
    );
    expect(made[0].isAttached).toBe(true);
    // The README's heading is the page's: no second title above it.
    expect(container.querySelector('.lf-ms-detail-title')).toBeNull();
    await click(byTestId('lf-ms-back'));
    expect(byTestId('lf-ms-grid')).not.toBeNull();
    expect(made[0].isDisposed).toBe(true);
  });

  it('deploys with what the dialog says, shows a refusal, then a success', async () => {
    const posted: IEndpointCreate[] = [];
    const notices: string[] = [];
    let answer: 'refuse' | 'ok' = 'refuse';
    const deploy = async (body: IEndpointCreate): Promise<IEndpoint> => {
      posted.push(body);
      if (answer === 'refuse') {
        throw new LabfleetError('your project quota allows 0.5 gpu.shares more', 409);
      }
      return { name: body.name } as IEndpoint;
    };
    await render(cards, deploy, notices);
    await click(byTestId('lf-ms-deploy', byTestId('lf-ms-card-echo-model')!));
    const dialog = byTestId('lf-ms-deploy-dialog')!;
    const name = byTestId('lf-ms-deploy-name', dialog) as HTMLInputElement;
    expect(name.value).toBe('echo-model-2');
    type(byTestId('lf-ms-deploy-gpu', dialog), '0.5');
    type(byTestId('lf-ms-deploy-replicas', dialog), 'two');
    await click(byTestId('lf-ms-deploy-submit', dialog));
    expect(byTestId('lf-ms-deploy-error')!.textContent).toMatch(/whole number/);
    expect(posted).toEqual([]);
    type(byTestId('lf-ms-deploy-replicas', dialog), '2');
    await click(byTestId('lf-ms-deploy-submit', dialog));
    expect(posted).toEqual([
      {
        name: 'echo-model-2',
        project: 'acme/ml',
        model_folder: 'f-echo',
        replicas: 2,
        slots: { cpu: 1, mem: 1024 ** 3, 'gpu.shares': 0.5 }
      }
    ]);
    expect(byTestId('lf-ms-deploy-error')!.textContent).toBe(
      'your project quota allows 0.5 gpu.shares more'
    );
    answer = 'ok';
    await click(byTestId('lf-ms-deploy-submit', dialog));
    expect(byTestId('lf-ms-deploy-dialog')).toBeNull();
    expect(byTestId('lf-ms-deployed')!.textContent).toContain('Endpoint echo-model-2 is deploying');
    expect(notices).toEqual([
      'Endpoint echo-model-2 is deploying: its replicas start like any session.'
    ]);
  });
});

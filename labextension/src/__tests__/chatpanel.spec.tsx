/**
 * The Chat panel rendered in jsdom against a fake API and a fake `fetch` whose reply streams:
 * the header, a message sent and its reply growing piece by piece, the panel's own token used
 * and never shown, an error in the endpoint's words, Stop, and the token revoked with the tab.
 */
import * as React from 'react';
import { act } from 'react';
import { createRoot, Root } from 'react-dom/client';

import { FleetAPI } from '../api';
import { ChatPanel, ChatSession } from '../components/Chat';
import type { IEndpoint } from '../types';

const encoder = new TextEncoder();

let container: HTMLDivElement;
let root: Root;
let calls: [string, ...unknown[]][];
let requests: { url: string; init: RequestInit }[];
/** What the endpoint answers next: a status and the chunks of its body, each released by a step. */
let answer: { status: number; chunks: string[]; type?: string };
let steps: (() => void)[];

function fakeApi(open = false): FleetAPI {
  const api = Object.create(FleetAPI.prototype) as FleetAPI;
  let n = 0;
  Object.assign(api, {
    endpoint: async (name: string) =>
      ({
        name,
        status: 'READY',
        url: `/services/labfleet/serve/${name}/`,
        open_to_public: open
      }) as IEndpoint,
    createEndpointToken: async (name: string, expiresIn: number, note: string) => {
      n++;
      calls.push(['token', name, expiresIn, note]);
      return { id: n, token: `lfsrv_${n}_secret` };
    },
    revokeEndpointToken: async (name: string, id: number) => {
      calls.push(['revoke', name, id]);
    }
  });
  return api;
}

/** A fetch whose stream gives one chunk per `steps` call (the test decides when each comes). */
async function fakeFetch(url: string, init?: RequestInit): Promise<Response> {
  requests.push({ url, init: init! });
  if (url.endsWith('v1/models')) {
    const body = JSON.stringify({ data: [{ id: 'echo-chat' }] });
    return {
      status: 200,
      ok: true,
      statusText: 'OK',
      headers: { get: () => 'application/json' },
      text: async () => body
    } as unknown as Response;
  }
  const { status, chunks, type } = answer;
  let i = 0;
  return {
    status,
    ok: status < 300,
    statusText: '',
    headers: { get: () => type ?? 'text/event-stream' },
    text: async () => chunks.join(''),
    body: {
      getReader: () => ({
        read: () =>
          new Promise((resolve, reject) => {
            init?.signal?.addEventListener('abort', () =>
              reject(Object.assign(new Error('aborted'), { name: 'AbortError' }))
            );
            steps.push(() =>
              resolve(
                i < chunks.length
                  ? { done: false, value: encoder.encode(chunks[i++]) }
                  : { done: true, value: undefined }
              )
            );
          }),
        cancel: async () => undefined
      })
    }
  } as unknown as Response;
}

function event(content: string): string {
  return `data: ${JSON.stringify({ choices: [{ delta: { content } }] })}\n\n`;
}

const byTestId = (id: string) => container.querySelector(`[data-testid="${id}"]`);
const flush = () => act(async () => new Promise(resolve => setTimeout(resolve, 0)));

async function step(): Promise<void> {
  await flush();
  await act(async () => steps.shift()?.());
  await flush();
}

function lastReply(): Element | undefined {
  const all = container.querySelectorAll('[data-testid="lf-chat-message"][data-role="assistant"]');
  return all[all.length - 1];
}

async function send(text: string): Promise<void> {
  const box = byTestId('lf-chat-box') as HTMLTextAreaElement;
  const setter = Object.getOwnPropertyDescriptor(HTMLTextAreaElement.prototype, 'value')!.set!;
  act(() => {
    setter.call(box, text);
    box.dispatchEvent(new Event('input', { bubbles: true }));
  });
  await act(async () => {
    (byTestId('lf-chat-send') as HTMLButtonElement).click();
  });
  await flush();
}

async function mount(session: ChatSession): Promise<void> {
  await act(async () => {
    root.render(<ChatPanel session={session} origin="https://hub.example" fetch={fakeFetch} />);
  });
  await flush();
}

beforeAll(() => {
  (globalThis as any).IS_REACT_ACT_ENVIRONMENT = true;
});

beforeEach(() => {
  calls = [];
  requests = [];
  steps = [];
  container = document.createElement('div');
  document.body.appendChild(container);
  root = createRoot(container);
});

afterEach(() => {
  act(() => root.unmount());
  container.remove();
});

describe('Chat panel', () => {
  it('streams a reply with a token of its own that the page never shows', async () => {
    const session = new ChatSession(fakeApi(), 'chat');
    await mount(session);
    expect(byTestId('lf-chat-endpoint')?.textContent).toBe('chat');
    expect(byTestId('lf-chat-url')?.textContent).toContain(
      'https://hub.example/services/labfleet/serve/chat/'
    );
    answer = {
      status: 200,
      chunks: [event('You'), event(' said:'), event(' hi'), 'data: [DONE]\n\n']
    };
    await send('hi');
    expect(calls).toEqual([['token', 'chat', 3600, 'Chat panel']]);
    const seen: string[] = [];
    for (let i = 0; i < 4; i++) {
      await step();
      seen.push(lastReply()?.querySelector('[data-testid="lf-chat-text"]')?.textContent ?? '');
    }
    // It grew piece by piece (the cursor shows while it streams)
    expect(seen).toEqual(['You▍', 'You said:▍', 'You said: hi▍', 'You said: hi']);
    expect(lastReply()?.getAttribute('data-state')).toBe('done');
    const chat = requests.find(r => r.url.endsWith('v1/chat/completions'))!;
    expect(chat.url).toBe('/services/labfleet/serve/chat/v1/chat/completions');
    expect((chat.init.headers as Record<string, string>).Authorization).toBe(
      'Bearer lfsrv_1_secret'
    );
    expect(JSON.parse(chat.init.body as string)).toEqual({
      model: 'echo-chat',
      messages: [{ role: 'user', content: 'hi' }],
      stream: true
    });
    expect(byTestId('lf-chat-url')?.textContent).toContain('model echo-chat');
    expect(container.innerHTML).not.toContain('lfsrv_');
    // The next message carries the conversation so far
    answer = { status: 200, chunks: ['data: [DONE]\n\n'] };
    await send('again');
    await step();
    const second = requests.filter(r => r.url.endsWith('completions'))[1];
    expect(JSON.parse(second.init.body as string).messages).toEqual([
      { role: 'user', content: 'hi' },
      { role: 'assistant', content: 'You said: hi' },
      { role: 'user', content: 'again' }
    ]);
    // Closing the tab revokes the panel's token
    session.dispose();
    expect(calls[calls.length - 1]).toEqual(['revoke', 'chat', 1]);
  });

  it('shows the endpoint’s error, after one new token for a 401', async () => {
    await mount(new ChatSession(fakeApi(), 'chat'));
    answer = {
      status: 401,
      chunks: ['{"status": 401, "message": "the token is not valid for endpoint chat"}'],
      type: 'application/json'
    };
    await send('hi');
    await flush();
    expect(calls.filter(c => c[0] === 'token').length).toBe(2);
    expect(byTestId('lf-chat-error')?.textContent).toBe(
      '401: the token is not valid for endpoint chat'
    );
    // The failed reply is not shown, the question is
    expect(lastReply()).toBeUndefined();
    expect(container.querySelectorAll('[data-role="user"]').length).toBe(1);
  });

  it('sends no token to a public endpoint, and Stop keeps what came', async () => {
    const session = new ChatSession(fakeApi(true), 'pub');
    await mount(session);
    expect(byTestId('lf-chat-url')?.textContent).toContain('open to the public');
    answer = { status: 200, chunks: [event('partial'), event(' more')] };
    await send('hi');
    await step();
    expect(byTestId('lf-chat-stop')).not.toBeNull();
    await act(async () => (byTestId('lf-chat-stop') as HTMLButtonElement).click());
    await flush();
    expect(lastReply()?.getAttribute('data-state')).toBe('stopped');
    expect(lastReply()?.textContent).toContain('partial');
    expect(lastReply()?.textContent).not.toContain('more');
    expect(byTestId('lf-chat-send')).not.toBeNull();
    expect(calls).toEqual([]);
    expect(
      requests.every(r => !(r.init.headers as Record<string, string> | undefined)?.Authorization)
    ).toBe(true);
  });
});

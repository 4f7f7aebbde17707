/**
 * The Chat panel's pure parts: the request body, the server-sent events parser fed chunks split
 * anywhere, OpenAI's chunks, the words of error answers, the in-memory token, and the request
 * loop against a fake `fetch` whose body streams chunk by chunk (401 renews the token once,
 * errors in the endpoint's words, Stop).
 */
import {
  chatBody,
  ChatError,
  chatErrorText,
  completionContent,
  endpointModel,
  endpointPath,
  firstModel,
  parseChunk,
  SSEParser,
  streamChat,
  TokenKeeper
} from '../chat';

const encoder = new TextEncoder();

/** A stand-in Response whose body yields `chunks` (strings or bytes) one read at a time. */
function response(
  status: number,
  chunks: (string | Uint8Array)[],
  type = 'text/event-stream',
  gate?: Promise<void>,
  signal?: AbortSignal
): Response {
  let i = 0;
  const text = chunks.map(c => (typeof c === 'string' ? c : new TextDecoder().decode(c))).join('');
  return {
    status,
    ok: status >= 200 && status < 300,
    statusText: { 200: 'OK', 401: 'Unauthorized', 429: 'Too Many Requests', 502: 'Bad Gateway' }[
      status
    ],
    headers: { get: (h: string) => (h.toLowerCase() === 'content-type' ? type : null) },
    text: async () => text,
    body: {
      getReader: () => ({
        read: async () => {
          if (i === 1 && gate) {
            await gate;
          }
          // As a real body's reader: an abort rejects the read in progress
          if (signal?.aborted) {
            throw Object.assign(new Error('The operation was aborted.'), { name: 'AbortError' });
          }
          if (i >= chunks.length) {
            return { done: true, value: undefined };
          }
          const c = chunks[i++];
          return { done: false, value: typeof c === 'string' ? encoder.encode(c) : c };
        },
        cancel: async () => undefined
      })
    }
  } as unknown as Response;
}

function sse(...contents: string[]): string {
  return (
    contents
      .map(c => `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: c } }] })}\n\n`)
      .join('') + 'data: [DONE]\n\n'
  );
}

describe('chat, pure', () => {
  it('makes the request body and the paths', () => {
    const messages = [{ role: 'user' as const, content: 'hi' }];
    expect(chatBody('m', messages)).toEqual({ model: 'm', messages, stream: true });
    expect(chatBody('m', messages, false).stream).toBe(false);
    expect(endpointPath('/services/labfleet/serve/chat/', 'v1/chat/completions')).toBe(
      '/services/labfleet/serve/chat/v1/chat/completions'
    );
    expect(endpointPath('/services/labfleet/serve/chat', '/v1/models')).toBe(
      '/services/labfleet/serve/chat/v1/models'
    );
    expect(firstModel({ data: [{ id: 'echo-chat' }, { id: 'b' }] })).toBe('echo-chat');
    expect(firstModel({ data: [] })).toBeNull();
    expect(firstModel('<html>')).toBeNull();
  });

  it('parses events whatever the chunks', () => {
    const stream = 'data: one\r\n\r\n: a comment\nevent: x\ndata: two\ndata:three\n\ndata: é€\r\r';
    const want = ['one', 'two\nthree', 'é€'];
    // Whole, and split at every place (a CRLF split between CR and LF included)
    expect(new SSEParser().feed(stream)).toEqual(want);
    for (let cut = 0; cut <= stream.length; cut++) {
      const p = new SSEParser();
      const got = [
        ...p.feed(stream.slice(0, cut)),
        ...p.feed(''),
        ...p.feed(stream.slice(cut)),
        ...p.end()
      ];
      expect(got).toEqual(want);
    }
    // Character by character
    const p = new SSEParser();
    const got: string[] = [];
    for (const c of stream) {
      got.push(...p.feed(c));
    }
    expect(got).toEqual(want);
    // A last event without its blank line counts at the end; nothing after it is invented
    const q = new SSEParser();
    expect(q.feed('data: last')).toEqual([]);
    expect(q.end()).toEqual(['last']);
    expect(q.end()).toEqual([]);
  });

  it('reads OpenAI chunks', () => {
    expect(parseChunk('[DONE]')).toEqual({ done: true, content: '' });
    expect(parseChunk('{"choices":[{"delta":{"content":" word"}}]}')).toEqual({
      done: false,
      content: ' word'
    });
    expect(parseChunk('{"choices":[{"delta":{"role":"assistant"}}]}').content).toBe('');
    expect(parseChunk('{"choices":[{"text":"legacy"}]}').content).toBe('legacy');
    expect(parseChunk('{"error":{"message":"out of memory"}}').error).toBe('out of memory');
    expect(parseChunk('not json').error).toContain('not JSON');
    expect(completionContent({ choices: [{ message: { content: 'You said: hi' } }] })).toBe(
      'You said: hi'
    );
    expect(completionContent({})).toBe('');
  });

  it('says what went wrong in the endpoint’s words', () => {
    expect(
      chatErrorText(400, 'Bad Request', {
        error: { message: "'messages' must be a non-empty list", type: 'invalid_request_error' }
      })
    ).toBe("400 Bad Request: 'messages' must be a non-empty list");
    expect(
      chatErrorText(401, 'Unauthorized', {
        status: 401,
        message: 'the token is not valid for endpoint chat'
      })
    ).toBe('401 Unauthorized: the token is not valid for endpoint chat');
    expect(chatErrorText(429, '', { status: 429, message: 'rate limit of 2 reached' })).toBe(
      '429: rate limit of 2 reached. Wait a little and send again.'
    );
    expect(chatErrorText(502, 'Bad Gateway', '<html>proxy error</html>')).toBe('502 Bad Gateway');
    expect(chatErrorText(503, '', 'no healthy replica')).toBe('503: no healthy replica');
  });
});

describe('TokenKeeper', () => {
  it('makes one token for calls at the same time, a new one on renew, and none kept on failure', async () => {
    let n = 0;
    let fail = false;
    const keeper = new TokenKeeper(async () => {
      n++;
      if (fail) {
        throw Object.assign(new Error('endpoint chat is DESTROYING'), { status: 409 });
      }
      return { id: n, token: `lfsrv_${n}_s` };
    });
    expect(keeper.id).toBeNull();
    const [a, b] = await Promise.all([keeper.get(), keeper.get()]);
    expect([a, b, n, keeper.id]).toEqual(['lfsrv_1_s', 'lfsrv_1_s', 1, 1]);
    expect(await keeper.renew()).toBe('lfsrv_2_s');
    expect(keeper.id).toBe(2);
    fail = true;
    const refused = keeper.renew();
    await expect(refused).rejects.toThrow(
      'could not make a token for the chat: endpoint chat is DESTROYING'
    );
    await expect(refused).rejects.toMatchObject({ status: 409 });
    fail = false;
    expect(await keeper.get()).toBe('lfsrv_4_s');
  });
});

describe('streamChat', () => {
  const url = '/services/labfleet/serve/chat/v1/chat/completions';
  const body = chatBody('echo-chat', [{ role: 'user', content: 'hello' }]);

  function keeper(): { tokens: TokenKeeper; made: () => number } {
    let n = 0;
    return {
      tokens: new TokenKeeper(async () => ({ id: ++n, token: `lfsrv_${n}_s` })),
      made: () => n
    };
  }

  it('passes the reply on piece by piece, with the token and without cookies', async () => {
    const { tokens } = keeper();
    const seen: RequestInit[] = [];
    const whole = sse('You', ' said:', ' héllo');
    // Split mid-event and inside the two bytes of "é"
    const bytes = encoder.encode(whole);
    const at = whole.indexOf('h') + 1 + 10;
    const fetch = async (_u: string, init?: RequestInit) => {
      seen.push(init!);
      return response(200, [bytes.slice(0, 25), bytes.slice(25, at), bytes.slice(at)]);
    };
    const deltas: string[] = [];
    const result = await streamChat({ url, body, tokens, fetch, onDelta: d => deltas.push(d) });
    expect(result).toEqual({ stopped: false });
    expect(deltas).toEqual(['You', ' said:', ' héllo']);
    expect(seen[0].method).toBe('POST');
    expect(seen[0].credentials).toBe('omit');
    expect((seen[0].headers as Record<string, string>).Authorization).toBe('Bearer lfsrv_1_s');
    expect(JSON.parse(seen[0].body as string)).toEqual(body);
  });

  it('takes a whole JSON answer too, and sends no token to a public endpoint', async () => {
    const seen: RequestInit[] = [];
    const fetch = async (_u: string, init?: RequestInit) => {
      seen.push(init!);
      return response(
        200,
        [JSON.stringify({ choices: [{ message: { content: 'You said: hello' } }] })],
        'application/json'
      );
    };
    const deltas: string[] = [];
    await streamChat({ url, body, tokens: null, fetch, onDelta: d => deltas.push(d) });
    expect(deltas).toEqual(['You said: hello']);
    expect((seen[0].headers as Record<string, string>).Authorization).toBeUndefined();
  });

  it('makes a new token after a 401, once', async () => {
    const { tokens, made } = keeper();
    const auth: string[] = [];
    let refuse = 1;
    const fetch = async (_u: string, init?: RequestInit) => {
      auth.push((init!.headers as Record<string, string>).Authorization);
      if (refuse-- > 0) {
        return response(401, ['{"status": 401, "message": "the token is not valid"}'], 'json');
      }
      return response(200, [sse('ok')]);
    };
    const deltas: string[] = [];
    await streamChat({ url, body, tokens, fetch, onDelta: d => deltas.push(d) });
    expect(auth).toEqual(['Bearer lfsrv_1_s', 'Bearer lfsrv_2_s']);
    expect(deltas).toEqual(['ok']);
    // Refused again with the new token: the error, not a loop
    refuse = 5;
    auth.length = 0;
    await expect(
      streamChat({ url, body, tokens, fetch, onDelta: () => undefined })
    ).rejects.toThrow('401 Unauthorized: the token is not valid');
    expect(auth).toEqual(['Bearer lfsrv_2_s', 'Bearer lfsrv_3_s']);
    expect(made()).toBe(3);
  });

  it('rejects with the endpoint’s words for 429, 5xx and an error in the stream', async () => {
    const { tokens } = keeper();
    const call = (r: Response) =>
      streamChat({ url, body, tokens, fetch: async () => r, onDelta: () => undefined });
    await expect(
      call(response(429, ['{"status":429,"message":"rate limit of 1 requests per minute"}']))
    ).rejects.toMatchObject({
      status: 429,
      message:
        '429 Too Many Requests: rate limit of 1 requests per minute. Wait a little and send again.'
    });
    await expect(call(response(502, ['<html>bad</html>']))).rejects.toThrow('502 Bad Gateway');
    await expect(
      call(response(200, ['data: {"error": {"message": "the model crashed"}}\n\n']))
    ).rejects.toThrow('the model crashed');
    await expect(
      streamChat({
        url,
        body,
        tokens,
        fetch: async () => {
          throw new TypeError('Failed to fetch');
        },
        onDelta: () => undefined
      })
    ).rejects.toEqual(new ChatError('the endpoint did not answer: Failed to fetch', 0));
  });

  it('stops when the signal aborts, keeping what came', async () => {
    const { tokens } = keeper();
    const controller = new AbortController();
    let release!: () => void;
    const gate = new Promise<void>(resolve => (release = resolve));
    const fetch = async (_u: string, init?: RequestInit) =>
      response(
        200,
        [sse('first').replace('data: [DONE]\n\n', ''), 'x'],
        undefined,
        gate,
        init!.signal!
      );
    const deltas: string[] = [];
    const pending = streamChat({
      url,
      body,
      tokens,
      fetch,
      signal: controller.signal,
      onDelta: d => {
        deltas.push(d);
      }
    });
    await new Promise(resolve => setTimeout(resolve, 0));
    controller.abort();
    release();
    expect(await pending).toEqual({ stopped: true });
    expect(deltas).toEqual(['first']);
  });

  it('finds the model to name, or falls back', async () => {
    const { tokens } = keeper();
    const models = response(
      200,
      [JSON.stringify({ data: [{ id: 'echo-chat' }] })],
      'application/json'
    );
    expect(
      await endpointModel({ url: 'm', tokens, fetch: async () => models, fallback: 'chat' })
    ).toBe('echo-chat');
    expect(
      await endpointModel({
        url: 'm',
        tokens,
        fetch: async () => response(404, ['no']),
        fallback: 'chat'
      })
    ).toBe('chat');
  });
});

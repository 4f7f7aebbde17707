/**
 * The Chat panel, the pure parts: the body an OpenAI-compatible `POST v1/chat/completions` takes, a
 * parser of server-sent events fed chunks split anywhere, the text of each streamed chunk, the
 * words of an error answer, the panel's own short-lived token kept in memory, and the request loop
 * that streams a reply (its `fetch` passed in, so tests run it without a server).
 */

/** One message of a conversation, as OpenAI's chat API takes it. */
export interface IChatMessage {
  role: 'system' | 'user' | 'assistant';
  content: string;
}

/** The token the panel makes for itself lives this long (seconds); a new one replaces it on 401. */
export const CHAT_TOKEN_LIFETIME_S = 3600;

/** The note the panel's tokens carry, so that the Serving section's list says what they are. */
export const CHAT_TOKEN_NOTE = 'Chat panel';

/** `<endpoint URL>v1/<path>`: the endpoint's URL ends in `/serve/<name>/`. */
export function endpointPath(endpointUrl: string, path: string): string {
  return endpointUrl.replace(/\/*$/, '/') + path.replace(/^\/+/, '');
}

/** The body of `POST v1/chat/completions`. */
export function chatBody(
  model: string,
  messages: IChatMessage[],
  stream = true
): { model: string; messages: IChatMessage[]; stream: boolean } {
  return { model, messages: messages.map(m => ({ role: m.role, content: m.content })), stream };
}

/** The first model's id in a `GET v1/models` answer; null when it names none. */
export function firstModel(body: unknown): string | null {
  const data = (body as { data?: unknown } | null)?.data;
  if (Array.isArray(data)) {
    for (const m of data) {
      const id = (m as { id?: unknown } | null)?.id;
      if (typeof id === 'string' && id) {
        return id;
      }
    }
  }
  return null;
}

/**
 * Server-sent events (the WHATWG rules that matter here): lines end in CR, LF or CRLF, a blank line
 * ends an event, `data:` lines join with a newline, comments and other fields are skipped.  Chunks
 * may split a line or a CRLF anywhere: a line waits for its end (the caller decodes bytes with a
 * streaming TextDecoder, so a character split between chunks waits there).
 */
export class SSEParser {
  /** The `data` of each event the chunk completes. */
  feed(chunk: string): string[] {
    if (!chunk) {
      return []; // (a decoder holding half a character gives '')
    }
    if (this._skipLF && chunk.startsWith('\n')) {
      chunk = chunk.slice(1); // the LF of a CRLF split between two chunks
    }
    this._skipLF = false;
    this._buffer += chunk;
    const out: string[] = [];
    let start = 0;
    for (let i = 0; i < this._buffer.length; i++) {
      const c = this._buffer[i];
      if (c !== '\n' && c !== '\r') {
        continue;
      }
      this._line(this._buffer.slice(start, i), out);
      if (c === '\r') {
        if (i + 1 === this._buffer.length) {
          this._skipLF = true;
        } else if (this._buffer[i + 1] === '\n') {
          i++;
        }
      }
      start = i + 1;
    }
    this._buffer = this._buffer.slice(start);
    return out;
  }

  /** The stream ended: a last event without its blank line still counts. */
  end(): string[] {
    const out: string[] = [];
    if (this._buffer) {
      this._line(this._buffer, out);
      this._buffer = '';
    }
    this._line('', out);
    return out;
  }

  private _line(line: string, out: string[]): void {
    if (line === '') {
      if (this._data !== null) {
        out.push(this._data);
      }
      this._data = null;
      return;
    }
    if (line.startsWith(':')) {
      return;
    }
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) {
      value = value.slice(1);
    }
    if (field === 'data') {
      this._data = this._data === null ? value : `${this._data}\n${value}`;
    }
  }

  private _buffer = '';
  private _data: string | null = null;
  private _skipLF = false;
}

/** What one streamed event says: more text, the end, or an error in the stream. */
export interface IChunk {
  done: boolean;
  content: string;
  error?: string;
}

/** The meaning of one event's `data` in OpenAI's chunk format (`[DONE]` ends the stream). */
export function parseChunk(data: string): IChunk {
  if (data.trim() === '[DONE]') {
    return { done: true, content: '' };
  }
  let obj: unknown;
  try {
    obj = JSON.parse(data);
  } catch {
    return { done: false, content: '', error: 'the endpoint sent an event that is not JSON' };
  }
  const error = openAIError(obj);
  if (error) {
    return { done: false, content: '', error };
  }
  const choice = (obj as { choices?: unknown[] } | null)?.choices?.[0] as
    { delta?: { content?: unknown }; text?: unknown } | undefined;
  const content = choice?.delta?.content ?? choice?.text;
  return { done: false, content: typeof content === 'string' ? content : '' };
}

/** The reply of a whole (not streamed) chat completion answer. */
export function completionContent(body: unknown): string {
  const choice = (body as { choices?: unknown[] } | null)?.choices?.[0] as
    { message?: { content?: unknown }; text?: unknown } | undefined;
  const content = choice?.message?.content ?? choice?.text;
  return typeof content === 'string' ? content : '';
}

/** The message of an OpenAI-style error body (`{"error": {"message": ...}}` or `{"error": "..."}`). */
function openAIError(body: unknown): string | null {
  if (!body || typeof body !== 'object') {
    return null;
  }
  const error = (body as { error?: unknown }).error;
  if (typeof error === 'string' && error.trim()) {
    return error.trim();
  }
  const message = (error as { message?: unknown } | null)?.message;
  return typeof message === 'string' && message.trim() ? message.trim() : null;
}

/** What a person reads for an error answer: `401: the token is not valid ...`. */
export function chatErrorText(status: number, statusText: string, body: unknown): string {
  let words = openAIError(body);
  if (!words && body && typeof body === 'object') {
    // The router's and the Hub's own errors: {"status": 401, "message": "..."}
    const m = (body as { message?: unknown }).message;
    words = typeof m === 'string' && m.trim() ? m.trim() : null;
  }
  if (!words && typeof body === 'string') {
    const text = body.trim();
    words = text && !text.startsWith('<') && text.length <= 300 ? text : null;
  }
  const head = `${status}${statusText ? ` ${statusText}` : ''}`;
  if (status === 429) {
    return `${head}: ${words ?? 'too many requests'}. Wait a little and send again.`;
  }
  return words ? `${head}: ${words}` : head || 'the endpoint did not answer';
}

/** A failed call of the endpoint; `status` 0 when it did not answer at all. */
export class ChatError extends Error {
  constructor(
    message: string,
    readonly status: number
  ) {
    super(message);
    this.name = 'ChatError';
  }
}

/** A token as `POST api/endpoints/{name}/tokens` answers it (its value in this answer only). */
export interface IMadeToken {
  id: number;
  token?: string;
}

/**
 * The panel's token: made on first use, kept in memory only (never in the DOM, never logged),
 * replaced by `renew()` after a 401.  Calls at the same time share one request.
 */
export class TokenKeeper {
  constructor(make: () => Promise<IMadeToken>) {
    this._make = make;
  }

  /** The id of the token in hand (the Serving section lists it under that id). */
  get id(): number | null {
    return this._id;
  }

  get(): Promise<string> {
    if (!this._pending) {
      const pending = this._make().then(
        t => {
          if (!t.token) {
            throw new ChatError('the service made a token but did not send it', 0);
          }
          this._id = t.id;
          return t.token;
        },
        (e: unknown) => {
          const status = (e as { status?: unknown }).status;
          throw new ChatError(
            `could not make a token for the chat: ${(e as Error).message ?? e}`,
            typeof status === 'number' ? status : 0
          );
        }
      );
      // A failure is not kept: the next call asks again.
      pending.catch(() => {
        if (this._pending === pending) {
          this._pending = null;
        }
      });
      this._pending = pending;
    }
    return this._pending;
  }

  /** Forget the token in hand and make another. */
  renew(): Promise<string> {
    this._pending = null;
    this._id = null;
    return this.get();
  }

  private _make: () => Promise<IMadeToken>;
  private _pending: Promise<string> | null = null;
  private _id: number | null = null;
}

type Fetch = (input: string, init?: RequestInit) => Promise<Response>;

/** How a reply ended: in full, or stopped by the caller part way. */
export interface IChatResult {
  stopped: boolean;
}

export interface IStreamOptions {
  url: string;
  body: unknown;
  /** null: the endpoint is open to the public, no token. */
  tokens: TokenKeeper | null;
  fetch: Fetch;
  signal?: AbortSignal;
  onDelta: (text: string) => void;
}

function aborted(e: unknown, signal?: AbortSignal): boolean {
  return !!signal?.aborted || (e instanceof Error && e.name === 'AbortError');
}

/**
 * One request with the token in hand (none for a public endpoint); after a 401, once more with a
 * new token.  No cookies: the endpoint (the user's own model, but code all the same) needs only
 * the token.
 */
async function authorized(
  o: Pick<IStreamOptions, 'tokens' | 'fetch' | 'signal'>,
  url: string,
  init: RequestInit & { headers: Record<string, string> }
): Promise<Response> {
  for (let attempt = 0; ; attempt++) {
    const headers = { ...init.headers };
    if (o.tokens) {
      headers.Authorization = `Bearer ${attempt ? await o.tokens.renew() : await o.tokens.get()}`;
    }
    const response = await o.fetch(url, {
      ...init,
      headers,
      signal: o.signal,
      credentials: 'omit',
      cache: 'no-store'
    });
    if (response.status !== 401 || !o.tokens || attempt > 0) {
      return response;
    }
  }
}

/** The model to name in requests: the endpoint's first in `GET v1/models`, else `fallback`. */
export async function endpointModel(
  o: Pick<IStreamOptions, 'tokens' | 'fetch' | 'signal'> & { url: string; fallback: string }
): Promise<string> {
  try {
    const response = await authorized(o, o.url, { method: 'GET', headers: {} });
    return (response.ok && firstModel(await readJSON(response))) || o.fallback;
  } catch (e) {
    if (e instanceof ChatError) {
      throw e; // no token: the chat would fail the same way
    }
    return o.fallback;
  }
}

async function readJSON(response: Response): Promise<unknown> {
  const text = await response.text().catch(() => '');
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/**
 * Send a chat request and pass the reply's text on as it streams (`onDelta` per piece).  Rejects
 * with a ChatError in the endpoint's words; resolves `{stopped: true}` when the signal aborts.
 */
export async function streamChat(o: IStreamOptions): Promise<IChatResult> {
  let response: Response;
  try {
    response = await authorized(o, o.url, {
      method: 'POST',
      headers: {
        'Content-Type': 'application/json',
        Accept: 'text/event-stream, application/json'
      },
      body: JSON.stringify(o.body)
    });
  } catch (e) {
    if (aborted(e, o.signal)) {
      return { stopped: true };
    }
    if (e instanceof ChatError) {
      throw e;
    }
    throw new ChatError(`the endpoint did not answer: ${(e as Error).message ?? e}`, 0);
  }
  if (!response.ok) {
    const body = await readJSON(response);
    throw new ChatError(chatErrorText(response.status, response.statusText, body), response.status);
  }
  const type = response.headers.get('Content-Type') ?? '';
  if (!type.includes('text/event-stream') || !response.body) {
    const body = await readJSON(response);
    const error = openAIError(body);
    if (error) {
      throw new ChatError(error, response.status);
    }
    o.onDelta(completionContent(body));
    return { stopped: false };
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const parser = new SSEParser();
  const handle = (events: string[]): boolean => {
    for (const data of events) {
      const chunk = parseChunk(data);
      if (chunk.error) {
        throw new ChatError(chunk.error, response.status);
      }
      if (chunk.content) {
        o.onDelta(chunk.content);
      }
      if (chunk.done) {
        return true;
      }
    }
    return false;
  };
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) {
        handle(parser.feed(decoder.decode()).concat(parser.end()));
        return { stopped: false };
      }
      if (handle(parser.feed(decoder.decode(value, { stream: true })))) {
        void reader.cancel().catch(() => undefined);
        return { stopped: false };
      }
    }
  } catch (e) {
    if (aborted(e, o.signal)) {
      return { stopped: true };
    }
    if (e instanceof ChatError) {
      throw e;
    }
    throw new ChatError(`the reply broke off: ${(e as Error).message ?? e}`, 0);
  }
}

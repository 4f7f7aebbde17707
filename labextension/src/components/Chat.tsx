/**
 * The Chat panel: a conversation with a serving endpoint that speaks OpenAI's chat API, in a main
 * area tab.  Requests go to the endpoint's one URL on this page's origin (the Hub's proxy), the
 * reply shows token by token as it streams, Stop aborts it.  Unless the endpoint is open to the
 * public, the panel makes a short-lived token of its own (chat.ts TokenKeeper): in memory only,
 * a new one after a 401, revoked when the tab closes.
 */
import { MainAreaWidget } from '@jupyterlab/apputils';
import { Button, ReactWidget } from '@jupyterlab/ui-components';
import * as React from 'react';

import type { FleetAPI } from '../api';
import {
  CHAT_TOKEN_LIFETIME_S,
  CHAT_TOKEN_NOTE,
  chatBody,
  endpointModel,
  endpointPath,
  type IChatMessage,
  streamChat,
  TokenKeeper
} from '../chat';
import { fleetIcon } from '../icons';
import { absoluteUrl, endpointChattable } from '../serving';
import type { IEndpoint } from '../types';
import { ErrorNote } from './common';

type Fetch = (input: string, init?: RequestInit) => Promise<Response>;

/** A message as the panel shows it: the assistant's may be streaming, stopped or failed. */
interface IShownMessage extends IChatMessage {
  state?: 'streaming' | 'stopped' | 'failed';
}

/**
 * What outlives a render: the endpoint's token and the request in flight.  The widget disposes
 * of it with the tab: the request stops and the token is revoked.
 */
export class ChatSession {
  constructor(
    readonly api: FleetAPI,
    readonly endpoint: string
  ) {
    this.tokens = new TokenKeeper(() =>
      api.createEndpointToken(endpoint, CHAT_TOKEN_LIFETIME_S, CHAT_TOKEN_NOTE)
    );
  }

  readonly tokens: TokenKeeper;
  controller: AbortController | null = null;
  model: string | null = null;

  stop(): void {
    this.controller?.abort();
  }

  dispose(): void {
    this.stop();
    const id = this.tokens.id;
    if (id !== null) {
      // Best effort: it expires on its own within the hour anyway.
      void this.api.revokeEndpointToken(this.endpoint, id).catch(() => undefined);
    }
  }
}

export function ChatPanel(props: {
  session: ChatSession;
  origin: string;
  fetch?: Fetch;
}): JSX.Element {
  const { session } = props;
  const name = session.endpoint;
  const doFetch: Fetch = props.fetch ?? ((input, init) => window.fetch(input, init));
  const [info, setInfo] = React.useState<IEndpoint | null>(null);
  const [loadError, setLoadError] = React.useState<string | null>(null);
  const [messages, setMessages] = React.useState<IShownMessage[]>([]);
  const [draft, setDraft] = React.useState('');
  const [streaming, setStreaming] = React.useState(false);
  const [error, setError] = React.useState<string | null>(null);
  const [model, setModel] = React.useState<string | null>(session.model);
  const conversation = React.useRef<HTMLDivElement>(null);

  const load = async () => {
    try {
      setInfo(await session.api.endpoint(name));
      setLoadError(null);
    } catch (e) {
      setLoadError((e as Error).message);
    }
  };
  React.useEffect(() => {
    void load();
  }, [name]);
  React.useEffect(() => {
    const el = conversation.current;
    if (el) {
      el.scrollTop = el.scrollHeight;
    }
  }, [messages]);

  const updateLast = (change: (m: IShownMessage) => IShownMessage) =>
    setMessages(ms => (ms.length ? [...ms.slice(0, -1), change(ms[ms.length - 1])] : ms));

  const send = async () => {
    const text = draft.trim();
    if (!text || streaming || !info) {
      return;
    }
    // The conversation so far, without replies that failed or never started.
    const history: IChatMessage[] = messages
      .filter(m => m.state !== 'failed' && (m.role !== 'assistant' || m.content))
      .map(m => ({ role: m.role, content: m.content }));
    history.push({ role: 'user', content: text });
    setMessages([
      ...messages,
      { role: 'user', content: text },
      { role: 'assistant', content: '', state: 'streaming' }
    ]);
    setDraft('');
    setError(null);
    setStreaming(true);
    const controller = new AbortController();
    session.controller = controller;
    const base = {
      tokens: info.open_to_public ? null : session.tokens,
      fetch: doFetch,
      signal: controller.signal
    };
    try {
      if (!session.model) {
        session.model = await endpointModel({
          ...base,
          url: endpointPath(info.url, 'v1/models'),
          fallback: name
        });
        setModel(session.model);
      }
      const result = await streamChat({
        ...base,
        url: endpointPath(info.url, 'v1/chat/completions'),
        body: chatBody(session.model, history),
        onDelta: delta => updateLast(m => ({ ...m, content: m.content + delta }))
      });
      updateLast(m => ({
        ...m,
        state: result.stopped || controller.signal.aborted ? 'stopped' : undefined
      }));
    } catch (e) {
      setError((e as Error).message);
      updateLast(m => ({ ...m, state: m.content ? 'stopped' : 'failed' }));
    } finally {
      session.controller = null;
      setStreaming(false);
    }
  };

  const url = info ? absoluteUrl(info.url, props.origin) : '';
  const shown = messages.filter(m => m.state !== 'failed');
  return (
    <div className="lf-chat" data-testid="lf-chat" data-endpoint={name}>
      <div className="lf-chat-head">
        <div className="lf-chat-title">
          <span className="lf-chat-name" data-testid="lf-chat-endpoint">
            {name}
          </span>
          {info ? (
            <span
              className={`lf-status ${endpointChattable(info.status) ? 'lf-status-running' : 'lf-status-pending'}`}
              data-testid="lf-chat-status"
            >
              {info.status}
            </span>
          ) : null}
          <span className="lf-chat-spacer" />
          <Button
            small
            minimal
            data-testid="lf-chat-clear"
            disabled={streaming || !messages.length}
            onClick={() => {
              setMessages([]);
              setError(null);
            }}
          >
            New chat
          </Button>
        </div>
        {info ? (
          <div className="lf-dim lf-small" data-testid="lf-chat-url">
            {url}
            {' · '}
            {info.open_to_public
              ? 'open to the public'
              : 'with a token of its own, in memory for this tab'}
            {model ? ` · model ${model}` : ''}
          </div>
        ) : null}
        {info && !endpointChattable(info.status) ? (
          <div className="lf-dim lf-small" data-testid="lf-chat-not-ready">
            {name} is {info.status}: it may not answer until a replica is healthy.
          </div>
        ) : null}
      </div>
      <ErrorNote message={loadError} testid="lf-chat-load-error" />
      <div
        className="lf-chat-conversation"
        ref={conversation}
        data-testid="lf-chat-conversation"
        aria-live="polite"
      >
        {shown.length ? (
          shown.map((m, i) => (
            <div
              key={i}
              className={`lf-chat-message lf-chat-${m.role}`}
              data-testid="lf-chat-message"
              data-role={m.role}
              data-state={m.state ?? 'done'}
            >
              <div className="lf-chat-role">{m.role === 'user' ? 'You' : name}</div>
              <div className="lf-chat-text" data-testid="lf-chat-text">
                {m.content}
                {m.state === 'streaming' ? <span className="lf-chat-cursor">▍</span> : null}
              </div>
              {m.state === 'stopped' ? <div className="lf-dim lf-small">(stopped)</div> : null}
            </div>
          ))
        ) : (
          <div className="lf-dim lf-chat-empty" data-testid="lf-chat-empty">
            Say something to {name}: the reply streams from its model (OpenAI's chat API,
            v1/chat/completions).
          </div>
        )}
      </div>
      <ErrorNote message={error} testid="lf-chat-error" />
      <form
        className="lf-chat-input"
        onSubmit={ev => {
          ev.preventDefault();
          void send();
        }}
      >
        <textarea
          className="jp-mod-styled lf-chat-box"
          data-testid="lf-chat-box"
          aria-label={`Message to ${name}`}
          placeholder="Message (Enter sends, Shift+Enter for a new line)"
          rows={3}
          value={draft}
          onChange={ev => setDraft(ev.currentTarget.value)}
          onKeyDown={ev => {
            if (ev.key === 'Enter' && !ev.shiftKey && !ev.nativeEvent.isComposing) {
              ev.preventDefault();
              void send();
            }
          }}
        />
        <div className="lf-chat-buttons">
          {streaming ? (
            <Button
              small
              className="lf-danger"
              data-testid="lf-chat-stop"
              onClick={() => session.stop()}
            >
              Stop
            </Button>
          ) : (
            <Button
              small
              type="submit"
              className="lf-primary"
              data-testid="lf-chat-send"
              disabled={!info || !draft.trim()}
            >
              Send
            </Button>
          )}
        </div>
      </form>
    </div>
  );
}

/** The panel's content: ChatPanel on the session that the tab's disposal ends. */
export class ChatWidget extends ReactWidget {
  constructor(session: ChatSession, origin: string = window.location.origin) {
    super();
    this.session = session;
    this._origin = origin;
    this.addClass('lf-chat-widget');
  }

  readonly session: ChatSession;

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this.session.dispose();
    super.dispose();
  }

  protected render(): JSX.Element {
    return <ChatPanel session={this.session} origin={this._origin} />;
  }

  private _origin: string;
}

/** The main area tab of an endpoint's Chat panel. */
export function chatTab(api: FleetAPI, endpoint: string): MainAreaWidget<ChatWidget> {
  const content = new ChatWidget(new ChatSession(api, endpoint));
  const tab = new MainAreaWidget({ content });
  tab.id = chatTabId(endpoint);
  tab.title.label = `Chat: ${endpoint}`;
  tab.title.caption = `Chat with the serving endpoint ${endpoint}`;
  tab.title.icon = fleetIcon;
  tab.title.closable = true;
  return tab;
}

/** One Chat tab per endpoint: its id. */
export function chatTabId(endpoint: string): string {
  return `labfleet-chat-${endpoint}`;
}

/**
 * "Serving": my model serving endpoints (a domain admin's: their domain's) with their status,
 * healthy replicas and routes; deploy one from a model folder, scale, delete, chat with it, make a
 * token (shown once with a curl line that calls the endpoint), list its tokens and revoke one
 * (`labfleet/api/endpoints...` through the session's proxy to the labfleet service).
 */
import { Clipboard } from '@jupyterlab/apputils';
import { Button, InputGroup } from '@jupyterlab/ui-components';
import * as React from 'react';

import { formatSlots } from '../slots';
import {
  absoluteUrl,
  curlLine,
  deployBody,
  EMPTY_DEPLOY_FORM,
  endpointChangeable,
  endpointChattable,
  endpointStarting,
  healthyText,
  type IDeployForm,
  listedTokens,
  reasonText,
  replicasProblem,
  requestsText,
  tokenMeta
} from '../serving';
import type { FleetStore } from '../store';
import type { IEndpoint, IEndpointRoute, IEndpointToken } from '../types';
import { type Confirm, confirmDialog, Empty, ErrorNote, Field, Select, useAction } from './common';

/** The existing status pill colours (base.css) for an endpoint's or a route's state. */
function statusClass(status: string | null | undefined): string {
  switch (status) {
    case 'READY':
    case 'RUNNING':
    case 'HEALTHY':
      return 'lf-status lf-status-running';
    case 'DEGRADED':
    case 'FAILED':
    case 'UNHEALTHY':
      return 'lf-status lf-status-error';
    case 'PENDING':
    case 'DEPLOYING':
    case 'PROVISIONING':
      return 'lf-status lf-status-pending';
    default:
      return 'lf-status';
  }
}

const CODE_STYLE: React.CSSProperties = {
  margin: '4px 0',
  padding: '4px 6px',
  whiteSpace: 'pre-wrap',
  overflowWrap: 'anywhere',
  fontFamily: 'var(--jp-code-font-family)',
  fontSize: 'var(--jp-code-font-size)',
  background: 'var(--jp-layout-color2)',
  border: 'var(--jp-border-width) solid var(--jp-border-color2)',
  borderRadius: 'var(--jp-border-radius)'
};

function Route(props: { route: IEndpointRoute }): JSX.Element {
  const r = props.route;
  return (
    <li
      className="lf-route"
      data-testid={`lf-route-${r.server}`}
      data-status={r.status}
      data-health={r.health}
      data-traffic={r.traffic}
    >
      <span className="lf-small">{r.server}</span>{' '}
      <span className={statusClass(r.status)}>{r.status}</span>{' '}
      <span className={statusClass(r.health)}>{r.health}</span>{' '}
      <span className="lf-dim lf-small">{r.traffic === 'ACTIVE' ? 'traffic' : 'no traffic'}</span>
      {r.last_error ? (
        <div className="lf-error lf-small" data-testid="lf-route-error" title={r.last_error}>
          {r.last_error}
        </div>
      ) : null}
    </li>
  );
}

/** A token just made: shown this once, with the curl line that uses it. */
function NewToken(props: { token: string; url: string; onClose: () => void }): JSX.Element {
  const line = curlLine(props.url, props.token);
  const [copied, setCopied] = React.useState(false);
  return (
    <div className="lf-info" data-testid="lf-endpoint-token">
      <div>This token is shown once: copy it now.</div>
      <pre style={CODE_STYLE} data-testid="lf-endpoint-curl">
        {line}
      </pre>
      <div className="lf-actions">
        <Button
          small
          data-testid="lf-endpoint-copy"
          onClick={() => {
            Clipboard.copyToSystem(line);
            setCopied(true);
          }}
        >
          {copied ? 'Copied' : 'Copy curl line'}
        </Button>
        <Button small minimal data-testid="lf-endpoint-token-close" onClick={props.onClose}>
          Done
        </Button>
      </div>
    </div>
  );
}

export type { Confirm };

/**
 * An endpoint's tokens in force (id, note, created, expires, last used, requests), each with
 * Revoke.  Loaded when shown, again when a token is made and when the endpoint's count of
 * requests moves (the panel's refresh).
 */
function Tokens(props: {
  store: FleetStore;
  endpoint: IEndpoint;
  version: number;
  confirm: Confirm;
}): JSX.Element {
  const { store, endpoint } = props;
  const [tokens, setTokens] = React.useState<IEndpointToken[] | null>(null);
  const [busy, error, run] = useAction();
  const load = () => run(async () => setTokens(await store.api.endpointTokens(endpoint.name)));
  React.useEffect(() => {
    void load();
  }, [props.version, endpoint.requests]);
  const revoke = async (t: IEndpointToken) => {
    const agreed = await props.confirm(
      `Revoke token ${t.id} of ${endpoint.name}?`,
      'Calls with this token get 401 from now on. This cannot be undone.',
      'Revoke'
    );
    if (agreed) {
      await run(async () => {
        await store.api.revokeEndpointToken(endpoint.name, t.id);
        setTokens(await store.api.endpointTokens(endpoint.name));
      });
    }
  };
  const listed = tokens ? listedTokens(tokens) : null;
  return (
    <div className="lf-tokens" data-testid="lf-endpoint-tokens">
      <ErrorNote message={error} testid="lf-tokens-error" />
      {listed === null ? (
        error ? null : (
          <Empty>Loading…</Empty>
        )
      ) : listed.shown.length ? (
        <ul className="lf-list">
          {listed.shown.map(t => (
            <li key={t.id} className="lf-token" data-testid={`lf-token-${t.id}`}>
              <div className="lf-session-head">
                <span className="lf-session-name">
                  Token {t.id}
                  {t.note ? <span className="lf-dim"> · {t.note}</span> : null}
                </span>
                <Button
                  small
                  className="lf-danger"
                  data-testid="lf-token-revoke"
                  aria-label={`Revoke token ${t.id}`}
                  disabled={busy}
                  onClick={() => void revoke(t)}
                >
                  Revoke
                </Button>
              </div>
              <div className="lf-dim lf-small" data-testid="lf-token-meta">
                {tokenMeta(t)}
              </div>
            </li>
          ))}
        </ul>
      ) : (
        <Empty testid="lf-tokens-empty">No token in force: make one with New token.</Empty>
      )}
      {listed?.hidden ? (
        <div className="lf-dim lf-small" data-testid="lf-tokens-hidden">
          {listed.hidden} revoked or expired not shown.
        </div>
      ) : null}
    </div>
  );
}

function EndpointItem(props: {
  store: FleetStore;
  endpoint: IEndpoint;
  origin: string;
  onChat?: (name: string) => void;
  confirm: Confirm;
}): JSX.Element {
  const { store } = props;
  const e = props.endpoint;
  const [replicas, setReplicas] = React.useState(String(e.replicas));
  const [confirming, setConfirming] = React.useState(false);
  const [token, setToken] = React.useState<string | null>(null);
  const [showTokens, setShowTokens] = React.useState(false);
  const [tokensVersion, setTokensVersion] = React.useState(0);
  const [note, setNote] = React.useState<string | null>(null);
  const [busy, error, run, setError] = useAction();
  React.useEffect(() => setReplicas(String(e.replicas)), [e.replicas]);
  const url = absoluteUrl(e.url, props.origin);
  const changeable = endpointChangeable(e.status);
  const routes = e.routes ?? [];
  const scale = async () => {
    const problem = replicasProblem(replicas);
    if (problem) {
      setError(problem);
      return;
    }
    const n = Number(replicas.trim());
    if (await run(() => store.scaleEndpoint(e.name, n))) {
      setNote(`Scaled to ${n} replica${n === 1 ? '' : 's'}.`);
    }
  };
  const remove = async () => {
    if (!confirming) {
      setConfirming(true);
      return;
    }
    setConfirming(false);
    if (await run(() => store.deleteEndpoint(e.name))) {
      setNote('Deleting: its replicas stop and its URL answers nothing.');
    }
  };
  const newToken = async () => {
    setNote(null);
    await run(async () => {
      const t = await store.createEndpointToken(e.name);
      setToken(t.token ?? null);
      setTokensVersion(v => v + 1);
    });
  };
  return (
    <li
      className="lf-endpoint"
      data-testid={`lf-endpoint-${e.name}`}
      data-status={e.status}
      data-healthy={e.healthy_replicas}
      data-replicas={e.replicas}
    >
      <div className="lf-session-head">
        <span className="lf-session-name">{e.name}</span>
        <span className={statusClass(e.status)} data-testid="lf-endpoint-status">
          {e.status}
        </span>
      </div>
      <div className="lf-dim lf-session-meta" data-testid="lf-endpoint-meta">
        {[healthyText(e), e.project, e.model_folder?.name, formatSlots(e.slots)]
          .filter(Boolean)
          .join(' · ')}
      </div>
      {reasonText(e) ? (
        <div className="lf-dim lf-small" data-testid="lf-endpoint-reason">
          {reasonText(e)}
        </div>
      ) : null}
      <div className="lf-small lf-session-meta">
        <a href={url} target="_blank" rel="noreferrer" data-testid="lf-endpoint-url">
          {url}
        </a>
        {e.open_to_public ? ' (open to the public)' : ''}
      </div>
      <div className="lf-dim lf-small">{requestsText(e)}</div>
      {routes.length ? (
        <ul className="lf-list" data-testid="lf-endpoint-routes">
          {routes.map(r => (
            <Route key={r.id} route={r} />
          ))}
        </ul>
      ) : null}
      {note ? (
        <div className="lf-info" data-testid="lf-endpoint-note">
          {note}
        </div>
      ) : null}
      <ErrorNote message={error} testid="lf-endpoint-error" />
      {token ? <NewToken token={token} url={url} onClose={() => setToken(null)} /> : null}
      {showTokens ? (
        <Tokens store={store} endpoint={e} version={tokensVersion} confirm={props.confirm} />
      ) : null}
      {changeable ? (
        <div className="lf-actions">
          {props.onChat && endpointChattable(e.status) ? (
            <Button
              small
              className="lf-primary"
              data-testid="lf-endpoint-open-chat"
              title={`Chat with ${e.name} in a new tab`}
              onClick={() => props.onChat?.(e.name)}
            >
              Chat
            </Button>
          ) : null}
          <InputGroup
            data-testid="lf-endpoint-replicas"
            aria-label={`Replicas of ${e.name}`}
            value={replicas}
            style={{ width: '4em' }}
            onChange={ev => setReplicas(ev.currentTarget.value)}
          />
          <Button
            small
            data-testid="lf-endpoint-scale"
            disabled={busy || replicas.trim() === String(e.replicas)}
            onClick={() => void scale()}
          >
            Scale
          </Button>
          <Button
            small
            data-testid="lf-endpoint-new-token"
            disabled={busy}
            onClick={() => void newToken()}
          >
            New token
          </Button>
          <Button
            small
            minimal={showTokens}
            data-testid="lf-endpoint-tokens-toggle"
            aria-expanded={showTokens}
            onClick={() => setShowTokens(!showTokens)}
          >
            {showTokens ? 'Hide tokens' : 'Tokens'}
          </Button>
          <Button
            small
            className="lf-danger"
            data-testid="lf-endpoint-delete"
            disabled={busy}
            onClick={() => void remove()}
            onBlur={() => setConfirming(false)}
          >
            {confirming ? 'Really delete?' : 'Delete'}
          </Button>
        </div>
      ) : null}
    </li>
  );
}

function DeployForm(props: { store: FleetStore; onDone: (name: string) => void }): JSX.Element {
  const { store } = props;
  const [form, setForm] = React.useState<IDeployForm>(EMPTY_DEPLOY_FORM);
  const [busy, error, run, setError] = useAction();
  React.useEffect(() => {
    void store.loadLaunchOptions();
  }, []);
  const options = store.data.launchOptions;
  const projects = options?.projects.map(p => p.name) ?? [];
  const folders = (options?.vfolders ?? []).filter(v => v.usage_mode === 'model' && v.mountable);
  const project = form.project || store.data.session?.project || projects[0] || '';
  const folder = form.folder || folders[0]?.name || '';
  const set =
    (key: keyof IDeployForm) => (ev: React.ChangeEvent<HTMLInputElement | HTMLSelectElement>) => {
      const target = ev.currentTarget as HTMLInputElement;
      setForm({ ...form, [key]: target.type === 'checkbox' ? target.checked : target.value });
    };
  const submit = async (ev: React.FormEvent) => {
    ev.preventDefault();
    let body;
    try {
      const taken = (store.data.endpoints ?? []).map(x => x.name);
      body = deployBody({ ...form, project, folder }, taken);
    } catch (err) {
      setError((err as Error).message);
      return;
    }
    if (await run(() => store.createEndpoint(body))) {
      props.onDone(body.name);
    }
  };
  return (
    <form className="lf-form" data-testid="lf-deploy-form" onSubmit={submit}>
      <Field label="Endpoint name" htmlFor="lf-deploy-name" help="Its URL ends in /serve/<name>/.">
        <InputGroup
          id="lf-deploy-name"
          data-testid="lf-deploy-name"
          value={form.name}
          placeholder="e.g. my-llm"
          aria-describedby="lf-deploy-name-help"
          onChange={set('name')}
        />
      </Field>
      <div className="lf-field-row">
        <Field label="Project" htmlFor="lf-deploy-project" wide>
          <Select
            id="lf-deploy-project"
            data-testid="lf-deploy-project"
            value={project}
            onChange={set('project')}
            options={projects.length ? projects : [{ value: '', label: 'none' }]}
          />
        </Field>
        <Field label="Model folder" htmlFor="lf-deploy-folder" wide>
          <Select
            id="lf-deploy-folder"
            data-testid="lf-deploy-folder"
            value={folder}
            onChange={set('folder')}
            options={
              folders.length
                ? folders.map(v => ({ value: v.name, label: v.name }))
                : [{ value: '', label: 'no model folder' }]
            }
          />
        </Field>
      </div>
      {options && !folders.length ? (
        <div className="lf-dim lf-small" data-testid="lf-deploy-no-folder">
          Make a folder with use "model" (Folders) holding a model-definition.yaml first.
        </div>
      ) : null}
      <ReplicaFields prefix="lf-deploy" form={form} onChange={set} />
      <label className="lf-check">
        <input
          type="checkbox"
          data-testid="lf-deploy-public"
          checked={form.openToPublic}
          onChange={set('openToPublic')}
        />{' '}
        Open to the public (no token needed)
      </label>
      <div className="lf-dim lf-small">
        Slots are per replica; each replica counts against your quota.
      </div>
      <ErrorNote message={error ?? store.errors.launchOptions} testid="lf-deploy-error" />
      <div className="lf-actions">
        <Button
          type="submit"
          small
          className="lf-primary"
          data-testid="lf-deploy-submit"
          disabled={busy}
        >
          Deploy
        </Button>
      </div>
    </form>
  );
}

export function Serving(props: {
  store: FleetStore;
  origin?: string;
  /** Open the Chat panel of an endpoint (index.ts: the `labfleet:open-chat` command). */
  onChat?: (name: string) => void;
  /** Open the Model Store (index.ts: the `labfleet:open-model-store` command). */
  onModelStore?: () => void;
  /** Ask before revoking a token; JupyterLab's dialog unless given. */
  confirm?: Confirm;
}): JSX.Element {
  const { store } = props;
  const origin = props.origin ?? window.location.origin;
  const confirm = props.confirm ?? confirmDialog;
  const endpoints = store.data.endpoints;
  const [deploying, setDeploying] = React.useState(false);
  const [deployed, setDeployed] = React.useState<string | null>(null);
  return (
    <div className="lf-serving" data-testid="lf-serving">
      {props.onModelStore ? (
        <div className="lf-actions">
          <Button
            small
            data-testid="lf-open-model-store"
            title="Shared model folders to deploy as endpoints"
            onClick={props.onModelStore}
          >
            Model Store
          </Button>
        </div>
      ) : null}
      <ErrorNote message={store.errors.endpoints} testid="lf-error-endpoints" />
      {endpoints === null ? (
        store.errors.endpoints ? null : (
          <Empty>Loading…</Empty>
        )
      ) : endpoints.length ? (
        <ul className="lf-list" data-testid="lf-endpoints-list">
          {endpoints.map(e => (
            <EndpointItem
              key={e.id}
              store={store}
              endpoint={e}
              origin={origin}
              onChat={props.onChat}
              confirm={confirm}
            />
          ))}
        </ul>
      ) : (
        <Empty testid="lf-endpoints-empty">
          No endpoints yet: deploy a model folder to serve it.
        </Empty>
      )}
      {deployed &&
      (endpoints ?? []).some(e => e.name === deployed && endpointStarting(e.status)) ? (
        <div className="lf-info" data-testid="lf-endpoint-deployed">
          Endpoint {deployed} is deploying: its replicas start like any session.
        </div>
      ) : null}
      {deploying ? (
        <DeployForm
          store={store}
          onDone={name => {
            setDeploying(false);
            setDeployed(name);
          }}
        />
      ) : null}
      <div className="lf-actions">
        <Button
          small
          minimal={deploying}
          data-testid="lf-deploy-toggle"
          aria-expanded={deploying}
          onClick={() => {
            setDeployed(null);
            setDeploying(!deploying);
          }}
        >
          {deploying ? 'Cancel' : 'Deploy a model…'}
        </Button>
      </div>
    </div>
  );
}

/** A deploy form's per-replica fields (replicas, CPU, memory, GPU share), in the sidebar's form
 * and the Model Store's dialog; ids and test ids are `<prefix>-replicas`, `-cpu`, `-mem`, `-gpu`. */
export function ReplicaFields(props: {
  prefix: string;
  form: IDeployForm;
  onChange: (key: keyof IDeployForm) => (ev: React.ChangeEvent<HTMLInputElement>) => void;
}): JSX.Element {
  const { prefix, form, onChange } = props;
  const field = (
    key: 'replicas' | 'cpu' | 'mem' | 'gpuShares',
    suffix: string,
    label: string,
    extra: { placeholder?: string; title?: string } = {}
  ) => (
    <Field label={label} htmlFor={`${prefix}-${suffix}`}>
      <InputGroup
        id={`${prefix}-${suffix}`}
        data-testid={`${prefix}-${suffix}`}
        value={form[key]}
        onChange={onChange(key)}
        {...extra}
      />
    </Field>
  );
  return (
    <div className="lf-field-row">
      {field('replicas', 'replicas', 'Replicas')}
      {field('cpu', 'cpu', 'CPU')}
      {field('mem', 'mem', 'Memory')}
      {field('gpuShares', 'gpu', 'GPU share', {
        placeholder: '0.25',
        title: 'A share of one GPU per replica (0.01 steps); empty: none'
      })}
    </div>
  );
}

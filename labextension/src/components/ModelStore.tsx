/**
 * The Model Store panel (main area): a search box and a grid of cards, one per shared model
 * folder (title, project, summary, model, Deploy).  A card opens its README; Deploy opens a small
 * dialog that posts `POST api/endpoints` and says what the service answered.
 *
 * What it talks to comes in as props (modelstore.ts passes FleetAPI calls and JupyterLab's
 * Markdown renderer), so it renders the same in jsdom.
 */
import { Button, InputGroup, ReactWidget, refreshIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';
import * as React from 'react';

import {
  cardOwnerText,
  deployBlocker,
  deployFormFor,
  filterCards,
  type IModelCard,
  modelText,
  readmeNotes
} from '../modelcards';
import { deployBody, type IDeployForm } from '../serving';
import type { IEndpoint, IEndpointCreate } from '../types';
import { Empty, ErrorNote, Field, Select, useAction } from './common';
import { ReplicaFields } from './Serving';

export interface IModelStoreProps {
  /** The cards (GET api/model-store). */
  load: () => Promise<IModelCard[]>;
  /** The caller's endpoint names, so the suggested name is free; may fail (then none). */
  endpointNames: () => Promise<string[]>;
  deploy: (body: IEndpointCreate) => Promise<IEndpoint>;
  /** The user's projects, for deploying their own folder (which belongs to none); may fail. */
  projects?: () => Promise<string[]>;
  /** README Markdown as a rendered widget; absent: the README as preformatted text. */
  renderMarkdown?: (markdown: string) => Promise<Widget>;
  /** A success notice (JupyterLab's notification); the panel says it too. */
  notify?: (message: string) => void;
}

/** The README: rendered by JupyterLab where it can, else as plain preformatted text. */
function Readme(props: {
  card: IModelCard;
  renderMarkdown?: (markdown: string) => Promise<Widget>;
}): JSX.Element {
  const { card, renderMarkdown } = props;
  const host = React.useRef<HTMLDivElement>(null);
  const [failed, setFailed] = React.useState<string | null>(null);
  // A layout effect: its clean-up runs while the host is still in the page, where Lumino can
  // detach the widget (a detached host makes Widget.detach throw).
  React.useLayoutEffect(() => {
    setFailed(null);
    if (!card.readme || !renderMarkdown) {
      return;
    }
    let live = true;
    let widget: Widget | null = null;
    renderMarkdown(card.readme)
      .then(w => {
        if (!live || !host.current || !host.current.isConnected) {
          w.dispose();
          return;
        }
        widget = w;
        Widget.attach(w, host.current);
      })
      .catch(e => live && setFailed((e as Error).message || 'cannot render it'));
    return () => {
      live = false;
      if (widget?.isAttached && widget.node.isConnected) {
        Widget.detach(widget);
      }
      if (widget && !widget.isAttached) {
        widget.dispose();
      }
    };
  }, [card.id, card.readme, renderMarkdown]);
  const notes = readmeNotes(card);
  return (
    <div className="lf-ms-readme-box">
      {notes.map(n => (
        <div key={n} className="lf-note lf-small" data-testid="lf-ms-readme-note">
          {n}
        </div>
      ))}
      {card.readme === null ? null : renderMarkdown && !failed ? (
        <div className="lf-ms-readme" data-testid="lf-ms-readme" ref={host} />
      ) : (
        <pre className="lf-ms-readme lf-ms-readme-text" data-testid="lf-ms-readme">
          {card.readme}
        </pre>
      )}
    </div>
  );
}

function ModelLine(props: { card: IModelCard }): JSX.Element {
  const m = modelText(props.card);
  return (
    <div
      className={`lf-ms-model lf-small${m.ok ? '' : ' lf-ms-model-missing'}`}
      data-testid="lf-ms-model"
      data-ok={m.ok}
      title={m.text}
    >
      {m.ok ? 'Model: ' : ''}
      {m.text}
    </div>
  );
}

function DeployButton(props: {
  card: IModelCard;
  onDeploy: (card: IModelCard) => void;
}): JSX.Element {
  const blocker = deployBlocker(props.card);
  return (
    <Button
      small
      className="lf-primary"
      data-testid="lf-ms-deploy"
      disabled={blocker !== null}
      title={blocker ?? `Serve ${props.card.name} as an endpoint`}
      aria-label={`Deploy ${props.card.title}`}
      onClick={(ev: React.MouseEvent) => {
        ev.stopPropagation();
        props.onDeploy(props.card);
      }}
    >
      Deploy
    </Button>
  );
}

function Card(props: {
  card: IModelCard;
  onOpen: (card: IModelCard) => void;
  onDeploy: (card: IModelCard) => void;
}): JSX.Element {
  const { card } = props;
  return (
    <li
      className="lf-ms-card"
      data-testid={`lf-ms-card-${card.name}`}
      data-folder-id={card.id}
      onClick={() => props.onOpen(card)}
    >
      <button
        type="button"
        className="lf-ms-card-title"
        data-testid="lf-ms-card-open"
        title={`Read about ${card.title}`}
        onClick={ev => {
          ev.stopPropagation();
          props.onOpen(card);
        }}
      >
        {card.title}
      </button>
      <div className="lf-ms-card-project lf-dim lf-small" data-testid="lf-ms-card-project">
        {cardOwnerText(card)}
        {card.title !== card.name ? ` · ${card.name}` : ''}
      </div>
      <div className="lf-ms-card-summary" data-testid="lf-ms-card-summary">
        {card.summary || <span className="lf-dim">No description.</span>}
      </div>
      <div className="lf-ms-card-foot">
        <ModelLine card={card} />
        <DeployButton card={card} onDeploy={props.onDeploy} />
      </div>
    </li>
  );
}

function Detail(props: {
  card: IModelCard;
  onBack: () => void;
  onDeploy: (card: IModelCard) => void;
  renderMarkdown?: (markdown: string) => Promise<Widget>;
}): JSX.Element {
  const { card } = props;
  return (
    <div className="lf-ms-detail" data-testid="lf-ms-detail" data-folder-id={card.id}>
      <div className="lf-ms-detail-head">
        <Button small minimal data-testid="lf-ms-back" onClick={props.onBack}>
          ← All models
        </Button>
        <DeployButton card={card} onDeploy={props.onDeploy} />
      </div>
      {card.readme !== null && card.title !== card.name ? null : (
        // The README's own heading is the title where it gave it.
        <h2 className="lf-ms-detail-title">{card.title}</h2>
      )}
      <div className="lf-ms-detail-meta lf-dim lf-small" data-testid="lf-ms-detail-meta">
        {card.project ? `Project ${card.project}` : 'Your folder'} · folder {card.name} · storage{' '}
        {card.host}
      </div>
      <ModelLine card={card} />
      <Readme card={card} renderMarkdown={props.renderMarkdown} />
    </div>
  );
}

/** The deploy dialog: endpoint name, replicas and slots per replica; the project is the folder's. */
function DeployDialog(props: {
  card: IModelCard;
  taken: string[];
  projects: string[];
  deploy: (body: IEndpointCreate) => Promise<IEndpoint>;
  onClose: () => void;
  onDeployed: (name: string) => void;
}): JSX.Element {
  const { card } = props;
  const [form, setForm] = React.useState<IDeployForm>(() =>
    deployFormFor(card, props.taken, props.projects)
  );
  const [busy, error, run, setError] = useAction();
  const first = React.useRef<HTMLInputElement>(null);
  React.useEffect(() => {
    first.current?.focus();
    first.current?.select();
  }, []);
  const set = (key: keyof IDeployForm) => (ev: React.ChangeEvent<HTMLInputElement>) =>
    setForm({ ...form, [key]: ev.currentTarget.value });
  const submit = async (ev: React.FormEvent) => {
    ev.preventDefault();
    let body: IEndpointCreate;
    try {
      body = deployBody(form, props.taken);
    } catch (e) {
      setError((e as Error).message);
      return;
    }
    if (await run(() => props.deploy(body))) {
      props.onDeployed(body.name);
    }
  };
  return (
    <div
      className="lf-ms-backdrop"
      onClick={() => !busy && props.onClose()}
      onKeyDown={ev => ev.key === 'Escape' && !busy && props.onClose()}
    >
      <form
        className="lf-ms-dialog"
        role="dialog"
        aria-modal="true"
        aria-labelledby="lf-ms-dialog-title"
        data-testid="lf-ms-deploy-dialog"
        onClick={ev => ev.stopPropagation()}
        onSubmit={submit}
      >
        <h3 id="lf-ms-dialog-title" className="lf-ms-dialog-title">
          Deploy {card.title}
        </h3>
        <div className="lf-dim lf-small">
          {card.project ? `In project ${card.project}, from` : 'From your'} folder {card.name}
          {card.model ? ` (port ${card.model.port})` : ''}.
        </div>
        {card.project ? null : (
          // The user's own folder belongs to no project: the endpoint's replicas run in one of theirs.
          <Field label="Project" htmlFor="lf-ms-deploy-project">
            <Select
              id="lf-ms-deploy-project"
              data-testid="lf-ms-deploy-project"
              value={form.project}
              onChange={ev => setForm({ ...form, project: ev.currentTarget.value })}
              options={props.projects}
            />
          </Field>
        )}
        <Field
          label="Endpoint name"
          htmlFor="lf-ms-deploy-name"
          help="Its URL ends in /serve/<name>/."
        >
          <InputGroup
            id="lf-ms-deploy-name"
            data-testid="lf-ms-deploy-name"
            inputRef={first}
            value={form.name}
            aria-describedby="lf-ms-deploy-name-help"
            onChange={set('name')}
          />
        </Field>
        <ReplicaFields prefix="lf-ms-deploy" form={form} onChange={set} />
        <div className="lf-dim lf-small">
          Per replica; each replica is a session of yours and counts against your quota.
        </div>
        <ErrorNote message={error} testid="lf-ms-deploy-error" />
        <div className="lf-actions lf-ms-dialog-actions">
          <Button
            small
            minimal
            data-testid="lf-ms-deploy-cancel"
            disabled={busy}
            onClick={props.onClose}
          >
            Cancel
          </Button>
          <Button
            type="submit"
            small
            className="lf-primary"
            data-testid="lf-ms-deploy-submit"
            disabled={busy}
          >
            {busy ? 'Deploying…' : 'Deploy'}
          </Button>
        </div>
      </form>
    </div>
  );
}

export function ModelStore(props: IModelStoreProps): JSX.Element {
  const [cards, setCards] = React.useState<IModelCard[] | null>(null);
  const [search, setSearch] = React.useState('');
  const [openId, setOpenId] = React.useState<string | null>(null);
  const [deploying, setDeploying] = React.useState<{
    card: IModelCard;
    taken: string[];
    projects: string[];
  } | null>(null);
  const [deployed, setDeployed] = React.useState<string | null>(null);
  const [loading, loadError, run] = useAction();
  const load = () => run(async () => setCards(await props.load()));
  React.useEffect(() => {
    void load();
  }, []);
  const startDeploy = async (card: IModelCard) => {
    let taken: string[] = [];
    try {
      taken = await props.endpointNames();
    } catch {
      // Only for the suggested name: the service says so if it is taken after all.
    }
    let projects: string[] = [];
    if (!card.project && props.projects) {
      try {
        projects = await props.projects();
      } catch {
        // The dialog then says no project; the service would refuse the endpoint anyway.
      }
    }
    setDeployed(null);
    setDeploying({ card, taken, projects });
  };
  const onDeployed = (name: string) => {
    setDeploying(null);
    setDeployed(name);
    props.notify?.(`Endpoint ${name} is deploying: its replicas start like any session.`);
  };
  const shown = cards ? filterCards(cards, search) : [];
  const open = cards?.find(c => c.id === openId) ?? null;
  return (
    <div className="lf-model-store" data-testid="lf-model-store">
      <div className="lf-ms-toolbar">
        <div className="lf-ms-heading">
          <h1 className="lf-ms-title">Model Store</h1>
          <div className="lf-dim lf-small">
            Your models and those your projects share. Open one to read about it; Deploy serves it
            as an endpoint.
          </div>
        </div>
        <InputGroup
          className="lf-ms-search"
          data-testid="lf-ms-search"
          type="search"
          placeholder="Search models"
          aria-label="Search models by name or title"
          value={search}
          rightIcon="ui-components:search"
          onChange={(ev: React.ChangeEvent<HTMLInputElement>) => {
            setSearch(ev.currentTarget.value);
            setOpenId(null);
          }}
        />
        <Button
          small
          minimal
          data-testid="lf-ms-refresh"
          title="Refresh"
          aria-label="Refresh"
          disabled={loading}
          onClick={() => void load()}
        >
          <refreshIcon.react tag="span" />
        </Button>
      </div>
      <ErrorNote message={loadError} testid="lf-ms-error" />
      {deployed ? (
        <div className="lf-info" data-testid="lf-ms-deployed">
          Endpoint {deployed} is deploying: follow it under Serving in the Fleet panel.
        </div>
      ) : null}
      {open ? (
        <Detail
          card={open}
          onBack={() => setOpenId(null)}
          onDeploy={c => void startDeploy(c)}
          renderMarkdown={props.renderMarkdown}
        />
      ) : cards === null ? (
        loadError ? null : (
          <Empty>Loading…</Empty>
        )
      ) : shown.length ? (
        <ul className="lf-ms-grid" data-testid="lf-ms-grid" aria-label="Models">
          {shown.map(c => (
            <Card
              key={c.id}
              card={c}
              onOpen={x => setOpenId(x.id)}
              onDeploy={x => void startDeploy(x)}
            />
          ))}
        </ul>
      ) : (
        <Empty testid="lf-ms-empty">
          {cards.length
            ? `No model matches "${search.trim()}".`
            : 'No models yet: a folder of yours or of your projects whose use is "model" shows here.'}
        </Empty>
      )}
      {deploying ? (
        <DeployDialog
          card={deploying.card}
          taken={deploying.taken}
          projects={deploying.projects}
          deploy={props.deploy}
          onClose={() => setDeploying(null)}
          onDeployed={onDeployed}
        />
      ) : null}
    </div>
  );
}

/** The panel as a Lumino widget, the content of the Model Store's MainAreaWidget. */
export class ModelStorePanel extends ReactWidget {
  constructor(private readonly _props: IModelStoreProps) {
    super();
    this.addClass('lf-model-store-panel');
  }

  protected render(): JSX.Element {
    return <ModelStore {...this._props} />;
  }
}

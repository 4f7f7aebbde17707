/**
 * The "New session" form: choices come from the service's launch options (only what the
 * user may use), and the cost of the choice against the quota left shows before it is sent.
 */
import { Button, InputGroup } from '@jupyterlab/ui-components';
import * as React from 'react';

import { memInput, toNumber } from '../format';
import type { LabfleetError } from '../api';
import {
  belowImageMinimum,
  costAgainstQuota,
  freeNowText,
  requestedSlots,
  serverNameProblem,
  sessionRequest,
  suggestServerName
} from '../sessions';
import { formatSlot, slotLabel } from '../slots';
import type { FleetStore } from '../store';
import {
  SESSION_TYPES,
  type ILaunchOptions,
  type IPreview,
  type ISpawnOptions,
  type SessionType
} from '../types';
import { Empty, ErrorNote, Field, Select } from './common';

interface IFormState {
  name: string;
  project: string;
  image: string;
  group: string;
  cpu: string;
  mem: string;
  gpu: string;
  vfolders: string[];
  type: SessionType;
  command: string;
}

function initialState(opts: ILaunchOptions, store: FleetStore): IFormState {
  const here = store.data.session;
  const taken = (store.data.sessions ?? []).map(s => s.name);
  const projects = opts.projects.map(p => p.name);
  const project =
    here?.project && projects.includes(here.project) ? here.project : (projects[0] ?? '');
  const state: IFormState = {
    name: suggestServerName(taken),
    project,
    image: '',
    group: '',
    // The service's defaults, the same in every launcher (the spawn form, the widget).
    cpu: String(opts.defaults?.cpu ?? 1),
    mem: memInput(opts.defaults?.mem ?? 2 * 2 ** 30),
    gpu: String(opts.defaults?.gpu ?? 0),
    vfolders: [],
    type: 'interactive',
    command: ''
  };
  return withDefaults(state, opts, here?.image ?? null, here?.resource_group ?? null);
}

/** Keep the image and group valid for the project and type, preferring `image` / `group`. */
function withDefaults(
  s: IFormState,
  opts: ILaunchOptions,
  image: string | null,
  group: string | null
): IFormState {
  const images = opts.images.filter(i => i.projects.includes(s.project)).map(i => i.name);
  const groups = opts.resource_groups
    .filter(g => g.session_types.includes(s.type))
    .map(g => g.name);
  const pick = (list: string[], ...prefs: (string | null)[]) =>
    prefs.find(p => p && list.includes(p)) ?? list[0] ?? '';
  return {
    ...s,
    image: pick(images, s.image, image),
    group: pick(groups, s.group, group)
  };
}

export function NewSessionForm(props: {
  store: FleetStore;
  onDone: (name: string) => void;
  onCancel: () => void;
}): JSX.Element {
  const { store } = props;
  const opts = store.data.launchOptions;
  const loadError = store.errors.launchOptions;
  const [state, setState] = React.useState<IFormState | null>(null);
  const [error, setError] = React.useState<string | null>(null);
  const [busy, setBusy] = React.useState(false);

  React.useEffect(() => {
    if (opts && state === null) {
      setState(initialState(opts, store));
    }
  }, [opts]);

  // Whether this request would start now, wait (and why) or be refused: the service judges, as
  // admission would, changing nothing; asked again a moment after each change.
  const [preview, setPreview] = React.useState<IPreview | null>(null);
  const requestKey = state && opts?.projects.length ? JSON.stringify(sessionRequest(state)) : '';
  React.useEffect(() => {
    if (!requestKey) {
      setPreview(null);
      return;
    }
    let live = true;
    const timer = window.setTimeout(() => {
      store.api.previewSession(JSON.parse(requestKey)).then(
        p => live && setPreview(p),
        // Refused as the start would be: its status and reason (none where no service answers).
        (e: LabfleetError) =>
          live && setPreview(e.status >= 400 ? { outcome: 'refused', message: e.message } : null)
      );
    }, 300);
    return () => {
      live = false;
      window.clearTimeout(timer);
    };
  }, [requestKey]);

  if (!opts || !state) {
    return (
      <div className="lf-form" data-testid="lf-new-session-form">
        <ErrorNote message={loadError} testid="lf-ns-load-error" />
        {loadError ? (
          <Button small onClick={() => void store.loadLaunchOptions()}>
            Try again
          </Button>
        ) : (
          <Empty>Loading the choices…</Empty>
        )}
      </div>
    );
  }
  if (!opts.projects.length) {
    return (
      <div className="lf-form" data-testid="lf-new-session-form">
        <Empty>
          {opts.project_admins?.length
            ? `You are not in any active project: ask ${opts.project_admins.join(', ')} to add you to one.`
            : 'You are not in any active project: ask your domain admin.'}
        </Empty>
      </div>
    );
  }

  const set = (patch: Partial<IFormState>) =>
    setState(withDefaults({ ...state, ...patch }, opts, null, null));
  const taken = (store.data.sessions ?? []).map(s => s.name);
  // Not while it starts: the new session joins the list before the form closes, and its own name
  // would read as taken.
  const nameProblem = busy ? null : serverNameProblem(state.name.trim(), taken);
  const requested = requestedSlots(state);
  const project = opts.projects.find(p => p.name === state.project);
  const cost = costAgainstQuota(requested.charged, project?.left);
  const image = opts.images.find(i => i.name === state.image);
  const belowMin = belowImageMinimum(requested.charged, image?.min_slots);
  const group = opts.resource_groups.find(g => g.name === state.group);
  const types = SESSION_TYPES.filter(t => !group || group.session_types.includes(t));
  const needsCommand = state.type !== 'interactive';
  const commandProblem =
    needsCommand && !state.command.trim() ? `a ${state.type} session needs a command` : null;
  const folders = opts.vfolders.filter(v => v.mountable);
  const invalid =
    !!nameProblem || Object.keys(requested.errors).length > 0 || !!commandProblem || !state.project;

  const submit = async (e: React.FormEvent) => {
    e.preventDefault();
    if (invalid || busy) {
      return;
    }
    const body: ISpawnOptions = { project: state.project, type: state.type };
    if (state.image) {
      body.image = state.image;
    }
    if (state.group) {
      body.resource_group = state.group;
    }
    if (state.cpu.trim()) {
      body.cpu = state.cpu.trim();
    }
    if (state.mem.trim()) {
      body.mem = state.mem.trim();
    }
    if ((toNumber(state.gpu) ?? 0) > 0) {
      body.gpu = state.gpu.trim();
    }
    if (state.vfolders.length) {
      body.vfolders = state.vfolders;
    }
    if (needsCommand) {
      body.command = state.command;
    }
    setBusy(true);
    setError(null);
    try {
      await store.startSession(state.name.trim(), body);
    } catch (err) {
      setError((err as Error).message);
      setBusy(false);
      return;
    }
    props.onDone(state.name.trim()); // busy until the form closes
  };

  const onImage = (name: string) => {
    const img = opts.images.find(i => i.name === name);
    const patch: Partial<IFormState> = { image: name };
    // Raise the amounts to the image's minimum; never lower what was typed.
    const minCpu = toNumber(img?.min_slots?.cpu);
    if (minCpu !== null && (toNumber(state.cpu) ?? 0) < minCpu) {
      patch.cpu = String(minCpu);
    }
    const minMem = toNumber(img?.min_slots?.mem);
    const mem = requestedSlots({ cpu: '', mem: state.mem, gpu: '' }).charged.mem ?? 0;
    if (minMem !== null && mem < minMem) {
      patch.mem = memInput(minMem);
    }
    set(patch);
  };

  return (
    <form className="lf-form" data-testid="lf-new-session-form" onSubmit={submit}>
      <Field label="Name" htmlFor="lf-ns-name" error={nameProblem ?? undefined}>
        <InputGroup
          id="lf-ns-name"
          data-testid="lf-ns-name"
          value={state.name}
          onChange={e => set({ name: e.currentTarget.value })}
        />
      </Field>
      <Field label="Project" htmlFor="lf-ns-project">
        <Select
          id="lf-ns-project"
          data-testid="lf-ns-project"
          value={state.project}
          onChange={e => set({ project: e.currentTarget.value })}
          options={opts.projects.map(p => p.name)}
        />
      </Field>
      <Field label="Image" htmlFor="lf-ns-image">
        <Select
          id="lf-ns-image"
          data-testid="lf-ns-image"
          value={state.image}
          onChange={e => onImage(e.currentTarget.value)}
          options={opts.images
            .filter(i => i.projects.includes(state.project))
            .map(i => ({ value: i.name, label: i.display_name || i.name }))}
        />
      </Field>
      <Field label="Resource group" htmlFor="lf-ns-group">
        <Select
          id="lf-ns-group"
          data-testid="lf-ns-group"
          value={state.group}
          onChange={e => set({ group: e.currentTarget.value })}
          options={opts.resource_groups
            .filter(g => g.session_types.includes(state.type))
            .map(g => ({
              value: g.name,
              label: g.description ? `${g.name} – ${g.description}` : g.name
            }))}
        />
      </Field>
      <div className="lf-field-row">
        <Field label="CPU cores" htmlFor="lf-ns-cpu" error={requested.errors.cpu}>
          <InputGroup
            id="lf-ns-cpu"
            data-testid="lf-ns-cpu"
            value={state.cpu}
            inputMode="decimal"
            onChange={e => set({ cpu: e.currentTarget.value })}
          />
        </Field>
        <Field label="Memory" htmlFor="lf-ns-mem" error={requested.errors.mem}>
          <InputGroup
            id="lf-ns-mem"
            data-testid="lf-ns-mem"
            value={state.mem}
            placeholder="e.g. 4g"
            onChange={e => set({ mem: e.currentTarget.value })}
          />
        </Field>
        <Field label="GPU" htmlFor="lf-ns-gpu" error={requested.errors.gpu}>
          <InputGroup
            id="lf-ns-gpu"
            data-testid="lf-ns-gpu"
            inputMode="decimal"
            value={state.gpu}
            title="Whole devices (1, 2) or a fraction of one (0.25, 0.5)"
            onChange={e => set({ gpu: e.currentTarget.value })}
          />
        </Field>
      </div>
      <Field label="Type" htmlFor="lf-ns-type">
        <Select
          id="lf-ns-type"
          data-testid="lf-ns-type"
          value={state.type}
          onChange={e => set({ type: e.currentTarget.value as SessionType })}
          options={types}
        />
      </Field>
      {needsCommand ? (
        <Field label="Command" htmlFor="lf-ns-command" error={commandProblem ?? undefined}>
          <InputGroup
            id="lf-ns-command"
            data-testid="lf-ns-command"
            value={state.command}
            placeholder={state.type === 'batch' ? 'python train.py' : 'python serve.py'}
            onChange={e => set({ command: e.currentTarget.value })}
          />
        </Field>
      ) : null}
      <fieldset className="lf-field lf-vfolders" data-testid="lf-ns-vfolders">
        <legend>Folders to mount</legend>
        {folders.length ? (
          folders.map(v => {
            const checked = v.auto || state.vfolders.includes(v.id);
            return (
              <label key={v.id} className="lf-check">
                <input
                  type="checkbox"
                  data-testid={`lf-ns-vfolder-${v.name}`}
                  checked={checked}
                  disabled={v.auto}
                  onChange={e =>
                    set({
                      vfolders: e.currentTarget.checked
                        ? [...state.vfolders, v.id]
                        : state.vfolders.filter(id => id !== v.id)
                    })
                  }
                />
                {v.name}
                <span className="lf-dim">
                  {' '}
                  {v.permission ?? ''}
                  {v.auto ? ', always mounted' : ''}
                  {v.owner.startsWith('project:') ? `, ${v.owner}` : ''}
                </span>
              </label>
            );
          })
        ) : (
          <Empty>no folders to mount</Empty>
        )}
      </fieldset>
      <div className="lf-cost" data-testid="lf-ns-cost">
        <div className="lf-subtitle">Cost against the quota left in {state.project}</div>
        {cost.rows.length ? (
          <table>
            <tbody>
              {cost.rows.map(r => (
                <tr
                  key={r.slot}
                  className={`lf-cost-row ${r.fits ? 'lf-cost-fits' : 'lf-cost-over'}`}
                  data-slot={r.slot}
                  data-testid={`lf-cost-${r.slot}`}
                >
                  <th scope="row">{slotLabel(r.slot)}</th>
                  <td>{formatSlot(r.slot, r.requested)}</td>
                  <td>
                    {r.left === null
                      ? 'no limit'
                      : r.fits
                        ? `of ${formatSlot(r.slot, r.left)} left`
                        : `only ${formatSlot(r.slot, r.left)} left`}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        ) : (
          <Empty>nothing asked beyond the defaults</Empty>
        )}
        {group?.free_now ? (
          <div className="lf-dim lf-small" data-testid="lf-ns-free">
            Free now in {group.name}, on one node: {freeNowText(group.free_now)}
          </div>
        ) : null}
        {!cost.fits ? (
          <div className="lf-warn" data-testid="lf-ns-over-quota">
            This asks more than is left: the service will refuse it.
          </div>
        ) : null}
        {belowMin.map(m => (
          <div className="lf-warn" key={m}>
            {m}
          </div>
        ))}
        {preview ? (
          <div
            className={`lf-preview lf-preview-${preview.outcome}`}
            data-testid="lf-ns-preview"
            data-outcome={preview.outcome}
          >
            {preview.message}
          </div>
        ) : null}
      </div>
      <ErrorNote message={error} testid="lf-ns-error" />
      <div className="lf-actions">
        <Button
          type="submit"
          className="lf-primary"
          data-testid="lf-ns-submit"
          small
          disabled={invalid || busy}
        >
          {busy ? 'Starting…' : 'Start session'}
        </Button>
        <Button type="button" small minimal onClick={props.onCancel}>
          Cancel
        </Button>
      </div>
    </form>
  );
}

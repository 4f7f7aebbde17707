/**
 * "Folders": my folders and those shared with me or my projects, with permission and usage;
 * create one, share one (an invitation with a permission), answer invitations, and open the
 * mounted ones in the file browser.
 */
import { Button, InputGroup } from '@jupyterlab/ui-components';
import * as React from 'react';

import { canInvite, folderUsage, permissionLabel, scopeUsage } from '../folders';
import { formatBytes, parseMem } from '../format';
import type { FleetStore } from '../store';
import { PERMISSIONS, USAGE_MODES, type IFolder, type IInvitation } from '../types';
import { Bar, Empty, ErrorNote, Field, Select, useAction, useReveal } from './common';
import { showShareLinkDialog } from './ShareLink';

function ShareForm(props: {
  store: FleetStore;
  folder: IFolder;
  onDone: (text: string) => void;
}): JSX.Element {
  const [invitee, setInvitee] = React.useState('');
  const [permission, setPermission] = React.useState('rw');
  const [busy, error, run] = useAction();
  const submit = async (e: React.FormEvent) => {
    e.preventDefault();
    const who = invitee.trim();
    if (!who) {
      return;
    }
    const ok = await run(() => props.store.invite(props.folder.id, who, permission));
    if (ok) {
      props.onDone(`${who} is invited to ${props.folder.name} (${permissionLabel(permission)}).`);
    }
  };
  return (
    <form className="lf-form lf-share-form" data-testid="lf-share-form" onSubmit={submit}>
      <Field label="Invite user" htmlFor={`lf-share-invitee-${props.folder.id}`}>
        <InputGroup
          id={`lf-share-invitee-${props.folder.id}`}
          data-testid="lf-share-invitee"
          value={invitee}
          placeholder="user name"
          onChange={e => setInvitee(e.currentTarget.value)}
        />
      </Field>
      <Field label="Permission" htmlFor={`lf-share-permission-${props.folder.id}`}>
        <Select
          id={`lf-share-permission-${props.folder.id}`}
          data-testid="lf-share-permission"
          value={permission}
          onChange={e => setPermission(e.currentTarget.value)}
          options={PERMISSIONS.map(p => ({ value: p, label: `${p} (${permissionLabel(p)})` }))}
        />
      </Field>
      <ErrorNote message={error} testid="lf-share-error" />
      <div className="lf-actions">
        <Button
          type="submit"
          small
          className="lf-primary"
          data-testid="lf-share-submit"
          disabled={busy || !invitee.trim()}
        >
          Invite
        </Button>
      </div>
    </form>
  );
}

function FolderItem(props: {
  store: FleetStore;
  folder: IFolder;
  mountedPath: string | null;
  onOpen: (path: string) => void;
  onShareLink: (folder: IFolder) => void;
}): JSX.Element {
  const f = props.folder;
  const [sharing, setSharing] = React.useState(false);
  const [note, setNote] = React.useState<string | null>(null);
  const usage = folderUsage(f, props.store.warnRatio);
  const scope = scopeUsage(f, props.store.warnRatio);
  const shown = usage.limit !== null ? usage : scope;
  const limitText =
    shown.limit === null
      ? `${formatBytes(usage.used)} used, no limit`
      : `${formatBytes(usage.used)} used${
          usage.limit !== null ? ` of ${formatBytes(usage.limit)}` : ''
        }; ${f.limits?.scope?.kind ?? ''} quota ${formatBytes(scope.used)}${
          scope.limit !== null ? ` of ${formatBytes(scope.limit)}` : ''
        }`;
  return (
    <li
      className="lf-folder-item"
      data-testid={`lf-folder-${f.name}`}
      data-folder-id={f.id}
      data-mounted={props.mountedPath ? 'true' : 'false'}
    >
      <div className="lf-folder-head">
        <span className="lf-folder-name">{f.name}</span>
        <span
          className="lf-badge"
          data-testid="lf-folder-permission"
          title={permissionLabel(f.permission)}
        >
          {f.permission ?? 'none'}
        </span>
      </div>
      <div className="lf-dim lf-folder-meta">
        {[
          f.owner_kind === 'project' ? f.owner : f.is_owner ? 'mine' : `shared by ${f.owner}`,
          f.usage_mode,
          f.host,
          f.status !== 'READY' ? f.status : null,
          props.mountedPath ? 'mounted' : null
        ]
          .filter(Boolean)
          .join(' · ')}
      </div>
      <Bar
        label={`${f.name} usage`}
        fraction={shown.fraction}
        level={shown.level}
        text={limitText}
        testid="lf-folder-usage"
      />
      <div className="lf-dim lf-small">{limitText}</div>
      {note ? <div className="lf-info">{note}</div> : null}
      <div className="lf-actions">
        {props.mountedPath ? (
          <Button
            small
            data-testid="lf-folder-open"
            onClick={() => props.onOpen(props.mountedPath!)}
            title={`Show ${props.mountedPath} in the file browser`}
          >
            Open in file browser
          </Button>
        ) : null}
        {canInvite(f) ? (
          <Button
            small
            minimal={!sharing}
            data-testid="lf-folder-share"
            aria-expanded={sharing}
            onClick={() => {
              setNote(null);
              setSharing(!sharing);
            }}
          >
            Share…
          </Button>
        ) : null}
        <Button
          small
          minimal
          data-testid="lf-folder-share-link"
          title="A link (and README badges) that imports a repository into a folder and opens it in a session"
          onClick={() => props.onShareLink(f)}
        >
          Share as a link…
        </Button>
      </div>
      {sharing ? (
        <ShareForm
          store={props.store}
          folder={f}
          onDone={text => {
            setSharing(false);
            setNote(text);
          }}
        />
      ) : null}
    </li>
  );
}

function CreateFolderForm(props: {
  store: FleetStore;
  onDone: (name: string) => void;
}): JSX.Element {
  const { store } = props;
  const [name, setName] = React.useState('');
  const [host, setHost] = React.useState('');
  const [mode, setMode] = React.useState('general');
  const [maxSize, setMaxSize] = React.useState('');
  const [busy, error, run, setError] = useAction();
  React.useEffect(() => {
    void store.loadStorageHosts();
  }, []);
  const hosts = (store.data.hosts ?? []).filter(
    h => h.is_active && (!h.rights || h.rights.includes('create-vfolder'))
  );
  const submit = async (e: React.FormEvent) => {
    e.preventDefault();
    const body: { name: string; host?: string; usage_mode: string; max_size?: number } = {
      name: name.trim(),
      usage_mode: mode
    };
    if (host) {
      body.host = host;
    }
    if (maxSize.trim()) {
      try {
        body.max_size = parseMem(maxSize, 'the size limit');
      } catch (err) {
        setError((err as Error).message);
        return;
      }
    }
    if (await run(() => store.createFolder(body))) {
      props.onDone(body.name);
    }
  };
  return (
    <form className="lf-form" data-testid="lf-folder-create" onSubmit={submit}>
      <Field
        label="Folder name"
        htmlFor="lf-folder-create-name"
        help="A name that starts with . is mounted in every session."
      >
        <InputGroup
          id="lf-folder-create-name"
          data-testid="lf-folder-create-name"
          value={name}
          placeholder="e.g. datasets"
          aria-describedby="lf-folder-create-name-help"
          onChange={e => setName(e.currentTarget.value)}
        />
      </Field>
      <div className="lf-field-row">
        <Field label="Storage host" htmlFor="lf-folder-create-host" wide>
          <Select
            id="lf-folder-create-host"
            data-testid="lf-folder-create-host"
            value={host}
            onChange={e => setHost(e.currentTarget.value)}
            options={
              // Each host once; the service's default first, and chosen by leaving the value empty.
              hosts.some(h => h.is_default)
                ? [...hosts]
                    .sort((a, b) => Number(!!b.is_default) - Number(!!a.is_default))
                    .map(h => ({
                      value: h.is_default ? '' : h.name,
                      label: h.is_default ? `${h.name} (default)` : h.name
                    }))
                : [
                    { value: '', label: 'default' },
                    ...hosts.map(h => ({ value: h.name, label: h.name }))
                  ]
            }
          />
        </Field>
        <Field label="Use" htmlFor="lf-folder-create-mode" wide>
          <Select
            id="lf-folder-create-mode"
            data-testid="lf-folder-create-mode"
            value={mode}
            onChange={e => setMode(e.currentTarget.value)}
            options={[...USAGE_MODES]}
          />
        </Field>
        <Field label="Size limit" htmlFor="lf-folder-create-max" wide>
          <InputGroup
            id="lf-folder-create-max"
            data-testid="lf-folder-create-max"
            value={maxSize}
            placeholder="none, or e.g. 10g"
            title="Empty: no limit.  A size such as 500m, 10g or 1t."
            onChange={e => setMaxSize(e.currentTarget.value)}
          />
        </Field>
      </div>
      <ErrorNote message={error ?? store.errors.hosts} testid="lf-folder-create-error" />
      <div className="lf-actions">
        <Button
          type="submit"
          small
          className="lf-primary"
          data-testid="lf-folder-create-submit"
          disabled={busy || !name.trim()}
        >
          Create
        </Button>
      </div>
    </form>
  );
}

function Invitation(props: { store: FleetStore; invitation: IInvitation }): JSX.Element {
  const inv = props.invitation;
  const [busy, error, run] = useAction();
  const mine = inv.invitee === props.store.user;
  return (
    <li className="lf-invitation" data-testid={`lf-invitation-${inv.vfolder_name}`}>
      <div>
        {mine
          ? `${inv.inviter} invites you to ${inv.vfolder_name} (${permissionLabel(inv.permission)})`
          : `You invited ${inv.invitee} to ${inv.vfolder_name} (${permissionLabel(inv.permission)}): waiting`}
      </div>
      <ErrorNote message={error} testid="lf-invitation-error" />
      {mine ? (
        <div className="lf-actions">
          <Button
            small
            className="lf-primary"
            data-testid="lf-invitation-accept"
            disabled={busy}
            onClick={() => void run(() => props.store.answerInvitation(inv.id, true))}
          >
            Accept
          </Button>
          <Button
            small
            minimal
            data-testid="lf-invitation-decline"
            disabled={busy}
            onClick={() => void run(() => props.store.answerInvitation(inv.id, false))}
          >
            Decline
          </Button>
        </div>
      ) : null}
    </li>
  );
}

export function Folders(props: {
  store: FleetStore;
  onOpen: (path: string) => void;
  /** The "Share as a link" dialog (default: JupyterLab's Dialog with the link generator). */
  onShareLink?: (folder: IFolder) => void;
}): JSX.Element {
  const { store } = props;
  const shareLink =
    props.onShareLink ?? ((f: IFolder) => void showShareLinkDialog(store.hub, f.name));
  const folders = store.data.folders;
  const invitations = (store.data.invitations ?? []).filter(i => i.state === 'pending');
  const mounted = new Map((store.data.mounted ?? []).map(m => [m.id, m.path]));
  // In the store: the Start section's "New folder" opens the form too.
  const creating = store.newFolderOpen;
  const setCreating = (open: boolean) => {
    store.newFolderOpen = open;
  };
  const [created, setCreated] = React.useState<string | null>(null);
  const formRef = React.useRef<HTMLDivElement>(null);
  useReveal(formRef, () => store.takeReveal('new-folder'));
  return (
    <div className="lf-folders" data-testid="lf-folders">
      <ErrorNote message={store.errors.folders} testid="lf-error-folders" />
      <ErrorNote message={store.errors.invitations} testid="lf-error-invitations" />
      {invitations.length ? (
        <ul className="lf-list lf-invitations" data-testid="lf-invitations">
          {invitations.map(i => (
            <Invitation key={i.id} store={store} invitation={i} />
          ))}
        </ul>
      ) : null}
      {folders === null ? (
        store.errors.folders ? null : (
          <Empty>Loading…</Empty>
        )
      ) : folders.length ? (
        <ul className="lf-list" data-testid="lf-folders-list">
          {folders.map(f => (
            <FolderItem
              key={f.id}
              store={store}
              folder={f}
              mountedPath={mounted.get(f.id) ?? null}
              onOpen={props.onOpen}
              onShareLink={shareLink}
            />
          ))}
        </ul>
      ) : (
        <Empty>No folders yet.</Empty>
      )}
      {created ? (
        <div className="lf-info" data-testid="lf-folder-created">
          Folder {created} is created; new sessions can mount it.
        </div>
      ) : null}
      {creating ? (
        <div ref={formRef} className="lf-reveal">
          <CreateFolderForm
            store={store}
            onDone={name => {
              setCreating(false);
              setCreated(name);
            }}
          />
        </div>
      ) : null}
      <div className="lf-actions">
        <Button
          small
          minimal={creating}
          data-testid="lf-folder-create-toggle"
          aria-expanded={creating}
          onClick={() => {
            setCreated(null);
            setCreating(!creating);
          }}
        >
          {creating ? 'Cancel' : 'New folder…'}
        </Button>
      </div>
    </div>
  );
}

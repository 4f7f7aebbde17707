/**
 * "Start": import a notebook, a git repository or an archive by URL into a folder (and open it
 * here, or in a session that mounts it), or go to the new-session and new-folder forms.
 */
import { Button, InputGroup } from '@jupyterlab/ui-components';
import * as React from 'react';

import {
  importLink,
  importRequest,
  importStatusText,
  labPath,
  mountPathOf,
  REPORT_KEYS,
  reportSummary,
  reportTotal
} from '../imports';
import type { FleetStore } from '../store';
import type { IImportJob } from '../types';
import { ErrorNote, Field, Select, useReveal } from './common';

/** Folders an import may write into: ready, and mine to write (rw, wd). */
function writableFolders(store: FleetStore): { value: string; label: string }[] {
  return (store.data.folders ?? [])
    .filter(f => f.status === 'READY' && (f.permission === 'rw' || f.permission === 'wd'))
    .map(f => ({
      value: f.id,
      label: f.owner_kind === 'project' ? `${f.name} (${f.owner})` : f.name
    }));
}

/** Where the import stands; once done, its report and where to open it. */
function ImportJob(props: {
  store: FleetStore;
  job: IImportJob;
  onOpenPath: (path: string) => void;
  onOpenTab: (url: string) => void;
}): JSX.Element {
  const { store, job } = props;
  const run = store.imports;
  const done = job.status === 'done';
  const total = reportTotal(job.report);
  const mountPath = done
    ? mountPathOf(job.folder, store.data.mounted, store.data.session?.mounts)
    : null;
  const hubLink = importLink(store.hub, {
    url: job.url,
    folder: job.folder.name,
    branch: run.request?.branch,
    open: run.request?.open
  });
  return (
    <div
      className={`lf-import-job lf-import-${job.status}`}
      data-testid="lf-import-job"
      data-status={job.status}
      role="status"
    >
      <div className="lf-import-status" data-testid="lf-import-status">
        {importStatusText(job)}
      </div>
      {job.message ? (
        <div className="lf-import-message" data-testid="lf-import-message">
          {job.message}
        </div>
      ) : null}
      {done && (job.resync || total > 0) ? (
        <div className="lf-import-report" data-testid="lf-import-report">
          <div data-testid="lf-import-report-counts">{reportSummary(job.report)}</div>
          {total > 0 ? (
            <details className="lf-details" data-testid="lf-import-report-names">
              <summary>Files</summary>
              {REPORT_KEYS.filter(k => job.report[k]?.length).map(k => (
                <div key={k} className="lf-import-report-group" data-testid={`lf-import-${k}`}>
                  <div className="lf-dim lf-small">{k}</div>
                  <ul className="lf-import-names">
                    {job.report[k].map(name => (
                      <li key={name}>{name}</li>
                    ))}
                  </ul>
                </div>
              ))}
            </details>
          ) : null}
        </div>
      ) : null}
      <div className="lf-actions">
        {done && mountPath ? (
          <Button
            small
            className="lf-primary"
            data-testid="lf-import-open"
            title={`Open ${labPath(mountPath, job.path)} in this Lab`}
            onClick={() => props.onOpenPath(labPath(mountPath, job.path))}
          >
            Open
          </Button>
        ) : null}
        {done && !mountPath ? (
          <Button
            small
            className="lf-primary"
            data-testid="lf-import-open-session"
            title={`This session does not mount folder ${job.folder.name}: the Hub finds or starts one that does, in a new tab`}
            onClick={() => props.onOpenTab(hubLink)}
          >
            Open in a new session
          </Button>
        ) : null}
        {run.running ? null : (
          <Button small minimal data-testid="lf-import-dismiss" onClick={() => run.clear()}>
            Dismiss
          </Button>
        )}
      </div>
    </div>
  );
}

function ImportForm(props: {
  store: FleetStore;
  onOpenPath: (path: string) => void;
  onOpenTab: (url: string) => void;
}): JSX.Element {
  const { store } = props;
  const run = store.imports;
  const [url, setUrl] = React.useState('');
  const [folder, setFolder] = React.useState('');
  const [branch, setBranch] = React.useState('');
  const [open, setOpen] = React.useState('');
  const folders = writableFolders(store);
  React.useEffect(() => {
    // The choices of folder: once, unless the Folders section keeps them fresh.
    if (store.data.folders === null && !store.isFetching('folders')) {
      void store.fetch('folders');
    }
  }, []);
  const busy = run.starting || run.running;
  const submit = (e: React.FormEvent) => {
    e.preventDefault();
    if (!url.trim() || busy) {
      return;
    }
    void run.start(importRequest({ url, folder, branch, open }));
  };
  return (
    <>
      <form className="lf-form lf-import-form" data-testid="lf-import-form" onSubmit={submit}>
        <Field
          label="URL"
          htmlFor="lf-import-url"
          help="A notebook (.ipynb), a git repository or an archive (.zip, .tar.gz)."
        >
          <InputGroup
            id="lf-import-url"
            data-testid="lf-import-url"
            value={url}
            placeholder="https://github.com/org/repo"
            aria-describedby="lf-import-url-help"
            onChange={e => setUrl(e.currentTarget.value)}
          />
        </Field>
        <Field
          label="Into folder"
          htmlFor="lf-import-folder"
          help="A new one is named after what is imported."
        >
          <Select
            id="lf-import-folder"
            data-testid="lf-import-folder"
            aria-describedby="lf-import-folder-help"
            value={folder}
            onChange={e => setFolder(e.currentTarget.value)}
            options={[{ value: '', label: 'a new folder' }, ...folders]}
          />
        </Field>
        <details className="lf-details lf-import-advanced" data-testid="lf-import-advanced">
          <summary>Advanced</summary>
          <Field label="Branch" htmlFor="lf-import-branch">
            <InputGroup
              id="lf-import-branch"
              data-testid="lf-import-branch"
              value={branch}
              placeholder="the default"
              onChange={e => setBranch(e.currentTarget.value)}
            />
          </Field>
          <Field
            label="Path to open"
            htmlFor="lf-import-open"
            help="Inside what is imported; default: the folder."
          >
            <InputGroup
              id="lf-import-open"
              data-testid="lf-import-open-path"
              value={open}
              aria-describedby="lf-import-open-help"
              placeholder="e.g. intro.ipynb"
              onChange={e => setOpen(e.currentTarget.value)}
            />
          </Field>
        </details>
        <ErrorNote message={run.error} testid="lf-import-error" />
        <div className="lf-actions">
          <Button
            type="submit"
            small
            className="lf-primary"
            data-testid="lf-import-submit"
            disabled={busy || !url.trim()}
          >
            {run.starting ? 'Importing…' : 'Import'}
          </Button>
        </div>
      </form>
      {run.job ? (
        <ImportJob
          store={store}
          job={run.job}
          onOpenPath={props.onOpenPath}
          onOpenTab={props.onOpenTab}
        />
      ) : null}
    </>
  );
}

export function Start(props: {
  store: FleetStore;
  /** Open a file or folder (relative to the Lab's root) in this Lab. */
  onOpenPath: (path: string) => void;
  /** Open a URL in a new browser tab. */
  onOpenTab: (url: string) => void;
}): JSX.Element {
  const { store } = props;
  const ref = React.useRef<HTMLDivElement>(null);
  // Opened by its command (a launcher card): the section comes into view, the URL field focused
  // (the first field in it).
  useReveal(ref, () => store.takeReveal('import'));
  return (
    <div ref={ref} className="lf-start" data-testid="lf-start">
      <div className="lf-subtitle">Import from URL</div>
      <ImportForm store={store} onOpenPath={props.onOpenPath} onOpenTab={props.onOpenTab} />
      <div className="lf-actions lf-start-new">
        <Button
          small
          data-testid="lf-start-new-session"
          title="The new-session form, under Sessions"
          onClick={() => store.showNewSession()}
        >
          New session…
        </Button>
        <Button
          small
          data-testid="lf-start-new-folder"
          title="The new-folder form, under Folders"
          onClick={() => store.showNewFolder()}
        >
          New folder…
        </Button>
      </div>
    </div>
  );
}

/**
 * "Share as a link": a link generator in the manner of nbgitpuller's.  From a repository (or a
 * notebook, or an archive) URL, a branch and a path to open, the Hub's import link, and badges
 * that link to it in Markdown and in HTML for a README.  Whoever follows the link gets the files
 * in a folder of their own and a session that opens them.
 */
import { Clipboard, Dialog, showDialog } from '@jupyterlab/apputils';
import { Button, InputGroup, ReactWidget } from '@jupyterlab/ui-components';
import * as React from 'react';

import {
  BADGE_ALT,
  badgeDataUri,
  badgeHtml,
  badgeMarkdown,
  badgeUrl,
  importLink,
  type IHubLocation
} from '../imports';
import { Field } from './common';

/** A read-only output with a copy button. */
function Output(props: {
  id: string;
  label: string;
  text: string;
  rows: number;
  copy: (text: string) => void;
}): JSX.Element {
  const [copied, setCopied] = React.useState(false);
  React.useEffect(() => setCopied(false), [props.text]);
  const id = `lf-share-link-${props.id}`;
  return (
    <Field label={props.label} htmlFor={id}>
      <div className="lf-copy-row">
        <textarea
          id={id}
          className="lf-output"
          data-testid={id}
          readOnly
          rows={props.rows}
          value={props.text}
          placeholder="Give a URL above"
          onFocus={e => e.currentTarget.select()}
        />
        <Button
          small
          data-testid={`${id}-copy`}
          disabled={!props.text}
          title={`Copy the ${props.label.toLowerCase()}`}
          onClick={() => {
            props.copy(props.text);
            setCopied(true);
          }}
        >
          {copied ? 'Copied' : 'Copy'}
        </Button>
      </div>
    </Field>
  );
}

export function ShareLinkForm(props: {
  hub: IHubLocation;
  /** The folder the dialog was opened for (named in the note). */
  folder?: string;
  /** Initial repository URL (empty: the folder view does not know where its files came from). */
  url?: string;
  copy?: (text: string) => void;
}): JSX.Element {
  const [url, setUrl] = React.useState(props.url ?? '');
  const [branch, setBranch] = React.useState('');
  const [open, setOpen] = React.useState('');
  const copy = props.copy ?? ((text: string) => Clipboard.copyToSystem(text));
  const given = url.trim() !== '';
  const link = given ? importLink(props.hub, { url, branch, open }) : '';
  const badge = badgeUrl(props.hub);
  return (
    <div className="lf-share-link" data-testid="lf-share-link">
      <p className="lf-dim lf-small">
        Whoever follows the link gets the files in a folder of their own and a session that opens
        them; following it again re-syncs them, keeping their edits.
        {props.folder ? ` It imports from the URL, not from folder ${props.folder}.` : ''}
      </p>
      <Field
        label="Repository URL"
        htmlFor="lf-share-link-url"
        help="A git repository, a notebook (.ipynb) or an archive (.zip, .tar.gz), at http, https or git."
      >
        <InputGroup
          id="lf-share-link-url"
          data-testid="lf-share-link-url"
          value={url}
          placeholder="https://github.com/org/repo"
          aria-describedby="lf-share-link-url-help"
          onChange={e => setUrl(e.currentTarget.value)}
        />
      </Field>
      <div className="lf-field-row">
        <Field label="Branch" htmlFor="lf-share-link-branch" wide>
          <InputGroup
            id="lf-share-link-branch"
            data-testid="lf-share-link-branch"
            value={branch}
            placeholder="the default"
            onChange={e => setBranch(e.currentTarget.value)}
          />
        </Field>
        <Field label="Path to open" htmlFor="lf-share-link-open" wide>
          <InputGroup
            id="lf-share-link-open"
            data-testid="lf-share-link-open"
            value={open}
            placeholder="e.g. notebooks/intro.ipynb"
            onChange={e => setOpen(e.currentTarget.value)}
          />
        </Field>
      </div>
      <Output id="plain" label="Link" text={link} rows={2} copy={copy} />
      <Output
        id="markdown"
        label="Markdown badge"
        text={given ? badgeMarkdown(link, badge) : ''}
        rows={2}
        copy={copy}
      />
      <Output
        id="html"
        label="HTML badge"
        text={given ? badgeHtml(link, badge) : ''}
        rows={2}
        copy={copy}
      />
      <div className="lf-share-link-preview lf-dim lf-small">
        <span>The badge:</span>
        <img src={badgeDataUri()} alt={BADGE_ALT} data-testid="lf-share-link-badge" />
      </div>
    </div>
  );
}

/** The dialog: the generator, and Close (Enter in a field does not close it). */
export async function showShareLinkDialog(hub: IHubLocation, folder?: string): Promise<void> {
  const body = ReactWidget.create(<ShareLinkForm hub={hub} folder={folder} />);
  body.addClass('lf-share-link-dialog');
  await showDialog({
    title: folder ? `Share as a link: ${folder}` : 'Share as a link',
    body,
    buttons: [Dialog.okButton({ label: 'Close' })],
    // No default button: Enter in a field would close the dialog and its outputs with it.
    defaultButton: -1,
    focusNodeSelector: 'input'
  });
}

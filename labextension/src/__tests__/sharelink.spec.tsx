/** The "Share as a link" generator: a URL, a branch and a path in; the link and badges out. */
import * as React from 'react';
import { act } from 'react';
import { createRoot, Root } from 'react-dom/client';

import { ShareLinkForm } from '../components/ShareLink';
import { hubLocation } from '../imports';

let container: HTMLDivElement;
let root: Root;
const copy = jest.fn();

const byTestId = (id: string) => container.querySelector(`[data-testid="${id}"]`);

function type(testid: string, value: string): void {
  const input = byTestId(testid) as HTMLInputElement;
  act(() => {
    Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value')?.set?.call(input, value);
    input.dispatchEvent(new Event('input', { bubbles: true }));
  });
}

beforeAll(() => {
  (globalThis as any).IS_REACT_ACT_ENVIRONMENT = true;
});

beforeEach(() => {
  container = document.createElement('div');
  document.body.appendChild(container);
  root = createRoot(container);
  act(() =>
    root.render(
      <ShareLinkForm
        hub={hubLocation('', '/hub/', 'https://hub.example.org')}
        folder="data"
        copy={copy}
      />
    )
  );
});

afterEach(() => {
  act(() => root.unmount());
  container.remove();
});

describe('ShareLinkForm', () => {
  it('has nothing to copy before a URL is given', () => {
    expect((byTestId('lf-share-link-url') as HTMLInputElement).value).toBe('');
    expect((byTestId('lf-share-link-plain') as HTMLTextAreaElement).value).toBe('');
    expect((byTestId('lf-share-link-plain-copy') as HTMLButtonElement).disabled).toBe(true);
    expect(byTestId('lf-share-link')?.textContent).toContain('not from folder data');
  });

  it('writes the link and both badges, and copies each', () => {
    type('lf-share-link-url', 'https://github.com/org/repo');
    type('lf-share-link-branch', 'main');
    type('lf-share-link-open', 'notebooks/intro.ipynb');
    const link =
      'https://hub.example.org/hub/labfleet/import?url=https%3A%2F%2Fgithub.com%2Forg%2Frepo' +
      '&branch=main&open=notebooks%2Fintro.ipynb';
    const badge = 'https://hub.example.org/services/labfleet/static/badge.svg';
    const value = (id: string) => (byTestId(id) as HTMLTextAreaElement).value;
    expect(value('lf-share-link-plain')).toBe(link);
    expect(value('lf-share-link-markdown')).toBe(`[![Run on labfleet](${badge})](${link})`);
    expect(value('lf-share-link-html')).toBe(
      `<a href="${link.replace(/&/g, '&amp;')}"><img src="${badge}" alt="Run on labfleet"></a>`
    );
    expect((byTestId('lf-share-link-plain') as HTMLTextAreaElement).readOnly).toBe(true);
    const button = byTestId('lf-share-link-markdown-copy') as HTMLButtonElement;
    act(() => button.click());
    expect(copy).toHaveBeenCalledWith(value('lf-share-link-markdown'));
    expect(button.textContent).toBe('Copied');
    // A change makes it a new text to copy.
    type('lf-share-link-branch', 'dev');
    expect(button.textContent).toBe('Copy');
  });

  it('previews the badge without a request', () => {
    const img = byTestId('lf-share-link-badge') as HTMLImageElement;
    expect(img.getAttribute('src')).toMatch(/^data:image\/svg\+xml/);
    expect(img.alt).toBe('Run on labfleet');
  });
});

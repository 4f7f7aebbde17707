/**
 * The Model Store plugin: the model folders the user's projects share, as cards with their README
 * and a Deploy button.  The command `labfleet:open-model-store` opens the panel
 * (components/ModelStore.tsx) in the main area, fed by the store's request (modelcards.ts) and
 * FleetAPI through the session's proxy; README Markdown is rendered by JupyterLab.
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, Notification, WidgetTracker } from '@jupyterlab/apputils';
import { PageConfig } from '@jupyterlab/coreutils';
import { IRenderMimeRegistry, MimeModel } from '@jupyterlab/rendermime';
import type { Widget } from '@lumino/widgets';

import { FleetAPI } from './api';
import { ModelStorePanel } from './components/ModelStore';
import { fleetIcon } from './icons';
import { fetchModelStore } from './modelcards';

export const OPEN_MODEL_STORE = 'labfleet:open-model-store';
const PLUGIN_ID = '@labfleet/labextension:model-store';
const PALETTE_CATEGORY = 'Fleet';
/** The commands of the Fleet sidebar (index.ts), where a deployed endpoint shows up. */
const SHOW_FLEET = 'labfleet:show';
const REFRESH_FLEET = 'labfleet:refresh';

/** Markdown rendered by JupyterLab (untrusted: its sanitizer drops scripts and unsafe HTML). */
function markdownRenderer(rendermime: IRenderMimeRegistry) {
  return async (markdown: string): Promise<Widget> => {
    const renderer = rendermime.createRenderer('text/markdown');
    await renderer.renderModel(
      new MimeModel({ data: { 'text/markdown': markdown }, trusted: false })
    );
    return renderer;
  };
}

function activate(
  app: JupyterFrontEnd,
  palette: ICommandPalette | null,
  rendermime: IRenderMimeRegistry | null,
  restorer: ILayoutRestorer | null
): void {
  const api = new FleetAPI();
  const tracker = new WidgetTracker<MainAreaWidget<ModelStorePanel>>({
    namespace: 'labfleet-model-store'
  });
  const open = () => {
    const existing = tracker.currentWidget;
    if (existing && !existing.isDisposed) {
      app.shell.activateById(existing.id);
      return existing;
    }
    const content = new ModelStorePanel({
      load: () => fetchModelStore(api),
      endpointNames: async () => (await api.endpoints()).map(e => e.name),
      projects: async () =>
        (await api.launchOptions(PageConfig.getOption('hubUser'))).projects.map(p => p.name),
      deploy: async body => {
        const endpoint = await api.createEndpoint(body);
        // The notice sends the user to the Fleet panel: it lists the endpoint now, not at its next poll.
        if (app.commands.hasCommand(REFRESH_FLEET)) {
          void app.commands.execute(REFRESH_FLEET);
        }
        return endpoint;
      },
      renderMarkdown: rendermime ? markdownRenderer(rendermime) : undefined,
      notify: message => {
        const actions = app.commands.hasCommand(SHOW_FLEET)
          ? [
              {
                label: 'Show in Fleet panel',
                callback: () => void app.commands.execute(SHOW_FLEET)
              }
            ]
          : [];
        Notification.success(message, { autoClose: 8000, actions });
      }
    });
    const widget = new MainAreaWidget({ content });
    widget.id = 'labfleet-model-store';
    widget.title.label = 'Model Store';
    widget.title.caption = 'Shared model folders of your projects, to deploy as endpoints';
    widget.title.icon = fleetIcon;
    widget.title.closable = true;
    void tracker.add(widget);
    app.shell.add(widget, 'main');
    app.shell.activateById(widget.id);
    return widget;
  };
  app.commands.addCommand(OPEN_MODEL_STORE, {
    label: 'Model Store',
    caption: 'Browse the model folders your projects share and deploy one as an endpoint',
    icon: fleetIcon,
    execute: () => {
      open();
    }
  });
  if (palette) {
    palette.addItem({ command: OPEN_MODEL_STORE, category: PALETTE_CATEGORY });
  }
  if (restorer) {
    void restorer.restore(tracker, { command: OPEN_MODEL_STORE, name: () => 'model-store' });
  }
}

export const modelStorePlugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'labfleet: the Model Store, the shared model folders to deploy as endpoints.',
  autoStart: true,
  optional: [ICommandPalette, IRenderMimeRegistry, ILayoutRestorer],
  activate
};

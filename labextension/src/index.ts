/**
 * labfleet in JupyterLab: the "Fleet" sidebar, the usage status bar item, commands and
 * settings.  Data comes from the session's server extension (api.ts); this file wires it
 * into the application: dialogs, the file browser, new tabs.
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  InputDialog,
  showDialog,
  showErrorMessage
} from '@jupyterlab/apputils';
import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { ILauncher } from '@jupyterlab/launcher';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Signal } from '@lumino/signaling';

import { FleetAPI } from './api';
import { chatTab, chatTabId } from './components/Chat';
import { fleetIcon } from './icons';
import { IdleWatch } from './idle';
import { hubLocation } from './imports';
import { modelStorePlugin } from './modelstore';
import { endpointChattable } from './serving';
import { sessionDisplayName } from './sessions';
import { FleetSidebar, type IFleetActions } from './sidebar';
import { UsageStatus } from './statusbar';
import { FleetStore } from './store';
import type { ISessionSummary } from './types';

const PLUGIN_ID = '@labfleet/labextension:plugin';

export namespace CommandIDs {
  /** Open (activate) the Fleet panel; the status bar item runs it. */
  export const show = 'labfleet:show';
  export const newSession = 'labfleet:new-session';
  /** The Start section's Import from URL: the section opens, its URL field focused. */
  export const importURL = 'labfleet:import';
  /** The Folders section's new-folder form (the Start section's New folder…). */
  export const newFolder = 'labfleet:new-folder';
  export const stopThis = 'labfleet:stop-this-session';
  export const openFolder = 'labfleet:open-folder';
  export const refresh = 'labfleet:refresh';
  /** The Chat panel of a serving endpoint (args: `{endpoint: name}`; none: ask which). */
  export const openChat = 'labfleet:open-chat';
  /** The Model Store panel (modelstore.ts registers it). */
  export const openModelStore = 'labfleet:open-model-store';
}

const PALETTE_CATEGORY = 'Fleet';
/** The launcher's section of Fleet cards (the same name as the palette's category). */
const LAUNCHER_CATEGORY = 'Fleet';
const DEFAULT_INTERVAL_S = 5;

/** Ask, then stop a session; a refusal from the service rejects with its message. */
async function confirmStop(name: string, here: boolean): Promise<boolean> {
  const result = await showDialog({
    title: here ? 'Stop this session?' : `Stop session ${sessionDisplayName(name)}?`,
    body: here
      ? 'Everything running in this session stops (kernels, terminals, apps) and this page ' +
        'loses its server. Files in your folders stay.'
      : 'Everything running in it stops. Files in your folders stay.',
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Stop session' })]
  });
  return result.button.accept;
}

function activate(
  app: JupyterFrontEnd,
  settingRegistry: ISettingRegistry | null,
  palette: ICommandPalette | null,
  statusBar: IStatusBar | null,
  restorer: ILayoutRestorer | null,
  launcher: ILauncher | null
): void {
  const api = new FleetAPI();
  const store = new FleetStore(api, {
    user: PageConfig.getOption('hubUser'),
    serverName: PageConfig.getOption('hubServerName'),
    hub: hubLocation(
      PageConfig.getOption('hubHost'),
      PageConfig.getOption('hubPrefix'),
      window.location.origin
    )
  });
  const intervalMs = DEFAULT_INTERVAL_S * 1000;

  const actions: IFleetActions = {
    stopThisSession: async () => {
      if (!(await confirmStop(store.serverName, true))) {
        return;
      }
      try {
        await store.stopThisSession();
      } catch (e) {
        await showErrorMessage('Could not stop this session', (e as Error).message);
        return;
      }
      // The server is going away: go to the Hub's home page, where the user sees it stop.
      const hubPrefix = PageConfig.getOption('hubPrefix');
      if (hubPrefix) {
        window.location.href = URLExt.join(hubPrefix, 'home');
      }
    },
    stopSession: async (s: ISessionSummary) => {
      if (s.current || s.name === store.serverName) {
        return actions.stopThisSession();
      }
      if (await confirmStop(s.name, false)) {
        await store.stopSession(s.name);
      }
    },
    openSession: (s: ISessionSummary) => {
      if (s.url) {
        window.open(s.url, '_blank');
      }
    },
    openFolder: (path: string) => {
      void app.commands.execute('filebrowser:open-path', { path });
    },
    openApp: service => {
      window.open(service.url, '_blank');
    },
    openPath: (path: string) => {
      // A file opens in its editor (the file browser goes to its folder); a folder is shown.
      void app.commands.execute('filebrowser:open-path', { path });
    },
    openTab: (url: string) => {
      window.open(url, '_blank', 'noopener');
    },
    openChat: (endpoint: string) => {
      void app.commands.execute(CommandIDs.openChat, { endpoint });
    },
    openModelStore: () => {
      if (app.commands.hasCommand(CommandIDs.openModelStore)) {
        void app.commands.execute(CommandIDs.openModelStore);
      } else {
        void showErrorMessage('No Model Store', 'The Model Store is not installed in this Lab.');
      }
    }
  };

  // The countdown to an idle reclamation: the panel, the status bar and notifications.
  const idle = new IdleWatch(store);
  const sidebar = new FleetSidebar(store, actions, intervalMs, idle);
  app.shell.add(sidebar, 'left', { rank: 850 });
  if (restorer) {
    restorer.add(sidebar, sidebar.id);
  }

  let usage: UsageStatus | null = null;
  let showStatus = true;
  const statusChanged = new Signal<FleetStore, void>(store);
  if (statusBar) {
    // A click, Enter or Space on the item opens the Fleet panel (the same command as the palette's).
    usage = new UsageStatus(
      api,
      intervalMs,
      () => void app.commands.execute(CommandIDs.show),
      idle
    );
    statusBar.registerStatusItem('@labfleet/labextension:usage', {
      item: usage,
      align: 'left',
      rank: 5,
      isActive: () => showStatus,
      activeStateChanged: statusChanged
    });
  }

  const { commands } = app;
  commands.addCommand(CommandIDs.show, {
    label: 'Show the Fleet panel',
    icon: fleetIcon,
    execute: () => app.shell.activateById(sidebar.id)
  });
  commands.addCommand(CommandIDs.refresh, {
    label: 'Refresh the Fleet panel',
    execute: () => sidebar.refresh()
  });
  // A launcher card says what it opens without the ellipsis of a menu or palette item.
  commands.addCommand(CommandIDs.importURL, {
    label: args => (args.isLauncher ? 'Import from URL' : 'Import from URL…'),
    caption: 'Import a notebook, a git repository or an archive by URL into a folder',
    icon: fleetIcon,
    execute: () => {
      app.shell.activateById(sidebar.id);
      store.showImport();
    }
  });
  commands.addCommand(CommandIDs.newSession, {
    label: args => (args.isLauncher ? 'New session' : 'New session…'),
    caption: 'Start another labfleet session (project, image, resources)',
    icon: fleetIcon,
    execute: () => {
      app.shell.activateById(sidebar.id);
      store.showNewSession();
    }
  });
  commands.addCommand(CommandIDs.newFolder, {
    label: args => (args.isLauncher ? 'New folder' : 'New folder…'),
    caption: 'Create a virtual folder that sessions can mount',
    icon: fleetIcon,
    execute: () => {
      app.shell.activateById(sidebar.id);
      store.showNewFolder();
    }
  });
  commands.addCommand(CommandIDs.stopThis, {
    label: 'Stop this session…',
    caption: 'Stop the labfleet session this Lab runs in (asks first)',
    execute: () => actions.stopThisSession()
  });
  commands.addCommand(CommandIDs.openFolder, {
    label: args => (args.name ? `Open folder ${args.name}` : 'Open a mounted folder…'),
    caption: 'Show a virtual folder mounted in this session in the file browser',
    execute: async args => {
      let name = (args.name as string | undefined) ?? '';
      if (!name) {
        let mounted: string[];
        try {
          mounted = (await api.mountedFolders()).map(m => m.name);
        } catch (e) {
          await showErrorMessage('Could not list the mounted folders', (e as Error).message);
          return;
        }
        if (!mounted.length) {
          await showErrorMessage('No folders', 'No virtual folder is mounted in this session.');
          return;
        }
        const choice = await InputDialog.getItem({
          title: 'Open a mounted folder',
          items: mounted
        });
        if (!choice.button.accept || !choice.value) {
          return;
        }
        name = choice.value;
      }
      actions.openFolder(`vfolders/${name}`);
    }
  });
  commands.addCommand(CommandIDs.openChat, {
    label: args => (args.endpoint ? `Chat with ${args.endpoint}` : 'Chat with an endpoint…'),
    caption: 'Chat with a serving endpoint that speaks the OpenAI chat API',
    icon: fleetIcon,
    execute: async args => {
      let name = (args.endpoint as string | undefined) ?? '';
      if (!name) {
        let ready: string[];
        try {
          ready = (await api.endpoints()).filter(e => endpointChattable(e.status)).map(e => e.name);
        } catch (e) {
          await showErrorMessage('Could not list the endpoints', (e as Error).message);
          return;
        }
        if (!ready.length) {
          await showErrorMessage('No endpoint', 'None of your endpoints is ready to chat.');
          return;
        }
        const choice = await InputDialog.getItem({ title: 'Chat with an endpoint', items: ready });
        if (!choice.button.accept || !choice.value) {
          return;
        }
        name = choice.value;
      }
      // One tab per endpoint: a second Chat brings the first to the front.
      const id = chatTabId(name);
      for (const w of app.shell.widgets('main')) {
        if (w.id === id) {
          app.shell.activateById(id);
          return;
        }
      }
      app.shell.add(chatTab(api, name), 'main');
      app.shell.activateById(id);
    }
  });
  if (palette) {
    for (const command of [
      CommandIDs.show,
      CommandIDs.importURL,
      CommandIDs.newSession,
      CommandIDs.newFolder,
      CommandIDs.stopThis,
      CommandIDs.openFolder,
      CommandIDs.refresh,
      CommandIDs.openChat
    ]) {
      palette.addItem({ command, category: PALETTE_CATEGORY });
    }
  }
  if (launcher) {
    [CommandIDs.importURL, CommandIDs.newSession, CommandIDs.newFolder].forEach((command, rank) =>
      launcher.add({ command, args: { isLauncher: true }, category: LAUNCHER_CATEGORY, rank })
    );
  }

  if (settingRegistry) {
    const apply = (settings: ISettingRegistry.ISettings) => {
      const seconds = Number(settings.get('refreshInterval').composite);
      const ms = (Number.isFinite(seconds) && seconds > 0 ? seconds : DEFAULT_INTERVAL_S) * 1000;
      sidebar.intervalMs = ms;
      if (usage) {
        usage.intervalMs = ms;
      }
      const ratio = Number(settings.get('quotaWarnRatio').composite);
      if (Number.isFinite(ratio) && ratio > 0) {
        store.warnRatio = ratio;
      }
      const show = settings.get('showStatusBar').composite !== false;
      if (show !== showStatus) {
        showStatus = show;
        statusChanged.emit();
      }
    };
    Promise.all([settingRegistry.load(PLUGIN_ID), app.restored])
      .then(([settings]) => {
        apply(settings);
        settings.changed.connect(apply);
      })
      .catch(reason => {
        console.error('labfleet: cannot load the settings', reason);
      });
  }
}

/** The Fleet plugin itself (the default export lists it with the Model Store's). */
export const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description:
    'labfleet: this session, quotas, usage, sessions, folders and apps; GPU use in the status bar.',
  autoStart: true,
  optional: [ISettingRegistry, ICommandPalette, IStatusBar, ILayoutRestorer, ILauncher],
  activate
};

export default [plugin, modelStorePlugin];

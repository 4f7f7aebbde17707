/**
 * The launcher's Fleet cards and their commands: Import from URL (the Start section opens, its
 * URL field focused), New session and New folder (their forms open), in the launcher when
 * JupyterLab has one (an optional dependency) and in the command palette.
 */
import type { JupyterFrontEnd } from '@jupyterlab/application';
import type { ICommandPalette } from '@jupyterlab/apputils';
import type { ILauncher } from '@jupyterlab/launcher';
import { CommandRegistry } from '@lumino/commands';
import { MessageLoop } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';
import { act } from 'react';

import { FleetAPI } from '../api';
import { CommandIDs, plugin } from '../index';
import type { FleetSidebar } from '../sidebar';

/** Every FleetAPI request answers from memory (an empty list): none reaches a server. */
function fakeRequests(): void {
  for (const name of Object.getOwnPropertyNames(FleetAPI.prototype)) {
    if (name !== 'constructor' && name !== 'settings') {
      jest.spyOn(FleetAPI.prototype as any, name).mockImplementation(async () => []);
    }
  }
}

beforeAll(() => {
  (globalThis as any).IS_REACT_ACT_ENVIRONMENT = true;
});

describe('the Fleet launcher cards', () => {
  let commands: CommandRegistry;
  let shell: { add: jest.Mock; activateById: jest.Mock };
  let launcher: { add: jest.Mock };
  let palette: { addItem: jest.Mock };
  let sidebar: FleetSidebar;

  beforeEach(async () => {
    fakeRequests();
    commands = new CommandRegistry();
    shell = { add: jest.fn(), activateById: jest.fn() };
    launcher = { add: jest.fn() };
    palette = { addItem: jest.fn() };
    const app = { commands, shell, restored: Promise.resolve() } as unknown as JupyterFrontEnd;
    plugin.activate(
      app,
      null,
      palette as unknown as ICommandPalette,
      null,
      null,
      launcher as unknown as ILauncher
    );
    sidebar = shell.add.mock.calls[0][0] as FleetSidebar;
    await act(async () => {
      Widget.attach(sidebar, document.body);
      MessageLoop.sendMessage(sidebar, Widget.Msg.UpdateRequest);
    });
  });

  afterEach(() => {
    act(() => sidebar.dispose());
    jest.restoreAllMocks();
  });

  it('adds three cards in the Fleet category, in order', () => {
    expect(CommandIDs.importURL).toBe('labfleet:import');
    expect(CommandIDs.newFolder).toBe('labfleet:new-folder');
    const items = launcher.add.mock.calls.map(c => c[0]);
    expect(items.map(i => i.command)).toEqual([
      'labfleet:import',
      'labfleet:new-session',
      'labfleet:new-folder'
    ]);
    expect(items.every(i => i.category === 'Fleet')).toBe(true);
    expect(items.map(i => i.rank)).toEqual([0, 1, 2]);
    // The launcher gives a card's args to the command's label and icon.
    expect(items.map(i => commands.label(i.command, i.args))).toEqual([
      'Import from URL',
      'New session',
      'New folder'
    ]);
    for (const i of items) {
      expect(commands.icon(i.command, i.args)).toBeTruthy();
    }
  });

  it('lists the commands in the palette under Fleet, with an ellipsis', () => {
    const listed = palette.addItem.mock.calls.map(c => c[0]);
    for (const command of [CommandIDs.importURL, CommandIDs.newSession, CommandIDs.newFolder]) {
      expect(listed).toContainEqual({ command, category: 'Fleet' });
    }
    expect(commands.label(CommandIDs.importURL)).toBe('Import from URL…');
    expect(commands.label(CommandIDs.newFolder)).toBe('New folder…');
  });

  it('Import from URL opens the Start section with its URL field focused', async () => {
    act(() => {
      sidebar.store.toggle('start', false);
      MessageLoop.flush();
    });
    expect(sidebar.node.querySelector('[data-testid="lf-import-url"]')).toBeNull();
    await act(async () => {
      await commands.execute(CommandIDs.importURL, { isLauncher: true });
      MessageLoop.flush();
    });
    expect(shell.activateById).toHaveBeenCalledWith('labfleet-sidebar');
    expect(sidebar.store.isOpen('start')).toBe(true);
    const url = sidebar.node.querySelector('[data-testid="lf-import-url"]');
    expect(url).not.toBeNull();
    expect(document.activeElement).toBe(url);
  });

  it('New folder opens the new-folder form, its name focused', async () => {
    await act(async () => {
      await commands.execute(CommandIDs.newFolder, { isLauncher: true });
      MessageLoop.flush();
    });
    expect(shell.activateById).toHaveBeenCalledWith('labfleet-sidebar');
    expect(sidebar.store.newFolderOpen).toBe(true);
    expect(document.activeElement).toBe(
      sidebar.node.querySelector('[data-testid="lf-folder-create-name"]')
    );
  });
});

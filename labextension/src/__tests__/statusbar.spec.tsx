/**
 * The status bar item opens the Fleet panel: a click anywhere on it (not only on its text),
 * Enter or Space when it has the focus.  Once on the widget alone, once through the plugin:
 * the item runs the command `labfleet:show`, which activates the sidebar in the shell.
 */
import type { JupyterFrontEnd } from '@jupyterlab/application';
import type { IStatusBar } from '@jupyterlab/statusbar';
import { CommandRegistry } from '@lumino/commands';
import { MessageLoop } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';
import { act } from 'react';

import { FleetAPI } from '../api';
import { plugin, CommandIDs } from '../index';
import { UsageStatus } from '../statusbar';
import type { IUsage } from '../types';

const USAGE: IUsage = {
  gpus: [
    {
      index: 0,
      uuid: 'GPU-1',
      model: 'A100-80GB',
      utilization: 40,
      memory_used: 2 * 2 ** 30,
      memory_total: 80 * 2 ** 30,
      memory_limit: 40 * 2 ** 30,
      shares: 0.5
    }
  ],
  cpu: { percent: 12 },
  memory: { used: 2 ** 30 }
} as unknown as IUsage;

/** A FleetAPI that answers every request from memory (none reaches a server). */
function fakeApi(): FleetAPI {
  const api = Object.create(FleetAPI.prototype) as FleetAPI;
  for (const name of Object.getOwnPropertyNames(FleetAPI.prototype)) {
    if (name !== 'constructor' && name !== 'settings') {
      (api as any)[name] = async () => (name === 'usage' ? USAGE : []);
    }
  }
  return api;
}

function click(target: Element, init: MouseEventInit = {}): void {
  target.dispatchEvent(new MouseEvent('click', { bubbles: true, cancelable: true, ...init }));
}

function key(target: Element, k: string, init: KeyboardEventInit = {}): KeyboardEvent {
  const event = new KeyboardEvent('keydown', { key: k, bubbles: true, cancelable: true, ...init });
  target.dispatchEvent(event);
  return event;
}

/** Attach the item and let React render it. */
async function show(item: UsageStatus): Promise<void> {
  await act(async () => {
    Widget.attach(item, document.body);
    MessageLoop.sendMessage(item, Widget.Msg.UpdateRequest);
  });
}

beforeAll(() => {
  (globalThis as any).IS_REACT_ACT_ENVIRONMENT = true;
});

describe('UsageStatus', () => {
  let item: UsageStatus;
  let onActivate: jest.Mock;

  beforeEach(async () => {
    onActivate = jest.fn();
    item = new UsageStatus(fakeApi(), 5000, onActivate);
    await show(item);
  });

  afterEach(() => {
    act(() => item.dispose());
  });

  it('is a focusable button with a label', () => {
    expect(item.node.getAttribute('role')).toBe('button');
    expect(item.node.tabIndex).toBe(0);
    expect(item.node.getAttribute('aria-label')).toMatch(/^Open the Fleet panel/);
    // the status bar's hover look for items that do something
    expect(item.hasClass('jp-mod-highlighted')).toBe(true);
  });

  it('opens on a click on its text or anywhere else on the item', () => {
    const text = item.node.querySelector('[data-testid="lf-statusbar"]');
    expect(text).not.toBeNull();
    click(text!);
    expect(onActivate).toHaveBeenCalledTimes(1);
    click(item.node); // the item's padding, outside the text
    expect(onActivate).toHaveBeenCalledTimes(2);
    click(item.node, { button: 2 }); // not on a right click
    expect(onActivate).toHaveBeenCalledTimes(2);
  });

  it('opens on Enter and Space, not on other keys', () => {
    const enter = key(item.node, 'Enter');
    expect(onActivate).toHaveBeenCalledTimes(1);
    expect(enter.defaultPrevented).toBe(true);
    const space = key(item.node, ' ');
    expect(onActivate).toHaveBeenCalledTimes(2);
    expect(space.defaultPrevented).toBe(true); // the page does not scroll
    key(item.node, 'a');
    key(item.node, 'Enter', { ctrlKey: true });
    expect(onActivate).toHaveBeenCalledTimes(2);
  });

  it('says what it shows once the usage is loaded', async () => {
    await act(async () => {
      await (item as any)._load();
    });
    expect(item.node.getAttribute('aria-label')).toMatch(
      /^Open the Fleet panel \(labfleet usage GPU/
    );
  });
});

describe('the plugin', () => {
  let commands: CommandRegistry;
  let shell: { add: jest.Mock; activateById: jest.Mock };
  let statusBar: { registerStatusItem: jest.Mock };
  let item: UsageStatus;

  beforeEach(async () => {
    // No request leaves the test: every FleetAPI the plugin makes answers from memory.
    const fake = fakeApi();
    for (const name of Object.getOwnPropertyNames(FleetAPI.prototype)) {
      if (name !== 'constructor' && name !== 'settings') {
        jest.spyOn(FleetAPI.prototype as any, name).mockImplementation((fake as any)[name]);
      }
    }
    commands = new CommandRegistry();
    shell = { add: jest.fn(), activateById: jest.fn() };
    statusBar = { registerStatusItem: jest.fn() };
    const app = { commands, shell, restored: Promise.resolve() } as unknown as JupyterFrontEnd;
    plugin.activate(app, null, null, statusBar as unknown as IStatusBar, null);
    expect(statusBar.registerStatusItem).toHaveBeenCalledTimes(1);
    item = statusBar.registerStatusItem.mock.calls[0][1].item;
    await show(item);
  });

  afterEach(() => {
    act(() => {
      item.dispose();
      (shell.add.mock.calls[0][0] as Widget).dispose();
    });
    jest.restoreAllMocks();
  });

  it('has a command that opens the Fleet panel', () => {
    expect(commands.hasCommand(CommandIDs.show)).toBe(true);
    expect(CommandIDs.show).toBe('labfleet:show');
    expect(shell.add).toHaveBeenCalledWith(expect.anything(), 'left', expect.anything());
    expect((shell.add.mock.calls[0][0] as Widget).id).toBe('labfleet-sidebar');
  });

  it('opens the Fleet panel when the status bar item is clicked', async () => {
    const execute = jest.spyOn(commands, 'execute');
    await act(async () => click(item.node.querySelector('[data-testid="lf-statusbar"]')!));
    expect(execute).toHaveBeenCalledWith(CommandIDs.show);
    expect(shell.activateById).toHaveBeenCalledWith('labfleet-sidebar');
  });

  it('opens the Fleet panel on Enter and Space', async () => {
    await act(async () => void key(item.node, 'Enter'));
    expect(shell.activateById).toHaveBeenCalledTimes(1);
    await act(async () => void key(item.node, ' '));
    expect(shell.activateById).toHaveBeenCalledTimes(2);
    expect(shell.activateById).toHaveBeenLastCalledWith('labfleet-sidebar');
  });
});

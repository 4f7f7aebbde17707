import { canInvite, folderUsage } from '../folders';
import { formatBytes, formatDuration, memInput, parseMem } from '../format';
import { formatQuotaRow, quotaLevel, quotaRows } from '../quota';
import {
  belowImageMinimum,
  costAgainstQuota,
  freeNowLines,
  freeNowText,
  requestedSlots,
  serverNameProblem,
  sessionRequest,
  sessionStatusLabel,
  suggestServerName,
  timeLeftLevel,
  timeLeftNow
} from '../sessions';
import { deviceLabel, formatSlot, formatSlots, gpuShareLabel } from '../slots';
import type { IFolder, IUsage } from '../types';
import { usageSummary, usageTooltip } from '../usage';

const GiB = 2 ** 30;

describe('formatting', () => {
  it('formats bytes in binary units', () => {
    expect(formatBytes(0)).toBe('0 B');
    expect(formatBytes(1023)).toBe('1023 B');
    expect(formatBytes(512 * 2 ** 20)).toBe('512 MiB');
    expect(formatBytes(1.5 * GiB)).toBe('1.5 GiB');
    expect(formatBytes(80 * GiB)).toBe('80 GiB');
    expect(formatBytes(null)).toBe('–');
  });

  it('formats slots for a person', () => {
    expect(formatSlot('cpu', 1)).toBe('1 core');
    expect(formatSlot('cpu', '2.5')).toBe('2.5 cores');
    expect(formatSlot('mem', GiB)).toBe('1 GiB');
    expect(formatSlot('gpu', 2)).toBe('2 GPUs');
    expect(formatSlot('gpu.shares', 0.25)).toBe('0.25');
    expect(formatSlot('mem', null)).toBe('–');
    expect(formatSlots({ 'gpu.shares': 0.5, mem: GiB, cpu: 1 })).toBe('1 core, 1 GiB, 0.5 GPU');
    expect(formatSlots({})).toBe('–');
  });

  it('labels devices with their share', () => {
    expect(deviceLabel({ index: 0, model: 'A100-80GB', shares: 0.5 })).toBe(
      '0.5 of GPU 0 (A100-80GB)'
    );
    expect(deviceLabel({ index: 1, model: 'A100-80GB', shares: 1 })).toBe('GPU 1 (A100-80GB)');
    expect(deviceLabel({ index: 2, model: 'H100', shares: '0.25' })).toBe('0.25 of GPU 2 (H100)');
    expect(deviceLabel({ index: 3, model: 'T4' })).toBe('GPU 3 (T4)');
  });

  it('says how a share of a GPU holds', () => {
    expect(gpuShareLabel({ shares: 0.25, memory: 20 * GiB, enforcement: 'mps' })).toBe(
      '0.25 of a GPU · 20 GiB · held by MPS'
    );
    expect(gpuShareLabel({ shares: 0.5, memory: null, enforcement: 'caps' })).toBe(
      '0.5 of a GPU · framework caps only (advisory)'
    );
    expect(gpuShareLabel({ shares: null, memory: GiB, enforcement: 'caps' })).toBe(
      'a share of a GPU · 1 GiB · framework caps only (advisory)'
    );
    expect(
      gpuShareLabel({
        shares: 0.5,
        memory: null,
        enforcement: 'caps',
        mps_withheld: 'the session runs as root'
      })
    ).toBe('0.5 of a GPU · framework caps only (advisory; MPS withheld: the session runs as root)');
  });

  it('formats durations', () => {
    expect(formatDuration(42)).toBe('42s');
    expect(formatDuration(303)).toBe('5m 3s');
    expect(formatDuration(7500)).toBe('2h 5m');
    expect(formatDuration(3600)).toBe('1h');
    expect(formatDuration(3 * 86400 + 4 * 3600 + 59)).toBe('3d 4h');
    expect(formatDuration(null)).toBe('no limit');
    expect(formatDuration(-5)).toBe('0s');
  });
});

describe('time left', () => {
  it('counts down from what the server said', () => {
    expect(timeLeftNow(100, 30)).toBe(70);
    expect(timeLeftNow(10, 30)).toBe(0);
    expect(timeLeftNow(null, 30)).toBeNull();
  });

  it('warns near the end of the lifetime', () => {
    expect(timeLeftLevel(null, null)).toBe('unlimited');
    expect(timeLeftLevel(0, 86400)).toBe('over');
    expect(timeLeftLevel(3600, 86400)).toBe('warn'); // < 10 % of a day
    expect(timeLeftLevel(600, 3600)).toBe('warn'); // < 15 minutes
    expect(timeLeftLevel(50000, 86400)).toBe('ok');
  });
});

describe('quota levels', () => {
  it('is ok, warn or over against the limit', () => {
    expect(quotaLevel(1, 4)).toBe('ok');
    expect(quotaLevel(3.2, 4)).toBe('warn');
    expect(quotaLevel(4, 4)).toBe('over');
    expect(quotaLevel(5, 4)).toBe('over');
    expect(quotaLevel(3, 4, 0.9)).toBe('ok');
    expect(quotaLevel(10, null)).toBe('unlimited');
    expect(quotaLevel(0, 0)).toBe('none');
    expect(quotaLevel(0.5, 0)).toBe('over');
  });

  it('makes one row per slot, unlimited where left is null', () => {
    const rows = quotaRows({
      limit: { cpu: 4, mem: 8 * GiB, 'gpu.shares': 1 },
      used: { cpu: 3.5, mem: GiB, 'gpu.shares': 1 },
      left: { cpu: 0.5, mem: 7 * GiB, 'gpu.shares': 0, gpu: null },
      unspecified: 'UNLIMITED'
    });
    expect(rows.map(r => [r.slot, r.level, r.left])).toEqual([
      ['cpu', 'warn', 0.5],
      ['mem', 'ok', 7 * GiB],
      ['gpu', 'unlimited', null],
      ['gpu.shares', 'over', 0]
    ]);
    expect(rows[0].fraction).toBeCloseTo(0.875);
    expect(rows[2].fraction).toBe(0);
  });

  it('words a row in a few words', () => {
    expect(formatQuotaRow({ slot: 'cpu', used: 3.5, limit: 4, left: 0.5 })).toBe(
      '3.5 / 4 cores · 0.5 left'
    );
    expect(formatQuotaRow({ slot: 'mem', used: GiB, limit: 8 * GiB, left: 7 * GiB })).toBe(
      '1 GiB / 8 GiB · 7 GiB left'
    );
    expect(formatQuotaRow({ slot: 'gpu.shares', used: 2, limit: 2, left: 0 })).toBe(
      '2 / 2 · 0 left'
    );
    expect(formatQuotaRow({ slot: 'cpu', used: 1, limit: null, left: null })).toBe(
      '1 core used · no limit'
    );
  });

  it('reads a missing slot by the scope default', () => {
    const limited = quotaRows({
      limit: { cpu: 2 },
      used: { gpu: 0 },
      left: {},
      unspecified: 'LIMITED'
    });
    expect(limited.find(r => r.slot === 'gpu')).toMatchObject({ limit: 0, left: 0, level: 'none' });
    const open = quotaRows({
      limit: { cpu: 2 },
      used: { gpu: 1 },
      left: {},
      unspecified: 'UNLIMITED'
    });
    expect(open.find(r => r.slot === 'gpu')).toMatchObject({
      limit: null,
      left: null,
      level: 'unlimited'
    });
    expect(open.find(r => r.slot === 'cpu')).toMatchObject({ limit: 2, left: 2, level: 'ok' });
  });
});

describe('a new session choice', () => {
  it('parses memory like the spawner', () => {
    expect(parseMem('8g')).toBe(8 * GiB);
    expect(parseMem('512m')).toBe(512 * 2 ** 20);
    expect(parseMem('1.5GiB')).toBe(1.5 * GiB);
    expect(parseMem(' 2 GB ')).toBe(2 * GiB);
    expect(parseMem('1024')).toBe(1024);
    expect(() => parseMem('lots')).toThrow('memory must be a size like 8g or 512m');
    expect(() => parseMem('0g')).toThrow('more than 0');
    expect(memInput(2 * GiB)).toBe('2g');
    expect(memInput(1536 * 2 ** 20)).toBe('1536m');
    expect(memInput(1000)).toBe('1000');
  });

  it('charges a fraction as shares and whole GPUs as both', () => {
    expect(requestedSlots({ cpu: '2', mem: '4g', gpu: '0.5' }).charged).toEqual({
      cpu: 2,
      mem: 4 * GiB,
      'gpu.shares': 0.5
    });
    expect(requestedSlots({ cpu: '', mem: '', gpu: '2' }).charged).toEqual({
      gpu: 2,
      'gpu.shares': 2
    });
    expect(requestedSlots({ cpu: '1', mem: '1g', gpu: '0' }).charged).toEqual({
      cpu: 1,
      mem: GiB
    });
  });

  it('says what is wrong with each field', () => {
    const r = requestedSlots({ cpu: 'two', mem: '4 apples', gpu: '0.333' });
    expect(r.charged).toEqual({});
    expect(Object.keys(r.errors).sort()).toEqual(['cpu', 'gpu', 'mem']);
    expect(r.errors.gpu).toBe('GPU takes steps of 0.01');
    expect(requestedSlots({ cpu: '-1', mem: '', gpu: '-0.5' }).errors).toMatchObject({
      cpu: expect.stringContaining('above 0'),
      gpu: expect.stringContaining('must be a number')
    });
  });

  it('costs a choice against the quota left', () => {
    const left = { cpu: 4, mem: 2 * GiB, gpu: null, 'gpu.shares': 0.5 };
    const fits = costAgainstQuota({ cpu: 2, mem: GiB, 'gpu.shares': 0.5 }, left);
    expect(fits.fits).toBe(true);
    expect(fits.rows.map(r => [r.slot, r.after])).toEqual([
      ['cpu', 2],
      ['mem', GiB],
      ['gpu.shares', 0]
    ]);
    const over = costAgainstQuota({ gpu: 1, 'gpu.shares': 1 }, left);
    expect(over.fits).toBe(false);
    expect(over.rows).toEqual([
      { slot: 'gpu', requested: 1, left: null, after: null, fits: true },
      { slot: 'gpu.shares', requested: 1, left: 0.5, after: -0.5, fits: false }
    ]);
    // Float noise does not make 0.3 shares of 0.3 left "too much".
    expect(costAgainstQuota({ 'gpu.shares': 0.1 + 0.2 }, { 'gpu.shares': 0.3 }).fits).toBe(true);
    expect(costAgainstQuota({ cpu: 1 }, null).fits).toBe(true);
  });

  it("warns below the image's minimum", () => {
    expect(belowImageMinimum({ cpu: 1, mem: GiB }, { cpu: 2, mem: GiB })).toEqual([
      'the image needs at least 2 cores of CPU'
    ]);
    expect(belowImageMinimum({ cpu: 4 }, { cpu: 2, mem: 8 * GiB })).toEqual([]);
  });

  it('checks and suggests session names', () => {
    expect(serverNameProblem('exp-1', [])).toBeNull();
    expect(serverNameProblem('', [])).toBe('give the session a name');
    expect(serverNameProblem('bad name', [])).toMatch(/letters, digits/);
    expect(serverNameProblem('work', ['work'])).toBe('you already have a session named work');
    expect(suggestServerName(['session-1', 'session-2'])).toBe('session-3');
    expect(suggestServerName([])).toBe('session-1');
  });

  it('labels session status with the queue position', () => {
    expect(sessionStatusLabel({ status: 'PENDING', queue_position: 2 })).toBe(
      'PENDING (#2 in queue)'
    );
    expect(
      sessionStatusLabel({
        status: 'PENDING',
        queue_position: 1,
        waiting_for: 'short of CPU: asks 4 cores; at most 1 free on one node'
      })
    ).toBe('PENDING (#1 in queue): short of CPU: asks 4 cores; at most 1 free on one node');
    expect(sessionStatusLabel({ status: 'RUNNING', queue_position: null })).toBe('RUNNING');
    expect(sessionStatusLabel({ status: 'ERROR', status_reason: 'image not found' })).toBe(
      'ERROR: image not found'
    );
  });
});

describe('folders', () => {
  const folder = (bytes: number, maxSize: number | null, scopeLimit: number | null): IFolder => ({
    id: 'f',
    name: 'data',
    host: 'local',
    owner: 'user:alice',
    owner_kind: 'user',
    domain: 'acme',
    usage_mode: 'general',
    permission: 'wd',
    is_owner: true,
    can_manage: true,
    status: 'READY',
    auto_mount: false,
    usage: { bytes },
    limits: {
      max_size: maxSize,
      scope: {
        kind: 'user',
        name: 'alice',
        used: bytes,
        limit: scopeLimit,
        folders: 1,
        max_folders: 10
      }
    },
    rights: ['create-vfolder', 'invite-others']
  });

  it("measures usage against the folder's own limit", () => {
    expect(folderUsage(folder(9 * GiB, 10 * GiB, null))).toMatchObject({
      limit: 10 * GiB,
      level: 'warn'
    });
    expect(folderUsage(folder(GiB, null, 10 * GiB))).toMatchObject({
      limit: null,
      level: 'unlimited'
    });
    expect(folderUsage(folder(GiB, 0, null)).limit).toBeNull(); // 0: no own limit
  });

  it('lets only owners of user folders with the right invite', () => {
    expect(canInvite(folder(0, null, null))).toBe(true);
    expect(canInvite({ ...folder(0, null, null), rights: ['create-vfolder'] })).toBe(false);
    expect(canInvite({ ...folder(0, null, null), is_owner: false })).toBe(false);
    expect(canInvite({ ...folder(0, null, null), owner_kind: 'project' })).toBe(false);
  });
});

describe('usage for the status bar', () => {
  const usage: IUsage = {
    cpu: { percent: 12.5, limit: 1 },
    memory: { used: 118 * 2 ** 20, limit: GiB },
    gpus: [
      {
        index: 0,
        model: 'A100-80GB',
        shares: 0.5,
        utilization: 37,
        memory_used: 2 * GiB,
        memory_total: 80 * GiB,
        memory_limit: 40 * GiB,
        source: 'mock'
      }
    ]
  };

  it('summarizes in one line', () => {
    expect(usageSummary(usage)).toBe('GPU 37% 2 GiB · CPU 13% · Mem 118 MiB');
    expect(usageSummary({ ...usage, gpus: [] })).toBe('CPU 13% · Mem 118 MiB');
    expect(usageSummary(null)).toBe('labfleet: –');
  });

  it('averages several devices', () => {
    const two = {
      ...usage,
      gpus: [usage.gpus[0], { ...usage.gpus[0], index: 1, utilization: 63 }]
    };
    expect(usageSummary(two)).toBe('2 GPUs 50% 4 GiB · CPU 13% · Mem 118 MiB');
  });

  it('has a tooltip line per device', () => {
    const lines = usageTooltip(usage).split('\n');
    expect(lines).toEqual([
      '0.5 of GPU 0 (A100-80GB): 37% busy, 2 GiB of 40 GiB (this session’s limit) [mock device]',
      'CPU: 13% of one core (limit 1 core)',
      'Memory: 118 MiB of 1 GiB'
    ]);
    const unknown = usageTooltip({
      ...usage,
      gpus: [{ ...usage.gpus[0], utilization: null, memory_limit: null, source: 'nvidia' }]
    });
    expect(unknown.split('\n')[0]).toBe(
      '0.5 of GPU 0 (A100-80GB): utilization unknown, 2 GiB of 80 GiB'
    );
  });
});

describe('what the fleet can give now', () => {
  const free = { alive_nodes: 1, nodes: 1, cpu: 1, mem: 3 * GiB, gpu: 0, 'gpu.shares': 0.75 };

  it('says whole free devices apart from the largest free part of one', () => {
    expect(freeNowText(free)).toBe('1 core, 3 GiB, 0 whole GPUs, up to 0.75 of one GPU');
    expect(freeNowText({ ...free, alive_nodes: 0 })).toBe('nothing: no node of the group is up');
    expect(freeNowText(undefined)).toBe('');
  });

  it("puts a line per resource group beside the quota, this session's group first", () => {
    const groups = [
      { name: 'a100', free_now: { ...free, gpu: 2, 'gpu.shares': 1 } },
      { name: 'old' }, // an older service: no free_now, no line
      { name: 'default', free_now: free },
      { name: 'cpu-only', free_now: { ...free, alive_nodes: 0 } }
    ];
    expect(freeNowLines(groups, 'default')).toEqual([
      {
        group: 'default',
        own: true,
        text: "Free now in default (this session's group): 1 core, 3 GiB, 0 whole GPUs, up to 0.75 of one GPU"
      },
      {
        group: 'a100',
        own: false,
        text: 'Free now in a100: 1 core, 3 GiB, 2 whole GPUs, up to 1 of one GPU'
      },
      {
        group: 'cpu-only',
        own: false,
        text: 'Free now in cpu-only: nothing: no node of the group is up'
      }
    ]);
    // Outside a session (or in a group no longer offered): the service's order.
    expect(freeNowLines(groups, null).map(l => l.group)).toEqual(['a100', 'default', 'cpu-only']);
    expect(freeNowLines(groups, 'gone').map(l => l.own)).toEqual([false, false, false]);
    expect(freeNowLines(undefined, 'default')).toEqual([]);
  });

  it('builds the service request as the spawner reads the form', () => {
    const choice = {
      project: 'acme/ml',
      group: 'default',
      type: 'interactive',
      image: '',
      cpu: '2',
      mem: '4g',
      gpu: '0.5',
      command: '',
      vfolders: []
    };
    expect(sessionRequest(choice)).toEqual({
      project: 'acme/ml',
      type: 'interactive',
      resource_group: 'default',
      slots: { cpu: 2, mem: '4g', 'gpu.shares': 0.5 }
    });
    expect(sessionRequest({ ...choice, gpu: '2', type: 'batch' })).toMatchObject({
      slots: { gpu: 2 },
      command: 'true'
    });
  });
});

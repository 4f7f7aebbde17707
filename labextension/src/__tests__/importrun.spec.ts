/** An import followed to its end: started, asked about every second, refused, forgotten. */
import { FleetAPI, LabfleetError } from '../api';
import { ImportRun } from '../importrun';
import type { IImportJob } from '../types';

function job(status: string, extra: Partial<IImportJob> = {}): IImportJob {
  return {
    id: 'j1',
    url: 'https://example.org/org/repo.git',
    kind: 'repository',
    status,
    message: '',
    folder: { id: null, name: 'repo' },
    path: '',
    report: { updated: [], kept: [], renamed: [] },
    ...extra
  };
}

function fakeApi(answers: (IImportJob | Error)[], start: IImportJob | Error = job('fetching')) {
  const calls: string[] = [];
  const api = Object.create(FleetAPI.prototype) as FleetAPI;
  (api as any).startImport = async (body: unknown) => {
    calls.push(`start ${JSON.stringify(body)}`);
    if (start instanceof Error) {
      throw start;
    }
    return start;
  };
  (api as any).getImport = async (id: string) => {
    calls.push(`get ${id}`);
    const a = answers.shift();
    if (!a) {
      throw new Error('asked too often');
    }
    if (a instanceof Error) {
      throw a;
    }
    return a;
  };
  return { api, calls };
}

/** Let the timer fire and the answer arrive. */
async function tick(ms = 1000): Promise<void> {
  await jest.advanceTimersByTimeAsync(ms);
}

beforeEach(() => jest.useFakeTimers());
afterEach(() => jest.useRealTimers());

describe('ImportRun', () => {
  it('asks every second until the job is done, then tells once', async () => {
    const done = job('done', {
      folder: { id: 'f1', name: 'repo' },
      message: 'cloned 12 files'
    });
    const { api, calls } = fakeApi([job('fetching'), job('writing'), done]);
    const finished = jest.fn();
    const run = new ImportRun(api, { onFinished: finished });
    let changes = 0;
    run.changed.connect(() => changes++);
    expect(await run.start({ url: 'https://example.org/org/repo.git' })).toBe(true);
    expect(run.job?.status).toBe('fetching');
    expect(run.running).toBe(true);
    await tick(999);
    expect(calls).toEqual(['start {"url":"https://example.org/org/repo.git"}']);
    await tick(1);
    expect(calls.slice(1)).toEqual(['get j1']);
    await tick();
    expect(run.job?.status).toBe('writing');
    await tick();
    expect(run.job).toEqual(done);
    expect(run.running).toBe(false);
    expect(finished).toHaveBeenCalledTimes(1);
    await tick(5000);
    expect(calls).toHaveLength(4); // asked no more
    expect(changes).toBeGreaterThanOrEqual(4);
  });

  it("keeps a refusal's words and asks nothing more", async () => {
    const refusal = new LabfleetError(
      'url: file scheme; an import fetches only https, http, git URLs',
      400
    );
    const { api, calls } = fakeApi([], refusal);
    const run = new ImportRun(api);
    expect(await run.start({ url: 'file:///etc/passwd' })).toBe(false);
    expect(run.error).toBe('url: file scheme; an import fetches only https, http, git URLs');
    expect(run.job).toBeNull();
    expect(run.starting).toBe(false);
    await tick(3000);
    expect(calls).toHaveLength(1);
  });

  it('goes on asking through a failure to answer, and stops at a 404', async () => {
    const { api, calls } = fakeApi([
      new LabfleetError('the server did not answer', 0),
      job('writing'),
      new LabfleetError('no import j1', 404)
    ]);
    const run = new ImportRun(api);
    await run.start({ url: 'https://example.org/r.git' });
    await tick();
    expect(run.error).toBe('the server did not answer');
    expect(run.running).toBe(true);
    await tick();
    expect(run.error).toBeNull();
    expect(run.job?.status).toBe('writing');
    await tick();
    expect(run.error).toBe('no import j1');
    expect(run.running).toBe(false);
    await tick(3000);
    expect(calls).toHaveLength(4);
  });

  it('lets go of the job it followed when cleared or started again', async () => {
    const { api, calls } = fakeApi([job('done', { id: 'j2' })]);
    const run = new ImportRun(api);
    await run.start({ url: 'https://example.org/a.git' });
    run.clear();
    expect(run.job).toBeNull();
    await tick(3000);
    expect(calls).toHaveLength(1);
    await run.start({ url: 'https://example.org/b.git' });
    await tick();
    expect(calls).toEqual([
      'start {"url":"https://example.org/a.git"}',
      'start {"url":"https://example.org/b.git"}',
      'get j1'
    ]);
    expect(run.request).toEqual({ url: 'https://example.org/b.git' });
    run.dispose();
  });
});

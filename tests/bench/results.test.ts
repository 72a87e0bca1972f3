/**
 * bench/lib/results.mjs: a row with a target carries a verdict and a row with a verdict a target,
 * or it is refused (BenchRowError) whether or not rows are being written; good rows reach the
 * KVC_BENCH_RESULTS file as written here by hand. The CUDA rows bench/all.mjs passes through
 * checkRow (read from the captured runs in bench/cuda/) comply.
 */
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { ipcRows, kernelRows } from '../../bench/lib/cuda-summary.mjs';
import { BenchRowError, checkRow, result } from '../../bench/lib/results.mjs';

const saved = process.env.KVC_BENCH_RESULTS;
afterEach(() => {
  if (saved === undefined) delete process.env.KVC_BENCH_RESULTS;
  else process.env.KVC_BENCH_RESULTS = saved;
});

const refused = (f: () => unknown): string => {
  try {
    f();
  } catch (e) {
    expect(e).toBeInstanceOf(BenchRowError);
    return (e as Error).message;
  }
  throw new Error('no BenchRowError');
};

describe('bench/lib/results.mjs', () => {
  it('refuses a target without a verdict, with rows written or not', () => {
    delete process.env.KVC_BENCH_RESULTS;
    expect(refused(() => result('flood', { name: 'waiters parked', figure: '12', target: 'bounded by the caps' }))).toBe('flood row "waiters parked": target "bounded by the caps" has no verdict (pass met: true / false from checking the figure against it)');
    process.env.KVC_BENCH_RESULTS = join(mkdtempSync(join(tmpdir(), 'kvc-rows-')), 'rows.jsonl');
    expect(refused(() => result('flood', { name: 'waiters parked', figure: '12', target: '<= 16' }))).toMatch(/has no verdict/);
  });

  it('refuses a verdict without a target (absent or "-"), and a met that is not a boolean', () => {
    delete process.env.KVC_BENCH_RESULTS;
    expect(refused(() => result('checksum', { name: 'ts block values', figure: '1.2 GB/s', met: true }))).toBe('checksum row "ts block values": verdict met has no target (pass the target it was checked against)');
    expect(refused(() => result('checksum', { name: 'ts block values', figure: '1.2 GB/s', target: '-', met: false }))).toBe('checksum row "ts block values": verdict missed has no target (pass the target it was checked against)');
    expect(refused(() => result('checksum', { name: 'x', figure: '1', target: '>= 1', met: 'yes' as unknown as boolean }))).toMatch(/met must be true, false or absent/);
    expect(refused(() => checkRow({ bench: 'cuda-ipc', name: 'x', target: '>= 0.8', verdict: 'passed' }))).toMatch(/verdict must be met, missed or figure/);
    expect(refused(() => checkRow({ bench: 'cuda-ipc', name: 'x', target: '>= 0.8', verdict: 'figure' }))).toMatch(/has no verdict/);
  });

  it('writes good rows as one JSON line each', () => {
    const file = join(mkdtempSync(join(tmpdir(), 'kvc-rows-')), 'rows.jsonl');
    process.env.KVC_BENCH_RESULTS = file;
    result('forward', { name: 'prefill', figure: '40 ms', baseline: '900 ms', ratio: '22.5x', target: '<= 50 ms', met: true });
    result('forward', { name: 'prefill', figure: '60 ms', target: '<= 50 ms', met: false });
    result('side-channel-flood', { name: 'LEASE p50', figure: '0.20 ms' });
    expect(readFileSync(file, 'utf8').trim().split('\n').map((l) => JSON.parse(l))).toEqual([
      { bench: 'forward', name: 'prefill', figure: '40 ms', baseline: '900 ms', ratio: '22.5x', target: '<= 50 ms', verdict: 'met' },
      { bench: 'forward', name: 'prefill', figure: '60 ms', baseline: '-', ratio: '-', target: '<= 50 ms', verdict: 'missed' },
      { bench: 'side-channel-flood', name: 'LEASE p50', figure: '0.20 ms', baseline: '-', ratio: '-', target: '-', verdict: 'figure' },
    ]);
  });

  it('the CUDA rows bench/all.mjs checks (bench/cuda/ captured runs) comply', () => {
    const read = (p: string) => readFileSync(new URL(`../../${p}`, import.meta.url), 'utf8');
    const results = read('bench/cuda/results-h200.txt');
    const from = results.lastIndexOf('######## call ');
    const last = results.slice(from, results.indexOf('\n########', from + 1)); // to the session-5 block
    const ipc = read('bench/cuda/ipc-h200.txt');
    const ipcRun = ipc.slice(ipc.indexOf('== kvc_bench_ipc '), ipc.indexOf('\n== ', ipc.indexOf('== kvc_bench_ipc ') + 1));
    const rows = [...kernelRows(last).map((r) => ({ bench: 'cuda-kernel', ...r })), ...ipcRows(ipcRun).map((r) => ({ bench: 'cuda-ipc', ...r }))];
    expect(rows.filter((r) => r.verdict !== 'figure').length).toBeGreaterThan(0);
    for (const r of rows) expect(checkRow(r)).toBe(r);
  });
});

/**
 * bench/lib/cuda-summary.mjs: the rows bench/all.mjs's table gets from the CUDA benchmark
 * executables' output, read from the runs captured in bench/cuda/results-h200.txt (kvc_bench_cuda,
 * three device calls of 2026-12-02) and bench/cuda/ipc-h200.txt (kvc_bench_ipc). Every expected
 * figure below was read off those files by hand.
 */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { CudaOutputError, ipcRows, kernelRows } from '../../bench/lib/cuda-summary.mjs';

const read = (p: string) => readFileSync(new URL(`../../${p}`, import.meta.url), 'utf8');
const RESULTS = read('bench/cuda/results-h200.txt');
const IPC = read('bench/cuda/ipc-h200.txt');

/** The output of device call `n` of results-h200.txt: from its `######## call n` line to the next call's. */
function call(n: number): string {
  const start = RESULTS.indexOf(`######## call ${n}\n`);
  expect(start).toBeGreaterThanOrEqual(0);
  const next = RESULTS.indexOf('\n########', start + 1); // the next call, or the session-5 block after call 1
  return RESULTS.slice(start, next < 0 ? undefined : next);
}

/** The `kvc_bench_ipc <size>` section of ipc-h200.txt. */
function ipcSection(size: string): string {
  const start = IPC.indexOf(`== kvc_bench_ipc ${size}\n`);
  expect(start).toBeGreaterThanOrEqual(0);
  return IPC.slice(start, IPC.indexOf('\n== ', start + 1));
}

const reason = (f: () => unknown): string => {
  try {
    f();
  } catch (e) {
    expect(e).toBeInstanceOf(CudaOutputError);
    return (e as Error).message;
  }
  throw new Error('no CudaOutputError');
};

describe('kvc_bench_cuda output -> rows', () => {
  it('call 3 of results-h200.txt: every summary line a figure row, then the two verdicts', () => {
    const rows = kernelRows(call(3));
    expect(rows).toHaveLength(24 + 2);
    expect(rows.slice(0, 24).every((r) => r.verdict === 'figure' && r.baseline === '-' && r.ratio === '-' && r.target === '-')).toBe(true);
    expect(rows.slice(0, 24).map((r) => r.name)).toEqual([
      'attn128 (best: NHD 32K V2)',
      'step28 floors from an idle GPU',
      'step28 floor',
      'step28 floor',
      'step28 floor',
      'step28 floor',
      'step28 H=2 V2 grid capped at 1 blocks/SM',
      'step28 H=2 V2 grid capped at 2 blocks/SM',
      'step28 H=2 V2 grid capped at 3 blocks/SM',
      'step28 H=2 (28.0 MiB) V2 items 32768 B',
      'step28 H=2 (28.0 MiB) V8 items 32768 B',
      'step28 H=2 (28.0 MiB) V1 items 32768 B',
      'step28 H=2 (28.0 MiB) V2 items 4096 B',
      'step28 H=4 V2 grid capped at 1 blocks/SM',
      'step28 H=4 V2 grid capped at 2 blocks/SM',
      'step28 H=4 V2 grid capped at 3 blocks/SM',
      'step28 H=4 (56.0 MiB) V2 items 32768 B',
      'step28 H=4 (56.0 MiB) V8 items 32768 B',
      'step28 H=8 V2 grid capped at 1 blocks/SM',
      'step28 H=8 V2 grid capped at 2 blocks/SM',
      'step28 H=8 V2 grid capped at 3 blocks/SM',
      'step28 H=8 (112.0 MiB) V2 items 32768 B',
      'step28 H=8 (112.0 MiB) V8 items 32768 B',
      'mamba 256 x 1 MiB',
    ]);
    expect(rows[0].figure).toBe('step 39.2 us (rows copy + kernel; target <= 40) = 0.908 of the plain read 35.6 us (target >= 0.8); kernel alone 39.1 us = 0.911');
    expect(rows[2].figure).toBe("plain read of the step's own scattered chunks (row major, 4 loads): pipelined 13.1 us, alone from idle 15.3 us");
    expect(rows[23].figure).toBe('worst variant 0.925 of the plain read 65.5 us (target >= 0.8)');
    expect(rows[24]).toEqual({ name: '128 MiB step (attn128, NHD 32K V2) vs the plain read', figure: '39.2 us', baseline: '35.6 us plain read', ratio: '0.908', target: '>= 0.93', verdict: 'missed' });
    // floors alone from idle: 15.3, 15.6, 15.2, 15.1 us -> 15.1; 15.1 / 16.4 = 0.9207
    expect(rows[25]).toEqual({
      name: 'isolated 28-layer step (2 KV heads, 28.0 MiB) from an idle GPU, incl. launch',
      figure: '16.4 us',
      baseline: '15.1 us plain read of its chunks',
      ratio: '0.921',
      target: '<= 15 us',
      verdict: 'missed',
    });
  });

  it('calls 2 and 1: the best attn128 variant named; without floor lines (call 1) the step has no baseline', () => {
    const two = kernelRows(call(2)).slice(-2);
    expect(two[0]).toMatchObject({ name: '128 MiB step (attn128, NHD 32K V2) vs the plain read', figure: '39.1 us', baseline: '35.5 us plain read', ratio: '0.906', verdict: 'missed' });
    // floors 15.6, 15.1, 15.2, 15.2 -> 15.1; 15.1 / 17.9 = 0.8436
    expect(two[1]).toMatchObject({ figure: '17.9 us', baseline: '15.1 us plain read of its chunks', ratio: '0.844', verdict: 'missed' });
    const one = kernelRows(call(1));
    expect(one).toHaveLength(19 + 2);
    expect(one[19]).toMatchObject({ name: '128 MiB step (attn128, NHD 32K V102) vs the plain read', figure: '39.2 us', baseline: '35.8 us plain read', ratio: '0.912', verdict: 'missed' });
    expect(one[20]).toEqual({
      name: 'isolated 28-layer step (2 KV heads, 28.0 MiB) from an idle GPU, incl. launch',
      figure: '17.6 us',
      baseline: '-',
      ratio: '-',
      target: '<= 15 us',
      verdict: 'missed',
    });
  });

  // The summary lines as bench_cuda.cu prints them now, with the figures of the last full run
  // (bench/results/h200-host-2026-12-02-final.md, its cuda-kernel rows).
  const NOW = [
    'device: NVIDIA H200, 132 SMs, L2 60 MiB, cc 9.0; runtime 13000 driver 13000; median of 50 timed runs per figure',
    '',
    'summary (every figure checked bit-exact against the CPU kernel first: all exact)',
    '  attn128 (best: NHD 32K V2): step 39.8 us (rows copy + kernel; target <= 40) = 0.887 of the plain read 35.3 us (target >= 0.8; issue 16: >= 0.93); kernel alone 39.0 us = 0.904',
    "  step28 floor, the step's own scattered chunks read plainly (row major, 4 loads): pipelined 13.0 us, alone from idle 15.9 us",
    "  step28 floor, the step's own scattered chunks read plainly (row major, 16 loads): pipelined 13.0 us, alone from idle 15.1 us",
    "  step28 floor, the step's own scattered chunks read plainly (layer major, 4 loads): pipelined 12.9 us, alone from idle 15.2 us",
    '  step28 H=2 (28.0 MiB) V2 items 32768 B: queued step 13.7 us, isolated step 18.0 us device incl. launch (target <= 15), submit() 12.2 us host, results after 25.4 us; pipelined 14.3 us = 0.814 of the plain read',
    '  mamba 256 x 1 MiB: worst variant 0.921 of the plain read 65.4 us (target >= 0.8)',
    '',
  ].join('\n');

  it("today's wording: the floor lines give the step's baseline", () => {
    const rows = kernelRows(NOW);
    expect(rows.map((r) => r.name).slice(0, 5)).toEqual([
      'attn128 (best: NHD 32K V2)',
      "step28 floor, the step's own scattered chunks read plainly (row major, 4 loads)",
      "step28 floor, the step's own scattered chunks read plainly (row major, 16 loads)",
      "step28 floor, the step's own scattered chunks read plainly (layer major, 4 loads)",
      'step28 H=2 (28.0 MiB) V2 items 32768 B',
    ]);
    expect(rows.slice(-2)).toEqual([
      { name: '128 MiB step (attn128, NHD 32K V2) vs the plain read', figure: '39.8 us', baseline: '35.3 us plain read', ratio: '0.887', target: '>= 0.93', verdict: 'missed' },
      { name: 'isolated 28-layer step (2 KV heads, 28.0 MiB) from an idle GPU, incl. launch', figure: '18.0 us', baseline: '15.1 us plain read of its chunks', ratio: '0.839', target: '<= 15 us', verdict: 'missed' },
    ]);
  });

  it('session 6 (bench/results/h200-2026-12-02-session6-cuda.txt): the isolated row is read from the variant the output names as default', () => {
    const text = read('bench/results/h200-2026-12-02-session6-cuda.txt');
    const start = text.indexOf('######## call 2: bench2.txt\n');
    expect(start).toBeGreaterThanOrEqual(0);
    const rows = kernelRows(text.slice(start, text.indexOf('\n########', start + 1)));
    expect(rows[0]).toMatchObject({ name: 'kernel variant by default', verdict: 'figure' });
    expect(rows.slice(-2)).toEqual([
      { name: '128 MiB step (attn128, NHD 32K V35) vs the plain read', figure: '37.9 us', baseline: '35.7 us plain read', ratio: '0.943', target: '>= 0.93', verdict: 'met' },
      // the first V35 32 KiB line (17.2 us; the second, 15.8 us, is not read); floors 16.0, 15.0, 14.7, 14.8 -> 14.7; 14.7 / 17.2 = 0.8547
      { name: 'isolated 28-layer step (2 KV heads, 28.0 MiB) from an idle GPU, incl. launch', figure: '17.2 us', baseline: '14.7 us plain read of its chunks', ratio: '0.855', target: '<= 15 us', verdict: 'missed' },
    ]);
    // without the default-variant line the V2 line is read, as for the outputs before session 6
    expect(() => kernelRows(NOW.replace('V2 items 32768 B', 'V35 items 32768 B'))).toThrow(/V2 items 32768 B/);
  });

  it('met at the targets, and never met when a GPU sum differed from the CPU kernel', () => {
    const fast = NOW.replace('= 0.887 of the plain read', '= 0.930 of the plain read').replace('isolated step 18.0 us', 'isolated step 15.0 us');
    expect(kernelRows(fast).slice(-2).map((r) => [r.ratio, r.figure, r.verdict])).toEqual([
      ['0.930', '39.8 us', 'met'],
      ['1.007', '15.0 us', 'met'],
    ]);
    const justMissed = NOW.replace('= 0.887 of the plain read', '= 0.929 of the plain read').replace('isolated step 18.0 us', 'isolated step 15.1 us');
    expect(kernelRows(justMissed).slice(-2).map((r) => r.verdict)).toEqual(['missed', 'missed']);
    const mismatch = fast.replace(': all exact)', ': MISMATCH)');
    expect(kernelRows(mismatch).slice(-2).map((r) => r.verdict)).toEqual(['missed', 'missed']);
  });

  it('malformed output is a CudaOutputError naming what is missing', () => {
    expect(reason(() => kernelRows(''))).toBe('kvc_bench_cuda output: expected one "summary (...)" line, found 0');
    expect(reason(() => kernelRows('no GPU: cudaErrorNoDevice\n'))).toBe('kvc_bench_cuda output: expected one "summary (...)" line, found 0');
    expect(reason(() => kernelRows(call(3) + call(2) + call(1)))).toBe('kvc_bench_cuda output: expected one "summary (...)" line, found 3');
    const noAttn = NOW.split('\n').filter((l) => !l.includes('attn128')).join('\n');
    expect(reason(() => kernelRows(noAttn))).toBe('kvc_bench_cuda summary: no "attn128 (best: ...): step X us ... = R of the plain read Y us" line');
    const cut = NOW.slice(0, NOW.indexOf('  step28 H=2'));
    expect(reason(() => kernelRows(cut))).toBe('kvc_bench_cuda summary: no "step28 H=2 (N MiB) V2 items 32768 B: queued step X us, isolated step Y us" line');
    const renamed = NOW.replace('isolated step 18.0 us', 'isolated 18.0 us');
    expect(reason(() => kernelRows(renamed))).toMatch(/no "step28 H=2/);
    const noNumber = NOW.replace('step 39.8 us', 'step ? us');
    expect(reason(() => kernelRows(noNumber))).toMatch(/no "attn128/);
    expect(reason(() => kernelRows(NOW.replace('  mamba 256 x 1 MiB:', '  mamba 256 x 1 MiB')))).toBe(
      'kvc_bench_cuda summary line without "name: figure": "mamba 256 x 1 MiB worst variant 0.921 of the plain read 65.4 us (target >= 0.8)"',
    );
  });
});

describe('kvc_bench_ipc output -> row', () => {
  it('the two runs of ipc-h200.txt', () => {
    expect(ipcRows(ipcSection('1 GiB'))).toEqual([{ name: 'KV load through CUDA IPC vs cudaMemcpy D2D (1 GiB)', figure: '0.524 ms', baseline: '0.015 ms D2D', ratio: '0.028', target: '>= 0.8', verdict: 'missed' }]);
    expect(ipcRows(ipcSection('64 MiB'))).toMatchObject([{ figure: '0.043 ms', baseline: '0.004 ms D2D', ratio: '0.105', verdict: 'missed' }]);
  });

  it("PASS is met; output without the ratio line or a time is a CudaOutputError", () => {
    const pass = ipcSection('1 GiB').replace('0.028  verdict: FAIL', '0.998  verdict: PASS');
    expect(ipcRows(pass)).toMatchObject([{ ratio: '0.998', verdict: 'met' }]);
    expect(reason(() => ipcRows('skipped: no CUDA device (no driver)\n'))).toBe('kvc_bench_ipc output: no "ratio IPC/D2D throughput: R  verdict: PASS|FAIL" line');
    const noIpc = ipcSection('1 GiB').split('\n').filter((l) => !l.startsWith('CUDA IPC load')).join('\n');
    expect(reason(() => ipcRows(noIpc))).toBe('kvc_bench_ipc output: no "CUDA IPC load ... X ms" line');
    const noD2d = ipcSection('1 GiB').split('\n').filter((l) => !l.startsWith('cudaMemcpy D2D')).join('\n');
    expect(reason(() => ipcRows(noD2d))).toBe('kvc_bench_ipc output: no "cudaMemcpy D2D ... X ms" line');
  });
});

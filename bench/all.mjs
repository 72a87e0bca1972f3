#!/usr/bin/env node
// Runs every benchmark under bench/ one after another and writes one table of all their figures
// (issue 16). Each benchmark prints its own output as before (kept in <out>.log); the rows it
// records through bench/lib/results.mjs are collected into one Markdown table.
//   node bench/all.mjs [--quick] [--only name,name] [--out bench-all.md] [--cuda DIR]
// --quick sets KVC_BENCH_QUICK=1 for every benchmark (short runs, noisier figures). --cuda DIR
// (on the GPU machine: the folder holding the CUDA executables kvc_bench_cuda and kvc_bench_ipc,
// bench/cuda/README.md says how they are built) adds their summary lines to the table; without it
// the table says they were not run. Figures from a busy machine are noisy: read ratios, and run on a quiet host.
import { spawnSync } from 'node:child_process';
import { appendFileSync, existsSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, hostname } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { CudaOutputError, ipcRows, kernelRows } from './lib/cuda-summary.mjs';
import { checkRow } from './lib/results.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const flag = (f) => args.includes(f);
const opt = (f, d) => {
  const i = args.indexOf(f);
  return i >= 0 && args[i + 1] ? args[i + 1] : d;
};
/** Every benchmark: script, node flags, what it needs. The order runs the quick ones first. */
const BENCHES = [
  { name: 'checksum', script: 'checksum.mjs' },
  { name: 'checksum-extensions', script: 'checksum-extensions.mjs' },
  { name: 'verify', script: 'verify.mjs' },
  { name: 'transfer', script: 'transfer.mjs' },
  { name: 'executor', script: 'executor.mjs' },
  { name: 'openai-stream', script: 'openai-stream.mjs' },
  { name: 'serving', script: 'serving.mjs' },
  { name: 'side-channel-flood', script: 'side-channel-flood.mjs' },
  { name: 'mooncake-flood', script: 'mooncake-flood.mjs', node: ['--expose-gc'] },
  { name: 'forward', script: 'forward.mjs' },
  { name: 'e2e', script: 'e2e.mjs' },
];
const only = opt('--only', '')
  .split(',')
  .filter(Boolean);
const unknown = only.filter((n) => !BENCHES.some((b) => b.name === n));
if (unknown.length) {
  console.error(`error: unknown benchmark ${unknown.join(', ')} (known: ${BENCHES.map((b) => b.name).join(', ')})`);
  process.exit(2);
}
const out = opt('--out', 'bench-all.md');
const rowsFile = `${out}.rows.jsonl`;
const logFile = `${out}.log`;
rmSync(rowsFile, { force: true });
writeFileSync(logFile, '');
/** `--quick`, or KVC_BENCH_QUICK=1 in the environment (the benches read that too). */
const quick = flag('--quick') || process.env.KVC_BENCH_QUICK === '1';
const env = { ...process.env, KVC_BENCH_RESULTS: rowsFile, ...(quick ? { KVC_BENCH_QUICK: '1' } : {}) };
const runs = [];
for (const b of BENCHES) {
  if (only.length && !only.includes(b.name)) continue;
  const path = join(here, b.script);
  if (!existsSync(path)) {
    runs.push({ name: b.name, status: 'missing', s: 0 });
    continue;
  }
  process.stdout.write(`running ${b.name} ... `);
  const t0 = Date.now();
  const r = spawnSync(process.execPath, [...(b.node ?? []), path], { env, encoding: 'utf8', maxBuffer: 256 << 20 });
  const s = (Date.now() - t0) / 1e3;
  appendFileSync(logFile, `\n===== ${b.name} (exit ${r.status ?? r.signal}, ${s.toFixed(1)} s)\n${r.stdout}${r.stderr}`);
  const status = r.status === 0 ? 'ok' : `failed (exit ${r.status ?? r.signal})`;
  runs.push({ name: b.name, status, s });
  console.log(`${status}, ${s.toFixed(1)} s`);
}
const cudaDir = opt('--cuda', '');
if (cudaDir) {
  // The CUDA executables print their own summaries; each summary line becomes a row.
  for (const [name, exe, argv] of [
    ['cuda-kernel', 'kvc_bench_cuda', quick ? ['--quick'] : []],
    ['cuda-ipc', 'kvc_bench_ipc', []],
  ]) {
    const path = join(cudaDir, exe);
    if (!existsSync(path)) {
      runs.push({ name, status: `missing (${path})`, s: 0 });
      continue;
    }
    process.stdout.write(`running ${name} ... `);
    const t0 = Date.now();
    const r = spawnSync(path, argv, { encoding: 'utf8', maxBuffer: 64 << 20 });
    const s = (Date.now() - t0) / 1e3;
    appendFileSync(logFile, `\n===== ${name} (exit ${r.status ?? r.signal}, ${s.toFixed(1)} s)\n${r.stdout}${r.stderr}`);
    runs.push({ name, status: r.status === 0 ? 'ok' : `failed (exit ${r.status ?? r.signal})`, s });
    console.log(`${runs.at(-1).status}, ${s.toFixed(1)} s`);
    // bench/lib/cuda-summary.mjs: output without the lines a verdict needs fails the run, never a silently shorter table
    try {
      const rows = name === 'cuda-kernel' ? kernelRows(r.stdout ?? '') : ipcRows(r.stdout ?? '');
      for (const row of rows) appendFileSync(rowsFile, `${JSON.stringify(checkRow({ bench: name, ...row }))}\n`);
    } catch (e) {
      if (!(e instanceof CudaOutputError)) throw e;
      const run = runs.at(-1);
      run.status = `${run.status === 'ok' ? 'failed' : run.status} (output not read: ${e.message})`;
      console.log(`  ${e.message}`);
    }
  }
}
const rows = existsSync(rowsFile)
  ? readFileSync(rowsFile, 'utf8')
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l))
  : [];
const esc = (s) => String(s).replaceAll('|', '\\|');
const lines = [
  `# kvconnect benchmarks: one table`,
  '',
  `${new Date().toISOString()}, ${hostname()}, ${cpus().length} cores (${cpus()[0]?.model ?? '?'}), node ${process.version}${quick ? ', quick runs' : ''}. Ratios are against a baseline measured in the same run.`,
  '',
  '| benchmark | measured | figure | baseline (same run) | ratio | target | verdict |',
  '| --- | --- | --- | --- | --- | --- | --- |',
  ...rows.map((r) => `| ${esc(r.bench)} | ${esc(r.name)} | ${esc(r.figure)} | ${esc(r.baseline)} | ${esc(r.ratio)} | ${esc(r.target)} | ${r.verdict} |`),
  '',
  // what each benchmark passes as `ratio` (bench/*.mjs, bench/lib/cuda-summary.mjs); keep in step with them
  'How to read the ratio column (the figure against its baseline of the same run; `-`: none):',
  '- a bare number: figure / baseline (GB/s: above 1 is faster than the baseline; ms, us, B: above 1 is slower or larger), except in the cuda-kernel and cuda-ipc rows, where it is a ratio of speeds, baseline time / figure time (above 1 is faster);',
  '- `Nx`: forward: baseline / figure, a speedup (the native path is N times as fast as the JS path); verify: figure / baseline, the consumer\'s work in multiples of the SPEC\'s floor (above 1 is slower);',
  '- `N% overhead (95% CI A..B)` (e2e): what checksums cost, the Hodges-Lehmann estimate of the within-pair ratios TTFT on / off and throughput off / on, minus 1, with its block-bootstrap interval; met only if the whole interval is at or below the target, missed if wholly above, `undecided` (counted as missed) if it straddles the target;',
  '- `N%` (e2e): CPU per request on / off - 1 (Hodges-Lehmann of the runs\' ratios); e2e\'s checksum computation per verified load: figure / baseline (its share of the TTFT); verify\'s 1K-token row: its share of a 1K-token prefill\'s CPU.',
  '',
  'A target without a unit or in `x` or `%` is checked against the ratio; a target in the figure\'s unit (`<= 50 us`, `>= 1.0 GB/s`, `<= 15 us`) against the figure, the ratio then only showing how far the baseline is.',
  '',
  '| benchmark | run | seconds | rows |',
  '| --- | --- | --- | --- |',
  ...runs.map((r) => `| ${r.name} | ${r.status} | ${r.s.toFixed(1)} | ${rows.filter((x) => x.bench === r.name).length} |`),
  '',
  cudaDir ? `CUDA executables from ${cudaDir}.` : 'Not run: the CUDA kernel and CUDA IPC benchmarks (on the GPU machine: `--cuda DIR`; `bench/cuda/README.md`).',
];
writeFileSync(out, `${lines.join('\n')}\n`);
console.log(`\n${lines.join('\n')}\n\nwritten: ${out} (each benchmark's output: ${logFile})`);
const met = rows.filter((r) => r.verdict === 'met').length;
const missed = rows.filter((r) => r.verdict === 'missed').length;
console.log(`targets: ${met} met, ${missed} missed; ${runs.filter((r) => r.status !== 'ok').length} benchmark(s) did not finish`);
process.exit(runs.every((r) => r.status === 'ok' || r.status === 'missing') ? 0 : 1);

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
const env = { ...process.env, KVC_BENCH_RESULTS: rowsFile, ...(flag('--quick') ? { KVC_BENCH_QUICK: '1' } : {}) };
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
    ['cuda-kernel', 'kvc_bench_cuda', flag('--quick') ? ['--quick'] : []],
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
    const text = r.stdout ?? '';
    if (name === 'cuda-kernel') {
      const summary = text.split('\nsummary')[1] ?? '';
      for (const l of summary.split('\n').slice(1)) {
        const t = l.trim();
        if (t) appendFileSync(rowsFile, `${JSON.stringify({ bench: name, name: t.split(':')[0], figure: t.slice(t.indexOf(':') + 1).trim(), baseline: '-', ratio: '-', target: '-', verdict: 'figure' })}\n`);
      }
      for (const row of cudaVerdicts(summary)) appendFileSync(rowsFile, `${JSON.stringify({ bench: name, ...row })}\n`);
    } else {
      const m = /ratio IPC\/D2D throughput: ([0-9.]+)\s+verdict: (PASS|FAIL)/.exec(text);
      const ipc = /CUDA IPC load[^\n]*?([0-9.]+) ms/.exec(text);
      const d2d = /cudaMemcpy D2D[^\n]*?([0-9.]+) ms/.exec(text);
      if (m) appendFileSync(rowsFile, `${JSON.stringify({ bench: name, name: 'KV load through CUDA IPC vs cudaMemcpy D2D (1 GiB)', figure: `${ipc?.[1] ?? '?'} ms`, baseline: `${d2d?.[1] ?? '?'} ms D2D`, ratio: m[1], target: '>= 0.8', verdict: m[2] === 'PASS' ? 'met' : 'missed' })}\n`);
    }
  }
}
/**
 * The verdict rows of issue 16 part 4 from `kvc_bench_cuda`'s summary lines (native/cuda/bench_cuda.cu
 * writes them): the 128 MiB step (attn128) >= 0.93 of the same run's plain read, and the isolated
 * 28-layer step (2 KV heads, the default kernel variant V2 at 32 KiB items) <= 15 us including launch.
 * A line that is not there gives no row (the table's run list shows the benchmark's exit).
 * @param {string} summary the text after `summary` in the executable's output
 * @returns {Array<{name: string, figure: string, baseline: string, ratio: string, target: string, verdict: 'met' | 'missed'}>}
 */
function cudaVerdicts(summary) {
  const out = [];
  const a = /attn128 \(best: ([^)]*)\): step ([0-9.]+) us.*?= ([0-9.]+) of the plain read ([0-9.]+) us/.exec(summary);
  if (a) out.push({ name: `128 MiB step (attn128, ${a[1]}) vs the plain read`, figure: `${a[2]} us`, baseline: `${a[4]} us plain read`, ratio: a[3], target: '>= 0.93', verdict: Number(a[3]) >= 0.93 ? 'met' : 'missed' });
  const s = /step28 H=2 \(([0-9.]+) MiB\) V2 items 32768 B: queued step ([0-9.]+) us, isolated step ([0-9.]+) us/.exec(summary);
  // baseline: the fastest plain read of the step's own scattered chunks, launched alone from idle
  const floors = [...summary.matchAll(/step28 floor, the step's own scattered chunks read plainly[^\n]*alone from idle ([0-9.]+) us/g)].map((m) => Number(m[1]));
  const floor = floors.length ? Math.min(...floors) : undefined;
  if (s) out.push({ name: `isolated 28-layer step (2 KV heads, ${s[1]} MiB) from an idle GPU, incl. launch`, figure: `${s[3]} us`, baseline: floor ? `${floor} us plain read of its chunks` : '-', ratio: floor ? (floor / Number(s[3])).toFixed(3) : '-', target: '<= 15 us', verdict: Number(s[3]) <= 15 ? 'met' : 'missed' });
  return out;
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
  `${new Date().toISOString()}, ${hostname()}, ${cpus().length} cores (${cpus()[0]?.model ?? '?'}), node ${process.version}${flag('--quick') ? ', quick runs' : ''}. Ratios are against a baseline measured in the same run.`,
  '',
  '| benchmark | measured | figure | baseline (same run) | ratio | target | verdict |',
  '| --- | --- | --- | --- | --- | --- | --- |',
  ...rows.map((r) => `| ${esc(r.bench)} | ${esc(r.name)} | ${esc(r.figure)} | ${esc(r.baseline)} | ${esc(r.ratio)} | ${esc(r.target)} | ${r.verdict} |`),
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

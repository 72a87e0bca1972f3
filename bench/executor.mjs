// Executor overhead: the same engine with its workers in process and in worker processes
// (packages/engine/src/multiprocess-executor.ts). Prints start time, prefill and decode step times
// (median) and their ratio (processes / in process). Asserts nothing.
// Run after `npm run build`; `KVC_BENCH_QUICK=1` for a short run.
import { Engine } from '../packages/engine/dist/index.js';
import { result } from './lib/results.mjs';

const quick = process.env.KVC_BENCH_QUICK === '1';
const DECODE = quick ? 16 : 64;
const prompt = 'The quick brown fox jumps over the lazy dog. '.repeat(quick ? 3 : 6);
const configs = [
  ['dense-gqa', 2, 1],
  ['dense-gqa', 1, 2],
  ['hybrid-mamba2', 2, 1],
];

async function run(preset, tpSize, ppSize, executor) {
  const t0 = performance.now();
  const e = new Engine({ preset, tpSize, ppSize, numBlocks: 256, maxNumBatchedTokens: 512, enablePrefixCaching: false, executor });
  await e.ready;
  const start = performance.now() - t0;
  try {
    await e.generate(prompt, { maxTokens: 4, ignoreEos: true }); // JIT warm-up in every process
    await e.addRequest(prompt, { maxTokens: DECODE, ignoreEos: true });
    const times = [];
    while (e.scheduler.hasWork()) {
      const t = performance.now();
      await e.step();
      times.push(performance.now() - t);
    }
    const decodes = times.slice(1).sort((x, y) => x - y);
    return { start, prefill: times[0], decode: decodes[Math.floor(decodes.length / 2)] };
  } finally {
    await e.shutdown();
  }
}

const f = (ms) => `${ms.toFixed(2)} ms`;
console.log('| model | TP x PP | start (in process / processes) | prefill of the prompt | decode step (median) | decode ratio |');
console.log('| --- | --- | --- | --- | --- | --- |');
for (const [preset, tp, pp] of configs) {
  const a = await run(preset, tp, pp, 'inprocess');
  const b = await run(preset, tp, pp, 'processes');
  console.log(`| ${preset} | ${tp} x ${pp} | ${f(a.start)} / ${f(b.start)} | ${f(a.prefill)} / ${f(b.prefill)} | ${f(a.decode)} / ${f(b.decode)} | ${(b.decode / a.decode).toFixed(2)} |`);
  result('executor', { name: `decode step, ${preset} TP${tp} x PP${pp}, worker processes`, figure: f(b.decode), baseline: `${f(a.decode)} in process`, ratio: (b.decode / a.decode).toFixed(2) });
}

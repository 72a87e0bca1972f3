// The forward pass of the demo model (`dense-gqa`): a 1K-token prefill (one segment, TP 1, PP 1,
// one thread), on the JavaScript path and on the native kernels (packages/engine/src/model/native-forward.ts)
// in the same run, interleaved; prints the median of N of each, the ratio, whether the two paths
// give the same logits bit for bit, and a verdict against the 50 ms goal of issue #16 section 3.
// Run after `npm run build`. `KVC_BENCH_QUICK=1` for a short run; `N=...`, `TOKENS=...` to change;
// `FORWARD_ISA=avx2` (or `generic`, `avx512`) for another variant of the kernels than this CPU's widest.
import { Worker, buildGroupConfigs, buildWeights, forward, forwardPath, resolveModel, setForwardPath } from '../packages/engine/dist/index.js';
import { result } from './lib/results.mjs';

const quick = process.env.KVC_BENCH_QUICK === '1';
const N = Number(process.env.N ?? (quick ? 3 : 7));
const TOKENS = Number(process.env.TOKENS ?? 1024);
const GOAL_MS = 50;
const m = resolveModel('dense-gqa');
const w = buildWeights(m);
const B = 16;
const groups = buildGroupConfigs(m, B);
const numBlocks = Math.ceil(TOKENS / B) + 1;
const worker = new Worker({ model: m, tpRank: 0, tpSize: 1, ppRank: 0, ppSize: 1, numBlocks, blockSize: B, cacheLayout: { layout: 'NHD', kvLayout: 'kv-first' }, kvDtype: 'bfloat16', groupConfigs: groups });
const tokenIds = Array.from({ length: TOKENS }, (_, i) => (i * 7919 + 13) % 256);
const blocks = groups.map(() => Array.from({ length: numBlocks - 1 }, (_, i) => i + 1));

/** One prefill: wall time and this process's CPU time (user + system; on a busy host the CPU time is the steadier figure). */
function prefill() {
  const c = process.cpuUsage();
  const t = performance.now();
  const l = forward(m, w, [[worker]], [{ requestId: 'r', start: 0, tokenIds, blocks, cacheFilled: 0, needLogits: true }]);
  const ms = performance.now() - t;
  const u = process.cpuUsage(c);
  return { ms, cpu: (u.user + u.system) / 1000, logits: l.get('r') };
}

const native = setForwardPath('native');
if (!native) console.log(`native path unavailable: ${forwardPath().reason}`);
if (native && process.env.FORWARD_ISA) {
  const { addon } = (await import('@kvconnect/native')).default;
  if (!addon.setForwardIsa(process.env.FORWARD_ISA)) throw new Error(`FORWARD_ISA=${process.env.FORWARD_ISA}: this CPU cannot run that variant`);
}
const times = { js: [], native: [] };
const cpus = { js: [], native: [] };
const logits = {};
for (let i = 0; i < N + 1; i++) {
  for (const path of native ? ['js', 'native'] : ['js']) {
    setForwardPath(path);
    const r = prefill();
    if (i > 0) {
      // the first round warms the JIT
      times[path].push(r.ms);
      cpus[path].push(r.cpu);
    }
    logits[path] = r.logits;
  }
}
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const f = (ms) => `${ms.toFixed(1)} ms`;
const js = median(times.js);
console.log(`dense-gqa prefill of ${TOKENS} tokens, TP 1 PP 1, one thread, median of ${N} (min..max):`);
const span = (xs) => `${f(Math.min(...xs))}..${f(Math.max(...xs))}`;
console.log(`  js:     wall ${f(js)} (${span(times.js)}), CPU ${f(median(cpus.js))} (${span(cpus.js)})`);
result('forward', { name: `dense-gqa ${TOKENS}-token prefill, JS path (wall, median of ${N})`, figure: f(js) });
if (native) {
  const nv = median(times.native);
  const { addon } = (await import('@kvconnect/native')).default;
  const same = Buffer.from(logits.js.buffer).equals(Buffer.from(logits.native.buffer));
  console.log(`  native: wall ${f(nv)} (${span(times.native)}), CPU ${f(median(cpus.native))} (${span(cpus.native)}), kernels: ${addon.forwardIsa()}`);
  console.log(`  ratio js / native: ${(js / nv).toFixed(1)}x; logits of the two paths ${same ? 'identical bit for bit' : 'DIFFER'}`);
  console.log(`  verdict: ${nv <= GOAL_MS ? 'MEETS' : 'MISSES'} the goal of <= ${GOAL_MS} ms (issue #16 section 3)`);
  result('forward', { name: `dense-gqa ${TOKENS}-token prefill, native path (wall, median of ${N})`, figure: f(nv), baseline: f(js), ratio: `${(js / nv).toFixed(1)}x`, target: `<= ${GOAL_MS} ms`, met: nv <= GOAL_MS });
} else {
  console.log(`  verdict: no native path; the JS path ${js <= GOAL_MS ? 'meets' : 'misses'} the goal of <= ${GOAL_MS} ms`);
}

#!/usr/bin/env node
/**
 * KVChecksumWorker on device KV with the `cuda` backend, as an engine drives it (GPU only): KV in
 * device memory, one producer send and one consumer load per step, `takeReport()` at the end of
 * each step. Prints, per configuration: host time per step in the checksum hooks (median, p99),
 * the steps between a submit and its records, the synchronizing CUDA calls per step
 * (`cuda.syncCallCount()`, expected 0 after the first step), and checks every record against the
 * `ts` backend over the same bytes. Needs only the built `dist/` of @kvconnect/checksum and
 * @kvconnect/core and the CUDA-built addon (no vitest), so it runs on a bare GPU machine.
 *
 *   npm run build && npm run build:cuda -w @kvconnect/native && node bench/cuda/device-worker.mjs
 *
 * Exit code 0 when every record matched and no steady-state step made a synchronizing call.
 */
import { performance } from 'node:perf_hooks';
import { cudaBindings, cudaSyncCallCount, cudaUnavailableReason, pagedAttentionBytes, pagedAttentionCache } from '@kvconnect/checksum';
// The worker's module itself (not the package index), so that a bare GPU machine needs no other
// dependency of @kvconnect/core (prom-client, pino, ...).
import { KVChecksumWorker } from '../../packages/core/dist/checksum-worker.js';

const reason = cudaUnavailableReason();
if (reason) {
  console.log(`skipped: ${reason}`);
  process.exit(0);
}
if (cudaSyncCallCount() === null) {
  console.log('the CUDA addon has no syncCallCount: rebuild it (npm run build:cuda -w @kvconnect/native)');
  process.exit(1);
}
const cuda = cudaBindings();

/** One configuration: layers x (blocks, heads, head size) bf16 NHD, blocks per request, steps. */
const CONFIGS = [
  { name: '4 layers, 4 heads x 128, 4 blocks/request', layers: 4, numBlocks: 256, numHeads: 4, headSize: 128, blocks: 4, steps: 200 },
  { name: '28 layers, 2 heads x 128, 8 blocks/request', layers: 28, numBlocks: 128, numHeads: 2, headSize: 128, blocks: 8, steps: 200 },
];

const median = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
const p99 = (a) => [...a].sort((x, y) => x - y)[Math.min(a.length - 1, Math.floor(a.length * 0.99))];
const same = (a, b) => JSON.stringify(a, (_, v) => (typeof v === 'bigint' ? `${v}` : v instanceof Map ? [...v] : ArrayBuffer.isView(v) ? Array.from(v, String) : v)) === JSON.stringify(b, (_, v) => (typeof v === 'bigint' ? `${v}` : v instanceof Map ? [...v] : ArrayBuffer.isView(v) ? Array.from(v, String) : v));

let failed = 0;
for (const c of CONFIGS) {
  const g = { dtype: 'bfloat16', numBlocks: c.numBlocks, blockSize: 16, numHeads: c.numHeads, headSize: c.headSize, kvLayout: 'kv-first' };
  let s = 7;
  const host = Array.from({ length: c.layers }, () => {
    const b = new Uint8Array(pagedAttentionBytes(g));
    for (let i = 0; i < b.length; i += 4) {
      s = (s * 1103515245 + 12345) >>> 0;
      b[i] = s >>> 24;
      b[i + 1] = s >>> 16;
      b[i + 2] = s >>> 8;
      b[i + 3] = s;
    }
    return b;
  });
  const names = host.map((_, l) => `model.layers.${l}.self_attn.attn`);
  const groups = [{ groupId: 0, caches: names.map((name, l) => pagedAttentionCache({ name, ...g, layout: 'NHD', at: { region: l } })) }];
  const base = { rank: { tpRank: 0, tpSize: 1 }, ppRank: 0, ppSize: 1, groups, groupConfigs: [{ groupId: 0, kind: 'full-attention', blockSize: 16, layerNames: names }] };
  const device = host.map((b) => {
    const address = cuda.devAlloc(0, b.byteLength);
    cuda.copyToDevice(0, address, b);
    return { kind: 'device', device: 0, address, bytes: b.byteLength };
  });
  const ref = new KVChecksumWorker({ backend: 'native' });
  ref.registerKvCaches({ ...base, regions: host });
  const gpu = new KVChecksumWorker({ backend: 'cuda' });
  gpu.registerKvCaches({ ...base, regions: device, stream: 0n });
  const ids = (i, k) => Array.from({ length: c.blocks }, (_, j) => (i * 13 + k * 5 + j * 31) % c.numBlocks);
  const want = new Map();
  const submitted = new Map();
  const lag = [];
  const hostUs = [];
  const syncs = [];
  let mismatches = 0;
  for (let i = 0; i < c.steps + 100 && (i < c.steps || gpu.stepsInFlight > 0); i++) {
    const tokens = c.blocks * 16 - 3;
    const meta =
      i < c.steps
        ? { send: [{ requestId: `s${i}`, numTokens: tokens, groups: [{ groupId: 0, start: 0, blockIds: ids(i, 0) }] }], recv: [{ requestId: `r${i}`, numTokens: tokens, groups: [{ groupId: 0, start: 0, blockIds: ids(i, 1) }] }], drop: [] }
        : null;
    const res = { finishedSending: new Set(), finishedRecving: new Set(meta ? [`r${i}`] : []), invalidBlockIds: new Set(), kvChecksums: new Map() };
    ref.bindStepMeta(meta);
    ref.afterForward();
    ref.afterTransferResults(res);
    const rr = ref.takeReport();
    for (const e of [...(rr?.sends ?? []), ...(rr?.recvs ?? [])]) want.set(e.requestId, e);
    const before = cudaSyncCallCount();
    const t0 = performance.now();
    gpu.bindStepMeta(meta);
    gpu.afterForward();
    gpu.afterTransferResults(res);
    const r = gpu.takeReport();
    hostUs.push((performance.now() - t0) * 1000);
    syncs.push(cudaSyncCallCount() - before);
    if (meta) submitted.set(`s${i}`, i), submitted.set(`r${i}`, i);
    for (const e of [...(r?.sends ?? []), ...(r?.recvs ?? [])]) {
      lag.push(i - submitted.get(e.requestId));
      if (!same(e, want.get(e.requestId))) mismatches++;
    }
    await new Promise((res2) => setImmediate(res2));
  }
  const steady = syncs.slice(1).filter((d) => d !== 0).length;
  const ok = mismatches === 0 && steady === 0 && lag.length === 2 * c.steps;
  if (!ok) failed++;
  console.log(
    `${c.name}: ${c.steps} steps, ${lag.length} records (${mismatches} differ from native), host us/step in the hooks median ${median(hostUs).toFixed(1)} p99 ${p99(hostUs).toFixed(1)}, ` +
      `steps submit->records median ${median(lag)} max ${Math.max(...lag)}, synchronizing calls: first step ${syncs[0]}, later steps with any ${steady} -> ${ok ? 'ok' : 'FAILED'}`,
  );
  gpu.close();
  for (const d of device) cuda.devFree(0, d.address);
}
process.exit(failed ? 1 : 0);

#!/usr/bin/env node
// Issue 10 part 5 and issue 15 on ONE GPU, in one command: producer and consumer engines as
// separate processes, every engine's workers in worker processes, KV in device memory on both
// sides (`device: cuda`; both engines share GPU 0: only one-GPU machines are lent), the checksum
// backend `auto` (cuda on GPU KV), the embedded agent moving the device regions (CUDA IPC between
// processes of one host). One table row per case, each with its PASS / FAIL (or `skipped: why`):
//
// - P/D rows, NIXL pull, NIXL push and Mooncake, producer TP2 -> consumer TP1 and TP1 -> TP2
//   (harness `startPDProcesses`, packages/harness/src/topology-multiprocess.ts): clean requests
//   verify and equal a single host instance; consumer-side faults injected over the device KV by
//   the FaultInjectingConnector (packages/harness/src/faults/kv-bytes.ts: through the device
//   memory the checksum sums) are every one caught (the load not used as it came) and recomputed
//   to the single instance's output. A connector that refuses device KV gives `skipped: <reason>`.
// - Producer-side faults (`stale`, `replay-params` with zeroed blocks) need the producer wrapped
//   too: one harness scenario over NIXL pull, device KV, in-process engines (runScenario).
// - Checksum path rows (in-process engines, so that this process holds the checksum contexts):
//   synchronizing CUDA calls of the checksum library over steady-state P/D requests
//   (`cuda.syncCallCount()`; emulated: `EmulatedDevice.syncCalls`), expected 0; host time the
//   checksum hooks add per step (kvconnect_kv_checksum_seconds, per side). GPU time per step is
//   not timed in the engine path (no events there): `kvc_bench_cuda` measures it (README).
//
//   node bench/cuda/pd-device-all.mjs                                     (GPU machine, CUDA addon)
//   KVC_PD_DEVICE=cuda-emulated node bench/cuda/pd-device-all.mjs        (anywhere: emulated device memory)
//   KVC_PD_ONLY=nixl-pull,mooncake ...    (only those connectors' P/D rows)
//
// Run after `npm run build` (the engine processes run dist/). Exit code 1 if any row FAILs.
import { performance } from 'node:perf_hooks';
import { Engine, PDProxy, PRESETS } from '@kvconnect/engine';
import { EmulatedDevice, cudaSyncCallCount } from '@kvconnect/checksum';
import { KVChecksumObservability } from '@kvconnect/core';
import { parseScenario, runScenario, startPDProcesses } from '@kvconnect/harness';

// Engine shutdowns wait on unref'd timers: keep the event loop alive until the table is out
// (else Node ends the script with exit code 13, a top-level await left unsettled).
const keepAlive = setInterval(() => {}, 1 << 30);
const DEVICE = process.env.KVC_PD_DEVICE ?? 'cuda';
const ONLY = process.env.KVC_PD_ONLY?.split(',');
const MAX = 6;
const MODEL = PRESETS['dense-gqa'];
const prompt = (i) => `Request ${i}: its KV lives in device memory on both sides, ${'checked before decode, '.repeat(3 + (i % 3))}end.`;
/** Consumer-side faults over device KV, request i gets FAULTS[i]; the requests after them are clean. */
const FAULTS = [
  { kind: 'bit-flip', seed: 1 },
  { kind: 'corrupt-region', fill: 'random', tokens: [20, 23] },
  { kind: 'misplaced-block', position: 0 },
  { kind: 'misplaced-tokens', tokens: [2, 4], sourceOffset: 3 },
  { kind: 'random-stale-range', fill: 'zero' },
  { kind: 'wrong-layout' },
  { kind: 'transport-error', tokens: [0, 15] },
];
const CLEAN = 2;
const rows = [];
const row = (what, status, detail) => {
  rows.push({ what, status, detail });
  console.log(`${status.padEnd(8)} ${what}: ${detail}`);
};

const reference = new Engine({ model: MODEL, numBlocks: 512, engineId: 'pd-all-ref' });
const want = [];
for (let i = 0; i < FAULTS.length + CLEAN; i++) want.push((await reference.generate(prompt(i), { maxTokens: MAX, ignoreEos: true })).tokenIds);

// ---- P/D over device KV, worker processes, consumer-side faults ----------------------------------
for (const connector of ['nixl-pull', 'nixl-push', 'mooncake']) {
  if (ONLY && !ONLY.includes(connector)) continue;
  for (const [ptp, ctp] of [[2, 1], [1, 2]]) {
    const what = `${connector} TP${ptp} -> TP${ctp}`;
    // dense-gqa has 2 KV heads: a TP2 consumer rank holds one, where HND and NHD are the same
    // bytes, so wrong-layout changes nothing there (its request is then a clean one).
    const noop = (f) => f.kind === 'wrong-layout' && ctp >= MODEL.numKvHeads;
    const faults = FAULTS.map((f, i) => ({ ...f, requests: [i] })).filter((f) => !noop(f));
    let pd;
    const t0 = performance.now();
    try {
      pd = await startPDProcesses({ connector, model: MODEL, producer: { tp: ptp, device: DEVICE }, consumer: { tp: ctp, device: DEVICE }, faults, workers: 'processes', idPrefix: `all-${connector}-${ptp}${ctp}`, readyTimeoutMs: 60_000 });
    } catch (e) {
      const msg = e instanceof Error ? e.message : String(e);
      const refused = /DeviceMemoryUnsupportedError|moves host memory only/.exec(msg);
      row(what, refused ? 'SKIP' : 'FAIL', refused ? `skipped: ${connector} refuses device KV (${msg.split('\n').find((l) => /host memory only/.test(l))?.trim() ?? refused[0]})` : `did not start: ${msg.split('\n').slice(0, 3).join(' | ')}`);
      continue;
    }
    try {
      const pids = await pd.workerPids();
      const started = performance.now() - t0;
      let same = 0;
      let verified = 0;
      let caught = 0;
      const missed = [];
      const t1 = performance.now();
      for (let i = 0; i < FAULTS.length + CLEAN; i++) {
        const res = await fetch(`${pd.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ prompt: prompt(i), max_tokens: MAX, temperature: 0, ignore_eos: true, request_id: `r${i}.0` }) });
        const body = await res.json();
        if (res.status === 200 && JSON.stringify(body.choices?.[0]?.token_ids) === JSON.stringify(want[i])) same++;
        const load = body.kvconnect?.decode?.load;
        const used = load?.verdict === 'verified' && load?.action === 'use';
        if (i < FAULTS.length && !noop(FAULTS[i])) {
          if (!used) caught++;
          else missed.push(FAULTS[i].kind);
        } else if (used) verified++;
      }
      const nf = faults.length;
      const nc = FAULTS.length + CLEAN - nf;
      const ms = (performance.now() - t1) / (FAULTS.length + CLEAN);
      const n = FAULTS.length + CLEAN;
      const ok = same === n && verified === nc && caught === nf && pids.producer.length === ptp && pids.consumer.length === ctp;
      row(what, ok ? 'PASS' : 'FAIL', `outputs equal a single instance ${same}/${n}; clean loads verified ${verified}/${nc}; faults caught ${caught}/${nf}${missed.length ? ` (missed: ${missed.join(', ')})` : ''}${nf < FAULTS.length ? ' (wrong-layout left out: one KV head per consumer rank)' : ''}; worker processes ${pids.producer.length} + ${pids.consumer.length}; ${ms.toFixed(0)} ms per request; started in ${(started / 1000).toFixed(1)} s`);
    } catch (e) {
      row(what, 'FAIL', `error: ${e instanceof Error ? e.message : String(e)}`);
    } finally {
      await pd.shutdown();
    }
  }
}

// ---- Producer-side faults over device KV (harness scenario, NIXL pull, in-process engines) ------
{
  const s = parseScenario({
    name: 'pd-device-producer-faults',
    model: 'GQA-S',
    connector: 'nixl-pull',
    producer: { tp: 2, device: DEVICE },
    consumer: { device: DEVICE },
    requests: Array.from({ length: 4 }, (_, i) => ({ promptTokens: 40, promptSeed: i })),
    faults: [
      { kind: 'stale', requests: [0] },
      { kind: 'stale', fill: 'zero', requests: [1] },
      { kind: 'bit-flip', layer: 1, head: 1, token: 20, requests: [2] },
    ],
    expect: {},
  });
  const q = (await runScenario(s)).runs[0].requests;
  const caught = q.slice(0, 3).filter((o) => o.kind === 'mismatch').length;
  const ok = caught === 3 && q[3].kind === 'verified' && q.every((o) => o.equalsReference);
  row(`nixl-pull TP2 -> TP1, producer-side stale (scenario)`, ok ? 'PASS' : 'FAIL', `stale / stale zero / bit-flip caught ${caught}/3 (${q.slice(0, 3).map((o) => o.kind).join(', ')}); control ${q[3].kind}; outputs equal ${q.filter((o) => o.equalsReference).length}/4`);
}

// ---- The checksum path on device KV: sync calls and host time per step ---------------------------
{
  const emulated = DEVICE === 'cuda-emulated';
  const dev = emulated ? new EmulatedDevice({ completeAfterPolls: 0 }) : null;
  const syncs = () => (emulated ? dev.syncCalls : cudaSyncCallCount());
  const pObs = new KVChecksumObservability({ level: 'silent' });
  const dObs = new KVChecksumObservability({ level: 'silent' });
  await import('@kvconnect/nixl-pull');
  const base = { model: MODEL, numBlocks: 256, device: DEVICE, checksumBackend: dev ?? 'auto' };
  const p = new Engine({ ...base, tpSize: 2, engineId: 'pd-all-ck-p', observability: pObs, kvTransferConfig: { kv_connector: 'NixlConnector', kv_role: 'kv_producer', enable_kv_checksum: true } });
  const d = new Engine({ ...base, engineId: 'pd-all-ck-d', observability: dObs, kvTransferConfig: { kv_connector: 'NixlConnector', kv_role: 'kv_consumer', enable_kv_checksum: true, kv_checksum_fail_closed: true } });
  try {
    await Promise.all([p.ready, d.ready]);
    const proxy = new PDProxy({ prefill: p, decode: d });
    await proxy.generate(prompt(0), { maxTokens: MAX, ignoreEos: true }); // warm-up: contexts, first tables
    const s0 = syncs();
    const steps0 = p.scheduler.stats.steps + d.scheduler.stats.steps;
    let same = 0;
    for (let i = 1; i <= 4; i++) if (JSON.stringify((await proxy.generate(prompt(i), { maxTokens: MAX, ignoreEos: true })).tokenIds) === JSON.stringify(want[i])) same++;
    const steps = p.scheduler.stats.steps + d.scheduler.stats.steps - steps0;
    const delta = s0 === null ? null : syncs() - s0;
    row(`checksum path: synchronizing calls (${emulated ? 'EmulatedDevice.syncCalls' : 'cuda.syncCallCount()'})`, delta === 0 && same === 4 ? 'PASS' : 'FAIL', delta === null ? 'the CUDA addon has no syncCallCount (rebuild it with CUDA)' : `${delta} over 4 steady-state P/D requests (${steps} engine steps, both engines); outputs equal ${same}/4`);
    const hist = async (obs, side) => {
      const m = (await obs.registry.getMetricsAsJSON()).find((x) => x.name === 'kvconnect_kv_checksum_seconds');
      const v = (k) => m?.values.find((x) => x.metricName === `kvconnect_kv_checksum_seconds_${k}` && x.labels.side === side)?.value ?? 0;
      return { n: v('count'), s: v('sum') };
    };
    const send = await hist(pObs, 'send');
    const recv = await hist(dObs, 'recv');
    const us = (h) => (h.n > 0 ? ((h.s / h.n) * 1e6).toFixed(0) : '-');
    row('checksum path: host time added to a step', send.n > 0 && recv.n > 0 ? 'PASS' : 'FAIL', `producer send ${us(send)} us mean over ${send.n} worker-steps, consumer recv ${us(recv)} us mean over ${recv.n}; GPU time per step: not timed in the engine path (kvc_bench_cuda step28)`);
  } finally {
    await p.shutdown();
    await d.shutdown();
  }
}
await reference.shutdown();

console.log(`\n| case | verdict | detail |\n| --- | --- | --- |`);
for (const r of rows) console.log(`| ${r.what} | ${r.status} | ${r.detail.replace(/\|/g, '/')} |`);
const failed = rows.filter((r) => r.status === 'FAIL').length;
console.log(failed === 0 ? `device ${DEVICE}: all ${rows.length - rows.filter((r) => r.status === 'SKIP').length} rows passed${rows.some((r) => r.status === 'SKIP') ? `, ${rows.filter((r) => r.status === 'SKIP').length} skipped` : ''}` : `device ${DEVICE}: ${failed} row(s) FAILED`);
clearInterval(keepAlive);
process.exit(failed === 0 ? 0 : 1);

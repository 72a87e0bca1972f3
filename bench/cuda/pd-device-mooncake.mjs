#!/usr/bin/env node
// Mooncake P/D with the KV cache in GPU memory (issue 10, parts 4 and 5): a producer engine (TP2)
// and a consumer engine (TP1) as separate processes, each with its workers in worker processes,
// with `device: 'cuda'` (KV allocated through the addon; the model computes on a host mirror),
// MooncakeConnector over the embedded agent (device regions between processes of one host: CUDA
// IPC), a proxy process in `concurrent` mode. The consumer is told the producer's bootstrap
// address by its config (no lookup by engine id). Prints: outputs equal to a single host instance
// and the consumer's verified loads. Figures, not assertions; the exit code is 1 if any check fails.
// (bench/cuda/pd-device.mjs does the same for NIXL pull and push.)
//
//   node bench/cuda/pd-device-mooncake.mjs                               (GPU machine, addon built with CUDA)
//   KVC_PD_DEVICE=cuda-emulated node bench/cuda/pd-device-mooncake.mjs   (anywhere: emulated device memory; staged, no IPC across processes)
//
// Run after `npm run build` (the engine processes run dist/).
import net from 'node:net';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import { Engine, launchEngineProcess, launchProxyProcess } from '@kvconnect/engine';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const DEVICE = process.env.KVC_PD_DEVICE ?? 'cuda';
const N = Number(process.env.KVC_PD_PROMPTS ?? 6);
const MAX = 8;
const PROMPTS = Array.from({ length: N }, (_, i) => `Prompt ${i}: Mooncake writes this request's KV from GPU memory into GPU memory, ${'checked '.repeat(4 + i)}before decode.`);
const MODULE = join(ROOT, 'node_modules/@kvconnect/mooncake/dist/index.js');
let failed = 0;
const check = (ok, what) => {
  console.log(`${ok ? 'PASS' : 'FAIL'} ${what}`);
  if (!ok) failed++;
};
const metric = (text, name, labels = '') => {
  let sum = 0;
  for (const line of text.split('\n')) if (line.startsWith(`${name}${labels}`) && !line.startsWith('#')) sum += Number(line.split(' ').pop());
  return sum;
};
const freePort = () =>
  new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });

const reference = new Engine({ preset: 'dense-gqa', numBlocks: 512, engineId: 'pd-device-mc-ref' });
const want = [];
for (const p of PROMPTS) want.push((await reference.generate(p, { maxTokens: MAX, ignoreEos: true })).tokenIds);

const port = await freePort();
const extra = { bootstrap_port: port, abort_timeout_ms: 60_000, transfer_timeout_ms: 90_000 };
const base = { preset: 'dense-gqa', numBlocks: 256, imports: [MODULE], device: DEVICE, executor: 'processes' };
const t0 = performance.now();
const [p, d] = await Promise.all([
  launchEngineProcess({ config: { ...base, tpSize: 2, engineId: 'dev-mc-p', kvTransferConfig: { kv_connector: 'MooncakeConnector', kv_role: 'kv_producer', enable_kv_checksum: true, kv_connector_extra_config: extra } } }),
  launchEngineProcess({
    config: { ...base, engineId: 'dev-mc-d', kvTransferConfig: { kv_connector: 'MooncakeConnector', kv_role: 'kv_consumer', enable_kv_checksum: true, kv_checksum_fail_closed: true, kv_load_failure_policy: 'recompute', kv_connector_extra_config: { ...extra, remote_bootstrap_addr: `127.0.0.1:${port}` } } },
  }),
]);
const proxy = await launchProxyProcess({ config: { prefill: [p.url], decode: [d.url], mode: 'concurrent' } });
console.log(`== mooncake: device ${DEVICE}, producer TP2 in two worker processes (pid ${p.pid}), consumer TP1 in a worker process (pid ${d.pid}); started in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
try {
  let same = 0;
  const t1 = performance.now();
  for (let i = 0; i < PROMPTS.length; i++) {
    const res = await fetch(`${proxy.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ prompt: PROMPTS[i], max_tokens: MAX, ignore_eos: true }) });
    const body = await res.json();
    if (res.status === 200 && JSON.stringify(body.choices[0].token_ids) === JSON.stringify(want[i])) same++;
  }
  const ms = performance.now() - t1;
  const dm = await (await fetch(`${d.url}/metrics`)).text();
  const verified = metric(dm, 'kvconnect_kv_checksum_loads_total', '{verdict="verified"}');
  check(same === PROMPTS.length, `mooncake: ${same}/${PROMPTS.length} outputs equal a single host instance (${(ms / PROMPTS.length).toFixed(0)} ms per request)`);
  check(verified === PROMPTS.length, `mooncake: ${verified} loads verified`);
} finally {
  await Promise.all([proxy.stop(), p.stop(), d.stop()]);
}
process.exit(failed ? 1 : 0);

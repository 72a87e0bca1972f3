#!/usr/bin/env node
// P/D with the KV cache in GPU memory (issue 10, part 5): a producer engine (TP2) and a consumer
// engine (TP1) as separate processes, each with its workers in worker processes, with `device: 'cuda'` (KV allocated through the addon; the
// model computes on a host mirror), the checksum backend chosen by `auto` (cuda on GPU KV), NIXL
// pull and push over the embedded agent (device regions between processes of one host: CUDA IPC),
// a proxy process. Prints, per connector: outputs equal to a single host instance, verdicts, a
// wrong-request load (another request's kv_transfer_params: must never verify), the embedded
// agent's transfer time. Figures, not assertions; the exit code is 1 if any check fails.
//
//   node bench/cuda/pd-device.mjs                        (on the GPU machine, addon built with CUDA)
//   KVC_PD_DEVICE=cuda-emulated node bench/cuda/pd-device.mjs   (anywhere: emulated device memory)
//
// Mooncake is left out: its worker half moves host memory only (DeviceMemoryUnsupportedError).
// Run after `npm run build` (the engine processes run dist/).
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import { Engine, launchEngineProcess, launchProxyProcess } from '@kvconnect/engine';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const DEVICE = process.env.KVC_PD_DEVICE ?? 'cuda';
const N = Number(process.env.KVC_PD_PROMPTS ?? 6);
const MAX = 8;
const PROMPTS = Array.from({ length: N }, (_, i) => `Prompt ${i}: the KV of this request lives in GPU memory on both sides, ${'and is checked '.repeat(4 + i)}before decode.`);
const modules = { pull: join(ROOT, 'node_modules/@kvconnect/nixl-pull/dist/index.js'), push: join(ROOT, 'node_modules/@kvconnect/nixl-push/dist/index.js') };
const names = { pull: 'NixlConnector', push: 'NixlPushConnector' };
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

const reference = new Engine({ preset: 'dense-gqa', numBlocks: 512, engineId: 'pd-device-ref' });
const want = [];
for (const p of PROMPTS) want.push((await reference.generate(p, { maxTokens: MAX, ignoreEos: true })).tokenIds);
// Request B: as long as PROMPTS[0] (so the consumer loads all of A's blocks), other tokens.
const B = PROMPTS[0].replace('Prompt 0', 'Prompt B');
const wantB = (await reference.generate(B, { maxTokens: MAX, ignoreEos: true })).tokenIds;

for (const mode of ['pull', 'push']) {
  const base = { preset: 'dense-gqa', numBlocks: 256, imports: [modules[mode]], device: DEVICE };
  const t0 = performance.now();
  const [p, d] = await Promise.all([
    launchEngineProcess({ config: { ...base, executor: 'processes', tpSize: 2, engineId: `dev-${mode}-p`, kvTransferConfig: { kv_connector: names[mode], kv_role: 'kv_producer', enable_kv_checksum: true } } }),
    launchEngineProcess({
      config: { ...base, executor: 'processes', engineId: `dev-${mode}-d`, kvTransferConfig: { kv_connector: names[mode], kv_role: 'kv_consumer', enable_kv_checksum: true, kv_checksum_fail_closed: true, kv_load_failure_policy: 'recompute' } },
    }),
  ]);
  const proxy = await launchProxyProcess({ config: { prefill: [p.url], decode: [d.url], mode: 'sequential' } });
  console.log(`== ${mode}: device ${DEVICE}, producer TP2 in two worker processes (pid ${p.pid}), consumer TP1 in a worker process (pid ${d.pid}); started in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
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
    check(same === PROMPTS.length, `${mode}: ${same}/${PROMPTS.length} outputs equal a single host instance (${(ms / PROMPTS.length).toFixed(0)} ms per request)`);
    check(metric(dm, 'kvconnect_kv_checksum_loads_total', '{verdict="verified"}') === PROMPTS.length, `${mode}: ${metric(dm, 'kvconnect_kv_checksum_loads_total', '{verdict="verified"}')} loads verified on the device checksum backend`);
    // Another request's params, its blocks intact on the producer: must never verify (SPEC 8.0).
    const a = await (await fetch(`${p.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ prompt: PROMPTS[0], max_tokens: 1, kv_transfer_params: { do_remote_decode: true } }) })).json();
    const params = a.kv_transfer_params;
    const b = await fetch(`${d.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ prompt: B, max_tokens: MAX, ignore_eos: true, kv_transfer_params: { ...params, do_remote_prefill: true } }) });
    const bb = await b.json();
    const dm2 = await (await fetch(`${d.url}/metrics`)).text();
    check(metric(dm2, 'kvconnect_kv_checksum_wrong_request_total') >= 1, `${mode}: request B given request A's params: wrong request caught (wrong_request_total ${metric(dm2, 'kvconnect_kv_checksum_wrong_request_total')})`);
    check(b.status === 200 && JSON.stringify(bb.choices?.[0]?.token_ids) === JSON.stringify(wantB), `${mode}: request B recomputed, output equals a single instance`);
    const xfer = metric(dm2, 'kvconnect_nixl_xfer_time_seconds_sum') + metric((await (await fetch(`${p.url}/metrics`)).text()), 'kvconnect_nixl_xfer_time_seconds_sum');
    console.log(`${mode}: NIXL transfer time (sum over loads, both sides): ${(xfer * 1000).toFixed(1)} ms`);
  } finally {
    await Promise.all([proxy.stop(), p.stop(), d.stop()]);
  }
}
await reference.shutdown();
console.log(failed === 0 ? 'all checks passed' : `${failed} check(s) failed`);
process.exit(failed === 0 ? 0 : 1);

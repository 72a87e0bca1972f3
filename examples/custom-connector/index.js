/**
 * Registers a custom KV connector (LoopbackConnector, ./loopback-connector.js) by name in the
 * kvconnect reference engine, runs prefill/decode disaggregation through it with KV checksums on
 * (fail-closed, policy recompute), and checks the result:
 *  - every load is verified by the KV checksums, and the output equals a single engine's;
 *  - a bit flipped in transit is caught (mismatch) and the request is recomputed, still correct.
 * Prints one line per request, then `verified: ...` and exits 0; anything else exits 1.
 */
import { KVChecksumObservability, KVConnectorRegistry } from '@kvconnect/core';
import { Engine, PDProxy } from '@kvconnect/engine';
import { loadNativeBackend, nativeUnavailableReason } from '@kvconnect/checksum';
import { LOOPBACK_CONNECTOR, loopbackBus, loopbackConnectorFactory } from './loopback-connector.js';

const MODEL = 'dense-gqa'; // the engine's small built-in transformer (float32 compute, bf16 KV)
const SAMPLING = { maxTokens: 8, ignoreEos: true };
const PROMPTS = [
  'Prefill on one engine, decode on another: the KV crosses through a custom connector.',
  'KV checksums prove that every loaded block is the block the producer computed.',
  'A third prompt, long enough to span several KV blocks of sixteen tokens each, to be sure.',
];

// 1. A registry with the custom connector registered by name (the engines look kv_connector up in it).
const registry = new KVConnectorRegistry();
registry.register(loopbackConnectorFactory);

// 2. Producer (prefill) and consumer (decode) engines, checksums on, consumer fail-closed.
const consumerObs = new KVChecksumObservability({ level: 'silent' });
const producer = new Engine({
  model: MODEL,
  engineId: 'producer',
  registry,
  kvTransferConfig: { kv_connector: LOOPBACK_CONNECTOR, kv_role: 'kv_producer', enable_kv_checksum: true },
  observability: new KVChecksumObservability({ level: 'silent' }),
});
const consumer = new Engine({
  model: MODEL,
  engineId: 'consumer',
  registry,
  kvTransferConfig: {
    kv_connector: LOOPBACK_CONNECTOR,
    kv_role: 'kv_consumer',
    enable_kv_checksum: true,
    kv_checksum_fail_closed: true,
    kv_load_failure_policy: 'recompute',
  },
  observability: consumerObs,
});
await Promise.all([producer.ready, consumer.ready]);
const proxy = new PDProxy({ prefill: producer, decode: consumer });
const single = new Engine({ model: MODEL, engineId: 'single' }); // the reference: no P/D

const verdicts = [];
for (const ev of ['load-verified', 'load-mismatch', 'load-unverified']) consumerObs.events.on(ev, (e) => verdicts.push({ ev, action: e.action }));

console.log(`checksum backend: ${loadNativeBackend() ? 'native (C++ addon)' : `ts (${nativeUnavailableReason()})`}`);
const problems = [];

// 3. P/D with checksums: every load verified, output identical to the single engine.
let verified = 0;
for (const [i, prompt] of PROMPTS.entries()) {
  verdicts.length = 0;
  const r = await proxy.generate(prompt, SAMPLING);
  const ref = await single.generate(prompt, SAMPLING);
  const same = JSON.stringify(r.tokenIds) === JSON.stringify(ref.tokenIds);
  const ok = same && r.finishReason === 'length' && verdicts.length === 1 && verdicts[0].ev === 'load-verified';
  if (ok) verified++;
  else problems.push(`request ${i}: finish=${r.finishReason} verdicts=${JSON.stringify(verdicts)} sameAsSingle=${same} ${r.error ?? ''}`);
  console.log(`request ${i}: ${verdicts.map((v) => v.ev).join(',') || 'no verdict'}, ${r.tokenIds.length} tokens, ${same ? 'identical to' : 'DIFFERENT from'} a single engine: ${JSON.stringify(r.tokenIds)}`);
}

// 4. A bit flipped in transit: the consumer's checksums catch it and recompute the prompt locally.
verdicts.length = 0;
loopbackBus.corruptNext = 1;
const bad = await proxy.generate(PROMPTS[0], SAMPLING);
const badRef = await single.generate(PROMPTS[0], SAMPLING);
const caught = verdicts.length === 1 && verdicts[0].ev === 'load-mismatch' && verdicts[0].action === 'recompute';
const recovered = JSON.stringify(bad.tokenIds) === JSON.stringify(badRef.tokenIds);
console.log(`corrupted load: ${verdicts.map((v) => `${v.ev} -> ${v.action}`).join(',') || 'no verdict'}, output ${recovered ? 'identical to' : 'DIFFERENT from'} a single engine`);
if (!caught || !recovered) problems.push(`corrupted load: verdicts=${JSON.stringify(verdicts)} recovered=${recovered}`);

await Promise.all([producer.shutdown(), consumer.shutdown(), single.shutdown()]);

if (problems.length > 0) {
  console.error(`FAILED:\n  ${problems.join('\n  ')}`);
  process.exit(1);
}
console.log(`verified: ${verified}/${PROMPTS.length} P/D loads through ${LOOPBACK_CONNECTOR} verified by KV checksums, 1/1 corrupted load caught and recomputed, outputs identical to a single engine`);

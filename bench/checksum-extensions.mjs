#!/usr/bin/env node
// Checksum extensions (issue 13 sections 2 and 3, docs/checksum-extensions.md). Not a test: prints
// figures and ratios measured in the same run. Run after `npm ci && npm run build`:
//   node bench/checksum-extensions.mjs        (KVC_BENCH_QUICK=1 for a short run)
//
// 1. Sampled checking: checksum compute time of one engine step, producer (replica 0) and consumer
//    (every replica), at kv_checksum_sample_rate 1, 0.25 and 0.05, with the ratio to rate 1. The
//    timed work is what a worker and the scheduler do per step: the sample (one HMAC per span,
//    BlockSampler), the rows and the backend sum (BlockChecksummer.compute with the mask).
// 2. Sub-block values: payload bytes of a load with and without sub-block values for the block-size
//    pairs 16/32, 16/64, 32/128 (producer/consumer), and the producer's extra compute time.
import {
  BlockChecksummer,
  BlockSampler,
  SAMPLE_THRESHOLD_ALL,
  encodePayload,
  pagedAttentionBytes,
  pagedAttentionCache,
  sampleThreshold,
  tokenDigest,
  subBlockGroupSpecs,
  sumSubBlocks,
} from '@kvconnect/checksum';
import { result } from './lib/results.mjs';

const QUICK = process.env.KVC_BENCH_QUICK === '1';
const median = (t) => [...t].sort((x, y) => x - y)[Math.floor(t.length / 2)];
const SECRET = Buffer.from('bench-cluster-secret-0123456789');

// ---------------------------------------------------------------------------------------------
// 1. Sampled checking
// ---------------------------------------------------------------------------------------------

const B = 16;
const LAYERS = 2;
const HEADS = 4;
const HEAD = 128;
const REQS = QUICK ? 16 : 32;
const TOKENS = 1024; // per request: 64 blocks, 4 spans
const NB = REQS * (TOKENS / B);
const shape = { dtype: 'bfloat16', numBlocks: NB, blockSize: B, numHeads: HEADS, headSize: HEAD, kvLayout: 'kv-first' };
const bytesPerLayer = pagedAttentionBytes(shape);
const mem = new Uint8Array(LAYERS * bytesPerLayer);
for (let i = 0; i < mem.length; i += 4096) mem[i] = i & 0xff;
const caches = Array.from({ length: LAYERS }, (_, l) => pagedAttentionCache({ name: `model.layers.${l}.self_attn.attn`, ...shape, layout: 'NHD', at: { region: 0, offset: l * bytesPerLayer } }));
const sides = {
  producer: new BlockChecksummer([{ groupId: 0, caches }], { tpRank: 0, tpSize: 1, role: 'producer' }, [mem]),
  consumer: new BlockChecksummer([{ groupId: 0, caches }], { tpRank: 0, tpSize: 1, role: 'consumer' }, [mem]),
};
console.log(`backend: ${sides.producer.backend.name}; step: ${REQS} requests x ${TOKENS} tokens, ${LAYERS} layers x ${HEADS} KV heads x ${HEAD} bf16, block ${B} (${((NB * B * LAYERS * HEADS * HEAD * 2 * 2) / 2 ** 20).toFixed(0)} MiB of KV)`);

const prompts = Array.from({ length: REQS }, (_, r) => Array.from({ length: TOKENS }, (_, i) => (i * 31 + r * 7919) % 50000));

/** One step of one side at `rate`: per request the sampler and its mask, then one backend call. */
function step(side, rate) {
  const T = sampleThreshold(rate);
  const runs = prompts.map((p, r) => {
    const blockIds = Array.from({ length: TOKENS / B }, (_, i) => r * (TOKENS / B) + i);
    if (T >= SAMPLE_THRESHOLD_ALL) return { group: 0, blockIds, start: 0, numTokens: TOKENS };
    const s = new BlockSampler(SECRET, tokenDigest(p), T);
    return { group: 0, blockIds, start: 0, numTokens: TOKENS, mask: blockIds.map((_, i) => (s.blockSampled(0, B, i) ? 1 : 0)) };
  });
  return sides[side].compute(runs);
}

const RATES = [1, 0.25, 0.05];
const REPS = QUICK ? 7 : 21;
console.log('\nsampled checking: checksum compute time per step (median of interleaved runs)');
console.log('| side | rate | ms per step | ratio to rate 1 | blocks summed |');
console.log('| --- | --- | --- | --- | --- |');
for (const side of ['producer', 'consumer']) {
  const t = new Map(RATES.map((r) => [r, []]));
  for (let i = 0; i < REPS; i++) {
    for (const rate of RATES) {
      const a = process.hrtime.bigint();
      step(side, rate);
      t.get(rate).push(Number(process.hrtime.bigint() - a) / 1e6);
    }
  }
  const base = median(t.get(1));
  for (const rate of RATES) {
    const ms = median(t.get(rate));
    const best = Math.min(...t.get(rate));
    let summed = NB;
    if (rate < 1) {
      summed = 0;
      for (const p of prompts) {
        const s = new BlockSampler(SECRET, tokenDigest(p), sampleThreshold(rate));
        for (let i = 0; i < TOKENS / B; i++) if (s.blockSampled(0, B, i)) summed++;
      }
    }
    console.log(`| ${side} | ${rate} | ${ms.toFixed(3)} (min ${best.toFixed(3)}) | ${(ms / base).toFixed(3)} (min ${(best / Math.min(...t.get(1))).toFixed(3)}) | ${summed} of ${NB} |`);
    result('checksum-extensions', { name: `sampled checking, ${side}, rate ${rate}`, figure: `${ms.toFixed(3)} ms/step`, baseline: `${base.toFixed(3)} ms/step (rate 1)`, ratio: (ms / base).toFixed(3) });
  }
}

// ---------------------------------------------------------------------------------------------
// 2. Sub-block values: payload bytes and the producer's extra compute
// ---------------------------------------------------------------------------------------------

console.log('\nsub-block values: payload of one request (2 attention groups) and producer compute per step');
console.log('| consumer/producer block | tokens | payload without | with sub-blocks | growth | producer ms (blocks) | + sub-blocks ms | ratio |');
console.log('| --- | --- | --- | --- | --- | --- | --- | --- |');
for (const [bd, bp] of [[16, 32], [16, 64], [32, 128]]) {
  const tokens = QUICK ? 4096 : 16384;
  const nb = tokens / bp;
  const sh = { dtype: 'bfloat16', numBlocks: nb, blockSize: bp, numHeads: HEADS, headSize: HEAD, kvLayout: 'kv-first' };
  const per = pagedAttentionBytes(sh);
  const m = new Uint8Array(LAYERS * per);
  for (let i = 0; i < m.length; i += 4096) m[i] = i & 0xff;
  const cs = Array.from({ length: LAYERS }, (_, l) => pagedAttentionCache({ name: `model.layers.${l}.self_attn.attn`, ...sh, layout: 'HND', at: { region: 0, offset: l * per } }));
  const group = { groupId: 0, caches: cs };
  const coarse = new BlockChecksummer([group], { tpRank: 0, tpSize: 1, role: 'producer' }, [m]);
  const k = bp / bd;
  const sub = new BlockChecksummer(subBlockGroupSpecs(group, bd), { tpRank: 0, tpSize: 1, role: 'producer' }, [m]);
  const run = { group: 0, blockIds: Array.from({ length: nb }, (_, i) => i), start: 0, numTokens: tokens };
  const tc = [];
  const ts = [];
  let values;
  let subValues;
  for (let i = 0; i < REPS; i++) {
    let a = process.hrtime.bigint();
    values = coarse.compute([run])[0].partials.get('1:0');
    tc.push(Number(process.hrtime.bigint() - a) / 1e6);
    a = process.hrtime.bigint();
    subValues = sumSubBlocks(sub, run, k).partials.get('1:0');
    ts.push(Number(process.hrtime.bigint() - a) / 1e6);
  }
  const groups = [0, 1].map((g) => ({ groupId: g, fingerprint: coarse.plans[0].fingerprint, blockSize: bp, start: 0, values }));
  const base = { numTokens: tokens, producerTpSize: 1, tokenDigest: 12345678901234567n, groups };
  const without = encodePayload(base).byteLength;
  const withSub = encodePayload({ ...base, subBlocks: [0, 1].map((g) => ({ groupId: g, blockSize: bd, start: 0, values: subValues })) }).byteLength;
  const c = median(tc);
  const s = median(ts);
  console.log(`| ${bd}/${bp} | ${tokens} | ${without} B | ${withSub} B | x${(withSub / without).toFixed(2)} (+${withSub - without} B) | ${c.toFixed(3)} | ${s.toFixed(3)} | ${(s / c).toFixed(2)} |`);
  result('checksum-extensions', { name: `sub-block payload ${bd}/${bp}, ${tokens} tokens`, figure: `${withSub} B`, baseline: `${without} B`, ratio: (withSub / without).toFixed(2) });
  result('checksum-extensions', { name: `sub-block producer compute ${bd}/${bp}, ${tokens} tokens`, figure: `${s.toFixed(3)} ms`, baseline: `${c.toFixed(3)} ms (block values)`, ratio: (s / c).toFixed(2) });
}

/**
 * Sampled checking (sampling.ts, docs/checksum-extensions.md section 2): the span rule against an
 * independent HMAC, its properties, the extension payload's sample threshold, the verifier's
 * `sample-rate` reason, and the catch rate of a single corrupted block over >= 1,000 faulted loads
 * at each rate, through the checksum layer directly (BlockChecksummer + verifyLoad).
 */
import { createHmac } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { BlockChecksummer } from '../src/compute.js';
import { decodePayload, encodePayload, tokenDigest } from '../src/payload.js';
import { BlockSampler, SAMPLE_SPAN_TOKENS, SAMPLE_THRESHOLD_ALL, sampleRateOf, sampleThreshold } from '../src/sampling.js';
import type { ChecksumPayload, ConsumerLoad } from '../src/types.js';
import { verifyLoad } from '../src/verify.js';
import { pagedAttentionBytes, pagedAttentionCache } from '../src/views.js';

const SECRET = Buffer.from('a-cluster-secret-for-sampling-tests', 'utf8');
const SEED = Number(process.env.KVC_SAMPLING_SEED ?? 20261201);

/** A seeded xorshift32 (the seed is printed by the catch-rate test). */
function rng(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5;
    s >>>= 0;
    return s;
  };
}

/** The span hash as the docs define it, written out here without sampling.ts. */
function specHash(secret: Uint8Array, key: bigint, groupId: number, span: number): number {
  const msg = Buffer.alloc(20);
  msg.writeBigUInt64LE(key, 0);
  msg.writeUInt32LE(groupId, 8);
  msg.writeBigUInt64LE(BigInt(span), 12);
  return createHmac('sha256', secret).update(Buffer.from('kvconnect-kv-checksum-sample-v1\0', 'latin1')).update(msg).digest().readUInt32BE(0);
}

describe('the span rule', () => {
  it('hashes (secret, request key, group, span) as documented', () => {
    const s = new BlockSampler(SECRET, 0x0123456789abcdefn, sampleThreshold(0.5));
    for (const [g, u] of [[0, 0], [0, 1], [3, 7], [4095, 123456]]) expect(s.spanHash(g, u)).toBe(specHash(SECRET, 0x0123456789abcdefn, g, u));
  });

  it('thresholds: round(rate * 2^32), 1 for tiny rates, 2^32 for rate 1; other rates are refused', () => {
    expect(sampleThreshold(1)).toBe(2 ** 32);
    expect(sampleThreshold(0.25)).toBe(2 ** 30);
    expect(sampleThreshold(0.05)).toBe(214748365);
    expect(sampleThreshold(1e-12)).toBe(1);
    expect(sampleRateOf(2 ** 30)).toBe(0.25);
    for (const bad of [0, -0.1, 1.5, Number.NaN, Number.POSITIVE_INFINITY]) expect(() => sampleThreshold(bad)).toThrow(RangeError);
  });

  it('depends on the secret and the request key, and is monotone in the threshold', () => {
    const t = sampleThreshold(0.5);
    const a = new BlockSampler(SECRET, 7n, t);
    const b = new BlockSampler(Buffer.from('another-secret-of-enough-bytes'), 7n, t);
    const c = new BlockSampler(SECRET, 8n, t);
    const set = (s: BlockSampler) => Array.from({ length: 256 }, (_, u) => s.spanSampled(0, u));
    expect(set(a)).not.toEqual(set(b));
    expect(set(a)).not.toEqual(set(c));
    for (let u = 0; u < 256; u++) {
      if (a.spanSampled(0, u, sampleThreshold(0.1))) expect(a.spanSampled(0, u, sampleThreshold(0.3))).toBe(true);
    }
  });

  it('a block is summed iff a span it overlaps is sampled; state groups use span 0', () => {
    const s = new BlockSampler(SECRET, 99n, sampleThreshold(0.3));
    for (let p = 0; p < 64; p++) {
      // 16-token blocks lie in span floor(p*16/256); 512-token blocks overlap spans 2p and 2p+1.
      expect(s.blockSampled(1, 16, p)).toBe(s.spanSampled(1, Math.floor((p * 16) / SAMPLE_SPAN_TOKENS)));
      expect(s.blockSampled(1, 512, p)).toBe(s.spanSampled(1, 2 * p) || s.spanSampled(1, 2 * p + 1));
    }
    expect(s.blockSampled(2, 0, 0)).toBe(s.spanSampled(2, 0));
    expect(new BlockSampler(SECRET, 99n, SAMPLE_THRESHOLD_ALL).blockSampled(1, 16, 5)).toBe(true);
  });
});

describe('the extension payload carries the sample threshold', () => {
  const groups = [{ groupId: 0, fingerprint: 5n, blockSize: 16, start: 0, values: BigUint64Array.of(1n, 2n) }];
  it('round-trips as version 16', () => {
    const p: ChecksumPayload = { numTokens: 32, producerTpSize: 1, tokenDigest: 9n, groups, sampleThreshold: 2 ** 30 };
    const d = decodePayload(encodePayload(p));
    expect(d).toMatchObject({ version: 16, sampleThreshold: 2 ** 30, subBlocks: [], tokenDigest: 9n });
    // Header bytes: fixarray 2, version 16, fixarray 6 (docs/checksum-extensions.md).
    expect(Array.from(encodePayload(p).subarray(0, 3))).toEqual([0x92, 0x10, 0x96]);
  });
  it('encodes the example of docs/checksum-extensions.md byte for byte', () => {
    const hex = [
      '92 10 96 30 01 07', // [16, [48, 1, 7,
      '91 95 00 05 20 00 c4 10 0300000000000000 0100000000000000', // [[0, 5, 32, 0, bin(3, 1)]],
      'ce 40000000', // 2^30,
      '91 94 00 10 00 c4 20 0100000000000000 0200000000000000 0100000000000000 0000000000000000', // [[0, 16, 0, bin(1, 2, 1, 0)]]]]
    ].join('').replace(/\s+/g, '');
    const p: ChecksumPayload = {
      numTokens: 48,
      producerTpSize: 1,
      tokenDigest: 7n,
      groups: [{ groupId: 0, fingerprint: 5n, blockSize: 32, start: 0, values: BigUint64Array.of(3n, 1n) }],
      sampleThreshold: 2 ** 30,
      subBlocks: [{ groupId: 0, blockSize: 16, start: 0, values: BigUint64Array.of(1n, 2n, 1n, 0n) }],
    };
    expect(Buffer.from(encodePayload(p)).toString('hex')).toBe(hex);
    expect(decodePayload(Buffer.from(hex, 'hex'))).toMatchObject({ version: 16, sampleThreshold: 2 ** 30, subBlocks: [{ groupId: 0, blockSize: 16, start: 0 }] });
  });

  it('rejects sub-block entries of unknown or repeated groups, and bodies of another arity', () => {
    const base = { numTokens: 48, producerTpSize: 1, tokenDigest: 7n, groups };
    const one = (groupId: number) => ({ groupId, blockSize: 8, start: 0, values: BigUint64Array.of(1n) });
    expect(() => encodePayload({ ...base, subBlocks: [one(3)] })).toThrow(RangeError);
    const ok = encodePayload({ ...base, subBlocks: [one(0)] });
    const unknown = Uint8Array.from(ok);
    unknown[unknown.length - 13] = 3; // the sub-block entry's groupId (94 <id> 08 00 c4 08 <8 bytes>)
    expect(() => decodePayload(unknown)).toThrow(/sub-block-group/);
    const twice = Uint8Array.from([...ok.subarray(0, ok.length - 15), 0x92, ...ok.subarray(ok.length - 14), ...ok.subarray(ok.length - 14)]);
    expect(() => decodePayload(twice)).toThrow(/sub-block-group/);
    const v2body = Uint8Array.from(ok);
    v2body[2] = 0x94; // a version-16 body of 4 elements
    expect(() => decodePayload(v2body)).toThrow(/arity/);
  });

  it('rejects a threshold of 0 or above 2^32', () => {
    const bytes = encodePayload({ numTokens: 32, producerTpSize: 1, tokenDigest: 9n, groups, sampleThreshold: 1 });
    // The threshold 1 is the positive fixint right before the sub-block array header (0x90).
    const at = bytes.length - 2;
    expect(bytes[at]).toBe(1);
    const zero = Uint8Array.from(bytes);
    zero[at] = 0;
    expect(() => decodePayload(zero)).toThrow(/sample-threshold/);
    const big = Uint8Array.from([...bytes.subarray(0, at), 0xcf, 0, 0, 0, 1, 0, 0, 0, 1, 0x90]);
    expect(() => decodePayload(big)).toThrow(/sample-threshold/);
    expect(() => encodePayload({ numTokens: 32, producerTpSize: 1, tokenDigest: 9n, groups, sampleThreshold: 2 ** 32 + 1 })).toThrow(RangeError);
  });
});

// ---------------------------------------------------------------------------------------------
// One attention group, one rank: the checksum layer as the scheduler and workers drive it.
// ---------------------------------------------------------------------------------------------

const B = 16;
const NB = 64;
const TOKENS = NB * B; // 4 spans of 256 tokens
const shape = { dtype: 'bfloat16' as const, numBlocks: NB, blockSize: B, numHeads: 2, headSize: 8, kvLayout: 'kv-first' as const };
const view = pagedAttentionCache({ name: 'model.layers.0.self_attn.attn', ...shape, layout: 'NHD', at: { region: 0 } });
const blockIds = Array.from({ length: NB }, (_, i) => (i * 37) % NB); // a permutation: ids are not positions

function rig(seed: number) {
  const next = rng(seed);
  const mem = new Uint8Array(pagedAttentionBytes(shape));
  for (let i = 0; i < mem.length; i++) mem[i] = next() & 0xff;
  const cmem = Uint8Array.from(mem);
  const prod = new BlockChecksummer([{ groupId: 0, caches: [view] }], { tpRank: 0, tpSize: 1, role: 'producer' }, [mem]);
  const cons = new BlockChecksummer([{ groupId: 0, caches: [view] }], { tpRank: 0, tpSize: 1, role: 'consumer' }, [cmem]);
  return { next, prod, cons, cmem };
}

/** One load at `rate` with one flipped bit in a random loaded block; true when the verdict is `mismatch`. */
function faultedLoad(r: ReturnType<typeof rig>, rate: number, fault = true): { caught: boolean; verdict: ReturnType<typeof verifyLoad> } {
  const prompt = Array.from({ length: TOKENS }, () => r.next() % 50000);
  const T = sampleThreshold(rate);
  // Each side builds its own sampler from its own prompt (the same request).
  const ps = new BlockSampler(SECRET, tokenDigest(prompt), T);
  const cs = new BlockSampler(SECRET, tokenDigest(prompt), T);
  const mask = (s: BlockSampler) => blockIds.map((_, p) => (s.blockSampled(0, B, p) ? 1 : 0));
  const pv = r.prod.compute([{ group: 0, blockIds, start: 0, numTokens: TOKENS, mask: mask(ps) }])[0];
  const payload: ChecksumPayload = {
    numTokens: TOKENS,
    producerTpSize: 1,
    tokenDigest: tokenDigest(prompt, TOKENS),
    groups: [{ groupId: 0, fingerprint: r.prod.plans[0].fingerprint, blockSize: B, start: 0, values: pv.partials.get('1:0')! }],
    ...(T < SAMPLE_THRESHOLD_ALL ? { sampleThreshold: T } : {}),
  };
  const wire = decodePayload(encodePayload(payload));
  const pos = r.next() % NB;
  const part = view.parts[r.next() % 2];
  const at = part.offset + blockIds[pos] * part.blockStride + (r.next() % B) * part.tokenStride + (r.next() % 2) * part.headStride + (r.next() % part.bytes);
  const bit = 1 << (r.next() % 8);
  if (fault) r.cmem[at] ^= bit;
  const cv = r.cons.compute([{ group: 0, blockIds, start: 0, numTokens: TOKENS, mask: mask(cs) }])[0];
  if (fault) r.cmem[at] ^= bit;
  const load: ConsumerLoad = {
    numTokens: TOKENS,
    tokenIds: prompt,
    tpSize: 1,
    ppSize: 1,
    groups: [{ groupId: 0, kind: 'attention', blockSize: B, start: 0, nBlocks: NB, fingerprint: r.cons.plans[0].fingerprint, skipped: false }],
    workers: [{ ppRank: 0, tpRank: 0, groups: new Map([[0, cv]]) }],
    ...(T < SAMPLE_THRESHOLD_ALL ? { sample: cs } : {}),
  };
  const verdict = verifyLoad(wire, load);
  return { caught: verdict.verdict === 'mismatch', verdict };
}

describe('sampled verification', () => {
  it('a clean sampled load verifies and says sampled with the rate and block counts', () => {
    const r = rig(SEED);
    for (let i = 0; i < 20; i++) {
      const { verdict } = faultedLoad(r, 0.25, false);
      expect(verdict.verdict).toBe('verified');
      expect(verdict.sampled?.rate).toBe(0.25);
      expect(verdict.sampled!.checked + verdict.sampled!.skipped).toBe(NB);
      expect(verdict.sampled!.checked % (SAMPLE_SPAN_TOKENS / B)).toBe(0); // whole spans
    }
    expect(faultedLoad(r, 1, false).verdict.sampled).toBeUndefined();
  });

  it('a producer sampling below the consumer rate, or a consumer that does not sample, is sample-rate', () => {
    const prompt = [1, 2, 3];
    const cs = new BlockSampler(SECRET, tokenDigest(prompt), sampleThreshold(0.5));
    const base = { numTokens: 3, producerTpSize: 1, tokenDigest: tokenDigest(prompt), groups: [{ groupId: 0, fingerprint: 1n, blockSize: 16, start: 0, values: BigUint64Array.of(0n) }] };
    const load: ConsumerLoad = {
      numTokens: 3,
      tokenIds: prompt,
      tpSize: 1,
      ppSize: 1,
      groups: [{ groupId: 0, kind: 'attention', blockSize: 16, start: 0, nBlocks: 1, fingerprint: 1n, skipped: false }],
      workers: [{ ppRank: 0, tpRank: 0, groups: new Map([[0, { start: 0, nBlocks: 1, skipped: false, partials: new Map([['1:0', BigUint64Array.of(0n)]]) }]]) }],
    };
    expect(verifyLoad({ ...base, sampleThreshold: sampleThreshold(0.25) }, { ...load, sample: cs }).unverified).toEqual([{ groupId: null, reason: 'sample-rate' }]);
    expect(verifyLoad({ ...base, sampleThreshold: sampleThreshold(0.5) }, load).unverified).toEqual([{ groupId: null, reason: 'sample-rate' }]);
    // A producer sampling at a higher rate than the consumer (or not at all) is fine.
    expect(verifyLoad({ ...base, sampleThreshold: sampleThreshold(0.75) }, { ...load, sample: cs }).unverified.map((u) => u.reason)).not.toContain('sample-rate');
    expect(verifyLoad(base, { ...load, sample: cs }).unverified.map((u) => u.reason)).not.toContain('sample-rate');
  });

  it('catches a single corrupted block with probability close to the rate (>= 1,000 faulted loads per rate)', () => {
    const N = 1200;
    const r = rig(SEED);
    const lines: string[] = [];
    for (const rate of [1, 0.25, 0.05]) {
      let caught = 0;
      for (let i = 0; i < N; i++) if (faultedLoad(r, rate).caught) caught++;
      const sd = Math.sqrt(N * rate * (1 - rate));
      lines.push(`rate ${rate}: caught ${caught}/${N} = ${(caught / N).toFixed(4)} (expected ${rate}, 4 sd = ${(4 * sd).toFixed(1)} loads)`);
      if (rate === 1) expect(caught).toBe(N);
      else expect(Math.abs(caught - N * rate)).toBeLessThanOrEqual(4 * sd);
    }
    console.log(`sampled checking catch rate (seed ${SEED}, KVC_SAMPLING_SEED to change):\n  ${lines.join('\n  ')}`);
  });
});

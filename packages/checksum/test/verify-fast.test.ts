/**
 * The verifier's typed-array arithmetic (verify.ts: BigUint64Array sums, bulk comparison of runs
 * of blocks) and the token digest's pieces (payload.ts) against straightforward BigInt references
 * written here from SPEC 8 steps 5 and 7 and SPEC 6.1: random loads (TP x PP grids, replica
 * counts, block sizes on both sides, prefix starts, sampled checking) with mismatches at random
 * blocks, workers and replicas, through the payload codec.
 */
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { decodePayloadBase64, encodePayloadBase64, tokenDigest } from '../src/payload.js';
import type { ConsumerLoad, PayloadGroup, WorkerRecord } from '../src/types.js';
import { verifyLoad } from '../src/verify.js';
import { Rng } from './layouts.js';
import { testSeed } from './seed.js';

const SEED = testSeed('verify-fast');
const CASES = 400;
const M64 = (1n << 64n) - 1n;
const u64 = (x: bigint): bigint => x & M64;

function rand64(r: Rng): bigint {
  return (BigInt(r.u32()) << 32n) | BigInt(r.u32());
}

/** A random split of `v` into `n` uint64 parts summing to it mod 2^64. */
function split(r: Rng, v: bigint, n: number): bigint[] {
  const parts = Array.from({ length: n - 1 }, () => rand64(r));
  return [...parts, u64(v - parts.reduce((a, b) => a + b, 0n))];
}

/** A sampler as the verifier sees one: which blocks (group, block size, position) were summed. */
function fakeSampler(salt: number): NonNullable<ConsumerLoad['sample']> {
  return { threshold: 2 ** 31, blockSampled: (g, b, pos) => ((pos * 2654435761 + b * 40503 + g + salt) >>> 0) % 5 !== 0 };
}

/** SPEC 6.1 written from its text: SHA-256 over LE uint32 ids, first 8 bytes read LE. */
function digestOf(ids: readonly number[]): bigint {
  const b = Buffer.alloc(4 * ids.length);
  ids.forEach((t, i) => b.writeUInt32LE(t, 4 * i));
  return createHash('sha256').update(b).digest().readBigUInt64LE(0);
}

interface Case {
  payloadGroup: PayloadGroup;
  load: ConsumerLoad;
  /** The producer's numTokens. */
  producerTokens: number;
}

/**
 * One load of one attention group (id 0): per-token values (zero past `numTokens`), summed into
 * the producer's blocks (size bp) and the consumer's (size bd); each consumer block value split
 * over the PP stages and shards of every replica count of the group, each replica of a shard
 * holding the same part (SPEC 2). Correct as built; `corrupt` then changes a few values.
 */
function randomCase(r: Rng): Case {
  const sizes = [1, 2, 4, 8, 16];
  const bp = r.pick(sizes);
  const bd = r.pick(sizes);
  const c = Math.max(bp, bd);
  const tokens = r.int(1, 160);
  const tokenValue = Array.from({ length: 400 }, (_, t) => (t < tokens ? rand64(r) : 0n));
  const blockValue = (b: number, size: number) => u64(tokenValue.slice(b * size, (b + 1) * size).reduce((a, x) => a + x, 0n));
  const producerValues = BigUint64Array.from({ length: Math.ceil(tokens / bp) }, (_, b) => blockValue(b, bp));

  const tpSize = r.pick([1, 2, 4]);
  const ppSize = r.pick([1, 2]);
  const divisors = [1, 2, 4].filter((d) => tpSize % d === 0);
  const rs = [...new Set([r.pick(divisors), ...(r.int(0, 2) === 0 ? [r.pick(divisors)] : [])])];
  // A prefix hit of whole chunks, and sometimes loaded blocks past the consumer's tokens.
  const start = (c / bd) * r.int(0, Math.floor((tokens - 1) / c));
  const nBlocks = Math.ceil(tokens / bd) - start + r.int(0, 2);
  const partials = new Map<string, Map<string, bigint[]>>(); // "pp:tp" -> key -> values
  for (let pp = 0; pp < ppSize; pp++) for (let tp = 0; tp < tpSize; tp++) partials.set(`${pp}:${tp}`, new Map());
  for (let i = 0; i < nBlocks; i++) {
    // Split the block value over the replica counts, then each part over (PP stage, shard).
    const byR = split(r, blockValue(start + i, bd), rs.length);
    rs.forEach((R, ri) => {
      const shards = tpSize / R;
      const parts = split(r, byR[ri], ppSize * shards);
      for (let pp = 0; pp < ppSize; pp++) {
        for (let tp = 0; tp < tpSize; tp++) {
          const m = partials.get(`${pp}:${tp}`)!;
          const key = `${R}:${tp % R}`;
          if (!m.has(key)) m.set(key, []);
          m.get(key)!.push(parts[pp * shards + Math.floor(tp / R)]);
        }
      }
    });
  }
  const workers: WorkerRecord[] = [...partials].map(([place, m]) => {
    const [pp, tp] = place.split(':').map(Number);
    const p = new Map([...m].map(([k, v]) => [k, BigUint64Array.from(v)]));
    return { ppRank: pp, tpRank: tp, groups: new Map([[0, { start, nBlocks, skipped: false, partials: p }]]) };
  });
  const fingerprint = rand64(r);
  const load: ConsumerLoad = {
    numTokens: tokens,
    tpSize,
    ppSize,
    groups: [{ groupId: 0, kind: 'attention', blockSize: bd, start, nBlocks, fingerprint, skipped: false }],
    workers,
    ...(r.int(0, 3) === 0 ? { sample: fakeSampler(r.u32()), tokenIds: Array.from({ length: tokens }, (_, t) => t) } : {}),
  };
  return { payloadGroup: { groupId: 0, fingerprint, blockSize: bp, start: 0, values: producerValues }, load, producerTokens: tokens };
}

/** Adds a random nonzero delta to a few random values: producer blocks, or one worker's partial at one block and key. */
function corrupt(r: Rng, k: Case): void {
  for (let n = r.int(0, 3); n > 0; n--) {
    const delta = rand64(r) | 1n;
    if (r.int(0, 3) === 0) {
      const v = k.payloadGroup.values;
      v[r.int(0, v.length - 1)] += delta;
    } else {
      const rec = r.pick(k.load.workers).groups.get(0)!;
      const v = r.pick([...rec.partials.values()]);
      v[r.int(0, v.length - 1)] += delta;
    }
  }
}

/**
 * SPEC 8 steps 5 and 7, the straightforward way (BigInt, one value at a time): the consumer
 * positions of every compared chunk where some check differs from the producer. Chunks of
 * C = max(Bp, Bd) tokens holding a loaded block with a valid consumer token; sampled checking
 * compares only chunks all of whose blocks on both sides are sampled. Inputs are covered as built.
 */
function referencePositions(k: Case): number[] {
  const g = k.load.groups[0];
  const bp = k.payloadGroup.blockSize;
  const bd = g.blockSize;
  const C = Math.max(bp, bd);
  const D = k.load.numTokens;
  // Step 5: check j of block pos = sum over workers and keys (R, r) with r == j mod R.
  const keys = new Map<string, { R: number; r: number }>();
  for (const w of k.load.workers) for (const name of w.groups.get(0)!.partials.keys()) keys.set(name, { R: Number(name.split(':')[0]), r: Number(name.split(':')[1]) });
  const maxR = Math.max(...[...keys.values()].map((x) => x.R));
  const check = (j: number, pos: number): bigint => {
    let s = 0n;
    for (const w of k.load.workers) {
      for (const [name, v] of w.groups.get(0)!.partials) if (keys.get(name)!.r === j % keys.get(name)!.R) s += v[pos - g.start];
    }
    return u64(s);
  };
  const chunks: number[] = [];
  for (let pos = g.start; pos < g.start + g.nBlocks; pos++) if (pos * bd < D && !chunks.includes(Math.floor((pos * bd) / C))) chunks.push(Math.floor((pos * bd) / C));
  const bad: number[] = [];
  for (const ch of chunks) {
    const valid = Math.min(C, D - ch * C);
    const pBlocks = Array.from({ length: Math.ceil(valid / bp) }, (_, i) => (ch * C) / bp + i);
    const dBlocks = Array.from({ length: Math.ceil(valid / bd) }, (_, i) => (ch * C) / bd + i);
    const s = k.load.sample;
    if (s) {
      const all = (b: number) => Array.from({ length: C / b }, (_, i) => (ch * C) / b + i);
      if (!all(bp).every((pos) => s.blockSampled(0, bp, pos)) || !all(bd).every((pos) => s.blockSampled(0, bd, pos))) continue;
    }
    const expected = u64(pBlocks.reduce((a, pos) => a + k.payloadGroup.values[pos - k.payloadGroup.start], 0n));
    let differs = false;
    for (let j = 0; j < maxR; j++) if (u64(dBlocks.reduce((a, pos) => a + check(j, pos), 0n)) !== expected) differs = true;
    if (differs) bad.push(...dBlocks);
  }
  return bad;
}

/** The case's payload (version 1, or 16 when sampled) through the base64 carrier, as a consumer gets it. */
function payloadOf(k: Case) {
  const p = {
    numTokens: k.producerTokens,
    producerTpSize: 1,
    groups: [k.payloadGroup],
    ...(k.load.sample ? { version: 16 as const, tokenDigest: digestOf(Array.from(k.load.tokenIds!)), sampleThreshold: k.load.sample.threshold } : { version: 1 as const }),
  };
  return decodePayloadBase64(encodePayloadBase64(p));
}

describe('verifyLoad against a BigInt reference of SPEC 8 steps 5 and 7', () => {
  it(`random loads, with mismatches at random blocks, workers and replicas (${CASES} cases)`, () => {
    const r = new Rng(SEED);
    let mismatched = 0;
    let sampled = 0;
    for (let i = 0; i < CASES; i++) {
      const k = randomCase(r);
      const correct = verifyLoad(payloadOf(k), k.load);
      // As built, every load is correct: the reference and the verifier both say so.
      expect(referencePositions(k), `case ${i}`).toEqual([]);
      if (k.load.sample) {
        expect(correct.verdict === 'verified' || (correct.verdict === 'unverified' && correct.unverified.every((u) => u.reason === 'nothing-to-verify')), `case ${i}`).toBe(true);
      } else {
        expect(correct, `case ${i}`).toMatchObject({ verdict: 'verified', mismatches: [], unverified: [] });
      }
      corrupt(r, k);
      const want = referencePositions(k);
      const v = verifyLoad(payloadOf(k), k.load);
      expect(v.mismatches, `case ${i}`).toEqual(want.length > 0 ? [{ groupId: 0, positions: want }] : []);
      if (want.length > 0) expect(v.verdict).toBe('mismatch');
      if (want.length > 0) mismatched++;
      if (k.load.sample) sampled++;
    }
    // The generator reaches what it is for.
    expect(mismatched).toBeGreaterThan(CASES / 4);
    expect(sampled).toBeGreaterThan(CASES / 10);
  });

  it('a mismatch in any one block of a long load is found, alone, and neither side\'s arrays are written', () => {
    const n = 3000;
    const r = new Rng(SEED ^ 0x5a5a);
    const values = BigUint64Array.from({ length: n }, () => rand64(r));
    // TP 2, R 1 (two shards) and R 2 (two replicas) keys: the sums of two workers, two checks.
    const a = BigUint64Array.from(values, (v, i) => u64(v - BigInt(i) * 7n));
    const b = BigUint64Array.from({ length: n }, (_, i) => u64(BigInt(i) * 7n));
    const rep = BigUint64Array.from({ length: n }, () => 0n);
    const load = (bad: number, side: 'producer' | 'shard' | 'replica'): { payload: PayloadGroup; load: ConsumerLoad; arrays: BigUint64Array[] } => {
      const pv = values.slice();
      const [a2, b2, r0, r1] = [a.slice(), b.slice(), rep.slice(), rep.slice()];
      if (side === 'producer') pv[bad] += 1n;
      if (side === 'shard') b2[bad] += 1n << 63n;
      if (side === 'replica') r1[bad] += 5n;
      const rec = (p: Map<string, BigUint64Array>) => new Map([[0, { start: 0, nBlocks: n, skipped: false, partials: p }]]);
      return {
        payload: { groupId: 0, fingerprint: 1n, blockSize: 16, start: 0, values: pv },
        load: {
          numTokens: 16 * n,
          tpSize: 2,
          ppSize: 1,
          groups: [{ groupId: 0, kind: 'attention', blockSize: 16, start: 0, nBlocks: n, fingerprint: 1n, skipped: false }],
          workers: [
            { ppRank: 0, tpRank: 0, groups: rec(new Map([['1:0', a2], ['2:0', r0]])) },
            { ppRank: 0, tpRank: 1, groups: rec(new Map([['1:0', b2], ['2:1', r1]])) },
          ],
        },
        arrays: [pv, a2, b2, r0, r1],
      };
    };
    for (const side of ['producer', 'shard', 'replica'] as const) {
      for (const bad of [0, 1, 1499, n - 2, n - 1]) {
        const x = load(bad, side);
        const before = x.arrays.map((v) => v.slice());
        const v = verifyLoad({ version: 1, numTokens: 16 * n, producerTpSize: 2, groups: [x.payload] }, x.load);
        expect(v.mismatches, `${side} ${bad}`).toEqual([{ groupId: 0, positions: [bad] }]);
        x.arrays.forEach((arr, i) => expect(arr, `${side} ${bad} array ${i}`).toEqual(before[i]));
      }
    }
  });
});

describe('tokenDigest in pieces (SPEC 6.1)', () => {
  it('equals one SHA-256 over all ids at lengths around the piece size', () => {
    const r = new Rng(SEED ^ 0x1234);
    const ids = Array.from({ length: 12_300 }, () => r.u32());
    for (const n of [0, 1, 4095, 4096, 4097, 8192, 8193, 12_300]) {
      expect(tokenDigest(ids, n), `n=${n}`).toBe(digestOf(ids.slice(0, n)));
      expect(tokenDigest(Uint32Array.from(ids.slice(0, n))), `typed n=${n}`).toBe(digestOf(ids.slice(0, n)));
      // A Uint32Array view at an offset, digesting fewer ids than it holds.
      expect(tokenDigest(Uint32Array.from(ids).subarray(3), Math.min(n, 12_297)), `typed view n=${n}`).toBe(digestOf(ids.slice(3, 3 + Math.min(n, 12_297))));
    }
  });

  it('refuses an id that is not a uint32 wherever it is, with its index; -0 is 0', () => {
    const ids = Array.from({ length: 9000 }, (_, i) => i);
    for (const at of [0, 4095, 4096, 8999]) {
      for (const bad of [-1, 1.5, 2 ** 32, Number.NaN, '5' as unknown as number, 5n as unknown as number]) {
        const x = [...ids];
        x[at] = bad;
        expect(() => tokenDigest(x), `${String(bad)} at ${at}`).toThrow(new RangeError(`token id ${String(bad)} at ${at} is not a uint32`));
      }
    }
    // A non-number is refused without being converted: neither valueOf nor Symbol.toPrimitive runs.
    let conversions = 0;
    const sneaky = { valueOf: () => ++conversions, [Symbol.toPrimitive]: () => ++conversions };
    for (const bad of [sneaky as unknown as number, Symbol('t') as unknown as number, undefined as unknown as number, null as unknown as number]) {
      const x = [...ids];
      x[4100] = bad;
      expect(() => tokenDigest(x), String(typeof bad)).toThrow(RangeError);
    }
    const o = [...ids];
    o[4100] = sneaky as unknown as number;
    expect(() => tokenDigest(o)).toThrow(new RangeError('token id of type object at 4100 is not a uint32'));
    expect(conversions).toBe(0);
    const z = [...ids];
    z[5000] = -0;
    expect(tokenDigest(z)).toBe(tokenDigest(ids.map((t, i) => (i === 5000 ? 0 : t))));
  });
});

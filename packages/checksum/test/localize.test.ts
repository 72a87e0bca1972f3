/**
 * Fine sums (localize.ts, issue #13 section 1) against hand-built expectations: each expected value
 * is written out from the SPEC 2-3 formula `x * m * (2j + 1)` for the one nonzero piece placed by
 * hand at a physical address computed here from the tensor layout (not through the views), and the
 * same logical bytes in other layouts, block sizes and TP sizes give the same fine sums.
 */
import { describe, expect, it } from 'vitest';
import { planGroup, type RankContext } from '../src/plan.js';
import {
  compareFineSums,
  decodeFineSums,
  encodeFineSums,
  fineSums,
  fineSumsWindowed,
  mergeFineSums,
  regionText,
  describeRegions,
  summarizeDifferences,
  LocalizeError,
  type FineSum,
} from '../src/localize.js';
import { mamba2StateLayout, pagedAttentionCache, pagedStateCache } from '../src/views.js';

const LAYER = 3;
const NAME = `model.layers.${LAYER}.self_attn.attn`;
const HEAD_SIZE = 4; // bf16: 8 bytes of K, 8 of V per head: cell = 16 bytes = 2 pieces (P = 2)
const EB = 2;
/** m of global head g of layer 3 (SPEC 2). */
const m = (g: number) => BigInt(2 * (LAYER * 65536 + g) + 1);
const u64 = (x: bigint) => BigInt.asUintN(64, x);

/** Logical content: K of global head 1, token 5, element 0 = 7; V of head 0, token 2, element 0 = 3. */
const WRITES = [
  { kv: 'K' as const, head: 1, token: 5, value: 7 },
  { kv: 'V' as const, head: 0, token: 2, value: 3 },
];
// Hand-built: K piece 0 of token 5 -> j = 5 * 2 + 0 = 10, weight 21; V is piece 1 of the cell:
// token 2 -> j = 2 * 2 + 1 = 5, weight 11.
const EXPECT_K = u64(7n * m(1) * 21n);
const EXPECT_V = u64(3n * m(0) * 11n);

/** One rank's NHD or HND 'separate' cache holding global heads [h0, h0 + H) of 2 heads, numTokens 12. */
function rank(o: { layout: 'NHD' | 'HND'; blockSize: number; tpRank: number; tpSize: number; blockIds: number[]; role: 'producer' | 'consumer'; flip?: { kv: 'K' | 'V'; head: number; token: number } }) {
  const H = 2 / o.tpSize;
  const h0 = o.tpRank * H;
  const B = o.blockSize;
  const numBlocks = 8;
  const bytes = numBlocks * B * H * HEAD_SIZE * EB;
  const k = new Uint8Array(bytes);
  const v = new Uint8Array(bytes);
  const addr = (block: number, t: number, h: number) => (o.layout === 'NHD' ? ((block * B + t) * H + h) * HEAD_SIZE * EB : ((block * H + h) * B + t) * HEAD_SIZE * EB);
  for (const w of WRITES) {
    if (w.head < h0 || w.head >= h0 + H) continue;
    const block = o.blockIds[Math.floor(w.token / B)];
    (w.kv === 'K' ? k : v)[addr(block, w.token % B, w.head - h0)] = w.value;
  }
  if (o.flip && o.flip.head >= h0 && o.flip.head < h0 + H) {
    const block = o.blockIds[Math.floor(o.flip.token / B)];
    (o.flip.kv === 'K' ? k : v)[addr(block, o.flip.token % B, o.flip.head - h0) + 1] ^= 0x10;
  }
  const view = pagedAttentionCache({ name: NAME, dtype: 'bfloat16', numBlocks, blockSize: B, numHeads: H, headSize: HEAD_SIZE, layout: o.layout, kvLayout: 'separate', at: { region: 0 }, v: { region: 1 } });
  const ctx: RankContext = { tpRank: o.tpRank, tpSize: o.tpSize, role: o.role };
  const plan = planGroup({ groupId: 0, caches: [view] }, ctx);
  return fineSums(plan, [k, v], { blockIds: o.blockIds, start: 0, numTokens: 12, tokenStart: 0, tokenEnd: 12, rangeTokens: 4 });
}

const pick = (sums: FineSum[], head: number, part: string, tokenStart: number) => sums.filter((s) => s.head === head && s.part === part && s.tokenStart === tokenStart);

describe('fine sums of attention (SPEC 2 keys: layer, global head, K/V, token range)', () => {
  it('equal the hand-computed contributions, and zero elsewhere', () => {
    const s = rank({ layout: 'NHD', blockSize: 4, tpRank: 0, tpSize: 1, blockIds: [5, 2, 7], role: 'producer' });
    // 2 heads x 2 parts x 3 ranges of 4 tokens.
    expect(s).toHaveLength(12);
    expect(pick(s, 1, 'K', 4).map((x) => x.value)).toEqual([EXPECT_K]);
    expect(pick(s, 0, 'V', 0).map((x) => x.value)).toEqual([EXPECT_V]);
    for (const x of s) {
      expect(x.layer).toBe(LAYER);
      expect(x.tokenEnd).toBe(x.tokenStart + 4);
      if (!((x.head === 1 && x.part === 'K' && x.tokenStart === 4) || (x.head === 0 && x.part === 'V' && x.tokenStart === 0))) expect(x.value).toBe(0n);
    }
  });

  it('do not depend on the layout, the block size or the TP size', () => {
    const key = (l: FineSum[]) => mergeFineSums([l]).map((x) => `${x.layer}|${x.head}|${x.part}|${x.tokenStart}|${x.tokenEnd}=${x.value}`).sort();
    const a = rank({ layout: 'NHD', blockSize: 4, tpRank: 0, tpSize: 1, blockIds: [5, 2, 7], role: 'producer' });
    const b = rank({ layout: 'HND', blockSize: 8, tpRank: 0, tpSize: 1, blockIds: [3, 1], role: 'producer' });
    const tp2 = [0, 1].map((r) => rank({ layout: 'NHD', blockSize: 4, tpRank: r, tpSize: 2, blockIds: [0, 4, 6], role: 'producer' }));
    expect(key(b)).toEqual(key(a));
    expect(key(mergeFineSums(tp2))).toEqual(key(a));
  });

  it('a flipped byte differs exactly at its layer, head, part and token range, across TP sizes', () => {
    const producer = mergeFineSums([0, 1].map((r) => rank({ layout: 'NHD', blockSize: 4, tpRank: r, tpSize: 2, blockIds: [0, 4, 6], role: 'producer' })));
    const consumer = rank({ layout: 'HND', blockSize: 8, tpRank: 0, tpSize: 1, blockIds: [3, 1], role: 'consumer', flip: { kv: 'V', head: 1, token: 9 } });
    const d = compareFineSums(producer, consumer);
    expect(d.map((x) => [x.layer, x.head, x.part, x.tokenStart, x.tokenEnd])).toEqual([[LAYER, 1, 'V', 8, 12]]);
    expect(summarizeDifferences(d).map(regionText)).toEqual(['layer 3, head 1, V, tokens 8-11']);
    expect(compareFineSums(producer, rank({ layout: 'HND', blockSize: 8, tpRank: 0, tpSize: 1, blockIds: [3, 1], role: 'consumer' }))).toEqual([]);
  });

  it('only the tokens asked for, clipped to numTokens', () => {
    const view = pagedAttentionCache({ name: NAME, dtype: 'bfloat16', numBlocks: 4, blockSize: 4, numHeads: 2, headSize: HEAD_SIZE, layout: 'NHD', kvLayout: 'separate', at: { region: 0 }, v: { region: 1 } });
    const plan = planGroup({ groupId: 0, caches: [view] }, { tpRank: 0, tpSize: 1, role: 'producer' });
    const mem = new Uint8Array(4 * 4 * 2 * 8);
    const s = fineSums(plan, [mem, mem], { blockIds: [0, 1], start: 0, numTokens: 6, tokenStart: 4, tokenEnd: 16, rangeTokens: 16 });
    expect(new Set(s.map((x) => `${x.tokenStart}-${x.tokenEnd}`))).toEqual(new Set(['0-6']));
    expect(() => fineSums(plan, [mem, mem], { blockIds: [9], start: 0, numTokens: 4, tokenStart: 0, tokenEnd: 4, rangeTokens: 4 })).toThrow(LocalizeError);
  });
});

describe('fine sums of a split state (SPEC 3 keys: layer, global row, conv/ssm, segment)', () => {
  it('a conv B row differs at its global row and segment', () => {
    // Mamba2 TP1: conv rows [x 0-3, B 4-5, C 6-7], one column (kernel 2), float16; ssm float32.
    const layout = mamba2StateLayout({ tpSize: 1, intermediateSize: 4, nGroups: 1, dState: 2, convKernel: 2, numHeads: 2, headDim: 1, convDimFirst: true, convDtype: 'float16', ssmDtype: 'float32' })!;
    const pageBytes = 8 * 1 * 2 + 2 * 1 * 2 * 4;
    const view = pagedStateCache({ name: 'model.layers.1.mixer', numBlocks: 2, at: { region: 0 }, pageBytes, layout });
    const plan = planGroup({ groupId: 1, caches: [view] }, { tpRank: 0, tpSize: 1, role: 'producer' });
    const mem = new Uint8Array(2 * pageBytes);
    // Block 1, conv row 5 (B segment, row 1 of it), element 0: byte offset pageBytes + 5 * 2.
    mem[pageBytes + 5 * 2] = 9;
    const s = fineSums(plan, [mem], { blockIds: [1], start: 0, numTokens: 10, tokenStart: 0, tokenEnd: 10, rangeTokens: 16 });
    const row5 = s.filter((x) => x.head === 5);
    // Hand-built: x = 9, j = 0 -> weight 1; m = 2 * (1 * 65536 + 5) + 1.
    expect(row5).toEqual([{ layer: 1, head: 5, part: 'conv', segment: 1, tokenStart: 0, tokenEnd: 0, replicas: 1, replica: 0, value: 9n * BigInt(2 * (65536 + 5) + 1) }]);
    expect(s.filter((x) => x.value !== 0n)).toHaveLength(1);
    // ssm rows follow conv rows: global rows 8-9, segment 0.
    expect(s.filter((x) => x.part === 'ssm').map((x) => [x.head, x.segment])).toEqual([[8, 0], [9, 0]]);
    const zero = fineSums(plan, [new Uint8Array(2 * pageBytes)], { blockIds: [1], start: 0, numTokens: 10, tokenStart: 0, tokenEnd: 10, rangeTokens: 16 });
    expect(summarizeDifferences(compareFineSums(zero, s)).map(regionText)).toEqual(['layer 1, conv segment 1, rows 5']);
  });
});

describe('summaries and the wire form', () => {
  it('consecutive heads with the same ranges merge; a replicated head names the copy that differs', () => {
    const d = (head: number, part: 'K' | 'V', tokenStart: number, replicas = 1, replica = 0) => ({ layer: 3, head, part, segment: -1, tokenStart, tokenEnd: tokenStart + 16, replicas, replica, producer: 1n, consumer: 2n });
    expect(summarizeDifferences([d(4, 'V', 32), d(5, 'V', 32), d(5, 'V', 48), d(4, 'V', 48), d(7, 'V', 32)]).map(regionText)).toEqual(['layer 3, heads 4-5, V, tokens 32-63', 'layer 3, head 7, V, tokens 32-47']);
    expect(summarizeDifferences([d(0, 'K', 0, 2, 0)]).map(regionText)).toEqual(['layer 3, head 0, K, tokens 0-15, replica 2:0']);
  });

  it('in words: K and V of a layer read as one, then alike layers merge', () => {
    const r = (layer: number, part: 'K' | 'V', heads: [number, number], tokens: Array<[number, number]>) => ({ layer, part, heads, segment: -1, tokens });
    expect(
      describeRegions([r(0, 'K', [0, 1], [[0, 25]]), r(0, 'V', [0, 1], [[0, 25]]), r(1, 'K', [0, 1], [[0, 25]]), r(1, 'V', [0, 1], [[0, 25]]), r(2, 'K', [0, 1], [[0, 25]]), r(3, 'V', [2, 2], [[16, 32]])]),
    ).toEqual(['layers 0-1, heads 0-1, K and V, tokens 0-24', 'layer 2, heads 0-1, K, tokens 0-24', 'layer 3, head 2, V, tokens 16-31']);
  });

  it('K and V on one side, one part on the other: compared as KV', () => {
    const s = (part: 'K' | 'V' | 'KV', value: bigint): FineSum => ({ layer: 0, head: 0, part, segment: -1, tokenStart: 0, tokenEnd: 4, replicas: 1, replica: 0, value });
    expect(compareFineSums([s('K', 5n), s('V', 6n)], [s('KV', 11n)])).toEqual([]);
    expect(compareFineSums([s('K', 5n), s('V', 6n)], [s('KV', 12n)]).map((x) => x.part)).toEqual(['KV']);
  });

  it('round-trips and rejects malformed keys', () => {
    const s: FineSum[] = [{ layer: 2, head: 7, part: 'V', segment: -1, tokenStart: 16, tokenEnd: 32, replicas: 2, replica: 1, value: (1n << 64n) - 3n }];
    const w = encodeFineSums(s);
    expect(decodeFineSums(w.keys, w.values)).toEqual(s);
    expect(() => decodeFineSums(w.keys, w.values.subarray(1))).toThrow(LocalizeError);
    expect(() => decodeFineSums([[2, 7, 9, 0, 16, 32, 2, 1]], w.values)).toThrow(/part code/);
    expect(() => decodeFineSums([[2, 7, 1, 0, 16, 32, 2, 2]], w.values)).toThrow(/replica/);
    expect(() => decodeFineSums([[2, -7, 1, 0, 16, 32, 2, 1]], w.values)).toThrow(LocalizeError);
  });
});

describe('fine sums read in windows (device KV: only the mismatched blocks are copied)', () => {
  // Random bytes in every block, so that a window too short or misplaced changes the sums.
  const fill = (n: number, seed: number) => {
    const a = new Uint8Array(n);
    let x = seed;
    for (let i = 0; i < n; i++) a[i] = (x = (x * 1103515245 + 12345) >>> 0) >>> 24;
    return a;
  };
  const reader = (regions: Uint8Array[], log: Array<[number, number, number]>) => (r: number, off: number, n: number) => {
    log.push([r, off, n]);
    return regions[r].slice(off, off + n);
  };

  for (const layout of ['NHD', 'HND'] as const) {
    it(`attention ${layout}: equal to fineSums over host memory, reading only the run's blocks`, () => {
      const numBlocks = 8;
      const view = pagedAttentionCache({ name: NAME, dtype: 'bfloat16', numBlocks, blockSize: 4, numHeads: 2, headSize: HEAD_SIZE, layout, kvLayout: 'separate', at: { region: 0 }, v: { region: 1 } });
      const plan = planGroup({ groupId: 0, caches: [view] }, { tpRank: 0, tpSize: 1, role: 'consumer' });
      const bytes = numBlocks * 4 * 2 * HEAD_SIZE * EB;
      const regions = [fill(bytes, 1), fill(bytes, 2)];
      const run = { blockIds: [6, 1], start: 1, numTokens: 11, tokenStart: 4, tokenEnd: 11, rangeTokens: 4 };
      const log: Array<[number, number, number]> = [];
      const want = fineSums(plan, regions, run);
      expect(want.length).toBeGreaterThan(0);
      expect(fineSumsWindowed(plan, [{}, {}], run, reader(regions, log))).toEqual(want);
      // One window per entry (K, V) and block: 2 x 2 reads of a block's 64 bytes, not the 512-byte regions.
      expect(log.length).toBe(4);
      expect(log.reduce((a, [, , n]) => a + n, 0)).toBe(4 * (bytes / numBlocks));
    });
  }

  it('a split state: equal to fineSums; a short read is a LocalizeError', () => {
    const layout = mamba2StateLayout({ tpSize: 1, intermediateSize: 4, nGroups: 1, dState: 2, convKernel: 2, numHeads: 2, headDim: 1, convDimFirst: true, convDtype: 'float16', ssmDtype: 'float32' })!;
    const pageBytes = 8 * 1 * 2 + 2 * 1 * 2 * 4;
    const view = pagedStateCache({ name: 'model.layers.1.mixer', numBlocks: 3, at: { region: 0 }, pageBytes, layout });
    const plan = planGroup({ groupId: 1, caches: [view] }, { tpRank: 0, tpSize: 1, role: 'producer' });
    const regions = [fill(3 * pageBytes, 7)];
    const run = { blockIds: [2], start: 0, numTokens: 10, tokenStart: 0, tokenEnd: 10, rangeTokens: 16 };
    expect(fineSumsWindowed(plan, [{}], run, reader(regions, []))).toEqual(fineSums(plan, regions, run));
    expect(() => fineSumsWindowed(plan, [{}], run, () => new Uint8Array(1))).toThrow(LocalizeError);
    expect(() => fineSumsWindowed(plan, [{}], { ...run, blockIds: [3] }, reader(regions, []))).toThrow(/outside the cache/);
  });
});

/**
 * The head/row mapping: every consumer rank gets exactly the logical content it must hold, for
 * different TP sizes (GQA sharded and replicated heads, MLA held whole, Mamba2 with n_groups 1),
 * block sizes, physical layouts and prefix hits; the planner refuses what cannot be mapped.
 */
import { describe, expect, it } from 'vitest';
import { PlanError, coalesce, planTransfer, sourceOfHead, type RankInfo } from '../src/index.js';
import { fill, makeRank, simulate, visit, type FixtureModel, type FixtureRank } from './fixtures.js';

const GQA: FixtureModel = { kind: 'gqa', layers: 2, kvHeads: 2, headDim: 8 };
const GQA4: FixtureModel = { kind: 'gqa', layers: 2, kvHeads: 4, headDim: 8 };
const MLA: FixtureModel = { kind: 'mla', layers: 2, kvHeads: 1, headDim: 12 };
const MAMBA1: FixtureModel = { kind: 'mamba', layers: 2, kvHeads: 1, headDim: 1, mamba: { numHeads: 4, headDim: 4, dState: 4, nGroups: 1, convKernel: 4 } };
const MAMBA2: FixtureModel = { ...MAMBA1, mamba: { ...MAMBA1.mamba!, nGroups: 2 } };

interface Side {
  tp: number;
  blockSize: number;
  layout?: 'NHD' | 'HND';
  kvLayout?: 'kv-first' | 'block-kv' | 'separate';
}

/**
 * Runs P (tp ranks) -> D (tp ranks) for `numTokens` tokens with a consumer prefix hit of `first`
 * tokens, and checks every consumer rank's loaded bytes and that nothing else was written.
 * @returns the plans per consumer rank.
 */
function run(m: FixtureModel, p: Side, d: Side, numTokens: number, first = 0): Array<ReturnType<typeof planTransfer>> {
  const numBlocks = 8;
  const P: FixtureRank[] = [...Array(p.tp).keys()].map((r) => makeRank(m, r, p.tp, { numBlocks, blockSize: p.blockSize, layout: p.layout, kvLayout: p.kvLayout }));
  const D: FixtureRank[] = [...Array(d.tp).keys()].map((r) => makeRank(m, r, d.tp, { numBlocks, blockSize: d.blockSize, layout: d.layout, kvLayout: d.kvLayout }));
  const state = m.kind === 'mamba';
  const pBlocks = state ? [5] : [...Array(Math.ceil(numTokens / p.blockSize)).keys()].map((i) => 7 - i);
  const dBlocks = state ? [3] : [...Array(Math.ceil(numTokens / d.blockSize)).keys()].map((i) => i + 1);
  for (const r of P) fill(r, pBlocks, numTokens);
  const plans: Array<ReturnType<typeof planTransfer>> = [];
  for (const r of D) {
    const plan = planTransfer({ dst: r.info, producer: { tpSize: p.tp, ranks: P.map((x) => x.info) }, dstBlocks: [dBlocks], srcBlocks: [pBlocks], firstToken: first, numTokens });
    plans.push(plan);
    for (const rp of plan) simulate(rp.pairs, P.find((x) => x.info === rp.src)!, r);
    // Every byte of the loaded range is right.
    let checked = 0;
    let wrong = 0;
    visit(r, dBlocks, numTokens, state ? 0 : first, (mem, off, want) => {
      checked++;
      if (mem[off] !== want) wrong++;
    });
    expect(checked).toBeGreaterThan(0);
    expect(wrong).toBe(0);
    // Nothing outside it was written: clear the loaded range and every byte is zero again.
    visit(r, dBlocks, numTokens, state ? 0 : first, (mem, off) => {
      mem[off] = 0;
    });
    for (const mem of r.regions) expect(mem.every((b) => b === 0)).toBe(true);
  }
  return plans;
}

describe('attention heads across TP sizes (SPEC 1)', () => {
  it('source of a global head is replica 0 of its shard', () => {
    expect(sourceOfHead(3, 2, 1)).toEqual({ tpRank: 1, head: 1 });
    // 2 KV heads on 4 ranks: ranks 2k, 2k+1 hold head k; the source is 2k.
    expect(sourceOfHead(1, 1, 2)).toEqual({ tpRank: 2, head: 0 });
  });
  it('GQA TP1 -> TP1', () => void run(GQA, { tp: 1, blockSize: 16 }, { tp: 1, blockSize: 16 }, 40));
  it('GQA TP1 -> TP2: each consumer rank reads its head from the one producer rank', () => {
    const plans = run(GQA, { tp: 1, blockSize: 16 }, { tp: 2, blockSize: 16 }, 40);
    expect(plans.map((p) => p.length)).toEqual([1, 1]);
  });
  it('GQA TP2 -> TP1: the consumer reads one head from each producer rank', () => {
    const plans = run(GQA, { tp: 2, blockSize: 16 }, { tp: 1, blockSize: 16 }, 40);
    expect(plans[0].map((p) => p.src.tpRank).sort()).toEqual([0, 1]);
  });
  it('GQA replicated on the consumer: 2 KV heads, TP1 -> TP4 (ranks 2k, 2k+1 hold head k)', () => void run(GQA, { tp: 1, blockSize: 16 }, { tp: 4, blockSize: 16 }, 33));
  it('GQA replicated on the producer: TP4 -> TP1 reads only replica 0 of each head (F08)', () => {
    const plans = run(GQA, { tp: 4, blockSize: 16 }, { tp: 1, blockSize: 16 }, 33);
    expect(plans[0].map((p) => p.src.tpRank).sort()).toEqual([0, 2]);
  });
  it('GQA 4 heads TP4 -> TP2 and TP2 -> TP4', () => {
    run(GQA4, { tp: 4, blockSize: 16 }, { tp: 2, blockSize: 16 }, 20);
    run(GQA4, { tp: 2, blockSize: 16 }, { tp: 4, blockSize: 16 }, 20);
  });
  it('MLA latent held whole by every rank: TP2 -> TP1 and TP1 -> TP2 read producer rank 0 only', () => {
    for (const plans of [run(MLA, { tp: 2, blockSize: 16 }, { tp: 1, blockSize: 16 }, 30), run(MLA, { tp: 1, blockSize: 16 }, { tp: 2, blockSize: 16 }, 30)]) {
      for (const p of plans) expect(p.map((x) => x.src.tpRank)).toEqual([0]);
    }
  });
  it('NHD on the producer, HND on the consumer (F10), with TP 1 -> 2', () => void run(GQA, { tp: 1, blockSize: 16, layout: 'NHD' }, { tp: 2, blockSize: 16, layout: 'HND', kvLayout: 'separate' }, 32));
  it('HND block-kv TP2 -> NHD TP1', () => void run(GQA, { tp: 2, blockSize: 16, layout: 'HND', kvLayout: 'block-kv' }, { tp: 1, blockSize: 16, layout: 'NHD' }, 32));
});

describe('block sizes and prefix hits (F05, F07): tokens pair by position', () => {
  it('16 -> 32 and 32 -> 16', () => {
    run(GQA, { tp: 1, blockSize: 16 }, { tp: 1, blockSize: 32 }, 50);
    run(GQA, { tp: 1, blockSize: 32 }, { tp: 1, blockSize: 16 }, 50);
  });
  it('a consumer prefix hit of 32 tokens moves only tokens 32..63', () => {
    const plans = run(GQA, { tp: 1, blockSize: 16 }, { tp: 1, blockSize: 16 }, 64, 32);
    // 2 layers x 1 rank x 2 KV heads x 16 bytes per head (K 8 + V 8 bf16... 8 elems x 2 bytes each part) x 32 tokens.
    expect(plans[0][0].bytes).toBe(2 * 2 * 2 * 16 * 32);
  });
  it('a prefix hit with different block sizes (32 -> 16, hit 16)', () => void run(GQA, { tp: 1, blockSize: 32 }, { tp: 1, blockSize: 16 }, 64, 16));
  it('contiguous cells coalesce into few descriptors (same layout, same block size)', () => {
    const plans = run(GQA, { tp: 1, blockSize: 16 }, { tp: 1, blockSize: 16 }, 48);
    // Per layer and K/V: one run per block (the block ids are not adjacent on both sides).
    expect(plans[0][0].pairs.length).toBeLessThanOrEqual(2 * 2 * 3);
  });
});

describe('Mamba2 state across TP sizes (SPEC 3, F06)', () => {
  it('n_groups 1, TP1 -> TP2: B and C (replicated on the consumer) read whole by every rank', () => void run(MAMBA1, { tp: 1, blockSize: 16 }, { tp: 2, blockSize: 16 }, 10));
  it('n_groups 1, TP2 -> TP1: x and heads from both ranks, B and C from rank 0 only', () => {
    const plans = run(MAMBA1, { tp: 2, blockSize: 16 }, { tp: 1, blockSize: 16 }, 10);
    expect(plans[0].map((p) => p.src.tpRank).sort()).toEqual([0, 1]);
  });
  it('n_groups 2, TP2 -> TP1 and TP1 -> TP2 (B and C sharded)', () => {
    run(MAMBA2, { tp: 2, blockSize: 16 }, { tp: 1, blockSize: 16 }, 10);
    run(MAMBA2, { tp: 1, blockSize: 16 }, { tp: 2, blockSize: 16 }, 10);
  });
});

describe('refusals', () => {
  const one = (m: FixtureModel, tp: number) => makeRank(m, 0, tp, { numBlocks: 4, blockSize: 16 });
  const plan = (dst: RankInfo, src: RankInfo, srcTp = 1, o: Partial<{ d: number[]; s: number[]; n: number }> = {}) =>
    planTransfer({ dst, producer: { tpSize: srcTp, ranks: [src] }, dstBlocks: [o.d ?? [0, 1]], srcBlocks: [o.s ?? [0, 1]], firstToken: 0, numTokens: o.n ?? 20 });
  it('a cache the producer lacks', () => expect(() => plan(one(GQA, 1).info, one(MLA, 1).info)).toThrow(PlanError));
  it('different global head counts', () => expect(() => plan(one(GQA4, 1).info, one(GQA, 1).info)).toThrow(/global heads/));
  it('a missing block for a loaded token', () => expect(() => plan(one(GQA, 1).info, one(GQA, 1).info, 1, { s: [0] })).toThrow(/no block for token/));
  it('a block id past the cache', () => expect(() => plan(one(GQA, 1).info, one(GQA, 1).info, 1, { s: [0, 9] })).toThrow(/out of range/));
  it('a layout that points outside the registered region', () => {
    const src = one(GQA, 1).info;
    const bad = { ...src, regions: src.regions.map((r) => ({ ...r, length: 8 })) };
    expect(() => plan(one(GQA, 1).info, bad)).toThrow(/outside region/);
  });
  it('a producer rank missing from the info', () => {
    const d = makeRank(GQA, 0, 1, { numBlocks: 4, blockSize: 16 });
    const p1 = makeRank(GQA, 1, 2, { numBlocks: 4, blockSize: 16 });
    expect(() => planTransfer({ dst: d.info, producer: { tpSize: 2, ranks: [p1.info] }, dstBlocks: [[0, 1]], srcBlocks: [[0, 1]], firstToken: 0, numTokens: 20 })).toThrow(/no producer rank 0/);
  });
  it('negative (null) blocks skip their tokens', () => {
    const plans = plan(one(GQA, 1).info, one(GQA, 1).info, 1, { s: [-1, 1] });
    const all = plan(one(GQA, 1).info, one(GQA, 1).info, 1);
    expect(plans[0].bytes).toBe(all[0].bytes - 2 * 2 * 2 * 16 * 16);
  });
  it('coalesce merges only pairs contiguous on both sides', () => {
    expect(coalesce([{ src: 10, dst: 100, len: 4 }, { src: 14, dst: 104, len: 4 }, { src: 30, dst: 108, len: 4 }])).toEqual([{ src: 10, dst: 100, len: 8 }, { src: 30, dst: 108, len: 4 }]);
  });
});

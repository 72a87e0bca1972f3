/**
 * The attention planner merges contiguous cells as it builds them (mapping.ts, `planAttention`);
 * its plans must equal the per-cell plan: one pair per consumer local head x token x part,
 * coalesced (what it built before, kept here as the reference), with the same cell counts, over
 * TP sizes, block sizes, NHD / HND, every KV layout, prefix hits and null blocks.
 */
import { describe, expect, it } from 'vitest';
import { coalesce, partOffset, planTransfer, sourceOfHead, type AttentionLayout, type Pair, type PlanInput, type RankInfo } from '../src/index.js';
import { makeRank, type FixtureModel, type FixtureRank } from './fixtures.js';

const MODELS: Record<string, FixtureModel> = {
  gqa2: { kind: 'gqa', layers: 2, kvHeads: 2, headDim: 8 },
  gqa4: { kind: 'gqa', layers: 1, kvHeads: 4, headDim: 4 },
  mla: { kind: 'mla', layers: 2, kvHeads: 1, headDim: 12 },
};

/** The per-cell plan (every cell its own pair, then `coalesce`), by producer agent name. */
function perCell(i: PlanInput): Map<string, { pairs: Pair[]; cells: number }> {
  const out = new Map<string, { pairs: Pair[]; cells: number }>();
  const at = (r: RankInfo, region: number, off: number) => r.regions[region].addr + off;
  for (const dc of i.dst.caches) {
    if (dc.kind !== 'attention') continue;
    const holders = i.producer.ranks.map((r) => ({ r, c: r.caches.find((c) => c.name === dc.name) as AttentionLayout }));
    const any = holders[0].c;
    const g0 = Math.floor(i.dst.tpRank / dc.replicas) * dc.localHeads;
    for (let h = 0; h < dc.localHeads; h++) {
      const s = sourceOfHead(g0 + h, any.localHeads, any.replicas);
      const { r, c } = holders.find((x) => x.r.tpRank === s.tpRank)!;
      let e = out.get(r.agentName);
      if (!e) out.set(r.agentName, (e = { pairs: [], cells: 0 }));
      for (let t = i.firstToken; t < i.numTokens; t++) {
        const bd = i.dstBlocks[dc.group][Math.floor(t / dc.blockSize)];
        const bp = i.srcBlocks[c.group][Math.floor(t / c.blockSize)];
        if (bd < 0 || bp < 0) continue;
        dc.parts.forEach((pd, q) => {
          const pp = c.parts[q];
          e!.pairs.push({ src: at(r, pp.region, partOffset(pp, bp, s.head, t % c.blockSize)), dst: at(i.dst, pd.region, partOffset(pd, bd, h, t % dc.blockSize)), len: pd.bytes });
          e!.cells++;
        });
      }
    }
  }
  for (const e of out.values()) e.pairs = coalesce(e.pairs);
  return out;
}

const made = new Map<string, FixtureRank[]>();
/** The ranks of one side (made once per shape: building views is the slow part). */
function ranks(model: string, tp: number, blockSize: number, layout: 'NHD' | 'HND', kvLayout: 'kv-first' | 'block-kv' | 'separate'): FixtureRank[] {
  const k = `${model}/${tp}/${blockSize}/${layout}/${kvLayout}`;
  let r = made.get(k);
  if (!r) made.set(k, (r = [...Array(tp).keys()].map((t) => makeRank(MODELS[model], t, tp, { numBlocks: 24, blockSize, layout, kvLayout }))));
  return r;
}

describe('planTransfer (attention): merged while built = per cell, then coalesced', () => {
  const cases: Array<[string, number, number, number, number, 'NHD' | 'HND', 'kv-first' | 'block-kv' | 'separate', number, number, boolean]> = [];
  for (const model of Object.keys(MODELS)) {
    for (const [tpP, tpD] of [[1, 1], [2, 1], [1, 2], [2, 2], [4, 2]]) {
      for (const [bP, bD] of [[16, 16], [16, 4], [4, 16]]) {
        for (const layout of ['NHD', 'HND'] as const) {
          for (const kvLayout of ['kv-first', 'block-kv', 'separate'] as const) {
            if (model === 'mla' && kvLayout !== 'kv-first') continue; // a vector cache has one part
            for (const [first, numTokens, nullBlock] of [[0, 64, false], [20, 61, false], [0, 64, true]] as const) cases.push([model, tpP, tpD, bP, bD, layout, kvLayout, first, numTokens, nullBlock]);
          }
        }
      }
    }
  }
  it(`${cases.length} layouts: same pairs and cells`, () => {
    let compared = 0;
    for (const [model, tpP, tpD, bP, bD, layout, kvLayout, first, numTokens, nullBlock] of cases) {
      const numBlocks = 24;
      const P = ranks(model, tpP, bP, layout, kvLayout);
      const D = ranks(model, tpD, bD, layout === 'NHD' ? 'HND' : 'NHD', kvLayout);
      const D2 = ranks(model, tpD, bD, layout, kvLayout);
      const srcBlocks = [[...Array(Math.ceil(numTokens / bP)).keys()].map((i) => numBlocks - 1 - i)];
      const dstBlocks = [[...Array(Math.ceil(numTokens / bD)).keys()].map((i) => (nullBlock && i === 1 ? -1 : i + 1))];
      // Both the consumer's own layout and the other one (NHD <- HND and back).
      for (const d of [...D, ...D2]) {
        const input: PlanInput = { dst: d.info, producer: { tpSize: tpP, ranks: P.map((x) => x.info) }, dstBlocks, srcBlocks, firstToken: first, numTokens };
        const got = planTransfer(input);
        const want = perCell(input);
        const label = `${model} tp ${tpP}->${tpD} block ${bP}->${bD} ${layout} ${kvLayout} [${first}, ${numTokens})${nullBlock ? ' null block' : ''}`;
        expect(new Map(got.map((p) => [p.src.agentName, { pairs: p.pairs, cells: p.cells }])), label).toEqual(new Map([...want].filter(([, e]) => e.cells > 0)));
        for (const p of got) expect(p.bytes, label).toBe(p.pairs.reduce((a, x) => a + x.len, 0));
        compared++;
      }
    }
    expect(compared).toBeGreaterThan(500);
  });
});

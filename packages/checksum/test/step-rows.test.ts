/**
 * StepRows (compute.ts): the `kvc_row` table of a step against a reference built here row by row
 * from SPEC 2's definitions (a block at position p holds the tokens [p*B, (p+1)*B) below
 * numTokens; blocks holding none get no row; sampled-out blocks get no row), over random runs of
 * several KV cache groups (block sizes 1 to 32, one and several output columns, a state group, a
 * skipped group), partial last blocks, ranges past numTokens, masks, and reuse across steps.
 */
import { describe, expect, it } from 'vitest';
import { ROW_WORDS } from '../src/backend.js';
import { StepRows, type BlockRun } from '../src/compute.js';
import { planGroup, type GroupPlan, type RankContext } from '../src/plan.js';
import { logicalAttentionCache, mamba2StateLayout, pagedStateCache, type CacheView } from '../src/views.js';
import { Rng } from './layouts.js';

/** A uniform integer in [0, n). */
const below = (rng: Rng, n: number): number => rng.u32() % n;
import { testSeed } from './seed.js';

const SEED = testSeed('step-rows.test.ts');

function attn(name: string, blockSize: number, replication?: 'all'): CacheView {
  return logicalAttentionCache({ name, dtype: 'bfloat16', numBlocks: 4, blockSize, localHeads: 2, cellBytes: 32, at: { region: 0 }, replication });
}

/** Plans of every kind StepRows distinguishes. */
function plans(): GroupPlan[] {
  const P0: RankContext = { tpRank: 0, tpSize: 1, role: 'producer' };
  const layout = mamba2StateLayout({ tpSize: 1, intermediateSize: 4, nGroups: 1, dState: 2, convKernel: 2, numHeads: 2, headDim: 1, convDimFirst: true, convDtype: 'float16', ssmDtype: 'float32' })!;
  const state = pagedStateCache({ name: 'model.layers.3.mixer', numBlocks: 2, at: { region: 0 }, pageBytes: 8 * 1 * 2 + 2 * 1 * 2 * 4, layout });
  const ps = [
    planGroup({ groupId: 0, caches: [attn('model.layers.0.attn', 16)] }, P0),
    planGroup({ groupId: 1, caches: [attn('model.layers.1.attn', 1)] }, P0),
    // two replica keys: two output columns per block
    planGroup({ groupId: 2, caches: [attn('model.layers.2.self_attn.attn', 32), attn('model.layers.2.self_attn.indexer', 32, 'all')] }, { tpRank: 1, tpSize: 2, role: 'consumer' }),
    planGroup({ groupId: 3, caches: [state] }, P0),
    planGroup({ groupId: 4, caches: [attn('model.attn', 8)] }, P0), // skipped: no layer number
    planGroup({ groupId: 5, caches: [attn('model.layers.5.attn', 5)] }, P0),
  ];
  expect(ps.map((p) => [p.kind === 'state' || p.kind === 'state-local', p.skipReason === null, p.columns.length])).toEqual([
    [false, true, 1],
    [false, true, 1],
    [false, true, 2],
    [true, true, 1],
    [false, false, 0],
    [false, true, 1],
  ]);
  return ps;
}

/** The rows and output length of one step, row by row from the definitions. */
function reference(ps: readonly GroupPlan[], runs: readonly BlockRun[]): { rows: number[]; outLength: number } {
  const rows: number[] = [];
  let outLength = 0;
  for (const run of runs) {
    const plan = ps[run.group];
    const columns = plan.columns.length;
    const isState = plan.kind === 'state' || plan.kind === 'state-local';
    for (let i = 0; i < run.blockIds.length; i++) {
      const out = outLength + i * columns;
      if (columns === 0 || plan.skipReason !== null || (run.mask !== undefined && run.mask[i] === 0)) continue;
      if (isState) {
        rows.push(run.group, run.blockIds[i], 0, 0, out, 0);
        continue;
      }
      const first = (run.start + i) * plan.blockSize;
      const valid = Math.min(plan.blockSize, Math.max(0, run.numTokens - first));
      if (valid > 0) rows.push(run.group, run.blockIds[i], first, valid, out, 0);
    }
    outLength += run.blockIds.length * columns;
  }
  return { rows, outLength };
}

/** A random run of group g: attention ranges that end inside, at and past numTokens. */
function randomRun(rng: Rng, ps: readonly GroupPlan[], g: number): BlockRun {
  const plan = ps[g];
  const isState = plan.kind === 'state' || plan.kind === 'state-local';
  const B = Math.max(plan.blockSize, 1);
  const n = isState ? 1 : below(rng, 5) === 0 ? below(rng, 3) : 1 + below(rng, 300);
  const start = isState ? 0 : below(rng, 40);
  const ids = Array.from({ length: n }, () => (below(rng, 8) === 0 ? 2 ** 32 - 1 - below(rng, 3) : below(rng, 1 << 20)));
  const blockIds = below(rng, 2) ? ids : below(rng, 2) ? Uint32Array.from(ids) : Int32Array.from(ids, (x) => x & 0x7fffffff);
  const pick = below(rng, 4);
  const numTokens =
    pick === 0 ? (start + n) * B // every block full
      : pick === 1 ? (start + n) * B - 1 - below(rng, B) // partial last block (or one block fewer)
        : pick === 2 ? below(rng, (start + n + 3) * B) // anywhere, also before start
          : (start + n + below(rng, 4)) * B + below(rng, B); // past the range
  const run: BlockRun = { group: g, blockIds, start, numTokens };
  if (below(rng, 4) === 0) run.mask = Uint8Array.from({ length: n }, () => (below(rng, 3) === 0 ? 0 : 1));
  return run;
}

describe('StepRows (compute.ts)', () => {
  it('builds the rows a row-by-row reference builds, over random steps of several groups', () => {
    const ps = plans();
    const step = new StepRows(ps);
    const rng = new Rng(SEED);
    for (let c = 0; c < 200; c++) {
      const runs = Array.from({ length: 1 + below(rng, 6) }, () => randomRun(rng, ps, below(rng, ps.length)));
      step.reset(); // the same object across steps: reused buffers
      runs.forEach((run, i) => expect(step.add(run)).toBe(i));
      const want = reference(ps, runs);
      expect(Array.from(step.rows), `case ${c} (seed ${SEED})`).toEqual(want.rows);
      expect(step.rows.length % ROW_WORDS).toBe(0);
      expect(step.outLength, `case ${c}`).toBe(want.outLength);
    }
  });

  it('gives a partial last block its own valid tokens, and no row to blocks past numTokens', () => {
    const ps = plans();
    const step = new StepRows(ps);
    step.add({ group: 0, blockIds: [7, 8, 9, 10], start: 2, numTokens: 2 * 16 + 16 + 5 });
    expect(Array.from(step.rows)).toEqual([0, 7, 32, 16, 0, 0, 0, 8, 48, 5, 1, 0]);
    expect(step.outLength).toBe(4);
  });

  it('refuses a block id that is not a uint32', () => {
    const ps = plans();
    for (const bad of [-1, 2 ** 32, 1.5, NaN]) {
      expect(() => new StepRows(ps).add({ group: 0, blockIds: [1, 2, bad, 3], start: 0, numTokens: 64 })).toThrow(RangeError);
      expect(() => new StepRows(ps).add({ group: 0, blockIds: [1, 2, bad, 3], start: 0, numTokens: 64, mask: [1, 1, 1, 1] })).toThrow(RangeError);
    }
  });
});

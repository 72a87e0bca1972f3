/**
 * One replica count R (SPEC 1) for the checksum plan and the transfer mapping: where the plan
 * cannot tell R (3 KV heads at TP 4: R = 4/3 does not divide the TP size, so the group is skipped),
 * the transfer layout refuses the cache with the same typed error instead of mapping heads with a
 * fractional R; where R is told, both use the same R.
 */
import { describe, expect, it } from 'vitest';
import { ReplicaCountError, planGroup } from '@kvconnect/checksum';
import { makeRank, type FixtureModel } from './fixtures.js';

const gqa = (kvHeads: number): FixtureModel => ({ kind: 'gqa', layers: 1, kvHeads, headDim: 8 });

describe('replica count: transfer mapping vs checksum plan (SPEC 1)', () => {
  it('TP 4 with 3 KV heads: the plan skips the group and the transfer layout refuses the cache', () => {
    // makeRank builds the views and the transfer layout (buildRankInfo) from them.
    const build = () => makeRank(gqa(3), 1, 4, { blockSize: 4, numBlocks: 4 });
    expect(build, 'the transfer layout must refuse R = 4/3, not map heads with it').toThrow(ReplicaCountError);
    expect(build).toThrow(/cannot tell the replicas of 3 KV heads at TP 4/);
  });

  it('the plan skips the same geometry with reason "replicas"', () => {
    // The views alone (no transfer layout): built with the fixture at a TP size that works, then re-ranked.
    const ok = makeRank(gqa(1), 1, 4, { blockSize: 4, numBlocks: 4 }).caches.groups[0];
    const caches = ok.caches.map((c) => ({ ...c, replication: { totalKvHeads: 3 } }));
    const plan = planGroup({ groupId: 0, caches }, { tpRank: 1, tpSize: 4, role: 'consumer' });
    expect(plan.skipReason).toBe('replicas');
    expect(plan.skipDetail).toMatch(/cannot tell the replicas of 3 KV heads at TP 4/);
  });

  for (const [kvHeads, tp, R] of [
    [2, 4, 2],
    [1, 4, 4],
    [4, 4, 1],
    [8, 2, 1],
  ] as const) {
    it(`${kvHeads} KV heads at TP ${tp}: both use R = ${R}`, () => {
      const r = makeRank(gqa(kvHeads), tp - 1, tp, { blockSize: 4, numBlocks: 4 });
      const layout = r.info.caches[0];
      expect(layout.kind === 'attention' && layout.replicas).toBe(R);
      const plan = planGroup(r.caches.groups[0], { tpRank: tp - 1, tpSize: tp, role: 'consumer' });
      expect(plan.skipReason).toBeNull();
      expect(plan.columns.map((c) => c.replicas)).toEqual([R]);
    });
  }
});

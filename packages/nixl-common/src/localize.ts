/**
 * The producer worker's part of `LOCALIZE` (docs/localize.md): fine sums (replica 0, as the
 * producer's block values, SPEC 2) of the blocks a {@link LocalizeOrder} names, over the tokens its
 * query asks for, on this rank's caches. Plain data in, plain data out: it runs in the worker's
 * process; the scheduler half merges the workers' results (producer.ts).
 * @module
 */
import { mergeFineSums, planGroup, type GroupPlan } from '@kvconnect/checksum';
import { localizeOnRank, type DeviceRegionReader, type LocalizeAnswer, type LocalizeQuery, type LocalizeStepEntry, type WorkerKVCaches } from '@kvconnect/core';
import type { LocalizeOrder, LocalizeResult } from './producer.js';

/**
 * The fine sums of `order` on the rank of `caches`. `plans` caches this rank's producer plans
 * (group index -> plan) between orders. A group this rank cannot sum, or whose blocks the order
 * does not name (a null block among them), reports its error instead of sums. Device KV is read
 * through `readDevice` (`@kvconnect/transfer` `readDeviceBytes`): only the blocks summed.
 */
export function localizeOrderOnRank(caches: WorkerKVCaches, plans: Map<number, GroupPlan>, order: LocalizeOrder, readDevice?: DeviceRegionReader): LocalizeResult {
  const planOf = (gi: number): GroupPlan => {
    let p = plans.get(gi);
    if (!p) plans.set(gi, (p = planGroup(caches.groups[gi], { tpRank: caches.rank.tpRank, tpSize: caches.rank.tpSize, role: 'producer' })));
    return p;
  };
  const entry: LocalizeStepEntry = { requestId: order.requestId, numTokens: order.numTokens, rangeTokens: order.query.rangeTokens, groups: [] };
  const errors = new Map<number, string>();
  for (const q of order.query.groups) {
    const gi = caches.groups.findIndex((g) => g.groupId === q.groupId);
    if (gi < 0) continue;
    const ids = order.blocks[gi] ?? [];
    const cfg = caches.groupConfigs[gi];
    let blockIds: number[];
    let start = 0;
    if (cfg?.kind === 'state') blockIds = ids.length > 0 ? [ids[ids.length - 1]] : [];
    else {
      const B = cfg?.blockSize ?? planOf(gi).blockSize;
      start = Math.floor(q.tokenStart / B);
      blockIds = ids.slice(start, Math.min(ids.length, Math.ceil(Math.min(q.tokenEnd, order.numTokens) / B)));
    }
    if (blockIds.length === 0 || blockIds.some((b) => b < 0)) {
      errors.set(q.groupId, `no blocks of tokens ${q.tokenStart}-${q.tokenEnd} held`);
      continue;
    }
    entry.groups.push({ groupId: q.groupId, start, blockIds, tokenStart: q.tokenStart, tokenEnd: q.tokenEnd });
  }
  const plansByIndex = caches.groups.map((_, gi) => (entry.groups.some((g) => g.groupId === caches.groups[gi].groupId) ? planOf(gi) : null));
  const got = localizeOnRank(
    plansByIndex as GroupPlan[],
    (id) => {
      const gi = caches.groups.findIndex((g) => g.groupId === id);
      return gi < 0 ? undefined : gi;
    },
    caches.regions,
    entry,
    readDevice,
  );
  return { ticket: order.ticket, groups: [...got.groups, ...[...errors].map(([groupId, error]) => ({ groupId, sums: [], error }))] };
}

/**
 * The producer's answer to a drill-down from every rank's result ({@link localizeOrderOnRank}):
 * per group of `query`, the ranks' fine sums merged (`mergeFineSums`: equal keys added mod 2^64)
 * and their errors joined (`; `). Used by NIXL's producer channel and Mooncake's consumer, which
 * merges the answers of the producer's workers.
 */
export function mergeLocalizeResults(query: LocalizeQuery, results: Iterable<LocalizeResult['groups']>): LocalizeAnswer & { status: 'held' } {
  const all = [...results];
  const groups = query.groups.map((g) => {
    const parts = all.map((x) => x.find((y) => y.groupId === g.groupId));
    const errors = parts.filter((x) => x?.error).map((x) => x!.error!);
    const sums = mergeFineSums(parts.map((x) => x?.sums ?? []));
    return errors.length > 0 ? { groupId: g.groupId, sums, error: errors.join('; ') } : { groupId: g.groupId, sums };
  });
  return { status: 'held', groups };
}

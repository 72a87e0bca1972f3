/**
 * The replica count R of an attention cache (SPEC 1): the one resolution the checksum planner,
 * the transfer mappings (NIXL, Mooncake), the in-process test connector and the fault harness use.
 * @module
 */
import type { AttentionCacheView } from './views.js';

/**
 * R cannot be told or does not divide the TP size (SPEC 1: such a group is skipped by the
 * checksum planner; a transfer mapping refuses the cache).
 */
export class ReplicaCountError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ReplicaCountError';
  }
}

/**
 * The replica count R of an attention cache at TP size `tpSize` (SPEC 1): the number of
 * consecutive TP ranks that hold the same heads (`shard = floor(tpRank / R)`,
 * `replica = tpRank mod R`).
 *
 * - `replication` absent: 1 (sharded heads); a number: that number; `'all'`: `tpSize` (MLA and
 *   other caches every rank holds whole);
 * - `{ totalKvHeads }`: 1 when `totalKvHeads >= tpSize` (then `totalKvHeads` must equal
 *   `localHeads * tpSize`), else `tpSize / totalKvHeads` (GQA with fewer KV heads than ranks; then
 *   `totalKvHeads` must divide `tpSize` and each rank holds one head).
 *
 * @param view the cache's `name` (for messages), `localHeads` and `replication`.
 * @returns R, a positive integer dividing `tpSize`.
 * @throws ReplicaCountError when R cannot be told or does not divide `tpSize` (e.g. 3 KV heads
 *   at TP 4), or `tpSize` is not a positive integer.
 */
export function replicaCount(view: Pick<AttentionCacheView, 'name' | 'localHeads' | 'replication'>, tpSize: number): number {
  if (!(Number.isSafeInteger(tpSize) && tpSize >= 1)) throw new ReplicaCountError(`${view.name}: TP size ${tpSize} is not a positive integer`);
  const r = view.replication ?? 1;
  let R: number;
  if (r === 'all') R = tpSize;
  else if (typeof r === 'number') R = r;
  else {
    const total = r.totalKvHeads;
    if (!(Number.isSafeInteger(total) && total > 0)) throw new ReplicaCountError(`${view.name}: totalKvHeads ${total} is not a positive integer`);
    if (total >= tpSize) {
      if (total !== view.localHeads * tpSize) throw new ReplicaCountError(`${view.name}: ${total} KV heads do not shard into ${view.localHeads} per rank at TP ${tpSize}`);
      R = 1;
    } else {
      if (tpSize % total !== 0 || view.localHeads !== 1) throw new ReplicaCountError(`${view.name}: cannot tell the replicas of ${total} KV heads at TP ${tpSize}`);
      R = tpSize / total;
    }
  }
  if (!(Number.isSafeInteger(R) && R >= 1 && tpSize % R === 0)) throw new ReplicaCountError(`${view.name}: R=${R} does not divide TP size ${tpSize}`);
  return R;
}

/**
 * Global heads of an attention cache (SPEC 1): `localHeads * tpSize / R`.
 * @throws ReplicaCountError as {@link replicaCount}.
 */
export function globalHeads(view: Pick<AttentionCacheView, 'name' | 'localHeads' | 'replication'>, tpSize: number): number {
  return (view.localHeads * tpSize) / replicaCount(view, tpSize);
}

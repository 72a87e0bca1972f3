/**
 * Which blocks a load touches: the one definition the connectors (NIXL pull/push through
 * `@kvconnect/nixl-common`, Mooncake) and the fault harness use to name a failed load's blocks in
 * `TransferResults.invalidBlockIds` (the engine then applies `kv_load_failure_policy`).
 *
 * It lives here, beside {@link KVCacheGroupConfig} and {@link BlockIdsPerGroup}, because it is a
 * fact of the connector contract (block tables per KV cache group, group kinds, block sizes), which
 * every connector already imports; `@kvconnect/checksum` knows cache memory, not block tables.
 * @module
 */
import type { KVCacheGroupConfig } from './connector.js';

/**
 * The block ids a load of tokens `[firstToken, numTokens)` writes, over all groups, each id once
 * (in group order, then block position):
 * - an attention group (`full-attention`, `sliding-window`) of block size `B`: the ids at block
 *   positions `floor(firstToken / B)` up to `ceil(numTokens / B)` (exclusive, clipped to the table),
 *   so a local prefix hit's whole blocks are never named;
 * - a `state` group: its running-state block, the last id of the table.
 *
 * An empty token range (`numTokens <= firstToken`) names no attention block. Negative ids (null
 * blocks, e.g. outside a sliding window) are left out.
 *
 * @param groups per group index (as `blocks`): its kind and block size in tokens; `null` or
 *   `undefined` leaves the group out (e.g. one this worker holds no cache of, or a fault restricted
 *   to another group).
 * @param blocks the consumer's block ids per group (`blocks[g]` for `groups[g]`).
 * @param firstToken first loaded token (the local prefix hit), request position.
 * @param numTokens one past the last loaded token, request position.
 */
export function loadBlockIds(
  groups: readonly (Pick<KVCacheGroupConfig, 'kind' | 'blockSize'> | null | undefined)[],
  blocks: readonly (readonly number[])[],
  firstToken: number,
  numTokens: number,
): number[] {
  const out = new Set<number>();
  blocks.forEach((ids, g) => {
    const cfg = groups[g];
    if (!cfg) return;
    if (cfg.kind === 'state') {
      const b = ids[ids.length - 1];
      if (b !== undefined && b >= 0) out.add(b);
      return;
    }
    if (numTokens <= firstToken) return;
    const B = cfg.blockSize;
    for (let p = Math.floor(firstToken / B); p < Math.min(ids.length, Math.ceil(numTokens / B)); p++) if (ids[p] >= 0) out.add(ids[p]);
  });
  return [...out];
}

/**
 * The `kv_cache_groups` field of an engine server's `GET /health` answer: the engine's KV cache
 * groups as `{ group_id, kind, block_size }` (block size in tokens), from which a P/D proxy learns
 * the consumer's block sizes for `kv_checksum_block_sizes` (docs/checksum-extensions.md section 1;
 * `PDProxy` in ../proxy.ts).
 * @module
 */
import type { BlockSizeGroup } from '@kvconnect/core';

/** One entry of `/health`'s `kv_cache_groups`. */
export interface HealthKVCacheGroup {
  group_id: number;
  kind: BlockSizeGroup['kind'];
  block_size: number;
}

/** The `kv_cache_groups` field of an engine with KV cache groups `groups`. */
export function healthKVCacheGroups(groups: readonly BlockSizeGroup[]): HealthKVCacheGroup[] {
  return groups.map((g) => ({ group_id: g.groupId, kind: g.kind, block_size: g.blockSize }));
}

const KINDS: ReadonlySet<string> = new Set<BlockSizeGroup['kind']>(['full-attention', 'sliding-window', 'state']);

/**
 * The KV cache groups a `/health` answer names, or `undefined` when it names none or any entry is
 * malformed (an older server, or a bad one: the proxy then adds no `kv_checksum_block_sizes`).
 */
export function parseHealthKVCacheGroups(health: Record<string, unknown>): BlockSizeGroup[] | undefined {
  const v = health.kv_cache_groups;
  if (!Array.isArray(v) || v.length === 0) return undefined;
  const out: BlockSizeGroup[] = [];
  for (const e of v) {
    if (typeof e !== 'object' || e === null) return undefined;
    const { group_id: groupId, kind, block_size: blockSize } = e as Record<string, unknown>;
    if (!Number.isSafeInteger(groupId) || (groupId as number) < 0) return undefined;
    if (typeof kind !== 'string' || !KINDS.has(kind)) return undefined;
    if (!Number.isSafeInteger(blockSize) || (blockSize as number) <= 0) return undefined;
    out.push({ groupId: groupId as number, kind: kind as BlockSizeGroup['kind'], blockSize: blockSize as number });
  }
  return out;
}

/**
 * Shared test fixtures of the Mooncake package's tests (not a test file: vitest collects `*.test.ts`).
 */
import { pagedAttentionBytes, pagedAttentionCache } from '@kvconnect/checksum';
import type { WorkerKVCaches } from '@kvconnect/core';

/** A worker's KV caches of one TP 1 / PP 1 rank: one bf16 NHD attention layer, 8 blocks of 4 tokens x 2 heads x 4, in one host region. */
export function caches(): WorkerKVCaches {
  const o = { dtype: 'bfloat16' as const, numBlocks: 8, blockSize: 4, numHeads: 2, headSize: 4, layout: 'NHD' as const, kvLayout: 'kv-first' as const };
  const attn = pagedAttentionCache({ ...o, name: 'model.layers.0.self_attn.attn', at: { region: 0 } });
  return {
    rank: { tpRank: 0, tpSize: 1 },
    ppRank: 0,
    ppSize: 1,
    regions: [new Uint8Array(pagedAttentionBytes(o))],
    groups: [{ groupId: 0, caches: [attn] }],
    groupConfigs: [{ groupId: 0, kind: 'full-attention', blockSize: 4, layerNames: [attn.name] }],
  };
}

// The e2e benchmark's checksum shape (bench/e2e.mjs: the demo model dense-gqa, packages/engine
// src/model/config.ts): 4 attention layers, one region each, bf16 KV, 2 KV heads x 16, 16-token
// blocks, kv-first, 8192 blocks per region; one call sums a request's 64 blocks of all 4 layers
// (512 KiB). Shared by bench/checksum.mjs and quick profiling scripts.
import { BlockChecksummer, pagedAttentionBytes, pagedAttentionCache } from '@kvconnect/checksum';

export const E2E_GEO = { dtype: 'bfloat16', blockSize: 16, numHeads: 2, headSize: 16, kvLayout: 'kv-first', numBlocks: 8192 };
export const E2E_LAYERS = 4;
export const E2E_BLOCKS = 64;
/** KV bytes one call reads: blocks x layers x (K + V). */
export const E2E_BYTES = E2E_BLOCKS * E2E_LAYERS * 2 * E2E_GEO.blockSize * E2E_GEO.numHeads * E2E_GEO.headSize * 2;

/**
 * A producer checksummer over random KV in `layout` ('NHD' or 'HND') on `backend`, the runs of
 * `sets` requests (64 consecutive blocks each, request i at blocks 64 i ..), and `flat`: one
 * buffer of E2E_BYTES bytes for the plain read-sum baseline.
 */
export function e2eShape(layout, backend, sets = 8) {
  const bytes = pagedAttentionBytes(E2E_GEO);
  const regions = [];
  const caches = [];
  for (let l = 0; l < E2E_LAYERS; l++) {
    const r = new Uint8Array(bytes);
    for (let o = 0; o < r.length; o += 65536) crypto.getRandomValues(r.subarray(o, Math.min(r.length, o + 65536)));
    regions.push(r);
    caches.push(pagedAttentionCache({ name: `model.layers.${l}.self_attn.attn`, ...E2E_GEO, layout, at: { region: l } }));
  }
  const ck = new BlockChecksummer([{ groupId: 0, caches }], { tpRank: 0, tpSize: 1, role: 'producer' }, regions, backend);
  const runs = Array.from({ length: sets }, (_, i) => [
    { group: 0, blockIds: Array.from({ length: E2E_BLOCKS }, (_, b) => i * E2E_BLOCKS + b), start: 0, numTokens: E2E_BLOCKS * E2E_GEO.blockSize },
  ]);
  const flat = new Uint8Array(E2E_BYTES);
  for (let o = 0; o < flat.length; o += 65536) crypto.getRandomValues(flat.subarray(o, o + 65536));
  return { ck, runs, flat };
}

/**
 * Sub-block values (docs/checksum-extensions.md section 1): a producer whose block size `Bp` is a
 * multiple `k * S` of the consumer's `S` also sums each of its blocks as `k` sub-blocks of `S`
 * tokens, so a consumer prefix hit that ends inside a producer block can be verified.
 *
 * The values are SPEC 2 block values at block size `S`: sub-block position `q = p*k + s` (producer
 * block position `p`, sub-block `s` in `0 .. k-1`) holds request positions `[q*S, (q+1)*S)`. They are
 * computed with the existing backends, unchanged: sub-block `s` of a cache is a view of the same
 * memory with block size `S`, shifted by `s*S` tokens inside each block ({@link subBlockView}), so
 * each producer block is read once per sub-block it holds, i.e. the KV is read once more in all.
 * @module
 */
import { ROW_WORDS, type ChecksumBackend } from './backend.js';
import type { BlockChecksummer, BlockRun } from './compute.js';
import type { GroupSpec } from './plan.js';
import { replicaKeyString, type WorkerGroupRecord } from './types.js';
import type { AttentionCacheView, CacheView } from './views.js';

/**
 * Sub-block `s` (of size `S` tokens) of every block of an attention cache view: the same memory
 * with block size `S`, each part's offset moved to token `s*S` of the block (kernel blocks
 * included). Returns null when it cannot be said as a view: `S` does not divide the block size,
 * or a part's kernel block size neither divides nor is divided by `S`.
 */
export function subBlockView(view: AttentionCacheView, S: number, s: number): AttentionCacheView | null {
  const bp = view.blockSize;
  if (!(Number.isSafeInteger(S) && S > 0 && bp % S === 0 && Number.isSafeInteger(s) && s >= 0 && s < bp / S)) return null;
  const t0 = s * S;
  const parts = [];
  for (const p of view.parts) {
    const kbt = p.kernelBlockTokens ?? bp;
    const kbs = p.kernelBlockStride ?? 0;
    const offset = p.offset + Math.floor(t0 / kbt) * kbs + (t0 % kbt) * p.tokenStride;
    if (kbt % S === 0) {
      // The sub-block lies inside one kernel block: contiguous tokens at tokenStride.
      parts.push({ ...p, offset, kernelBlockTokens: S, kernelBlockStride: 0 });
    } else if (S % kbt === 0) {
      parts.push({ ...p, offset, kernelBlockTokens: kbt, kernelBlockStride: kbs });
    } else {
      return null;
    }
  }
  return { ...view, blockSize: S, parts };
}

/**
 * The `k = Bp / S` group specs whose plans sum sub-blocks `0 .. k-1` of `group` (a group of
 * attention caches of one block size `Bp`), in sub-block order; null when `S` does not divide
 * `Bp` (or is not smaller), the group holds a cache that is not attention, or a view cannot be
 * shifted ({@link subBlockView}). Plans of these specs have the group's fingerprint and replica
 * columns (SPEC 5 identities do not hold the block size).
 */
export function subBlockGroupSpecs(group: GroupSpec, S: number): GroupSpec[] | null {
  const attn = group.caches.filter((c): c is AttentionCacheView => c.kind === 'attention');
  if (attn.length === 0 || attn.length !== group.caches.length) return null;
  const bp = attn[0].blockSize;
  if (attn.some((c) => c.blockSize !== bp) || !(S < bp && bp % S === 0)) return null;
  const specs: GroupSpec[] = [];
  for (let s = 0; s < bp / S; s++) {
    const caches: CacheView[] = [];
    for (const c of attn) {
      const v = subBlockView(c, S, s);
      if (v === null) return null;
      caches.push(v);
    }
    specs.push({ groupId: group.groupId, caches });
  }
  return specs;
}

/**
 * Sums the sub-blocks of one producer run with a checksummer over {@link subBlockGroupSpecs}
 * (host backends): one `kvc_row` per (block, sub-block `s`) of group index `s`, first token
 * `position * k * S + s * S`, `min(S, numTokens - first)` valid tokens, all in one backend call
 * (rows without a valid token, and the blocks a `mask` leaves out, get none: their values are 0).
 *
 * @param summer - a host checksummer over the `k` specs of {@link subBlockGroupSpecs}, in order.
 * @param run - the producer's run: block ids at positions `start ..`, its `numTokens`, optional mask.
 * @param k - sub-blocks per block (`Bp / S`).
 * @returns one record at block size `S`: positions `start * k ..`, `nBlocks * k` values per replica key.
 * @throws Error on a device checksummer; RangeError as the backend for ids outside the caches.
 */
export function sumSubBlocks(summer: BlockChecksummer, run: Pick<BlockRun, 'blockIds' | 'start' | 'numTokens' | 'mask'>, k: number): WorkerGroupRecord {
  if (summer.isDevice) throw new Error('sub-block values are summed on host backends only');
  const plans = summer.plans;
  const n = run.blockIds.length * k;
  const skip = plans.find((p) => p.skipReason !== null);
  if (plans.length !== k || skip) return { start: run.start * k, nBlocks: n, skipped: true, skipReason: skip?.skipReason ?? 'invalid-view', partials: new Map() };
  const S = plans[0].blockSize;
  const cols = plans[0].columns.length;
  const rows = new Uint32Array(n * ROW_WORDS);
  let w = 0;
  for (let i = 0; i < run.blockIds.length; i++) {
    if (run.mask !== undefined && run.mask[i] === 0) continue;
    const id = run.blockIds[i];
    if (id >>> 0 !== id) throw new RangeError(`block id ${id} is not a uint32`);
    for (let s = 0; s < k; s++) {
      const first = ((run.start + i) * k + s) * S;
      const valid = Math.min(S, run.numTokens - first);
      if (valid <= 0) break;
      rows.set([s, id, first, valid, (i * k + s) * cols, 0], w);
      w += ROW_WORDS;
    }
  }
  const out = new BigUint64Array(n * cols);
  if (w > 0) (summer.backend as ChecksumBackend).sumRows(summer.tables, summer.regions as readonly Uint8Array[], rows.subarray(0, w), out);
  const partials = new Map<string, BigUint64Array>();
  plans[0].columns.forEach((key, c) => {
    const v = new BigUint64Array(n);
    for (let q = 0; q < n; q++) v[q] = out[q * cols + c];
    partials.set(replicaKeyString(key), v);
  });
  return { start: run.start * k, nBlocks: n, skipped: false, partials };
}

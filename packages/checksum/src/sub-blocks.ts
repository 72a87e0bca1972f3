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
import type { BlockRun } from './compute.js';
import type { GroupSpec } from './plan.js';
import type { WorkerGroupRecord } from './types.js';
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
 * The runs that sum the sub-blocks of a producer run (`blockIds` at positions `start ..`, block
 * size `k * S`) with a checksummer over {@link subBlockGroupSpecs}: one run per (block, sub-block),
 * group index `s`, block position `p*k + s` at size `S` (so its first token is `p*Bp + s*S`).
 * A `mask` (sampled checking) carries over to every sub-block of a masked block.
 */
export function subBlockRuns(run: Pick<BlockRun, 'blockIds' | 'start' | 'numTokens' | 'mask'>, k: number): BlockRun[] {
  const runs: BlockRun[] = [];
  for (let i = 0; i < run.blockIds.length; i++) {
    if (run.mask !== undefined && run.mask[i] === 0) continue;
    for (let s = 0; s < k; s++) runs.push({ group: s, blockIds: [run.blockIds[i]], start: (run.start + i) * k + s, numTokens: run.numTokens });
  }
  return runs;
}

/**
 * Gathers the records of {@link subBlockRuns} into one record at block size `S`: `start * k ..`,
 * `nBlocks * k` positions, partials per replica key (masked blocks' sub-blocks stay 0).
 */
export function subBlockValues(run: Pick<BlockRun, 'blockIds' | 'start' | 'mask'>, k: number, records: readonly WorkerGroupRecord[]): WorkerGroupRecord {
  const n = run.blockIds.length * k;
  const partials = new Map<string, BigUint64Array>();
  let r = 0;
  let skipped = false;
  for (let i = 0; i < run.blockIds.length; i++) {
    if (run.mask !== undefined && run.mask[i] === 0) continue;
    for (let s = 0; s < k; s++, r++) {
      const rec = records[r];
      if (rec.skipped) skipped = true;
      for (const [key, v] of rec.partials) {
        let out = partials.get(key);
        if (!out) partials.set(key, (out = new BigUint64Array(n)));
        out[i * k + s] = v[0];
      }
    }
  }
  return { start: run.start * k, nBlocks: n, skipped, partials };
}

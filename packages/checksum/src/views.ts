/**
 * Cache views (SPEC 2-4): how a rank's physical KV cache memory maps onto the logical view the
 * checksum is defined on. A view never copies memory; it names a region (an index into the rank's
 * list of registered memory regions) and byte offsets and strides inside it.
 *
 * Attention-like caches are viewed as `[numBlocks, localHeads, blockSize, cellBytes]` where a
 * cell is the token's K bytes then its V bytes for one head (MLA and indexer caches: the one
 * vector). State caches (Mamba, GDN) are lists of state tensors per block.
 *
 * All sizes are in bytes unless they say tokens, heads, rows or elements. Strides may be any
 * non-negative byte counts (no alignment required).
 * @module
 */
import { DTYPE_BYTES, type Dtype } from './types.js';

/**
 * One contiguous run of each cell's bytes: the K bytes, the V bytes, or the whole cell.
 * Byte `b` of this part for (block, head h, token t) is at
 * `offset + block*blockStride + floor(t/kernelBlockTokens)*kernelBlockStride
 *  + (t mod kernelBlockTokens)*tokenStride + h*headStride + b` in region `region`.
 */
export interface AttentionPart {
  region: number;
  offset: number;
  /** Bytes of this part in each cell. */
  bytes: number;
  blockStride: number;
  headStride: number;
  tokenStride: number;
  /** Tokens per kernel block when the attention kernel subdivides a block (default: blockSize). */
  kernelBlockTokens?: number;
  /** Bytes between the kernel blocks of one block (used only with kernelBlockTokens < blockSize). */
  kernelBlockStride?: number;
}

/**
 * How the TP ranks hold a cache's heads (SPEC 1, replicas R):
 * - a number: R consecutive ranks hold the same heads (vLLM's `max_tp_shards` semantics);
 * - `'all'`: every rank holds the whole cache (MLA latent, indexer): R = tpSize;
 * - `{ totalKvHeads }`: infer R from the model's KV head count: R = 1 if
 *   `totalKvHeads >= tpSize`, else `tpSize / totalKvHeads` (GQA with fewer KV heads than ranks).
 * Default: 1 (sharded heads).
 */
export type Replication = number | 'all' | { totalKvHeads: number };

/** A token-based cache: full or sliding-window attention, MLA latent, indexer (SPEC 2). */
export interface AttentionCacheView {
  kind: 'attention';
  /** The layer name, e.g. `model.layers.7.self_attn.attn` (SPEC 4). */
  name: string;
  /** Other layers that share this cache (KV sharing); the cache counts once (SPEC 4). */
  aliases?: readonly string[];
  dtype: Dtype;
  numBlocks: number;
  /** Tokens per block. */
  blockSize: number;
  /** Heads this rank holds (MLA/indexer: 1). */
  localHeads: number;
  /** The cell's parts, in cell order (K then V, or the whole cell). */
  parts: readonly AttentionPart[];
  replication?: Replication;
}

/** The TP split of one state (SPEC 3): `segments` partition dimension `axis`, in order. */
export interface StateSplit {
  axis: number;
  /** `[localSize, R]` per segment: rows this rank holds, and the segment's replicas. */
  segments: ReadonlyArray<readonly [number, number]>;
}

/** One state tensor of a state cache, per block. */
export interface StateTensor {
  dtype: Dtype;
  /** Local shape (this rank's), without the block dimension. */
  shape: readonly number[];
  region: number;
  /** Bytes to element 0 of block 0. */
  offset: number;
  blockStride: number;
  /** Byte strides per dim; default row-major contiguous. */
  strides?: readonly number[];
  /** TP split declaration; omit for a layer without one (then give none for any state). */
  split?: StateSplit;
}

/** A Mamba/GDN-like state cache (SPEC 3). States in page order; only the first two are covered. */
export interface StateCacheView {
  kind: 'state';
  name: string;
  aliases?: readonly string[];
  numBlocks: number;
  states: readonly StateTensor[];
}

/** Any cache view. */
export type CacheView = AttentionCacheView | StateCacheView;

/** Row-major contiguous byte strides of `shape` with element size `elemBytes`. */
export function contiguousStrides(shape: readonly number[], elemBytes: number): number[] {
  const strides = new Array<number>(shape.length);
  let s = elemBytes;
  for (let d = shape.length - 1; d >= 0; d--) {
    strides[d] = s;
    s *= shape[d];
  }
  return strides;
}

/** Where a tensor starts: a region index and a byte offset in it. */
export interface Place {
  region: number;
  offset?: number;
}

/**
 * Options of {@link pagedAttentionCache}: a standard paged K/V cache of one layer.
 * `kvLayout` says how K and V are stored:
 * - `'kv-first'`: one tensor `[2, numBlocks, ...block]` (vLLM FlashAttention), K half first;
 * - `'block-kv'`: one tensor `[numBlocks, 2, ...block]` (vLLM FlashInfer);
 * - `'separate'`: two tensors `[numBlocks, ...block]`, at `k` and `v`.
 * `layout` orders a block: `'NHD'` = `[blockSize, heads, headSize]`, `'HND'` =
 * `[heads, blockSize, headSize]`. With `kernelBlockSize` the block is stored as
 * `blockSize / kernelBlockSize` kernel blocks of that layout.
 */
export interface PagedAttentionOptions {
  name: string;
  aliases?: readonly string[];
  dtype: Dtype;
  numBlocks: number;
  blockSize: number;
  /** KV heads on this rank. */
  numHeads: number;
  /** Elements per head for K (and V, unless `vHeadSize`). */
  headSize: number;
  vHeadSize?: number;
  layout: 'NHD' | 'HND';
  kvLayout: 'kv-first' | 'block-kv' | 'separate';
  /** Where the tensor starts (`kv-first`, `block-kv`), or K's tensor (`separate`). */
  at: Place;
  /** V's tensor (`separate` only). */
  v?: Place;
  kernelBlockSize?: number;
  replication?: Replication;
}

/**
 * A paged attention cache in one of the common physical layouts (see {@link PagedAttentionOptions}).
 * @throws RangeError for non-positive sizes or a kernel block size that does not divide blockSize.
 */
export function pagedAttentionCache(o: PagedAttentionOptions): AttentionCacheView {
  const eb = DTYPE_BYTES[o.dtype];
  if (eb === undefined) throw new RangeError(`unknown dtype ${String(o.dtype)}`);
  for (const [k, v] of [['numBlocks', o.numBlocks], ['blockSize', o.blockSize], ['numHeads', o.numHeads], ['headSize', o.headSize]] as const) {
    if (!Number.isSafeInteger(v) || v <= 0) throw new RangeError(`${k} must be a positive integer, got ${v}`);
  }
  const kb = o.kernelBlockSize ?? o.blockSize;
  if (!(Number.isSafeInteger(kb) && kb > 0 && o.blockSize % kb === 0)) throw new RangeError(`kernelBlockSize ${kb} must divide blockSize ${o.blockSize}`);
  const kBytes = o.headSize * eb;
  const vBytes = (o.vHeadSize ?? o.headSize) * eb;
  const H = o.numHeads;
  const B = o.blockSize;
  // Per-half geometry (K or V), for a half whose head vector is `hb` bytes.
  const half = (hb: number) => {
    const kblock = H * kb * hb; // bytes of one kernel block
    return o.layout === 'NHD'
      ? { headStride: hb, tokenStride: H * hb, kernelBlockStride: kblock, bytesPerBlock: B * H * hb }
      : { headStride: kb * hb, tokenStride: hb, kernelBlockStride: kblock, bytesPerBlock: B * H * hb };
  };
  const gk = half(kBytes);
  const gv = half(vBytes);
  const base = o.at.offset ?? 0;
  let kPart: AttentionPart;
  let vPart: AttentionPart;
  const common = (g: ReturnType<typeof half>) => ({
    headStride: g.headStride,
    tokenStride: g.tokenStride,
    kernelBlockTokens: kb,
    kernelBlockStride: g.kernelBlockStride,
  });
  if (o.kvLayout === 'kv-first') {
    if (kBytes !== vBytes) throw new RangeError('kv-first needs equal K and V head sizes');
    kPart = { region: o.at.region, offset: base, bytes: kBytes, blockStride: gk.bytesPerBlock, ...common(gk) };
    vPart = { region: o.at.region, offset: base + o.numBlocks * gk.bytesPerBlock, bytes: vBytes, blockStride: gv.bytesPerBlock, ...common(gv) };
  } else if (o.kvLayout === 'block-kv') {
    if (kBytes !== vBytes) throw new RangeError('block-kv needs equal K and V head sizes');
    const stride = gk.bytesPerBlock + gv.bytesPerBlock;
    kPart = { region: o.at.region, offset: base, bytes: kBytes, blockStride: stride, ...common(gk) };
    vPart = { region: o.at.region, offset: base + gk.bytesPerBlock, bytes: vBytes, blockStride: stride, ...common(gv) };
  } else {
    if (!o.v) throw new RangeError("kvLayout 'separate' needs the V tensor's place (v)");
    kPart = { region: o.at.region, offset: base, bytes: kBytes, blockStride: gk.bytesPerBlock, ...common(gk) };
    vPart = { region: o.v.region, offset: o.v.offset ?? 0, bytes: vBytes, blockStride: gv.bytesPerBlock, ...common(gv) };
  }
  return {
    kind: 'attention',
    name: o.name,
    aliases: o.aliases,
    dtype: o.dtype,
    numBlocks: o.numBlocks,
    blockSize: B,
    localHeads: H,
    parts: [kPart, vPart],
    replication: o.replication,
  };
}

/** Bytes a {@link pagedAttentionCache} with these options occupies in each of its tensors. */
export function pagedAttentionBytes(o: Pick<PagedAttentionOptions, 'dtype' | 'numBlocks' | 'blockSize' | 'numHeads' | 'headSize' | 'vHeadSize' | 'kvLayout'>): number {
  const eb = DTYPE_BYTES[o.dtype];
  const per = o.numBlocks * o.blockSize * o.numHeads * eb;
  const k = per * o.headSize;
  const v = per * (o.vHeadSize ?? o.headSize);
  return o.kvLayout === 'separate' ? Math.max(k, v) : k + v;
}

/**
 * A one-vector-per-token cache (MLA latent, indexer keys): tensor `[numBlocks, blockSize, width]`
 * (or with kernel blocks, `[numBlocks * blockSize/kb, kb, width]`, the same bytes). Held whole by
 * every TP rank unless `replication` says otherwise (SPEC 1: MLA caches have R = tpSize).
 */
export function vectorCache(o: {
  name: string;
  aliases?: readonly string[];
  dtype: Dtype;
  numBlocks: number;
  blockSize: number;
  /** Elements per token. */
  width: number;
  at: Place;
  replication?: Replication;
}): AttentionCacheView {
  const eb = DTYPE_BYTES[o.dtype];
  const cell = o.width * eb;
  return {
    kind: 'attention',
    name: o.name,
    aliases: o.aliases,
    dtype: o.dtype,
    numBlocks: o.numBlocks,
    blockSize: o.blockSize,
    localHeads: 1,
    parts: [{ region: o.at.region, offset: o.at.offset ?? 0, bytes: cell, blockStride: o.blockSize * cell, headStride: 0, tokenStride: cell }],
    replication: o.replication ?? 'all',
  };
}

/**
 * A contiguous logical view `[numBlocks, localHeads, blockSize, cellBytes]` in one region, the
 * form the conformance vectors give a rank's data in.
 */
export function logicalAttentionCache(o: {
  name: string;
  dtype: Dtype;
  numBlocks: number;
  blockSize: number;
  localHeads: number;
  cellBytes: number;
  at: Place;
  replication?: Replication;
}): AttentionCacheView {
  const c = o.cellBytes;
  return {
    kind: 'attention',
    name: o.name,
    dtype: o.dtype,
    numBlocks: o.numBlocks,
    blockSize: o.blockSize,
    localHeads: o.localHeads,
    parts: [{ region: o.at.region, offset: o.at.offset ?? 0, bytes: c, blockStride: o.localHeads * o.blockSize * c, headStride: o.blockSize * c, tokenStride: c }],
    replication: o.replication,
  };
}

// ---------------------------------------------------------------------------------------------
// State layers: shapes and TP split declarations (upstream MambaStateShapeCalculator and
// MambaStateSplit, seed commit "Mamba state").
// ---------------------------------------------------------------------------------------------

/** Local shapes and splits of a state layer's covered states, in page order (conv, ssm). */
export interface StateLayout {
  states: Array<{ dtype: Dtype; shape: number[]; split: StateSplit }>;
}

/**
 * Mamba2 state shapes at a TP size. conv: `[convDim, convKernel - 1]` (dim-first) or transposed,
 * with `convDim = intermediate/tp + 2 * groupRows` rows in segments `[x, B, C]`; ssm:
 * `[numHeads/tp, headDim, dState]` split by heads. B and C: with `nGroups % tp == 0` each rank holds
 * `nGroups/tp` groups (R = 1); with `tp % nGroups == 0` each holds one group and `tp/nGroups` ranks
 * share it (vLLM replicates the groups, e.g. n_groups = 1 replicates B and C on every rank).
 * @returns null when the TP size does not divide the sizes (the layer then has no split).
 */
export function mamba2StateLayout(o: {
  tpSize: number;
  intermediateSize: number;
  nGroups: number;
  dState: number;
  convKernel: number;
  numHeads: number;
  headDim: number;
  convDimFirst: boolean;
  convDtype: Dtype;
  ssmDtype: Dtype;
}): StateLayout | null {
  const tp = o.tpSize;
  if (o.intermediateSize % tp !== 0 || o.numHeads % tp !== 0) return null;
  let groupRows: number;
  let groupR: number;
  if (o.nGroups % tp === 0) {
    groupRows = (o.nGroups / tp) * o.dState;
    groupR = 1;
  } else if (tp % o.nGroups === 0) {
    groupRows = o.dState;
    groupR = tp / o.nGroups;
  } else {
    return null;
  }
  const x = o.intermediateSize / tp;
  const convDim = x + 2 * groupRows;
  const w = o.convKernel - 1;
  const segments: Array<[number, number]> = [[x, 1], [groupRows, groupR], [groupRows, groupR]];
  return {
    states: [
      {
        dtype: o.convDtype,
        shape: o.convDimFirst ? [convDim, w] : [w, convDim],
        split: { axis: o.convDimFirst ? 0 : 1, segments },
      },
      { dtype: o.ssmDtype, shape: [o.numHeads / tp, o.headDim, o.dState], split: { axis: 0, segments: [[o.numHeads / tp, 1]] } },
    ],
  };
}

/**
 * Mamba1 state shapes: conv `[intermediate/tp, convKernel-1]` (segment `[x]`), ssm
 * `[intermediate/tp, dState]` split by channels. @returns null when tp does not divide.
 */
export function mamba1StateLayout(o: { tpSize: number; intermediateSize: number; dState: number; convKernel: number; convDimFirst: boolean; convDtype: Dtype; ssmDtype: Dtype }): StateLayout | null {
  if (o.intermediateSize % o.tpSize !== 0) return null;
  const x = o.intermediateSize / o.tpSize;
  const w = o.convKernel - 1;
  return {
    states: [
      { dtype: o.convDtype, shape: o.convDimFirst ? [x, w] : [w, x], split: { axis: o.convDimFirst ? 0 : 1, segments: [[x, 1]] } },
      { dtype: o.ssmDtype, shape: [x, o.dState], split: { axis: 0, segments: [[x, 1]] } },
    ],
  };
}

/**
 * Gated delta net state shapes: conv rows `[Q, K, V]` = `[kHeads*headKDim, kHeads*headKDim,
 * vHeads*headVDim] / tp`, temporal `[vHeads/tp, headKDim, headVDim]` split by value heads.
 * @returns null when tp does not divide the head counts.
 */
export function gdnStateLayout(o: { tpSize: number; numKHeads: number; numVHeads: number; headKDim: number; headVDim: number; convKernel: number; convDimFirst: boolean; convDtype: Dtype; ssmDtype: Dtype }): StateLayout | null {
  const tp = o.tpSize;
  if (o.numKHeads % tp !== 0 || o.numVHeads % tp !== 0) return null;
  const q = (o.numKHeads / tp) * o.headKDim;
  const v = (o.numVHeads / tp) * o.headVDim;
  const conv = 2 * q + v;
  const w = o.convKernel - 1;
  return {
    states: [
      { dtype: o.convDtype, shape: o.convDimFirst ? [conv, w] : [w, conv], split: { axis: o.convDimFirst ? 0 : 1, segments: [[q, 1], [q, 1], [v, 1]] } },
      { dtype: o.ssmDtype, shape: [o.numVHeads / tp, o.headKDim, o.headVDim], split: { axis: 0, segments: [[o.numVHeads / tp, 1]] } },
    ],
  };
}

/**
 * A state cache whose states are packed from the start of each block's page, in order (vLLM's
 * Mamba page: conv, ssm, then extra states), each row-major contiguous. `pageBytes` is the block
 * stride (>= the sum of the states' bytes; padding is not covered). Pass `withSplits: false` for a
 * layer without a split declaration.
 */
export function pagedStateCache(o: {
  name: string;
  aliases?: readonly string[];
  numBlocks: number;
  at: Place;
  pageBytes: number;
  layout: StateLayout;
  withSplits?: boolean;
  /** States after the covered ones (not summed), to place them in the page. */
  extraStates?: Array<{ dtype: Dtype; shape: number[] }>;
}): StateCacheView {
  let off = o.at.offset ?? 0;
  const states: StateTensor[] = [];
  for (const s of [...o.layout.states, ...(o.extraStates ?? [])]) {
    const eb = DTYPE_BYTES[s.dtype];
    const bytes = s.shape.reduce((a, b) => a * b, 1) * eb;
    const split = 'split' in s && o.withSplits !== false ? (s as { split: StateSplit }).split : undefined;
    states.push({ dtype: s.dtype, shape: s.shape, region: o.at.region, offset: off, blockStride: o.pageBytes, split });
    off += bytes;
  }
  if (off - (o.at.offset ?? 0) > o.pageBytes) throw new RangeError(`states need ${off} bytes, page has ${o.pageBytes}`);
  return { kind: 'state', name: o.name, aliases: o.aliases, numBlocks: o.numBlocks, states };
}

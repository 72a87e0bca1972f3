/**
 * Planning: turns one rank's cache views of a KV cache group into the group's checksum plan
 * (SPEC 2-5): layer numbers, head offsets, replica keys, the fingerprint, and the table of
 * `kvc_entry` records every backend sums (`native/include/kvc_checksum.h`).
 *
 * A geometry the SPEC does not cover is never summed: the plan says `skipped` with a reason code.
 * @module
 */
import { createHash } from 'node:crypto';
import { ENTRY_ATTN, ENTRY_BYTES, ENTRY_ROWS, ENTRY_STREAM, type PackedTables } from './backend.js';
import { ReplicaCountError, replicaCount } from './replicas.js';
import { DTYPE_BYTES, isDtype, replicaKeyString, type GroupKind, type ReplicaKey } from './types.js';
import { contiguousStrides, type AttentionCacheView, type CacheView, type StateCacheView, type StateTensor } from './views.js';

/** Slices per layer (SPEC 2): `m = 2 * (layer * 65536 + g) + 1`. */
export const HEADS_PER_LAYER = 65536;

/** Codes of the reasons a rank skips a group. */
export type SkipReason =
  | 'layer-name' // no, or more than one, all-digit component (SPEC 4)
  | 'layer-module' // one layer number in two modules (SPEC 4)
  | 'dtype' // a dtype outside SPEC 5's list
  | 'cell-bytes' // cellBytes not a multiple of 8 (SPEC 2)
  | 'replicas' // R unknown or not dividing tpSize (SPEC 1)
  | 'too-many-heads' // headOffset + global heads/rows > 65536 (SPEC 2, 3)
  | 'mixed-kinds' // attention and state caches, or split and unsplit states, in one group
  | 'block-size' // caches of the group disagree on the block size
  | 'state-split' // a split that does not partition its axis, or R not dividing tpSize (SPEC 3)
  | 'state-width' // a split state whose element width is not 2 or 4 (SPEC 3)
  | 'state-layout' // a state without a split that is not contiguous, or whose bytes are not 8k (SPEC 3)
  | 'state-rank' // a split state with more than 3 dims besides its axis
  | 'invalid-view'; // a view that contradicts itself (sizes, regions)

/** One decoded `kvc_entry` (field names as in the C header). */
export interface Entry {
  kind: number;
  region: number;
  column: number;
  offset: number;
  factorBase: bigint;
  blockStride: number;
  outerStride: number;
  kblockStride: number;
  tokenStride: number;
  elemStride: [number, number, number];
  elemCount: [number, number, number];
  outerCount: number;
  kblockTokens: number;
  byteStart: number;
  byteCount: number;
  cellPieces: number;
  elemBytes: number;
  numBlocks: number;
  blockTokens: number;
}

/** The role of the rank: a producer sums replica 0 only, a consumer every replica it holds (SPEC 2). */
export type Role = 'producer' | 'consumer';

/** Where a rank sits. */
export interface RankContext {
  tpRank: number;
  tpSize: number;
  role: Role;
}

/** The caches of one KV cache group on one rank (one PP stage's layers; may be empty). */
export interface GroupSpec {
  groupId: number;
  caches: readonly CacheView[];
}

/** A cache as the plan covers it. */
export interface PlannedCache {
  /** The name it counts under (lowest (layer number, name) over the cache and its aliases). */
  name: string;
  layer: number;
  /** SPEC 4 head offset within its layer module. */
  headOffset: number;
  /** SPEC 5 identity text and its fingerprint. */
  identity: string;
  fingerprint: bigint;
}

/** One rank's plan for one group. */
export interface GroupPlan {
  groupId: number;
  /** Null when the rank holds no cache of the group (e.g. a PP stage without its layers). */
  kind: GroupKind | null;
  /** Tokens per block (attention); 0 for state groups and empty plans. */
  blockSize: number;
  /** Why the rank cannot cover the group, or null. */
  skipReason: SkipReason | null;
  /** Human detail for the skip reason. */
  skipDetail?: string;
  /** Sum of this rank's caches' fingerprints (SPEC 5); the group's is the sum over PP stages. */
  fingerprint: bigint;
  caches: PlannedCache[];
  /** Output columns: the replica keys this rank sums, in column order. */
  columns: ReplicaKey[];
  entries: Entry[];
}

class Skip extends Error {
  constructor(
    readonly reason: SkipReason,
    detail: string,
  ) {
    super(detail);
  }
}

/**
 * The layer number and module of a layer name (SPEC 4): the one all-digit dot-separated
 * component, and the name up to and including it. `model.layers.7.self_attn.attn` ->
 * `{ layer: 7, module: 'model.layers.7' }`.
 * @returns null when the name has no such component, or more than one.
 */
export function parseLayerName(name: string): { layer: number; module: string } | null {
  const parts = name.split('.');
  let at = -1;
  for (let i = 0; i < parts.length; i++) {
    if (/^[0-9]+$/.test(parts[i])) {
      if (at >= 0) return null;
      at = i;
    }
  }
  if (at < 0) return null;
  const layer = Number(parts[at]);
  if (!Number.isSafeInteger(layer)) return null;
  return { layer, module: parts.slice(0, at + 1).join('.') };
}

/**
 * SPEC 5: the first 8 bytes of SHA-256 of the UTF-8 identity text, as a LE uint64.
 * @param identity the identity array; its text is `JSON.stringify(identity)`.
 */
export function fingerprintOf(identity: unknown[]): bigint {
  return fingerprintOfText(JSON.stringify(identity));
}

/** {@link fingerprintOf} on the identity's JSON text. */
export function fingerprintOfText(text: string): bigint {
  const d = createHash('sha256').update(text, 'utf8').digest();
  return d.readBigUInt64LE(0);
}

/** Largest value of a `kvc_entry` uint32 field (counts, block ids). */
const U32_MAX = 0xffffffff;

function checkInt(v: unknown, what: string, min = 0, max = Number.MAX_SAFE_INTEGER): number {
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min || v > max) throw new Skip('invalid-view', `${what} must be an integer in [${min}, ${max}], got ${String(v)}`);
  return v;
}

/** The cache's counting name and layer (SPEC 4 aliases). */
function canonical(c: CacheView): { name: string; layer: number; module: string } {
  let best: { name: string; layer: number; module: string } | null = null;
  for (const n of [c.name, ...(c.aliases ?? [])]) {
    const p = parseLayerName(n);
    if (!p) throw new Skip('layer-name', `layer name ${JSON.stringify(n)} has no single all-digit component`);
    if (!best || p.layer < best.layer || (p.layer === best.layer && n < best.name)) best = { name: n, ...p };
  }
  return best!;
}

/** What identifies a cache's memory and geometry (for KV-sharing duplicates). */
function memoryOf(c: CacheView): unknown {
  return c.kind === 'attention' ? [c.dtype, c.numBlocks, c.blockSize, c.localHeads, c.parts, c.replication ?? 1] : [c.numBlocks, c.states];
}

/** R of a cache (SPEC 1, {@link replicaCount}); a geometry it cannot tell skips the group (`replicas`). */
function resolveReplicas(c: AttentionCacheView, tpSize: number): number {
  try {
    return replicaCount(c, tpSize);
  } catch (e) {
    if (e instanceof ReplicaCountError) throw new Skip('replicas', e.message);
    throw e;
  }
}

function columnOf(columns: ReplicaKey[], key: ReplicaKey): number {
  const s = replicaKeyString(key);
  let i = columns.findIndex((k) => replicaKeyString(k) === s);
  if (i < 0) {
    columns.push(key);
    i = columns.length - 1;
  }
  return i;
}

/**
 * A `kvc_entry` of `kind` with every field at its neutral value (counts 1 for element dims, all
 * else 0), overridden by `fields`. For building tables by hand (tests, tools); the planner fills
 * every field it uses.
 */
export function makeEntry(kind: number, fields: Partial<Entry> = {}): Entry {
  return {
    kind,
    region: 0,
    column: 0,
    offset: 0,
    factorBase: 0n,
    blockStride: 0,
    outerStride: 0,
    kblockStride: 0,
    tokenStride: 0,
    elemStride: [0, 0, 0],
    elemCount: [1, 1, 1],
    outerCount: 1,
    kblockTokens: 0,
    byteStart: 0,
    byteCount: 0,
    cellPieces: 0,
    elemBytes: 0,
    numBlocks: 0,
    blockTokens: 0,
    ...fields,
  };
}

/** Global heads (attention) or global rows (split state) a cache occupies in its module (SPEC 4). */
function globalSize(c: CacheView, tpSize: number): number {
  if (c.kind === 'attention') return (c.localHeads * tpSize) / resolveReplicas(c, tpSize);
  const covered = c.states.slice(0, 2);
  if (!covered.some((s) => s.split)) return tpSize; // one slice per rank (SPEC 3, last paragraph)
  let rows = 0;
  for (const s of covered) {
    for (const [local, R] of s.split?.segments ?? []) rows += (local * tpSize) / R;
  }
  return rows;
}

/**
 * Plans one group on one rank: SPEC 2-5. Never throws for a view the SPEC does not cover; such a
 * group comes back with `skipReason` set and no entries.
 * @throws RangeError only for an invalid rank context (tpRank outside [0, tpSize)).
 */
export function planGroup(spec: GroupSpec, rank: RankContext): GroupPlan {
  if (!(Number.isSafeInteger(rank.tpSize) && rank.tpSize >= 1 && Number.isSafeInteger(rank.tpRank) && rank.tpRank >= 0 && rank.tpRank < rank.tpSize)) {
    throw new RangeError(`bad rank: tpRank ${rank.tpRank} of tpSize ${rank.tpSize}`);
  }
  const plan: GroupPlan = { groupId: spec.groupId, kind: null, blockSize: 0, skipReason: null, fingerprint: 0n, caches: [], columns: [], entries: [] };
  if (spec.caches.length === 0) return plan;
  try {
    fillPlan(plan, spec, rank);
  } catch (e) {
    if (!(e instanceof Skip)) throw e;
    plan.skipReason = e.reason;
    plan.skipDetail = e.message;
    plan.entries = [];
    plan.columns = [];
    plan.caches = [];
    plan.fingerprint = 0n;
  }
  return plan;
}

function fillPlan(plan: GroupPlan, spec: GroupSpec, rank: RankContext): void {
  const { tpSize } = rank;
  // Kind of the group.
  const kinds = new Set<GroupKind>();
  for (const c of spec.caches) {
    if (c.kind === 'attention') kinds.add('attention');
    else {
      const covered = c.states.slice(0, 2);
      if (covered.length === 0) throw new Skip('invalid-view', `${c.name}: a state cache without states`);
      const nSplit = covered.filter((s) => s.split).length;
      if (nSplit !== 0 && nSplit !== covered.length) throw new Skip('mixed-kinds', `${c.name}: some covered states declare a TP split, some do not`);
      kinds.add(nSplit ? 'state' : 'state-local');
    }
  }
  if (kinds.size !== 1) throw new Skip('mixed-kinds', `group ${spec.groupId} mixes ${[...kinds].join(' and ')} caches`);
  plan.kind = [...kinds][0];

  // Layer numbers, modules, head offsets (SPEC 4). A cache listed twice (the same view, or one
  // view per layer of a KV-sharing set, each naming the others as aliases) counts once.
  const named: Array<{ c: CacheView; name: string; layer: number; module: string }> = [];
  for (const c of spec.caches) {
    const n = { c, ...canonical(c) };
    const seen = named.find((x) => x.name === n.name);
    if (!seen) named.push(n);
    else if (seen.c !== c && JSON.stringify(memoryOf(seen.c)) !== JSON.stringify(memoryOf(c))) {
      throw new Skip('invalid-view', `two different caches count under ${n.name} (KV sharing must name one cache)`);
    }
  }
  const moduleOfLayer = new Map<number, string>();
  for (const n of named) {
    const m = moduleOfLayer.get(n.layer);
    if (m !== undefined && m !== n.module) throw new Skip('layer-module', `layer ${n.layer} appears in modules ${m} and ${n.module}`);
    moduleOfLayer.set(n.layer, n.module);
  }
  named.sort((a, b) => (a.module === b.module ? (a.name < b.name ? -1 : a.name > b.name ? 1 : 0) : a.layer - b.layer));
  const offsets = new Map<string, number>(); // module -> next head offset
  for (const n of named) {
    const headOffset = offsets.get(n.module) ?? 0;
    const size = globalSize(n.c, tpSize);
    if (headOffset + size > HEADS_PER_LAYER) throw new Skip('too-many-heads', `${n.name}: head offset ${headOffset} + ${size} exceeds ${HEADS_PER_LAYER}`);
    offsets.set(n.module, headOffset + size);
    const identity =
      n.c.kind === 'attention' ? planAttention(plan, n.c, n.name, n.layer, headOffset, rank) : planState(plan, n.c, n.name, n.layer, headOffset, rank);
    const text = JSON.stringify(identity);
    const fp = fingerprintOfText(text);
    plan.caches.push({ name: n.name, layer: n.layer, headOffset, identity: text, fingerprint: fp });
    plan.fingerprint = BigInt.asUintN(64, plan.fingerprint + fp);
  }
}

function planAttention(plan: GroupPlan, c: AttentionCacheView, name: string, layer: number, headOffset: number, rank: RankContext): unknown[] {
  if (!isDtype(c.dtype)) throw new Skip('dtype', `${c.name}: dtype ${String(c.dtype)}`);
  const nb = checkInt(c.numBlocks, `${c.name}.numBlocks`, 1, U32_MAX);
  const B = checkInt(c.blockSize, `${c.name}.blockSize`, 1, U32_MAX);
  const H = checkInt(c.localHeads, `${c.name}.localHeads`, 1, U32_MAX);
  if (plan.blockSize !== 0 && plan.blockSize !== B) throw new Skip('block-size', `${c.name}: block size ${B} != ${plan.blockSize}`);
  plan.blockSize = B;
  if (c.parts.length === 0) throw new Skip('invalid-view', `${c.name}: no parts`);
  let cellBytes = 0;
  for (const p of c.parts) cellBytes += checkInt(p.bytes, `${c.name}.parts.bytes`, 1);
  if (cellBytes % 8 !== 0) throw new Skip('cell-bytes', `${c.name}: cell of ${cellBytes} bytes is not whole 8-byte pieces`);
  const R = resolveReplicas(c, rank.tpSize);
  const globalHeads = (H * rank.tpSize) / R;
  const replica = rank.tpRank % R;
  const shard = Math.floor(rank.tpRank / R);
  if (rank.role === 'consumer' || replica === 0) {
    const column = columnOf(plan.columns, { replicas: R, replica });
    const factorBase = BigInt(layer) * BigInt(HEADS_PER_LAYER) + BigInt(headOffset + shard * H);
    let byteStart = 0;
    for (const p of c.parts) {
      const kbt = p.kernelBlockTokens ?? B;
      if (!(Number.isSafeInteger(kbt) && kbt >= 1 && B % kbt === 0)) throw new Skip('invalid-view', `${c.name}: kernel block of ${kbt} tokens does not divide ${B}`);
      const e = makeEntry(ENTRY_ATTN);
      e.region = checkInt(p.region, 'region');
      e.column = column;
      e.offset = checkInt(p.offset, 'offset');
      e.factorBase = factorBase;
      e.blockStride = checkInt(p.blockStride, 'blockStride');
      e.outerStride = checkInt(p.headStride, 'headStride');
      e.kblockStride = kbt === B ? 0 : checkInt(p.kernelBlockStride, 'kernelBlockStride');
      e.tokenStride = checkInt(p.tokenStride, 'tokenStride');
      e.outerCount = H;
      e.kblockTokens = kbt;
      e.byteStart = byteStart;
      e.byteCount = p.bytes;
      e.cellPieces = cellBytes / 8;
      e.numBlocks = nb;
      e.blockTokens = B;
      plan.entries.push(e);
      byteStart += p.bytes;
    }
  }
  return [name, 'attention', c.dtype, globalHeads, cellBytes];
}

function stateStrides(s: StateTensor): number[] {
  return s.strides ? [...s.strides] : contiguousStrides(s.shape, DTYPE_BYTES[s.dtype]);
}

function planState(plan: GroupPlan, c: StateCacheView, name: string, layer: number, headOffset: number, rank: RankContext): unknown[] {
  const nb = checkInt(c.numBlocks, `${c.name}.numBlocks`, 1, U32_MAX);
  const covered = c.states.slice(0, 2);
  for (const s of covered) {
    if (!isDtype(s.dtype)) throw new Skip('dtype', `${c.name}: dtype ${String(s.dtype)}`);
    if (s.shape.length === 0) throw new Skip('invalid-view', `${c.name}: a state of rank 0`);
    s.shape.forEach((d) => checkInt(d, `${c.name}.shape`, 1));
    if (s.strides && s.strides.length !== s.shape.length) throw new Skip('invalid-view', `${c.name}: ${s.strides.length} strides for ${s.shape.length} dims`);
  }
  if (plan.kind === 'state-local') {
    // One slice per TP rank: covered states' bytes concatenated (SPEC 3, last paragraph).
    const column = columnOf(plan.columns, { replicas: 1, replica: 0 });
    let streamBytes = 0;
    for (const s of covered) {
      const eb = DTYPE_BYTES[s.dtype];
      const dense = contiguousStrides(s.shape, eb);
      const st = stateStrides(s);
      if (st.some((v, i) => v !== dense[i] && s.shape[i] !== 1)) throw new Skip('state-layout', `${c.name}: a state without a split must be contiguous`);
      const bytes = s.shape.reduce((a, b) => a * b, 1) * eb;
      const e = makeEntry(ENTRY_STREAM);
      e.region = checkInt(s.region, 'region');
      e.column = column;
      e.offset = checkInt(s.offset, 'offset');
      e.blockStride = checkInt(s.blockStride, 'blockStride');
      e.factorBase = BigInt(layer) * BigInt(HEADS_PER_LAYER) + BigInt(headOffset + rank.tpRank);
      e.byteStart = streamBytes;
      e.byteCount = bytes;
      e.numBlocks = nb;
      plan.entries.push(e);
      streamBytes += bytes;
    }
    if (streamBytes % 8 !== 0) throw new Skip('state-layout', `${c.name}: ${streamBytes} state bytes are not whole 8-byte pieces`);
    return [name, 'state-local', covered.map((s) => [s.dtype, [...s.shape]])];
  }
  // TP-split states: global rows (SPEC 3).
  const identityStates: unknown[] = [];
  let segmentStart = headOffset;
  for (const s of covered) {
    const split = s.split!;
    const eb = DTYPE_BYTES[s.dtype];
    if (eb !== 2 && eb !== 4) throw new Skip('state-width', `${c.name}: ${s.dtype} elements are ${eb} bytes, not 2 or 4`);
    const axis = split.axis;
    if (!(Number.isSafeInteger(axis) && axis >= 0 && axis < s.shape.length)) throw new Skip('state-split', `${c.name}: axis ${axis} of a ${s.shape.length}-dim state`);
    let sumLocal = 0;
    for (const [local, R] of split.segments) {
      if (!(Number.isSafeInteger(local) && local >= 1 && Number.isSafeInteger(R) && R >= 1)) throw new Skip('state-split', `${c.name}: segment [${local}, ${R}]`);
      if (rank.tpSize % R !== 0) throw new Skip('state-split', `${c.name}: R=${R} does not divide TP size ${rank.tpSize}`);
      sumLocal += local;
    }
    if (split.segments.length === 0 || sumLocal !== s.shape[axis]) throw new Skip('state-split', `${c.name}: segments cover ${sumLocal} of ${s.shape[axis]} rows`);
    const st = stateStrides(s);
    const otherDims: number[] = [];
    const otherStrides: number[] = [];
    s.shape.forEach((d, i) => {
      if (i !== axis) {
        otherDims.push(d);
        otherStrides.push(st[i]);
      }
    });
    // Merge row-major contiguous element dims so any state fits in 3.
    const dims: Array<[number, number]> = [];
    for (let i = 0; i < otherDims.length; i++) {
      const last = dims[dims.length - 1];
      if (last && last[1] === otherStrides[i] * otherDims[i]) {
        last[0] *= otherDims[i];
        last[1] = otherStrides[i];
      } else dims.push([otherDims[i], otherStrides[i]]);
    }
    if (dims.length > 3) throw new Skip('state-rank', `${c.name}: ${dims.length} element dims`);
    while (dims.length < 3) dims.push([1, 0]);
    let localStart = 0;
    const globalSizes: number[] = [];
    for (const [local, R] of split.segments) {
      const replica = rank.tpRank % R;
      const shard = Math.floor(rank.tpRank / R);
      const global = (local * rank.tpSize) / R;
      if (rank.role === 'consumer' || replica === 0) {
        const e = makeEntry(ENTRY_ROWS);
        e.region = checkInt(s.region, 'region');
        e.column = columnOf(plan.columns, { replicas: R, replica });
        e.offset = checkInt(s.offset, 'offset') + localStart * st[axis];
        e.blockStride = checkInt(s.blockStride, 'blockStride');
        e.outerStride = st[axis];
        e.outerCount = local;
        e.elemCount = [dims[0][0], dims[1][0], dims[2][0]];
        e.elemStride = [dims[0][1], dims[1][1], dims[2][1]];
        e.elemBytes = eb;
        e.factorBase = BigInt(layer) * BigInt(HEADS_PER_LAYER) + BigInt(segmentStart + shard * local);
        e.numBlocks = nb;
        plan.entries.push(e);
      }
      localStart += local;
      segmentStart += global;
      globalSizes.push(global);
    }
    identityStates.push([s.dtype, globalSizes, otherDims]);
  }
  return [name, 'state', identityStates];
}

// ---------------------------------------------------------------------------------------------
// Packing (kvc_entry, 128 bytes LE)
// ---------------------------------------------------------------------------------------------

/** Writes `e` as a `kvc_entry` at byte `at` of `dv`. */
export function writeEntry(dv: DataView, at: number, e: Entry): void {
  const u64 = (o: number, v: number | bigint) => dv.setBigUint64(at + o, BigInt(v), true);
  u64(0, e.offset);
  u64(8, e.factorBase);
  u64(16, e.blockStride);
  u64(24, e.outerStride);
  u64(32, e.kblockStride);
  u64(40, e.tokenStride);
  for (let i = 0; i < 3; i++) u64(48 + 8 * i, e.elemStride[i]);
  for (let i = 0; i < 3; i++) dv.setUint32(at + 72 + 4 * i, e.elemCount[i], true);
  const u32 = [e.kind, e.region, e.column, e.outerCount, e.kblockTokens, e.byteStart, e.byteCount, e.cellPieces, e.elemBytes, e.numBlocks, e.blockTokens];
  u32.forEach((v, i) => dv.setUint32(at + 84 + 4 * i, v, true));
}

/** Reads the `kvc_entry` at byte `at` of `dv` (strides and offsets must be safe integers). */
export function readEntry(dv: DataView, at: number): Entry {
  const n = (o: number) => Number(dv.getBigUint64(at + o, true));
  const u32 = (i: number) => dv.getUint32(at + 84 + 4 * i, true);
  return {
    offset: n(0),
    factorBase: dv.getBigUint64(at + 8, true),
    blockStride: n(16),
    outerStride: n(24),
    kblockStride: n(32),
    tokenStride: n(40),
    elemStride: [n(48), n(56), n(64)],
    elemCount: [dv.getUint32(at + 72, true), dv.getUint32(at + 76, true), dv.getUint32(at + 80, true)],
    kind: u32(0),
    region: u32(1),
    column: u32(2),
    outerCount: u32(3),
    kblockTokens: u32(4),
    byteStart: u32(5),
    byteCount: u32(6),
    cellPieces: u32(7),
    elemBytes: u32(8),
    numBlocks: u32(9),
    blockTokens: u32(10),
  };
}

/** Packs several groups' entries into one table set (group `g` = `plans[g]`). */
export function packTables(plans: readonly GroupPlan[]): PackedTables {
  return packEntryGroups(plans.map((p) => p.entries));
}

/** Packs entry lists into one table set (group `g` = `groups[g]`), 128 bytes LE per entry. */
export function packEntryGroups(groups: ReadonlyArray<readonly Entry[]>): PackedTables {
  const total = groups.reduce((a, g) => a + g.length, 0);
  const entries = new Uint8Array(total * ENTRY_BYTES);
  const dv = new DataView(entries.buffer);
  const groupStart = new Uint32Array(groups.length + 1);
  let k = 0;
  groups.forEach((g, i) => {
    groupStart[i] = k;
    for (const e of g) writeEntry(dv, ENTRY_BYTES * k++, e);
  });
  groupStart[groups.length] = k;
  return { entries, groupStart, nGroups: groups.length };
}

/**
 * The lowest and one-past-highest byte an entry reads for block ids `< numBlocks` (the C
 * `kvc_entry_extent`). @throws RangeError for an entry with an invalid kind or zero counts.
 */
export function entryExtent(e: Entry): [number, number] {
  const last = e.numBlocks - 1;
  if (e.numBlocks < 1) throw new RangeError('entry with num_blocks 0');
  switch (e.kind) {
    case ENTRY_ATTN: {
      if (e.kblockTokens < 1 || e.blockTokens < 1 || e.outerCount < 1 || e.byteCount < 1) throw new RangeError('ATTN entry with zero counts');
      if (e.blockTokens % e.kblockTokens !== 0) throw new RangeError('ATTN entry: block_tokens is not a multiple of kblock_tokens');
      if (e.byteStart + e.byteCount > e.cellPieces * 8) throw new RangeError('ATTN entry: part past the cell');
      const lastT = e.blockTokens - 1;
      const hi =
        e.offset + last * e.blockStride + Math.floor(lastT / e.kblockTokens) * e.kblockStride + (lastT % e.kblockTokens) * e.tokenStride + (e.outerCount - 1) * e.outerStride + e.byteCount;
      return [e.offset, hi];
    }
    case ENTRY_ROWS: {
      if (e.outerCount < 1 || (e.elemBytes !== 2 && e.elemBytes !== 4) || e.elemCount.some((c) => c < 1) || e.blockTokens !== 0) throw new RangeError('ROWS entry with bad counts');
      let hi = e.offset + last * e.blockStride + (e.outerCount - 1) * e.outerStride + e.elemBytes;
      for (let i = 0; i < 3; i++) hi += (e.elemCount[i] - 1) * e.elemStride[i];
      return [e.offset, hi];
    }
    case ENTRY_STREAM:
      if (e.byteCount < 1 || e.outerCount !== 1 || e.blockTokens !== 0) throw new RangeError('STREAM entry with bad counts');
      return [e.offset, e.offset + last * e.blockStride + e.byteCount];
    default:
      throw new RangeError(`unknown entry kind ${e.kind}`);
  }
}

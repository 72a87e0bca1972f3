/**
 * Localizing a mismatch (issue #13, section 1): finer sums of a group's blocks, keyed by what they
 * cover in the model's terms instead of by block, so that a producer and a consumer of any TP/PP
 * size, block size and memory layout can compare them and say which layers, KV heads, K or V and
 * token ranges differ.
 *
 * A **fine sum** is the SPEC 2-3 block value restricted to one key: the sum of the contributions
 * `x * m * (2j + 1)` of the pieces of one (layer, global head, part of the cell, token range), with
 * the SPEC's own `m` (layer and global head) and `j` (request position), so that it is independent
 * of the layout exactly as the block values are, and the fine sums of a block add up to its block
 * value (the sum is linear). Keys:
 *
 * - attention: `layer` (SPEC 4 layer number, global across PP), `head` (SPEC 2 global head
 *   `g = headOffset + shard * localHeads + h`), `part` (`K`, `V` when the cache's cell has two parts,
 *   K then V; `KV` for a one-part cell such as MLA or a logical view; `P<i>` for more parts), and
 *   the token range `[tokenStart, tokenEnd)`: request positions `[k*W, (k+1)*W)` for a range width
 *   `W`, clipped to the load's tokens;
 * - split state (SPEC 3): `layer`, `head` = the global row, `part` = `conv` / `ssm` (the two covered
 *   states; `state` when only one is covered), `segment` = the segment index in its state (Mamba2
 *   conv: 0 x, 1 B, 2 C); tokens `[0, 0)`;
 * - state without a split: `layer`, `head` = the rank's slice (`headOffset + tpRank`), `part`
 *   `state-local`.
 *
 * Each fine sum carries the replica key `(R, r)` of the partial it belongs to (SPEC 2): a producer
 * sums replica 0 only, a consumer every replica it holds, and {@link compareFineSums} checks every
 * consumer copy against the producer's value.
 *
 * These functions read host memory only (`Uint8Array` regions), with the reference backend's piece
 * reader (`weightedPieces` in backend-ts.ts): they run only after a mismatch, never on the verified
 * path.
 * @module
 */
import { ENTRY_ATTN, ENTRY_ROWS, ENTRY_STREAM } from './backend.js';
import { memOf, weightedPieces, type Mem } from './backend-ts.js';
import { HEADS_PER_LAYER, type Entry, type GroupPlan } from './plan.js';

/** The part of a cell (attention) or of a state a fine sum covers (see the module comment). */
export type FinePart = 'K' | 'V' | 'KV' | `P${number}` | 'conv' | 'ssm' | 'state' | 'state-local';

/** One fine sum (see the module comment for the keys). Plain data. */
export interface FineSum {
  /** SPEC 4 layer number. */
  layer: number;
  /** Global KV head (attention), global row (split state) or slice (state without a split). */
  head: number;
  part: FinePart;
  /** Split states: the segment of the row in its state; -1 otherwise. */
  segment: number;
  /** First request position of the token range (attention); 0 for states. */
  tokenStart: number;
  /** One past the last request position of the range, clipped to the load (attention); 0 for states. */
  tokenEnd: number;
  /** Replica key `(R, r)` of the partial (SPEC 2). */
  replicas: number;
  replica: number;
  /** uint64. */
  value: bigint;
}

/** What to sum: one request's blocks of one group, and the tokens and range width to key them by. */
export interface FineRun {
  /** Physical block ids of block positions `start, start+1, ...` (state groups: the running-state block). */
  blockIds: ArrayLike<number>;
  /** Block position of `blockIds[0]` (state groups: 0). */
  start: number;
  /** The request's tokens whose KV the blocks hold (SPEC 2 numTokens). */
  numTokens: number;
  /** Request positions to cover: `[tokenStart, tokenEnd)` (attention; ignored for states). */
  tokenStart: number;
  tokenEnd: number;
  /** Token range width W >= 1 (attention; ignored for states). */
  rangeTokens: number;
}

/** A fine-sum input that cannot be summed (bad run, block ids outside the cache, device plan). */
export class LocalizeError extends Error {
  override readonly name: string = 'LocalizeError';
}

const u64 = (x: bigint): bigint => BigInt.asUintN(64, x);
const LAYER = BigInt(HEADS_PER_LAYER);

/** The attention part labels of a plan's entries, in entry order (K/V when a cell has two parts). */
function attentionParts(entries: readonly Entry[]): FinePart[] {
  const labels: FinePart[] = new Array(entries.length);
  let i = 0;
  while (i < entries.length) {
    const e = entries[i];
    if (e.kind !== ENTRY_ATTN) {
      i++;
      continue;
    }
    // One cache's parts: consecutive ATTN entries of one factor base and column, from byte 0.
    let j = i + 1;
    while (j < entries.length && entries[j].kind === ENTRY_ATTN && entries[j].factorBase === e.factorBase && entries[j].column === e.column && entries[j].byteStart > 0) j++;
    const n = j - i;
    for (let k = 0; k < n; k++) labels[i + k] = n === 1 ? 'KV' : n === 2 ? (k === 0 ? 'K' : 'V') : `P${k}`;
    i = j;
  }
  return labels;
}

/** The state and segment of global row `row` of `layer` (from the plan's SPEC 5 identities). */
function stateRow(plan: GroupPlan, layer: number, row: number): { part: FinePart; segment: number } {
  for (const c of plan.caches) {
    if (c.layer !== layer) continue;
    const id = JSON.parse(c.identity) as [string, string, Array<[string, number[], number[]]>];
    if (id[1] !== 'state') continue;
    const states = id[2];
    let at = c.headOffset;
    for (let s = 0; s < states.length; s++) {
      const sizes = states[s][1];
      for (let k = 0; k < sizes.length; k++) {
        if (row >= at && row < at + sizes[k]) return { part: states.length === 2 ? (s === 0 ? 'conv' : 'ssm') : 'state', segment: k };
        at += sizes[k];
      }
    }
  }
  return { part: 'state', segment: -1 };
}

/** Sum over a state row's elements of `x * (2j + 1)`, `j` = element index (SPEC 3), mod 2^64. */
function rowSum(e: Entry, mem: Mem, rowAddr: number): bigint {
  const [c0, c1, c2] = e.elemCount;
  const [s0, s1, s2] = e.elemStride;
  let acc = 0n;
  let j = 0;
  for (let a = 0; a < c0; a++) {
    for (let b = 0; b < c1; b++) {
      for (let c = 0; c < c2; c++, j++) {
        const at = rowAddr + a * s0 + b * s1 + c * s2;
        const x = e.elemBytes === 2 ? mem.dv.getUint16(at, true) : mem.dv.getUint32(at, true);
        acc += BigInt(x) * BigInt(2 * j + 1);
      }
    }
  }
  return u64(acc);
}

/**
 * The fine sums of one run of `plan`'s group (see the module comment), one per key and replica
 * key, in no particular order; keys with no valid token are absent.
 * @param plan the rank's plan of the group (`planGroup`; its role decides the replicas summed)
 * @param regions the rank's host memory regions the plan's entries index
 * @throws LocalizeError for a skipped plan, a run with bad numbers, block ids past the cache, or a
 *   region that is not host memory.
 */
export function fineSums(plan: GroupPlan, regions: readonly Uint8Array[], run: FineRun): FineSum[] {
  if (plan.skipReason !== null) throw new LocalizeError(`group ${plan.groupId} is skipped on this rank (${plan.skipReason})`);
  const W = run.rangeTokens;
  for (const [k, v] of [['start', run.start], ['numTokens', run.numTokens], ['tokenStart', run.tokenStart], ['tokenEnd', run.tokenEnd]] as const) {
    if (!(Number.isSafeInteger(v) && v >= 0)) throw new LocalizeError(`${k} must be a non-negative integer, got ${v}`);
  }
  if (!(Number.isSafeInteger(W) && W >= 1)) throw new LocalizeError(`rangeTokens must be a positive integer, got ${W}`);
  const mems = regions.map((r, i) => {
    if (!(r instanceof Uint8Array)) throw new LocalizeError(`region ${i} is not host memory`);
    return memOf(r);
  });
  const out = new Map<string, FineSum>();
  const add = (s: Omit<FineSum, 'value'>, v: bigint) => {
    const k = `${s.layer}|${s.head}|${s.part}|${s.segment}|${s.tokenStart}|${s.replicas}|${s.replica}`;
    const prev = out.get(k);
    if (prev) prev.value = u64(prev.value + v);
    else out.set(k, { ...s, value: u64(v) });
  };
  const labels = attentionParts(plan.entries);
  const isState = plan.kind === 'state' || plan.kind === 'state-local';
  if (isState && run.blockIds.length !== 1) throw new LocalizeError(`a state group sums one running-state block, got ${run.blockIds.length}`);
  plan.entries.forEach((e, ei) => {
    const mem = mems[e.region];
    if (!mem) throw new LocalizeError(`entry ${ei}: region ${e.region} of ${mems.length}`);
    const key = plan.columns[e.column];
    const layer = Number(e.factorBase / LAYER);
    const g0 = Number(e.factorBase % LAYER);
    for (let i = 0; i < run.blockIds.length; i++) {
      const block = run.blockIds[i];
      if (!(Number.isSafeInteger(block) && block >= 0 && block < e.numBlocks)) throw new LocalizeError(`block id ${block} outside the cache's ${e.numBlocks} blocks`);
      if (e.kind === ENTRY_ATTN) {
        const B = e.blockTokens;
        const first = (run.start + i) * B;
        const lo = Math.max(first, run.tokenStart);
        const hi = Math.min(first + B, run.numTokens, run.tokenEnd);
        const base = e.offset + block * e.blockStride;
        for (let tau = lo; tau < hi; tau++) {
          const t = tau - first;
          const k0 = Math.floor(tau / W) * W;
          const tokenEnd = Math.min(k0 + W, run.numTokens, run.tokenEnd);
          for (let h = 0; h < e.outerCount; h++) {
            const addr = base + Math.floor(t / e.kblockTokens) * e.kblockStride + (t % e.kblockTokens) * e.tokenStride + h * e.outerStride;
            const x = weightedPieces(mem, addr, e.byteStart, e.byteCount, tau * e.cellPieces);
            const m = u64(2n * (e.factorBase + BigInt(h)) + 1n);
            add({ layer, head: g0 + h, part: labels[ei], segment: -1, tokenStart: k0, tokenEnd, replicas: key.replicas, replica: key.replica }, x * m);
          }
        }
      } else if (e.kind === ENTRY_ROWS) {
        for (let r = 0; r < e.outerCount; r++) {
          const m = u64(2n * (e.factorBase + BigInt(r)) + 1n);
          const where = stateRow(plan, layer, g0 + r);
          add({ layer, head: g0 + r, part: where.part, segment: where.segment, tokenStart: 0, tokenEnd: 0, replicas: key.replicas, replica: key.replica }, rowSum(e, mem, e.offset + block * e.blockStride + r * e.outerStride) * m);
        }
      } else if (e.kind === ENTRY_STREAM) {
        const x = weightedPieces(mem, e.offset + block * e.blockStride, e.byteStart, e.byteCount, 0);
        add({ layer, head: g0, part: 'state-local', segment: -1, tokenStart: 0, tokenEnd: 0, replicas: key.replicas, replica: key.replica }, x * u64(2n * e.factorBase + 1n));
      }
    }
  });
  return [...out.values()];
}

/**
 * Reads `bytes` bytes at byte `offset` of region `region` (an index into the rank's regions) into
 * host memory; for {@link fineSumsWindowed}. Device memory: a device-to-host copy (e.g.
 * `@kvconnect/transfer`'s `DeviceMemory.copy(device, 'd2h', ...)`).
 */
export type RegionReader = (region: number, offset: number, bytes: number) => Uint8Array;

/** Bytes past an entry's block base that {@link fineSums} reads for one block (non-negative strides). */
function entryExtent(e: Entry): number {
  const strides = [e.outerStride, e.kblockStride, e.tokenStride, ...e.elemStride];
  if (strides.some((x) => x < 0)) throw new LocalizeError('a layout with negative strides cannot be read in windows');
  const outer = Math.max(0, e.outerCount - 1) * e.outerStride;
  if (e.kind === ENTRY_ATTN) {
    let t = 0;
    for (let tau = 0; tau < e.blockTokens; tau++) t = Math.max(t, Math.floor(tau / e.kblockTokens) * e.kblockStride + (tau % e.kblockTokens) * e.tokenStride);
    return outer + t + e.byteCount; // weightedPieces reads byteCount bytes at the address of byte byteStart
  }
  if (e.kind === ENTRY_ROWS) return outer + e.elemCount.reduce((a, c, i) => a + Math.max(0, c - 1) * e.elemStride[i], 0) + e.elemBytes;
  if (e.kind === ENTRY_STREAM) return e.byteCount;
  return 0;
}

/**
 * {@link fineSums} of a run whose regions need not be host memory (device KV): only the bytes of
 * the run's blocks are read, through `read`, one window per entry and block
 * (`[offset + block * blockStride, + extent)`, the extent being what the entry reads of a block),
 * and summed by {@link fineSums} over compact host copies. Equal to {@link fineSums} over the same
 * bytes in host memory.
 * @param regions the rank's regions (host or device); only their count is used here
 * @throws LocalizeError as {@link fineSums}, for a layout with negative strides, or when `read`
 *   returns another number of bytes than asked
 */
export function fineSumsWindowed(plan: GroupPlan, regions: readonly unknown[], run: FineRun, read: RegionReader): FineSum[] {
  if (plan.skipReason !== null) throw new LocalizeError(`group ${plan.groupId} is skipped on this rank (${plan.skipReason})`);
  const n = run.blockIds.length;
  const compact: Uint8Array[] = [];
  const entries = plan.entries.map((e, ei) => {
    if (e.region < 0 || e.region >= regions.length) throw new LocalizeError(`entry ${ei}: region ${e.region} of ${regions.length}`);
    const extent = entryExtent(e);
    const stride = Math.ceil(extent / 8) * 8;
    const buf = new Uint8Array(Math.max(8, stride * n));
    Array.from(run.blockIds).forEach((block, i) => {
      if (!(Number.isSafeInteger(block) && block >= 0 && block < e.numBlocks)) throw new LocalizeError(`block id ${block} outside the cache's ${e.numBlocks} blocks`);
      if (extent === 0) return;
      const got = read(e.region, e.offset + block * e.blockStride, extent);
      if (got.byteLength !== extent) throw new LocalizeError(`read of region ${e.region} returned ${got.byteLength} bytes, not ${extent}`);
      buf.set(got, i * stride);
    });
    compact.push(buf);
    return { ...e, region: ei, offset: 0, blockStride: stride, numBlocks: Math.max(1, n) };
  });
  return fineSums({ ...plan, entries }, compact, { ...run, blockIds: Array.from({ length: n }, (_, i) => i) });
}

/** The key of a fine sum without its replica key. */
function baseKey(s: Pick<FineSum, 'layer' | 'head' | 'part' | 'segment' | 'tokenStart'>): string {
  return `${s.layer}|${s.head}|${s.part}|${s.segment}|${s.tokenStart}`;
}

/**
 * Adds up fine sums of several workers (or steps): one fine sum per key and replica key, values
 * summed mod 2^64, `tokenEnd` the largest seen.
 */
export function mergeFineSums(lists: Iterable<readonly FineSum[]>): FineSum[] {
  const out = new Map<string, FineSum>();
  for (const list of lists) {
    for (const s of list) {
      const k = `${baseKey(s)}|${s.replicas}|${s.replica}`;
      const prev = out.get(k);
      if (prev) {
        prev.value = u64(prev.value + s.value);
        prev.tokenEnd = Math.max(prev.tokenEnd, s.tokenEnd);
      } else out.set(k, { ...s });
    }
  }
  return [...out.values()];
}

/**
 * One key where a consumer copy differs from the producer: the {@link FineSum} key (its
 * `replicas`/`replica` are the consumer copy's) with both sides' values (uint64).
 */
export interface FineDifference extends Omit<FineSum, 'value'> {
  producer: bigint;
  consumer: bigint;
}

const ATTENTION_PARTS = (p: FinePart) => p === 'K' || p === 'V' || p === 'KV' || /^P\d+$/.test(p);

/**
 * The attention parts of (layer, head) that both sides can compare: each side's own parts when
 * they name the same set, else everything summed as `KV` (one side holds K and V apart, the other
 * one part: their K/V boundary is not known to be the same).
 */
function collapseParts(p: FineSum[], c: FineSum[]): [FineSum[], FineSum[]] {
  const partsOf = (list: FineSum[]) => {
    const m = new Map<string, Set<string>>();
    for (const s of list) {
      if (!ATTENTION_PARTS(s.part)) continue;
      const k = `${s.layer}|${s.head}`;
      let set = m.get(k);
      if (!set) m.set(k, (set = new Set()));
      set.add(s.part);
    }
    return m;
  };
  const pp = partsOf(p);
  const cp = partsOf(c);
  const collapse = new Set<string>();
  for (const k of new Set([...pp.keys(), ...cp.keys()])) {
    const a = [...(pp.get(k) ?? [])].sort().join(',');
    const b = [...(cp.get(k) ?? [])].sort().join(',');
    if (a !== b && a !== '' && b !== '') collapse.add(k);
  }
  const apply = (list: FineSum[]) => (collapse.size === 0 ? list : mergeFineSums([list.map((s) => (ATTENTION_PARTS(s.part) && collapse.has(`${s.layer}|${s.head}`) ? { ...s, part: 'KV' as const } : s))]));
  return [apply(p), apply(c)];
}

/**
 * Compares the producer's fine sums (replica 0 of every producer rank, merged) with the consumer's
 * (every replica of every consumer rank, merged) over the same query: every consumer copy of a key
 * must equal the producer's value (a key one side lacks counts as 0 there). Parts are compared as
 * `KV` where the sides split the cell differently.
 * @returns the differences, sorted by layer, part, head, token range, replica.
 */
export function compareFineSums(producer: readonly FineSum[], consumer: readonly FineSum[]): FineDifference[] {
  const [p, c] = collapseParts(
    mergeFineSums([producer.filter((s) => s.replica === 0).map((s) => ({ ...s, replicas: 1 }))]),
    mergeFineSums([consumer]),
  );
  const prod = new Map<string, FineSum>();
  for (const s of p) prod.set(baseKey(s), s);
  const cons = new Map<string, FineSum[]>();
  for (const s of c) {
    const k = baseKey(s);
    const l = cons.get(k);
    if (l) l.push(s);
    else cons.set(k, [s]);
  }
  const diffs: FineDifference[] = [];
  for (const k of new Set([...prod.keys(), ...cons.keys()])) {
    const ps = prod.get(k);
    const copies = cons.get(k) ?? [];
    const ref = (ps ?? copies[0])!;
    const pv = ps?.value ?? 0n;
    const list = copies.length > 0 ? copies : [{ ...ref, replicas: 1, replica: 0, value: 0n }];
    for (const s of list) {
      if (s.value === pv) continue;
      diffs.push({ layer: ref.layer, head: ref.head, part: ref.part, segment: ref.segment, tokenStart: ref.tokenStart, tokenEnd: Math.max(ps?.tokenEnd ?? 0, s.tokenEnd), replicas: s.replicas, replica: s.replica, producer: pv, consumer: s.value });
    }
  }
  return diffs.sort((a, b) => a.layer - b.layer || (a.part < b.part ? -1 : a.part > b.part ? 1 : 0) || a.head - b.head || a.tokenStart - b.tokenStart || a.replicas - b.replicas || a.replica - b.replica);
}

/** A region where the sides differ, for logs and reports: a run of heads (rows) of one layer and part with the same token ranges. */
export interface LocalizedRegion {
  layer: number;
  part: FinePart;
  /** Attention: global KV heads `[first, last]`; states: global rows `[first, last]`. */
  heads: [number, number];
  /** Split states: the segment of the rows in their state; -1 otherwise. */
  segment: number;
  /** Attention: merged token ranges `[start, endExclusive)`; states: empty. */
  tokens: Array<[number, number]>;
  /** The differing consumer copies `"R:r"` when some copies of a replicated head matched; absent when every copy differs. */
  replicas?: string[];
}

/**
 * Groups differences into regions: per layer and part, heads (rows) with the same token ranges and
 * replica set, consecutive, form one region; consecutive token ranges merge.
 */
export function summarizeDifferences(diffs: readonly FineDifference[]): LocalizedRegion[] {
  const by = new Map<string, Map<number, { ranges: Map<number, number>; reps: Set<string>; allReps: number; segment: number }>>();
  for (const d of diffs) {
    const k = `${d.layer}|${d.part}`;
    let heads = by.get(k);
    if (!heads) by.set(k, (heads = new Map()));
    let h = heads.get(d.head);
    if (!h) heads.set(d.head, (h = { ranges: new Map(), reps: new Set(), allReps: d.replicas, segment: d.segment }));
    if (ATTENTION_PARTS(d.part)) h.ranges.set(d.tokenStart, Math.max(h.ranges.get(d.tokenStart) ?? 0, d.tokenEnd));
    h.reps.add(`${d.replicas}:${d.replica}`);
    h.allReps = Math.max(h.allReps, d.replicas);
  }
  const out: LocalizedRegion[] = [];
  for (const [k, heads] of by) {
    const [layerText, part] = k.split('|');
    const rows = [...heads].sort((a, b) => a[0] - b[0]).map(([head, h]) => {
      const sorted = [...h.ranges].sort((a, b) => a[0] - b[0]);
      const tokens: Array<[number, number]> = [];
      for (const [s, e] of sorted) {
        const last = tokens[tokens.length - 1];
        if (last && last[1] >= s) last[1] = Math.max(last[1], e);
        else tokens.push([s, e]);
      }
      const reps = h.reps.size < h.allReps ? [...h.reps].sort() : undefined;
      return { head, tokens, reps, segment: h.segment, sig: JSON.stringify([tokens, reps ?? null, h.segment]) };
    });
    for (const r of rows) {
      const last = out[out.length - 1];
      if (last && last.layer === Number(layerText) && last.part === part && last.heads[1] === r.head - 1 && JSON.stringify([last.tokens, last.replicas ?? null, last.segment]) === r.sig) {
        last.heads[1] = r.head;
        continue;
      }
      const region: LocalizedRegion = { layer: Number(layerText), part: part as FinePart, heads: [r.head, r.head], segment: r.segment, tokens: r.tokens };
      if (r.reps) region.replicas = r.reps;
      out.push(region);
    }
  }
  return out;
}

/**
 * A region in words: `layer 3, heads 4-5, V, tokens 32-47` (token ranges inclusive), or for states
 * `layer 1, conv segment 1, rows 128-191`.
 */
export function regionText(r: LocalizedRegion): string {
  const span = (a: number, b: number) => (a === b ? `${a}` : `${a}-${b}`);
  const reps = r.replicas ? `, replica ${r.replicas.join(', ')}` : '';
  if (ATTENTION_PARTS(r.part)) {
    const heads = r.heads[0] === r.heads[1] ? `head ${r.heads[0]}` : `heads ${span(r.heads[0], r.heads[1])}`;
    const toks = r.tokens.map(([s, e]) => span(s, e - 1)).join(', ');
    return `layer ${r.layer}, ${heads}, ${r.part}, tokens ${toks}${reps}`;
  }
  const seg = r.segment >= 0 ? ` segment ${r.segment}` : '';
  const what = r.part === 'state-local' ? (r.heads[0] === r.heads[1] ? `slice ${r.heads[0]}` : `slices ${span(r.heads[0], r.heads[1])}`) : `rows ${span(r.heads[0], r.heads[1])}`;
  return `layer ${r.layer}, ${r.part}${seg}, ${what}${reps}`;
}

/**
 * Regions in words, compacted: {@link regionText} per region, except that the K and V regions of one
 * layer with the same heads, tokens and replicas read as one (`K and V`), and then consecutive
 * layers that read alike merge (`layers 0-3, heads 0-1, K and V, tokens 0-24`).
 */
export function describeRegions(regions: readonly LocalizedRegion[]): string[] {
  type Row = { layers: [number, number]; rest: string; part: string };
  const rows: Row[] = [];
  const body = (r: LocalizedRegion, part: string) => regionText({ ...r, part: part as FinePart }).replace(/^layer \d+, /, '');
  const used = new Set<number>();
  regions.forEach((r, i) => {
    if (used.has(i)) return;
    let part: string = r.part;
    if (r.part === 'K') {
      const j = regions.findIndex((v, k) => !used.has(k) && k !== i && v.part === 'V' && v.layer === r.layer && v.heads[0] === r.heads[0] && v.heads[1] === r.heads[1] && JSON.stringify([v.tokens, v.replicas ?? null]) === JSON.stringify([r.tokens, r.replicas ?? null]));
      if (j >= 0) {
        used.add(j);
        part = 'K and V';
      }
    }
    used.add(i);
    const rest = body(r, part === 'K and V' ? 'KV' : part).replace(/, KV, /, part === 'K and V' ? ', K and V, ' : ', KV, ');
    const last = rows[rows.length - 1];
    if (last && last.rest === rest && last.layers[1] === r.layer - 1) last.layers[1] = r.layer;
    else rows.push({ layers: [r.layer, r.layer], rest, part });
  });
  return rows.map((x) => `${x.layers[0] === x.layers[1] ? `layer ${x.layers[0]}` : `layers ${x.layers[0]}-${x.layers[1]}`}, ${x.rest}`);
}

// ---------------------------------------------------------------------------------------------
// Wire form (docs/localize.md): parts as small integers, keys as arrays, values as LE uint64 bins.
// ---------------------------------------------------------------------------------------------

const PART_CODES: Record<string, number> = { K: 0, V: 1, KV: 2, conv: 3, ssm: 4, state: 5, 'state-local': 6 };
/** First code of the `P<i>` parts (`P<i>` = 16 + i, i < 240). */
const PART_P0 = 16;

/** The wire code of a part (docs/localize.md): K 0, V 1, KV 2, conv 3, ssm 4, state 5, state-local 6, `P<i>` 16+i. */
export function finePartCode(p: FinePart): number {
  const c = PART_CODES[p];
  if (c !== undefined) return c;
  const m = /^P(\d+)$/.exec(p);
  if (m && Number(m[1]) < 240) return PART_P0 + Number(m[1]);
  throw new LocalizeError(`no wire code for part ${p}`);
}

/** The part of a wire code, or null for a code no part has. */
export function finePartOfCode(c: number): FinePart | null {
  for (const [k, v] of Object.entries(PART_CODES)) if (v === c) return k as FinePart;
  if (Number.isInteger(c) && c >= PART_P0 && c < 256) return `P${c - PART_P0}`;
  return null;
}

/**
 * Fine sums in wire form: `keys`, one `[layer, head, partCode, segment + 1, tokenStart, tokenEnd,
 * replicas, replica]` array per sum, and `values`, `8 * n` bytes of LE uint64 in the same order.
 */
export function encodeFineSums(sums: readonly FineSum[]): { keys: number[][]; values: Uint8Array } {
  const values = new Uint8Array(8 * sums.length);
  const dv = new DataView(values.buffer);
  const keys = sums.map((s, i) => {
    dv.setBigUint64(8 * i, s.value, true);
    return [s.layer, s.head, finePartCode(s.part), s.segment + 1, s.tokenStart, s.tokenEnd, s.replicas, s.replica];
  });
  return { keys, values };
}

/** Most fine sums one group's wire form may hold. */
export const MAX_FINE_SUMS = 1 << 20;

/**
 * Decodes {@link encodeFineSums}' form, strictly.
 * @throws LocalizeError naming the first bad field (wrong arity, a non-integer or negative number,
 *   an unknown part code, a replica not below its count, values not `8 * keys` bytes, too many sums).
 */
export function decodeFineSums(keys: unknown, values: unknown): FineSum[] {
  if (!Array.isArray(keys)) throw new LocalizeError('fine sums: keys must be an array');
  if (keys.length > MAX_FINE_SUMS) throw new LocalizeError(`fine sums: more than ${MAX_FINE_SUMS}`);
  if (!(values instanceof Uint8Array) || values.byteLength !== 8 * keys.length) throw new LocalizeError('fine sums: values must be 8 bytes per key');
  const dv = new DataView(values.buffer, values.byteOffset, values.byteLength);
  const nat = (x: unknown, w: string, max = Number.MAX_SAFE_INTEGER): number => {
    if (typeof x !== 'number' || !Number.isSafeInteger(x) || x < 0 || x > max) throw new LocalizeError(`fine sums: ${w} must be an integer in [0, ${max}]`);
    return x;
  };
  return keys.map((k, i) => {
    if (!Array.isArray(k) || k.length !== 8) throw new LocalizeError(`fine sums: key ${i} must have 8 fields`);
    const part = finePartOfCode(nat(k[2], `key ${i} part`, 255));
    if (part === null) throw new LocalizeError(`fine sums: key ${i}: unknown part code ${String(k[2])}`);
    const replicas = nat(k[6], `key ${i} replicas`);
    const replica = nat(k[7], `key ${i} replica`);
    if (replicas < 1 || replica >= replicas) throw new LocalizeError(`fine sums: key ${i}: replica ${replica} of ${replicas}`);
    return {
      layer: nat(k[0], `key ${i} layer`),
      head: nat(k[1], `key ${i} head`, HEADS_PER_LAYER - 1),
      part,
      segment: nat(k[3], `key ${i} segment`, 65536) - 1,
      tokenStart: nat(k[4], `key ${i} tokenStart`),
      tokenEnd: nat(k[5], `key ${i} tokenEnd`),
      replicas,
      replica,
      value: dv.getBigUint64(8 * i, true),
    };
  });
}

/**
 * Which bytes move where: the mapping of one consumer rank's caches onto the producer's ranks,
 * as descriptor pairs (address ranges in each side's registered memory), for any TP sizes,
 * block sizes, physical layouts and local prefix hits.
 *
 * - Attention-like caches: each consumer local head `h` is global head
 *   `g = floor(tpRank / R_d) * L_d + h` (SPEC 1); its source is the producer rank
 *   `floor(g / L_p) * R_p` (replica 0 of the shard holding it), local head `g mod L_p`. This
 *   covers sharded heads, GQA heads replicated over ranks (R = tp / kvHeads), and MLA latent /
 *   indexer caches every rank holds whole (R = tp, so every consumer rank reads producer rank 0).
 * - Tokens pair by request position: token `t` is at block `t / B` of each side's block table
 *   (block sizes may differ); only tokens `[firstToken, numTokens)` move (a consumer's local
 *   prefix hit stays local). A null block (negative id) on either side skips its tokens.
 * - State caches (Mamba, GDN): the running-state block (last of the group's block table) of each
 *   side; with a TP split declaration, rows pair by global row (SPEC 3): a segment with `R`
 *   replicas is read from the producer rank `floor(globalRow / L_p) * R_p`, so B/C replicated
 *   on the consumer (Mamba2 n_groups = 1) are read whole by every consumer rank. Without a split
 *   the state moves only between equal TP sizes, rank to rank.
 *
 * Every address is derived from the views' addressing (`part offset + block * blockStride +
 * kernel block + token * tokenStride + head * headStride`) and bounds-checked against the
 * rank's registered regions; a layout that does not fit raises {@link PlanError}.
 *
 * A producer rank that knows only its own layout (push: MooncakeConnector) plans its share with a
 * partial producer side ({@link ProducerSide.partial}): the cells other ranks hold are left out.
 * @module
 */
import { DTYPE_BYTES } from '@kvconnect/checksum';
import type { AttentionLayout, CacheLayout, PartLayout, RankInfo, StateLayoutInfo, StateTensorLayout } from './protocol.js';

/** The two sides cannot be mapped (different models, caches, dtypes, head counts, a missing block). */
export class PlanError extends Error {
  override readonly name: string = 'PlanError';
  constructor(message: string) {
    super(message);
  }
}

/** One descriptor pair: `len` bytes at `src` (producer) and `dst` (consumer). */
export interface Pair {
  src: number;
  dst: number;
  len: number;
}

/** The pairs one producer rank provides to the consumer rank. */
export interface RankPlan {
  /** The producer rank. */
  readonly src: RankInfo;
  /** Coalesced, sorted by consumer address. */
  readonly pairs: Pair[];
  /** Total bytes. */
  readonly bytes: number;
  /** Cells (attention token x head x part, or state elements) before coalescing. */
  readonly cells: number;
}

/** The producer side of a plan: its ranks and TP size. */
export interface ProducerSide {
  readonly tpSize: number;
  readonly ranks: readonly RankInfo[];
  /**
   * When true, `ranks` are only some of the producer's ranks (a producer rank planning its own
   * writes): a cache none of them holds (another PP stage's) and the heads or rows a rank not
   * listed holds are left out, not refused. A source rank outside `tpSize` is still refused.
   * Default false: `ranks` are all of them, and anything they lack is a {@link PlanError}.
   */
  readonly partial?: boolean;
}

/** What {@link planTransfer} maps. */
export interface PlanInput {
  /** The consumer rank. */
  readonly dst: RankInfo;
  readonly producer: ProducerSide;
  /** Consumer block ids per group (the request's whole block table). */
  readonly dstBlocks: readonly (readonly number[])[];
  /** Producer block ids per group. */
  readonly srcBlocks: readonly (readonly number[])[];
  /** First token to move (the consumer's local prefix hit). */
  readonly firstToken: number;
  /** Tokens of the load (`firstToken + external tokens`). */
  readonly numTokens: number;
}

/** Byte offset of one part of a cell (block, local head, token in block), as the views define it. */
export function partOffset(p: PartLayout, block: number, head: number, token: number): number {
  const kbt = p.kernelBlockTokens;
  return p.offset + block * p.blockStride + Math.floor(token / kbt) * p.kernelBlockStride + (token % kbt) * p.tokenStride + head * p.headStride;
}

/** The replica-0 producer rank and its local head for global head `g` (SPEC 1). */
export function sourceOfHead(g: number, producerLocalHeads: number, producerReplicas: number): { tpRank: number; head: number } {
  const shard = Math.floor(g / producerLocalHeads);
  return { tpRank: shard * producerReplicas, head: g - shard * producerLocalHeads };
}

/** Global heads of consumer rank `tpRank` of a cache (`[first, count]`). */
export function headsOfRank(tpRank: number, localHeads: number, replicas: number): [number, number] {
  return [Math.floor(tpRank / replicas) * localHeads, localHeads];
}

function absolute(rank: RankInfo, region: number, offset: number, len: number, what: string): number {
  const r = rank.regions[region];
  if (!r) throw new PlanError(`${what}: region ${region} is not registered by ${rank.agentName}`);
  if (offset < 0 || offset + len > r.length) throw new PlanError(`${what}: bytes [${offset}, ${offset + len}) outside region ${region} (${r.length} bytes) of ${rank.agentName}`);
  return r.addr + offset;
}

/** Byte offsets (from the state's block start) of every element of `row` along `axis`, in row-major order of the other dims. */
export function rowElementOffsets(shape: readonly number[], strides: readonly number[], axis: number, row: number): number[] {
  const dims = shape.map((_, d) => d).filter((d) => d !== axis);
  const idx = new Array<number>(dims.length).fill(0);
  const total = dims.reduce((a, d) => a * shape[d], 1);
  const out = new Array<number>(total);
  for (let k = 0; k < total; k++) {
    let off = row * strides[axis];
    for (let i = 0; i < dims.length; i++) off += idx[i] * strides[dims[i]];
    out[k] = off;
    for (let i = dims.length - 1; i >= 0; i--) {
      if (++idx[i] < shape[dims[i]]) break;
      idx[i] = 0;
    }
  }
  return out;
}

function allElementOffsets(shape: readonly number[], strides: readonly number[]): number[] {
  const out: number[] = [];
  for (let r = 0; r < shape[0]; r++) out.push(...rowElementOffsets(shape, strides, 0, r));
  return out;
}

/** Sorts pairs by consumer address and merges neighbours contiguous on both sides. */
export function coalesce(pairs: Pair[]): Pair[] {
  if (pairs.length === 0) return pairs;
  pairs.sort((a, b) => a.dst - b.dst || a.src - b.src);
  const out: Pair[] = [{ ...pairs[0] }];
  for (let i = 1; i < pairs.length; i++) {
    const p = pairs[i];
    const last = out[out.length - 1];
    if (last.dst + last.len === p.dst && last.src + last.len === p.src) last.len += p.len;
    else out.push({ ...p });
  }
  return out;
}

type Holder = { rank: RankInfo; cache: CacheLayout };

/** The holder at producer TP rank `tpRank`; null when a partial producer side lacks it (another rank's share). */
function holderAt(i: PlanInput, holders: Map<number, Holder>, tpRank: number, kind: CacheLayout['kind'], name: string, forWhat = ''): Holder | null {
  const h = holders.get(tpRank);
  if (h?.cache.kind === kind) return h;
  if (!h && i.producer.partial && tpRank >= 0 && tpRank < i.producer.tpSize) return null;
  throw new PlanError(`${name}: no producer rank ${tpRank}${forWhat}`);
}

function lastBlock(ids: readonly number[] | undefined, what: string): number {
  const b = ids?.[ids.length - 1];
  if (b === undefined || b < 0) throw new PlanError(`${what}: no running-state block`);
  return b;
}

/**
 * Maps the consumer rank `dst` onto the producer's ranks.
 * @returns one {@link RankPlan} per producer rank that provides bytes (others left out).
 * @throws PlanError when the two sides cannot be mapped.
 */
export function planTransfer(i: PlanInput): RankPlan[] {
  const { dst, producer } = i;
  if (!(Number.isSafeInteger(i.firstToken) && Number.isSafeInteger(i.numTokens) && i.firstToken >= 0 && i.firstToken <= i.numTokens)) {
    throw new PlanError(`bad token range [${i.firstToken}, ${i.numTokens})`);
  }
  // Cache name -> producer TP rank -> holder (over every PP stage).
  const byName = new Map<string, Map<number, Holder>>();
  for (const rank of producer.ranks) {
    for (const cache of rank.caches) {
      let m = byName.get(cache.name);
      if (!m) byName.set(cache.name, (m = new Map()));
      m.set(rank.tpRank, { rank, cache });
    }
  }
  const out = new Map<RankInfo, { pairs: Pair[]; cells: number }>();
  const add: AddPair = (rank, p, cells = 1) => {
    let l = out.get(rank);
    if (!l) out.set(rank, (l = { pairs: [], cells: 0 }));
    if (p) l.pairs.push(p);
    l.cells += cells;
  };
  for (const dc of dst.caches) {
    const holders = byName.get(dc.name);
    if (!holders || holders.size === 0) {
      if (producer.partial) continue; // another PP stage holds it
      throw new PlanError(`the producer has no cache ${dc.name}`);
    }
    if (dc.kind === 'attention') planAttention(i, dc, holders, add);
    else planState(i, dc, holders, add);
  }
  return [...out].map(([src, { pairs, cells }]) => {
    const c = coalesce(pairs);
    return { src, pairs: c, bytes: c.reduce((a, p) => a + p.len, 0), cells };
  });
}

/** Adds pair `p` for producer rank `rank` (null: none, the cells extended a pair already added) and counts `cells` cells (default 1). */
type AddPair = (rank: RankInfo, p: Pair | null, cells?: number) => void;

/**
 * The cells of an attention cache: consumer local head x token `[firstToken, numTokens)` x part.
 * Addresses are computed (and checked) in head, token, part order, so the first error is the same
 * whatever the layouts. Cells are then emitted in the consumer's memory order where a simple one
 * exists (token-major when heads are adjacent, NHD; else head-major, HND) and merged on the fly
 * with the previous cell of the same producer rank and part when contiguous on both sides, which
 * {@link coalesce} would merge anyway: the plan is the same, but a 1K-token load builds hundreds of
 * pairs instead of tens of thousands (one object and one sort entry per cell cost ~5-10 ms on the
 * consumer's TTFT path; issue 16 section 3).
 */
function planAttention(i: PlanInput, dc: AttentionLayout, holders: Map<number, Holder>, add: AddPair): void {
  const { dst, producer } = i;
  const any = holders.values().next().value!.cache;
  if (any.kind !== 'attention') throw new PlanError(`${dc.name}: attention on the consumer, state on the producer`);
  if (any.dtype !== dc.dtype) throw new PlanError(`${dc.name}: dtype ${dc.dtype} on the consumer, ${any.dtype} on the producer`);
  if (any.parts.length !== dc.parts.length || any.parts.some((p, q) => p.bytes !== dc.parts[q].bytes)) {
    throw new PlanError(`${dc.name}: cell parts differ (consumer ${dc.parts.map((x) => x.bytes).join('+')} bytes, producer ${any.parts.map((x) => x.bytes).join('+')})`);
  }
  const globalD = (dc.localHeads * dst.tpSize) / dc.replicas;
  const globalP = (any.localHeads * producer.tpSize) / any.replicas;
  if (globalD !== globalP || !Number.isInteger(globalD)) throw new PlanError(`${dc.name}: global heads differ: ${globalD} KV heads on the consumer, ${globalP} on the producer`);
  const [g0] = headsOfRank(dst.tpRank, dc.localHeads, dc.replicas);
  const dBlocks = i.dstBlocks[dc.group] ?? [];
  const Bd = dc.blockSize;
  const H = dc.localHeads;
  const Q = dc.parts.length;
  const T = i.numTokens - i.firstToken;
  // Cell (h, t, q) at (h * T + t) * Q + q; NaN: no cell (a null block, or a head another rank holds).
  const srcAt = new Float64Array(H * T * Q).fill(NaN);
  const dstAt = new Float64Array(H * T * Q).fill(NaN);
  const rankOf: Array<RankInfo | null> = new Array(H).fill(null);
  for (let h = 0; h < H; h++) {
    const src = sourceOfHead(g0 + h, any.localHeads, any.replicas);
    const holder = holderAt(i, holders, src.tpRank, 'attention', dc.name, ` for head ${g0 + h}`);
    if (!holder) continue;
    rankOf[h] = holder.rank;
    const sc = holder.cache as AttentionLayout;
    const sBlocks = i.srcBlocks[sc.group] ?? [];
    const Bp = sc.blockSize;
    for (let t = i.firstToken; t < i.numTokens; t++) {
      const bd = dBlocks[Math.floor(t / Bd)];
      const bp = sBlocks[Math.floor(t / Bp)];
      if (bd === undefined) throw new PlanError(`${dc.name}: the consumer gave no block for token ${t} (${dBlocks.length} blocks of ${Bd})`);
      if (bp === undefined) throw new PlanError(`${dc.name}: the producer has no block for token ${t} (${sBlocks.length} blocks of ${Bp})`);
      if (bd < 0 || bp < 0) continue;
      if (bd >= dc.numBlocks || bp >= sc.numBlocks) throw new PlanError(`${dc.name}: block id out of range`);
      for (let q = 0; q < Q; q++) {
        const pd = dc.parts[q];
        const pp = sc.parts[q];
        const k = (h * T + (t - i.firstToken)) * Q + q;
        srcAt[k] = absolute(holder.rank, pp.region, partOffset(pp, bp, src.head, t % Bp), pp.bytes, dc.name);
        dstAt[k] = absolute(dst, pd.region, partOffset(pd, bd, h, t % Bd), pd.bytes, dc.name);
      }
    }
  }
  // Emission order: token-major when the consumer's heads of a token are adjacent (NHD), else head-major.
  const p0 = dc.parts[0];
  const tokenMajor = H > 1 && p0 !== undefined && p0.headStride === p0.bytes;
  const last = new Map<RankInfo, Array<Pair | null>>();
  const emit = (h: number, t: number, q: number) => {
    const k = (h * T + t) * Q + q;
    const s = srcAt[k];
    if (Number.isNaN(s)) return;
    const rank = rankOf[h]!;
    const d = dstAt[k];
    const len = dc.parts[q].bytes;
    let l = last.get(rank);
    if (!l) last.set(rank, (l = new Array<Pair | null>(Q).fill(null)));
    const p = l[q];
    if (p && p.dst + p.len === d && p.src + p.len === s) {
      p.len += len;
      add(rank, null);
    } else {
      const np = { src: s, dst: d, len };
      l[q] = np;
      add(rank, np);
    }
  };
  if (tokenMajor) for (let t = 0; t < T; t++) for (let h = 0; h < H; h++) for (let q = 0; q < Q; q++) emit(h, t, q);
  else for (let h = 0; h < H; h++) for (let t = 0; t < T; t++) for (let q = 0; q < Q; q++) emit(h, t, q);
}

function otherDims(s: StateTensorLayout, axis: number): number[] {
  return s.shape.filter((_, d) => d !== axis);
}

function planState(i: PlanInput, dc: StateLayoutInfo, holders: Map<number, Holder>, add: AddPair): void {
  const { dst, producer } = i;
  const any = holders.values().next().value!.cache;
  if (any.kind !== 'state') throw new PlanError(`${dc.name}: state on the consumer, attention on the producer`);
  if (any.states.length !== dc.states.length) throw new PlanError(`${dc.name}: ${dc.states.length} states on the consumer, ${any.states.length} on the producer`);
  const bd = lastBlock(i.dstBlocks[dc.group], `${dc.name} (consumer)`);
  if (bd >= dc.numBlocks) throw new PlanError(`${dc.name}: block id out of range`);
  dc.states.forEach((sd, k) => {
    const sp0 = any.states[k];
    if (sd.dtype !== sp0.dtype) throw new PlanError(`${dc.name} state ${k}: dtype ${sd.dtype} on the consumer, ${sp0.dtype} on the producer`);
    const eb = DTYPE_BYTES[sd.dtype];
    const pairAt = (holder: Holder, sp: StateTensorLayout, dOffs: number[], pOffs: number[]) => {
      const sc = holder.cache as StateLayoutInfo;
      const bp = lastBlock(i.srcBlocks[sc.group], `${dc.name} (producer)`);
      if (bp >= sc.numBlocks) throw new PlanError(`${dc.name}: block id out of range`);
      for (let e = 0; e < dOffs.length; e++) {
        add(holder.rank, {
          src: absolute(holder.rank, sp.region, sp.offset + bp * sp.blockStride + pOffs[e], eb, dc.name),
          dst: absolute(dst, sd.region, sd.offset + bd * sd.blockStride + dOffs[e], eb, dc.name),
          len: eb,
        });
      }
    };
    if (!sd.split || !sp0.split) {
      if (dst.tpSize !== producer.tpSize) throw new PlanError(`${dc.name} state ${k}: no TP split declaration, and TP sizes differ (${producer.tpSize} -> ${dst.tpSize})`);
      const holder = holderAt(i, holders, dst.tpRank, 'state', dc.name);
      if (!holder) return;
      const sp = (holder.cache as StateLayoutInfo).states[k];
      if (sp.shape.length !== sd.shape.length || sp.shape.some((d, x) => d !== sd.shape[x])) throw new PlanError(`${dc.name} state ${k}: shapes differ`);
      pairAt(holder, sp, allElementOffsets(sd.shape, sd.strides), allElementOffsets(sp.shape, sp.strides));
      return;
    }
    const axis = sd.split.axis;
    if (sp0.split.axis !== axis || sd.split.segments.length !== sp0.split.segments.length) throw new PlanError(`${dc.name} state ${k}: TP splits differ`);
    const od = otherDims(sd, axis);
    const op = otherDims(sp0, axis);
    if (od.length !== op.length || od.some((d, x) => d !== op[x])) throw new PlanError(`${dc.name} state ${k}: row shapes differ`);
    let offD = 0;
    sd.split.segments.forEach(([Ld, Rd], s) => {
      const [Lp, Rp] = sp0.split!.segments[s];
      if ((Ld * dst.tpSize) / Rd !== (Lp * producer.tpSize) / Rp) throw new PlanError(`${dc.name} state ${k} segment ${s}: ${(Ld * dst.tpSize) / Rd} rows on the consumer, ${(Lp * producer.tpSize) / Rp} on the producer`);
      const shardD = Math.floor(dst.tpRank / Rd);
      for (let r = 0; r < Ld; r++) {
        const g = shardD * Ld + r;
        const shardP = Math.floor(g / Lp);
        const holder = holderAt(i, holders, shardP * Rp, 'state', dc.name, ` for row ${g}`);
        if (!holder) continue;
        const sp = (holder.cache as StateLayoutInfo).states[k];
        if (!sp.split) throw new PlanError(`${dc.name} state ${k}: producer ranks disagree on the split`);
        const offP = sp.split.segments.slice(0, s).reduce((a, x) => a + x[0], 0);
        pairAt(holder, sp, rowElementOffsets(sd.shape, sd.strides, axis, offD + r), rowElementOffsets(sp.shape, sp.strides, axis, offP + g - shardP * Lp));
      }
      offD += Ld;
    });
  });
}

/**
 * Cache layouts on the side channel, and the producer's write plan: which bytes of this producer
 * worker go to which addresses of a consumer worker.
 *
 * The consumer describes its caches ({@link describeLayout}: per cache the parts' strides, block
 * size, local heads and replication, or the state tensors' shapes, strides and TP splits) and its
 * registered regions. The producer maps every consumer cell to the producer TP rank that holds it
 * (as `InProcessConnector` does): a consumer rank's global head `g` (state row `g` of a segment)
 * lies in producer shard `floor(g / Lp)`, and the first replica of that shard (TP rank
 * `shard * Rp`) writes it. So every consumer cell is written by exactly one producer rank, for
 * any producer and consumer TP sizes, block sizes and layouts (dtypes must match: bytes are
 * copied). PP: a producer worker writes the caches it holds; each cache lives on one PP stage.
 *
 * Writes are coalesced: descriptor pairs are sorted by source address and merged where both the
 * source and the destination are contiguous.
 * @module
 */
import { DTYPE_BYTES, contiguousStrides, type AttentionCacheView, type AttentionPart, type Replication, type StateCacheView, type StateTensor } from '@kvconnect/checksum';
import type { WorkerKVCaches } from '@kvconnect/core';
import type { XferDesc } from '@kvconnect/transfer';
import type { WireCache, WireLoad, WirePart, WireState } from './protocol.js';

/** A write plan that cannot be built: the layouts disagree, or the request names blocks or tokens the producer lacks. */
export class LayoutMismatchError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'LayoutMismatchError';
  }
}

/** The replica count R of a cache at a TP size (SPEC 1, as the checksum planner resolves it). */
export function replicasOf(r: Replication | undefined, tpSize: number): number {
  if (r === undefined) return 1;
  if (r === 'all') return tpSize;
  if (typeof r === 'number') return Math.max(1, r);
  return r.totalKvHeads >= tpSize ? 1 : Math.max(1, Math.floor(tpSize / r.totalKvHeads));
}

/** Byte strides of a state tensor (given, or row-major contiguous). */
export function stateStrides(s: StateTensor): number[] {
  return s.strides ? [...s.strides] : contiguousStrides(s.shape, DTYPE_BYTES[s.dtype]);
}

/** The wire description of a worker's caches (every group, every cache). */
export function describeLayout(caches: WorkerKVCaches): WireCache[] {
  const out: WireCache[] = [];
  caches.groups.forEach((g, gi) => {
    for (const v of g.caches) {
      if (v.kind === 'attention') {
        out.push({
          kind: 'attention',
          name: v.name,
          group: gi,
          dtype: v.dtype,
          blockSize: v.blockSize,
          localHeads: v.localHeads,
          replication: v.replication,
          parts: v.parts.map((p): WirePart => ({ ...p })),
        });
      } else {
        out.push({
          kind: 'state',
          name: v.name,
          group: gi,
          states: v.states.map((s): WireState => ({
            dtype: s.dtype,
            shape: [...s.shape],
            region: s.region,
            offset: s.offset,
            blockStride: s.blockStride,
            strides: stateStrides(s),
            split: s.split ? { axis: s.split.axis, segments: s.split.segments.map(([l, r]) => [l, r] as [number, number]) } : undefined,
          })),
        });
      }
    }
  });
  return out;
}

/** Byte offset of token `token`, head `head` of part `p` in block `block` (the checksum package's view formula). */
export function partOffset(p: AttentionPart | WirePart, blockSize: number, block: number, head: number, token: number): number {
  const kbt = p.kernelBlockTokens ?? blockSize;
  return p.offset + block * p.blockStride + Math.floor(token / kbt) * (p.kernelBlockStride ?? 0) + (token % kbt) * p.tokenStride + head * p.headStride;
}

/** Calls `fn(offset)` with the byte offset (strides) of every element of row `row` along `axis`, in index order. */
function forEachRowElement(shape: readonly number[], strides: readonly number[], axis: number, row: number, fn: (off: number) => void): void {
  const dims = shape.map((_, d) => d).filter((d) => d !== axis);
  const idx = new Array<number>(dims.length).fill(0);
  const total = dims.reduce((a, d) => a * shape[d], 1);
  for (let k = 0; k < total; k++) {
    let off = row * strides[axis];
    for (let i = 0; i < dims.length; i++) off += idx[i] * strides[dims[i]];
    fn(off);
    for (let i = dims.length - 1; i >= 0; i--) {
      if (++idx[i] < shape[dims[i]]) break;
      idx[i] = 0;
    }
  }
}

/** The consumer side of a write plan. */
export interface ConsumerSide {
  tpSize: number;
  tpRank: number;
  /** Registered regions `[addr, length]`, in the consumer's region order. */
  regions: ReadonlyArray<readonly [number, number]>;
  caches: readonly WireCache[];
}

/** The producer side of a write plan. */
export interface ProducerSide {
  caches: WorkerKVCaches;
  /** Agent addresses of `caches.regions`, same order. */
  regionAddrs: readonly number[];
  /** The producer request's block ids per group. */
  blocks: readonly (readonly number[])[];
  /** Tokens whose KV the producer computed. */
  numTokens: number;
}

/** A write plan: `local[i]` goes to `remote[i]`. */
export interface WritePlan {
  local: XferDesc[];
  remote: XferDesc[];
  /** Bytes written. */
  bytes: number;
  /** Cells (attention token x head x part, or state elements) before coalescing. */
  cells: number;
}

class PairList {
  src: number[] = [];
  dst: number[] = [];
  len: number[] = [];
  constructor(
    private readonly p: ProducerSide,
    private readonly c: ConsumerSide,
  ) {}

  add(srcRegion: number, srcOff: number, dstRegion: number, dstOff: number, len: number, what: () => string): void {
    const sr = this.p.caches.regions[srcRegion];
    if (!sr || srcOff < 0 || srcOff + len > sr.byteLength) throw new LayoutMismatchError(`${what()}: producer bytes [${srcOff}, ${srcOff + len}) outside region ${srcRegion}`);
    const dr = this.c.regions[dstRegion];
    if (!dr || dstOff < 0 || dstOff + len > dr[1]) throw new LayoutMismatchError(`${what()}: consumer bytes [${dstOff}, ${dstOff + len}) outside region ${dstRegion}`);
    this.src.push(this.p.regionAddrs[srcRegion] + srcOff);
    this.dst.push(dr[0] + dstOff);
    this.len.push(len);
  }

  finish(): WritePlan {
    const n = this.src.length;
    const order = Array.from({ length: n }, (_, i) => i).sort((a, b) => this.src[a] - this.src[b]);
    const local: XferDesc[] = [];
    const remote: XferDesc[] = [];
    let bytes = 0;
    let s = -1;
    let d = -1;
    let l = 0;
    const flush = () => {
      if (l > 0) {
        local.push({ addr: s, length: l });
        remote.push({ addr: d, length: l });
      }
    };
    for (const i of order) {
      bytes += this.len[i];
      if (l > 0 && this.src[i] === s + l && this.dst[i] === d + l) {
        l += this.len[i];
        continue;
      }
      flush();
      s = this.src[i];
      d = this.dst[i];
      l = this.len[i];
    }
    flush();
    return { local, remote, bytes, cells: n };
  }
}

/**
 * The bytes this producer worker writes for one consumer worker's load.
 * @throws LayoutMismatchError when the layouts disagree (cache kinds, parts, dtypes, state shapes,
 *   a state without a TP split across different TP sizes), or the load names tokens or blocks
 *   the producer does not have.
 */
export function planWrites(p: ProducerSide, c: ConsumerSide, load: WireLoad): WritePlan {
  if (load.numTokens > p.numTokens) throw new LayoutMismatchError(`the consumer asks for ${load.numTokens} tokens; the producer computed ${p.numTokens}`);
  const mine = p.caches;
  const tpP = mine.rank.tpSize;
  const tpD = c.tpSize;
  const myTp = mine.rank.tpRank;
  const byName = new Map<string, { gi: number; view: AttentionCacheView | StateCacheView }>();
  mine.groups.forEach((g, gi) => {
    for (const v of g.caches) byName.set(v.name, { gi, view: v });
  });
  const pairs = new PairList(p, c);
  for (const cc of c.caches) {
    const prod = byName.get(cc.name);
    if (!prod) continue; // another PP stage holds it (or nobody: the checksums then report the group)
    const pBlocks = p.blocks[prod.gi] ?? [];
    const dBlocks = load.blocks[cc.group] ?? [];
    if (cc.kind === 'attention') {
      const pv = prod.view;
      if (pv.kind !== 'attention') throw new LayoutMismatchError(`${cc.name}: attention on the consumer, state on the producer`);
      if (pv.dtype !== cc.dtype) throw new LayoutMismatchError(`${cc.name}: dtype ${cc.dtype} on the consumer, ${pv.dtype} on the producer`);
      if (pv.parts.length !== cc.parts.length || pv.parts.some((x, q) => x.bytes !== cc.parts[q].bytes)) {
        throw new LayoutMismatchError(`${cc.name}: cell parts differ (consumer ${cc.parts.map((x) => x.bytes).join('+')} bytes, producer ${pv.parts.map((x) => x.bytes).join('+')})`);
      }
      const Rd = replicasOf(cc.replication, tpD);
      const Rp = replicasOf(pv.replication, tpP);
      const Ld = cc.localHeads;
      const Lp = pv.localHeads;
      const shardD = Math.floor(c.tpRank / Rd);
      const globalD = (Ld * tpD) / Rd;
      const globalP = (Lp * tpP) / Rp;
      if (globalD !== globalP) throw new LayoutMismatchError(`${cc.name}: ${globalD} KV heads on the consumer, ${globalP} on the producer`);
      const Bd = cc.blockSize;
      const Bp = pv.blockSize;
      for (let h = 0; h < Ld; h++) {
        const gh = shardD * Ld + h;
        const shardP = Math.floor(gh / Lp);
        if (shardP * Rp >= tpP) throw new LayoutMismatchError(`${cc.name}: consumer head ${gh} has no producer rank (producer TP ${tpP}, ${Lp} heads per rank)`);
        if (shardP * Rp !== myTp) continue;
        const hp = gh - shardP * Lp;
        for (let tok = load.firstToken; tok < load.numTokens; tok++) {
          const bd = dBlocks[Math.floor(tok / Bd)];
          const bp = pBlocks[Math.floor(tok / Bp)];
          if (bd === undefined) throw new LayoutMismatchError(`${cc.name}: the consumer gave no block for token ${tok}`);
          if (bp === undefined) throw new LayoutMismatchError(`${cc.name}: the producer has no block for token ${tok}`);
          if (bd < 0 || bp < 0) continue; // a null block (out of a sliding window): nothing to move
          if (bp >= pv.numBlocks) throw new LayoutMismatchError(`${cc.name}: producer block ${bp} out of range`);
          for (let q = 0; q < pv.parts.length; q++) {
            const partP = pv.parts[q];
            const partD = cc.parts[q];
            pairs.add(partP.region, partOffset(partP, Bp, bp, hp, tok % Bp), partD.region, partOffset(partD, Bd, bd, h, tok % Bd), partP.bytes, () => `${cc.name} token ${tok} head ${gh}`);
          }
        }
      }
    } else {
      const pv = prod.view;
      if (pv.kind !== 'state') throw new LayoutMismatchError(`${cc.name}: state on the consumer, attention on the producer`);
      if (pv.states.length !== cc.states.length) throw new LayoutMismatchError(`${cc.name}: ${cc.states.length} states on the consumer, ${pv.states.length} on the producer`);
      const bd = dBlocks[dBlocks.length - 1];
      const bp = pBlocks[pBlocks.length - 1];
      if (bd === undefined || bp === undefined || bd < 0 || bp < 0) throw new LayoutMismatchError(`${cc.name}: no running-state block`);
      if (bp >= pv.numBlocks) throw new LayoutMismatchError(`${cc.name}: producer block ${bp} out of range`);
      cc.states.forEach((sd, k) => {
        const sp = pv.states[k];
        if (sp.dtype !== sd.dtype) throw new LayoutMismatchError(`${cc.name} state ${k}: dtype ${sd.dtype} on the consumer, ${sp.dtype} on the producer`);
        if (!sd.split !== !sp.split) throw new LayoutMismatchError(`${cc.name} state ${k}: a TP split on one side only`);
        if (!sd.split && tpD !== tpP) throw new LayoutMismatchError(`${cc.name} state ${k}: state without a TP split across TP sizes ${tpP} -> ${tpD}`);
        const axis = sd.split?.axis ?? 0;
        if (sp.split && sp.split.axis !== axis) throw new LayoutMismatchError(`${cc.name} state ${k}: split axes differ`);
        if (sp.shape.length !== sd.shape.length || sp.shape.some((n, d) => d !== axis && n !== sd.shape[d])) throw new LayoutMismatchError(`${cc.name} state ${k}: row shapes differ`);
        const segsD = sd.split?.segments ?? [[sd.shape[axis], 1] as [number, number]];
        const segsP = sp.split?.segments ?? [[sp.shape[axis], 1] as const];
        if (segsD.length !== segsP.length) throw new LayoutMismatchError(`${cc.name} state ${k}: ${segsD.length} split segments on the consumer, ${segsP.length} on the producer`);
        const spStr = stateStrides(sp);
        const eb = DTYPE_BYTES[sd.dtype];
        let offD = 0;
        let offP = 0;
        segsD.forEach(([Ld, Rd], s) => {
          const [Lp, Rp] = segsP[s];
          if ((Ld * tpD) / Rd !== (Lp * tpP) / Rp) throw new LayoutMismatchError(`${cc.name} state ${k} segment ${s}: ${(Ld * tpD) / Rd} rows on the consumer, ${(Lp * tpP) / Rp} on the producer`);
          const shardD = Math.floor(c.tpRank / Rd);
          for (let i = 0; i < Ld; i++) {
            const gr = shardD * Ld + i;
            const shardP = sd.split ? Math.floor(gr / Lp) : 0;
            const tpSrc = sd.split ? shardP * Rp : c.tpRank;
            if (tpSrc >= tpP) throw new LayoutMismatchError(`${cc.name} state ${k}: consumer row ${gr} has no producer rank`);
            if (tpSrc !== myTp) continue;
            const rowP = offP + (sd.split ? gr - shardP * Lp : i);
            const dOffs: number[] = [];
            const pOffs: number[] = [];
            forEachRowElement(sd.shape, sd.strides, axis, offD + i, (o) => dOffs.push(o));
            forEachRowElement(sp.shape, spStr, axis, rowP, (o) => pOffs.push(o));
            for (let e = 0; e < dOffs.length; e++) {
              pairs.add(sp.region, sp.offset + bp * sp.blockStride + pOffs[e], sd.region, sd.offset + bd * sd.blockStride + dOffs[e], eb, () => `${cc.name} state ${k} row ${gr}`);
            }
          }
          offD += Ld;
          offP += Lp;
        });
      });
    }
  }
  return pairs.finish();
}

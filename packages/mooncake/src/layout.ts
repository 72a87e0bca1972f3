/**
 * Cache layouts on the side channel, and the producer's write plan: which bytes of this producer
 * worker go to which addresses of a consumer worker.
 *
 * The consumer describes its caches ({@link describeLayout}: per cache the parts' strides, block
 * size, local heads and replication, or the state tensors' shapes, strides and TP splits) and its
 * registered regions. The producer maps every consumer cell to the producer TP rank that holds it
 * with `@kvconnect/nixl-common`'s mapping ({@link planTransfer}, the one the NIXL connectors use):
 * a consumer rank's global head `g` (state row `g` of a segment) lies in producer shard
 * `floor(g / Lp)`, and the first replica of that shard (TP rank `shard * Rp`) writes it. So every
 * consumer cell is written by exactly one producer rank, for any producer and consumer TP sizes,
 * block sizes and layouts (dtypes must match: bytes are copied). PP: a producer worker writes the
 * caches it holds; each cache lives on one PP stage.
 *
 * Writes are coalesced: descriptor pairs are sorted by consumer address and merged where both the
 * source and the destination are contiguous.
 * @module
 */
import { DTYPE_BYTES, ReplicaCountError, contiguousStrides, replicaCount, type AttentionPart, type Replication, type StateTensor } from '@kvconnect/checksum';
import type { WorkerKVCaches } from '@kvconnect/core';
import { PlanError, buildRankInfo, planTransfer, type CacheLayout, type RankInfo } from '@kvconnect/nixl-common';
import type { RegisteredRegion, XferDesc } from '@kvconnect/transfer';
import type { WireCache, WireLoad, WireMemory, WirePart, WireState } from './protocol.js';

/** A write plan that cannot be built: the layouts disagree, or the request names blocks or tokens the producer lacks. */
export class LayoutMismatchError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'LayoutMismatchError';
  }
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

/** The consumer side of a write plan. */
export interface ConsumerSide {
  tpSize: number;
  tpRank: number;
  /** Registered regions `[addr, length]`, in the consumer's region order. */
  regions: ReadonlyArray<readonly [number, number]>;
  /** The memory of every region (default host memory, `DRAM` device 0). */
  memory?: WireMemory;
  caches: readonly WireCache[];
}

/** The producer side of a write plan. */
export interface ProducerSide {
  /** The producer worker's caches (their regions host or device memory; only the layout is read here). */
  caches: WorkerKVCaches;
  /** The regions as the producer's agent registered them (address, length, kind, device), in `caches.regions` order. */
  regions: readonly RegisteredRegion[];
  /** The producer request's block ids per group. */
  blocks: readonly (readonly number[])[];
  /** Tokens whose KV the producer computed. */
  numTokens: number;
}

/** A write plan: `local[i]` goes to `remote[i]`. */
export interface WritePlan {
  /** Producer descriptors, in `localKind` memory (device ids set for VRAM). */
  local: XferDesc[];
  /** Consumer descriptors, in `remoteKind` memory (device ids set for VRAM). */
  remote: XferDesc[];
  /** The memory kind of the producer's regions (`prepDescList(null, localKind, local)`). */
  localKind: 'DRAM' | 'VRAM';
  /** The memory kind of the consumer's regions (`prepDescList(consumer, remoteKind, remote)`). */
  remoteKind: 'DRAM' | 'VRAM';
  /** Bytes written. */
  bytes: number;
  /** Cells (attention token x head x part, or state elements) before coalescing. */
  cells: number;
}

/**
 * The one memory kind and device of a worker's registered regions (`DRAM` device 0 when there are
 * none). A worker's KV is in one memory: all host, or all on one CUDA device.
 * @throws LayoutMismatchError for regions of several kinds or devices.
 */
export function workerMemory(regions: readonly RegisteredRegion[]): WireMemory {
  const first = regions[0];
  const m: WireMemory = { kind: first?.kind ?? 'DRAM', deviceId: first?.kind === 'VRAM' ? first.deviceId : 0 };
  regions.forEach((r, i) => {
    if (r.kind !== m.kind || (r.kind === 'VRAM' && r.deviceId !== m.deviceId)) throw new LayoutMismatchError(`KV region ${i} is ${r.kind} on device ${r.deviceId}, region 0 ${m.kind} on device ${m.deviceId}: a worker's KV must be in one memory (all host, or all on one CUDA device)`);
  });
  return m;
}

/** The wire layout of a consumer cache as nixl-common's mapping takes it (no block count on the wire: the regions bound it). */
/** R of a peer's attention cache (SPEC 1, `replicaCount`); one that cannot be told is a layout mismatch. */
function peerReplicas(c: Extract<WireCache, { kind: 'attention' }>, tpSize: number): number {
  try {
    return replicaCount(c, tpSize);
  } catch (e) {
    throw e instanceof ReplicaCountError ? new LayoutMismatchError(e.message) : e;
  }
}

function wireToLayout(c: WireCache, tpSize: number): CacheLayout {
  if (c.kind === 'attention') {
    return {
      kind: 'attention',
      group: c.group,
      name: c.name,
      dtype: c.dtype,
      numBlocks: Number.POSITIVE_INFINITY,
      blockSize: c.blockSize,
      localHeads: c.localHeads,
      replicas: peerReplicas(c, tpSize),
      parts: c.parts.map((p) => ({ ...p, kernelBlockTokens: p.kernelBlockTokens ?? c.blockSize, kernelBlockStride: p.kernelBlockStride ?? 0 })),
    };
  }
  return { kind: 'state', group: c.group, name: c.name, numBlocks: Number.POSITIVE_INFINITY, states: c.states.map((s) => ({ ...s, split: s.split ?? null })) };
}

/** Refuses a state with a TP split on one side only (nixl-common's mapping would copy it whole between equal TP sizes). */
function checkSplits(p: ProducerSide, c: ConsumerSide): void {
  const mine = new Map(p.caches.groups.flatMap((g) => g.caches.map((v) => [v.name, v] as const)));
  for (const cc of c.caches) {
    const pv = mine.get(cc.name);
    if (cc.kind !== 'state' || pv?.kind !== 'state') continue;
    cc.states.forEach((sd, k) => {
      if (!sd.split !== !pv.states[k]?.split) throw new LayoutMismatchError(`${cc.name} state ${k}: a TP split on one side only`);
    });
  }
}

/**
 * The bytes this producer worker writes for one consumer worker's load: nixl-common's
 * {@link planTransfer} over this worker alone (a partial producer side: the cells other producer
 * workers hold, and the caches of other PP stages, are left to them). Descriptors are coalesced and
 * sorted by consumer address.
 * @throws LayoutMismatchError when the layouts disagree (cache kinds, parts, dtypes, state shapes,
 *   a state without a TP split across different TP sizes), or the load names tokens or blocks
 *   the producer does not have.
 */
export function planWrites(p: ProducerSide, c: ConsumerSide, load: WireLoad): WritePlan {
  if (load.numTokens > p.numTokens) throw new LayoutMismatchError(`the consumer asks for ${load.numTokens} tokens; the producer computed ${p.numTokens}`);
  checkSplits(p, c);
  const mine = workerMemory(p.regions);
  const theirs: WireMemory = c.memory ?? { kind: 'DRAM', deviceId: 0 };
  const producer = buildRankInfo(p.caches, 'producer', new Uint8Array(0), p.regions);
  const consumer: RankInfo = {
    tpRank: c.tpRank,
    tpSize: c.tpSize,
    ppRank: 0,
    ppSize: 1,
    agentName: 'consumer',
    agentMetadata: new Uint8Array(0),
    regions: c.regions.map(([addr, length]) => ({ addr, length, kind: theirs.kind, deviceId: theirs.deviceId })),
    caches: c.caches.map((x) => wireToLayout(x, c.tpSize)),
  };
  let plans;
  try {
    plans = planTransfer({ dst: consumer, producer: { tpSize: producer.tpSize, ranks: [producer], partial: true }, dstBlocks: load.blocks, srcBlocks: p.blocks, firstToken: load.firstToken, numTokens: load.numTokens });
  } catch (e) {
    throw e instanceof PlanError ? new LayoutMismatchError(e.message) : e;
  }
  const plan = plans[0];
  return {
    local: plan?.pairs.map((x) => ({ addr: x.src, length: x.len, deviceId: mine.deviceId })) ?? [],
    remote: plan?.pairs.map((x) => ({ addr: x.dst, length: x.len, deviceId: theirs.deviceId })) ?? [],
    localKind: mine.kind,
    remoteKind: theirs.kind,
    bytes: plan?.bytes ?? 0,
    cells: plan?.cells ?? 0,
  };
}

/**
 * Workers: one per TP rank and PP stage (objects in one process). A worker holds its shard of every
 * cache of its stage's layers in `Uint8Array` memory regions, in the configured physical layout and
 * dtype, described by @kvconnect/checksum views, and computes its part of each layer's mixer from
 * and into those caches (so what a connector loads is what the model reads).
 *
 * TP sharding (vLLM): query heads `numHeads / tp` per rank; KV heads `numKvHeads / tp` per rank, or
 * with `numKvHeads < tp` one KV head per rank replicated on `R = tp / numKvHeads` consecutive ranks;
 * MLA latent and indexer caches are held whole by every rank (R = tp); Mamba2 x channels and heads
 * are sharded, B and C groups sharded when `nGroups % tp == 0`, else replicated (`tp / nGroups` ranks
 * share a group). Every head/channel is computed with the same float operations in the same order
 * whatever the rank, and outputs are gathered in global order by the executor: numerics do not
 * depend on TP, PP or block size.
 *
 * Device mode (`WorkerOptions.device`, the engine's `--device cuda | cuda-emulated`): the KV cache
 * is device memory ({@link Worker.deviceRegions}, one allocation per region, through
 * `DeviceMemory` of @kvconnect/transfer), and that is what the connector registers and the KV
 * checksum worker sums. The model still computes on the host, from a host mirror of the cache
 * ({@link Worker.regions}): before a layer reads positions it did not write itself (loaded KV,
 * a loaded state), it copies their blocks device to host; right after it wrote new positions
 * (before `saveKvLayer`), it copies their blocks host to device. The device is the KV's truth.
 * @module
 */
import { softmaxExp } from './model/softmax-exp.js';
import {
  DTYPE_BYTES,
  contiguousStrides,
  mamba2StateLayout,
  pagedAttentionBytes,
  pagedAttentionCache,
  pagedStateCache,
  vectorCache,
  type AttentionCacheView,
  type AttentionPart,
  type GroupSpec,
  type StateCacheView,
  type StateTensor,
  type CacheView,
} from '@kvconnect/checksum';
import { replicaCount, type DeviceMemoryRegion } from '@kvconnect/checksum';
import { EmulatedDeviceMemory, deviceMemoryOf, type DeviceMemory, type KVDeviceMode } from '@kvconnect/transfer';
import { SharedHostArena } from '@kvconnect/transfer';
import type { KVCacheGroupConfig, KVChecksumWorkerHooks, KVConnectorWorker, WorkerKVCaches } from './contracts.js';
import { readElem, writeElem, type KvDtype } from './dtype.js';
import { attnLayerName, indexerLayerName, mambaLayerName, stageLayers, type ModelConfig } from './model/config.js';
import { applyRope, dotRow, silu, type AttentionWeights, type Mamba2Weights, type MlaWeights } from './model/weights.js';
import { attentionNative, nativeForward } from './model/native-forward.js';

/** Physical layout of the paged attention caches (see @kvconnect/checksum `pagedAttentionCache`). */
export interface CacheLayout {
  /** Order inside a block: `NHD` = `[blockSize, heads, headSize]`, `HND` = `[heads, blockSize, headSize]`. */
  layout: 'NHD' | 'HND';
  /** How K and V are stored: one tensor `[2, blocks, ...]`, `[blocks, 2, ...]`, or two tensors. */
  kvLayout: 'kv-first' | 'block-kv' | 'separate';
}

/** One request's tokens in a forward pass. */
export interface ForwardSegment {
  requestId: string;
  /** Request position of `tokenIds[0]`. */
  start: number;
  /** Tokens at positions `start, start+1, ...`. */
  tokenIds: readonly number[];
  /** Block ids per KV cache group (the request's whole block table). */
  blocks: readonly (readonly number[])[];
  /**
   * Tokens whose cache entries already hold their KV (computed earlier or loaded): positions below
   * it are read, never rewritten (a recomputed last token after a KV load reads the loaded KV).
   */
  cacheFilled: number;
  /** Whether the executor returns logits for the segment's last token. */
  needLogits: boolean;
}

/** Options of a {@link Worker}. */
export interface WorkerOptions {
  model: ModelConfig;
  tpRank: number;
  tpSize: number;
  ppRank: number;
  ppSize: number;
  numBlocks: number;
  blockSize: number;
  cacheLayout: CacheLayout;
  kvDtype: KvDtype;
  /** Dtype of Mamba SSM states (default float32, as vLLM's `mamba_ssm_cache_dtype`). */
  ssmDtype?: KvDtype;
  groupConfigs: readonly KVCacheGroupConfig[];
  /**
   * Host KV memory (`device` cpu): `shared` (default) from shared mappings where the addon has them
   * (`SharedHostArena` of @kvconnect/transfer: the embedded agent then moves it to a peer on this
   * host by direct copies), else, and with `heap`, ordinary heap memory.
   */
  hostKv?: 'shared' | 'heap';
  /**
   * Where the KV cache lives (device mode; see the module note): `cpu` (default, host memory),
   * `cuda` or `cuda-emulated`; the worker opens it with `deviceMemoryOf` of @kvconnect/transfer.
   * A string, so that worker options cross into a worker process.
   */
  device?: KVDeviceMode;
  /** CUDA device ordinal of the KV cache in device mode (default 0). */
  deviceId?: number;
}

/**
 * Allocates one device region per host region, on `device`, and copies the host bytes in (zeros
 * at construction: so that device and host mirror start equal).
 */
export function allocateDeviceKv(dm: DeviceMemory, device: number, host: readonly Uint8Array[]): DeviceMemoryRegion[] {
  return host.map((h) => {
    const r = dm.alloc(device, h.byteLength);
    dm.copy(device, 'h2d', r.address, h, h.byteLength);
    return r;
  });
}

/** Most requests whose mirrored positions a worker remembers per layer (older ones copy again). */
const MIRROR_MEMORY = 4096;

/** Byte address of one part of a cell: (block, local head, token in block). */
export function partAddress(p: AttentionPart, blockSize: number, block: number, head: number, token: number): number {
  const kbt = p.kernelBlockTokens ?? blockSize;
  return p.offset + block * p.blockStride + Math.floor(token / kbt) * (p.kernelBlockStride ?? 0) + (token % kbt) * p.tokenStride + head * p.headStride;
}

/** Byte address of element `idx` (multi-index) of state `s` in block `block`. */
export function stateAddress(s: StateTensor, block: number, idx: readonly number[]): number {
  const st = s.strides ?? contiguousStrides(s.shape, DTYPE_BYTES[s.dtype]);
  let a = s.offset + block * s.blockStride;
  for (let d = 0; d < idx.length; d++) a += idx[d] * st[d];
  return a;
}

/** The local Mamba2 sizes of a rank. */
interface MambaShard {
  xLocal: number;
  headsLocal: number;
  groupsLocal: number;
  firstGroup: number;
  convDimLocal: number;
}

/**
 * A TP rank of a PP stage: cache memory, views, connector and checksum worker halves, and the
 * rank's share of each mixer's compute.
 */
export class Worker {
  readonly tpRank: number;
  readonly tpSize: number;
  readonly ppRank: number;
  readonly ppSize: number;
  /** Layers `[start, end)` of this worker's stage. */
  readonly layers: [number, number];
  /** Host memory of the caches (device mode: the host mirror the model computes from). */
  readonly regions: Uint8Array[] = [];
  /** Device mode: the device memory of each region (what connectors and checksums see); else null. */
  readonly deviceRegions: DeviceMemoryRegion[] | null = null;
  /** Caches per group, in group order (views over {@link regions}). */
  readonly groups: GroupSpec[];
  /** The connector's worker half (set by the engine). */
  connector: KVConnectorWorker | null = null;
  /** The checksum worker (set by the engine when checksums are on). */
  checksum: KVChecksumWorkerHooks | null = null;

  private readonly m: ModelConfig;
  private readonly o: WorkerOptions;
  private readonly attn = new Map<number, AttentionCacheView>();
  private readonly indexer = new Map<number, AttentionCacheView>();
  private readonly state = new Map<number, StateCacheView>();
  private readonly groupOfLayer = new Map<number, number>();
  private readonly mambaShard: MambaShard | null = null;
  private readonly dm: DeviceMemory | null;
  private readonly deviceId: number;
  /** Device mode: per layer, request -> positions `[0, n)` whose blocks the host mirror holds. */
  private readonly mirrored = new Map<number, Map<string, number>>();

  constructor(o: WorkerOptions) {
    this.o = o;
    this.m = o.model;
    this.tpRank = o.tpRank;
    this.tpSize = o.tpSize;
    this.ppRank = o.ppRank;
    this.ppSize = o.ppSize;
    this.layers = stageLayers(this.m.layerTypes.length, o.ppSize, o.ppRank);
    const groupCaches: CacheView[][] = o.groupConfigs.map(() => []);
    const groupIndex = (kind: KVCacheGroupConfig['kind']) => o.groupConfigs.findIndex((g) => g.kind === kind);
    const tp = o.tpSize;
    if (this.m.mamba) {
      const mb = this.m.mamba;
      const inner = mb.numHeads * mb.headDim;
      const replicated = mb.nGroups % tp !== 0;
      const groupsLocal = replicated ? 1 : mb.nGroups / tp;
      const firstGroup = replicated ? Math.floor(o.tpRank / (tp / mb.nGroups)) : o.tpRank * groupsLocal;
      this.mambaShard = { xLocal: inner / tp, headsLocal: mb.numHeads / tp, groupsLocal, firstGroup, convDimLocal: inner / tp + 2 * groupsLocal * mb.dState };
    }
    for (let li = this.layers[0]; li < this.layers[1]; li++) {
      const type = this.m.layerTypes[li];
      if (type === 'attention' || type === 'sliding') {
        const g = groupIndex(type === 'attention' ? 'full-attention' : 'sliding-window');
        const localKv = this.m.numKvHeads >= tp ? this.m.numKvHeads / tp : 1;
        const sizes = { dtype: o.kvDtype, numBlocks: o.numBlocks, blockSize: o.blockSize, numHeads: localKv, headSize: this.m.headDim, kvLayout: o.cacheLayout.kvLayout } as const;
        const bytes = pagedAttentionBytes(sizes);
        const region = this.addRegion(bytes);
        const v = o.cacheLayout.kvLayout === 'separate' ? { region: this.addRegion(bytes) } : undefined;
        const view = pagedAttentionCache({ ...sizes, name: attnLayerName(li), layout: o.cacheLayout.layout, at: { region }, v, replication: { totalKvHeads: this.m.numKvHeads } });
        this.attn.set(li, view);
        groupCaches[g].push(view);
        this.groupOfLayer.set(li, g);
      } else if (type === 'mla') {
        const c = this.m.mla!;
        const g = groupIndex('full-attention');
        const eb = DTYPE_BYTES[o.kvDtype];
        const width = c.kvLoraRank + c.ropeDim;
        const latent = vectorCache({ name: attnLayerName(li), dtype: o.kvDtype, numBlocks: o.numBlocks, blockSize: o.blockSize, width, at: { region: this.addRegion(o.numBlocks * o.blockSize * width * eb) } });
        this.attn.set(li, latent);
        groupCaches[g].push(latent);
        if (c.indexerDim > 0) {
          const idx = vectorCache({ name: indexerLayerName(li), dtype: o.kvDtype, numBlocks: o.numBlocks, blockSize: o.blockSize, width: c.indexerDim, at: { region: this.addRegion(o.numBlocks * o.blockSize * c.indexerDim * eb) } });
          this.indexer.set(li, idx);
          groupCaches[g].push(idx);
        }
        this.groupOfLayer.set(li, g);
      } else {
        const mb = this.m.mamba!;
        const g = groupIndex('state');
        const layout = mamba2StateLayout({
          tpSize: tp,
          intermediateSize: mb.numHeads * mb.headDim,
          nGroups: mb.nGroups,
          dState: mb.dState,
          convKernel: mb.convKernel,
          numHeads: mb.numHeads,
          headDim: mb.headDim,
          convDimFirst: true,
          convDtype: o.kvDtype,
          ssmDtype: o.ssmDtype ?? 'float32',
        });
        if (!layout) throw new RangeError(`mamba2 layer ${li}: TP ${tp} does not divide its sizes`);
        let pageBytes = 0;
        for (const s of layout.states) pageBytes += s.shape.reduce((a, b) => a * b, 1) * DTYPE_BYTES[s.dtype];
        const view = pagedStateCache({ name: mambaLayerName(li), numBlocks: o.numBlocks, at: { region: this.addRegion(o.numBlocks * pageBytes) }, pageBytes, layout });
        this.state.set(li, view);
        groupCaches[g].push(view);
        this.groupOfLayer.set(li, g);
      }
    }
    this.groups = o.groupConfigs.map((gc, i) => ({ groupId: gc.groupId, caches: groupCaches[i] }));
    this.dm = deviceMemoryOf(o.device ?? 'cpu');
    this.deviceId = o.deviceId ?? 0;
    if (this.dm) this.deviceRegions = allocateDeviceKv(this.dm, this.deviceId, this.regions);
  }

  /** Allocator of host KV regions (see {@link WorkerOptions.hostKv}); made on first use. */
  private hostArena: SharedHostArena | null = null;

  private addRegion(bytes: number): number {
    this.hostArena ??= new SharedHostArena({ shared: this.o.hostKv !== 'heap' && (this.o.device ?? 'cpu') === 'cpu' });
    this.regions.push(this.hostArena.alloc(bytes));
    return this.regions.length - 1;
  }

  /** This worker's caches as connectors and the checksum worker see them (`registerKvCaches`). */
  kvCaches(): WorkerKVCaches {
    return {
      rank: { tpRank: this.tpRank, tpSize: this.tpSize },
      ppRank: this.ppRank,
      ppSize: this.ppSize,
      regions: (this.deviceRegions ?? this.regions) as WorkerKVCaches['regions'],
      groups: this.groups,
      groupConfigs: this.o.groupConfigs,
    };
  }

  /**
   * The caches the KV checksum worker sums: {@link kvCaches} (device regions in device mode);
   * with emulated device memory, host views of that same emulated device memory (the bytes the
   * connector moved), so that any checksum backend can read them.
   */
  checksumKvCaches(): WorkerKVCaches {
    const c = this.kvCaches();
    const dm = this.dm;
    if (!(dm instanceof EmulatedDeviceMemory) || !this.deviceRegions) return c;
    return { ...c, regions: this.deviceRegions.map((r) => dm.hostView(r.address, r.bytes)) };
  }

  /** Frees the device memory of the caches (device mode); the worker is unusable afterwards. */
  freeDevice(): void {
    if (!this.dm || !this.deviceRegions) return;
    for (const r of this.deviceRegions.splice(0)) this.dm.free(r);
  }

  // -------------------------------------------------------------------------------------------
  // Device mode: the host mirror
  // -------------------------------------------------------------------------------------------

  /** Copies `[start, start + bytes)` of region `region` device -> host (`in`) or host -> device. */
  private copyRun(region: number, start: number, bytes: number, toHost: boolean): void {
    const h = this.regions[region].subarray(start, start + bytes);
    const d = this.deviceRegions![region].address + BigInt(start);
    if (toHost) this.dm!.copy(this.deviceId, 'd2h', h, d, bytes);
    else this.dm!.copy(this.deviceId, 'h2d', d, h, bytes);
  }

  /** Copies block `block` of every cache layer `li` uses (one run per dense part, else per cell). */
  private copyBlock(li: number, block: number, toHost: boolean): void {
    for (const v of [this.attn.get(li), this.indexer.get(li)]) {
      if (!v) continue;
      const B = v.blockSize;
      for (const p of v.parts) {
        const lo = partAddress(p, B, block, 0, 0);
        const hi = partAddress(p, B, block, v.localHeads - 1, B - 1) + p.bytes;
        if (hi - lo === B * v.localHeads * p.bytes) this.copyRun(p.region, lo, hi - lo, toHost);
        else for (let t = 0; t < B; t++) for (let h = 0; h < v.localHeads; h++) this.copyRun(p.region, partAddress(p, B, block, h, t), p.bytes, toHost);
      }
    }
    const sv = this.state.get(li);
    if (sv) {
      for (const st of sv.states) {
        const eb = DTYPE_BYTES[st.dtype];
        const lo = st.offset + block * st.blockStride;
        const n = st.shape.reduce((a, b) => a * b, 1);
        const hi = stateAddress(st, block, st.shape.map((d) => d - 1)) + eb;
        if (hi - lo === n * eb) this.copyRun(st.region, lo, hi - lo, toHost);
        else {
          const idx = new Array<number>(st.shape.length).fill(0);
          for (let k = 0; k < n; k++) {
            this.copyRun(st.region, stateAddress(st, block, idx), eb, toHost);
            for (let d = idx.length - 1; d >= 0 && ++idx[d] === st.shape[d]; d--) idx[d] = 0;
          }
        }
      }
    }
  }

  /** Device mode, before layer `li` reads: device -> host for positions it did not write itself. */
  private mirrorIn(li: number, segs: readonly ForwardSegment[]): void {
    if (!this.dm) return;
    const g = this.groupOfLayer.get(li)!;
    const seen = this.mirrored.get(li);
    const state = this.state.has(li);
    const window = this.o.groupConfigs[g].kind === 'sliding-window' ? (this.m.slidingWindow ?? Infinity) : Infinity;
    for (const seg of segs) {
      const had = seen?.get(seg.requestId);
      let lo = had !== undefined && had <= seg.start ? had : 0; // a restart (preemption) re-reads everything
      const hi = seg.cacheFilled;
      if (lo >= hi) continue;
      const blocks = seg.blocks[g];
      if (state) {
        this.copyBlock(li, blocks[0], true);
        continue;
      }
      if (Number.isFinite(window)) lo = Math.max(lo, seg.start - window + 1, 0);
      const B = this.o.blockSize;
      for (let b = Math.floor(lo / B); b <= Math.floor((hi - 1) / B); b++) if (blocks[b] !== undefined && blocks[b] >= 0) this.copyBlock(li, blocks[b], true);
    }
  }

  /** Device mode, after layer `li` wrote: host -> device for the blocks of the new positions. */
  private mirrorOut(li: number, segs: readonly ForwardSegment[]): void {
    if (!this.dm) return;
    const g = this.groupOfLayer.get(li)!;
    let seen = this.mirrored.get(li);
    if (!seen) this.mirrored.set(li, (seen = new Map()));
    const B = this.o.blockSize;
    for (const seg of segs) {
      const end = seg.start + seg.tokenIds.length;
      const from = Math.max(seg.start, seg.cacheFilled);
      const blocks = seg.blocks[g];
      if (this.state.has(li)) {
        if (from < end || (seg.start === 0 && seg.cacheFilled === 0)) this.copyBlock(li, blocks[0], false);
      } else if (from < end) {
        for (let b = Math.floor(from / B); b <= Math.floor((end - 1) / B); b++) this.copyBlock(li, blocks[b], false);
      }
      seen.delete(seg.requestId);
      seen.set(seg.requestId, end);
      if (seen.size > MIRROR_MEMORY) seen.delete(seen.keys().next().value!);
    }
  }

  /** The cache names layer `li` reads and writes (for `waitForLayerLoad` / `saveKvLayer`). */
  cacheNames(li: number): string[] {
    const names: string[] = [];
    const a = this.attn.get(li);
    if (a) names.push(a.name);
    const ix = this.indexer.get(li);
    if (ix) names.push(ix.name);
    const s = this.state.get(li);
    if (s) names.push(s.name);
    return names;
  }

  /** Query heads `[first, first + count)` this rank computes. */
  queryHeads(): [number, number] {
    const n = this.m.numHeads / this.tpSize;
    return [this.tpRank * n, n];
  }

  // -------------------------------------------------------------------------------------------
  // Attention (full and sliding window)
  // -------------------------------------------------------------------------------------------

  /**
   * GQA attention of layer `li` for this rank's query heads: writes the new tokens' K/V of its KV
   * heads, then attends over the cache in token order. Writes head `q`'s output of token `i` to
   * `out[i * numHeads * headDim + q * headDim ...]`.
   */
  attention(li: number, w: AttentionWeights, hn: Float32Array, segs: readonly ForwardSegment[], out: Float32Array): void {
    this.mirrorIn(li, segs);
    const m = this.m;
    const view = this.attn.get(li)!;
    const g = this.groupOfLayer.get(li)!;
    const dt = this.o.kvDtype;
    const eb = DTYPE_BYTES[dt];
    const H = m.hiddenSize;
    const hd = m.headDim;
    const local = view.localHeads;
    const R = replicaCount(view, this.tpSize);
    const shard = Math.floor(this.tpRank / R);
    const [kp, vp] = view.parts;
    const B = view.blockSize;
    const mem = this.regions;
    const kmem = mem[kp.region];
    const vmem = mem[vp.region];
    const [q0, nq] = this.queryHeads();
    const qPerKv = m.numHeads / m.numKvHeads;
    const window = w.kind === 'sliding' ? m.slidingWindow! : Infinity;
    const scale = 1 / Math.sqrt(hd);
    const nf = nativeForward(); // the same computation on the native kernels (model/native-forward.ts)
    if (nf) {
      attentionNative(nf, { model: m, kp, vp, kmem, vmem, dtype: dt, eb, blockSize: B, local, shard, q0, nq, window, group: g }, w, hn, segs, out);
      this.mirrorOut(li, segs);
      return;
    }
    const tmp = new Float32Array(hd);
    let t0 = 0;
    for (const seg of segs) {
      const n = seg.tokenIds.length;
      const blocks = seg.blocks[g];
      // Write the new tokens' K and V (positions not already in the cache).
      for (let j = 0; j < n; j++) {
        const pos = seg.start + j;
        if (pos < seg.cacheFilled) continue;
        const block = blocks[Math.floor(pos / B)];
        for (let h = 0; h < local; h++) {
          const gk = shard * local + h;
          for (let d = 0; d < hd; d++) tmp[d] = dotRow(w.k, gk * hd + d, hn, (t0 + j) * H);
          applyRope(tmp, 0, hd, pos, m.ropeTheta);
          let a = partAddress(kp, B, block, h, pos % B);
          for (let d = 0; d < hd; d++) writeElem(kmem, a + d * eb, dt, tmp[d]);
          for (let d = 0; d < hd; d++) tmp[d] = dotRow(w.v, gk * hd + d, hn, (t0 + j) * H);
          a = partAddress(vp, B, block, h, pos % B);
          for (let d = 0; d < hd; d++) writeElem(vmem, a + d * eb, dt, tmp[d]);
        }
      }
      // Read K/V of the context once.
      const end = seg.start + n;
      const lo0 = Number.isFinite(window) ? Math.max(0, seg.start - window + 1) : 0;
      const K = new Float32Array(local * end * hd);
      const V = new Float32Array(local * end * hd);
      for (let pos = lo0; pos < end; pos++) {
        const block = blocks[Math.floor(pos / B)];
        for (let h = 0; h < local; h++) {
          const ka = partAddress(kp, B, block, h, pos % B);
          const va = partAddress(vp, B, block, h, pos % B);
          const o = (h * end + pos) * hd;
          for (let d = 0; d < hd; d++) {
            K[o + d] = readElem(kmem, ka + d * eb, dt);
            V[o + d] = readElem(vmem, va + d * eb, dt);
          }
        }
      }
      const q = new Float32Array(hd);
      const acc = new Float64Array(hd);
      for (let qh = q0; qh < q0 + nq; qh++) {
        const hl = Math.floor(qh / qPerKv) - shard * local;
        for (let j = 0; j < n; j++) {
          const pos = seg.start + j;
          for (let d = 0; d < hd; d++) q[d] = dotRow(w.q, qh * hd + d, hn, (t0 + j) * H);
          applyRope(q, 0, hd, pos, m.ropeTheta);
          const lo = Number.isFinite(window) ? Math.max(0, pos - window + 1) : 0;
          const o = (t0 + j) * m.numHeads * hd + qh * hd;
          softmaxAttend(pos - lo + 1, (t) => {
            const kb = (hl * end + lo + t) * hd;
            let s = 0;
            for (let d = 0; d < hd; d++) s += q[d] * K[kb + d];
            return s * scale;
          }, (t, p) => {
            const vb = (hl * end + lo + t) * hd;
            for (let d = 0; d < hd; d++) acc[d] += p * V[vb + d];
          }, acc);
          for (let d = 0; d < hd; d++) out[o + d] = acc[d];
        }
      }
      t0 += n;
    }
    this.mirrorOut(li, segs);
  }

  // -------------------------------------------------------------------------------------------
  // MLA
  // -------------------------------------------------------------------------------------------

  /**
   * MLA-style attention of layer `li`: every rank writes the whole latent `[c, k_rope]` and indexer
   * key of each new token; its query heads attend with keys/values up-projected from the latent,
   * plus the indexer score as a logit bias. Output head `q` at `out[i * numHeads * vDim + q * vDim]`.
   */
  mla(li: number, w: MlaWeights, hn: Float32Array, segs: readonly ForwardSegment[], out: Float32Array): void {
    this.mirrorIn(li, segs);
    const m = this.m;
    const c = m.mla!;
    const view = this.attn.get(li)!;
    const iview = this.indexer.get(li) ?? null;
    const g = this.groupOfLayer.get(li)!;
    const dt = this.o.kvDtype;
    const eb = DTYPE_BYTES[dt];
    const H = m.hiddenSize;
    const B = view.blockSize;
    const width = c.kvLoraRank + c.ropeDim;
    const r = c.kvLoraRank;
    const lp = view.parts[0];
    const lmem = this.regions[lp.region];
    const ip = iview?.parts[0];
    const imem = ip ? this.regions[ip.region] : null;
    const idim = c.indexerDim;
    const [q0, nq] = this.queryHeads();
    const qd = c.nopeDim + c.ropeDim;
    const scale = 1 / Math.sqrt(qd);
    const iscale = idim > 0 ? 1 / Math.sqrt(idim) : 0;
    const vec = new Float32Array(Math.max(width, idim));
    let t0 = 0;
    for (const seg of segs) {
      const n = seg.tokenIds.length;
      const blocks = seg.blocks[g];
      for (let j = 0; j < n; j++) {
        const pos = seg.start + j;
        if (pos < seg.cacheFilled) continue;
        const block = blocks[Math.floor(pos / B)];
        const x = (t0 + j) * H;
        for (let i = 0; i < r; i++) vec[i] = dotRow(w.dkv, i, hn, x);
        for (let i = 0; i < c.ropeDim; i++) vec[r + i] = dotRow(w.kr, i, hn, x);
        applyRope(vec, r, c.ropeDim, pos, m.ropeTheta);
        const a = partAddress(lp, B, block, 0, pos % B);
        for (let i = 0; i < width; i++) writeElem(lmem, a + i * eb, dt, vec[i]);
        if (ip && imem && w.ik) {
          for (let i = 0; i < idim; i++) vec[i] = dotRow(w.ik, i, hn, x);
          const ia = partAddress(ip, B, block, 0, pos % B);
          for (let i = 0; i < idim; i++) writeElem(imem, ia + i * eb, dt, vec[i]);
        }
      }
      const end = seg.start + n;
      const L = new Float32Array(end * width);
      const IK = new Float32Array(end * Math.max(idim, 1));
      for (let pos = 0; pos < end; pos++) {
        const block = blocks[Math.floor(pos / B)];
        const a = partAddress(lp, B, block, 0, pos % B);
        for (let i = 0; i < width; i++) L[pos * width + i] = readElem(lmem, a + i * eb, dt);
        if (ip && imem) {
          const ia = partAddress(ip, B, block, 0, pos % B);
          for (let i = 0; i < idim; i++) IK[pos * idim + i] = readElem(imem, ia + i * eb, dt);
        }
      }
      // Indexer query per token (shared by every head).
      const IQ = new Float32Array(n * Math.max(idim, 1));
      if (w.iq) for (let j = 0; j < n; j++) for (let i = 0; i < idim; i++) IQ[j * idim + i] = dotRow(w.iq, i, hn, (t0 + j) * H);
      const kn = new Float32Array(end * c.nopeDim);
      const vv = new Float32Array(end * c.vDim);
      const q = new Float32Array(qd);
      const acc = new Float64Array(c.vDim);
      for (let qh = q0; qh < q0 + nq; qh++) {
        for (let pos = 0; pos < end; pos++) {
          for (let d = 0; d < c.nopeDim; d++) kn[pos * c.nopeDim + d] = dotRow(w.uk, qh * c.nopeDim + d, L, pos * width);
          for (let d = 0; d < c.vDim; d++) vv[pos * c.vDim + d] = dotRow(w.uv, qh * c.vDim + d, L, pos * width);
        }
        for (let j = 0; j < n; j++) {
          const pos = seg.start + j;
          for (let d = 0; d < qd; d++) q[d] = dotRow(w.q, qh * qd + d, hn, (t0 + j) * H);
          applyRope(q, c.nopeDim, c.ropeDim, pos, m.ropeTheta);
          const o = (t0 + j) * m.numHeads * c.vDim + qh * c.vDim;
          softmaxAttend(pos + 1, (t) => {
            let s = 0;
            for (let d = 0; d < c.nopeDim; d++) s += q[d] * kn[t * c.nopeDim + d];
            for (let d = 0; d < c.ropeDim; d++) s += q[c.nopeDim + d] * L[t * width + r + d];
            let b = 0;
            for (let i = 0; i < idim; i++) b += IQ[j * idim + i] * IK[t * idim + i];
            return s * scale + b * iscale;
          }, (t, p) => {
            for (let d = 0; d < c.vDim; d++) acc[d] += p * vv[t * c.vDim + d];
          }, acc);
          for (let d = 0; d < c.vDim; d++) out[o + d] = acc[d];
        }
      }
      t0 += n;
    }
    this.mirrorOut(li, segs);
  }

  // -------------------------------------------------------------------------------------------
  // Mamba2
  // -------------------------------------------------------------------------------------------

  /**
   * Mamba2-style mixer of layer `li` for this rank's heads and channels, token by token through the
   * state cache (conv state `[x | B | C rows, K-1]`, SSM state `[heads, headDim, dState]`). The
   * conv uses K-1 taps over the post-update window, so a token's output follows from the state
   * after it: a recomputed last token (after a KV load) reads the loaded state without updating
   * it. Writes channel `ch` of token `i` to `out[i * inner + ch]`.
   */
  mamba(li: number, w: Mamba2Weights, hn: Float32Array, segs: readonly ForwardSegment[], out: Float32Array): void {
    this.mirrorIn(li, segs);
    const m = this.m;
    const mb = m.mamba!;
    const sh = this.mambaShard!;
    const view = this.state.get(li)!;
    const g = this.groupOfLayer.get(li)!;
    const [convS, ssmS] = view.states;
    const cmem = this.regions[convS.region];
    const smem = this.regions[ssmS.region];
    const cdt = convS.dtype as KvDtype;
    const sdt = ssmS.dtype as KvDtype;
    const ceb = DTYPE_BYTES[cdt];
    const seb = DTYPE_BYTES[sdt];
    const cst = convS.strides ?? contiguousStrides(convS.shape, ceb);
    const sst = ssmS.strides ?? contiguousStrides(ssmS.shape, seb);
    const H = m.hiddenSize;
    const taps = mb.convKernel - 1;
    const inner = mb.numHeads * mb.headDim;
    const N = mb.dState;
    const gRows = sh.groupsLocal * N;
    const headsPerGroup = mb.numHeads / mb.nGroups;
    // Global conv channel of each local conv row, and the weight row producing it.
    const rowsL = sh.convDimLocal;
    const globalCh = new Int32Array(rowsL);
    for (let i = 0; i < sh.xLocal; i++) globalCh[i] = this.tpRank * sh.xLocal + i;
    for (let i = 0; i < gRows; i++) {
      globalCh[sh.xLocal + i] = inner + sh.firstGroup * N + i;
      globalCh[sh.xLocal + gRows + i] = inner + mb.nGroups * N + sh.firstGroup * N + i;
    }
    const inp = new Float32Array(rowsL);
    const conv = new Float32Array(rowsL);
    let t0 = 0;
    for (const seg of segs) {
      const n = seg.tokenIds.length;
      const block = seg.blocks[g][0];
      const cbase = convS.offset + block * convS.blockStride;
      const sbase = ssmS.offset + block * ssmS.blockStride;
      if (seg.start === 0 && seg.cacheFilled === 0) {
        // A fresh running state: zero both states of the block.
        for (let rr = 0; rr < rowsL; rr++) for (let k = 0; k < taps; k++) writeElem(cmem, cbase + rr * cst[0] + k * cst[1], cdt, 0);
        for (let h = 0; h < sh.headsLocal; h++) for (let p = 0; p < mb.headDim; p++) for (let s = 0; s < N; s++) writeElem(smem, sbase + h * sst[0] + p * sst[1] + s * sst[2], sdt, 0);
      }
      for (let j = 0; j < n; j++) {
        const pos = seg.start + j;
        const replay = pos < seg.cacheFilled;
        const x = (t0 + j) * H;
        if (!replay) {
          for (let rr = 0; rr < rowsL; rr++) {
            const gc = globalCh[rr];
            inp[rr] = gc < inner ? dotRow(w.x, gc, hn, x) : gc < inner + mb.nGroups * N ? dotRow(w.b, gc - inner, hn, x) : dotRow(w.c, gc - inner - mb.nGroups * N, hn, x);
            const ra = cbase + rr * cst[0];
            for (let k = 0; k < taps - 1; k++) writeElem(cmem, ra + k * cst[1], cdt, readElem(cmem, ra + (k + 1) * cst[1], cdt));
            writeElem(cmem, ra + (taps - 1) * cst[1], cdt, inp[rr]);
          }
        }
        for (let rr = 0; rr < rowsL; rr++) {
          const gc = globalCh[rr];
          const ra = cbase + rr * cst[0];
          let acc = w.convB[gc];
          for (let k = 0; k < taps; k++) acc += w.convW[gc * taps + k] * readElem(cmem, ra + k * cst[1], cdt);
          conv[rr] = Math.fround(silu(acc));
        }
        for (let hl = 0; hl < sh.headsLocal; hl++) {
          const gh = this.tpRank * sh.headsLocal + hl;
          const gl = Math.floor(gh / headsPerGroup) - sh.firstGroup;
          const dtRaw = dotRow(w.dt, gh, hn, x) + w.dtBias[gh];
          const dtv = Math.fround(dtRaw > 20 ? dtRaw : Math.log1p(Math.exp(dtRaw)));
          const dA = Math.fround(Math.exp(-dtv * Math.exp(w.aLog[gh])));
          for (let p = 0; p < mb.headDim; p++) {
            const xv = conv[hl * mb.headDim + p];
            let y = 0;
            for (let s = 0; s < N; s++) {
              const a = sbase + hl * sst[0] + p * sst[1] + s * sst[2];
              if (!replay) {
                const prev = readElem(smem, a, sdt);
                writeElem(smem, a, sdt, dA * prev + dtv * xv * conv[sh.xLocal + gl * N + s]);
              }
              y += readElem(smem, a, sdt) * conv[sh.xLocal + gRows + gl * N + s];
            }
            y += w.d[gh] * xv;
            const ch = gh * mb.headDim + p;
            out[(t0 + j) * inner + ch] = Math.fround(y * silu(dotRow(w.z, ch, hn, x)));
          }
        }
      }
      t0 += n;
    }
    this.mirrorOut(li, segs);
  }
}

/**
 * Softmax attention over `n` keys in index order: `score(t)` for each (float64), the weights
 * `p = softmaxExp(score - max) / sum` (model/softmax-exp.ts: a float32 exponential, as attention
 * kernels compute it; the sum and the division in float64), then, after zeroing `out`, `acc(t, p)`
 * in index order, which adds `p * v[t]` into `out`. Deterministic: fixed order, float64 apart from
 * the exponential; the caller rounds `out` to float32 once (when it stores the row into a
 * Float32Array), not after every addition. native/src/forward_kernel.inc (`attendGroup`,
 * `attendByPosition`) computes the same bits.
 */
function softmaxAttend(n: number, score: (t: number) => number, acc: (t: number, p: number) => void, out: Float64Array): void {
  const s = new Float64Array(n);
  let mx = -Infinity;
  for (let t = 0; t < n; t++) {
    s[t] = score(t);
    if (s[t] > mx) mx = s[t];
  }
  let sum = 0;
  for (let t = 0; t < n; t++) {
    s[t] = softmaxExp(s[t] - mx);
    sum += s[t];
  }
  out.fill(0);
  for (let t = 0; t < n; t++) acc(t, s[t] / sum);
}

/**
 * Test support (not for production): `InProcessConnector`, a KV connector that copies blocks
 * between engines of ONE process (unit tests, the harness's in-process scenarios). It moves no
 * bytes over any transport: a consumer worker reads the producer worker's memory straight from an
 * {@link InProcessBus}, an object the test creates and hands to every engine that should meet on it
 * (through the factory: {@link createInProcessConnectorFactory}, or a registry from
 * {@link inProcessRegistry}). It trusts every peer on its bus; never use it to serve. Engines whose
 * workers run in other processes cannot use it (the bus is an object of one process).
 *
 * The bus stands for the transport between engines; the two halves of one engine talk only
 * through the connector contract: the producer scheduler's leases reach its workers in the step
 * metadata ({@link InProcessMeta}), never through the bus.
 *
 * Producer workers publish their {@link WorkerKVCaches} on the bus keyed by engine id; consumer
 * workers copy logical cells per group and block position, mapping each consumer rank's global
 * heads (state rows) to the producer rank that holds them, so TP sizes, PP sizes, block sizes,
 * layouts and dtypes may differ (dtypes must match: bytes are copied).
 *
 * - Carrier of checksums: `kv_transfer_params` (sequential P/D), or `connector` for concurrent
 *   (Mooncake-style) requests that carry a `transfer_id` (the payload rides on the bus and comes
 *   back in the consumer workers' `kvChecksums`).
 * - Loads are asynchronous: `startLoadKv` schedules the copy on the event loop; a later
 *   `getTransferResults` reports it in `finishedRecving`.
 * - The producer keeps a request's blocks (`delayFree`) until every consumer worker read them (or
 *   `lease_ms` passed), then each producer worker reports it in `finishedSending`.
 * - The producer's params carry `remote_num_tokens` (the tokens whose KV it holds); a consumer whose
 *   prompt is longer (the proxy appended the first sampled token) loads only those tokens and
 *   computes the rest locally (vllm#50558).
 * - {@link InProcessBus.faultHook} sees (and may change) every copied piece: flip a bit in transit.
 *   Pieces and bytes copied are counted in {@link InProcessBus.copies} and {@link InProcessBus.bytes}.
 * @module
 */
import { KVConnectorRegistry } from '@kvconnect/core';
import { DTYPE_BYTES, contiguousStrides, replicaCount, type AttentionCacheView, type StateCacheView, type StateTensor } from '@kvconnect/checksum';
import type {
  BlockIdsPerGroup,
  ConnectorRequest,
  FinishReason,
  KVChecksumCarrier,
  KVConnectorFactory,
  KVConnectorScheduler,
  KVConnectorWorker,
  KVTransferConfig,
  LoadError,
  MatchedTokens,
  RequestFinishedResult,
  SchedulerContext,
  SchedulerOutput,
  TransferResults,
  WorkerContext,
  WorkerKVCaches,
  HostWorkerKVCaches,
} from '@kvconnect/core';
import { hostRegions } from '@kvconnect/core';
import { partAddress } from '../worker.js';

/** The name the connector registers under by default. */
export const IN_PROCESS_CONNECTOR = 'InProcessConnector';

/** Where a copied piece is (for fault hooks). */
export interface CopyContext {
  /** Consumer request id and the producer's. */
  requestId: string;
  remoteRequestId: string;
  groupId: number;
  /** Cache (layer) name. */
  name: string;
  /** Consumer worker. */
  tpRank: number;
  ppRank: number;
  /** Attention: token position, global head and part (0 = K or whole cell, 1 = V). */
  token?: number;
  head?: number;
  part?: number;
  /** State: state index and global row within its segment list. */
  state?: number;
  row?: number;
}

interface Published {
  engineId: string;
  tpSize: number;
  ppSize: number;
  workers: Map<string, HostWorkerKVCaches>;
  /** Producer request -> consumer workers that finished reading it (written by the consumers). */
  reads: Map<string, { readers: Set<string>; world: number; done: boolean }>;
}

/**
 * The bus engines of one process meet on (the stand-in for a transport): producer workers'
 * caches, concurrent-mode params and payloads, and which consumer workers read what. Create one per
 * test (or per harness run) and give it to the factory of every engine that should see the others.
 */
export class InProcessBus {
  readonly engines = new Map<string, Published>();
  /** Concurrent mode: transfer id -> the producer's params, once it finished. */
  readonly transfers = new Map<string, Record<string, unknown>>();
  /** Concurrent mode: transfer id -> encoded checksum payload (connector carrier). */
  readonly payloads = new Map<string, Uint8Array>();
  /** Called for every copied piece; may modify `bytes` (they are written to the consumer as left). */
  faultHook: ((ctx: CopyContext, bytes: Uint8Array) => void) | null = null;
  /** Pieces copied (all workers). */
  copies = 0;
  /** Bytes copied (all workers). */
  bytes = 0;
  /** When true, loads fail: the consumer workers report the request's blocks in `invalidBlockIds`. */
  failLoads = false;
  /** Loads held by {@link pause} until {@link resume}. */
  private held: Array<() => void> | null = null;

  /** Holds every load started from now on (they stay in flight). */
  pause(): void {
    this.held ??= [];
  }

  /** Lets held loads run (on the event loop) and stops holding. */
  resume(): void {
    const h = this.held ?? [];
    this.held = null;
    for (const f of h) setImmediate(f);
  }

  /** Runs `f` on the event loop, or holds it while paused. */
  defer(f: () => void): void {
    if (this.held) this.held.push(f);
    else setImmediate(f);
  }

  engine(engineId: string): Published {
    let e = this.engines.get(engineId);
    if (!e) {
      e = { engineId, tpSize: 0, ppSize: 0, workers: new Map(), reads: new Map() };
      this.engines.set(engineId, e);
    }
    return e;
  }

  /** Forgets everything (between tests). */
  reset(): void {
    this.engines.clear();
    this.transfers.clear();
    this.payloads.clear();
    this.faultHook = null;
    this.copies = 0;
    this.bytes = 0;
    this.failLoads = false;
    this.held = null;
  }

  /** A consumer worker (`reader`, of a consumer with `world` workers) finished reading a producer request. */
  markRead(engineId: string, requestId: string, reader: string, world: number): void {
    const e = this.engine(engineId);
    let r = e.reads.get(requestId);
    if (!r) e.reads.set(requestId, (r = { readers: new Set(), world, done: false }));
    r.readers.add(reader);
    r.world = world;
    if (r.readers.size >= r.world) r.done = true;
  }
}

/** A load the consumer scheduler hands to its workers (plain data). */
export interface InProcessLoad {
  requestId: string;
  remoteRequestId: string;
  remoteEngineId: string;
  localBlocks: number[][];
  remoteBlocks: number[][];
  /** First loaded token and the load's numTokens. */
  firstToken: number;
  numTokens: number;
  transferId?: string;
}

/** A finished producer request whose blocks the workers hold until read or until `expiresAt`. */
export interface InProcessLease {
  requestId: string;
  /** Epoch milliseconds (`Date.now()`) after which the blocks are released unread. */
  expiresAt: number;
}

/** Scheduler-to-worker metadata of one step (plain data). */
export interface InProcessMeta {
  /** Consumer: loads to start. */
  loads: InProcessLoad[];
  /** Producer: requests finished since the previous step, whose blocks wait for their readers. */
  leases: InProcessLease[];
}

/** The connector's factory type: step metadata {@link InProcessMeta}; no worker or handshake metadata. */
export type InProcessConnectorFactory = KVConnectorFactory<InProcessMeta, never, never>;

const isStr = (x: unknown): x is string => typeof x === 'string' && x.length > 0;

class InProcessScheduler implements KVConnectorScheduler<InProcessMeta, never, never> {
  private pending: InProcessLoad[] = [];
  private leases: InProcessLease[] = [];
  private readonly asked = new Map<string, number>();
  private readonly leaseMs: number;

  constructor(
    private readonly bus: InProcessBus,
    private readonly config: KVTransferConfig,
    private readonly ctx: SchedulerContext,
  ) {
    const l = config.kv_connector_extra_config.lease_ms;
    this.leaseMs = typeof l === 'number' ? l : 30_000;
  }

  private remote(req: ConnectorRequest): Record<string, unknown> | null {
    const p = req.kvTransferParams;
    if (!p || p.do_remote_prefill !== true) return null;
    if (Array.isArray(p.remote_block_ids) && isStr(p.remote_engine_id)) return p;
    if (isStr(p.transfer_id)) return this.bus.transfers.get(p.transfer_id) ?? null;
    return null;
  }

  getNumNewMatchedTokens(req: ConnectorRequest, numComputedTokens: number): MatchedTokens {
    const p = req.kvTransferParams;
    if (!p || p.do_remote_prefill !== true || this.config.kv_role === 'kv_producer') return { count: 0, loadAsync: false };
    const r = this.remote(req);
    if (!r) return isStr(p.transfer_id) ? { count: null, loadAsync: false } : { count: 0, loadAsync: false };
    this.asked.set(req.requestId, numComputedTokens);
    const held = typeof r.remote_num_tokens === 'number' ? r.remote_num_tokens : req.promptTokenIds.length;
    return { count: Math.max(0, Math.min(req.promptTokenIds.length, held) - numComputedTokens), loadAsync: true };
  }

  updateStateAfterAlloc(req: ConnectorRequest, blocks: BlockIdsPerGroup, numExternalTokens: number): void {
    const local = this.asked.get(req.requestId);
    this.asked.delete(req.requestId);
    if (numExternalTokens <= 0 || local === undefined) return;
    const r = this.remote(req)!;
    this.pending.push({
      requestId: req.requestId,
      remoteRequestId: r.remote_request_id as string,
      remoteEngineId: r.remote_engine_id as string,
      localBlocks: blocks.map((b) => b.slice()),
      remoteBlocks: (r.remote_block_ids as number[][]).map((b) => b.slice()),
      firstToken: local,
      numTokens: local + numExternalTokens,
      transferId: isStr(req.kvTransferParams?.transfer_id) ? (req.kvTransferParams!.transfer_id as string) : undefined,
    });
  }

  buildConnectorMeta(): InProcessMeta {
    const m = { loads: this.pending, leases: this.leases };
    this.pending = [];
    this.leases = [];
    return m;
  }

  updateConnectorOutput(): void {}

  requestFinished(req: ConnectorRequest, blocks: BlockIdsPerGroup, reason: FinishReason): RequestFinishedResult {
    const p = req.kvTransferParams;
    if (!p || p.do_remote_decode !== true || (reason !== 'stop' && reason !== 'length') || this.config.kv_role === 'kv_consumer') return { delayFree: false };
    const params: Record<string, unknown> = {
      remote_engine_id: this.ctx.engineId,
      remote_request_id: req.requestId,
      remote_block_ids: blocks.map((b) => b.slice()),
      remote_tp_size: this.ctx.tpSize,
      remote_num_tokens: Math.min(req.numComputedTokens, req.promptTokenIds.length),
    };
    this.leases.push({ requestId: req.requestId, expiresAt: Date.now() + this.leaseMs });
    if (isStr(p.transfer_id)) this.bus.transfers.set(p.transfer_id, { ...params, do_remote_prefill: true });
    return { delayFree: true, kvTransferParams: params };
  }

  kvChecksumCarrier(req: ConnectorRequest): KVChecksumCarrier {
    return isStr(req.kvTransferParams?.transfer_id) ? 'connector' : 'kv_transfer_params';
  }

  sendKvChecksums(req: ConnectorRequest, payload: Uint8Array): void {
    const t = req.kvTransferParams?.transfer_id;
    if (isStr(t)) this.bus.payloads.set(t, payload.slice());
  }
}

function stateStrides(s: StateTensor): number[] {
  return s.strides ? [...s.strides] : contiguousStrides(s.shape, DTYPE_BYTES[s.dtype]);
}

/** Calls `fn(offset)` with the byte offset (strides) of every element of row `row` along `axis`. */
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

class InProcessWorker implements KVConnectorWorker<InProcessMeta, never, never> {
  private caches: HostWorkerKVCaches | null = null;
  private meta: InProcessMeta | null = null;
  /** Producer: leases of finished requests not yet reported in finishedSending. */
  private readonly leases = new Map<string, number>();
  private readonly done = new Set<string>();
  private readonly invalid = new Set<number>();
  private readonly loadErrors = new Map<string, LoadError>();
  private readonly payloads = new Map<string, Uint8Array>();
  private readonly key: string;

  constructor(
    private readonly bus: InProcessBus,
    private readonly ctx: WorkerContext,
  ) {
    this.key = `${ctx.ppRank}:${ctx.tpRank}`;
  }

  registerKvCaches(all: WorkerKVCaches): void {
    const caches = hostRegions(all, 'InProcessConnector');
    this.caches = caches;
    const e = this.bus.engine(this.ctx.engineId);
    e.tpSize = this.ctx.tpSize;
    e.ppSize = this.ctx.ppSize;
    e.workers.set(this.key, caches);
  }

  bindConnectorMetadata(meta: InProcessMeta | null): void {
    this.meta = meta ?? null;
    for (const l of meta?.leases ?? []) this.leases.set(l.requestId, l.expiresAt);
  }

  startLoadKv(_output: SchedulerOutput): void {
    for (const load of this.meta?.loads ?? []) {
      this.bus.defer(() => {
        try {
          if (this.bus.failLoads) throw new Error('load failed (failLoads)');
          this.copy(load);
        } catch (e) {
          for (const g of load.localBlocks) for (const b of g) this.invalid.add(b);
          this.loadErrors.set(load.requestId, { reason: 'transfer-error', message: e instanceof Error ? e.message : String(e) });
        }
        if (load.transferId) {
          const p = this.bus.payloads.get(load.transferId);
          if (p) this.payloads.set(load.requestId, p);
        }
        this.done.add(load.requestId);
        this.bus.markRead(load.remoteEngineId, load.remoteRequestId, this.key, this.ctx.tpSize * this.ctx.ppSize);
      });
    }
  }

  getTransferResults(): TransferResults<never> {
    const res: TransferResults<never> = { finishedSending: new Set(), finishedRecving: new Set(this.done), invalidBlockIds: new Set(this.invalid), kvChecksums: new Map(), loadErrors: new Map(this.loadErrors) };
    this.loadErrors.clear();
    for (const id of this.done) {
      const p = this.payloads.get(id);
      if (p) res.kvChecksums.set(id, p);
      this.payloads.delete(id);
    }
    this.done.clear();
    this.invalid.clear();
    const reads = this.bus.engines.get(this.ctx.engineId)?.reads;
    const now = Date.now();
    for (const [id, expiresAt] of this.leases) {
      if (reads?.get(id)?.done || now > expiresAt) {
        this.leases.delete(id);
        res.finishedSending.add(id);
      }
    }
    return res;
  }

  clearConnectorMetadata(): void {
    this.meta = null;
  }

  /** Copies the load's tokens (attention) and running states into this worker's caches. */
  private copy(load: InProcessLoad): void {
    const mine = this.caches!;
    const src = this.bus.engines.get(load.remoteEngineId);
    if (!src) throw new Error(`producer ${load.remoteEngineId} not on the bus`);
    // name -> tp rank -> (caches, view) over every producer worker.
    const byName = new Map<string, Map<number, { c: HostWorkerKVCaches; gi: number; view: AttentionCacheView | StateCacheView }>>();
    for (const c of src.workers.values()) {
      c.groups.forEach((g, gi) => {
        for (const v of g.caches) {
          let m = byName.get(v.name);
          if (!m) byName.set(v.name, (m = new Map()));
          m.set(c.rank.tpRank, { c, gi, view: v });
        }
      });
    }
    const tpD = mine.rank.tpSize;
    const tpP = src.tpSize;
    mine.groups.forEach((g, gi) => {
      const cfg = mine.groupConfigs[gi];
      const localBlocks = load.localBlocks[gi] ?? [];
      const remoteBlocks = load.remoteBlocks[gi] ?? [];
      for (const v of g.caches) {
        const prod = byName.get(v.name);
        if (!prod) throw new Error(`producer has no cache ${v.name}`);
        const ctxBase = { requestId: load.requestId, remoteRequestId: load.remoteRequestId, groupId: cfg.groupId, name: v.name, tpRank: mine.rank.tpRank, ppRank: mine.ppRank };
        if (v.kind === 'attention') {
          const Rd = replicaCount(v, tpD);
          const Ld = v.localHeads;
          const shardD = Math.floor(mine.rank.tpRank / Rd);
          const Bd = v.blockSize;
          for (let h = 0; h < Ld; h++) {
            const gh = shardD * Ld + h;
            const any = prod.values().next().value!;
            const pv0 = any.view as AttentionCacheView;
            const Lp = pv0.localHeads;
            const shardP = Math.floor(gh / Lp);
            const tpSrc = shardP * replicaCount(pv0, tpP);
            const p = prod.get(tpSrc);
            if (!p || p.view.kind !== 'attention') throw new Error(`no producer rank for ${v.name} head ${gh}`);
            const pv = p.view;
            const hp = gh - shardP * Lp;
            const Bp = pv.blockSize;
            const pBlocks = load.remoteBlocks[p.gi] ?? remoteBlocks;
            for (let tok = load.firstToken; tok < load.numTokens; tok++) {
              const bd = localBlocks[Math.floor(tok / Bd)];
              const bp = pBlocks[Math.floor(tok / Bp)];
              if (bd === undefined || bp === undefined) throw new Error(`no block for token ${tok}`);
              v.parts.forEach((partD, q) => {
                const partP = pv.parts[q];
                const from = partAddress(partP, Bp, bp, hp, tok % Bp);
                const bytes = p.c.regions[partP.region].slice(from, from + partP.bytes);
                this.bus.faultHook?.({ ...ctxBase, token: tok, head: gh, part: q }, bytes);
                mine.regions[partD.region].set(bytes, partAddress(partD, Bd, bd, h, tok % Bd));
                this.bus.copies++;
                this.bus.bytes += bytes.byteLength;
              });
            }
          }
        } else {
          const bd = localBlocks[0];
          v.states.forEach((sd, k) => {
            if (!sd.split) {
              if (tpD !== tpP) throw new Error(`${v.name}: state without a TP split across TP sizes`);
            }
            const sdStr = stateStrides(sd);
            const axis = sd.split?.axis ?? 0;
            const segs = sd.split?.segments ?? [[sd.shape[axis], 1] as const];
            let offD = 0;
            let globalBase = 0;
            segs.forEach(([Ld, Rd], s) => {
              const shardD = Math.floor(mine.rank.tpRank / Rd);
              for (let i = 0; i < Ld; i++) {
                const gr = shardD * Ld + i;
                const any = prod.values().next().value!.view as StateCacheView;
                const spAny = any.states[k];
                const [Lp, Rp] = spAny.split?.segments[s] ?? [spAny.shape[axis], 1];
                const shardP = Math.floor(gr / Lp);
                const tpSrc = sd.split ? shardP * Rp : mine.rank.tpRank;
                const p = prod.get(tpSrc);
                if (!p || p.view.kind !== 'state') throw new Error(`no producer rank for ${v.name} row ${gr}`);
                const sp = p.view.states[k];
                const offP = (sp.split?.segments ?? []).slice(0, s).reduce((a, x) => a + x[0], 0);
                const rowP = offP + (sd.split ? gr - shardP * Lp : i);
                const spStr = stateStrides(sp);
                const bp = (load.remoteBlocks[p.gi] ?? remoteBlocks)[0];
                const eb = DTYPE_BYTES[sd.dtype];
                const dOffs: number[] = [];
                const pOffs: number[] = [];
                forEachRowElement(sd.shape, sdStr, axis, offD + i, (o) => dOffs.push(o));
                forEachRowElement(sp.shape, spStr, axis, rowP, (o) => pOffs.push(o));
                const row = new Uint8Array(dOffs.length * eb);
                const pmem = p.c.regions[sp.region];
                pOffs.forEach((o, e) => row.set(pmem.subarray(sp.offset + bp * sp.blockStride + o, sp.offset + bp * sp.blockStride + o + eb), e * eb));
                this.bus.faultHook?.({ ...ctxBase, state: k, row: globalBase + gr }, row);
                const dmem = mine.regions[sd.region];
                dOffs.forEach((o, e) => dmem.set(row.subarray(e * eb, (e + 1) * eb), sd.offset + bd * sd.blockStride + o));
                this.bus.copies++;
                this.bus.bytes += row.byteLength;
              }
              offD += Ld;
              globalBase += (Ld * tpD) / Rd;
            });
          });
        }
      }
    });
  }
}

/** Options of {@link createInProcessConnectorFactory}. */
export interface InProcessConnectorOptions {
  /** The bus the engines created from this factory meet on. */
  bus: InProcessBus;
  /** The registered name (default {@link IN_PROCESS_CONNECTOR}). */
  name?: string;
}

/** A factory of the connector whose engines meet on `o.bus`, registered as `o.name`. */
export function createInProcessConnectorFactory(o: InProcessConnectorOptions): InProcessConnectorFactory {
  const { bus } = o;
  return {
    name: o.name ?? IN_PROCESS_CONNECTOR,
    createScheduler: (config, ctx) => new InProcessScheduler(bus, config, ctx),
    createWorker: (_config, ctx) => new InProcessWorker(bus, ctx),
    // `connector` for requests with a transfer_id, else `kv_transfer_params` (InProcessScheduler.kvChecksumCarrier).
    kvChecksumCarriers: () => ['connector', 'kv_transfer_params'],
  };
}

/**
 * Registers the connector as `o.name` (default {@link IN_PROCESS_CONNECTOR}), over `o.bus`, in
 * `registry`, unless the name is taken.
 */
export function registerInProcessConnector(registry: KVConnectorRegistry, o: InProcessConnectorOptions): void {
  const name = o.name ?? IN_PROCESS_CONNECTOR;
  if (!registry.has(name)) registry.register(createInProcessConnectorFactory({ ...o, name }));
}

/**
 * A fresh registry (with the built-ins) holding the connector over `bus` (default: a new bus):
 * give it to every engine of a test (`EngineOptions.registry`).
 */
export function inProcessRegistry(bus: InProcessBus = new InProcessBus(), name: string = IN_PROCESS_CONNECTOR): { registry: KVConnectorRegistry; bus: InProcessBus } {
  const registry = new KVConnectorRegistry();
  registerInProcessConnector(registry, { bus, name });
  return { registry, bus };
}

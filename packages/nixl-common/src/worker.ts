/**
 * The worker half shared by NIXL pull and push: the rank's transfer agent (by
 * `kv_connector_extra_config.backend`), memory registration, its handshake metadata for the
 * scheduler half (`getHandshakeMetadata`: its {@link RankInfo} and backend; the scheduler serves
 * them on the producer's side channel), a notif poller, transfers with metrics (on the worker
 * context's `metricsRegistry`), and the results a step reports. A consumer worker handshakes with
 * producers on its own side-channel clients ({@link NixlPeers}); a producer worker reports
 * read-done notifs and finished push writes in its worker metadata and reports `finishedSending`
 * for the leases the scheduler says ended (scheduler.ts). It shares nothing with the scheduler
 * half but the contract's plain data, so it runs in a worker process as well as in the engine's.
 * Loads and writes run asynchronously; no hook waits on the network.
 * @module
 */
import { randomBytes } from 'node:crypto';
import type { KVConnectorWorker, KVTransferConfig, LoadError, SchedulerOutput, TransferResults, WorkerContext, WorkerKVCaches } from '@kvconnect/core';
import { loadBlockIds, silentLogger, type Logger } from '@kvconnect/core';
import { readDeviceBytes, toMemoryRegion, type TransferAgent, type XferOp } from '@kvconnect/transfer';
import { createAgent } from './agent.js';
import { parseNixlConfig, type NixlConfig } from './config.js';
import { type Pair } from './mapping.js';
import { nixlMetrics, type NixlMetrics } from './metrics.js';
import { NixlPeers } from './peers.js';
import type { NixlHandshakeMetadata } from './producer.js';
import type { GroupPlan } from '@kvconnect/checksum';
import { localizeOrderOnRank } from './localize.js';
import type { LocalizeResult } from './producer.js';
import { buildRankInfo, type RankInfo, type TransferMode } from './protocol.js';
import { metricsRegistryOf, type LoadSpec, type NixlMeta, type NixlWorkerMeta } from './scheduler.js';

/** A transfer that did not complete (`status`: the agent's error kind). */
export class TransferFailedError extends Error {
  override readonly name: string = 'TransferFailedError';
  constructor(
    readonly status: string,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}


const sleep = (ms: number) =>
  new Promise<void>((r) => {
    const t = setTimeout(r, ms);
    t.unref();
  });

/** The shared worker half; pull and push implement loads, notifs and (push) writes. */
export abstract class NixlWorkerBase implements KVConnectorWorker<NixlMeta, NixlWorkerMeta, NixlHandshakeMetadata> {
  readonly config: NixlConfig;
  /** This worker's metrics (the worker context's registry; the engine aggregates it on /metrics). */
  readonly metrics: NixlMetrics;
  /** This worker's side-channel clients and cached producer handshakes (consumer loads). */
  readonly peers: NixlPeers;
  /** `ppRank:tpRank`. */
  readonly key: string;
  /** The engine's logger (`ctx.logger`: engine, role, PP stage, TP rank), or a silent one. */
  protected readonly log: Logger;
  /** The rank's transfer agent (after `registerKvCaches`). */
  agent: TransferAgent | null = null;
  /** The rank's handshake info (after `registerKvCaches`). */
  rank: RankInfo | null = null;
  protected caches: WorkerKVCaches | null = null;
  protected meta: NixlMeta | null = null;
  /** Loads finished (well or not) since the last results. */
  protected readonly recvDone = new Set<string>();
  protected readonly invalid = new Set<number>();
  /** Why each failed load failed (reported in `loadErrors`). */
  protected readonly loadErrors = new Map<string, LoadError>();
  protected readonly recvChecksums = new Map<string, Uint8Array>();
  /** Consumer loads started and not reported yet. */
  protected readonly active = new Set<string>();
  /** Remote agents loaded into this rank's agent, by name. */
  private readonly agents = new Map<string, Promise<string>>();
  /** Producer: requests the scheduler said ended, not reported in `finishedSending` yet. */
  protected readonly toReport = new Set<string>();
  /** Producer: leases the scheduler holds (poll fast while some are). */
  private leasesHeld = 0;
  /** This step's worker metadata so far. */
  protected readonly readDone: Array<[string, string, number]> = [];
  protected readonly pushDone: string[] = [];
  /** Producer: fine sums of `LOCALIZE` orders computed this step, and this rank's producer plans for them. */
  protected readonly localized: LocalizeResult[] = [];
  private readonly localizePlans = new Map<number, GroupPlan>();
  protected closed = false;
  private polling: Promise<void> | null = null;

  constructor(
    readonly transferConfig: KVTransferConfig,
    readonly ctx: WorkerContext,
    readonly mode: TransferMode,
  ) {
    this.config = parseNixlConfig(transferConfig);
    this.metrics = nixlMetrics(this.config.metricsRegistry ?? metricsRegistryOf(ctx) ?? undefined);
    this.peers = new NixlPeers({ mode, config: this.config, metrics: this.metrics });
    this.key = `${ctx.ppRank}:${ctx.tpRank}`;
    this.log = ctx.logger?.child({ connector: mode === 'pull' ? 'NixlConnector' : 'NixlPushConnector' }) ?? silentLogger();
  }

  /** Consumer role (loads). */
  get isConsumer(): boolean {
    return this.transferConfig.kv_role !== 'kv_producer';
  }

  /** Producer role (serves or pushes). */
  get isProducer(): boolean {
    return this.transferConfig.kv_role !== 'kv_consumer';
  }

  /** Consumer world size (TP x PP of this engine). */
  get world(): number {
    return this.ctx.tpSize * this.ctx.ppSize;
  }

  async registerKvCaches(caches: WorkerKVCaches): Promise<void> {
    this.caches = caches;
    const name = `${this.ctx.engineId}/pp${this.ctx.ppRank}tp${this.ctx.tpRank}/${randomBytes(4).toString('hex')}`;
    const agent = await (this.config.agentFactory ?? createAgent)({
      backend: this.config.backend,
      name,
      host: this.config.agentHost,
      nixlLibrary: this.config.nixlLibrary,
      nixlBackendParams: this.config.nixlBackendParams,
      nixlBackend: this.config.nixlBackend,
      clusterSecret: this.config.clusterSecret,
      lanes: this.config.transferLanes,
      ...(this.config.transferStallTimeoutMs !== undefined ? { stallTimeoutMs: this.config.transferStallTimeoutMs } : {}),
    });
    this.agent = agent;
    const reg = await agent.registerMemory(caches.regions.map((r) => toMemoryRegion(r)));
    const md = await agent.getLocalMetadata();
    this.rank = buildRankInfo(caches, agent.name, md, reg.regions);
    this.polling = this.pollLoop();
  }

  /** This rank's {@link RankInfo} and agent backend, for the scheduler half (null before `registerKvCaches`). */
  getHandshakeMetadata(): NixlHandshakeMetadata | null {
    return this.rank && this.agent ? { rank: this.rank, backend: this.agent.backend } : null;
  }

  bindConnectorMetadata(meta: NixlMeta): void {
    this.meta = meta ?? null;
    if (!this.meta) return;
    if (this.meta.leasesHeld !== undefined) this.leasesHeld = this.meta.leasesHeld;
    for (const id of this.meta.finished?.[this.key] ?? []) this.toReport.add(id);
    // LOCALIZE (docs/localize.md): the held blocks' fine sums, before this step's forward pass.
    for (const o of this.meta.localize ?? []) if (this.caches) this.localized.push(localizeOrderOnRank(this.caches, this.localizePlans, o, readDeviceBytes));
    this.onMeta(this.meta);
  }

  startLoadKv(_output: SchedulerOutput): void {
    for (const load of this.meta?.loads ?? []) {
      this.active.add(load.requestId);
      this.startLoad(load);
    }
  }

  getTransferResults(): TransferResults<NixlWorkerMeta> {
    this.onTick();
    const sent = new Set<string>();
    for (const id of this.toReport) {
      if (this.writing(id)) continue;
      sent.add(id);
      this.toReport.delete(id);
      this.onSent(id);
    }
    const res: TransferResults<NixlWorkerMeta> = {
      finishedSending: sent,
      finishedRecving: new Set(this.recvDone),
      invalidBlockIds: new Set(this.invalid),
      kvChecksums: new Map(this.recvChecksums),
      loadErrors: new Map(this.loadErrors),
    };
    if (this.readDone.length > 0 || this.pushDone.length > 0 || this.localized.length > 0) {
      res.workerMeta = { readDone: this.readDone.splice(0), pushDone: this.pushDone.splice(0) };
      if (this.localized.length > 0) res.workerMeta.localized = this.localized.splice(0);
    }
    for (const id of this.recvDone) this.active.delete(id);
    this.recvDone.clear();
    this.invalid.clear();
    this.loadErrors.clear();
    this.recvChecksums.clear();
    return res;
  }

  clearConnectorMetadata(): void {
    this.meta = null;
  }

  /** New step metadata (push producers take their finished blocks and registrations here). */
  protected onMeta(_meta: NixlMeta): void {}
  /**
   * Push producer: whether WRITEs of `requestId` are still in flight (its blocks must not be
   * freed yet: `finishedSending` waits for them).
   */
  protected writing(_requestId: string): boolean {
    return false;
  }
  /** `requestId` was reported in `finishedSending` (forget its state). */
  protected onSent(_requestId: string): void {}
  /** Starts one consumer load (asynchronously; report through {@link finishLoad} / {@link failLoad}). */
  protected abstract startLoad(load: LoadSpec): void;
  /** One notif from agent `sender`. */
  protected abstract onNotif(sender: string, bytes: Uint8Array): void;
  /** Called by the poller and at each step's results (deadlines). */
  protected onTick(): void {}
  /** Whether the poller should poll fast (something is in flight). */
  protected busy(): boolean {
    return this.active.size > 0 || this.leasesHeld > 0 || this.toReport.size > 0;
  }

  private async pollLoop(): Promise<void> {
    while (!this.closed) {
      try {
        const m = await this.agent!.pollNotifs();
        for (const [sender, msgs] of m) for (const b of msgs) this.onNotif(sender, b);
      } catch (e) {
        if (this.closed) break;
        this.log.warn({ err: e instanceof Error ? e.message : String(e) }, 'pollNotifs failed');
      }
      this.onTick();
      await sleep(this.busy() ? 1 : 10);
    }
  }

  /** Reports a load done (its bytes are in place); `checksums`: a connector-carried payload. */
  protected finishLoad(load: LoadSpec, checksums?: Uint8Array | null): void {
    if (!this.active.has(load.requestId) || this.recvDone.has(load.requestId)) return;
    if (checksums) this.recvChecksums.set(load.requestId, checksums);
    this.recvDone.add(load.requestId);
  }

  /**
   * Reports a load failed: its loaded blocks (never a local prefix hit's) go to
   * `invalidBlockIds` with the request in `finishedRecving`, and `reason` with the error's text to
   * `loadErrors`, so the engine reports the cause and applies the load failure policy. The producer
   * is told to release its blocks.
   */
  protected failLoad(load: LoadSpec, reason: string, err?: unknown): void {
    if (!this.active.has(load.requestId) || this.recvDone.has(load.requestId)) return;
    this.log.warn({ requestId: load.requestId, reason, err: err instanceof Error ? err.message : err === undefined ? undefined : String(err) }, 'KV load failed');
    this.metrics.failedTransfers.inc({ mode: this.mode, reason });
    const held = this.caches!.groupConfigs.map((g, gi) => (this.rank!.caches.some((c) => c.group === gi) ? g : null));
    for (const b of loadBlockIds(held, load.localBlocks, load.firstToken, load.numTokens)) this.invalid.add(b);
    this.loadErrors.set(load.requestId, { reason, message: err instanceof Error ? err.message : err === undefined ? reason : String(err) });
    this.recvDone.add(load.requestId);
    this.peers.release(load.remoteHost, load.remotePort, [load.remoteRequestId], load.consumerKey, [load.leaseCapability]);
  }

  /** The agent name of `rank` once its metadata is loaded into this rank's agent. */
  protected ensurePeer(rank: RankInfo): Promise<string> {
    let p = this.agents.get(rank.agentName);
    if (!p) {
      p = this.agent!.loadRemoteMetadata(rank.agentMetadata).then((name) => {
        if (name !== rank.agentName) throw new TransferFailedError('invalid', `agent metadata names ${name}, the handshake ${rank.agentName}`);
        return name;
      });
      this.agents.set(rank.agentName, p);
      p.catch(() => this.agents.delete(rank.agentName));
    }
    return p;
  }

  /**
   * One transfer with `remote` (READ: remote `src` into local `dst`; WRITE: local `src` into
   * remote `dst`), with an optional notif delivered after the data landed. Records metrics.
   * @throws TransferFailedError
   */
  protected async transfer(op: XferOp, remote: RankInfo, pairs: readonly Pair[], notif?: Uint8Array): Promise<void> {
    const agent = this.agent!;
    const t0 = performance.now();
    const remoteName = await this.ensurePeer(remote);
    const localDescs = pairs.map((p) => ({ addr: op === 'READ' ? p.dst : p.src, length: p.len }));
    const remoteDescs = pairs.map((p) => ({ addr: op === 'READ' ? p.src : p.dst, length: p.len }));
    const local = await agent.prepDescList(null, this.rank!.regions[0]?.kind ?? 'DRAM', localDescs);
    const rl = await agent.prepDescList(remoteName, remote.regions[0]?.kind ?? 'DRAM', remoteDescs);
    const req = await agent.makeTransfer({ op, local, remote: rl, notif });
    try {
      let s = await agent.post(req, { timeoutMs: this.config.transferTimeoutMs });
      const t1 = performance.now();
      this.metrics.postSeconds.observe({ mode: this.mode, op }, (t1 - t0) / 1000);
      if (s === 'in-progress') s = await agent.wait(req);
      if (s !== 'done') throw new TransferFailedError(s, `${op} with ${remoteName}: ${s}${req.error ? ` (${req.error.message})` : ''}`, { cause: req.error });
      this.metrics.xferSeconds.observe({ mode: this.mode, op }, (performance.now() - t1) / 1000);
      this.metrics.bytes.observe({ mode: this.mode, op }, req.bytes);
      this.metrics.descriptors.observe({ mode: this.mode, op }, req.count);
    } finally {
      await agent.release(req).catch(() => {});
      await agent.releaseDescList(local).catch(() => {});
      await agent.releaseDescList(rl).catch(() => {});
    }
  }

  async shutdown(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.agent?.close().catch(() => {});
    await this.polling?.catch(() => {});
    this.peers.close();
  }
}

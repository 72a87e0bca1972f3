/**
 * The per-engine state the NIXL connector halves of one engine share in its process: the worker
 * ranks' handshake info, the side-channel server (producer) and clients (consumer), the producer's
 * leases and push registrations, and the metrics.
 *
 * Why a process-local hub: vLLM's workers hand their handshake metadata to the scheduler process
 * (`set_xfer_handshake_metadata`), which serves it on one side channel per engine. kvconnect's
 * connector API has no such hook, and the reference engine runs its scheduler and workers in one
 * process, so the halves meet here, keyed by engine id. The scheduler never waits on it: it reads
 * the bound address and lease table only.
 * @module
 */
import type { KVCacheGroupConfig, KVRole } from '@kvconnect/core';
import { checkBindHost } from '@kvconnect/transfer';
import type { NixlConfig } from './config.js';
import { LeaseTable } from './lease.js';
import { nixlMetrics, type NixlMetrics } from './metrics.js';
import {
  NIXL_PROTOCOL_VERSION,
  compatHash,
  decodeEngineInfo,
  decodeEmptyBody,
  decodeLeaseBody,
  encodeEngineInfo,
  encodeLeaseBody,
  type EngineInfo,
  type GroupKind,
  type PushRegistration,
  type RankInfo,
  type SideRequest,
  type TransferMode,
} from './protocol.js';
import { SideChannelClient, SideChannelError, SideChannelServer, type HandlerResult, type SideChannelServerStats } from './side-channel.js';

/** What a hub asks of a worker half (push dispatch). */
export interface HubWorker {
  /** `ppRank:tpRank`. */
  readonly key: string;
  /** A consumer rank registered blocks for producer request `requestId` (push). */
  onPushReg?(requestId: string): void;
}

/** Options of {@link acquireHub}. */
export interface HubOptions {
  engineId: string;
  mode: TransferMode;
  role: KVRole;
  tpSize: number;
  ppSize: number;
  config: NixlConfig;
  /** Metrics registry of the engine, when the context offers one. */
  registry?: NixlConfig['metricsRegistry'];
}

/** A consumer's handshake failed: the producer refused (incompatible, not ready) or could not be reached. */
export class HandshakeError extends Error {
  override readonly name: string = 'HandshakeError';
  constructor(
    readonly code: string,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/** The shared state of one engine's NIXL connector halves. */
export class NixlEngineHub {
  readonly engineId: string;
  readonly mode: TransferMode;
  readonly role: KVRole;
  readonly tpSize: number;
  readonly ppSize: number;
  readonly config: NixlConfig;
  readonly metrics: NixlMetrics;
  readonly leases: LeaseTable;
  /** Push: producer request id -> consumer agent name -> registration. */
  readonly pushRegs = new Map<string, Map<string, PushRegistration>>();
  private readonly ranks = new Map<string, RankInfo>();
  private readonly workers = new Map<string, HubWorker>();
  private groupKinds: GroupKind[] | null = null;
  private blockSizes: number[] | null = null;
  private backend = '';
  private server: SideChannelServer | null = null;
  private listening: Promise<{ host: string; port: number }> | null = null;
  private readonly clients = new Map<string, SideChannelClient>();
  /** Side-channel requests waiting for an answer, across this engine's clients (at most 16 384). */
  private readonly waiterBudget = { used: 0, max: 16_384 };
  private readonly infos = new Map<string, Promise<EngineInfo>>();
  /** The settled value of each entry of {@link infos} (what {@link invalidatePeer} compares). */
  private readonly settled = new Map<string, EngineInfo>();
  private info: EngineInfo | null = null;
  private users = 0;

  constructor(o: HubOptions) {
    this.engineId = o.engineId;
    this.mode = o.mode;
    this.role = o.role;
    this.tpSize = o.tpSize;
    this.ppSize = o.ppSize;
    this.config = o.config;
    this.metrics = nixlMetrics(o.config.metricsRegistry ?? o.registry ?? undefined);
    this.leases = new LeaseTable({ leaseMs: o.config.leaseMs, workers: o.tpSize * o.ppSize, onExpired: () => this.metrics.expiredLeases.inc({ mode: this.mode }) });
  }

  /** Sets the engine's groups (first caller wins; both halves know them). */
  setGroups(groups: readonly KVCacheGroupConfig[]): void {
    if (this.groupKinds) return;
    this.groupKinds = groups.map((g) => g.kind);
    this.blockSizes = groups.map((g) => g.blockSize);
  }

  /** Adds a worker rank (its handshake info) and the worker half. */
  addRank(info: RankInfo, worker: HubWorker, backend: string): void {
    const key = `${info.ppRank}:${info.tpRank}`;
    this.ranks.set(key, info);
    this.workers.set(key, worker);
    this.backend = backend;
    this.info = null;
  }

  /** Every rank registered. */
  get complete(): boolean {
    return this.ranks.size === this.tpSize * this.ppSize && this.groupKinds !== null;
  }

  /** This engine's compatibility hash (after every rank registered). */
  compatHash(): string {
    return compatHash({ mode: this.mode, backend: this.backend, groupKinds: this.groupKinds ?? [], ranks: [...this.ranks.values()], salt: this.config.compatSalt });
  }

  /** This engine's handshake info, or null before every rank registered. */
  engineInfo(): EngineInfo | null {
    if (!this.complete) return null;
    this.info ??= {
      version: NIXL_PROTOCOL_VERSION,
      mode: this.mode,
      compatHash: this.compatHash(),
      engineId: this.engineId,
      tpSize: this.tpSize,
      ppSize: this.ppSize,
      blockSizes: this.blockSizes!,
      groupKinds: this.groupKinds!,
      ranks: [...this.ranks.values()].sort((a, b) => a.ppRank - b.ppRank || a.tpRank - b.tpRank),
    };
    return this.info;
  }

  /**
   * Starts the side-channel server (once) on the configured host (loopback by default), with the
   * cluster secret when one is configured. @returns its address.
   * @throws ClusterSecretError (rejected) for a non-loopback host without a secret (`checkBindHost`).
   */
  ensureListening(): Promise<{ host: string; port: number }> {
    if (!this.listening) {
      const secret = this.config.clusterSecret;
      this.listening = (async () => {
        const host = checkBindHost(this.config.sideChannelHost, secret, 'NIXL side channel');
        this.server = new SideChannelServer((req) => this.handle(req), { clusterSecret: secret });
        return this.server.listen(host, this.config.sideChannelPort);
      })();
    }
    return this.listening;
  }

  /** The side-channel server's counters (buffered bytes, pending requests, dropped peers), or null before it listens. */
  sideChannelStats(): SideChannelServerStats | null {
    return this.server?.stats() ?? null;
  }

  /** The side channel's address once it listens. */
  get address(): { host: string; port: number } | null {
    return this.server?.address ?? null;
  }

  /** The client of the side channel at `host:port` (shared by the engine's halves). */
  client(host: string, port: number): SideChannelClient {
    const k = `${host}:${port}`;
    let c = this.clients.get(k);
    if (!c) this.clients.set(k, (c = new SideChannelClient(host, port, { timeoutMs: this.config.handshakeTimeoutMs, clusterSecret: this.config.clusterSecret, waiterBudget: this.waiterBudget })));
    return c;
  }

  /**
   * The producer's info at `host:port` (handshake, cached until {@link invalidatePeer}). Both
   * sides check compatibility: the producer refuses a different version, mode or model, and so
   * does this side. `timeoutMs`: how long the handshake may wait for the answer (default the
   * handshake timeout; a load passes its transfer deadline, as a busy producer answers between
   * engine steps).
   * @throws HandshakeError
   */
  peerInfo(host: string, port: number, engineId?: string, timeoutMs?: number): Promise<EngineInfo> {
    const k = `${host}:${port}`;
    let p = this.infos.get(k);
    if (p) {
      return p.then((info) => {
        if (engineId === undefined || info.engineId === engineId) return info;
        this.invalidatePeer(host, port, info);
        return this.peerInfo(host, port, engineId, timeoutMs);
      });
    }
    p = this.handshake(host, port, timeoutMs);
    this.infos.set(k, p);
    p.then(
      (info) => {
        if (this.infos.get(k) === p) this.settled.set(k, info);
      },
      () => {
        if (this.infos.get(k) === p) this.infos.delete(k);
      },
    );
    return p.then((info) => {
      if (engineId !== undefined && info.engineId !== engineId) throw new HandshakeError('engine-id', `side channel ${k} serves engine ${info.engineId}, not ${engineId}`);
      return info;
    });
  }

  /**
   * Forgets the cached handshake with `host:port` when it is still `stale` (the info a failed
   * load used; a newer handshake is kept): the next load handshakes again, e.g. with a producer
   * restarted on the same port (new agents, new regions).
   */
  invalidatePeer(host: string, port: number, stale: EngineInfo): void {
    const k = `${host}:${port}`;
    if (this.settled.get(k) !== stale) return;
    this.settled.delete(k);
    this.infos.delete(k);
  }

  private async handshake(host: string, port: number, timeoutMs?: number): Promise<EngineInfo> {
    const mine = this.compatHash();
    let info: EngineInfo;
    try {
      info = await this.client(host, port).request({ type: 'info', version: NIXL_PROTOCOL_VERSION, mode: this.mode, compatHash: mine }, decodeEngineInfo, timeoutMs);
    } catch (e) {
      const code = e instanceof SideChannelError ? e.code : 'transport';
      this.metrics.handshakes.inc({ mode: this.mode, result: code });
      throw new HandshakeError(code, `handshake with ${host}:${port} failed: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
    }
    if (info.version !== NIXL_PROTOCOL_VERSION || info.mode !== this.mode || info.compatHash !== mine) {
      this.metrics.handshakes.inc({ mode: this.mode, result: 'incompatible' });
      throw new HandshakeError('incompatible', `producer ${info.engineId} at ${host}:${port} is incompatible (version ${info.version}, mode ${info.mode}; this side: version ${NIXL_PROTOCOL_VERSION}, mode ${this.mode})`);
    }
    this.metrics.handshakes.inc({ mode: this.mode, result: 'ok' });
    return info;
  }

  /**
   * LEASE to a producer: heartbeat (`pinMs` 0) or pin. `timeoutMs`: how long to wait for the
   * answer (default the handshake timeout; a pin before a READ passes the transfer's deadline: a
   * producer busy with a long engine step answers only after it).
   * @returns expiry per request (0 = gone).
   */
  lease(host: string, port: number, requestIds: string[], pinMs: number, timeoutMs?: number): Promise<Map<string, number>> {
    return this.client(host, port).request({ type: 'lease', requestIds, pinMs }, decodeLeaseBody, timeoutMs);
  }

  /** RELEASE to a producer (best effort; errors are swallowed). */
  release(host: string, port: number, requestIds: string[]): void {
    this.client(host, port)
      .request({ type: 'release', requestIds }, decodeEmptyBody)
      .catch(() => {});
  }

  /**
   * PUSH_REG to a producer; `timeoutMs` as for {@link lease} (a push load passes what is left of
   * its deadline). @throws SideChannelError with the refusal code.
   */
  pushRegister(host: string, port: number, reg: PushRegistration, timeoutMs?: number): Promise<void> {
    return this.client(host, port).request({ type: 'push-reg', reg }, decodeEmptyBody, timeoutMs);
  }

  /** Serves one side-channel request (producer side). */
  handle(req: SideRequest): HandlerResult {
    switch (req.type) {
      case 'info': {
        const info = this.engineInfo();
        if (!info) return { refuse: 'not-ready', message: `engine ${this.engineId}: workers still registering` };
        if (req.version !== NIXL_PROTOCOL_VERSION || req.mode !== this.mode || req.compatHash !== info.compatHash) {
          this.metrics.handshakes.inc({ mode: this.mode, result: 'refused' });
          return { refuse: 'incompatible', message: `engine ${this.engineId} speaks version ${NIXL_PROTOCOL_VERSION}, mode ${this.mode}; peer: version ${req.version}, mode ${req.mode}${req.compatHash !== info.compatHash ? ', different model or backend' : ''}` };
        }
        return { ok: encodeEngineInfo(info) };
      }
      case 'lease':
        return { ok: encodeLeaseBody(this.leases.touch(req.requestIds, req.pinMs)) };
      case 'release':
        for (const id of req.requestIds) {
          this.leases.release(id);
          this.pushRegs.delete(id);
        }
        return { ok: [] };
      case 'push-reg': {
        if (this.mode !== 'push') return { refuse: 'incompatible', message: 'PUSH_REG to a pull engine' };
        const id = req.reg.producerRequestId;
        const state = this.leases.stateOf(id);
        if (state === undefined) {
          const ended = this.leases.endedAs(id);
          return ended ? { refuse: 'lease-expired', message: `request ${id}: lease ${ended}` } : { refuse: 'unknown-request', message: `no finished request ${id}` };
        }
        if (state !== 'held') return { refuse: 'lease-expired', message: `request ${id}: lease ${state}` };
        this.leases.touch([id], 0);
        let m = this.pushRegs.get(id);
        if (!m) this.pushRegs.set(id, (m = new Map()));
        m.set(req.reg.rank.agentName, req.reg);
        setImmediate(() => {
          for (const w of this.workers.values()) w.onPushReg?.(id);
        });
        return { ok: [] };
      }
    }
  }

  /** Counts a user (a connector half); {@link releaseUser} closes the hub with the last one. */
  addUser(): void {
    this.users++;
  }

  /** Drops a user; the last one closes the server and clients and forgets the hub. */
  async releaseUser(): Promise<void> {
    if (--this.users > 0) return;
    hubs.delete(this.engineId);
    for (const c of this.clients.values()) c.close();
    this.clients.clear();
    await this.server?.close();
  }
}

const hubs = new Map<string, NixlEngineHub>();

/** The hub of `o.engineId` in this process (created on first use), with one more user. */
export function acquireHub(o: HubOptions): NixlEngineHub {
  let h = hubs.get(o.engineId);
  if (!h) hubs.set(o.engineId, (h = new NixlEngineHub(o)));
  h.addUser();
  return h;
}

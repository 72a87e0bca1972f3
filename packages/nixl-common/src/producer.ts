/**
 * The producer's side channel, served by the NIXL scheduler half (vLLM's
 * `NixlConnectorScheduler` serves the handshake from the scheduler process with the metadata the
 * workers handed over through `set_xfer_handshake_metadata`). It answers:
 *
 * - `INFO` from the engine's handshake info ({@link engineInfoOf}: every worker's
 *   {@link RankInfo}, collected through `getHandshakeMetadata` -> `setXferHandshakeMetadata`);
 * - `LEASE` / `RELEASE` on the producer's {@link LeaseTable}, which this object owns (every request
 *   about a held request, `PUSH_REG` and `LOCALIZE` too, only with its lease capability,
 *   consumer-binding.ts: else `forbidden`);
 * - `PUSH_REG` (push mode): checks the lease and queues the registration; the scheduler half
 *   passes it to the producer workers in the next step's metadata (the workers WRITE);
 * - `LOCALIZE` (docs/localize.md): while the request's blocks are still held, queues an order for
 *   the producer workers (next step's metadata), keeps the blocks until every worker sent its fine
 *   sums (workers' metadata), and answers with their merge; `gone` when the blocks are not held.
 *
 * What the workers learn (read-done notifs, finished push writes) reaches the lease table in the
 * workers' per-step metadata, and the leases that ended reach the workers in the scheduler's
 * step metadata (scheduler.ts). One object per scheduler half: nothing is shared between engines
 * or halves through process-global state.
 * @module
 */
import type { FineSum } from '@kvconnect/checksum';
import type { KVCacheGroupConfig, LocalizeAnswer, LocalizeQuery } from '@kvconnect/core';
import { checkBindHost } from '@kvconnect/transfer';
import type { NixlConfig } from './config.js';
import { LeaseCapabilities, LocalizeBudget, localizeQueryRanges } from './consumer-binding.js';
import { LeaseTable } from './lease.js';
import { mergeLocalizeResults } from './localize.js';
import type { NixlMetrics } from './metrics.js';
import { NIXL_PROTOCOL_VERSION, compatHash, encodeEngineInfo, encodeLeaseBody, encodeLocalizeBody, type EngineInfo, type PushRegistration, type RankInfo, type SideRequest, type TransferMode } from './protocol.js';
import { SideChannelServer, type HandlerResult, type SideChannelServerStats } from './side-channel.js';

/**
 * A NIXL worker's handshake metadata (`getHandshakeMetadata`, plain data): its rank's
 * {@link RankInfo} (agent name and metadata blob, registered regions, cache layouts) and the
 * agent's backend.
 */
export interface NixlHandshakeMetadata {
  rank: RankInfo;
  backend: string;
}

/**
 * An engine's handshake info from its workers' handshake metadata, or null until every one of
 * the `tpSize * ppSize` workers reported (vLLM: the scheduler serves the metadata of all ranks).
 * Ranks are sorted by PP stage, then TP rank.
 */
export function engineInfoOf(o: { engineId: string; mode: TransferMode; tpSize: number; ppSize: number; groups: readonly KVCacheGroupConfig[]; workers: Iterable<NixlHandshakeMetadata>; salt?: string }): EngineInfo | null {
  const all = [...o.workers];
  if (all.length !== o.tpSize * o.ppSize || all.length === 0) return null;
  const ranks = all.map((w) => w.rank).sort((a, b) => a.ppRank - b.ppRank || a.tpRank - b.tpRank);
  const groupKinds = o.groups.map((g) => g.kind);
  return {
    version: NIXL_PROTOCOL_VERSION,
    mode: o.mode,
    compatHash: compatHash({ mode: o.mode, backend: all[0]!.backend, groupKinds, ranks, salt: o.salt }),
    engineId: o.engineId,
    tpSize: o.tpSize,
    ppSize: o.ppSize,
    blockSizes: o.groups.map((g) => g.blockSize),
    groupKinds,
    ranks,
  };
}

/** Push registrations queued between two engine steps, at most (more are refused `busy`). */
export const MAX_QUEUED_PUSH_REGS = 16_384;

/** `LOCALIZE` requests waiting for the workers, at most (more are refused `busy`). */
export const MAX_PENDING_LOCALIZE = 256;

/** A `LOCALIZE` order for the producer workers (in {@link NixlMeta}`.localize`; plain data). */
export interface LocalizeOrder {
  /** Matches the workers' answers to the request. */
  ticket: number;
  requestId: string;
  /** The request's blocks per group (as `kv_transfer_params.remote_block_ids`) and its tokens. */
  blocks: number[][];
  numTokens: number;
  query: LocalizeQuery;
}

/** A producer worker's fine sums of one order (in `NixlWorkerMeta.localized`; plain data). */
export interface LocalizeResult {
  ticket: number;
  groups: Array<{ groupId: number; sums: FineSum[]; error?: string }>;
}

/** Options of {@link NixlProducerChannel}. */
export interface NixlProducerChannelOptions {
  engineId: string;
  mode: TransferMode;
  /** Producer workers (`tpSize * ppSize`): each reports every request once. */
  workers: number;
  config: Pick<NixlConfig, 'leaseMs' | 'sideChannelHost' | 'sideChannelPort' | 'clusterSecret' | 'localizeHoldMs' | 'transferTimeoutMs' | 'localizeMaxInflightPerPeer' | 'localizeRangesPerSecondPerPeer'>;
  metrics: NixlMetrics;
}

/** The producer's side-channel server, leases and push registrations (owned by the scheduler half). */
export class NixlProducerChannel {
  readonly leases: LeaseTable;
  /** The engine's handshake info once every worker reported (INFO answers it). */
  info: EngineInfo | null = null;
  private server: SideChannelServer | null = null;
  private listening: Promise<{ host: string; port: number }> | null = null;
  /** Push registrations accepted since the last {@link takePushRegs}. */
  private pushRegs: PushRegistration[] = [];
  /** Finished requests' blocks and tokens, for `LOCALIZE` (forgotten with their lease). */
  private readonly finished = new Map<string, { blocks: number[][]; numTokens: number }>();
  private localizeOrders: LocalizeOrder[] = [];
  private readonly localizing = new Map<number, { order: LocalizeOrder; results: Map<string, LocalizeResult>; resolve: (a: LocalizeAnswer | Error) => void; timer: NodeJS.Timeout }>();
  private nextTicket = 1;
  /**
   * The lease capability of each held request (protocol 19, consumer-binding.ts; drawn by
   * {@link heldBlocks}): `LEASE`, `RELEASE`, `PUSH_REG` and `LOCALIZE` of the request must carry
   * it, else `forbidden`. It is the request's binding: consumer keys bind nothing here since 19.
   */
  readonly capabilities = new LeaseCapabilities();
  /** The `LOCALIZE` budget: token ranges per request, computations per connection (consumer-binding.ts). */
  private readonly budget: LocalizeBudget;
  /** Requests served, by type (diagnostics; a verified load never makes a `localize`). */
  readonly served: Record<SideRequest['type'], number> = { info: 0, lease: 0, release: 0, 'push-reg': 0, localize: 0 };

  constructor(private readonly o: NixlProducerChannelOptions) {
    this.budget = new LocalizeBudget({ maxInFlight: o.config.localizeMaxInflightPerPeer, rangesPerSecond: o.config.localizeRangesPerSecondPerPeer });
    this.leases = new LeaseTable({ leaseMs: o.config.leaseMs, workers: o.workers, holdAfterDoneMs: o.config.localizeHoldMs, onExpired: () => o.metrics.expiredLeases.inc({ mode: o.mode }) });
  }

  /**
   * Starts the side-channel server (once) on the configured host (loopback by default), with the
   * cluster secret when one is configured. @returns its address.
   * @throws ClusterSecretError (rejected) for a non-loopback host without a secret (`checkBindHost`).
   */
  listen(): Promise<{ host: string; port: number }> {
    if (!this.listening) {
      const secret = this.o.config.clusterSecret;
      this.listening = (async () => {
        const host = checkBindHost(this.o.config.sideChannelHost, secret, 'NIXL side channel');
        this.server = new SideChannelServer((req, peer) => this.handle(req, peer), { clusterSecret: secret });
        return this.server.listen(host, this.o.config.sideChannelPort);
      })();
    }
    return this.listening;
  }

  /** The side channel's address once it listens. */
  get address(): { host: string; port: number } | null {
    return this.server?.address ?? null;
  }

  /** The side-channel server's counters (buffered bytes, pending requests, dropped peers), or null before it listens. */
  sideChannelStats(): SideChannelServerStats | null {
    return this.server?.stats() ?? null;
  }

  /** The push registrations accepted since the previous call (for the next step's metadata). */
  takePushRegs(): PushRegistration[] {
    const r = this.pushRegs;
    this.pushRegs = [];
    return r;
  }

  /**
   * A finished request whose blocks are held under a lease: what a later `LOCALIZE` sums.
   * @returns the request's fresh lease capability (consumer-binding.ts), for its `kv_transfer_params`.
   */
  heldBlocks(requestId: string, blocks: number[][], numTokens: number): string {
    this.finished.set(requestId, { blocks, numTokens });
    return this.capabilities.grant(requestId);
  }

  /** Why a message with `capability` may not act on `requestId` (a `forbidden` text that never holds a capability), or null. */
  private denied(requestId: string, capability: string | null | undefined, what: string): string | null {
    const why = this.capabilities.check(requestId, capability);
    return why === null ? null : `engine ${this.o.engineId}: request ${requestId}: ${why}; ${what}`;
  }

  /** The `LOCALIZE` orders accepted since the previous call (for the next step's metadata). */
  takeLocalizeOrders(): LocalizeOrder[] {
    for (const id of this.finished.keys()) {
      if (this.leases.stateOf(id) !== undefined) continue;
      this.finished.delete(id);
      this.capabilities.forget(id);
    }
    const r = this.localizeOrders;
    this.localizeOrders = [];
    return r;
  }

  /** A worker's fine sums of an order (`worker`: its `workerKey`); the answer goes out once every worker sent its own. */
  onLocalized(worker: string, r: LocalizeResult): void {
    const p = this.localizing.get(r.ticket);
    if (!p) return;
    p.results.set(worker, r);
    if (p.results.size < this.o.workers) return;
    p.resolve(mergeLocalizeResults(p.order.query, [...p.results.values()].map((x) => x.groups)));
  }

  /**
   * Serves `LOCALIZE`: see the module comment. Refused `forbidden` without the request's lease
   * capability, `busy` over the request's budget or the connection `peer`'s computations in
   * flight; a refusal changes nothing (consumer-binding.ts).
   */
  private async localize(requestId: string, query: LocalizeQuery, capability: string | null, peer: string): Promise<HandlerResult> {
    const held = this.finished.get(requestId);
    if (!held || !this.leases.blocksHeld(requestId)) {
      const state = this.leases.stateOf(requestId);
      const ended = this.leases.endedAs(requestId);
      const why = state === 'held' || state === 'done' ? 'blocks being freed' : state !== undefined ? `lease ${state}` : ended !== undefined ? `blocks freed (lease ${ended})` : 'unknown request';
      return { ok: encodeLocalizeBody({ status: 'gone', detail: `request ${requestId}: ${why}` }) };
    }
    const denied = this.denied(requestId, capability, 'nothing summed');
    if (denied !== null) return { refuse: 'forbidden', message: denied };
    // One LOCALIZE per request at a time: a peer cannot fill the queue with copies of one order.
    for (const p of this.localizing.values()) {
      if (p.order.requestId === requestId) return { refuse: 'busy', message: `engine ${this.o.engineId}: a LOCALIZE of request ${requestId} is already being served` };
    }
    if (this.localizing.size >= MAX_PENDING_LOCALIZE) return { refuse: 'busy', message: `engine ${this.o.engineId}: ${MAX_PENDING_LOCALIZE} LOCALIZE requests wait for the workers` };
    // Charged to the request (what its capability grants), not to a key the asker drew.
    const asker = `connection ${peer}`;
    const over = this.budget.take(`request ${requestId}`, localizeQueryRanges(query), asker);
    if (over !== null) return { refuse: 'busy', message: `engine ${this.o.engineId}: ${over}` };
    const order: LocalizeOrder = { ticket: this.nextTicket++, requestId, blocks: held.blocks, numTokens: held.numTokens, query };
    this.leases.localizing(requestId, 1);
    try {
      const a = await new Promise<LocalizeAnswer | Error>((resolve) => {
        const timer = setTimeout(() => resolve(new Error(`the workers sent no fine sums in ${this.o.config.transferTimeoutMs} ms`)), this.o.config.transferTimeoutMs);
        timer.unref();
        this.localizing.set(order.ticket, { order, results: new Map(), resolve, timer });
        this.localizeOrders.push(order);
      });
      if (a instanceof Error) return { refuse: 'internal', message: a.message };
      return { ok: encodeLocalizeBody(a) };
    } finally {
      const p = this.localizing.get(order.ticket);
      if (p) clearTimeout(p.timer);
      this.localizing.delete(order.ticket);
      this.leases.localizing(requestId, -1);
      this.budget.done(asker);
    }
  }

  /** Serves one side-channel request (`peer`: the connection, as the side-channel server names it). */
  handle(req: SideRequest, peer = ''): HandlerResult | Promise<HandlerResult> {
    const { engineId, mode, metrics } = this.o;
    this.served[req.type]++;
    switch (req.type) {
      case 'info': {
        const info = this.info;
        if (!info) return { refuse: 'not-ready', message: `engine ${engineId}: workers still registering` };
        if (req.version !== NIXL_PROTOCOL_VERSION || req.mode !== mode || req.compatHash !== info.compatHash) {
          metrics.handshakes.inc({ mode, result: 'refused' });
          return { refuse: 'incompatible', message: `engine ${engineId} speaks version ${NIXL_PROTOCOL_VERSION}, mode ${mode}; peer: version ${req.version}, mode ${req.mode}${req.compatHash !== info.compatHash ? ', different model or backend' : ''}` };
        }
        return { ok: encodeEngineInfo(info) };
      }
      case 'lease': {
        // Requests named without their capability are neither extended nor pinned: answered 0 when
        // others of the LEASE carry theirs (a consumer's heartbeat batches all of its loads from this
        // producer; one forged request among them must not starve the others), refused `forbidden`
        // when none does (a pin before a READ names one request).
        const ok: string[] = [];
        let denied: string | null = null;
        for (const [i, id] of req.requestIds.entries()) {
          const why = this.denied(id, req.capabilities?.[i], 'nothing leased');
          if (why === null) ok.push(id);
          else denied ??= why;
        }
        if (denied !== null && ok.length === 0) return { refuse: 'forbidden', message: denied };
        const expiries = this.leases.touch(ok, req.pinMs);
        return { ok: encodeLeaseBody(new Map(req.requestIds.map((id) => [id, expiries.get(id) ?? 0]))) };
      }
      case 'release': {
        // All or nothing: a RELEASE naming a request without its capability releases none.
        for (const [i, id] of req.requestIds.entries()) {
          const denied = this.denied(id, req.capabilities?.[i], 'nothing released');
          if (denied !== null) return { refuse: 'forbidden', message: denied };
        }
        for (const id of req.requestIds) this.leases.release(id);
        return { ok: [] };
      }
      case 'push-reg': {
        if (mode !== 'push') return { refuse: 'incompatible', message: 'PUSH_REG to a pull engine' };
        const id = req.reg.producerRequestId;
        const denied = this.denied(id, req.capability, 'not registered');
        if (denied !== null) return { refuse: 'forbidden', message: denied };
        const state = this.leases.stateOf(id);
        if (state === undefined) {
          const ended = this.leases.endedAs(id);
          return ended ? { refuse: 'lease-expired', message: `request ${id}: lease ${ended}` } : { refuse: 'unknown-request', message: `no finished request ${id}` };
        }
        if (state !== 'held') return { refuse: 'lease-expired', message: `request ${id}: lease ${state}` };
        if (this.pushRegs.length >= MAX_QUEUED_PUSH_REGS) return { refuse: 'busy', message: `engine ${engineId}: ${MAX_QUEUED_PUSH_REGS} push registrations wait for the next step` };
        this.leases.touch([id], 0);
        this.pushRegs.push(req.reg);
        return { ok: [] };
      }
      case 'localize':
        return this.localize(req.requestId, req.query, req.capability ?? null, peer);
    }
  }

  /** Closes the server. */
  async close(): Promise<void> {
    for (const p of this.localizing.values()) p.resolve(new Error('producer shutting down'));
    await this.server?.close();
  }
}

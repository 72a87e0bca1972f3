/**
 * The worker half of `MooncakeConnector` (vLLM `MooncakeConnectorWorker`), P2P with producer
 * WRITEs.
 *
 * Producer worker: registers its KV memory (host, or device memory as `VRAM`) with its transfer
 * agent, binds a ZeroMQ ROUTER and
 * registers the ROUTER's address with the bootstrap server. A consumer worker's
 * {@link TransferMetadata} may arrive before the producer has the request: each request waits
 * (deadline `abort_timeout_ms`) until the scheduler's metadata ships the request's blocks. It then
 * WRITEs the consumer's blocks through the agent ({@link planWrites}) and answers with a
 * {@link TransferResponse} per request (CONTINUE, the last one FINISH; ERROR for failures) whose
 * `kv_checksums` carries the request's checksum payload (SPEC 7). The blocks are reported in
 * `finishedSending` once every consumer worker (TP x PP, from the metadata) was answered, or when
 * the lease (`abort_timeout_ms`) expires with no write in flight.
 *
 * Consumer worker: for each load of the step, finds the producer's workers through the bootstrap
 * server, sends its metadata to every producer worker over a DEALER, and finishes the load when
 * each of them answered. The first copy of the checksum payload is kept and reported in
 * `kvChecksums` with the finished load. A failed load (an error response, a malformed response,
 * the deadline) is reported finished with its loaded blocks in `invalidBlockIds`, after every
 * producer worker answered (none may still be writing into the blocks), or at the deadline.
 *
 * Nothing here waits inside an engine step; every network wait is async with a deadline, and no
 * peer message can throw out of a handler.
 *
 * Side channel security (`channel.ts`, `docs/security.md (Mooncake)`): every DEALER connection
 * starts with a hello / welcome handshake; the consumer sends its metadata only after the producer
 * proved the cluster secret (when one is set), and every message is proven and numbered. The
 * ROUTER binds to `side_channel_host` (loopback by default; another host needs a secret).
 * Bounds on the producer: requests waiting for their prefill are capped per consumer connection
 * (`max_waiters_per_peer`) and in total (`max_waiters`) and expire after `abort_timeout_ms`; a
 * request over a cap is answered with an error at once. The bytes of metadata messages not yet
 * answered are capped the same way (`max_pending_bytes[_per_peer]`), checked before the message
 * is decoded.
 *
 * Localization (`docs/localize.md`): with `localize_hold_ms` a producer keeps a request's blocks
 * that long after every consumer worker was served, and answers a consumer's `loc` (side-channel
 * protocol 4) with the fine sums of its rank over the held blocks (`localizeOrderOnRank`); the
 * answer ends the hold. A send no longer held is answered `gone`.
 *
 * Lease capability (protocol 6, `@kvconnect/nixl-common` `consumer-binding.ts`): a send whose
 * params held `lease_capability` is written only for an `md` request that carries it, and
 * localized only for a `loc` that does (constant-time comparison); without one, the first consumer
 * key served binds the send and an `md` or `loc` with another key is refused. Refused `md`
 * requests are answered `err_code` `forbidden` and do not count as served.
 * @module
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { loadBlockIds, silentLogger, type Logger } from '@kvconnect/core';
import type { KVConnectorWorker, KVRole, LoadError, SchedulerOutput, TransferResults, WorkerContext, WorkerKVCaches } from '@kvconnect/core';
import { checkBindHost, readDeviceBytes, toMemoryRegion, type RegisteredRegion, type TransferAgent } from '@kvconnect/transfer';
import * as zmq from 'zeromq';
import { ConsumerBindings, LocalizeBudget, capabilityDenied, localizeOrderOnRank, localizeQueryRanges } from '@kvconnect/nixl-common';
import type { GroupPlan } from '@kvconnect/checksum';
import { createAgent } from './agent.js';
import { ConsumerSession, ProducerSessions, SideChannelAuthError, type ProducerSession } from './channel.js';
import { queryEngine, registerWorker, registrationBody, type EngineWorkers } from './bootstrap.js';
import type { MooncakeOptions } from './config.js';
import { describeLayout, planWrites, workerMemory } from './layout.js';
import {
  decodeEnvelope,
  decodeLocalizeRequest,
  decodeTransferMetadata,
  encodeLocalizeReply,
  decodeTransferResponse,
  encodeEnvelope,
  MooncakeIncompatibleError,
  type SideEnvelope,
  encodeTransferMetadata,
  encodeTransferResponse,
  XferStatusCode,
  type TransferMetadata,
  type TransferResponse,
  type WireCache,
  type WireLoad,
  type WireMemory,
} from './protocol.js';
import { type MooncakeConnectorMetadata, type MooncakeLoadSpec, type MooncakeSendSpec } from './scheduler.js';
import { mooncakeMetrics, type MooncakeMetrics } from './metrics.js';

const errText = (e: unknown): string => (e instanceof Error ? e.message : String(e));


/** Test and embedding hooks of the connector (fault injection). */
export interface MooncakeConnectorHooks {
  /** Wraps each worker's transfer agent (e.g. a fault-injecting agent). */
  wrapAgent?(agent: TransferAgent, ctx: WorkerContext): TransferAgent;
  /** Sees every transfer response a producer worker sends; returns the bytes to send instead. */
  onResponse?(bytes: Uint8Array, ctx: WorkerContext): Uint8Array;
}

/** Counters of one worker (for tests, logs and metrics). */
export interface MooncakeWorkerStats {
  /** Producer: metadata messages received, and rejected by the decoder. */
  metadataReceived: number;
  metadataRejected: number;
  /** Producer: requests that arrived before their prefill finished (and waited). */
  waitedForPrefill: number;
  /** Producer: requests answered with an error at once because a waiter cap was reached. */
  waitersRefused: number;
  /** Producer: metadata messages refused because a pending-bytes cap was reached. */
  messagesRefusedBusy: number;
  /** Side-channel messages refused (handshake, proof, version, session; both roles). */
  authRejected: number;
  /** Producer: WRITE transfers posted, bytes written, descriptors, error responses. */
  writes: number;
  bytesWritten: number;
  descriptors: number;
  errorsSent: number;
  /** Producer: send states ended by lease expiry. */
  leasesExpired: number;
  /** Producer: side-channel messages received on the ROUTER (every kind, well-formed or not). */
  messagesIn: number;
  /** Producer: `loc` (localize) requests received, and answered `held` (fine sums sent). */
  localizeReceived: number;
  localizeAnswered: number;
  /** Producer: `loc` requests refused `forbidden` (no or another lease capability, or another consumer's transfer) or `busy` (over the transfer's budget). */
  localizeRefused: number;
  /** Producer: `md` requests refused `forbidden` (no or another lease capability, or another consumer's transfer); nothing was written. */
  metadataForbidden: number;
  /** Consumer: loads finished, failed, responses received, malformed responses. */
  loadsFinished: number;
  loadsFailed: number;
  responsesReceived: number;
  responsesMalformed: number;
}

/** Producer state of one finished request. */
interface SendState {
  spec: MooncakeSendSpec;
  served: Set<string>;
  expected: number | null;
  inflight: number;
  expired: boolean;
  /** Every consumer worker was served; the blocks are held for `localize_hold_ms` (a drill-down may ask). */
  holding: boolean;
  timer: NodeJS.Timeout;
}

/** Consumer state of one load. */
interface LoadState {
  spec: MooncakeLoadSpec;
  /** Producer workers (ROUTER addresses) that have not answered yet; null until the metadata went out. */
  waiting: Set<string> | null;
  failed: string | null;
  /** The `LoadError` reason of the first failure (`unreachable`, `unauthenticated`, `malformed-response`, `producer-error`, `timeout`). */
  failReason?: string;
  payload: Uint8Array | null;
  timer: NodeJS.Timeout;
}

interface Waiter {
  resolve(s: SendState | string): void;
}

/** A consumer's DEALER to one producer worker and its session. */
interface Dealer {
  sock: zmq.Dealer;
  sender: Sender;
  session: ConsumerSession;
  /** Settles once the welcome is checked. */
  ready: Promise<void>;
  settle(err?: Error): void;
}

/** A serial send queue over one socket (zeromq allows one pending send per socket). */
class Sender {
  private q: Promise<void> = Promise.resolve();
  constructor(private readonly sock: zmq.Router | zmq.Dealer) {}
  send(msg: Array<Uint8Array | Buffer> | Uint8Array): Promise<void> {
    const p = this.q.then(() => this.sock.send(msg as never));
    this.q = p.catch(() => {});
    return p;
  }
}

const FINISHED_MEMORY = 65_536;

/** The worker half. */
export class MooncakeWorker implements KVConnectorWorker {
  readonly stats: MooncakeWorkerStats = {
    metadataReceived: 0,
    metadataRejected: 0,
    waitedForPrefill: 0,
    waitersRefused: 0,
    messagesRefusedBusy: 0,
    authRejected: 0,
    writes: 0,
    bytesWritten: 0,
    descriptors: 0,
    errorsSent: 0,
    leasesExpired: 0,
    messagesIn: 0,
    localizeReceived: 0,
    localizeAnswered: 0,
    localizeRefused: 0,
    metadataForbidden: 0,
    loadsFinished: 0,
    loadsFailed: 0,
    responsesReceived: 0,
    responsesMalformed: 0,
  };
  /** The last error message of a failed load or request (diagnostics). */
  lastError: string | null = null;
  private caches: WorkerKVCaches | null = null;
  private agent: TransferAgent | null = null;
  /** The KV regions as the agent registered them (host `DRAM`, or device `VRAM` with its CUDA device). */
  private regions: readonly RegisteredRegion[] = [];
  private memory: WireMemory = { kind: 'DRAM', deviceId: 0 };
  private layout: WireCache[] = [];
  private agentMetadata: Uint8Array | null = null;
  private router: zmq.Router | null = null;
  private routerSender: Sender | null = null;
  /** `tcp://host:port` of this worker's ROUTER (producer). */
  sideChannelAddr: string | null = null;
  private handshake: Record<string, string | number> | null = null;
  private meta: MooncakeConnectorMetadata | null = null;
  private closed = false;
  // producer
  private readonly sends = new Map<string, SendState>();
  private readonly waiters = new Map<string, Set<Waiter>>();
  private readonly finishedTransfers = new Map<string, string>();
  /** This rank's producer checksum plans by group index (fine sums of `loc`), made on first use. */
  private readonly plans = new Map<number, GroupPlan>();
  private finishedSending = new Set<string>();
  private sessions: ProducerSessions | null = null;
  /** Waiters and pending metadata bytes, in total and per peer (a consumer connection). */
  private waiterTotal = 0;
  private readonly peerWaiters = new Map<string, number>();
  private pendingBytes = 0;
  private readonly peerPendingBytes = new Map<string, number>();
  /** The consumer key each send is bound to (the first `md` served for it; `loc` needs it: `consumer-binding.ts`). */
  private readonly bindings = new ConsumerBindings();
  /** Per consumer `loc` budget (`localize_max_inflight_per_peer`, `localize_ranges_per_second_per_peer`). */
  private readonly localizeBudget: LocalizeBudget;
  /** This worker's owner token at the bootstrap server. */
  private readonly owner = randomUUID();
  // consumer
  private readonly loads = new Map<string, LoadState>();
  private finishedRecving = new Set<string>();
  private invalid = new Set<number>();
  private loadErrors = new Map<string, LoadError>();
  private payloads = new Map<string, Uint8Array>();
  private readonly dealers = new Map<string, Dealer>();
  private readonly producers = new Map<string, Promise<EngineWorkers>>();

  constructor(
    private readonly role: KVRole,
    private readonly ctx: WorkerContext,
    private readonly opts: MooncakeOptions,
    private readonly hooks: MooncakeConnectorHooks = {},
  ) {
    this.metrics = mooncakeMetrics(ctx.metricsRegistry);
    this.localizeBudget = new LocalizeBudget({ maxInFlight: opts.localizeMaxInflightPerPeer, rangesPerSecond: opts.localizeRangesPerSecondPerPeer });
    this.log = ctx.logger?.child({ connector: 'MooncakeConnector' }) ?? silentLogger();
  }

  private readonly metrics: MooncakeMetrics;
  /** The engine's logger (`ctx.logger`: engine, role, PP stage, TP rank), or a silent one. */
  private readonly log: Logger;

  private get key(): string {
    return `${this.ctx.ppRank}:${this.ctx.tpRank}`;
  }

  /** This worker's transfer agent (after `registerKvCaches`). */
  get transferAgent(): TransferAgent | null {
    return this.agent;
  }

  /**
   * Registers the worker's KV regions with a new agent: host memory as `DRAM`, device memory
   * (`DeviceMemoryRegion`) as `VRAM` with its CUDA device (`toMemoryRegion`; the embedded agent
   * moves it by CUDA IPC on one host and pinned staging across hosts, the Mooncake agent registers
   * it with location `cuda:N`). Producer: binds the side channel and registers with the bootstrap
   * server.
   * @throws LayoutMismatchError when the regions are not all in one memory (all host, or all on
   *   one CUDA device); the agent's TransferError when it refuses a region.
   */
  async registerKvCaches(caches: WorkerKVCaches): Promise<void> {
    this.caches = caches;
    const name = `${this.ctx.engineId.slice(0, 200)}/pp${this.ctx.ppRank}/tp${this.ctx.tpRank}/${randomUUID().slice(0, 8)}`;
    let agent = await createAgent(this.opts.backend, name, this.opts.host, this.opts.clusterSecret, this.opts.transferLanes, this.opts.transferStallTimeoutMs);
    if (this.hooks.wrapAgent) agent = this.hooks.wrapAgent(agent, this.ctx);
    this.agent = agent;
    const reg = await agent.registerMemory(caches.regions.map((r) => toMemoryRegion(r)));
    this.memory = workerMemory(reg.regions);
    this.regions = reg.regions;
    this.layout = describeLayout(caches);
    this.agentMetadata = await agent.getLocalMetadata();
    if (this.role !== 'kv_consumer') await this.startRouter();
  }

  private async startRouter(): Promise<void> {
    const host = checkBindHost(this.opts.host, this.opts.clusterSecret, 'Mooncake side channel');
    this.sessions = new ProducerSessions(this.opts.clusterSecret, { maxSessions: this.opts.maxSessions, idleMs: this.opts.sessionIdleMs });
    const router = new zmq.Router({ linger: 0, maxMessageSize: this.opts.maxMessageBytes, receiveHighWaterMark: 64 });
    await router.bind(`tcp://${host.includes(':') ? `[${host}]` : host}:*`);
    this.router = router;
    this.routerSender = new Sender(router);
    this.sideChannelAddr = router.lastEndpoint;
    void this.routerLoop(router);
    const reg = { engineId: this.ctx.engineId, tpRank: this.ctx.tpRank, ppRank: this.ctx.ppRank, tpSize: this.ctx.tpSize, ppSize: this.ctx.ppSize, addr: this.sideChannelAddr!, owner: this.owner };
    if (this.opts.bootstrapAddr !== undefined) {
      await registerWorker(this.opts.bootstrapAddr, reg, { timeoutMs: this.opts.bootstrapTimeoutMs, secret: this.opts.clusterSecret });
      return;
    }
    // The engine's own bootstrap server (its scheduler half's): registered only through the
    // handshake hooks (getHandshakeMetadata -> MooncakeScheduler.setXferHandshakeMetadata), in
    // process or from a worker process alike; no process-global lookup.
    this.handshake = registrationBody(reg);
  }

  /** Producer without `bootstrap_addr`: this worker's registration body for its engine's bootstrap server. */
  getHandshakeMetadata(): Record<string, string | number> | null {
    return this.handshake;
  }

  bindConnectorMetadata(meta: unknown): void {
    this.meta = (meta as MooncakeConnectorMetadata | null) ?? null;
    if (!this.meta) return;
    if (this.role !== 'kv_consumer') {
      for (const s of this.meta.sends) this.addSend(s);
      for (const t of this.meta.aborts) this.endTransfer(t, 'the producer request ended without KV to send (aborted or failed)');
    }
  }

  startLoadKv(_output: SchedulerOutput): void {
    const loads = this.meta?.loads ?? [];
    if (loads.length === 0 || this.role === 'kv_producer') return;
    const byProducer = new Map<string, MooncakeLoadSpec[]>();
    for (const l of loads) {
      const st: LoadState = { spec: l, waiting: null, failed: null, payload: null, timer: setTimeout(() => this.timeout(l.requestId), this.opts.transferTimeoutMs) };
      this.loads.set(l.requestId, st);
      const k = `${l.remoteEngineId}\u0000${l.bootstrapAddr}`;
      let a = byProducer.get(k);
      if (!a) byProducer.set(k, (a = []));
      a.push(l);
    }
    for (const specs of byProducer.values()) void this.sendLoads(specs);
  }

  getTransferResults(): TransferResults {
    const res: TransferResults = { finishedSending: this.finishedSending, finishedRecving: this.finishedRecving, invalidBlockIds: this.invalid, kvChecksums: this.payloads, loadErrors: this.loadErrors };
    this.loadErrors = new Map();
    this.finishedSending = new Set();
    this.finishedRecving = new Set();
    this.invalid = new Set();
    this.payloads = new Map();
    return res;
  }

  clearConnectorMetadata(): void {
    this.meta = null;
  }

  // ------------------------------------------------------------------------------------------
  // Producer

  private addSend(spec: MooncakeSendSpec): void {
    const old = this.sends.get(spec.transferId);
    if (old) clearTimeout(old.timer);
    this.bindings.forget(spec.transferId);
    const st: SendState = { spec, served: new Set(), expected: null, inflight: 0, expired: false, holding: false, timer: setTimeout(() => this.expire(spec.transferId), this.opts.abortTimeoutMs) };
    this.sends.set(spec.transferId, st);
    this.finishedTransfers.delete(spec.transferId);
    const ws = this.waiters.get(spec.transferId);
    this.waiters.delete(spec.transferId);
    for (const w of ws ?? []) w.resolve(st);
  }

  private rememberFinished(transferId: string, why: string): void {
    this.finishedTransfers.set(transferId, why);
    if (this.finishedTransfers.size > FINISHED_MEMORY) this.finishedTransfers.delete(this.finishedTransfers.keys().next().value!);
  }

  /** Ends a transfer that will never have blocks (aborted): waiting consumers get an error. */
  private endTransfer(transferId: string, why: string): void {
    this.rememberFinished(transferId, why);
    const ws = this.waiters.get(transferId);
    this.waiters.delete(transferId);
    for (const w of ws ?? []) w.resolve(why);
  }

  private expire(transferId: string): void {
    const st = this.sends.get(transferId);
    if (!st) return;
    st.expired = true;
    if (st.inflight === 0) {
      this.stats.leasesExpired++;
      this.finishSend(st, `the lease of transfer ${transferId} expired`);
    }
  }

  private finishSend(st: SendState, why: string): void {
    clearTimeout(st.timer);
    if (this.sends.get(st.spec.transferId) === st) {
      this.sends.delete(st.spec.transferId);
      this.bindings.forget(st.spec.transferId);
    }
    this.rememberFinished(st.spec.transferId, why);
    this.finishedSending.add(st.spec.requestId);
  }

  /** Every consumer worker of `st` was answered: frees its blocks, or holds them for `localize_hold_ms`. */
  private served(st: SendState): void {
    if (this.opts.localizeHoldMs <= 0 || st.holding) {
      if (!st.holding) this.finishSend(st, `transfer ${st.spec.transferId} was served`);
      return;
    }
    st.holding = true;
    clearTimeout(st.timer);
    st.timer = setTimeout(() => this.finishSend(st, `transfer ${st.spec.transferId} was served (hold of ${this.opts.localizeHoldMs} ms ended)`), this.opts.localizeHoldMs);
  }

  private waitForSend(transferId: string, peer: string): Promise<SendState | string> {
    const st = this.sends.get(transferId);
    if (st) return Promise.resolve(st);
    const done = this.finishedTransfers.get(transferId);
    if (done) return Promise.resolve(`transfer ${transferId} is over: ${done}`);
    const mine = this.peerWaiters.get(peer) ?? 0;
    if (this.waiterTotal >= this.opts.maxWaiters || mine >= this.opts.maxWaitersPerPeer) {
      this.stats.waitersRefused++;
      return Promise.resolve(`transfer ${transferId} refused: the producer already has ${this.waiterTotal} requests waiting for their prefill (${mine} of this consumer; caps ${this.opts.maxWaiters} / ${this.opts.maxWaitersPerPeer} per consumer)`);
    }
    this.waiterTotal++;
    this.peerWaiters.set(peer, mine + 1);
    const release = () => {
      this.waiterTotal--;
      const n = (this.peerWaiters.get(peer) ?? 1) - 1;
      if (n > 0) this.peerWaiters.set(peer, n);
      else this.peerWaiters.delete(peer);
    };
    this.stats.waitedForPrefill++;
    return new Promise((resolve) => {
      let set = this.waiters.get(transferId);
      if (!set) this.waiters.set(transferId, (set = new Set()));
      const w: Waiter = {
        resolve: (x) => {
          clearTimeout(timer);
          release();
          resolve(x);
        },
      };
      const timer = setTimeout(() => {
        set!.delete(w);
        if (set!.size === 0 && this.waiters.get(transferId) === set) this.waiters.delete(transferId);
        release();
        resolve(`timed out after ${this.opts.abortTimeoutMs} ms waiting for the prefill of transfer ${transferId}`);
      }, this.opts.abortTimeoutMs);
      set.add(w);
    });
  }

  private async routerLoop(router: zmq.Router): Promise<void> {
    try {
      for await (const frames of router) {
        this.stats.messagesIn++;
        const [identity, msg] = frames;
        if (!identity || !msg || frames.length !== 2) {
          this.stats.metadataRejected++;
          continue;
        }
        void this.onRouterMessage(identity, msg).catch((e) => this.log.warn({ err: errText(e) }, 'metadata handler failed'));
      }
    } catch (e) {
      if (!this.closed) this.log.warn({ err: errText(e) }, 'router loop ended');
    }
  }

  private sendEnvelope(identity: Buffer, e: SideEnvelope): void {
    if (!this.routerSender || this.closed) return;
    this.routerSender.send([identity, encodeEnvelope(e)]).catch((err) => this.log.debug({ err: errText(err) }, 'reply failed'));
  }

  /** Answers in the session the message came in (even when that session was dropped since). */
  private reply(identity: Buffer, session: ProducerSession, r: TransferResponse): void {
    if (!this.routerSender || this.closed) return;
    if (r.status === XferStatusCode.ERROR || r.errReqs.length > 0) this.stats.errorsSent++;
    let bytes = encodeTransferResponse(r);
    if (this.hooks.onResponse) bytes = this.hooks.onResponse(bytes, this.ctx);
    this.sendEnvelope(identity, this.sessions!.seal(session, bytes)!);
  }

  /** A ROUTER message: the envelope, the handshake and the proofs, then {@link onMetadata}. */
  private async onRouterMessage(identity: Buffer, msg: Buffer): Promise<void> {
    let e: SideEnvelope;
    try {
      e = decodeEnvelope(msg, this.opts.maxMessageBytes);
    } catch (err) {
      this.stats.metadataRejected++;
      this.stats.authRejected++;
      this.lastError = err instanceof Error ? err.message : String(err);
      return this.sendEnvelope(identity, { kind: 'refuse', code: err instanceof MooncakeIncompatibleError ? 'incompatible' : 'bad-message', message: this.lastError });
    }
    const peer = identity.toString('hex');
    if (e.kind === 'hello') {
      const w = this.sessions!.hello(peer, e);
      if (w.kind === 'refuse') {
        this.stats.authRejected++;
        this.lastError = w.message ?? 'hello refused';
      }
      return this.sendEnvelope(identity, w);
    }
    if (e.kind !== 'md' && e.kind !== 'loc') {
      this.stats.authRejected++;
      return this.sendEnvelope(identity, { kind: 'refuse', code: 'bad-message', message: `a producer expects hello, md or loc, not ${e.kind}` });
    }
    const opened = this.sessions!.open(peer, e);
    if ('refuse' in opened) {
      this.stats.metadataRejected++;
      this.stats.authRejected++;
      this.lastError = opened.refuse.message ?? 'refused';
      return this.sendEnvelope(identity, opened.refuse);
    }
    if (e.kind === 'loc') return this.onLocalize(identity, opened.session, opened.body);
    const cost = opened.body.byteLength;
    const mine = this.peerPendingBytes.get(peer) ?? 0;
    if (this.pendingBytes + cost > this.opts.maxPendingBytes || mine + cost > this.opts.maxPendingBytesPerPeer) {
      this.stats.metadataReceived++;
      this.stats.messagesRefusedBusy++;
      this.lastError = `metadata message of ${cost} bytes refused: ${this.pendingBytes} bytes of metadata pending (${mine} of this consumer; caps ${this.opts.maxPendingBytes} / ${this.opts.maxPendingBytesPerPeer} per consumer)`;
      let ids: string[] = [];
      try {
        ids = [...decodeTransferMetadata(opened.body, this.opts.maxMessageBytes).requests.keys()];
      } catch {
        /* answered without ids */
      }
      return this.reply(identity, opened.session, { status: XferStatusCode.ERROR, okReqs: [], errReqs: ids, errMsg: this.lastError, kvChecksums: new Map() });
    }
    this.pendingBytes += cost;
    this.peerPendingBytes.set(peer, mine + cost);
    try {
      await this.onMetadata((r) => this.reply(identity, opened.session, r), opened.body, peer);
    } finally {
      this.pendingBytes -= cost;
      const n = (this.peerPendingBytes.get(peer) ?? cost) - cost;
      if (n > 0) this.peerPendingBytes.set(peer, n);
      else this.peerPendingBytes.delete(peer);
    }
  }

  /**
   * Why a message about `st` with `capability` and `consumerKey` may not act on it (a text without
   * the capability), or null: a send with a capability needs it; one without is bound to the
   * first consumer key that asks (an unbound one is bound to `consumerKey` now, a null key binds nothing).
   */
  private denied(st: SendState, capability: string | null | undefined, consumerKey: string | null): string | null {
    const cap = st.spec.leaseCapability;
    if (cap !== undefined) return capabilityDenied(cap, capability);
    return this.bindings.check(st.spec.transferId, consumerKey);
  }

  /**
   * A consumer's `loc`: the fine sums of this rank over the held blocks of its transfer, or `gone`;
   * the answer ends the send's hold (`localize_hold_ms`). A malformed request is refused
   * (`bad-message`); one without the transfer's lease capability (or, for a transfer without one,
   * of another consumer key than the one served: `forbidden`) or over the transfer's budget
   * (`busy`) is refused and changes nothing (`consumer-binding.ts`).
   * Synchronous: the blocks cannot be freed while they are summed.
   */
  private onLocalize(identity: Buffer, session: ProducerSession, body: Uint8Array): void {
    this.stats.localizeReceived++;
    let req;
    try {
      req = decodeLocalizeRequest(body, this.opts.maxMessageBytes);
    } catch (err) {
      this.lastError = err instanceof Error ? err.message : String(err);
      return this.sendEnvelope(identity, { kind: 'refuse', code: 'bad-message', message: this.lastError });
    }
    const st = this.sends.get(req.transferId);
    let bytes: Uint8Array;
    if (!st || !this.caches) {
      const done = this.finishedTransfers.get(req.transferId);
      bytes = encodeLocalizeReply({ status: 'gone', detail: `transfer ${req.transferId}: ${done ?? 'unknown transfer'}` });
    } else {
      const refuse = (code: 'forbidden' | 'busy', message: string) => {
        this.stats.localizeRefused++;
        this.lastError = message;
        this.sendEnvelope(identity, { kind: 'refuse', code, message });
      };
      const why = this.denied(st, req.leaseCapability, req.consumerKey ?? null);
      if (why !== null) return refuse('forbidden', `transfer ${req.transferId}: ${why}`);
      // Charged to the transfer (what its capability grants), not to a key the asker drew.
      const asker = `connection ${identity.toString('hex')}`;
      const over = this.localizeBudget.take(`transfer ${req.transferId}`, localizeQueryRanges(req.query), asker);
      if (over !== null) return refuse('busy', `transfer ${req.transferId}: ${over}`);
      let r;
      try {
        r = localizeOrderOnRank(this.caches, this.plans, { ticket: 0, requestId: st.spec.requestId, blocks: st.spec.blocks, numTokens: st.spec.numTokens, query: req.query }, readDeviceBytes);
      } finally {
        this.localizeBudget.done(asker);
      }
      bytes = encodeLocalizeReply({ status: 'held', groups: r.groups });
      this.stats.localizeAnswered++;
      if (st.holding) this.finishSend(st, `transfer ${req.transferId} was localized`);
    }
    this.sendEnvelope(identity, this.sessions!.seal(session, bytes)!);
  }

  private async onMetadata(answer: (r: TransferResponse) => void, msg: Uint8Array, peer: string): Promise<void> {
    this.stats.metadataReceived++;
    let md: TransferMetadata;
    try {
      md = decodeTransferMetadata(msg, this.opts.maxMessageBytes);
    } catch (e) {
      this.stats.metadataRejected++;
      this.lastError = e instanceof Error ? e.message : String(e);
      answer({ status: XferStatusCode.ERROR, okReqs: [], errReqs: [], errMsg: this.lastError, kvChecksums: new Map() });
      return;
    }
    const ids = [...md.requests.keys()];
    const allErr = (m: string) => {
      this.lastError = m;
      answer({ status: XferStatusCode.ERROR, okReqs: [], errReqs: ids, errMsg: m, kvChecksums: new Map() });
    };
    if (md.backend !== this.agent!.backend) return allErr(`the consumer uses transfer backend ${md.backend}, this producer ${this.agent!.backend}`);
    let agentName: string;
    try {
      agentName = await this.agent!.loadRemoteMetadata(md.agentMetadata);
    } catch (e) {
      return allErr(`cannot load the consumer's agent metadata: ${e instanceof Error ? e.message : String(e)}`);
    }
    if (ids.length === 0) {
      answer({ status: XferStatusCode.FINISH, okReqs: [], errReqs: [], kvChecksums: new Map() });
      return;
    }
    // Requests that would wait for their prefill: refused together, in one answer, over a cap.
    let parking = 0;
    for (const l of md.requests.values()) if (!this.sends.has(l.transferId) && !this.finishedTransfers.has(l.transferId)) parking++;
    const mine = this.peerWaiters.get(peer) ?? 0;
    if (parking > 0 && (this.waiterTotal + parking > this.opts.maxWaiters || mine + parking > this.opts.maxWaitersPerPeer)) {
      this.stats.waitersRefused += parking;
      return allErr(`${parking} requests refused: they would wait for their prefill and the producer already has ${this.waiterTotal} waiting (${mine} of this consumer; caps ${this.opts.maxWaiters} / ${this.opts.maxWaitersPerPeer} per consumer)`);
    }
    let left = ids.length;
    await Promise.all(
      ids.map(async (id) => {
        const r = await this.serve(md, agentName, md.requests.get(id)!, peer);
        left--;
        const status = !r.ok ? XferStatusCode.ERROR : left === 0 ? XferStatusCode.FINISH : XferStatusCode.CONTINUE;
        const kvChecksums = new Map<string, Uint8Array>();
        if (r.ok && r.payload) kvChecksums.set(id, r.payload);
        answer({ status, okReqs: r.ok ? [id] : [], errReqs: r.ok ? [] : [id], errMsg: r.ok ? undefined : r.error, ...(!r.ok && r.code ? { errCode: r.code } : {}), kvChecksums });
      }),
    );
  }

  /** Writes one request's blocks for one consumer worker. */
  private async serve(md: TransferMetadata, agentName: string, load: WireLoad, peer: string): Promise<{ ok: true; payload?: Uint8Array } | { ok: false; error: string; code?: 'forbidden' }> {
    const got = await this.waitForSend(load.transferId, peer);
    if (typeof got === 'string') {
      this.lastError = got;
      return { ok: false, error: got };
    }
    const st = got;
    // Only with the transfer's capability (or, without one, from the consumer key that bound it);
    // a refused request writes nothing and does not count as served. Binds an unbound transfer
    // without a capability to this key: the consumer it is served to, which may `loc` it later.
    const why = this.denied(st, load.leaseCapability, md.consumerKey ?? null);
    if (why !== null) {
      this.stats.metadataForbidden++;
      const error = `forbidden: transfer ${st.spec.transferId}: ${why}`;
      this.lastError = error;
      return { ok: false, error, code: 'forbidden' };
    }
    const consumerKey = `${md.engineId}\u0000${md.ppRank}:${md.tpRank}`;
    st.expected = md.tpSize * md.ppSize;
    st.inflight++;
    try {
      const plan = planWrites(
        { caches: this.caches!, regions: this.regions, blocks: st.spec.blocks, numTokens: st.spec.numTokens },
        { tpSize: md.tpSize, tpRank: md.tpRank, regions: md.regions, memory: md.memory, caches: md.caches },
        load,
      );
      if (plan.local.length > 0) {
        const agent = this.agent!;
        // The agent checks every descriptor against its registered regions (local) and those the
        // consumer's agent metadata advertised (remote) of that kind and device.
        const local = await agent.prepDescList(null, plan.localKind, plan.local);
        try {
          // A consumer advertising regions the agent refuses makes this throw: the local list is
          // released all the same (a peer must not be able to leak descriptor lists).
          const remote = await agent.prepDescList(agentName, plan.remoteKind, plan.remote);
          try {
            const req = await agent.makeTransfer({ op: 'WRITE', local, remote });
            try {
              const t0 = performance.now();
              let status = await agent.post(req);
              if (status === 'in-progress') status = await agent.wait(req);
              if (status === 'done') this.metrics.xferSeconds.observe({ op: 'WRITE' }, (performance.now() - t0) / 1000);
              if (status !== 'done') throw new Error(`WRITE to ${agentName} failed: ${status}${req.error ? `: ${req.error.message}` : ''}`);
            } finally {
              await agent.release(req).catch(() => {});
            }
          } finally {
            await agent.releaseDescList(remote).catch(() => {});
          }
        } finally {
          await agent.releaseDescList(local).catch(() => {});
        }
        this.stats.writes++;
        this.stats.bytesWritten += plan.bytes;
        this.stats.descriptors += plan.local.length;
        this.metrics.bytes.observe({ op: 'WRITE' }, plan.bytes);
        this.metrics.descriptors.observe({ op: 'WRITE' }, plan.local.length);
      }
      return { ok: true, payload: st.spec.kvChecksums };
    } catch (e) {
      this.metrics.failedTransfers.inc({ op: 'WRITE' });
      const error = e instanceof Error ? e.message : String(e);
      this.lastError = error;
      return { ok: false, error };
    } finally {
      st.inflight--;
      // Answered (ok or not): this consumer worker will not ask again.
      st.served.add(consumerKey);
      if (this.sends.get(st.spec.transferId) === st) {
        if (st.expected !== null && st.served.size >= st.expected) this.served(st);
        else if (st.expired && st.inflight === 0) {
          this.stats.leasesExpired++;
          this.finishSend(st, `the lease of transfer ${st.spec.transferId} expired`);
        }
      }
    }
  }

  // ------------------------------------------------------------------------------------------
  // Consumer

  private producerWorkers(engineId: string, bootstrapAddr: string): Promise<EngineWorkers> {
    const k = `${engineId}\u0000${bootstrapAddr}`;
    let p = this.producers.get(k);
    if (!p) {
      p = queryEngine(bootstrapAddr, engineId, { deadlineMs: this.opts.bootstrapTimeoutMs, secret: this.opts.clusterSecret });
      this.producers.set(k, p);
      p.catch(() => this.producers.delete(k));
    }
    return p;
  }

  /**
   * The DEALER to `addr`, created with a fixed random routing id (a reconnect keeps its session)
   * and a hello; its `ready` settles once the producer's welcome is checked.
   */
  private dealer(addr: string): Dealer {
    let d = this.dealers.get(addr);
    if (!d) {
      const sock = new zmq.Dealer({ linger: 0, maxMessageSize: this.opts.maxMessageBytes, routingId: randomBytes(16).toString('hex') });
      sock.connect(addr);
      let settle!: (err?: Error) => void;
      const ready = new Promise<void>((resolve, reject) => {
        settle = (err) => (err ? reject(err) : resolve());
      });
      ready.catch(() => {});
      const session = new ConsumerSession(this.opts.clusterSecret);
      const dd: Dealer = { sock, sender: new Sender(sock), session, ready, settle };
      d = dd;
      this.dealers.set(addr, dd);
      void this.dealerLoop(addr, dd);
      dd.sender.send(encodeEnvelope(session.hello())).catch((e) => this.dropDealer(addr, dd, `cannot send to ${addr}: ${e instanceof Error ? e.message : String(e)}`));
    }
    return d;
  }

  /** Forgets a DEALER whose session failed (the next load says hello again) and fails the loads waiting on it. */
  private dropDealer(addr: string, d: Dealer, why: string): void {
    this.stats.authRejected++;
    this.lastError = why;
    d.settle(new SideChannelAuthError('unauthenticated', why));
    if (this.dealers.get(addr) === d) this.dealers.delete(addr);
    d.sock.close();
    this.failAddr(addr, why, false, 'unauthenticated');
  }

  private async dealerLoop(addr: string, d: Dealer): Promise<void> {
    try {
      for await (const frames of d.sock) {
        let e: SideEnvelope;
        try {
          if (frames.length !== 1) throw new Error(`expected one frame, got ${frames.length}`);
          e = decodeEnvelope(frames[0], this.opts.maxMessageBytes);
        } catch (err) {
          this.stats.responsesReceived++;
          this.stats.responsesMalformed++;
          const m = `malformed message from ${addr}: ${err instanceof Error ? err.message : String(err)}`;
          if (err instanceof MooncakeIncompatibleError || !d.session.ready) this.dropDealer(addr, d, m);
          else this.failAddr(addr, m, false, 'malformed-response');
          continue;
        }
        try {
          if (e.kind === 'welcome') {
            d.session.welcome(e);
            d.settle();
          } else if (e.kind === 'resp') {
            this.onResponse(addr, [d.session.open(e)]);
          } else if (e.kind === 'refuse') {
            this.dropDealer(addr, d, `producer ${addr} refused (${e.code}): ${e.message ?? ''}`);
          } else {
            throw new SideChannelAuthError('bad-message', `a consumer expects welcome, resp or refuse, not ${e.kind}`);
          }
        } catch (err) {
          this.dropDealer(addr, d, `producer ${addr}: ${err instanceof Error ? err.message : String(err)}`);
        }
      }
    } catch (e) {
      if (!this.closed) this.log.warn({ addr, err: errText(e) }, 'dealer loop ended');
    }
  }

  private async sendLoads(specs: MooncakeLoadSpec[]): Promise<void> {
    const { remoteEngineId, bootstrapAddr } = specs[0];
    try {
      const workers = await this.producerWorkers(remoteEngineId, bootstrapAddr);
      const addrs = [...new Set(workers.workers.flat().filter((a): a is string => a !== undefined))];
      const live = specs.filter((s) => this.loads.has(s.requestId));
      if (live.length === 0 || this.closed) return;
      const requests = new Map<string, WireLoad>();
      for (const s of live) requests.set(s.requestId, { transferId: s.transferId, blocks: s.blocks, firstToken: s.firstToken, numTokens: s.numTokens, leaseCapability: s.leaseCapability });
      const bytes = encodeTransferMetadata({
        agentMetadata: this.agentMetadata!,
        backend: this.agent!.backend,
        engineId: this.ctx.engineId,
        tpSize: this.ctx.tpSize,
        tpRank: this.ctx.tpRank,
        ppSize: this.ctx.ppSize,
        ppRank: this.ctx.ppRank,
        regions: this.regions.map((r) => [r.addr, r.length] as [number, number]),
        memory: this.memory,
        caches: this.layout,
        requests,
        consumerKey: live[0].consumerKey,
      });
      for (const s of live) this.loads.get(s.requestId)!.waiting = new Set(addrs);
      for (const a of addrs) {
        const d = this.dealer(a);
        d.ready
          .then(() => d.sender.send(encodeEnvelope(d.session.seal(bytes))))
          // An auth failure: the producer never got the metadata (dropDealer already failed the loads).
          .catch((e) => this.failAddr(a, `cannot send to ${a}: ${e instanceof Error ? e.message : String(e)}`, !(e instanceof SideChannelAuthError), 'unreachable'));
      }
    } catch (e) {
      const m = e instanceof Error ? e.message : String(e);
      for (const s of specs) {
        const st = this.loads.get(s.requestId);
        if (st) this.fail(st, m, null, true, 'unreachable');
      }
    }
  }

  private onResponse(addr: string, frames: Uint8Array[]): void {
    this.stats.responsesReceived++;
    let r: TransferResponse;
    try {
      if (frames.length !== 1) throw new Error(`expected one frame, got ${frames.length}`);
      r = decodeTransferResponse(frames[0], this.opts.maxMessageBytes);
    } catch (e) {
      this.stats.responsesMalformed++;
      this.failAddr(addr, `malformed transfer response from ${addr}: ${e instanceof Error ? e.message : String(e)}`, false, 'malformed-response');
      return;
    }
    for (const id of r.okReqs) {
      const st = this.loads.get(id);
      if (!st || !st.waiting?.has(addr)) continue;
      const p = r.kvChecksums.get(id);
      if (p && !st.payload) st.payload = p; // every producer worker may carry it; keep the first
      st.waiting.delete(addr);
      this.maybeDone(st);
    }
    for (const id of r.errReqs) {
      const st = this.loads.get(id);
      if (st?.waiting?.has(addr)) this.fail(st, `producer ${addr}: ${r.errMsg ?? 'error'}`, addr, false, r.errCode ?? 'producer-error');
    }
    if (r.status === XferStatusCode.ERROR && r.okReqs.length === 0 && r.errReqs.length === 0) this.failAddr(addr, `producer ${addr}: ${r.errMsg ?? 'error'}`, false);
  }

  /** Fails every load waiting on `addr` (its answer is lost or unreadable). */
  private failAddr(addr: string, why: string, force: boolean, reason?: string): void {
    for (const st of [...this.loads.values()]) if (st.waiting?.has(addr)) this.fail(st, why, addr, force, reason);
  }

  /**
   * Marks a load failed. It is reported once every producer worker answered (`addr` just did),
   * so no producer is still writing into its blocks; `force` reports it now. `reason`: the
   * reported `LoadError` code (the first failure's counts).
   */
  private fail(st: LoadState, why: string, addr: string | null, force: boolean, reason = 'producer-error'): void {
    if (st.failed === null) st.failReason = reason;
    st.failed ??= why;
    this.lastError = why;
    if (addr !== null) st.waiting?.delete(addr);
    if (force) st.waiting = new Set();
    this.maybeDone(st);
  }

  private timeout(requestId: string): void {
    const st = this.loads.get(requestId);
    if (!st) return;
    // The producer may have restarted elsewhere: ask the bootstrap server again next time.
    this.producers.delete(`${st.spec.remoteEngineId}\u0000${st.spec.bootstrapAddr}`);
    this.fail(st, `load of ${requestId} timed out after ${this.opts.transferTimeoutMs} ms`, null, true, 'timeout');
  }

  private maybeDone(st: LoadState): void {
    if (st.waiting === null || st.waiting.size > 0) return;
    const id = st.spec.requestId;
    if (this.loads.get(id) !== st) return;
    this.loads.delete(id);
    clearTimeout(st.timer);
    if (st.failed !== null) {
      this.stats.loadsFailed++;
      this.log.debug({ requestId: id, err: st.failed }, 'load failed');
      this.loadErrors.set(id, { reason: st.failReason ?? 'producer-error', message: st.failed });
      for (const b of loadBlockIds(this.caches?.groupConfigs ?? [], st.spec.blocks, st.spec.firstToken, st.spec.numTokens)) this.invalid.add(b);
    } else {
      this.stats.loadsFinished++;
      if (st.payload) this.payloads.set(id, st.payload);
    }
    this.finishedRecving.add(id);
  }

  // ------------------------------------------------------------------------------------------

  /** What the producer's caps bound (diagnostics, flood tests): waiters (total, the most of one peer), pending metadata bytes, sessions. */
  resourceCounts(): { waiters: number; maxPeerWaiters: number; pendingBytes: number; maxPeerPendingBytes: number; sessions: number } {
    return {
      waiters: this.waiterTotal,
      maxPeerWaiters: Math.max(0, ...this.peerWaiters.values()),
      pendingBytes: this.pendingBytes,
      maxPeerPendingBytes: Math.max(0, ...this.peerPendingBytes.values()),
      sessions: this.sessions?.size ?? 0,
    };
  }

  /** Pending producer sends and consumer loads (diagnostics, leak tests). */
  pendingCounts(): { sends: number; waiters: number; loads: number } {
    let w = 0;
    for (const s of this.waiters.values()) w += s.size;
    return { sends: this.sends.size, waiters: w, loads: this.loads.size };
  }

  async shutdown(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const st of this.sends.values()) clearTimeout(st.timer);
    for (const st of this.loads.values()) clearTimeout(st.timer);
    for (const [t, ws] of this.waiters) for (const w of ws) w.resolve(`transfer ${t}: the producer is shutting down`);
    this.waiters.clear();
    this.router?.close();
    for (const d of this.dealers.values()) d.sock.close();
    this.dealers.clear();
    await this.agent?.close().catch(() => {});
  }
}

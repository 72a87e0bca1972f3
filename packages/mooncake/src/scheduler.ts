/**
 * The scheduler half of `MooncakeConnector` (vLLM `MooncakeConnectorScheduler`).
 *
 * Producer (`do_remote_decode` with a `transfer_id`): when the prefill finishes normally, the
 * request's blocks are kept (`delayFree`) and shipped to the workers in the next step's metadata
 * ({@link MooncakeSendSpec}), with the request's KV checksum payload when the checksum scheduler
 * handed one over through {@link MooncakeScheduler.sendKvChecksums} (SPEC 7, carrier
 * `connector`). A request that ends otherwise ships an abort, so a consumer waiting on it gets an
 * error response at once. No `kv_transfer_params` are returned: the proxy already sent the
 * consumer its params.
 *
 * Consumer (`do_remote_prefill` with a `transfer_id` and `remote_engine_id`): every prompt token
 * past the local prefix hit is loaded asynchronously; the load ({@link MooncakeLoadSpec}: blocks,
 * first token, producer engine and bootstrap address) reaches the workers in the next metadata.
 * The bootstrap address comes from the params (`remote_bootstrap_addr`), else the extra config's
 * `remote_bootstrap_addr`; never from process-global state (a producer engine in the same
 * process is found only the same ways: {@link MooncakeScheduler.bootstrapAddress} tells its
 * address to whoever configures the consumer). Params it cannot use (no
 * `transfer_id`, e.g. NIXL-shaped ones; no bootstrap address; a producer's params without
 * `do_remote_prefill`) are said in the returned params (`kv_transfer_params_error`, see
 * `@kvconnect/core`'s `UnusableParams`) and counted; the request prefills locally.
 *
 * The owner of the producer's bootstrap server is this half (one per engine); it listens from
 * construction, and the engine's workers register with it through the handshake hooks
 * ({@link MooncakeScheduler.setXferHandshakeMetadata}, in process or with workers in their own
 * processes), or with `bootstrap_addr` over HTTP.
 * @module
 */
import type {
  BlockIdsPerGroup,
  ConnectorRequest,
  FinishReason,
  HandshakeMetadataByWorker,
  KVChecksumCarrier,
  KVConnectorScheduler,
  KVTransferConfig,
  LocalizeAnswer,
  LocalizeQuery,
  MatchedTokens,
  RequestFinishedResult,
  SchedulerContext,
} from '@kvconnect/core';
import { UnusableParams, hasRemoteKeys } from '@kvconnect/core';
import { LEASE_CAPABILITY_CHARS, LEASE_CAPABILITY_PARAM, isLeaseCapability, newConsumerKey } from '@kvconnect/nixl-common';
import { checkBindHost } from '@kvconnect/transfer';
import { BootstrapServer, parseRegistration } from './bootstrap.js';
import type { MooncakeOptions } from './config.js';
import { localizeAtProducer } from './localize.js';

/** A producer request whose blocks the workers may now write to consumers. */
export interface MooncakeSendSpec {
  requestId: string;
  transferId: string;
  /** The request's block ids per group. */
  blocks: number[][];
  /** Tokens whose KV the producer computed. */
  numTokens: number;
  /** The SPEC 6 checksum payload, when checksums are on. */
  kvChecksums?: Uint8Array;
  /**
   * The transfer's lease capability (`kv_transfer_params.lease_capability`, drawn by the proxy;
   * `consumer-binding.ts`): the consumer's `md` and `loc` must carry it. Absent (the proxy gave
   * none, or a malformed one, which the consumer refuses as unusable params): the first consumer
   * key served binds the transfer.
   */
  leaseCapability?: string;
}

/** A consumer load the workers start. */
export interface MooncakeLoadSpec {
  requestId: string;
  transferId: string;
  remoteEngineId: string;
  /** The producer's bootstrap server (`host:port`). */
  bootstrapAddr: string;
  /** The request's block ids per group (all of them; the load covers tokens `[firstToken, numTokens)`). */
  blocks: number[][];
  firstToken: number;
  numTokens: number;
  /** The consumer engine's key (`@kvconnect/nixl-common` `consumer-binding.ts`): sent in the load's `md`. */
  consumerKey: string;
  /** The transfer's lease capability from the params (`lease_capability`), sent in the load's `md` and `loc`; null or absent: none. */
  leaseCapability?: string | null;
}

/** The connector's per-step metadata. */
export interface MooncakeConnectorMetadata {
  sends: MooncakeSendSpec[];
  loads: MooncakeLoadSpec[];
  /** Transfer ids of producer requests that ended without KV to send. */
  aborts: string[];
}

const isStr = (x: unknown): x is string => typeof x === 'string' && x.length > 0;

/** The scheduler half. */
export class MooncakeScheduler implements KVConnectorScheduler {
  private sends = new Map<string, MooncakeSendSpec>();
  private loads: MooncakeLoadSpec[] = [];
  private aborts: string[] = [];
  private readonly asked = new Map<string, { local: number; bootstrapAddr: string; remoteEngineId: string; transferId: string; leaseCapability: string | null }>();
  private readonly server: Promise<BootstrapServer> | null = null;
  /** Loads not started because no bootstrap address was known (the request prefilled locally). */
  noBootstrap = 0;
  /** Consumer requests whose params could not be used (said in their returned params). */
  private readonly unusable: UnusableParams;
  /** Consumer: this engine's key (`consumer-binding.ts`), in its loads' `md` and its `loc`. */
  readonly consumerKey = newConsumerKey();

  constructor(
    private readonly config: KVTransferConfig,
    private readonly ctx: SchedulerContext,
    private readonly opts: MooncakeOptions,
  ) {
    this.unusable = new UnusableParams(config.kv_connector, ctx.metricsRegistry);
    if (config.kv_role !== 'kv_consumer' && opts.bootstrapAddr === undefined) {
      checkBindHost(opts.bootstrapHost, opts.clusterSecret, 'Mooncake bootstrap server'); // a config error, thrown here rather than from the listen
      const p = BootstrapServer.start({ host: opts.bootstrapHost, port: opts.bootstrapPort, secret: opts.clusterSecret });
      this.server = p;
      p.catch(() => {}); // a listen failure is reported by setXferHandshakeMetadata (engine start) and bootstrapAddress
    }
  }

  /**
   * Registers the engine's workers (their {@link WorkerRegistration}s from `getHandshakeMetadata`,
   * checked by `parseRegistration`) with this half's bootstrap server; the way workers in their own
   * processes reach it. Without a server (consumer, or `bootstrap_addr`): nothing to do.
   * @throws BootstrapError for a malformed registration.
   */
  async setXferHandshakeMetadata(metadata: HandshakeMetadataByWorker<unknown>): Promise<void> {
    if (!this.server) return;
    const s = await this.server;
    for (const r of metadata.values()) s.register(parseRegistration(r));
  }

  /** The bootstrap server this half started (producer without `bootstrap_addr`), or null. */
  bootstrapServer(): Promise<BootstrapServer> | null {
    return this.server;
  }

  /**
   * `host:port` where this half's bootstrap server listens (with `bootstrap_port: 0`, the port it
   * got), or null without a server (consumer, or `bootstrap_addr`). What a proxy or a deployment
   * puts in a consumer's `remote_bootstrap_addr` (params or extra config); nothing else in the
   * process learns it.
   * @throws the listen error (e.g. EADDRINUSE) when the server could not start.
   */
  async bootstrapAddress(): Promise<string | null> {
    return this.server ? (await this.server).address : null;
  }

  /** The producer's bootstrap address: the params' `remote_bootstrap_addr`, else the config's (nothing else: no process-global registry). */
  private bootstrapFor(p: Record<string, unknown>): string | undefined {
    if (isStr(p.remote_bootstrap_addr)) return p.remote_bootstrap_addr;
    return this.opts.remoteBootstrapAddr;
  }

  getNumNewMatchedTokens(request: ConnectorRequest, numComputedTokens: number): MatchedTokens {
    const p = request.kvTransferParams;
    const consumer = this.config.kv_role !== 'kv_producer';
    if (consumer && p && p.do_remote_prefill !== true && p.do_remote_decode !== true && (hasRemoteKeys(p) || p.transfer_id !== undefined)) {
      this.unusable.reject(request.requestId, 'kv_transfer_params name a producer but lack do_remote_prefill: true; prefilled locally');
    }
    if (!p || p.do_remote_prefill !== true || !consumer) return { count: 0, loadAsync: false };
    if (!isStr(p.transfer_id) || !isStr(p.remote_engine_id)) {
      this.unusable.reject(request.requestId, `kv_transfer_params unusable by Mooncake (${isStr(p.transfer_id) ? 'remote_engine_id' : 'transfer_id'} missing: Mooncake pairs the two sides by a proxy-given transfer_id); prefilled locally`);
      return { count: 0, loadAsync: false };
    }
    const cap = p[LEASE_CAPABILITY_PARAM];
    if (cap !== undefined && cap !== null && !isLeaseCapability(cap)) {
      // Never echo the value: the reason goes to logs and the returned params.
      this.unusable.reject(request.requestId, `kv_transfer_params unusable by Mooncake (${LEASE_CAPABILITY_PARAM}: malformed, expected ${LEASE_CAPABILITY_CHARS} lowercase hex digits); prefilled locally`);
      return { count: 0, loadAsync: false };
    }
    const bootstrapAddr = this.bootstrapFor(p);
    if (bootstrapAddr === undefined) {
      this.noBootstrap++;
      this.unusable.reject(request.requestId, `no bootstrap address for producer ${p.remote_engine_id} (no remote_bootstrap_addr in the params or the config); prefilled locally`);
      return { count: 0, loadAsync: false };
    }
    const count = Math.max(0, request.promptTokenIds.length - numComputedTokens);
    if (count === 0) return { count: 0, loadAsync: false };
    this.asked.set(request.requestId, { local: numComputedTokens, bootstrapAddr, remoteEngineId: p.remote_engine_id, transferId: p.transfer_id, leaseCapability: typeof cap === 'string' ? cap : null });
    return { count, loadAsync: true };
  }

  updateStateAfterAlloc(request: ConnectorRequest, blocks: BlockIdsPerGroup, numExternalTokens: number): void {
    const a = this.asked.get(request.requestId);
    this.asked.delete(request.requestId);
    if (!a || numExternalTokens <= 0) return;
    this.loads.push({
      requestId: request.requestId,
      transferId: a.transferId,
      remoteEngineId: a.remoteEngineId,
      bootstrapAddr: a.bootstrapAddr,
      blocks: blocks.map((b) => b.slice()),
      firstToken: a.local,
      numTokens: a.local + numExternalTokens,
      consumerKey: this.consumerKey,
      ...(a.leaseCapability !== null ? { leaseCapability: a.leaseCapability } : {}),
    });
  }

  buildConnectorMeta(): MooncakeConnectorMetadata | null {
    if (this.sends.size === 0 && this.loads.length === 0 && this.aborts.length === 0) return null;
    const m: MooncakeConnectorMetadata = { sends: [...this.sends.values()], loads: this.loads, aborts: this.aborts };
    this.sends = new Map();
    this.loads = [];
    this.aborts = [];
    return m;
  }

  updateConnectorOutput(): void {}

  requestFinished(request: ConnectorRequest, blocks: BlockIdsPerGroup, reason: FinishReason): RequestFinishedResult {
    const id = request.requestId;
    this.asked.delete(id);
    this.loads = this.loads.filter((l) => l.requestId !== id);
    const rejected = this.unusable.take(id);
    if (rejected) return { delayFree: false, kvTransferParams: rejected };
    const p = request.kvTransferParams;
    if (!p || p.do_remote_decode !== true || !isStr(p.transfer_id) || this.config.kv_role === 'kv_consumer') return { delayFree: false };
    const hasBlocks = blocks.some((g) => g.length > 0);
    if ((reason !== 'stop' && reason !== 'length') || !hasBlocks) {
      this.aborts.push(p.transfer_id);
      return { delayFree: false };
    }
    const cap = p[LEASE_CAPABILITY_PARAM];
    this.sends.set(id, { requestId: id, transferId: p.transfer_id, blocks: blocks.map((b) => b.slice()), numTokens: Math.min(request.numComputedTokens, request.numTokens), ...(isLeaseCapability(cap) ? { leaseCapability: cap } : {}) });
    return { delayFree: true };
  }

  kvChecksumCarrier(request: ConnectorRequest): KVChecksumCarrier {
    const p = request.kvTransferParams;
    if (!p) return null;
    if (p.do_remote_prefill === true) return 'connector';
    if (p.do_remote_decode === true && isStr(p.transfer_id)) return 'connector';
    return null;
  }

  /**
   * Keeps the payload of a request whose blocks are about to be sent; it ships with them in the
   * next metadata. The payload of a request with nothing to send is dropped.
   */
  sendKvChecksums(request: ConnectorRequest, payload: Uint8Array): void {
    const s = this.sends.get(request.requestId);
    if (s) s.kvChecksums = payload.slice();
  }

  /**
   * Consumer: asks the producer of `request`'s load for fine sums of its blocks (a mismatched
   * load's drill-down, `docs/localize.md`): every producer worker over the side channel (`loc`,
   * protocol 4; `localize.ts`), found through the bootstrap server of the request's params (as the
   * load did). The producer still holds the blocks only with `localize_hold_ms`.
   * @throws Error when the params name no producer, or it cannot be reached, refuses or answers
   *   malformed within `timeoutMs`.
   */
  async localizeKvChecksums(request: ConnectorRequest, query: LocalizeQuery, timeoutMs: number): Promise<LocalizeAnswer> {
    const p = request.kvTransferParams ?? {};
    const bootstrapAddr = this.bootstrapFor(p);
    if (!isStr(p.transfer_id) || !isStr(p.remote_engine_id) || bootstrapAddr === undefined) throw new Error(`request ${request.requestId}: its kv_transfer_params name no Mooncake producer (transfer_id, remote_engine_id, bootstrap address)`);
    return localizeAtProducer(
      { bootstrapAddr, engineId: p.remote_engine_id, transferId: p.transfer_id, consumerKey: this.consumerKey, leaseCapability: isLeaseCapability(p[LEASE_CAPABILITY_PARAM]) ? p[LEASE_CAPABILITY_PARAM] : null, secret: this.opts.clusterSecret, maxMessageBytes: this.opts.maxMessageBytes, bootstrapTimeoutMs: this.opts.bootstrapTimeoutMs },
      query,
      timeoutMs,
    );
  }

  async shutdown(): Promise<void> {
    if (!this.server) return;
    const s = await this.server.catch(() => null);
    await s?.close();
  }
}

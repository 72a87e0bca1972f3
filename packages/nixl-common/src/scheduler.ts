/**
 * The scheduler half shared by NIXL pull and push (vLLM `NixlConnectorScheduler`):
 *
 * - producer (`kv_producer`, or `kv_both` for requests with `do_remote_decode`): when a request
 *   finishes normally, holds its blocks (`delayFree`) under a lease and returns
 *   `kv_transfer_params` in vLLM's NixlConnector shape (`request_finished` in vLLM's
 *   `vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py`): `{ do_remote_prefill: true,
 *   do_remote_decode: false, remote_engine_id, remote_request_id, remote_block_ids (per group),
 *   remote_host, remote_port (side channel), tp_size }`, plus kvconnect's `lease_expiry` (ms since
 *   epoch), `remote_tp_size` (= `tp_size`, read by kvconnect consumers before 0.2) and
 *   `lease_capability` (protocol 19: the request's unguessable capability, `consumer-binding.ts`,
 *   which every side-channel request about it must carry); forwarded verbatim to a consumer (as
 *   vLLM's toy proxy does), they load;
 * - consumer (`do_remote_prefill`): offers the prompt tokens past the local prefix hit as an
 *   async load, ships the load (only the tokens not hit locally) to the workers in the next
 *   step's metadata, heartbeats the producer's lease while the load is pending, and releases the
 *   producer's blocks when it will not read them (full local hit, abort).
 *
 * The halves talk only through the connector contract (packages/core/src/connector.ts), so the
 * scheduler half may run in the engine process and each worker half in a worker process:
 *
 * - handshake: every worker's {@link NixlHandshakeMetadata} (`getHandshakeMetadata`) reaches
 *   {@link NixlScheduler.setXferHandshakeMetadata}, which builds the engine's handshake info and
 *   (producer) starts the side channel (producer.ts: INFO, LEASE, RELEASE, PUSH_REG, the lease
 *   table). A consumer's loads carry the engine's compatibility hash to its workers.
 * - scheduler -> workers ({@link NixlMeta}): loads, finished push requests, push registrations,
 *   the producer's handshake info (push, once), and per worker the requests whose lease ended
 *   (released, expired, read by every consumer rank, or the worker's push writes done): the
 *   worker reports them in `finishedSending` (the engine frees blocks only then).
 * - workers -> scheduler ({@link NixlWorkerMeta}): read-done notifs (pull) and finished push
 *   writes, applied to the lease table in `updateConnectorOutput`.
 *
 * Consumer side, each worker holds its own side-channel clients and cached handshakes
 * (peers.ts, as vLLM's consumer workers handshake themselves): the handshake, the lease pin
 * before a READ and PUSH_REG run where the load runs, and a failed load forgets the handshake it
 * used there. This half's own clients send heartbeats and releases. Nothing blocks a hook.
 * @module
 */
import type {
  BlockIdsPerGroup,
  ConnectorRequest,
  FinishReason,
  KVChecksumCarrier,
  HandshakeMetadataByWorker,
  KVConnectorOutput,
  KVConnectorScheduler,
  KVTransferConfig,
  LocalizeAnswer,
  LocalizeQuery,
  MatchedTokens,
  RequestFinishedResult,
  SchedulerContext,
} from '@kvconnect/core';
import { LocalizeBusyError, UnusableParams, hasRemoteKeys, workerKey } from '@kvconnect/core';
import { parseNixlConfig, type NixlConfig } from './config.js';
import { LEASE_CAPABILITY_CHARS, LEASE_CAPABILITY_PARAM, isLeaseCapability, newConsumerKey } from './consumer-binding.js';
import { nixlMetrics, type NixlMetrics } from './metrics.js';
import { NixlPeers } from './peers.js';
import { SideChannelError } from './side-channel.js';
import { NixlProducerChannel, engineInfoOf, type LocalizeOrder, type LocalizeResult, type NixlHandshakeMetadata } from './producer.js';
import { LIMITS, type EngineInfo, type PushRegistration, type TransferMode } from './protocol.js';

/** The producer's params as the consumer reads them. */
export interface RemoteParams {
  remoteEngineId: string;
  remoteRequestId: string;
  remoteBlockIds: number[][];
  remoteHost: string;
  remotePort: number;
  remoteTpSize: number;
  leaseExpiry: number | null;
  /** `lease_capability` (protocol 19, `consumer-binding.ts`): sent with every side-channel request about the load; null when the params hold none. */
  leaseCapability: string | null;
}

/** One load a consumer worker runs. */
export interface LoadSpec extends RemoteParams {
  /** The consumer's request id. */
  requestId: string;
  /** The consumer's whole block table per group. */
  localBlocks: number[][];
  /** First loaded token (local prefix hit) and the load's numTokens. */
  firstToken: number;
  numTokens: number;
  /** The consumer engine's compatibility hash (the INFO request's; '' before the handshake metadata arrived). */
  compatHash: string;
  /** The consumer engine's key (`consumer-binding.ts`): sent with the load's `LEASE`, `PUSH_REG` and `RELEASE`. */
  consumerKey: string;
}

/** Push: a finished producer request whose blocks the workers write once the consumer registers. */
export interface PushSpec {
  requestId: string;
  blocks: number[][];
  /** Tokens the producer's blocks hold. */
  numTokens: number;
  /** Encoded checksum payload (SPEC 6) for the completion notif, or null. */
  checksums: Uint8Array | null;
}

/** Scheduler-to-worker metadata of a step (plain data: it crosses to worker processes). */
export interface NixlMeta {
  /** Consumer: loads to start. */
  loads: LoadSpec[];
  /** Push producer: finished requests whose blocks the workers write once consumers register. */
  pushes: PushSpec[];
  /** Push producer: consumer ranks' registrations (`PUSH_REG`) accepted since the previous step. */
  pushRegs?: PushRegistration[];
  /** Push producer: the engine's handshake info (every rank's layout, to plan WRITEs); sent once. */
  producer?: EngineInfo;
  /** Producer: per worker key (`workerKey`), the requests it reports in `finishedSending` now. */
  finished?: Record<string, string[]>;
  /** Producer: leases still held (the workers poll notifs fast while some are). */
  leasesHeld?: number;
  /** Producer: `LOCALIZE` orders (fine sums of held blocks, docs/localize.md) accepted since the previous step. */
  localize?: LocalizeOrder[];
}

/** Worker-to-scheduler metadata of a step ({@link TransferResults.workerMeta}, plain data). */
export interface NixlWorkerMeta {
  /** Pull producer: read-done notifs `[producerRequestId, consumer agent, consumer world]`. */
  readDone?: Array<[string, string, number]>;
  /** Push producer: requests this worker finished writing to every registered consumer rank. */
  pushDone?: string[];
  /** Producer: this worker's fine sums of the step's `LOCALIZE` orders. */
  localized?: LocalizeResult[];
}

const isStr = (x: unknown): x is string => typeof x === 'string' && x.length > 0 && x.length <= LIMITS.idLength;
const isInt = (x: unknown, min: number, max: number): x is number => typeof x === 'number' && Number.isSafeInteger(x) && x >= min && x <= max;

/**
 * The producer's params of a consumer request (`do_remote_prefill`), checked; null when any field
 * is missing or malformed (the request then prefills locally). See {@link checkRemoteParams}.
 */
export function parseRemoteParams(p: Record<string, unknown> | undefined): RemoteParams | null {
  const r = checkRemoteParams(p);
  return typeof r === 'string' ? null : r;
}

/**
 * The producer's params of a consumer request, checked. The TP size is vLLM's `tp_size` or
 * kvconnect's older `remote_tp_size`.
 * @returns the params, or why they cannot be used (names the first bad field).
 */
export function checkRemoteParams(p: Record<string, unknown> | undefined): RemoteParams | string {
  if (!p) return 'no kv_transfer_params';
  const ids = p.remote_block_ids;
  if (!Array.isArray(ids) || ids.length > LIMITS.groups) return `remote_block_ids: expected at most ${LIMITS.groups} arrays of block ids (one per KV cache group)`;
  for (const g of ids) if (!Array.isArray(g) || g.length > LIMITS.blocks || !g.every((b) => isInt(b, -1, Number.MAX_SAFE_INTEGER))) return `remote_block_ids: expected arrays of at most ${LIMITS.blocks} integer block ids`;
  const tp = p.tp_size ?? p.remote_tp_size;
  for (const [k, ok] of [
    ['remote_engine_id', isStr(p.remote_engine_id)],
    ['remote_request_id', isStr(p.remote_request_id)],
    ['remote_host', isStr(p.remote_host)],
    ['remote_port', isInt(p.remote_port, 1, 65535)],
    ['tp_size', isInt(tp, 1, LIMITS.ranks)],
  ] as const) {
    if (!ok) return `${k}: missing or malformed (${k === 'remote_port' ? 'an integer port' : k === 'tp_size' ? `tp_size or remote_tp_size, an integer in [1, ${LIMITS.ranks}]` : `a string of 1 to ${LIMITS.idLength} characters`})`;
  }
  const lease = p.lease_expiry;
  const cap = p[LEASE_CAPABILITY_PARAM];
  // Never echo the value: the reason goes to logs and the returned params.
  if (cap !== undefined && cap !== null && !isLeaseCapability(cap)) return `${LEASE_CAPABILITY_PARAM}: malformed (expected ${LEASE_CAPABILITY_CHARS} lowercase hex digits)`;
  return {
    remoteEngineId: p.remote_engine_id as string,
    remoteRequestId: p.remote_request_id as string,
    remoteBlockIds: (ids as number[][]).map((g) => g.slice()),
    remoteHost: p.remote_host as string,
    remotePort: p.remote_port as number,
    remoteTpSize: tp as number,
    leaseExpiry: typeof lease === 'number' && Number.isFinite(lease) ? lease : null,
    leaseCapability: typeof cap === 'string' ? cap : null,
  };
}

/** The shared scheduler half; pull and push set the mode and the carrier. */
export class NixlScheduler implements KVConnectorScheduler<NixlMeta, NixlWorkerMeta, NixlHandshakeMetadata> {
  readonly config: NixlConfig;
  readonly metrics: NixlMetrics;
  /** Producer: the side channel, leases and push registrations (null on a consumer). */
  readonly channel: NixlProducerChannel | null;
  /** This half's side-channel clients (consumer heartbeats and releases). */
  readonly peers: NixlPeers;
  /** This engine's handshake info once every worker's metadata arrived. */
  private info: EngineInfo | null = null;
  private sentProducerInfo = false;
  private readonly asked = new Map<string, { hit: number; remote: RemoteParams }>();
  private pendingLoads: LoadSpec[] = [];
  private pendingPushes = new Map<string, PushSpec>();
  /** Consumer loads in flight: request -> producer and the workers that finished. */
  private readonly loading = new Map<string, { remote: RemoteParams; workers: Set<string> }>();
  private timer: NodeJS.Timeout | null = null;
  private closed = false;
  /** Consumer requests whose params could not be used (said in their returned params). */
  private readonly unusable: UnusableParams;
  /** Consumer: this engine's key (`consumer-binding.ts`), in every request about its loads and in their `LoadSpec`s. */
  readonly consumerKey = newConsumerKey();

  constructor(
    readonly transferConfig: KVTransferConfig,
    readonly ctx: SchedulerContext,
    readonly mode: TransferMode,
  ) {
    this.config = parseNixlConfig(transferConfig);
    this.metrics = nixlMetrics(this.config.metricsRegistry ?? metricsRegistryOf(ctx) ?? undefined);
    this.peers = new NixlPeers({ mode, config: this.config, metrics: this.metrics });
    this.channel = this.isProducer ? new NixlProducerChannel({ engineId: ctx.engineId, mode, workers: ctx.tpSize * ctx.ppSize, config: this.config, metrics: this.metrics }) : null;
    this.unusable = new UnusableParams(transferConfig.kv_connector, ctx.metricsRegistry);
  }

  /**
   * Every worker's handshake metadata (vLLM `set_xfer_handshake_metadata`): builds the engine's
   * handshake info and, on a producer, starts the side channel that serves it.
   * @throws ClusterSecretError (rejected) for a non-loopback side channel without a secret.
   */
  async setXferHandshakeMetadata(metadata: HandshakeMetadataByWorker<NixlHandshakeMetadata>): Promise<void> {
    this.info = engineInfoOf({ engineId: this.ctx.engineId, mode: this.mode, tpSize: this.ctx.tpSize, ppSize: this.ctx.ppSize, groups: this.ctx.groupConfigs, workers: metadata.values(), salt: this.config.compatSalt });
    if (this.channel) {
      this.channel.info = this.info;
      await this.channel.listen();
    }
  }

  private get isConsumer(): boolean {
    return this.transferConfig.kv_role !== 'kv_producer';
  }

  private get isProducer(): boolean {
    return this.transferConfig.kv_role !== 'kv_consumer';
  }

  getNumNewMatchedTokens(request: ConnectorRequest, numComputedTokens: number): MatchedTokens {
    const p = request.kvTransferParams;
    if (this.isConsumer && p?.do_remote_prefill !== true && p?.do_remote_decode !== true && hasRemoteKeys(p)) {
      this.unusable.reject(request.requestId, 'kv_transfer_params name a producer (remote_engine_id / remote_block_ids) but lack do_remote_prefill: true; prefilled locally');
    }
    if (!this.isConsumer || p?.do_remote_prefill !== true) return { count: 0, loadAsync: false };
    const remote = checkRemoteParams(p);
    if (typeof remote === 'string') {
      this.unusable.reject(request.requestId, `kv_transfer_params unusable (${remote}); prefilled locally`);
      return { count: 0, loadAsync: false };
    }
    const count = Math.max(0, request.promptTokenIds.length - numComputedTokens);
    if (count === 0) {
      // Everything is local: the producer can free its blocks now.
      this.peers.release(remote.remoteHost, remote.remotePort, [remote.remoteRequestId], this.consumerKey, [remote.leaseCapability]);
      return { count: 0, loadAsync: false };
    }
    this.asked.set(request.requestId, { hit: numComputedTokens, remote });
    this.armHeartbeats();
    return { count, loadAsync: true };
  }

  updateStateAfterAlloc(request: ConnectorRequest, blocks: BlockIdsPerGroup, numExternalTokens: number): void {
    const a = this.asked.get(request.requestId);
    this.asked.delete(request.requestId);
    if (!a) return;
    if (numExternalTokens <= 0) {
      this.peers.release(a.remote.remoteHost, a.remote.remotePort, [a.remote.remoteRequestId], this.consumerKey, [a.remote.leaseCapability]);
      return;
    }
    this.pendingLoads.push({ ...a.remote, requestId: request.requestId, localBlocks: blocks.map((b) => b.slice()), firstToken: a.hit, numTokens: a.hit + numExternalTokens, compatHash: this.info?.compatHash ?? '', consumerKey: this.consumerKey });
    this.loading.set(request.requestId, { remote: a.remote, workers: new Set() });
  }

  buildConnectorMeta(): NixlMeta {
    const meta: NixlMeta = { loads: this.pendingLoads, pushes: [...this.pendingPushes.values()] };
    this.pendingLoads = [];
    this.pendingPushes = new Map();
    const ch = this.channel;
    if (ch) {
      const finished: Record<string, string[]> = {};
      for (let pp = 0; pp < this.ctx.ppSize; pp++) {
        for (let tp = 0; tp < this.ctx.tpSize; tp++) {
          const k = workerKey(pp, tp);
          const ids = ch.leases.take(k);
          if (ids.length > 0) finished[k] = ids;
        }
      }
      meta.finished = finished;
      meta.leasesHeld = ch.leases.size;
      const localize = ch.takeLocalizeOrders();
      if (localize.length > 0) meta.localize = localize;
      if (this.mode === 'push') {
        meta.pushRegs = ch.takePushRegs();
        if (!this.sentProducerInfo && ch.info) {
          meta.producer = ch.info;
          this.sentProducerInfo = true;
        }
      }
    }
    return meta;
  }

  updateConnectorOutput(outputs: readonly KVConnectorOutput<NixlWorkerMeta>[]): void {
    const world = this.ctx.tpSize * this.ctx.ppSize;
    for (const out of outputs) {
      const wm = out.kvConnectorWorkerMeta;
      if (wm && this.channel) {
        for (const [id, reader, size] of wm.readDone ?? []) if (!this.channel.leases.readerDone(id, reader, size)) this.metrics.failedNotifs.inc({ mode: this.mode });
        for (const id of wm.pushDone ?? []) this.channel.leases.workerDone(id, workerKey(out.ppRank, out.tpRank));
        for (const r of wm.localized ?? []) this.channel.onLocalized(workerKey(out.ppRank, out.tpRank), r);
      }
      for (const id of out.finishedRecving) {
        const l = this.loading.get(id);
        if (!l) continue;
        l.workers.add(`${out.ppRank}:${out.tpRank}`);
        if (l.workers.size >= world) this.loading.delete(id);
      }
    }
  }

  requestFinished(request: ConnectorRequest, blocks: BlockIdsPerGroup, reason: FinishReason): RequestFinishedResult {
    const id = request.requestId;
    const a = this.asked.get(id);
    if (a) {
      this.asked.delete(id);
      this.peers.release(a.remote.remoteHost, a.remote.remotePort, [a.remote.remoteRequestId], this.consumerKey, [a.remote.leaseCapability]);
    }
    this.loading.delete(id);
    const p = request.kvTransferParams;
    const rejected = this.unusable.take(id);
    if (rejected) return { delayFree: false, kvTransferParams: rejected };
    if (!this.isProducer || p?.do_remote_decode !== true || (reason !== 'stop' && reason !== 'length')) return { delayFree: false };
    const addr = this.channel?.address;
    if (!addr) return { delayFree: false };
    const leaseExpiry = this.channel!.leases.add(id);
    const copy = blocks.map((b) => b.slice());
    const capability = this.channel!.heldBlocks(id, copy, request.numComputedTokens);
    if (this.mode === 'push') this.pendingPushes.set(id, { requestId: id, blocks: copy, numTokens: request.numComputedTokens, checksums: null });
    return {
      delayFree: true,
      kvTransferParams: {
        do_remote_prefill: true,
        do_remote_decode: false,
        remote_engine_id: this.ctx.engineId,
        remote_request_id: id,
        remote_block_ids: copy,
        remote_host: addr.host,
        remote_port: addr.port,
        tp_size: this.ctx.tpSize,
        remote_tp_size: this.ctx.tpSize,
        lease_expiry: leaseExpiry,
        [LEASE_CAPABILITY_PARAM]: capability,
      },
    };
  }

  kvChecksumCarrier(request: ConnectorRequest): KVChecksumCarrier {
    const p = request.kvTransferParams;
    if (p?.do_remote_decode !== true && p?.do_remote_prefill !== true) return null;
    return this.mode === 'pull' ? 'kv_transfer_params' : 'connector';
  }

  /**
   * Push producer: keeps the checksums of a request about to be pushed; they ride to the workers
   * with its blocks in the next step's metadata. Checksums of a request with nothing to push are dropped.
   */
  sendKvChecksums(request: ConnectorRequest, payload: Uint8Array): void {
    const e = this.pendingPushes.get(request.requestId);
    if (e) e.checksums = payload.slice();
  }

  /**
   * Consumer: `LOCALIZE` to the producer of `request`'s load (docs/localize.md), then `RELEASE` of
   * its blocks (the consumer is done with them either way).
   * @throws Error when the request's params name no producer; SideChannelError when the producer
   *   refused or did not answer within `timeoutMs`.
   */
  async localizeKvChecksums(request: ConnectorRequest, query: LocalizeQuery, timeoutMs: number): Promise<LocalizeAnswer> {
    const remote = checkRemoteParams(request.kvTransferParams);
    if (typeof remote === 'string') throw new Error(`no producer to ask: ${remote}`);
    try {
      return await this.peers.localize(remote.remoteHost, remote.remotePort, remote.remoteRequestId, query, timeoutMs, this.consumerKey, remote.leaseCapability);
    } catch (e) {
      if (e instanceof SideChannelError && e.code === 'busy') throw new LocalizeBusyError(e.message, { cause: e });
      throw e;
    } finally {
      this.peers.release(remote.remoteHost, remote.remotePort, [remote.remoteRequestId], this.consumerKey, [remote.leaseCapability]);
    }
  }

  private armHeartbeats(): void {
    if (this.timer || this.closed || this.config.heartbeatMs <= 0) return;
    this.timer = setInterval(() => this.heartbeat(), this.config.heartbeatMs);
    this.timer.unref();
  }

  /** Sends one heartbeat per producer for the loads not yet done (also called by the timer). */
  heartbeat(): void {
    const by = new Map<string, { host: string; port: number; ids: string[]; caps: (string | null)[] }>();
    const add = (r: RemoteParams) => {
      const k = `${r.remoteHost}:${r.remotePort}`;
      let e = by.get(k);
      if (!e) by.set(k, (e = { host: r.remoteHost, port: r.remotePort, ids: [], caps: [] }));
      e.ids.push(r.remoteRequestId);
      e.caps.push(r.leaseCapability);
    };
    for (const a of this.asked.values()) add(a.remote);
    for (const l of this.loading.values()) add(l.remote);
    if (by.size === 0 && this.timer) {
      clearInterval(this.timer);
      this.timer = null;
      return;
    }
    for (const e of by.values()) this.peers.lease(e.host, e.port, e.ids, 0, undefined, this.consumerKey, e.caps).catch(() => {});
  }

  /** Requests with consumer-side state (asked or loading), for leak tests. */
  pendingCounts(): { asked: number; loading: number; pushes: number } {
    return { asked: this.asked.size, loading: this.loading.size, pushes: this.pendingPushes.size };
  }

  async shutdown(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.timer) clearInterval(this.timer);
    this.peers.close();
    await this.channel?.close();
  }
}

/** The engine's metrics registry from a connector context, when it offers one (`metricsRegistry`). */
export function metricsRegistryOf(ctx: object): NixlConfig['metricsRegistry'] {
  const r = (ctx as { metricsRegistry?: unknown }).metricsRegistry;
  return r && typeof (r as { getSingleMetric?: unknown }).getSingleMetric === 'function' ? (r as NixlConfig['metricsRegistry']) : null;
}

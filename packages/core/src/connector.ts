/**
 * The KV connector API (modelled on vLLM's KV connector v1): a scheduler half that runs in the
 * engine's scheduler, and a worker half that runs in each worker (one per TP rank and PP stage).
 * This file is the contract between host engines and connectors: who calls each hook, when,
 * whether it may block, and who frees blocks.
 *
 * The engine step, as every host engine runs it:
 *  1. Scheduler: `schedule()` admits requests. For a new request it calls
 *     {@link KVConnectorScheduler.getNumNewMatchedTokens}; after allocating blocks it calls
 *     {@link KVConnectorScheduler.updateStateAfterAlloc}. It then builds the step's
 *     {@link SchedulerOutput}, including {@link KVConnectorScheduler.buildConnectorMeta} and the KV
 *     checksum scheduler's `buildStepMeta()`.
 *  2. Workers (each TP rank of each PP stage, stages in order): `bindConnectorMetadata`,
 *     `startLoadKv` (non-blocking: starts async loads), the forward pass (calling
 *     `waitForLayerLoad` before a layer reads KV and `saveKvLayer` after it writes KV), `waitForSave`,
 *     then `getTransferResults` and `clearConnectorMetadata`. Worker hooks never wait on the network
 *     inside a step: transfers complete asynchronously and are reported by a later
 *     `getTransferResults`.
 *  3. Scheduler: `updateFromOutput` with every worker's {@link KVConnectorOutput};
 *     {@link KVConnectorScheduler.updateConnectorOutput}; finished requests go through
 *     {@link KVConnectorScheduler.requestFinished}.
 *
 * Processes: the scheduler half runs in the engine (scheduler) process and every worker half in its
 * worker's process (one per TP rank x PP stage, as in production). The halves exchange only what this
 * contract carries, and all of it is plain data ({@link PlainData}): the scheduler half's
 * {@link KVConnectorScheduler.buildConnectorMeta} reaches every worker's
 * {@link KVConnectorWorker.bindConnectorMetadata}; a worker's {@link TransferResults.workerMeta}
 * reaches the scheduler half in {@link KVConnectorOutput.kvConnectorWorkerMeta}; and once, at start,
 * each worker's {@link KVConnectorWorker.getHandshakeMetadata} reaches the scheduler half's
 * {@link KVConnectorScheduler.setXferHandshakeMetadata} (vLLM `get_handshake_metadata` /
 * `set_xfer_handshake_metadata`). Nothing may work only because two halves share a process: no
 * process-global registries, hubs or shared objects between halves.
 *
 * Blocks: the engine's KV cache manager owns every block. A connector never frees a block; when
 * `requestFinished` returns `delayFree: true` the engine keeps the request's blocks until a worker
 * reports the request in `finishedSending` (the consumer read them, or the lease expired).
 * @module
 */
import type { LocalizeAnswer, LocalizeQuery } from './checksum-localize.js';
import { isDeviceRegion, type GroupSpec, type KVMemoryRegion, type RankContext } from '@kvconnect/checksum';
import type { Registry } from 'prom-client';
import type { Logger } from 'pino';

/** The role of an engine in P/D (vLLM `kv_role`). */
export type KVRole = 'kv_producer' | 'kv_consumer' | 'kv_both';

/**
 * `kv_transfer_params` of a request: the connector-specific JSON object that travels with a
 * request through the proxy (vLLM's field). Well-known keys:
 * - `do_remote_decode` (producer side: keep the KV for a remote decoder);
 * - `do_remote_prefill` (consumer side: load the KV from the producer);
 * - `kv_checksums` (NIXL pull carrier: standard base64 of the checksum payload, SPEC 7).
 */
export type KVTransferParams = Record<string, unknown>;

/** Block ids of a request per KV cache group: `blocks[g][i]` = block at position `i` of group `g`. */
export type BlockIdsPerGroup = number[][];

/** What connectors and the checksum scheduler see of a request. */
export interface ConnectorRequest {
  readonly requestId: string;
  readonly promptTokenIds: readonly number[];
  /** Tokens whose KV is computed or loaded so far. */
  readonly numComputedTokens: number;
  /** Prompt plus generated tokens so far. */
  readonly numTokens: number;
  readonly kvTransferParams?: KVTransferParams;
}

/** A KV cache group as the engine's KV cache manager defines it (same order on every side). */
export interface KVCacheGroupConfig {
  /** Group index (SPEC: groupId). */
  groupId: number;
  /** Attention groups are token based; state groups hold one running-state block per request. */
  kind: 'full-attention' | 'sliding-window' | 'state';
  /** Tokens per block (state groups: the engine's block size for bookkeeping). */
  blockSize: number;
  /** The layer names of the group (model-wide, all PP stages). */
  layerNames: string[];
  /** Sliding window in tokens (sliding-window groups). */
  slidingWindow?: number;
}

/** How KV checksums travel for a request (SPEC 7). */
export type KVChecksumCarrier = 'kv_transfer_params' | 'connector' | null;

/** A carrier a connector can use (SPEC 7): {@link KVChecksumCarrier} without `null`. */
export type KVChecksumCarrierKind = Exclude<KVChecksumCarrier, null>;

/** Result of {@link KVConnectorScheduler.getNumNewMatchedTokens}. */
export interface MatchedTokens {
  /** Tokens beyond `numComputedTokens` the connector can provide; null = not known yet (ask again next step). */
  count: number | null;
  /** True when the tokens arrive asynchronously (the request waits for them, `WAITING_FOR_REMOTE_KVS`). */
  loadAsync: boolean;
}

/** Result of {@link KVConnectorScheduler.requestFinished}. */
export interface RequestFinishedResult {
  /** Keep the request's blocks until a worker reports it in `finishedSending`. */
  delayFree: boolean;
  /** `kv_transfer_params` to return to the client/proxy (producer side). */
  kvTransferParams?: KVTransferParams;
}

/** A step's scheduler output as workers see it (fields connectors need). */
export interface SchedulerOutput {
  readonly stepId: number;
  /** Tokens scheduled per request in this step. */
  readonly numScheduledTokens: ReadonlyMap<string, number>;
  /** Requests finished since the previous step (their blocks may be freed soon). */
  readonly finishedRequestIds: ReadonlySet<string>;
  /** The connector's metadata for this step ({@link KVConnectorScheduler.buildConnectorMeta}). */
  readonly kvConnectorMetadata: KVConnectorMetadata | null;
  /** The KV checksum scheduler's metadata for this step (opaque to connectors). */
  readonly kvChecksumMetadata: unknown;
}

/** Scheduler-to-worker metadata of one connector (connector-defined plain data). */
export type KVConnectorMetadata = unknown;

/**
 * What may cross between a connector's halves (and between the engine's processes): values a
 * structured-clone serializer carries (msgpackr with `structuredClone`, `node:v8` serialize):
 * `null`, booleans, numbers, bigints, strings, `Uint8Array` (and other typed arrays), arrays, plain
 * objects, `Map` and `Set` of these. No functions, class instances with behaviour, or shared objects.
 * This type documents the rule; engines enforce it by serializing what crosses.
 */
export type PlainData = unknown;

/** A worker's handshake metadata, keyed by worker: `"${ppRank}:${tpRank}"` (see {@link workerKey}). */
export type HandshakeMetadataByWorker<H> = ReadonlyMap<string, H>;

/** The key of a worker in {@link HandshakeMetadataByWorker}: `"${ppRank}:${tpRank}"`. */
export function workerKey(ppRank: number, tpRank: number): string {
  return `${ppRank}:${tpRank}`;
}

/**
 * What one worker reports after a step (vLLM `KVConnectorOutput`). Plain data: it crosses from the
 * worker process to the engine process. `W` is the connector's worker-to-scheduler metadata.
 */
export interface KVConnectorOutput<W = unknown> {
  ppRank: number;
  tpRank: number;
  /** Requests whose KV this worker finished sending (the producer may free their blocks). */
  finishedSending: Set<string>;
  /** Requests whose KV this worker finished loading. */
  finishedRecving: Set<string>;
  /** Blocks whose load failed (the scheduler applies the load failure policy to their requests). */
  invalidBlockIds: Set<number>;
  /** Checksum payloads a connector carried (SPEC 7, `connector` carrier), by request id. */
  kvChecksums: Map<string, Uint8Array>;
  /** Why loads failed, by request id ({@link TransferResults.loadErrors}). */
  loadErrors?: Map<string, LoadError>;
  /** The KV checksum worker's report for this step (opaque here; see checksum-worker). */
  kvChecksumReport?: unknown;
  /** The connector's worker-to-scheduler metadata of this step ({@link TransferResults.workerMeta}). */
  kvConnectorWorkerMeta?: W;
}

/** A worker's registered KV caches, as views over its memory (@kvconnect/checksum). */
export interface WorkerKVCaches {
  readonly rank: Omit<RankContext, 'role'>;
  readonly ppRank: number;
  readonly ppSize: number;
  /**
   * The memory regions the views index: host memory (`Uint8Array`, bytes in the worker's process)
   * or device memory (`DeviceMemoryRegion` of @kvconnect/checksum: CUDA device, address, bytes, IPC
   * handle). A worker's regions are all host or all device. A connector that moves only host
   * memory calls {@link hostRegions} and so refuses device regions with a clear error.
   */
  readonly regions: readonly KVMemoryRegion[];
  /**
   * Device regions: the engine's CUDA stream (`cudaStream_t` as a bigint) whose work writes the KV;
   * device work that reads it (the KV checksum worker's one submit per step) is enqueued on it.
   * Absent or 0n: the legacy default stream.
   */
  readonly stream?: bigint;
  /** This worker's caches per group, in group order (a PP stage without a group's layers: empty). */
  readonly groups: readonly GroupSpec[];
  /** Group configs, same order. */
  readonly groupConfigs: readonly KVCacheGroupConfig[];
}

/**
 * Why one load failed in transit, as a connector's worker saw it: the engine reports it (verdict
 * `transfer-failed`, logs, metrics) and applies `kv_load_failure_policy`, never as a checksum
 * mismatch.
 */
export interface LoadError {
  /** A short stable code for metrics and logs (connector-defined, e.g. `timeout`, `unreachable`, `producer-error`, `lease-expired`). */
  reason: string;
  /** A human description of the cause (peer, status, error text). */
  message: string;
}

/** A worker's KV caches whose regions are host memory (what {@link hostRegions} checked). */
export type HostWorkerKVCaches = Omit<WorkerKVCaches, 'regions'> & { readonly regions: readonly Uint8Array[] };

/**
 * Raised by a connector (or the code it calls) that moves only host memory when a worker's KV
 * regions are device memory.
 */
export class DeviceMemoryUnsupportedError extends TypeError {
  constructor(readonly who: string, readonly regionIndex: number) {
    super(`${who} moves host memory only, but KV region ${regionIndex} of this worker is device memory (CUDA); device KV needs a device-capable transfer agent`);
    this.name = 'DeviceMemoryUnsupportedError';
  }
}

/**
 * `caches`, checked to hold host regions only, for connectors that read and write KV bytes in the
 * worker's process. @throws DeviceMemoryUnsupportedError naming `who` and the first device region.
 */
export function hostRegions(caches: WorkerKVCaches, who: string): HostWorkerKVCaches {
  const i = caches.regions.findIndex((r) => isDeviceRegion(r));
  if (i >= 0) throw new DeviceMemoryUnsupportedError(who, i);
  return caches as HostWorkerKVCaches;
}

/** Transfer results since the previous call ({@link KVConnectorWorker.getTransferResults}). */
export interface TransferResults<W = unknown> {
  finishedSending: Set<string>;
  finishedRecving: Set<string>;
  invalidBlockIds: Set<number>;
  kvChecksums: Map<string, Uint8Array>;
  /**
   * Optional: why the loads reported failed in this result failed, by request id (the request is
   * also in `finishedRecving` and its loaded blocks in `invalidBlockIds`). A failed load without an
   * entry is reported with reason `invalid-blocks`.
   */
  loadErrors?: Map<string, LoadError>;
  /**
   * Connector-defined plain data for the scheduler half (e.g. leases a worker saw released, transfer
   * statistics); the engine passes it on in {@link KVConnectorOutput.kvConnectorWorkerMeta}.
   */
  workerMeta?: W;
}

/**
 * The scheduler half of a connector. Runs on the engine's scheduler; its hooks must not block
 * (no waiting on the network; return what is known now).
 */
export interface KVConnectorScheduler<S = KVConnectorMetadata, W = unknown, H = unknown> {
  /**
   * Called by `schedule()` for a waiting request. Returns how many tokens past
   * `numComputedTokens` (the local prefix-cache hit) the connector can load.
   */
  getNumNewMatchedTokens(request: ConnectorRequest, numComputedTokens: number): MatchedTokens;
  /**
   * Called once at start, before the first step, with every worker's
   * {@link KVConnectorWorker.getHandshakeMetadata} (workers that returned null are left out), keyed
   * by {@link workerKey} (vLLM `set_xfer_handshake_metadata`). A connector that serves a side channel
   * from the scheduler process (e.g. NIXL's handshake) starts it here. The engine awaits it.
   */
  setXferHandshakeMetadata?(metadata: HandshakeMetadataByWorker<H>): void | Promise<void>;
  /** Called after the engine allocated the request's blocks (all groups), with the external token count. */
  updateStateAfterAlloc(request: ConnectorRequest, blocks: BlockIdsPerGroup, numExternalTokens: number): void;
  /** Called once per step after scheduling; the result reaches every worker's `bindConnectorMetadata`. */
  buildConnectorMeta(output: Omit<SchedulerOutput, 'kvConnectorMetadata' | 'kvChecksumMetadata'>): S;
  /** Called with every worker's output of a step, after `updateFromOutput` collected them. */
  updateConnectorOutput(outputs: readonly KVConnectorOutput<W>[]): void;
  /** Called when a request finishes (stopped, length, aborted, error), before its blocks are freed. */
  requestFinished(request: ConnectorRequest, blocks: BlockIdsPerGroup, reason: FinishReason): RequestFinishedResult;
  /** Where this connector carries KV checksums for `request` (SPEC 7); null: it cannot. */
  kvChecksumCarrier(request: ConnectorRequest): KVChecksumCarrier;
  /**
   * Producer, `connector` carrier: the encoded checksum payload of a finished request whose KV is
   * about to be sent. Called after `requestFinished`. The connector moves the bytes with the KV.
   */
  sendKvChecksums?(request: ConnectorRequest, payload: Uint8Array): void;
  /**
   * Consumer: asks the producer of `request`'s load for fine sums of its blocks (issue #13
   * localization, `docs/localize.md`; checksum-localize.ts) while it still holds them. Resolves with
   * the producer's answer, `gone` when it no longer holds them; rejects when it refused or could not
   * be reached within `timeoutMs`. Never called on a verified load. Absent: the connector cannot.
   */
  localizeKvChecksums?(request: ConnectorRequest, query: LocalizeQuery, timeoutMs: number): Promise<LocalizeAnswer>;
  /** Releases resources (sockets, timers). */
  shutdown?(): Promise<void> | void;
}

/** Why a request finished. */
export type FinishReason = 'stop' | 'length' | 'abort' | 'error';

/** The worker half of a connector: one instance per worker (TP rank x PP stage), in the worker's process. */
export interface KVConnectorWorker<S = KVConnectorMetadata, W = unknown, H = unknown> {
  /** Called once at start with the worker's caches (memory and views). */
  registerKvCaches(caches: WorkerKVCaches): void | Promise<void>;
  /**
   * Called once after {@link registerKvCaches}: this worker's transfer metadata for the scheduler
   * half (vLLM `get_handshake_metadata`), plain data, or null for none.
   */
  getHandshakeMetadata?(): H | null;
  /** Called at the start of each step with the connector's metadata. */
  bindConnectorMetadata(meta: S): void;
  /** Starts this step's loads; must not wait for them. */
  startLoadKv(output: SchedulerOutput): void;
  /** Called before layer `layerName` reads KV in the forward pass (layer-wise loading). */
  waitForLayerLoad?(layerName: string): void;
  /** Called after layer `layerName` wrote this step's KV (layer-wise saving). */
  saveKvLayer?(layerName: string): void;
  /** Called after the forward pass. */
  waitForSave?(): void;
  /** Transfers that completed since the previous call; never waits. */
  getTransferResults(): TransferResults<W>;
  /** Called at the end of each step. */
  clearConnectorMetadata(): void;
  /** Releases resources. */
  shutdown?(): Promise<void> | void;
}

/**
 * A connector: its two halves, created by a registered factory. Generic over the connector's
 * scheduler-to-worker metadata `S`, worker-to-scheduler metadata `W` and handshake metadata `H`
 * (all plain data), so neither half casts `unknown`.
 */
export interface KVConnectorFactory<S = any, W = any, H = any> {
  /** The registered name (`kv_connector`). */
  readonly name: string;
  createScheduler(config: KVTransferConfig, ctx: SchedulerContext): KVConnectorScheduler<S, W, H>;
  createWorker(config: KVTransferConfig, ctx: WorkerContext): KVConnectorWorker<S, W, H>;
  /**
   * The KV checksum carriers (SPEC 7) the connector built from `config` uses for some requests
   * (its scheduler's `kvChecksumCarrier` returns only these, or null); `[]` = it carries no KV
   * checksums. A function of the config because wrapping connectors (MultiConnector, the fault
   * injector) answer for the children their config names. The engine passes the answer to the
   * KV checksum scheduler (`KVChecksumSchedulerOptions.carriers`), which decides from it whether
   * checksums can run at all.
   *
   * Optional for third-party factories: absent, or `undefined` returned (e.g. a wrapper whose
   * child does not declare), the checksum scheduler falls back to asking `kvChecksumCarrier` about
   * three probe requests.
   */
  kvChecksumCarriers?(config: KVTransferConfig): readonly KVChecksumCarrierKind[] | undefined;
}

/** What a connector's scheduler half knows about its engine. */
export interface SchedulerContext {
  engineId: string;
  tpSize: number;
  ppSize: number;
  groupConfigs: readonly KVCacheGroupConfig[];
  /** The engine's Prometheus registry: connectors register their metrics here (served on /metrics). */
  metricsRegistry?: Registry;
  /** The engine's logger (pino; its lines carry the engine and role): connectors log with a child of it. */
  logger?: Logger;
}

/** What a connector's worker half knows about its engine. */
export interface WorkerContext {
  engineId: string;
  tpRank: number;
  tpSize: number;
  ppRank: number;
  ppSize: number;
  /** The engine's Prometheus registry (as {@link SchedulerContext.metricsRegistry}). */
  metricsRegistry?: Registry;
  /** The engine's logger for this worker (its lines carry the engine, role, PP stage and TP rank). */
  logger?: Logger;
}

/** The KV transfer config (vLLM `kv_transfer_config`), validated by `parseKVTransferConfig`. */
export interface KVTransferConfig {
  kv_connector: string;
  kv_role: KVRole;
  /** Default false. */
  enable_kv_checksum: boolean;
  /** Default false (fail-open: log and use the KV). */
  kv_checksum_fail_closed: boolean;
  /** Sampled checking, in (0, 1]; absent = 1, every block (docs/checksum-extensions.md section 2). */
  kv_checksum_sample_rate?: number;
  /** Default 'recompute'. */
  kv_load_failure_policy: 'fail' | 'recompute';
  /** Connector-specific options. */
  kv_connector_extra_config: Record<string, unknown>;
  /** A module to import that registers `kv_connector` (third-party connectors). */
  kv_connector_module_path?: string;
  /** vLLM's `engine_id`: the engine's id when the engine is given none of its own. */
  engine_id?: string;
  /** vLLM keys without a meaning here, accepted and ignored (`IGNORED_VLLM_KEYS` in config.ts). */
  kv_buffer_device?: string;
  kv_buffer_size?: number;
  kv_rank?: number | null;
  kv_parallel_size?: number;
  kv_ip?: string;
  kv_port?: number;
  enable_permute_local_kv?: boolean;
}

/**
 * The KV checksum scheduler (ARCHITECTURE steps 2, 4, 6 and 8; SPEC 6-8; upstream
 * `KVChecksumScheduler`, seed commits "Scheduling and verification", "NIXL push", "Mooncake").
 * Runs in the engine's scheduler and works with any connector through its checksum carrier.
 *
 * Producer: records a send entry when a request's prompt completes, adds the TP x PP workers'
 * replica-0 sums, and on a normal finish builds the payload (version 2, SPEC 6.1: with the digest of
 * the request's first `numTokens` prompt token ids) and hands it to the carrier
 * (`kv_transfer_params.kv_checksums`, or the connector's `sendKvChecksums`).
 *
 * Consumer: records a receive entry of only the loaded blocks, takes the payload (version 1 or 2)
 * from the request's params or the first connector-carried copy, and when the load finishes
 * verifies it against the loaded blocks and the request's prompt tokens (SPEC 8, identity first:
 * 8.0) and applies fail-open / fail-closed and the load failure policy. Verdict logs carry
 * `identity: checked | unchecked | none`; a load checked against a version-1 payload counts in
 * `kvconnect_kv_checksum_identity_unchecked_total`, another request's KV in
 * `kvconnect_kv_checksum_wrong_request_total`. A load whose transfer failed (a worker's
 * `loadErrors` entry, or invalid blocks) is not verified: outcome `transfer-failed` with its cause,
 * `kv_load_failure_policy`, never a checksum mismatch.
 *
 * Nothing here blocks; per-request state is dropped when a request finishes, aborts or its load
 * is verified.
 *
 * Choices where the contracts are silent (each fail-safe):
 * - `blocks[k]` of the hooks is the block list of `groupConfigs[k]`; a negative block id is a null
 *   block (freed, e.g. out of a sliding window): leading null blocks are not summed, and a group
 *   with a null block after a real one is left out of the entry (the consumer then reports
 *   `covered-one-side`, never a false mismatch);
 * - the connector's `kvChecksumCarrier(request)` takes no direction, so send entries are recorded
 *   only on `kv_producer` engines, or on `kv_both` engines for requests whose params say
 *   `do_remote_decode`; receive entries only on `kv_consumer` / `kv_both` engines;
 * - "no carrier at all" at start is decided from the factory's declared carriers
 *   (`KVConnectorFactory.kvChecksumCarriers`, passed as `carriers`: empty = no carrier); only
 *   without a declaration (a third-party factory) by asking the connector about three probe
 *   requests (params `{do_remote_decode: true}`, `{do_remote_prefill: true}`, none): all null = no carrier.
 * @module
 */
import {
  BlockSampler,
  SAMPLE_THRESHOLD_ALL,
  sampleThreshold,
  decodePayload,
  decodePayloadBase64,
  encodePayload,
  parseReplicaKey,
  tokenDigest,
  verdictSummary,
  verifyLoad,
  PayloadError,
  PAYLOAD_VERSION_EXTENSIONS,
  type ChecksumPayload,
  type ConsumerGroup,
  type ConsumerLoad,
  type GroupKind,
  type PayloadGroup,
  type SubBlockValues,
  type Verdict,
  type WorkerRecord,
} from '@kvconnect/checksum';
import { resolveClusterSecret } from '@kvconnect/transfer';
import type { KVChecksumSchedulerHooks, LoadDecision } from './checksum-hooks.js';
import type {
  BlockIdsPerGroup,
  ConnectorRequest,
  FinishReason,
  KVCacheGroupConfig,
  KVChecksumCarrier,
  KVChecksumCarrierKind,
  KVConnectorOutput,
  KVConnectorScheduler,
  KVRole,
  KVTransferConfig,
  KVTransferParams,
  LoadError,
  RequestFinishedResult,
} from './connector.js';
import { decodeReport, isReport, REPORT_JSON_FORMAT, type ChecksumStepMeta, type KVChecksumReport, type ReportEntry, type ReportGroup, type StepEntry, type StepGroupEntry } from './checksum-report.js';
import { ChecksumLocalizer, type LocalizeOptions } from './checksum-localize.js';
import { KVChecksumObservability, type LoadEvent, type NotSentReason } from './observability.js';
import { subBlockSizeFits } from './checksum-block-sizes.js';

/** The `kv_transfer_params` key of the NIXL pull carrier (SPEC 7): standard base64 of the payload. */
export const KV_CHECKSUMS_PARAM = 'kv_checksums';

/** Raised at start under fail-closed when the connector cannot carry checksums (no load could be verified). */
export class KVChecksumCarrierError extends Error {
  constructor(readonly connectorName: string) {
    super(`KV connector ${JSON.stringify(connectorName)} does not carry KV checksums, so no load could be verified (kv_checksum_fail_closed is set)`);
    this.name = 'KVChecksumCarrierError';
  }
}

/**
 * The `kv_transfer_params` key that tells a producer the consumer's block sizes (docs/checksum-extensions.md
 * section 1): an object group id (decimal text) -> the consumer's block size in tokens. For each
 * attention group whose producer block size is a larger multiple of it, the producer also sends
 * sub-block values at that size, so a consumer prefix hit inside a producer block is verified.
 */
export const KV_CHECKSUM_BLOCK_SIZES_PARAM = 'kv_checksum_block_sizes';

/** Raised at start when `kv_checksum_sample_rate` < 1 and no cluster secret is configured (the sample would be predictable). */
export class KVChecksumSampleError extends Error {
  constructor() {
    super('kv_checksum_sample_rate below 1 needs the cluster secret (kv_connector_extra_config.cluster_secret or KVCONNECT_CLUSTER_SECRET): without it a peer could predict the unchecked blocks');
    this.name = 'KVChecksumSampleError';
  }
}

/** Options of a {@link KVChecksumScheduler}. */
export interface KVChecksumSchedulerOptions {
  config: KVTransferConfig;
  /** The connector's scheduler half (its carrier and `sendKvChecksums`). */
  connector: KVConnectorScheduler;
  /** The engine's role; default `config.kv_role`. */
  role?: KVRole;
  tpSize: number;
  ppSize: number;
  /** The engine's KV cache groups, in the order of the hooks' `blocks` lists. */
  groupConfigs: readonly KVCacheGroupConfig[];
  /** Default: a new one with an `info` logger and its own registry. */
  observability?: KVChecksumObservability;
  /**
   * The carriers the connector's factory declares (`KVConnectorFactory.kvChecksumCarriers(config)`);
   * empty = the connector carries no KV checksums. Absent: unknown, decided by probing the
   * connector's `kvChecksumCarrier` (third-party factories without a declaration).
   */
  carriers?: readonly KVChecksumCarrierKind[];
  /**
   * How long a worker's sums announced in flight (device backends) may take before the request
   * goes on without them (load `unverified` / payload not sent, `workers-missing`), in ms.
   * Default 10000.
   */
  inFlightTimeoutMs?: number;
  /** Consumer: drill-downs of mismatched loads (checksum-localize.ts); default on, 16-token ranges, 5 s. */
  localize?: LocalizeOptions;
}

/** A producer request waiting for its workers' sums and its finish. */
interface SendPending {
  request: ConnectorRequest;
  entry: StepEntry;
  carrier: Exclude<KVChecksumCarrier, null>;
  reports: Map<string, ReportEntry>;
  /** Workers whose sums are in flight on a device: worker key -> deadline (ms since the epoch). */
  inFlight?: Map<string, number>;
  /** Sampled checking: the threshold the entry was sampled at (absent: every block). */
  sampleThreshold?: number;
}

/** A consumer load waiting for its workers' sums. */
interface RecvPending {
  entry: StepEntry;
  carrier: Exclude<KVChecksumCarrier, null>;
  /** The producer's payload: undefined = none yet, 'malformed' = rejected by the decoder. */
  payload: ChecksumPayload | 'malformed' | undefined;
  reports: Map<string, ReportEntry>;
  /** As {@link SendPending.inFlight}. */
  inFlight?: Map<string, number>;
  /** Sampled checking: the sampler the entry was sampled with (absent: every block). */
  sampler?: BlockSampler;
}

const PROBES: ConnectorRequest[] = [
  { requestId: '__kvconnect_checksum_probe_send__', promptTokenIds: [], numComputedTokens: 0, numTokens: 0, kvTransferParams: { do_remote_decode: true } },
  { requestId: '__kvconnect_checksum_probe_recv__', promptTokenIds: [], numComputedTokens: 0, numTokens: 0, kvTransferParams: { do_remote_prefill: true } },
  { requestId: '__kvconnect_checksum_probe_plain__', promptTokenIds: [], numComputedTokens: 0, numTokens: 0 },
];

const isStateKind = (k: KVCacheGroupConfig['kind']) => k === 'state';
const u64 = (x: bigint) => BigInt.asUintN(64, x);

/**
 * Implements {@link KVChecksumSchedulerHooks} (see `checksum-hooks.ts` for when the engine calls
 * each hook). Construct with an options object, or positionally:
 * `new KVChecksumScheduler(config, connector, role, tpSize, ppSize, groupConfigs, observability?)`.
 *
 * @throws KVChecksumCarrierError at construction when checksums are enabled, fail-closed, and
 *   the connector has no carrier. Under fail-open the same case logs a warning, emits
 *   `checksums-disabled` and leaves {@link enabled} false.
 * @throws RangeError for TP/PP sizes that are not positive integers.
 */
export class KVChecksumScheduler implements KVChecksumSchedulerHooks {
  readonly config: KVTransferConfig;
  readonly connector: KVConnectorScheduler;
  readonly role: KVRole;
  readonly tpSize: number;
  readonly ppSize: number;
  readonly groupConfigs: readonly KVCacheGroupConfig[];
  readonly observability: KVChecksumObservability;
  private _enabled: boolean;
  private readonly sends = new Map<string, SendPending>();
  private readonly recvs = new Map<string, RecvPending>();
  private nextSend = new Map<string, StepEntry>();
  private nextRecv = new Map<string, StepEntry>();
  private nextDrop = new Set<string>();
  private readonly inFlightTimeoutMs: number;
  /** Sampled checking: the configured threshold (sampling.ts), and the cluster secret when it is below 2^32. */
  private readonly sampleThreshold: number;
  private readonly sampleSecret: Uint8Array | null = null;
  /** Consumer: drill-downs of mismatched loads (checksum-localize.ts); null on a producer. */
  readonly localizer: ChecksumLocalizer | null;

  constructor(options: KVChecksumSchedulerOptions);
  constructor(
    config: KVTransferConfig,
    connector: KVConnectorScheduler,
    role: KVRole,
    tpSize: number,
    ppSize: number,
    groupConfigs: readonly KVCacheGroupConfig[],
    observability?: KVChecksumObservability,
  );
  constructor(
    a: KVChecksumSchedulerOptions | KVTransferConfig,
    connector?: KVConnectorScheduler,
    role?: KVRole,
    tpSize?: number,
    ppSize?: number,
    groupConfigs?: readonly KVCacheGroupConfig[],
    observability?: KVChecksumObservability,
  ) {
    const o: KVChecksumSchedulerOptions =
      'kv_connector' in a ? { config: a, connector: connector!, role, tpSize: tpSize!, ppSize: ppSize!, groupConfigs: groupConfigs!, observability } : a;
    for (const [k, v] of [['tpSize', o.tpSize], ['ppSize', o.ppSize]] as const) {
      if (!(Number.isSafeInteger(v) && v >= 1)) throw new RangeError(`${k} must be a positive integer, got ${String(v)}`);
    }
    this.config = o.config;
    this.connector = o.connector;
    this.role = o.role ?? o.config.kv_role;
    this.tpSize = o.tpSize;
    this.ppSize = o.ppSize;
    this.groupConfigs = o.groupConfigs;
    this.observability = o.observability ?? new KVChecksumObservability();
    this.inFlightTimeoutMs = o.inFlightTimeoutMs ?? 10_000;
    this._enabled = o.config.enable_kv_checksum;
    this.localizer = this.role === 'kv_producer' ? null : new ChecksumLocalizer({ config: o.config, connector: o.connector, tpSize: o.tpSize, ppSize: o.ppSize, groupConfigs: o.groupConfigs, observability: this.observability, ...o.localize });
    if (this._enabled && !this.connectorHasCarrier(o.carriers)) {
      if (o.config.kv_checksum_fail_closed) throw new KVChecksumCarrierError(o.config.kv_connector);
      const reason = `KV connector ${o.config.kv_connector} does not carry KV checksums; KV checksums are disabled`;
      this.observability.logger.warn({ connector: o.config.kv_connector }, reason);
      this.observability.events.emit('checksums-disabled', { reason });
      this._enabled = false;
    }
    this.sampleThreshold = sampleThreshold(o.config.kv_checksum_sample_rate ?? 1);
    if (this._enabled && this.sampleThreshold < SAMPLE_THRESHOLD_ALL) {
      this.sampleSecret = resolveClusterSecret(o.config.kv_connector_extra_config.cluster_secret);
      if (this.sampleSecret === null) throw new KVChecksumSampleError();
    }
  }

  /** Sampled checking: the request's sampler (its key: the digest of the whole prompt), or undefined when every block is summed. */
  private samplerOf(request: ConnectorRequest): BlockSampler | undefined {
    if (this.sampleSecret === null) return undefined;
    try {
      return new BlockSampler(this.sampleSecret, tokenDigest(request.promptTokenIds), this.sampleThreshold);
    } catch (e) {
      this.observability.logger.warn({ requestId: request.requestId, err: e }, 'no KV checksum sample for this request (prompt not digestible): every block summed');
      return undefined;
    }
  }

  /** False when checksums are off (config, or a connector without a carrier under fail-open). */
  get enabled(): boolean {
    return this._enabled;
  }

  /** Producer requests and consumer loads with state held (for diagnostics and leak tests). */
  pendingCounts(): { sends: number; recvs: number } {
    return { sends: this.sends.size, recvs: this.recvs.size };
  }

  /** From the factory's declaration when there is one; else (a third-party factory) from probe requests. */
  private connectorHasCarrier(declared: readonly KVChecksumCarrierKind[] | undefined): boolean {
    if (declared) return declared.length > 0;
    return PROBES.some((p) => {
      try {
        return this.connector.kvChecksumCarrier(p) !== null;
      } catch {
        return false;
      }
    });
  }

  private carrierOf(request: ConnectorRequest): KVChecksumCarrier {
    try {
      return this.connector.kvChecksumCarrier(request);
    } catch (e) {
      this.observability.logger.warn({ requestId: request.requestId, err: e }, 'kvChecksumCarrier threw; request not checksummed');
      return null;
    }
  }

  /** Block positions of one group to sum (see the module notes on null blocks). */
  private groupEntry(k: number, ids: readonly number[] | undefined, firstToken: number, numTokens: number): StepGroupEntry | null {
    const g = this.groupConfigs[k];
    if (!ids) return null;
    if (isStateKind(g.kind)) {
      const last = ids[ids.length - 1];
      return last === undefined || last < 0 ? null : { groupId: g.groupId, start: 0, blockIds: [last] };
    }
    const B = g.blockSize;
    let start = Math.floor(firstToken / B);
    const end = Math.min(ids.length, Math.ceil(numTokens / B));
    while (start < end && ids[start] < 0) start++;
    const blockIds = ids.slice(start, end);
    if (blockIds.some((b) => b < 0)) return null;
    return { groupId: g.groupId, start, blockIds };
  }

  private entryOf(request: ConnectorRequest, blocks: BlockIdsPerGroup, firstToken: number, numTokens: number, sampler?: BlockSampler): StepEntry {
    const groups: StepGroupEntry[] = [];
    this.groupConfigs.forEach((cfg, k) => {
      const e = this.groupEntry(k, blocks[k], firstToken, numTokens);
      if (e && sampler) {
        // Sampled checking: only blocks overlapping a sampled span (sampling.ts; state groups: span 0).
        const bs = isStateKind(cfg.kind) ? 0 : cfg.blockSize;
        const sample = e.blockIds.map((_, i) => i).filter((i) => sampler.blockSampled(e.groupId, bs, e.start + i));
        if (sample.length < e.blockIds.length) e.sample = sample;
      }
      if (e) groups.push(e);
      else this.observability.logger.debug({ requestId: request.requestId, groupId: this.groupConfigs[k].groupId }, 'group not checksummed for this request (no blocks, or a null block among them)');
    });
    return { requestId: request.requestId, numTokens, groups };
  }

  /** Producer: records a send entry (every block holding one of the `numTokens` tokens; state groups: the running-state block). */
  onPromptComplete(request: ConnectorRequest, blocks: BlockIdsPerGroup, numTokens: number): void {
    if (!this._enabled || this.role === 'kv_consumer') return;
    if (this.role === 'kv_both' && !request.kvTransferParams?.do_remote_decode) return;
    const carrier = this.carrierOf(request);
    if (carrier === null) return;
    const sampler = this.samplerOf(request);
    const entry = this.entryOf(request, blocks, 0, numTokens, sampler);
    this.askSubBlocks(request, entry);
    // A new prefill (after preemption) replaces an earlier entry and its sums.
    this.sends.set(request.requestId, { request, entry, carrier, reports: new Map(), ...(sampler ? { sampleThreshold: sampler.threshold } : {}) });
    this.nextSend.set(request.requestId, entry);
  }

  /**
   * Producer: names `subBlockSize` on the entry's attention groups whose block size is a larger
   * multiple of the consumer's, as the request's {@link KV_CHECKSUM_BLOCK_SIZES_PARAM} says; a value
   * that is not a positive integer, or does not divide the producer's, is ignored.
   */
  private askSubBlocks(request: ConnectorRequest, entry: StepEntry): void {
    const sizes = request.kvTransferParams?.[KV_CHECKSUM_BLOCK_SIZES_PARAM];
    if (typeof sizes !== 'object' || sizes === null || Array.isArray(sizes)) return;
    for (const g of entry.groups) {
      const cfg = this.groupConfigs.find((c) => c.groupId === g.groupId);
      const bd = (sizes as Record<string, unknown>)[String(g.groupId)];
      if (!cfg || isStateKind(cfg.kind)) continue;
      if (subBlockSizeFits(cfg.blockSize, bd)) g.subBlockSize = bd;
    }
  }

  /** Consumer: records a receive entry of the loaded blocks only, and takes a params-carried payload. */
  onLoadScheduled(request: ConnectorRequest, blocks: BlockIdsPerGroup, numLocalTokens: number, numExternalTokens: number): void {
    if (!this._enabled || this.role === 'kv_producer') return;
    const carrier = this.carrierOf(request);
    if (carrier === null) return;
    const sampler = this.samplerOf(request);
    const entry = this.entryOf(request, blocks, numLocalTokens, numLocalTokens + numExternalTokens, sampler);
    let payload: RecvPending['payload'];
    if (carrier === 'kv_transfer_params') {
      const text = request.kvTransferParams?.[KV_CHECKSUMS_PARAM];
      if (text !== undefined) payload = this.decode(request.requestId, () => decodePayloadBase64(text as string)); // a non-string is rejected (PayloadError)
    }
    this.recvs.set(request.requestId, { entry, carrier, payload, reports: new Map(), ...(sampler ? { sampler } : {}) });
    this.nextRecv.set(request.requestId, entry);
    this.nextDrop.delete(request.requestId);
  }

  private decode(requestId: string, f: () => ChecksumPayload): ChecksumPayload | 'malformed' {
    try {
      return f();
    } catch (e) {
      const reason = e instanceof PayloadError ? e.reason : 'type';
      this.observability.logger.warn({ requestId, reason, detail: e instanceof Error ? e.message : String(e) }, 'KV checksum payload rejected');
      return 'malformed';
    }
  }

  /** The step's {@link ChecksumStepMeta}, or null when there is nothing for the workers. */
  buildStepMeta(): ChecksumStepMeta | null {
    const localize = this.localizer?.takeStepEntries() ?? [];
    if (this.nextSend.size === 0 && this.nextRecv.size === 0 && this.nextDrop.size === 0 && localize.length === 0) return null;
    const meta: ChecksumStepMeta = { send: [...this.nextSend.values()], recv: [...this.nextRecv.values()], drop: [...this.nextDrop] };
    if (localize.length > 0) meta.localize = localize;
    this.nextSend = new Map();
    this.nextRecv = new Map();
    this.nextDrop = new Set();
    return meta;
  }

  private asReport(x: unknown): KVChecksumReport | null {
    if (x === undefined || x === null) return null;
    try {
      if (typeof x === 'object' && (x as { format?: unknown }).format === REPORT_JSON_FORMAT) return decodeReport(x);
      if (typeof x === 'string') return decodeReport(JSON.parse(x));
    } catch (e) {
      this.observability.logger.error({ err: e }, 'dropping an undecodable KV checksum report');
      return null;
    }
    if (isReport(x)) return x;
    if (this.observability.once('bad-report')) this.observability.logger.error('dropping a KV checksum report of unknown shape');
    return null;
  }

  /** Adds every worker's sums to their pending requests and takes connector-carried payloads (first copy). */
  updateFromOutputs(outputs: readonly KVConnectorOutput[]): void {
    if (!this._enabled) return;
    for (const out of outputs) {
      const report = this.asReport(out.kvChecksumReport);
      if (report) {
        const key = `${report.ppRank}:${report.tpRank}`;
        this.observability.recordCompute('send', report.seconds.send, report.bytes.send);
        this.observability.recordCompute('recv', report.seconds.recv, report.bytes.recv);
        for (const e of report.sends) this.sends.get(e.requestId)?.reports.set(key, e);
        for (const e of report.recvs) this.recvs.get(e.requestId)?.reports.set(key, e);
        for (const r of report.received) this.takeReceived(r.requestId, r.payload);
        for (const l of report.localized ?? []) this.localizer?.onWorker(key, l);
        this.trackInFlight(key, report);
      }
      for (const [id, bytes] of out.kvChecksums ?? []) this.takeReceived(id, bytes);
    }
  }

  /** A report's records end their workers' waits; its `inFlight` requests start new ones. */
  private trackInFlight(key: string, report: KVChecksumReport): void {
    // New waits first, then the records end them: a step whose sums were submitted and already
    // collected by the same takeReport() (a GPU finishes within the step's host time) reports the
    // request both in flight and done, and must not wait for records it already delivered.
    const deadline = Date.now() + this.inFlightTimeoutMs;
    for (const id of report.inFlight?.sends ?? []) {
      const p = this.sends.get(id);
      if (p) (p.inFlight ??= new Map()).set(key, deadline);
    }
    for (const id of report.inFlight?.recvs ?? []) {
      const p = this.recvs.get(id);
      if (p) (p.inFlight ??= new Map()).set(key, deadline);
    }
    for (const e of report.sends) this.sends.get(e.requestId)?.inFlight?.delete(key);
    for (const e of report.recvs) this.recvs.get(e.requestId)?.inFlight?.delete(key);
  }

  /** See {@link KVChecksumSchedulerHooks.sumsInFlight}. Past the deadline, logs the late workers once and stops waiting. */
  sumsInFlight(request: ConnectorRequest): boolean {
    if (!this._enabled) return false;
    const id = request.requestId;
    return [this.sends.get(id), this.recvs.get(id)].some((p) => {
      if (!p?.inFlight || p.inFlight.size === 0) return false;
      const now = Date.now();
      if ([...p.inFlight.values()].some((d) => now < d)) return true;
      this.observability.logger.warn({ requestId: id, workers: [...p.inFlight.keys()], timeoutMs: this.inFlightTimeoutMs }, 'KV checksum sums of a worker did not arrive in time; going on without them');
      p.inFlight.clear();
      return false;
    });
  }

  private takeReceived(requestId: string, bytes: Uint8Array): void {
    const p = this.recvs.get(requestId);
    if (!p || p.carrier !== 'connector' || p.payload !== undefined) return;
    p.payload = this.decode(requestId, () => decodePayload(bytes));
    this.observability.events.emit('checksum-payload-received', { requestId, bytes: bytes.byteLength });
  }

  /**
   * Consumer: verifies a finished load (SPEC 8; identity against `request.promptTokenIds`, 8.0) and
   * applies fail-open / fail-closed and the failure policy. With `loadError` (the transfer failed)
   * nothing is verified: the decision is `kv_load_failure_policy` with the cause, fail-open or closed.
   */
  onLoadFinished(request: ConnectorRequest, loadError?: LoadError): LoadDecision {
    const p = this.recvs.get(request.requestId);
    if (p) {
      this.recvs.delete(request.requestId);
      this.nextRecv.delete(request.requestId);
      this.nextDrop.add(request.requestId);
    }
    if (loadError) return this.transferFailed(request.requestId, loadError, p?.entry.numTokens ?? request.numTokens);
    if (!this._enabled || !p) return { action: 'use', verdict: null };
    const load = this.consumerLoad(p, request);
    const verdict = verifyLoad(p.payload ?? null, load);
    const action: LoadDecision['action'] = verdict.verdict === 'verified' || !this.config.kv_checksum_fail_closed ? 'use' : this.config.kv_load_failure_policy;
    this.report(request.requestId, verdict, action, load.numTokens, p.entry.groups);
    // After the decision: the drill-down never delays the load failure policy.
    if (verdict.verdict === 'mismatch') this.localizer?.start(request, p.entry, verdict);
    return { action, verdict };
  }

  /** A load whose transfer failed: reported with its cause (never a checksum verdict); the failure policy applies. */
  private transferFailed(requestId: string, loadError: LoadError, numTokens: number): LoadDecision {
    const action = this.config.kv_load_failure_policy;
    const obs = this.observability;
    obs.recordTransferFailed(loadError, action);
    obs.logger.error({ requestId, reason: loadError.reason, detail: loadError.message, action }, `KV load failed in transit (${loadError.reason}): ${action}`);
    const ev = { requestId, loadError, action, numTokens };
    obs.events.emit('load-transfer-failed', ev);
    obs.events.emit(action === 'recompute' ? 'load-recomputed' : 'load-failed', ev);
    return { action, verdict: null, loadError };
  }

  /** The consumer's side of a load (SPEC 8 input); `tokenIds` = the request's prompt (SPEC 8.0). */
  private consumerLoad(p: RecvPending, request: ConnectorRequest): ConsumerLoad {
    const workers: WorkerRecord[] = [...p.reports].map(([key, e]) => {
      const [pp, tp] = key.split(':').map(Number);
      return { ppRank: pp, tpRank: tp, groups: new Map(e.groups.map((g) => [g.groupId, g])) };
    });
    const fpRank = Math.min(...workers.map((w) => w.tpRank));
    const groups: ConsumerGroup[] = p.entry.groups.map((g) => {
      const recs = workers.map((w) => ({ w, r: w.groups.get(g.groupId) as ReportGroup | undefined }));
      const kind = recs.find((x) => x.r?.kind)?.r?.kind ?? null;
      const cfg = this.groupConfigs.find((c) => c.groupId === g.groupId);
      let fingerprint = 0n;
      for (const { w, r } of recs) if (w.tpRank === fpRank && r) fingerprint = u64(fingerprint + r.fingerprint);
      return {
        groupId: g.groupId,
        kind: (kind ?? (cfg && isStateKind(cfg.kind) ? 'state' : 'attention')) as GroupKind,
        blockSize: cfg?.blockSize ?? 1,
        start: g.start,
        nBlocks: g.blockIds.length,
        fingerprint,
        skipped: kind === null || recs.some((x) => x.r?.skipped === true),
      };
    });
    return { numTokens: p.entry.numTokens, tokenIds: request.promptTokenIds, tpSize: this.tpSize, ppSize: this.ppSize, groups, workers, ...(p.sampler ? { sample: p.sampler } : {}) };
  }

  /** Records, logs and emits a verdict; the log lines name the request, group, block ids, positions and reason. */
  private report(requestId: string, verdict: Verdict, action: LoadDecision['action'], numTokens: number, loaded: readonly { groupId: number; start: number; blockIds: readonly number[] }[] = []): void {
    // consumer block ids at consumer block positions (SPEC 8: positions count from the request's first block)
    const blockIdsAt = (groupId: number, positions: readonly number[]): number[] => {
      const g = loaded.find((x) => x.groupId === groupId);
      return g ? positions.map((pos) => g.blockIds[pos - g.start] ?? -1) : [];
    };
    const obs = this.observability;
    const ev: LoadEvent = { requestId, verdict, action, numTokens };
    obs.recordLoad(verdict, action);
    const log = obs.logger;
    const { identity } = verdict;
    for (const g of verdict.leftOut) {
      if (obs.once(`left-out:${g}`)) log.warn({ requestId, groupId: g }, 'KV cache group left out of KV checksums: state without a TP split across different TP sizes');
    }
    if (identity === 'unchecked' && obs.once('identity-unchecked')) {
      log.warn({ requestId }, 'KV checksum payload of version 1: the load is not checked against the request tokens (identity unchecked, SPEC 8.0); upgrade the producer to payload version 2');
    }
    if (verdict.wrongRequest) log.error({ requestId, action, identity }, 'KV load belongs to another request: the payload token digest differs from the prompt (SPEC 8.0)');
    if (verdict.verdict === 'verified') {
      log.debug({ requestId, action, identity, ...(verdict.sampled ? { sampled: verdict.sampled } : {}), ...(verdict.subBlockGroups ? { subBlockGroups: verdict.subBlockGroups } : {}) }, 'KV load verified');
      obs.events.emit('load-verified', ev);
    } else {
      for (const m of verdict.mismatches) {
        log.error({ requestId, groupId: m.groupId, blockIds: blockIdsAt(m.groupId, m.positions), positions: m.positions, reason: verdict.wrongRequest ? 'wrong-request' : 'mismatch', action, wrongRequest: verdict.wrongRequest }, 'KV checksum mismatch');
      }
      for (const u of verdict.unverified) log.warn({ requestId, groupId: u.groupId, reason: u.reason, action }, 'KV checksums not verified');
      log.info({ requestId, action, identity, summary: verdictSummary(verdict) }, `KV load ${verdict.verdict}: ${action}`);
      obs.events.emit(verdict.verdict === 'mismatch' ? 'load-mismatch' : 'load-unverified', ev);
    }
    if (action === 'recompute') obs.events.emit('load-recomputed', ev);
    if (action === 'fail') obs.events.emit('load-failed', ev);
  }

  /** Producer: on `stop`/`length`, builds the payload and hands it to the carrier; cleans state for every reason. */
  onRequestFinished(request: ConnectorRequest, result: RequestFinishedResult, reason: FinishReason): KVTransferParams | undefined {
    const id = request.requestId;
    if (this.recvs.delete(id) || this.nextRecv.delete(id)) this.nextDrop.add(id);
    this.nextSend.delete(id);
    const p = this.sends.get(id);
    this.sends.delete(id);
    if (!this._enabled || !p || (reason !== 'stop' && reason !== 'length')) return result.kvTransferParams;
    const built = this.buildPayload(p);
    if ('notSent' in built) {
      this.notSent(id, built.notSent, built.detail);
      return result.kvTransferParams;
    }
    let bytes: Uint8Array;
    try {
      bytes = encodePayload(built.payload);
    } catch (e) {
      this.notSent(id, 'encode-error', e instanceof Error ? e.message : String(e));
      return result.kvTransferParams;
    }
    const sent = { requestId: id, carrier: p.carrier, bytes: bytes.byteLength, groups: built.payload.groups.map((g) => g.groupId) };
    if (p.carrier === 'kv_transfer_params') {
      if (!result.kvTransferParams) {
        this.notSent(id, 'no-params', 'the connector returned no kv_transfer_params');
        return undefined;
      }
      this.sent(sent);
      return { ...result.kvTransferParams, [KV_CHECKSUMS_PARAM]: Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('base64') };
    }
    if (!this.connector.sendKvChecksums) {
      this.notSent(id, 'no-send-hook', 'the connector carries checksums but has no sendKvChecksums');
      return result.kvTransferParams;
    }
    try {
      this.connector.sendKvChecksums(request, bytes);
      this.sent(sent);
    } catch (e) {
      this.observability.logger.error({ requestId: id, err: e }, 'sendKvChecksums threw; KV checksums not sent');
    }
    return result.kvTransferParams;
  }

  private sent(ev: { requestId: string; carrier: 'kv_transfer_params' | 'connector'; bytes: number; groups: number[] }): void {
    this.observability.metrics.payloadsSent.inc({ carrier: ev.carrier });
    this.observability.logger.debug(ev, 'KV checksums sent');
    this.observability.events.emit('checksum-payload-sent', ev);
  }

  private notSent(requestId: string, reason: NotSentReason, detail: string): void {
    this.observability.metrics.payloadsNotSent.inc({ reason });
    this.observability.logger.warn({ requestId, reason, detail }, 'KV checksums not sent');
    this.observability.events.emit('checksum-payload-not-sent', { requestId, reason, detail });
  }

  /**
   * Payload (version 2, SPEC 6.1) of a producer request: every TP x PP worker must have reported;
   * values = sum over workers of their replica-0 partials per block; fingerprint = sum over PP
   * stages of one TP rank's; groups a worker skipped (or no worker holds) are left out;
   * `tokenDigest` = digest of the first `numTokens` prompt token ids (`encode-error` when the
   * prompt holds fewer, or an id is not a uint32).
   */
  private buildPayload(p: SendPending): { payload: ChecksumPayload } | { notSent: NotSentReason; detail: string } {
    const workers = [...p.reports.entries()]
      .map(([key, e]) => {
        const [pp, tp] = key.split(':').map(Number);
        return { pp, tp, e };
      })
      .filter((w) => w.pp < this.ppSize && w.tp < this.tpSize);
    if (workers.length < this.tpSize * this.ppSize) {
      return { notSent: 'workers-missing', detail: `${workers.length} of ${this.tpSize * this.ppSize} workers reported their sums` };
    }
    const fpRank = Math.min(...workers.map((w) => w.tp));
    const groups: PayloadGroup[] = [];
    const subBlocks: SubBlockValues[] = [];
    for (const g of p.entry.groups) {
      const cfg = this.groupConfigs.find((c) => c.groupId === g.groupId)!;
      const state = isStateKind(cfg.kind);
      const start = state ? 0 : g.start;
      const n = g.blockIds.length;
      const values = new BigUint64Array(n);
      let fingerprint = 0n;
      let skip = false;
      let anyKind = false;
      for (const w of workers) {
        const r = w.e.groups.find((x) => x.groupId === g.groupId);
        if (!r || r.start !== start || r.nBlocks !== n) return { notSent: 'rows-differ', detail: `worker ${w.pp}:${w.tp} summed other blocks of group ${g.groupId}` };
        if (r.skipped) skip = true;
        if (r.kind !== null) anyKind = true;
        if (w.tp === fpRank) fingerprint = u64(fingerprint + r.fingerprint);
        for (const [k, v] of r.partials) {
          let replica: number;
          try {
            replica = parseReplicaKey(k).replica;
          } catch {
            return { notSent: 'rows-differ', detail: `worker ${w.pp}:${w.tp} reported replica key ${k}` };
          }
          if (replica !== 0) continue;
          if (v.length !== n) return { notSent: 'rows-differ', detail: `worker ${w.pp}:${w.tp} reported ${v.length} values for ${n} blocks` };
          for (let b = 0; b < n; b++) values[b] += v[b]; // the BigUint64Array store is mod 2^64
        }
      }
      if (skip || !anyKind) continue;
      groups.push({ groupId: g.groupId, fingerprint, blockSize: cfg.blockSize, start, values });
      if (g.subBlockSize !== undefined) {
        const sub = subBlockPayload(g.groupId, workers.map((w) => w.e.groups.find((x) => x.groupId === g.groupId)?.sub));
        if (sub) subBlocks.push(sub);
      }
    }
    const { numTokens } = p.entry;
    let digest: bigint;
    try {
      digest = tokenDigest(p.request.promptTokenIds, numTokens);
    } catch (e) {
      return { notSent: 'encode-error', detail: `no token digest of ${numTokens} tokens: ${e instanceof Error ? e.message : String(e)}` };
    }
    const ext =
      p.sampleThreshold !== undefined || subBlocks.length > 0
        ? { version: PAYLOAD_VERSION_EXTENSIONS, ...(p.sampleThreshold !== undefined ? { sampleThreshold: p.sampleThreshold } : {}), ...(subBlocks.length > 0 ? { subBlocks } : {}) }
        : { version: 2 as const };
    return { payload: { ...ext, numTokens, producerTpSize: this.tpSize, tokenDigest: digest, groups } };
  }
}

/**
 * A group's sub-block values from its workers' `sub` records: every worker must have one, of one
 * block size and the same rows; the values are the sum over workers of the replica-0 partials
 * (as the block values, SPEC 2). Undefined when a worker has none or they disagree.
 */
function subBlockPayload(groupId: number, subs: ReadonlyArray<ReportGroup['sub']>): SubBlockValues | undefined {
  const first = subs[0];
  if (!first || subs.some((s) => !s || s.blockSize !== first.blockSize || s.start !== first.start || s.nBlocks !== first.nBlocks)) return undefined;
  const values = new BigUint64Array(first.nBlocks);
  for (const s of subs) {
    for (const [k, v] of s!.partials) {
      let replica: number;
      try {
        replica = parseReplicaKey(k).replica;
      } catch {
        return undefined;
      }
      if (replica !== 0) continue;
      if (v.length !== first.nBlocks) return undefined;
      for (let b = 0; b < v.length; b++) values[b] += v[b]; // the BigUint64Array store is mod 2^64
    }
  }
  return { groupId, blockSize: first.blockSize, start: first.start, values };
}

/**
 * `MultiConnector` (vLLM's `MultiConnector`): one connector over an ordered list of child
 * connectors. Registered as `'MultiConnector'`; configured with
 *
 * ```json
 * { "kv_connector": "MultiConnector", "kv_role": "kv_both",
 *   "kv_connector_extra_config": { "connectors": [
 *     { "kv_connector": "NixlConnector", "kv_connector_extra_config": { ... } },
 *     { "kv_connector": "OffloadConnector" } ] } }
 * ```
 *
 * Children inherit `kv_role`, `enable_kv_checksum`, `kv_checksum_fail_closed` and
 * `kv_load_failure_policy` from the parent unless their entry sets them.
 *
 * Routing: the first child that matches tokens loads a request (the others see no blocks); the
 * checksum carrier of a load is that child's; of a sent request, the first child with a carrier
 * (it then gets `sendKvChecksums`). `requestFinished` merges the children's params (first child
 * wins on a key both set) and keeps the blocks while any child sends; the worker reports a request
 * in `finishedSending` once every child that kept its blocks has. Transfer results merge;
 * connector-carried checksums: the first copy wins (child order).
 *
 * What crosses between the halves carries one slot per child, in child order: the step metadata
 * ({@link MultiConnectorMetadata}), the worker-to-scheduler metadata
 * ({@link MultiConnectorWorkerMeta}: child `i`'s `workerMeta` reaches child `i`'s
 * `updateConnectorOutput` as its `kvConnectorWorkerMeta`) and the handshake metadata
 * ({@link MultiConnectorHandshake}: child `i`'s `getHandshakeMetadata` reaches child `i`'s
 * `setXferHandshakeMetadata`, keyed by worker, workers that gave null left out), as vLLM's
 * `MultiConnector` does for `get_handshake_metadata` / `set_xfer_handshake_metadata`.
 * @module
 */
import { KVTransferConfigError, parseKVTransferConfig, type ConfigProblem } from './config.js';
import type {
  BlockIdsPerGroup,
  ConnectorRequest,
  HandshakeMetadataByWorker,
  FinishReason,
  KVChecksumCarrier,
  KVChecksumCarrierKind,
  KVConnectorFactory,
  KVConnectorMetadata,
  KVConnectorOutput,
  KVConnectorScheduler,
  KVConnectorWorker,
  KVTransferConfig,
  KVTransferParams,
  MatchedTokens,
  RequestFinishedResult,
  SchedulerContext,
  SchedulerOutput,
  TransferResults,
  WorkerContext,
  WorkerKVCaches,
} from './connector.js';

/** The registered name. */
export const MULTI_CONNECTOR_NAME = 'MultiConnector';

/** What the MultiConnector needs of a registry: factories by name. */
export interface ConnectorLookup {
  get(name: string): KVConnectorFactory;
}

/** Scheduler-to-worker metadata of a MultiConnector step (plain data). */
export interface MultiConnectorMetadata {
  /** Each child's metadata, in child order. */
  children: KVConnectorMetadata[];
  /** Requests that finished this step with more than one child sending: how many must report `finishedSending`. */
  expectedSends: Record<string, number>;
}

/**
 * Worker-to-scheduler metadata of a MultiConnector worker step (plain data): child `i`'s
 * `workerMeta` (null when it gave none), in child order.
 */
export interface MultiConnectorWorkerMeta {
  children: unknown[];
}

/** Handshake metadata of a MultiConnector worker (plain data): child `i`'s, null when it has none. */
export interface MultiConnectorHandshake {
  children: unknown[];
}

/** The MultiConnector's halves, typed over its metadata. */
export type MultiConnectorFactoryType = KVConnectorFactory<MultiConnectorMetadata, MultiConnectorWorkerMeta, MultiConnectorHandshake>;

const INHERITED = ['kv_role', 'enable_kv_checksum', 'kv_checksum_fail_closed', 'kv_load_failure_policy'] as const;

/**
 * The child configs of a MultiConnector config (`kv_connector_extra_config.connectors`), each
 * validated by `parseKVTransferConfig` with the inherited fields filled in.
 * @throws KVTransferConfigError listing every problem of every entry (paths under
 *   `kv_connector_extra_config.connectors[i]`).
 */
export function multiConnectorChildConfigs(config: KVTransferConfig): KVTransferConfig[] {
  const base = 'kv_connector_extra_config.connectors';
  const list = config.kv_connector_extra_config.connectors;
  if (!Array.isArray(list) || list.length === 0) {
    throw new KVTransferConfigError([{ path: base, message: 'expected a non-empty array of connector configs' }]);
  }
  const problems: ConfigProblem[] = [];
  const out: KVTransferConfig[] = [];
  list.forEach((entry, i) => {
    const path = `${base}[${i}]`;
    if (typeof entry !== 'object' || entry === null || Array.isArray(entry)) {
      problems.push({ path, message: 'expected an object' });
      return;
    }
    const raw: Record<string, unknown> = { ...(entry as Record<string, unknown>) };
    for (const k of INHERITED) if (raw[k] === undefined) raw[k] = config[k];
    try {
      out.push(parseKVTransferConfig(raw, path));
    } catch (e) {
      if (e instanceof KVTransferConfigError) problems.push(...e.problems);
      else throw e;
    }
  });
  if (problems.length > 0) throw new KVTransferConfigError(problems);
  return out;
}

/** The `MultiConnector` factory; children are created from `lookup` (the registry it is registered in). */
export class MultiConnectorFactory implements MultiConnectorFactoryType {
  readonly name = MULTI_CONNECTOR_NAME;

  constructor(private readonly lookup: ConnectorLookup) {}

  /** @throws KVTransferConfigError for a bad `connectors` list; UnknownConnectorError for an unknown child. */
  createScheduler(config: KVTransferConfig, ctx: SchedulerContext): MultiConnectorScheduler {
    return new MultiConnectorScheduler(multiConnectorChildConfigs(config).map((c) => this.lookup.get(c.kv_connector).createScheduler(c, ctx)));
  }

  /** @throws KVTransferConfigError for a bad `connectors` list; UnknownConnectorError for an unknown child. */
  createWorker(config: KVTransferConfig, ctx: WorkerContext): MultiConnectorWorker {
    return new MultiConnectorWorker(multiConnectorChildConfigs(config).map((c) => this.lookup.get(c.kv_connector).createWorker(c, ctx)));
  }

  /** The union of the children's declared carriers; undefined when a child declares none (unknown: probe). */
  kvChecksumCarriers(config: KVTransferConfig): readonly KVChecksumCarrierKind[] | undefined {
    const out = new Set<KVChecksumCarrierKind>();
    for (const c of multiConnectorChildConfigs(config)) {
      const d = this.lookup.get(c.kv_connector).kvChecksumCarriers?.(c);
      if (!d) return undefined;
      for (const k of d) out.add(k);
    }
    return [...out];
  }
}

async function settleAll(calls: Array<() => Promise<void> | void>): Promise<void> {
  const results = await Promise.allSettled(calls.map(async (f) => f()));
  const errors = results.filter((r): r is PromiseRejectedResult => r.status === 'rejected').map((r) => r.reason as unknown);
  if (errors.length === 1) throw errors[0];
  if (errors.length > 1) throw new AggregateError(errors, `${errors.length} child connectors failed`);
}

/** The scheduler half of a MultiConnector. */
export class MultiConnectorScheduler implements KVConnectorScheduler<MultiConnectorMetadata, MultiConnectorWorkerMeta, MultiConnectorHandshake> {
  /** request id -> index of the child loading it. */
  private readonly loadChild = new Map<string, number>();
  /** request id -> index of the child carrying its checksums when it is sent. */
  private readonly sendChild = new Map<string, number>();
  /** Finished requests, forgotten at the next `buildConnectorMeta` (after `sendKvChecksums`). */
  private readonly finished = new Set<string>();
  private expectedSends: Record<string, number> = {};
  /**
   * Consumer: forwards a drill-down (`docs/localize.md`) to the child that loaded the request.
   * Present when some child has `localizeKvChecksums`; rejects when no child loaded the request
   * or the loading child has none.
   */
  localizeKvChecksums?: KVConnectorScheduler['localizeKvChecksums'];

  constructor(readonly children: readonly KVConnectorScheduler[]) {
    if (children.length === 0) throw new RangeError('MultiConnector needs at least one child connector');
    if (children.some((c) => c.localizeKvChecksums)) {
      this.localizeKvChecksums = async (request, query, timeoutMs) => {
        const i = this.loadChild.get(request.requestId);
        if (i === undefined) throw new Error(`MultiConnector: no child loaded request ${request.requestId}`);
        const child = this.children[i];
        if (!child.localizeKvChecksums) throw new Error(`MultiConnector: child ${i}, which loaded ${request.requestId}, cannot localize (no localizeKvChecksums)`);
        return child.localizeKvChecksums(request, query, timeoutMs);
      };
    }
  }

  /** The index of the child loading `requestId`, or undefined. */
  loadingChild(requestId: string): number | undefined {
    return this.loadChild.get(requestId);
  }

  /**
   * Asks every child in order; the first with a positive count loads the request. A child that
   * does not know yet (`count: null`) makes the answer null (ask again next step).
   */
  getNumNewMatchedTokens(request: ConnectorRequest, numComputedTokens: number): MatchedTokens {
    let chosen = -1;
    let result: MatchedTokens = { count: 0, loadAsync: false };
    for (let i = 0; i < this.children.length; i++) {
      const r = this.children[i].getNumNewMatchedTokens(request, numComputedTokens);
      if (r.count === null) return { count: null, loadAsync: false };
      if (chosen < 0 && r.count > 0) {
        chosen = i;
        result = r;
      }
    }
    if (chosen >= 0) this.loadChild.set(request.requestId, chosen);
    else this.loadChild.delete(request.requestId);
    return result;
  }

  /** The loading child gets the blocks and the external token count; the others empty blocks and 0. */
  updateStateAfterAlloc(request: ConnectorRequest, blocks: BlockIdsPerGroup, numExternalTokens: number): void {
    const chosen = this.loadChild.get(request.requestId) ?? -1;
    const empty: BlockIdsPerGroup = blocks.map(() => []);
    this.children.forEach((c, i) => (i === chosen ? c.updateStateAfterAlloc(request, blocks, numExternalTokens) : c.updateStateAfterAlloc(request, empty, 0)));
  }

  /** Every child's metadata, in order, plus the send counts of requests several children send. */
  buildConnectorMeta(output: Omit<SchedulerOutput, 'kvConnectorMetadata' | 'kvChecksumMetadata'>): MultiConnectorMetadata {
    const meta: MultiConnectorMetadata = { children: this.children.map((c) => c.buildConnectorMeta(output)), expectedSends: this.expectedSends };
    this.expectedSends = {};
    for (const id of this.finished) {
      this.loadChild.delete(id);
      this.sendChild.delete(id);
    }
    this.finished.clear();
    return meta;
  }

  /**
   * Every child gets the step's outputs with its own slot of each output's
   * {@link MultiConnectorWorkerMeta} as `kvConnectorWorkerMeta` (absent when the worker gave none
   * for that child).
   */
  updateConnectorOutput(outputs: readonly KVConnectorOutput<MultiConnectorWorkerMeta>[]): void {
    this.children.forEach((c, i) =>
      c.updateConnectorOutput(
        outputs.map((o) => {
          const { kvConnectorWorkerMeta, ...rest } = o;
          const mine = kvConnectorWorkerMeta?.children?.[i];
          return mine === undefined || mine === null ? rest : { ...rest, kvConnectorWorkerMeta: mine };
        }),
      ),
    );
  }

  /**
   * Child `i` gets, per worker, slot `i` of that worker's {@link MultiConnectorHandshake}; workers
   * whose slot is null are left out. Children without the hook are skipped; all are awaited.
   */
  async setXferHandshakeMetadata(metadata: HandshakeMetadataByWorker<MultiConnectorHandshake>): Promise<void> {
    await settleAll(
      this.children.map((c, i) => () => {
        if (!c.setXferHandshakeMetadata) return;
        const mine = new Map<string, unknown>();
        for (const [worker, h] of metadata) {
          const x = h?.children?.[i];
          if (x !== undefined && x !== null) mine.set(worker, x);
        }
        return c.setXferHandshakeMetadata(mine);
      }),
    );
  }

  /**
   * Every child's `requestFinished`; `delayFree` if any child keeps the blocks. Params merge in
   * child order; on a key several children set, the first child's value is kept.
   */
  requestFinished(request: ConnectorRequest, blocks: BlockIdsPerGroup, reason: FinishReason): RequestFinishedResult {
    let delaying = 0;
    let params: KVTransferParams | undefined;
    for (const c of this.children) {
      const r = c.requestFinished(request, blocks, reason);
      if (r.delayFree) delaying++;
      if (r.kvTransferParams) params = { ...r.kvTransferParams, ...(params ?? {}) };
    }
    if (delaying > 1) this.expectedSends[request.requestId] = delaying;
    this.finished.add(request.requestId);
    return params ? { delayFree: delaying > 0, kvTransferParams: params } : { delayFree: delaying > 0 };
  }

  /** The carrier of the child loading the request; else of the first child with a carrier for it. */
  kvChecksumCarrier(request: ConnectorRequest): KVChecksumCarrier {
    const loading = this.loadChild.get(request.requestId);
    if (loading !== undefined) return this.children[loading].kvChecksumCarrier(request);
    for (let i = 0; i < this.children.length; i++) {
      const c = this.children[i].kvChecksumCarrier(request);
      if (c !== null) {
        this.sendChild.set(request.requestId, i);
        return c;
      }
    }
    return null;
  }

  /**
   * Forwards to the child that carries the request's checksums.
   * @throws Error when no child carries them or that child has no `sendKvChecksums`.
   */
  sendKvChecksums(request: ConnectorRequest, payload: Uint8Array): void {
    let i = this.sendChild.get(request.requestId) ?? this.loadChild.get(request.requestId);
    if (i === undefined) {
      i = this.children.findIndex((c) => c.kvChecksumCarrier(request) !== null);
      if (i < 0) throw new Error(`MultiConnector: no child carries KV checksums for request ${request.requestId}`);
    }
    const child = this.children[i];
    if (!child.sendKvChecksums) throw new Error(`MultiConnector: child ${i} carries KV checksums for ${request.requestId} but has no sendKvChecksums`);
    child.sendKvChecksums(request, payload);
  }

  /** Shuts every child down (all of them, even when some fail). */
  shutdown(): Promise<void> {
    return settleAll(this.children.map((c) => () => c.shutdown?.()));
  }
}

/** The worker half of a MultiConnector. */
export class MultiConnectorWorker implements KVConnectorWorker<MultiConnectorMetadata, MultiConnectorWorkerMeta, MultiConnectorHandshake> {
  private expectedSends = new Map<string, number>();
  /** request id -> children that reported it in finishedSending so far. */
  private readonly sendsSeen = new Map<string, Set<number>>();
  private childMeta: KVConnectorMetadata[] = [];

  constructor(readonly children: readonly KVConnectorWorker[]) {
    if (children.length === 0) throw new RangeError('MultiConnector needs at least one child connector');
  }

  registerKvCaches(caches: WorkerKVCaches): void | Promise<void> {
    const pending = this.children.map((c) => c.registerKvCaches(caches)).filter((r): r is Promise<void> => r instanceof Promise);
    if (pending.length > 0) return Promise.all(pending).then(() => undefined);
  }

  /** Every child's handshake metadata in child order; null when no child has any. */
  getHandshakeMetadata(): MultiConnectorHandshake | null {
    const children = this.children.map((c) => c.getHandshakeMetadata?.() ?? null);
    return children.some((h) => h !== null) ? { children } : null;
  }

  bindConnectorMetadata(meta: MultiConnectorMetadata | null): void {
    const m = meta;
    this.childMeta = m?.children ?? [];
    for (const [id, n] of Object.entries(m?.expectedSends ?? {})) this.expectedSends.set(id, n);
    this.children.forEach((c, i) => c.bindConnectorMetadata(this.childMeta[i] ?? null));
  }

  startLoadKv(output: SchedulerOutput): void {
    this.children.forEach((c, i) => c.startLoadKv({ ...output, kvConnectorMetadata: this.childMeta[i] ?? null }));
  }

  waitForLayerLoad(layerName: string): void {
    for (const c of this.children) c.waitForLayerLoad?.(layerName);
  }

  saveKvLayer(layerName: string): void {
    for (const c of this.children) c.saveKvLayer?.(layerName);
  }

  waitForSave(): void {
    for (const c of this.children) c.waitForSave?.();
  }

  /**
   * Merged results: unions; a request is finished sending once every sending child said so; first
   * checksum copy and first load error win; `workerMeta` holds each child's (null for none), absent when no child gave any.
   */
  getTransferResults(): TransferResults<MultiConnectorWorkerMeta> {
    const out: TransferResults<MultiConnectorWorkerMeta> = { finishedSending: new Set(), finishedRecving: new Set(), invalidBlockIds: new Set(), kvChecksums: new Map() };
    const metas: unknown[] = [];
    this.children.forEach((c, i) => {
      const r = c.getTransferResults();
      metas.push(r.workerMeta ?? null);
      for (const id of r.finishedRecving) out.finishedRecving.add(id);
      for (const b of r.invalidBlockIds) out.invalidBlockIds.add(b);
      for (const [id, bytes] of r.kvChecksums) if (!out.kvChecksums.has(id)) out.kvChecksums.set(id, bytes);
      for (const [id, e] of r.loadErrors ?? []) if (!(out.loadErrors ??= new Map()).has(id)) out.loadErrors.set(id, e);
      for (const id of r.finishedSending) {
        const seen = this.sendsSeen.get(id) ?? new Set<number>();
        seen.add(i);
        this.sendsSeen.set(id, seen);
      }
    });
    for (const [id, seen] of this.sendsSeen) {
      if (seen.size >= (this.expectedSends.get(id) ?? 1)) {
        out.finishedSending.add(id);
        this.sendsSeen.delete(id);
        this.expectedSends.delete(id);
      }
    }
    if (metas.some((m) => m !== null)) out.workerMeta = { children: metas };
    return out;
  }

  clearConnectorMetadata(): void {
    for (const c of this.children) c.clearConnectorMetadata();
    this.childMeta = [];
  }

  shutdown(): Promise<void> {
    return settleAll(this.children.map((c) => () => c.shutdown?.()));
  }
}

/**
 * The engine: a request front end, the {@link Scheduler}, TP x PP {@link Worker}s running a small
 * real transformer, and the KV connector and KV checksum hooks at the points `@kvconnect/core`'s
 * contracts fix (see `scheduler.ts` for the scheduler half; {@link Engine.step} for the workers').
 *
 * Where the workers run is the executor's business (executor.ts): objects in this process
 * (`executor: 'inprocess'`, the default) or one process per TP rank x PP stage (`'processes'`,
 * multiprocess-executor.ts). Either way the connector's scheduler half runs here and its worker
 * halves with their workers, and they exchange only plain data: the step's connector metadata, each
 * worker's `KVConnectorOutput` (with `kvConnectorWorkerMeta`), and once, at start, the workers'
 * handshake metadata (`getHandshakeMetadata` -> `setXferHandshakeMetadata`, awaited before the first
 * step). A worker process that dies fails every pending request with its reason
 * ({@link Engine.failure}).
 * @module
 */
import {
  AggregatorRegistry,
  Registry,
  type MetricObjectWithValues,
  type MetricValue,
} from 'prom-client';
import {
  KVChecksumObservability,
  KVChecksumScheduler,
  defaultRegistry,
  ignoredTransferConfigKeys,
  parseKVTransferConfig,
  type KVChecksumMetrics,
  type KVConnectorRegistry,
} from '@kvconnect/core';
import type { BackendName } from '@kvconnect/checksum';
import { checkChecksumBackend, type EngineChecksumBackend } from './checksum-device.js';
import type { KVCacheGroupConfig, KVConnectorOutput, KVConnectorScheduler, KVTransferConfig, KVTransferParams, FinishReason, SchedulerOutput } from './contracts.js';
import type { KvDtype } from './dtype.js';
import type { KVDeviceMode } from '@kvconnect/transfer';
import { EngineMetrics } from './metrics.js';
import { InProcessExecutor, type Executor, type ExecutorKind } from './executor.js';
import { roundTrip } from './ipc.js';
import { MultiProcessExecutor } from './multiprocess-executor.js';
import { attnLayerName, indexerLayerName, mambaLayerName, resolveModel, validateModel, type ModelConfig, type PresetName } from './model/config.js';
import { buildWeights, type ModelWeights } from './model/weights.js';
import { Request, type SamplingParams } from './request.js';
import { Scheduler, type StepPlan } from './scheduler.js';
import { ByteTokenizer } from './tokenizer.js';
import { Worker, type CacheLayout, type WorkerOptions } from './worker.js';
import { WorkerRuntime } from './worker-runtime.js';

/** Options of an {@link Engine}. */
export interface EngineOptions {
  /** A preset name or a model config (or give {@link preset}). */
  model?: PresetName | ModelConfig;
  /** A preset name (alternative to {@link model}). */
  preset?: PresetName;
  /** TP ranks per PP stage (default 1). */
  tpSize?: number;
  /** PP stages (default 1). */
  ppSize?: number;
  /** Tokens per KV block (default 16). */
  blockSize?: number;
  /** Blocks in the pool, shared by every KV cache group (default 512). */
  numBlocks?: number;
  /** Physical layout of the paged attention caches (default NHD, kv-first). */
  cacheLayout?: CacheLayout;
  /** KV cache element type (default bfloat16). Mamba conv states use it too. */
  kvDtype?: KvDtype;
  /** Mamba SSM state type (default float32). */
  ssmDtype?: KvDtype;
  /**
   * Where the KV cache lives (default `cpu`): `cuda` allocates it in GPU memory through the native
   * addon (built with CUDA), `cuda-emulated` in the emulated device memory of @kvconnect/transfer
   * (CI). The model computes on the host from a mirror; connectors and checksums see the device
   * memory (worker.ts, device mode).
   */
  device?: KVDeviceMode;
  /** CUDA device ordinal of the KV cache with `device` `cuda` (default 0). */
  deviceId?: number;
  /** Token budget per step (default 256; smaller values chunk prefills). */
  maxNumBatchedTokens?: number;
  /** Most running requests (default 256). */
  maxNumSeqs?: number;
  /**
   * Most prompt tokens one request gets in a step (vLLM's `long_prefill_token_threshold`; see
   * `SchedulerOptions.longPrefillTokenThreshold` in `scheduler.ts`): default a quarter of
   * `maxNumBatchedTokens` (at least 1), so a long prompt cannot take a whole step from other requests;
   * 0 = no cap.
   */
  longPrefillTokenThreshold?: number;
  /** vLLM `kv_transfer_config` (raw; validated by `parseKVTransferConfig`). */
  kvTransferConfig?: unknown;
  /** Prefix caching (default true). */
  enablePrefixCaching?: boolean;
  /** The engine id connectors use to name this engine (default `kv_transfer_config.engine_id`, else a random one). */
  engineId?: string;
  /** The model name on the engine's metrics (vLLM's `model_name` label; default the model's name). */
  servedModelName?: string;
  /** Where `kv_connector` is looked up (default the core's `defaultRegistry`). */
  registry?: KVConnectorRegistry;
  /**
   * KV checksum backend of the workers (default `auto`): a host backend for host KV, `cuda` for
   * KV in GPU memory, `cuda-emulated` or an `EmulatedDevice` (tests: the device path without a GPU;
   * see checksum-device.ts).
   */
  checksumBackend?: EngineChecksumBackend;
  /** How long device sums in flight may take before a request goes on without them, ms (KVChecksumScheduler `inFlightTimeoutMs`). */
  checksumInFlightTimeoutMs?: number;
  /** Events, metrics and logs of the KV checksums (default: a new one, log level `warn`). */
  observability?: KVChecksumObservability;
  /**
   * Where the workers run (default `inprocess`): objects in this process, or `processes`, one
   * worker process per TP rank x PP stage (multiprocess-executor.ts). With `processes` the workers
   * create their connector halves from the process-wide registry after importing
   * {@link workerImports} (and `kv_connector_module_path`), so `registry` must be left out and
   * `checksumBackend` must be a name.
   */
  executor?: ExecutorKind;
  /** `processes`: modules each worker process imports first (connector packages that register on import). */
  workerImports?: readonly string[];
  /**
   * In process: send every value that crosses between a connector's halves through the IPC
   * serializer's round trip and reject data that is not plain, as worker processes would (default true).
   */
  checkPlainData?: boolean;
}

/** What {@link Engine.generate} resolves to. */
export interface GenerateResult {
  requestId: string;
  /** Generated token ids. */
  tokenIds: number[];
  /** Generated text (byte-level tokenizer). */
  text: string;
  finishReason: FinishReason;
  /** Params the connector (and checksum scheduler) returned: producer side of P/D. */
  kvTransferParams?: KVTransferParams;
  /** Why the request ended with `error`. */
  error?: string;
  /** Times the request was preempted. */
  numPreemptions: number;
}

/** What one {@link Engine.step} did. */
export interface StepResult {
  stepId: number;
  /** Tokens scheduled per request. */
  numScheduledTokens: ReadonlyMap<string, number>;
  /** Requests that finished in this step. */
  finished: GenerateResult[];
  preempted: string[];
}

interface Pending {
  resolve: (r: GenerateResult) => void;
  reject: (e: unknown) => void;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
const yieldTurn = () => new Promise<void>((r) => setImmediate(r));

/**
 * A serving engine. Construct it, then `generate()` (which drives the step loop) or `addRequest()`
 * and `step()` by hand. Async setup (connector module import, `registerKvCaches`) completes before
 * the first step ({@link ready}).
 */
export class Engine {
  readonly engineId: string;
  readonly model: ModelConfig;
  readonly tpSize: number;
  readonly ppSize: number;
  readonly blockSize: number;
  readonly tokenizer = new ByteTokenizer();
  /** KV cache groups: full attention, then sliding window, then state (only those the model has). */
  readonly groupConfigs: KVCacheGroupConfig[];
  /** `workers[ppRank][tpRank]` (in-process executor; empty when the workers run in their own processes). */
  readonly workers: Worker[][];
  /** Where the workers run. */
  readonly executorKind: ExecutorKind;
  readonly transferConfig: KVTransferConfig | null;
  /** Resolves when setup finished; rejects with the setup error. */
  readonly ready: Promise<void>;
  /** Events, metrics and logs of KV checksums (present with a transfer config). */
  readonly observability: KVChecksumObservability | null;
  /**
   * The engine's Prometheus registry: the engine metrics (vLLM's names, metrics.ts), and with a
   * transfer config the KV checksum and connector metrics (the observability's registry).
   */
  readonly metricsRegistry: Registry;
  private readonly engineMetrics: EngineMetrics;
  private readonly weights: ModelWeights;
  private readonly o: EngineOptions;
  private readonly executor: Executor;
  private _failure: Error | null = null;
  private _scheduler: Scheduler | null = null;
  private connector: KVConnectorScheduler | null = null;
  private checksumScheduler: KVChecksumScheduler | null = null;
  private readonly pending = new Map<string, Pending>();
  private nextId = 0;
  private looping = false;
  private stepping = false;
  private steps = 0;
  private closed = false;

  constructor(o: EngineOptions) {
    this.o = o;
    const model = o.model ?? o.preset;
    if (model === undefined) throw new RangeError('EngineOptions needs a model (preset name or config)');
    this.model = resolveModel(model);
    this.tpSize = o.tpSize ?? 1;
    this.ppSize = o.ppSize ?? 1;
    this.blockSize = o.blockSize ?? 16;
    validateModel(this.model, this.tpSize, this.ppSize);
    this.transferConfig = o.kvTransferConfig === undefined || o.kvTransferConfig === null ? null : parseKVTransferConfig(o.kvTransferConfig);
    this.engineId = o.engineId ?? this.transferConfig?.engine_id ?? `engine-${Math.random().toString(36).slice(2, 10)}`;
    this.observability = this.transferConfig ? (o.observability ?? new KVChecksumObservability({ level: 'warn', bindings: { engine: this.engineId, role: this.transferConfig.kv_role } })) : null;
    for (const key of this.transferConfig ? ignoredTransferConfigKeys(this.transferConfig) : []) {
      this.observability?.logger.debug({ key }, `kv_transfer_config.${key} has no meaning in kvconnect: ignored`);
    }
    this.metricsRegistry = this.observability?.registry ?? new Registry();
    this.engineMetrics = new EngineMetrics(this.metricsRegistry, { modelName: o.servedModelName ?? this.model.name, engine: this.engineId }, {
      queues: () => {
        const s = this._scheduler;
        return s ? { running: s.running.length, waiting: s.waiting.length, kvUsage: s.kv.usage, preemptions: s.stats.preemptions, prefixQueriedTokens: s.kv.stats.queriedTokens, prefixHitTokens: s.kv.stats.hitTokens } : null;
      },
    });
    this.groupConfigs = buildGroupConfigs(this.model, this.blockSize);
    this.weights = buildWeights(this.model);
    const numBlocks = o.numBlocks ?? 512;
    const workerOptions: WorkerOptions[][] = [];
    for (let pp = 0; pp < this.ppSize; pp++) {
      const stage: WorkerOptions[] = [];
      for (let tp = 0; tp < this.tpSize; tp++) {
        stage.push({
          model: this.model,
          tpRank: tp,
          tpSize: this.tpSize,
          ppRank: pp,
          ppSize: this.ppSize,
          numBlocks,
          blockSize: this.blockSize,
          cacheLayout: o.cacheLayout ?? { layout: 'NHD', kvLayout: 'kv-first' },
          kvDtype: o.kvDtype ?? 'bfloat16',
          ssmDtype: o.ssmDtype,
          groupConfigs: this.groupConfigs,
          device: o.device ?? 'cpu',
          deviceId: o.deviceId,
        });
      }
      workerOptions.push(stage);
    }
    this.executorKind = o.executor ?? 'inprocess';
    if (this.executorKind === 'processes') {
      if (o.registry !== undefined && o.registry !== defaultRegistry) throw new RangeError("executor 'processes': worker processes create connector halves from the process-wide registry (workerImports, kv_connector_module_path); a custom registry cannot cross processes");
      if (typeof o.checksumBackend === 'object') throw new RangeError("executor 'processes': checksumBackend must be a backend name (an object cannot cross processes)");
      this.workers = [];
      this.executor = new MultiProcessExecutor({ model: this.model, weights: this.weights, workers: workerOptions, imports: o.workerImports, checksumBackend: o.checksumBackend as BackendName | 'auto' | undefined });
    } else if (this.executorKind === 'inprocess') {
      this.workers = workerOptions.map((stage) => stage.map((wo) => new Worker(wo)));
      if (this.transferConfig?.enable_kv_checksum) checkChecksumBackend(o.checksumBackend ?? 'auto', this.workers[0][0].kvCaches(), this.workers[0][0].checksumKvCaches());
      const env = { registry: o.registry ?? defaultRegistry, metricsRegistry: this.observability?.registry, checksumBackend: o.checksumBackend, logger: this.observability?.logger };
      const runtimes = this.workers.map((stage) => stage.map((w) => new WorkerRuntime(w, this.weights, env)));
      this.executor = new InProcessExecutor(this.model, this.weights, runtimes, o.checkPlainData === false ? <T>(v: T) => v : roundTrip);
    } else {
      throw new RangeError(`unknown executor ${JSON.stringify(this.executorKind)} (known: inprocess, processes)`);
    }
    this.executor.onFailure((e) => this.onExecutorFailure(e));
    this.ready = this.setup(numBlocks);
    this.ready.catch(() => {});
  }

  private async setup(numBlocks: number): Promise<void> {
    const cfg = this.transferConfig;
    const registry = this.o.registry ?? defaultRegistry;
    if (cfg) {
      await registry.prepare(cfg);
      this.connector = registry.createScheduler(cfg, { engineId: this.engineId, tpSize: this.tpSize, ppSize: this.ppSize, groupConfigs: this.groupConfigs, metricsRegistry: this.observability?.registry, logger: this.observability?.logger.child({ half: 'scheduler' }) });
      if (cfg.enable_kv_checksum) {
        this.checksumScheduler = new KVChecksumScheduler({
          config: cfg,
          connector: this.connector,
          tpSize: this.tpSize,
          ppSize: this.ppSize,
          groupConfigs: this.groupConfigs,
          observability: this.observability!,
          carriers: registry.get(cfg.kv_connector).kvChecksumCarriers?.(cfg),
          inFlightTimeoutMs: this.o.checksumInFlightTimeoutMs,
        });
      }
    }
    const handshake = await this.executor.start({ engineId: this.engineId, transferConfig: cfg, checksum: this.checksumScheduler?.enabled ?? false });
    if (this.connector?.setXferHandshakeMetadata) await this.connector.setXferHandshakeMetadata(handshake);
    this._scheduler = new Scheduler({
      groupConfigs: this.groupConfigs,
      blockSize: this.blockSize,
      numBlocks,
      maxNumBatchedTokens: this.o.maxNumBatchedTokens ?? 256,
      maxNumSeqs: this.o.maxNumSeqs,
      longPrefillTokenThreshold: this.o.longPrefillTokenThreshold ?? Math.max(1, Math.floor((this.o.maxNumBatchedTokens ?? 256) / 4)),
      enablePrefixCaching: this.o.enablePrefixCaching ?? true,
      worldSize: this.tpSize * this.ppSize,
      eosTokenId: this.model.eosTokenId,
      connector: this.connector,
      checksum: this.checksumScheduler,
      loadFailurePolicy: cfg?.kv_load_failure_policy,
      warn: (msg, fields) => this.observability?.logger.warn({ engineId: this.engineId, ...fields }, msg),
      onLoadOutcome: (e) => this.observability?.events.emit('load-outcome', e),
      onFinished: (r) => this.settle(r),
    });
  }

  /** The scheduler (after {@link ready}). */
  get scheduler(): Scheduler {
    if (!this._scheduler) throw new Error('engine not ready (await engine.ready)');
    return this._scheduler;
  }

  /** The connector's scheduler half (after {@link ready}; null without a transfer config). */
  get kvConnectorScheduler(): KVConnectorScheduler | null {
    return this.connector;
  }

  /** The KV checksum scheduler, when checksums are on. */
  get kvChecksumScheduler(): KVChecksumScheduler | null {
    return this.checksumScheduler;
  }

  /** Prometheus metrics of the KV checksum scheduler (loads by verdict, recomputed, failed, ...). */
  get checksumMetrics(): KVChecksumMetrics | null {
    return this.observability?.metrics ?? null;
  }

  /**
   * The engine's Prometheus metrics in text format: the engine metrics (vLLM's names), the checksum
   * and connector scheduler metrics of its registry and, with worker processes, every worker's
   * registry (connector worker halves), aggregated with prom-client's `AggregatorRegistry` (same
   * name and labels: summed).
   */
  async metricsText(): Promise<string> {
    const reg = this.metricsRegistry;
    const workers = this.executor.kind === 'processes' ? await this.executor.workerMetrics() : [];
    if (workers.length === 0) return reg.metrics();
    const own = await reg.getMetricsAsJSON();
    return AggregatorRegistry.aggregate([own, ...workers] as MetricObjectWithValues<MetricValue<string>>[][]).metrics();
  }

  /**
   * Why this engine cannot serve any more (a worker process died: `worker pp0/tp1 exited (signal
   * SIGKILL)`), or null. Every pending request was rejected with it; new ones are too.
   */
  get failure(): Error | null {
    return this._failure;
  }

  /** The worker processes' pids `[pp][tp]` (`processes` executor, after {@link ready}; else []). */
  get workerPids(): number[][] {
    return this.executor instanceof MultiProcessExecutor ? this.executor.pids : [];
  }

  private onExecutorFailure(e: Error): void {
    if (this._failure) return;
    this._failure = e;
    this.observability?.logger.error({ engineId: this.engineId, err: e.message }, 'engine failed: a worker process is gone');
    for (const p of this.pending.values()) p.reject(e);
    this.pending.clear();
  }

  /** Engine-side counters: steps, preemptions, loads used / recomputed / failed, prefix cache. */
  get stats(): Scheduler['stats'] & { prefixCache: { queries: number; queriedTokens: number; hitTokens: number }; kvUsage: number } {
    const s = this.scheduler;
    return { ...s.stats, prefixCache: { ...s.kv.stats }, kvUsage: s.kv.usage };
  }

  /**
   * Queues a request (text is tokenized with BOS first).
   * @returns the request id.
   */
  async addRequest(prompt: string | readonly number[], sampling: SamplingParams = {}, kvTransferParams?: KVTransferParams, requestId?: string): Promise<string> {
    await this.ready;
    if (this._failure) throw this._failure;
    const ids = typeof prompt === 'string' ? this.tokenizer.encode(prompt) : prompt;
    const id = requestId ?? `${this.engineId}-req-${this.nextId++}`;
    this.engineMetrics.requestArrived(id, performance.now());
    this.scheduler.addRequest(new Request(id, ids, sampling, kvTransferParams ? { ...kvTransferParams } : undefined, this.steps));
    return id;
  }

  /**
   * Generates for one prompt, driving the step loop until the request finishes.
   * @param kvTransferParams `kv_transfer_params` (e.g. `{ do_remote_decode: true }` on a producer).
   */
  async generate(prompt: string | readonly number[], sampling: SamplingParams = {}, kvTransferParams?: KVTransferParams, requestId?: string): Promise<GenerateResult> {
    const id = await this.addRequest(prompt, sampling, kvTransferParams, requestId);
    const p = new Promise<GenerateResult>((resolve, reject) => this.pending.set(id, { resolve, reject }));
    void this.runLoop();
    return p;
  }

  /** Aborts a request (it resolves with finishReason `abort`). @returns false if unknown or finished. */
  abort(requestId: string): boolean {
    const ok = this._scheduler?.abort(requestId) ?? false;
    if (ok) void this.runLoop();
    return ok;
  }

  private settle(r: Request): void {
    this.engineMetrics.requestFinished(r.requestId, performance.now(), r.finishReason ?? 'error', r.promptTokenIds.length, r.outputTokenIds.length);
    const p = this.pending.get(r.requestId);
    this.pending.delete(r.requestId);
    p?.resolve(this.resultOf(r));
  }

  private resultOf(r: Request): GenerateResult {
    return {
      requestId: r.requestId,
      tokenIds: r.outputTokenIds.slice(),
      text: this.tokenizer.decode(r.outputTokenIds),
      finishReason: r.finishReason!,
      kvTransferParams: r.outputKvTransferParams,
      error: r.error,
      numPreemptions: r.numPreemptions,
    };
  }

  /**
   * Steps while there is work, yielding to the event loop between steps (so async transfers
   * complete); polls every millisecond while only transfers are pending.
   */
  private async runLoop(): Promise<void> {
    if (this.looping) return;
    this.looping = true;
    try {
      await this.ready;
      while (!this.closed && this.scheduler.hasWork()) {
        await this.step();
        if (this.scheduler.onlyWaitingForTransfers()) await sleep(1);
        else await yieldTurn();
      }
    } catch (e) {
      for (const p of this.pending.values()) p.reject(e);
      this.pending.clear();
    } finally {
      this.looping = false;
    }
  }

  /**
   * One engine step:
   * 1. scheduler: `schedule()` (connector and checksum scheduler hooks);
   * 2. every worker: `connector.bindConnectorMetadata`, `checksum.bindStepMeta`, `connector.startLoadKv`;
   * 3. the forward pass, PP stages in order (`waitForLayerLoad` / `saveKvLayer` per layer);
   * 4. every worker: `connector.waitForSave`, `checksum.afterForward`, `connector.getTransferResults`,
   *    `checksum.afterTransferResults`, `connector.clearConnectorMetadata`, then its
   *    {@link KVConnectorOutput} with `checksum.takeReport()`;
   * 5. sampling, then the scheduler's `updateFromOutput` (finishes, frees, transfers).
   */
  async step(): Promise<StepResult> {
    await this.ready;
    if (this.stepping) throw new Error('step() is not reentrant');
    this.stepping = true;
    try {
      this.steps++;
      const sched = this.scheduler;
      if (this._failure) throw this._failure;
      const plan = sched.schedule();
      const out = await this.runWorkers(plan);
      const sampled = new Map<string, number>();
      for (const s of plan.segments) {
        const logits = out.logits.get(s.request.requestId);
        if (logits) sampled.set(s.request.requestId, s.request.sample(logits));
      }
      const finished = sched.updateFromOutput(plan, sampled, out.outputs);
      const now = performance.now();
      for (const id of sampled.keys()) this.engineMetrics.firstToken(id, now);
      return { stepId: plan.stepId, numScheduledTokens: plan.numScheduledTokens, finished: finished.map((r) => this.resultOf(r)), preempted: plan.preempted };
    } finally {
      this.stepping = false;
    }
  }

  private runWorkers(plan: StepPlan): Promise<{ logits: Map<string, Float32Array>; outputs: KVConnectorOutput[] }> {
    const view: SchedulerOutput = {
      stepId: plan.stepId,
      numScheduledTokens: plan.numScheduledTokens,
      finishedRequestIds: plan.finishedRequestIds,
      kvConnectorMetadata: plan.kvConnectorMetadata,
      kvChecksumMetadata: plan.kvChecksumMetadata,
    };
    const segments = plan.segments.map((s) => ({
      requestId: s.request.requestId,
      start: s.start,
      tokenIds: s.tokenIds,
      blocks: s.blocks,
      cacheFilled: s.cacheFilled,
      needLogits: s.needLogits,
    }));
    return this.executor.execute({ schedulerOutput: view, segments });
  }

  /**
   * Stops the loop and shuts the connector halves down (and the worker processes). Pending
   * requests stay unresolved.
   */
  async shutdown(): Promise<void> {
    this.closed = true;
    await this.ready.catch(() => {});
    await this.connector?.shutdown?.();
    await this.executor.shutdown();
  }
}

/** The KV cache groups of a model: full attention (attention + MLA layers), sliding window, state. */
export function buildGroupConfigs(m: ModelConfig, blockSize: number): KVCacheGroupConfig[] {
  const groups: KVCacheGroupConfig[] = [];
  const full: string[] = [];
  const sliding: string[] = [];
  const state: string[] = [];
  m.layerTypes.forEach((t, i) => {
    if (t === 'attention') full.push(attnLayerName(i));
    else if (t === 'mla') {
      full.push(attnLayerName(i));
      if ((m.mla?.indexerDim ?? 0) > 0) full.push(indexerLayerName(i));
    } else if (t === 'sliding') sliding.push(attnLayerName(i));
    else state.push(mambaLayerName(i));
  });
  if (full.length) groups.push({ groupId: groups.length, kind: 'full-attention', blockSize, layerNames: full });
  if (sliding.length) groups.push({ groupId: groups.length, kind: 'sliding-window', blockSize, layerNames: sliding, slidingWindow: m.slidingWindow });
  if (state.length) groups.push({ groupId: groups.length, kind: 'state', blockSize, layerNames: state });
  return groups;
}

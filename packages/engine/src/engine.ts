/**
 * The engine: a request front end, the {@link Scheduler}, TP x PP {@link Worker}s running a small
 * real transformer, and the KV connector and KV checksum hooks at the points `@kvconnect/core`'s
 * contracts fix (see `scheduler.ts` for the scheduler half; {@link Engine.step} for the workers').
 * @module
 */
import {
  KVChecksumObservability,
  KVChecksumScheduler,
  KVChecksumWorker,
  defaultRegistry,
  parseKVTransferConfig,
  type KVChecksumMetrics,
  type KVConnectorRegistry,
} from '@kvconnect/core';
import type { BackendName, ChecksumBackend } from '@kvconnect/checksum';
import type { KVCacheGroupConfig, KVConnectorOutput, KVConnectorScheduler, KVTransferConfig, KVTransferParams, FinishReason, SchedulerOutput } from './contracts.js';
import type { KvDtype } from './dtype.js';
import { forward } from './executor.js';
import { attnLayerName, indexerLayerName, mambaLayerName, resolveModel, validateModel, type ModelConfig, type PresetName } from './model/config.js';
import { buildWeights, type ModelWeights } from './model/weights.js';
import { Request, type SamplingParams } from './request.js';
import { Scheduler, type StepPlan } from './scheduler.js';
import { ByteTokenizer } from './tokenizer.js';
import { Worker, type CacheLayout } from './worker.js';

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
  /** The engine id connectors use to name this engine (default a random one). */
  engineId?: string;
  /** Where `kv_connector` is looked up (default the core's `defaultRegistry`). */
  registry?: KVConnectorRegistry;
  /** KV checksum backend of the workers (default `auto`). */
  checksumBackend?: BackendName | 'auto' | ChecksumBackend;
  /** Events, metrics and logs of the KV checksums (default: a new one, log level `warn`). */
  observability?: KVChecksumObservability;
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
  /** `workers[ppRank][tpRank]`. */
  readonly workers: Worker[][];
  readonly transferConfig: KVTransferConfig | null;
  /** Resolves when setup finished; rejects with the setup error. */
  readonly ready: Promise<void>;
  /** Events, metrics and logs of KV checksums (present with a transfer config). */
  readonly observability: KVChecksumObservability | null;
  private readonly weights: ModelWeights;
  private readonly o: EngineOptions;
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
    this.engineId = o.engineId ?? `engine-${Math.random().toString(36).slice(2, 10)}`;
    this.transferConfig = o.kvTransferConfig === undefined || o.kvTransferConfig === null ? null : parseKVTransferConfig(o.kvTransferConfig);
    this.observability = this.transferConfig ? (o.observability ?? new KVChecksumObservability({ level: 'warn' })) : null;
    this.groupConfigs = buildGroupConfigs(this.model, this.blockSize);
    this.weights = buildWeights(this.model);
    const numBlocks = o.numBlocks ?? 512;
    this.workers = [];
    for (let pp = 0; pp < this.ppSize; pp++) {
      const stage: Worker[] = [];
      for (let tp = 0; tp < this.tpSize; tp++) {
        stage.push(
          new Worker({
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
          }),
        );
      }
      this.workers.push(stage);
    }
    this.ready = this.setup(numBlocks);
    this.ready.catch(() => {});
  }

  private async setup(numBlocks: number): Promise<void> {
    const cfg = this.transferConfig;
    const registry = this.o.registry ?? defaultRegistry;
    if (cfg) {
      await registry.prepare(cfg);
      this.connector = registry.createScheduler(cfg, { engineId: this.engineId, tpSize: this.tpSize, ppSize: this.ppSize, groupConfigs: this.groupConfigs, metricsRegistry: this.observability?.registry });
      if (cfg.enable_kv_checksum) {
        this.checksumScheduler = new KVChecksumScheduler({
          config: cfg,
          connector: this.connector,
          tpSize: this.tpSize,
          ppSize: this.ppSize,
          groupConfigs: this.groupConfigs,
          observability: this.observability!,
          carriers: registry.get(cfg.kv_connector).kvChecksumCarriers?.(cfg),
        });
      }
      for (const w of this.workers.flat()) {
        w.connector = registry.createWorker(cfg, { engineId: this.engineId, tpRank: w.tpRank, tpSize: this.tpSize, ppRank: w.ppRank, ppSize: this.ppSize, metricsRegistry: this.observability?.registry });
        await w.connector.registerKvCaches(w.kvCaches());
        if (this.checksumScheduler?.enabled) {
          const ck = new KVChecksumWorker({ config: cfg, backend: this.o.checksumBackend ?? 'auto' });
          ck.registerKvCaches(w.kvCaches());
          w.checksum = ck;
        }
      }
    }
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

  /** The KV checksum scheduler, when checksums are on. */
  get kvChecksumScheduler(): KVChecksumScheduler | null {
    return this.checksumScheduler;
  }

  /** Prometheus metrics of the KV checksum scheduler (loads by verdict, recomputed, failed, ...). */
  get checksumMetrics(): KVChecksumMetrics | null {
    return this.observability?.metrics ?? null;
  }

  /** The checksum metrics in Prometheus text format ('' without a transfer config). */
  async metricsText(): Promise<string> {
    return this.observability ? this.observability.registry.metrics() : '';
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
    const ids = typeof prompt === 'string' ? this.tokenizer.encode(prompt) : prompt;
    const id = requestId ?? `${this.engineId}-req-${this.nextId++}`;
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
      const plan = sched.schedule();
      const out = this.runWorkers(plan);
      const sampled = new Map<string, number>();
      for (const s of plan.segments) {
        const logits = out.logits.get(s.request.requestId);
        if (logits) sampled.set(s.request.requestId, s.request.sample(logits));
      }
      const finished = sched.updateFromOutput(plan, sampled, out.outputs);
      return { stepId: plan.stepId, numScheduledTokens: plan.numScheduledTokens, finished: finished.map((r) => this.resultOf(r)), preempted: plan.preempted };
    } finally {
      this.stepping = false;
    }
  }

  private runWorkers(plan: StepPlan): { logits: Map<string, Float32Array>; outputs: KVConnectorOutput[] } {
    const view: SchedulerOutput = {
      stepId: plan.stepId,
      numScheduledTokens: plan.numScheduledTokens,
      finishedRequestIds: plan.finishedRequestIds,
      kvConnectorMetadata: plan.kvConnectorMetadata,
      kvChecksumMetadata: plan.kvChecksumMetadata,
    };
    const all = this.workers.flat();
    for (const w of all) {
      w.connector?.bindConnectorMetadata(plan.kvConnectorMetadata);
      w.checksum?.bindStepMeta(plan.kvChecksumMetadata);
      w.connector?.startLoadKv(view);
    }
    const segs = plan.segments.map((s) => ({
      requestId: s.request.requestId,
      start: s.start,
      tokenIds: s.tokenIds,
      blocks: s.blocks,
      cacheFilled: s.cacheFilled,
      needLogits: s.needLogits,
    }));
    const logits = segs.length > 0 ? forward(this.model, this.weights, this.workers, segs) : new Map<string, Float32Array>();
    const outputs: KVConnectorOutput[] = [];
    for (const w of all) {
      w.connector?.waitForSave?.();
      w.checksum?.afterForward();
      const res = w.connector?.getTransferResults() ?? { finishedSending: new Set<string>(), finishedRecving: new Set<string>(), invalidBlockIds: new Set<number>(), kvChecksums: new Map<string, Uint8Array>() };
      w.checksum?.afterTransferResults(res);
      w.connector?.clearConnectorMetadata();
      outputs.push({
        ppRank: w.ppRank,
        tpRank: w.tpRank,
        finishedSending: res.finishedSending,
        finishedRecving: res.finishedRecving,
        invalidBlockIds: res.invalidBlockIds,
        kvChecksums: res.kvChecksums,
        kvChecksumReport: w.checksum?.takeReport(),
        ...(res.workerMeta !== undefined ? { kvConnectorWorkerMeta: res.workerMeta } : {}),
      });
    }
    return { logits, outputs };
  }

  /**
   * Stops the loop and shuts the connector halves down. Pending requests stay unresolved.
   */
  async shutdown(): Promise<void> {
    this.closed = true;
    await this.ready.catch(() => {});
    await this.connector?.shutdown?.();
    for (const w of this.workers.flat()) await w.connector?.shutdown?.();
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

/**
 * The model executor: runs a step's forward pass through the PP stages in order and, inside a
 * stage, through its TP workers. Each worker computes its heads/channels of a mixer into a shared
 * buffer in global order (the all-gather); projections after the gather (o_proj, MLP, final norm,
 * LM head) see the whole vector, so no partial sums are reduced and the numerics equal TP 1.
 *
 * The dense parts of the model (embedding, norms, projections after the gather, MLP, LM head) run
 * in the engine process, in {@link forwardSteps}; only the mixers run in the workers, against the
 * workers' own KV cache memory. An {@link Executor} decides where the workers are:
 * - {@link InProcessExecutor}: worker objects in the engine's process (the default; unit tests).
 *   Every value that crosses between a connector's halves (the step's {@link SchedulerOutput}, each
 *   worker's {@link KVConnectorOutput}, the handshake metadata) goes through the IPC serializer's
 *   round trip (`ipc.ts`), so non-plain data fails here as it would across processes.
 * - `MultiProcessExecutor` (`multiprocess-executor.ts`): one worker process per (TP rank, PP stage).
 *
 * Either way the float operations and their order are the same (the workers run the same
 * {@link runMixer} on the same inputs), so outputs do not depend on the executor.
 * @module
 */
import type { HandshakeMetadataByWorker, KVConnectorOutput, KVTransferConfig, SchedulerOutput } from './contracts.js';
import { stageLayers, type ModelConfig } from './model/config.js';
import { dotRow, matVec, rmsNorm, silu, type LayerWeights, type Mamba2Weights, type MlpWeights, type ModelWeights } from './model/weights.js';
import type { ForwardSegment, Worker } from './worker.js';
import { nativeForward } from './model/native-forward.js';
import type { WorkerRuntime } from './worker-runtime.js';

/** Where an engine's workers run: in its process, or one process per TP rank x PP stage. */
export type ExecutorKind = 'inprocess' | 'processes';

/**
 * One mixer a stage's workers compute: layer `layer` of PP stage `stage`, from the normalized hidden
 * states `hn` (`[T, hiddenSize]`, float32) into `out` (`[T, width]`, zeros; width from
 * {@link mixerWidth}). Each TP worker fills its columns ({@link mixerColumns}) of every row.
 */
export interface MixerCall {
  stage: number;
  layer: number;
  hn: Float32Array;
  out: Float32Array;
}

/** Row width of the gathered output of layer `li`'s mixer: query heads x head (value) size, or Mamba2's inner size. */
export function mixerWidth(m: ModelConfig, li: number): number {
  const t = m.layerTypes[li];
  if (t === 'attention' || t === 'sliding') return m.numHeads * m.headDim;
  if (t === 'mla') return m.numHeads * m.mla!.vDim;
  return m.mamba!.numHeads * m.mamba!.headDim;
}

/**
 * The columns `[start, start + count)` of each gathered row that TP rank `tpRank` of `tpSize` writes
 * for layer `li` (its query heads, as `Worker.queryHeads`, or its Mamba2 heads' channels): disjoint
 * over the ranks, covering the row.
 */
export function mixerColumns(m: ModelConfig, li: number, tpRank: number, tpSize: number): { start: number; count: number } {
  const t = m.layerTypes[li];
  const per = t === 'mamba2' ? m.mamba!.headDim : t === 'mla' ? m.mla!.vDim : m.headDim;
  const heads = (t === 'mamba2' ? m.mamba!.numHeads : m.numHeads) / tpSize;
  return { start: tpRank * heads * per, count: heads * per };
}

/**
 * The forward pass of `segs` as a generator: it yields one {@link MixerCall} per layer (PP stages
 * in order); the driver fills `call.out` (every TP worker of `call.stage`) before resuming it.
 * Returns the logits (length vocab) of the last token of every segment with `needLogits`, by
 * request id.
 */
export function* forwardSteps(m: ModelConfig, w: ModelWeights, ppSize: number, segs: readonly ForwardSegment[]): Generator<MixerCall, Map<string, Float32Array>, void> {
  const H = m.hiddenSize;
  let T = 0;
  for (const s of segs) T += s.tokenIds.length;
  const h = new Float32Array(T * H);
  let t = 0;
  for (const s of segs) {
    for (const id of s.tokenIds) {
      h.set(w.embed.data.subarray(id * H, (id + 1) * H), t * H);
      t++;
    }
  }
  const hn = new Float32Array(T * H);
  const row = new Float32Array(H);
  let outBuf = new Float32Array(0);
  for (let pp = 0; pp < ppSize; pp++) {
    const [l0, l1] = stageLayers(m.layerTypes.length, ppSize, pp);
    for (let li = l0; li < l1; li++) {
      const lw = w.layers[li];
      const mixer = lw.mixer;
      for (let i = 0; i < T; i++) hn.set(rmsNorm(h, mixer.norm, i * H, row), i * H);
      // One buffer for every layer of this pass (each layer's output is consumed before the next yield).
      const width = mixerWidth(m, li);
      if (outBuf.length < T * width) outBuf = new Float32Array(T * width);
      const gathered = outBuf.subarray(0, T * width).fill(0);
      yield { stage: pp, layer: li, hn, out: gathered };
      const proj = mixer.kind === 'mamba2' ? (mixer as Mamba2Weights).out : mixer.o;
      const nf = nativeForward(); // the same sums on the native kernels (model/native-forward.ts)
      if (nf) nf.fwdMatmul(proj.data, H, proj.cols, gathered, proj.cols, T, h, H, true);
      else for (let i = 0; i < T; i++) {
        for (let r = 0; r < H; r++) h[i * H + r] = Math.fround(h[i * H + r] + dotRow(proj, r, gathered, i * proj.cols));
      }
      mlp(lw.mlp, h, T, H);
    }
  }
  const logits = new Map<string, Float32Array>();
  t = 0;
  for (const s of segs) {
    t += s.tokenIds.length;
    if (!s.needLogits) continue;
    const x = rmsNorm(h, w.finalNorm, (t - 1) * H);
    logits.set(s.requestId, matVec(w.lmHead, x));
  }
  return logits;
}

/**
 * Worker `wk`'s share of layer `li`'s mixer (weights `lw`), with its connector's layer hooks:
 * `waitForLayerLoad(name)` before the layer reads its caches, `saveKvLayer(name)` after it wrote them.
 */
export function runMixer(wk: Worker, li: number, lw: LayerWeights, hn: Float32Array, segs: readonly ForwardSegment[], out: Float32Array): void {
  const names = wk.cacheNames(li);
  const c = wk.connector;
  if (c?.waitForLayerLoad) for (const n of names) c.waitForLayerLoad(n);
  const mixer = lw.mixer;
  if (mixer.kind === 'attention' || mixer.kind === 'sliding') wk.attention(li, mixer, hn, segs, out);
  else if (mixer.kind === 'mla') wk.mla(li, mixer, hn, segs, out);
  else wk.mamba(li, mixer as Mamba2Weights, hn, segs, out);
  if (c?.saveKvLayer) for (const n of names) c.saveKvLayer(n);
}

/**
 * Forward pass of `segs` over in-process `workers[pp][tp]` (see {@link forwardSteps}, {@link runMixer}).
 * @returns logits of the last token of every segment with `needLogits`, by request id.
 */
export function forward(m: ModelConfig, w: ModelWeights, workers: readonly (readonly Worker[])[], segs: readonly ForwardSegment[]): Map<string, Float32Array> {
  const it = forwardSteps(m, w, workers.length, segs);
  for (let r = it.next(); ; r = it.next()) {
    if (r.done) return r.value;
    const call = r.value;
    for (const wk of workers[call.stage]) runMixer(wk, call.layer, w.layers[call.layer], call.hn, segs, call.out);
  }
}

function mlp(w: MlpWeights, h: Float32Array, T: number, H: number): void {
  const I = w.gate.rows;
  const nf = nativeForward(); // the same computation on the native kernels (model/native-forward.ts)
  if (nf) return nf.fwdMlp(h, T, H, w.norm, w.gate.data, w.up.data, w.down.data, I);
  const x = new Float32Array(H);
  const a = new Float32Array(I);
  for (let i = 0; i < T; i++) {
    rmsNorm(h, w.norm, i * H, x);
    for (let r = 0; r < I; r++) a[r] = Math.fround(silu(dotRow(w.gate, r, x)) * dotRow(w.up, r, x));
    for (let r = 0; r < H; r++) h[i * H + r] = Math.fround(h[i * H + r] + dotRow(w.down, r, a));
  }
}

// ---------------------------------------------------------------------------------------------
// Executors
// ---------------------------------------------------------------------------------------------

/** What an {@link Executor} sets its workers up with (after the engine created its scheduler halves). */
export interface ExecutorSetup {
  engineId: string;
  /** The engine's parsed `kv_transfer_config` (null: no connector). */
  transferConfig: KVTransferConfig | null;
  /** Whether the workers run a KV checksum worker (the checksum scheduler is enabled). */
  checksum: boolean;
}

/** One step for the workers: the scheduler output they see and the forward pass's segments. */
export interface StepInput {
  schedulerOutput: SchedulerOutput;
  segments: readonly ForwardSegment[];
}

/** What a step's workers produced: logits of the segments with `needLogits`, and one output per worker (PP-major). */
export interface StepExecution {
  logits: Map<string, Float32Array>;
  outputs: KVConnectorOutput[];
}

/** A worker's Prometheus registry, as prom-client's `Registry.getMetricsAsJSON()` gives it. */
export type WorkerMetricsJSON = unknown[];

/**
 * Runs an engine's workers. The engine calls {@link start} once, then {@link execute} once per step
 * (never two at a time), and {@link shutdown} at the end.
 */
export interface Executor {
  readonly kind: ExecutorKind;
  /**
   * Creates each worker's connector worker half (and KV checksum worker), calls `registerKvCaches`,
   * then `getHandshakeMetadata`.
   * @returns every non-null handshake metadata, keyed by `workerKey(pp, tp)`.
   */
  start(setup: ExecutorSetup): Promise<HandshakeMetadataByWorker<unknown>>;
  /** One step on every worker (connector and checksum hooks in the contract's order, the forward pass). */
  execute(input: StepInput): Promise<StepExecution>;
  /** The metrics of registries the engine's own registry does not hold (worker processes'); [] in process. */
  workerMetrics(): Promise<WorkerMetricsJSON[]>;
  /** Why the executor cannot run steps any more (a worker process died), or null. */
  readonly failure: Error | null;
  /** Calls `listener` once when {@link failure} is set. */
  onFailure(listener: (error: Error) => void): void;
  /** Shuts the connector worker halves down (and stops worker processes). */
  shutdown(): Promise<void>;
}

/**
 * Workers as objects in the engine's process (`workers[pp][tp]`), each with a {@link WorkerRuntime}.
 * Values crossing between a connector's halves take the IPC serializer's round trip when
 * `checkPlainData` is on (the default).
 */
export class InProcessExecutor implements Executor {
  readonly kind = 'inprocess' as const;
  readonly failure: Error | null = null;

  constructor(
    private readonly model: ModelConfig,
    private readonly weights: ModelWeights,
    /** `runtimes[pp][tp]`. */
    private readonly runtimes: readonly (readonly WorkerRuntime[])[],
    private readonly roundTrip: <T>(value: T, path: string) => T,
  ) {}

  async start(setup: ExecutorSetup): Promise<HandshakeMetadataByWorker<unknown>> {
    const out = new Map<string, unknown>();
    for (const rt of this.runtimes.flat()) {
      const h = await rt.setup(setup);
      if (h !== null && h !== undefined) out.set(rt.key, this.roundTrip(h, `worker ${rt.key} handshake metadata`));
    }
    return out;
  }

  execute(input: StepInput): Promise<StepExecution> {
    const all = this.runtimes.flat();
    for (const rt of all) rt.begin(this.roundTrip(input.schedulerOutput, 'SchedulerOutput'), input.segments);
    let logits = new Map<string, Float32Array>();
    if (input.segments.length > 0) {
      const it = forwardSteps(this.model, this.weights, this.runtimes.length, input.segments);
      for (let r = it.next(); ; r = it.next()) {
        if (r.done) {
          logits = r.value;
          break;
        }
        for (const rt of this.runtimes[r.value.stage]) rt.mixer(r.value.layer, r.value.hn, r.value.out);
      }
    }
    const outputs = all.map((rt) => this.roundTrip(rt.end(), `worker ${rt.key} KVConnectorOutput`));
    return Promise.resolve({ logits, outputs });
  }

  workerMetrics(): Promise<WorkerMetricsJSON[]> {
    return Promise.resolve([]);
  }

  onFailure(): void {}

  async shutdown(): Promise<void> {
    for (const rt of this.runtimes.flat()) await rt.shutdown();
  }
}

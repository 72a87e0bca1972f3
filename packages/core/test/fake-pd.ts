/**
 * A tiny P/D rig without an engine: the same logical KV laid into a producer's and a consumer's
 * workers (any TP, PP, block size and layout), fake connectors per carrier, and drivers that call
 * the checksum hooks in engine order (checksum-hooks.ts).
 *
 * Model (4 layer modules, 3 KV cache groups):
 * - group 0 (full attention): `model.layers.{0,1}.self_attn.attn`, 4 global KV heads (sharded by
 *   TP), bf16, head size 4 (cell = K 8 bytes + V 8 bytes);
 * - group 1 (full attention, MLA-like): `model.layers.2.self_attn.mla`, one 16-byte vector per
 *   token, held whole by every TP rank (R = tpSize);
 * - group 2 (state): `model.layers.3.mixer`, conv [8 rows, 3] fp16 + ssm [4 rows, 4] fp32, rows
 *   split by TP (R = 1). The running-state block is the last of the request's list.
 * Layers go to PP stage `layer % ppSize`.
 */
import { pino } from 'pino';
import {
  pagedAttentionBytes,
  pagedAttentionCache,
  vectorCache,
  type AttentionCacheView,
  type CacheView,
  type GroupSpec,
  type StateCacheView,
} from '@kvconnect/checksum';
import type {
  BlockIdsPerGroup,
  ConnectorRequest,
  KVCacheGroupConfig,
  KVChecksumCarrier,
  KVConnectorOutput,
  KVConnectorScheduler,
  KVTransferConfig,
  LoadError,
  MatchedTokens,
  RequestFinishedResult,
  TransferResults,
} from '../src/connector.js';
import type { LoadDecision } from '../src/checksum-hooks.js';
import type { LocalizeOptions } from '../src/checksum-localize.js';
import { KVChecksumScheduler } from '../src/checksum-scheduler.js';
import { KVChecksumWorker } from '../src/checksum-worker.js';
import { encodeReport } from '../src/checksum-report.js';
import { KVChecksumObservability } from '../src/observability.js';

export const HEADS = 4;
export const CELL = 16; // bf16, head size 4: K 8 bytes + V 8 bytes
export const MLA_CELL = 16;
export const CONV = { rows: 8, elems: 3, eb: 2 };
export const SSM = { rows: 4, elems: 4, eb: 4 };
export const NUM_BLOCKS = 16;
export const NUM_STATE_BLOCKS = 4;
export const ATTN_LAYERS = [0, 1];
export const MLA_LAYER = 2;
export const STATE_LAYER = 3;

/** A seeded xorshift32. */
export class Rng {
  private s: number;
  constructor(seed: number) {
    this.s = seed >>> 0 || 0x9e3779b9;
  }
  u32(): number {
    let x = this.s;
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    this.s = x;
    return x;
  }
  fill(b: Uint8Array): Uint8Array {
    for (let i = 0; i < b.length; i++) b[i] = this.u32() & 0xff;
    return b;
  }
  shuffle<T>(xs: T[]): T[] {
    for (let i = xs.length - 1; i > 0; i--) {
      const j = this.u32() % (i + 1);
      [xs[i], xs[j]] = [xs[j], xs[i]];
    }
    return xs;
  }
}

/** The logical KV of one request. */
export interface LogicalKV {
  tokens: number;
  /** attn[layer]: [tokens, HEADS, CELL] */
  attn: Map<number, Uint8Array>;
  /** [tokens, MLA_CELL] */
  mla: Uint8Array;
  /** [CONV.rows, CONV.elems * 2 bytes] */
  conv: Uint8Array;
  /** [SSM.rows, SSM.elems * 4 bytes] */
  ssm: Uint8Array;
}

export function logicalKV(seed: number, tokens: number): LogicalKV {
  const rng = new Rng(seed);
  const attn = new Map<number, Uint8Array>();
  for (const l of ATTN_LAYERS) attn.set(l, rng.fill(new Uint8Array(tokens * HEADS * CELL)));
  return {
    tokens,
    attn,
    mla: rng.fill(new Uint8Array(tokens * MLA_CELL)),
    conv: rng.fill(new Uint8Array(CONV.rows * CONV.elems * CONV.eb)),
    ssm: rng.fill(new Uint8Array(SSM.rows * SSM.elems * SSM.eb)),
  };
}

/** One side's shape. */
export interface SideShape {
  tp: number;
  pp: number;
  blockSize: number;
  layout: 'NHD' | 'HND';
  kvLayout: 'kv-first' | 'block-kv';
}

export function groupConfigs(blockSize: number): KVCacheGroupConfig[] {
  return [
    { groupId: 0, kind: 'full-attention', blockSize, layerNames: ATTN_LAYERS.map((l) => `model.layers.${l}.self_attn.attn`) },
    { groupId: 1, kind: 'full-attention', blockSize, layerNames: [`model.layers.${MLA_LAYER}.self_attn.mla`] },
    { groupId: 2, kind: 'state', blockSize, layerNames: [`model.layers.${STATE_LAYER}.mixer`] },
  ];
}

/** One worker's memory and views. */
export interface FakeWorker {
  ppRank: number;
  tpRank: number;
  region: Uint8Array;
  groups: GroupSpec[];
  hooks: KVChecksumWorker;
}

const onStage = (layer: number, pp: number, stage: number) => layer % pp === stage;

function buildWorker(shape: SideShape, ppRank: number, tpRank: number, seed: number, workerOptions?: ConstructorParameters<typeof KVChecksumWorker>[0]): FakeWorker {
  const localHeads = HEADS / shape.tp;
  const B = shape.blockSize;
  const g0: CacheView[] = [];
  const g1: CacheView[] = [];
  const g2: CacheView[] = [];
  let off = 0;
  for (const l of ATTN_LAYERS) {
    if (!onStage(l, shape.pp, ppRank)) continue;
    const o = { name: `model.layers.${l}.self_attn.attn`, dtype: 'bfloat16' as const, numBlocks: NUM_BLOCKS, blockSize: B, numHeads: localHeads, headSize: 4, layout: shape.layout, kvLayout: shape.kvLayout };
    g0.push(pagedAttentionCache({ ...o, at: { region: 0, offset: off } }));
    off += pagedAttentionBytes(o);
  }
  if (onStage(MLA_LAYER, shape.pp, ppRank)) {
    g1.push(vectorCache({ name: `model.layers.${MLA_LAYER}.self_attn.mla`, dtype: 'bfloat16', numBlocks: NUM_BLOCKS, blockSize: B, width: MLA_CELL / 2, at: { region: 0, offset: off } }));
    off += NUM_BLOCKS * B * MLA_CELL;
  }
  if (onStage(STATE_LAYER, shape.pp, ppRank)) {
    const convRows = CONV.rows / shape.tp;
    const ssmRows = SSM.rows / shape.tp;
    const convBytes = convRows * CONV.elems * CONV.eb;
    const page = convBytes + ssmRows * SSM.elems * SSM.eb + 8; // padding past the states is not covered
    const view: StateCacheView = {
      kind: 'state',
      name: `model.layers.${STATE_LAYER}.mixer`,
      numBlocks: NUM_STATE_BLOCKS,
      states: [
        { dtype: 'float16', shape: [convRows, CONV.elems], region: 0, offset: off, blockStride: page, split: { axis: 0, segments: [[convRows, 1]] } },
        { dtype: 'float32', shape: [ssmRows, SSM.elems], region: 0, offset: off + convBytes, blockStride: page, split: { axis: 0, segments: [[ssmRows, 1]] } },
      ],
    };
    g2.push(view);
    off += NUM_STATE_BLOCKS * page;
  }
  const region = new Rng(seed * 7919 + ppRank * 131 + tpRank + 1).fill(new Uint8Array(off)); // garbage everywhere
  const groups: GroupSpec[] = [
    { groupId: 0, caches: g0 },
    { groupId: 1, caches: g1 },
    { groupId: 2, caches: g2 },
  ];
  const hooks = new KVChecksumWorker(workerOptions ?? { backend: 'auto' });
  hooks.registerKvCaches({ rank: { tpRank, tpSize: shape.tp }, ppRank, ppSize: shape.pp, regions: [region], groups, groupConfigs: groupConfigs(B) });
  return { ppRank, tpRank, region, groups, hooks };
}

export function buildWorkers(shape: SideShape, seed: number, workerOptions?: ConstructorParameters<typeof KVChecksumWorker>[0]): FakeWorker[] {
  const out: FakeWorker[] = [];
  for (let pp = 0; pp < shape.pp; pp++) for (let tp = 0; tp < shape.tp; tp++) out.push(buildWorker(shape, pp, tp, seed, workerOptions));
  return out;
}

/** Byte address of (block, local head h, token t) of a view's first part, byte 0. */
export function cellAddress(view: AttentionCacheView, block: number, h: number, t: number): number {
  const p = view.parts[0];
  const kbt = p.kernelBlockTokens ?? view.blockSize;
  return p.offset + block * p.blockStride + Math.floor(t / kbt) * (p.kernelBlockStride ?? 0) + (t % kbt) * p.tokenStride + h * p.headStride;
}

/** Writes one logical cell (K then V bytes) at (block, local head h, token t) of a view. */
export function writeCell(view: AttentionCacheView, region: Uint8Array, block: number, h: number, t: number, cell: Uint8Array): void {
  let at = 0;
  for (const p of view.parts) {
    const kbt = p.kernelBlockTokens ?? view.blockSize;
    const addr = p.offset + block * p.blockStride + Math.floor(t / kbt) * (p.kernelBlockStride ?? 0) + (t % kbt) * p.tokenStride + h * p.headStride;
    region.set(cell.subarray(at, at + p.bytes), addr);
    at += p.bytes;
  }
}

/**
 * Lays tokens [fromToken, kv.tokens) of the logical KV into a worker's caches at the request's
 * block ids (the "transfer"), and the state rows into the running-state block (last of blocks[2]).
 */
export function layKV(w: FakeWorker, shape: SideShape, kv: LogicalKV, blocks: BlockIdsPerGroup, fromToken = 0): void {
  const B = shape.blockSize;
  for (const c of w.groups[0].caches as AttentionCacheView[]) {
    const layer = Number(c.name.split('.')[2]);
    const data = kv.attn.get(layer)!;
    for (let t = fromToken; t < kv.tokens; t++) {
      for (let h = 0; h < c.localHeads; h++) {
        const g = w.tpRank * c.localHeads + h;
        const at = (t * HEADS + g) * CELL;
        writeCell(c, w.region, blocks[0][Math.floor(t / B)], h, t % B, data.subarray(at, at + CELL));
      }
    }
  }
  for (const c of w.groups[1].caches as AttentionCacheView[]) {
    for (let t = fromToken; t < kv.tokens; t++) writeCell(c, w.region, blocks[1][Math.floor(t / B)], 0, t % B, kv.mla.subarray(t * MLA_CELL, (t + 1) * MLA_CELL));
  }
  for (const c of w.groups[2].caches as StateCacheView[]) {
    const block = blocks[2][blocks[2].length - 1];
    const [conv, ssm] = c.states;
    const cr = conv.shape[0];
    const convRow = CONV.elems * CONV.eb;
    for (let i = 0; i < cr; i++) {
      const g = w.tpRank * cr + i;
      w.region.set(kv.conv.subarray(g * convRow, (g + 1) * convRow), conv.offset + block * conv.blockStride + i * convRow);
    }
    const sr = ssm.shape[0];
    const ssmRow = SSM.elems * SSM.eb;
    for (let i = 0; i < sr; i++) {
      const g = w.tpRank * sr + i;
      w.region.set(kv.ssm.subarray(g * ssmRow, (g + 1) * ssmRow), ssm.offset + block * ssm.blockStride + i * ssmRow);
    }
  }
}

/** Block tables of a request of `tokens` tokens at block size `B` (distinct shuffled ids; state: [scratch, running]). */
export function blockTables(seed: number, tokens: number, B: number): BlockIdsPerGroup {
  const rng = new Rng(seed);
  const n = Math.ceil(tokens / B);
  const ids = () => rng.shuffle([...Array(NUM_BLOCKS).keys()]).slice(0, n);
  const st = rng.shuffle([...Array(NUM_STATE_BLOCKS).keys()]);
  return [ids(), ids(), [st[0], st[1]]];
}

/** A fake connector scheduler with a fixed carrier. */
export class FakeConnector implements KVConnectorScheduler {
  readonly sent = new Map<string, Uint8Array>();
  readonly finished: string[] = [];
  constructor(
    public carrier: KVChecksumCarrier,
    private readonly withSend = true,
  ) {
    if (!withSend) (this as { sendKvChecksums?: unknown }).sendKvChecksums = undefined;
  }
  getNumNewMatchedTokens(): MatchedTokens {
    return { count: 0, loadAsync: false };
  }
  updateStateAfterAlloc(): void {}
  buildConnectorMeta(): unknown {
    return null;
  }
  updateConnectorOutput(): void {}
  requestFinished(request: ConnectorRequest): RequestFinishedResult {
    this.finished.push(request.requestId);
    return { delayFree: true, kvTransferParams: { do_remote_prefill: true, remote_engine_id: 'P0', remote_request_id: request.requestId } };
  }
  kvChecksumCarrier(): KVChecksumCarrier {
    return this.carrier;
  }
  sendKvChecksums?(request: ConnectorRequest, payload: Uint8Array): void {
    this.sent.set(request.requestId, payload);
  }
}

/** A pino logger writing JSON objects into `lines`. */
export function captureLogger(lines: Array<Record<string, unknown>>) {
  return pino({ level: 'debug' }, { write: (s: string) => void lines.push(JSON.parse(s) as Record<string, unknown>) });
}

export function config(over: Partial<KVTransferConfig> = {}): KVTransferConfig {
  return {
    kv_connector: 'Fake',
    kv_role: 'kv_producer',
    enable_kv_checksum: true,
    kv_checksum_fail_closed: false,
    kv_load_failure_policy: 'recompute',
    kv_connector_extra_config: {},
    ...over,
  };
}

function replan(workers: FakeWorker[], shape: SideShape, prepare: (workers: FakeWorker[]) => void): void {
  prepare(workers);
  for (const w of workers) w.hooks.registerKvCaches({ rank: { tpRank: w.tpRank, tpSize: shape.tp }, ppRank: w.ppRank, ppSize: shape.pp, regions: [w.region], groups: w.groups, groupConfigs: groupConfigs(shape.blockSize) });
}

/** A `prepare` that makes the state group's conv state fp8 (SPEC 3: only 2- or 4-byte rows), so every worker skips group 2. */
export function fp8State(workers: FakeWorker[]): void {
  for (const w of workers) for (const c of w.groups[2].caches as StateCacheView[]) (c.states[0] as { dtype: string }).dtype = 'float8_e4m3fn';
}

function emptyResults(): TransferResults {
  return { finishedSending: new Set(), finishedRecving: new Set(), invalidBlockIds: new Set(), kvChecksums: new Map() };
}

function output(w: FakeWorker, results: TransferResults, report: unknown): KVConnectorOutput {
  return { ppRank: w.ppRank, tpRank: w.tpRank, ...results, kvChecksumReport: report };
}

export interface ProducerRun {
  scheduler: KVChecksumScheduler;
  connector: FakeConnector;
  obs: KVChecksumObservability;
  params: Record<string, unknown> | undefined;
  payload: Uint8Array | undefined;
  workers: FakeWorker[];
  logs: Array<Record<string, unknown>>;
}

/** Runs the producer: prompt completes, one step's forward, the request finishes (`length` by default). */
export function runProducer(o: {
  shape: SideShape;
  kv: LogicalKV;
  carrier: KVChecksumCarrier;
  seed?: number;
  requestId?: string;
  reason?: 'stop' | 'length' | 'abort' | 'error';
  dropReportOf?: number;
  connector?: KVConnectorScheduler;
  jsonReports?: boolean;
  /** Changes the workers' views before the run (they are planned again). */
  prepare?: (workers: FakeWorker[]) => void;
  /** The request's prompt (default `0 .. tokens-1`). */
  promptTokenIds?: number[];
  /** Config fields over the defaults (e.g. `kv_checksum_sample_rate`). */
  configOver?: Partial<KVTransferConfig>;
  /** More `kv_transfer_params` of the producer's request (e.g. `kv_checksum_block_sizes`). */
  params?: Record<string, unknown>;
}): ProducerRun {
  const seed = o.seed ?? 1;
  const id = o.requestId ?? 'req-1';
  const logs: Array<Record<string, unknown>> = [];
  const obs = new KVChecksumObservability({ logger: captureLogger(logs) });
  const connector = new FakeConnector(o.carrier);
  const scheduler = new KVChecksumScheduler({ config: config({ kv_role: 'kv_producer', ...o.configOver }), connector: o.connector ?? connector, tpSize: o.shape.tp, ppSize: o.shape.pp, groupConfigs: groupConfigs(o.shape.blockSize), observability: obs });
  const workers = buildWorkers(o.shape, seed);
  if (o.prepare) replan(workers, o.shape, o.prepare);
  const blocks = blockTables(seed + 100, o.kv.tokens, o.shape.blockSize);
  for (const w of workers) layKV(w, o.shape, o.kv, blocks);
  const req: ConnectorRequest = { requestId: id, promptTokenIds: o.promptTokenIds ?? [...Array(o.kv.tokens).keys()], numComputedTokens: 0, numTokens: o.kv.tokens, kvTransferParams: { do_remote_decode: true, ...o.params } };
  scheduler.onPromptComplete(req, blocks, o.kv.tokens);
  const meta = scheduler.buildStepMeta();
  const outputs = workers.map((w, i) => {
    w.hooks.bindStepMeta(meta);
    w.hooks.afterForward();
    const res = emptyResults();
    w.hooks.afterTransferResults(res);
    const rep = w.hooks.takeReport();
    const report = i === o.dropReportOf ? undefined : o.jsonReports && rep ? JSON.parse(JSON.stringify(encodeReport(rep))) : rep;
    return output(w, res, report);
  });
  scheduler.updateFromOutputs(outputs);
  const c = o.connector ?? connector;
  const result = c.requestFinished(req, blocks, o.reason ?? 'length');
  const params = scheduler.onRequestFinished(req, result, o.reason ?? 'length');
  return { scheduler, connector, obs, params, payload: connector.sent.get(id), workers, logs };
}

export interface ConsumerRun {
  decision: LoadDecision;
  scheduler: KVChecksumScheduler;
  obs: KVChecksumObservability;
  workers: FakeWorker[];
  logs: Array<Record<string, unknown>>;
  recvStarts: number[];
  /** The consumer's block ids per group (the load's blocks). */
  blocks: BlockIdsPerGroup;
}

/**
 * Runs the consumer: load scheduled after a local hit of `numLocal` tokens, the connector "moves"
 * the KV (laid from the logical KV, then `corrupt` runs), the load finishes, verification.
 */
export function runConsumer(o: {
  shape: SideShape;
  kv: LogicalKV;
  carrier: KVChecksumCarrier;
  params?: Record<string, unknown>;
  /** Connector-carried copies, delivered by workers in order (first copy wins). */
  connectorPayloads?: Array<Uint8Array | undefined>;
  numLocal?: number;
  failClosed?: boolean;
  policy?: 'fail' | 'recompute';
  seed?: number;
  requestId?: string;
  corrupt?: (workers: FakeWorker[], blocks: BlockIdsPerGroup) => void;
  connector?: KVConnectorScheduler;
  obs?: KVChecksumObservability;
  jsonReports?: boolean;
  /** Changes the workers' views before the run (they are planned again). */
  prepare?: (workers: FakeWorker[]) => void;
  /** The request's prompt (default `0 .. tokens-1`, the producer's default). */
  promptTokenIds?: number[];
  /** The load failed in transit with this cause (passed to `onLoadFinished`). */
  loadError?: LoadError;
  /** Config fields over the defaults (e.g. `kv_checksum_sample_rate`). */
  configOver?: Partial<KVTransferConfig>;
  /** The checksum scheduler's `localize` option. */
  localize?: LocalizeOptions;
}): ConsumerRun {
  const seed = o.seed ?? 2;
  const id = o.requestId ?? 'req-1';
  const numLocal = o.numLocal ?? 0;
  const logs: Array<Record<string, unknown>> = [];
  const obs = o.obs ?? new KVChecksumObservability({ logger: captureLogger(logs) });
  const connector = o.connector ?? new FakeConnector(o.carrier);
  const cfg = config({ kv_role: 'kv_consumer', kv_checksum_fail_closed: o.failClosed ?? false, kv_load_failure_policy: o.policy ?? 'recompute', ...o.configOver });
  const scheduler = new KVChecksumScheduler({ config: cfg, connector, role: 'kv_consumer', tpSize: o.shape.tp, ppSize: o.shape.pp, groupConfigs: groupConfigs(o.shape.blockSize), observability: obs, localize: o.localize });
  const workers = buildWorkers(o.shape, seed);
  if (o.prepare) replan(workers, o.shape, o.prepare);
  const blocks = blockTables(seed + 100, o.kv.tokens, o.shape.blockSize);
  const req: ConnectorRequest = { requestId: id, promptTokenIds: o.promptTokenIds ?? [...Array(o.kv.tokens).keys()], numComputedTokens: numLocal, numTokens: o.kv.tokens, kvTransferParams: o.params };
  scheduler.onLoadScheduled(req, blocks, numLocal, o.kv.tokens - numLocal);
  const meta = scheduler.buildStepMeta();
  for (const w of workers) w.hooks.bindStepMeta(meta);
  // The transfer: only the loaded tokens arrive; the local prefix blocks keep what they hold.
  for (const w of workers) layKV(w, o.shape, o.kv, blocks, numLocal);
  o.corrupt?.(workers, blocks);
  const recvStarts: number[] = [];
  const outputs = workers.map((w, i) => {
    const res = emptyResults();
    res.finishedRecving.add(id);
    const copy = o.connectorPayloads?.[i];
    if (copy) res.kvChecksums.set(id, copy);
    w.hooks.afterTransferResults(res);
    const rep = w.hooks.takeReport();
    for (const e of rep?.recvs ?? []) for (const g of e.groups) if (g.groupId === 0) recvStarts.push(g.start);
    return output(w, res, o.jsonReports && rep ? JSON.parse(JSON.stringify(encodeReport(rep))) : rep);
  });
  scheduler.updateFromOutputs(outputs);
  const decision = scheduler.onLoadFinished(req, o.loadError);
  scheduler.onRequestFinished(req, { delayFree: false }, 'stop');
  return { decision, scheduler, obs, workers, logs, recvStarts, blocks };
}

/** The value of a counter (optionally with labels) in a registry. */
export async function metricValue(obs: KVChecksumObservability, name: string, labels: Record<string, string> = {}): Promise<number> {
  const m = obs.registry.getSingleMetric(name);
  if (!m) throw new Error(`no metric ${name}`);
  const { values } = await m.get();
  const hit = values.find((v) => Object.entries(labels).every(([k, x]) => v.labels[k] === x) && (Object.keys(labels).length > 0 || !('le' in v.labels)));
  return hit?.value ?? 0;
}

/**
 * The scenario runner: builds the engines of a scenario (a pluggable {@link Topology}; the default
 * runs producer, consumers and a single-instance reference in this process), sends the requests
 * through the P/D proxy, collects each load's verdict from the consumer's checksum scheduler
 * events, compares every output with the single instance, and checks the expectations.
 * @module
 */
import { performance } from 'node:perf_hooks';
import type { Verdict } from '@kvconnect/checksum';
import { KVChecksumObservability, KVConnectorRegistry, defaultRegistry, type KVConnectorFactory, type KVTransferConfig, type LoadError, type LoadOutcomeEvent, type Localization } from '@kvconnect/core';
import { ByteTokenizer, Engine, PDProxy, type GenerateResult, type ModelConfig, type PDProxyOptions, type PDResult, type SamplingParams } from '@kvconnect/engine';

/** What the P/D proxy needs of an engine (its `generate` and id). */
export type PDEndpoint = PDProxyOptions['prefill'];
import { FAULT_CONNECTOR_MODULE } from './fault-connector.js';
import type { FaultSpec } from './faults.js';
import { FAULT_INJECTING_CONNECTOR, applyGroundTruth, faultReportOf, registerFaultInjectingConnector, requestIndexOf, type InjectionRecord, type LoadRecord } from './faults/index.js';
import { IN_PROCESS_CONNECTOR, InProcessBus } from './in-process-connector.js';
import { resolveModelSpec } from './models.js';
import { generatedPrompts, promptText } from './prompts.js';
import { freePort } from './topology-multiprocess.js';
import type { ConnectorName, FinishKind, RequestExpectation, RunSpec, Scenario, SideSpec, VerdictKind } from './scenario.js';
import { transferExtraConfig, transferUnavailable } from './transfer.js';

/** A connector's package and registered name. */
export const CONNECTOR_PACKAGES: Readonly<Record<Exclude<ConnectorName, 'in-process'>, { pkg: string; name: string }>> = Object.freeze({
  'nixl-pull': { pkg: '@kvconnect/nixl-pull', name: 'NixlConnector' },
  'nixl-push': { pkg: '@kvconnect/nixl-push', name: 'NixlPushConnector' },
  mooncake: { pkg: '@kvconnect/mooncake', name: 'MooncakeConnector' },
});

/**
 * The registered name of a scenario connector, importing its package first; or why it cannot run
 * here (`{ skip }`).
 */
export async function resolveConnector(c: ConnectorName): Promise<{ name: string } | { skip: string }> {
  if (c === 'in-process') return { name: IN_PROCESS_CONNECTOR };
  const { pkg, name } = CONNECTOR_PACKAGES[c];
  if (!defaultRegistry.has(name)) {
    try {
      await import(pkg);
    } catch (e) {
      return { skip: `connector ${c} needs ${pkg}, which is not installed (${e instanceof Error ? e.message.split('\n')[0] : String(e)})` };
    }
  }
  if (!defaultRegistry.has(name)) return { skip: `connector ${c}: ${pkg} loads but does not register ${name} yet` };
  return { name };
}

/** A request ready to send: its prompts and sampling. */
export interface PreparedRequest {
  index: number;
  /** Producer prompt (token ids). */
  prompt: number[];
  /** Consumer prompt when it differs (appended first token). */
  consumerPrompt?: number[];
  sampling: SamplingParams;
  /** Prompt text when known (reports). */
  text?: string;
}

/** What a topology provides for one run. */
export interface TopologyInstance {
  /** The producer endpoint (the runner wraps it to name requests). */
  prefill: PDEndpoint;
  /** Consumer endpoints (DP). */
  decode: PDEndpoint[];
  /** Engine ids of producer and consumers (fault and load records are filtered by them). */
  producerIds: string[];
  consumerIds: string[];
  /** Consumer checksum observability, one per consumer (verdict events). */
  consumerObservability: KVChecksumObservability[];
  producerObservability: KVChecksumObservability[];
  /** Block size per group id of the consumer (to turn token positions into block positions). */
  consumerBlockSizes: Map<number, number>;
  /** Computes `ids` on a side (so its prefix cache holds them). */
  warm(side: 'producer' | 'consumer', consumer: number, ids: number[]): Promise<void>;
  shutdown(): Promise<void>;
}

/** Everything a topology needs to build one run. */
export interface TopologyContext {
  scenario: Scenario;
  model: ModelConfig;
  run: RunSpec;
  runIndex: number;
  /** The inner connector's registered name. */
  innerConnector: string;
  faults: FaultSpec[];
}

/** Builds the engines of a run (in process, or processes of an engine server). */
export type Topology = (ctx: TopologyContext) => Promise<TopologyInstance>;

let engineSeq = 0;

function sideOptions(s: SideSpec) {
  return {
    tpSize: s.tp ?? 1,
    ppSize: s.pp ?? 1,
    blockSize: s.blockSize ?? 16,
    cacheLayout: { layout: s.layout ?? 'NHD', kvLayout: s.kvLayout ?? 'kv-first' },
    kvDtype: s.dtype ?? 'bfloat16',
    maxNumBatchedTokens: s.maxBatchedTokens ?? 256,
    numBlocks: s.numBlocks ?? 256,
    enablePrefixCaching: s.prefixCaching ?? true,
    device: s.device ?? 'cpu',
  } as const;
}

/** The transfer config of one side: the FaultInjectingConnector, loaded by module path, around the inner connector. */
export function sideTransferConfig(o: {
  role: 'kv_producer' | 'kv_consumer';
  checksums: boolean;
  failClosed?: boolean;
  policy?: 'fail' | 'recompute';
  inner: string;
  innerExtra?: Record<string, unknown>;
  faults: FaultSpec[];
}): Record<string, unknown> {
  return {
    kv_connector: FAULT_INJECTING_CONNECTOR,
    kv_connector_module_path: FAULT_CONNECTOR_MODULE,
    kv_role: o.role,
    enable_kv_checksum: o.checksums,
    kv_checksum_fail_closed: o.failClosed ?? false,
    kv_load_failure_policy: o.policy ?? 'recompute',
    kv_connector_extra_config: { inner: { kv_connector: o.inner, kv_connector_extra_config: o.innerExtra ?? {} }, faults: o.faults },
  } satisfies Partial<KVTransferConfig> & Record<string, unknown>;
}

/**
 * The connectors of one in-process run: a registry of its own holding the FaultInjectingConnector,
 * the harness's in-process connector over a bus of the run, and the inner connector's factory
 * (from the default registry, where its package registered it). With `wrap`, the engines get
 * `wrap(FaultInjectingConnector's factory)` instead.
 */
function runRegistry(inner: string, wrap?: (f: KVConnectorFactory) => KVConnectorFactory): KVConnectorRegistry {
  const registry = new KVConnectorRegistry();
  registerFaultInjectingConnector(registry, { bus: new InProcessBus() });
  if (!registry.has(inner)) registry.register(defaultRegistry.get(inner));
  if (!wrap) return registry;
  const outer = new KVConnectorRegistry();
  outer.register(wrap(registry.get(FAULT_INJECTING_CONNECTOR)));
  return outer;
}

/**
 * The inner connector's extra config of each side. MooncakeConnector: the consumers find the
 * producer's bootstrap server only through their config (`remote_bootstrap_addr`; no lookup inside
 * the process), so unless the scenario's `connectorConfig` names a bootstrap address or port, the
 * producer's server gets a free loopback port and the consumers its address.
 */
async function bootstrapExtras(inner: string, config: Record<string, unknown> | undefined): Promise<{ producerExtra?: Record<string, unknown>; consumerExtra?: Record<string, unknown> }> {
  const c = config ?? {};
  if (inner !== CONNECTOR_PACKAGES.mooncake.name || 'bootstrap_port' in c || 'bootstrap_addr' in c || 'remote_bootstrap_addr' in c) return { producerExtra: config, consumerExtra: config };
  const port = await freePort();
  return { producerExtra: { ...c, bootstrap_port: port }, consumerExtra: { ...c, bootstrap_port: port, remote_bootstrap_addr: `127.0.0.1:${port}` } };
}

/** The default topology: producer and consumers as engines of this process. */
export const inProcessTopology: Topology = (ctx) => inProcessEngines(ctx);

/**
 * {@link inProcessTopology}, the engines' FaultInjectingConnector factory replaced by
 * `wrap(factory)` when given (tests: halves that only see serialized copies of what crosses).
 */
export async function inProcessEngines(ctx: TopologyContext, wrap?: (f: KVConnectorFactory) => KVConnectorFactory): Promise<TopologyInstance> {
  const s = ctx.scenario;
  const checks = ctx.run.checksums ?? s.checksums;
  const id = engineSeq++;
  const registry = runRegistry(ctx.innerConnector, wrap);
  const { producerExtra, consumerExtra } = await bootstrapExtras(ctx.innerConnector, { ...transferExtraConfig(s.transfer), ...s.connectorConfig });
  const pObs = new KVChecksumObservability({ level: 'silent' });
  const producer = new Engine({
    registry,
    model: ctx.model,
    ...sideOptions(s.producer),
    engineId: `harness-p${id}`,
    observability: pObs,
    kvTransferConfig: sideTransferConfig({ role: 'kv_producer', checksums: s.producer.checksums ?? checks, inner: ctx.innerConnector, innerExtra: producerExtra, faults: ctx.faults }),
  });
  const consumers: Engine[] = [];
  const cObs: KVChecksumObservability[] = [];
  for (let k = 0; k < (s.consumer.dp ?? 1); k++) {
    const obs = new KVChecksumObservability({ level: 'silent' });
    cObs.push(obs);
    consumers.push(
      new Engine({
        registry,
        model: ctx.model,
        ...sideOptions(s.consumer),
        engineId: `harness-d${id}-${k}`,
        observability: obs,
        kvTransferConfig: sideTransferConfig({
          role: 'kv_consumer',
          checksums: s.consumer.checksums ?? checks,
          failClosed: s.consumer.failClosed ?? true,
          policy: s.consumer.policy ?? 'recompute',
          inner: ctx.innerConnector,
          innerExtra: consumerExtra,
          faults: ctx.faults,
        }),
      }),
    );
  }
  await Promise.all([producer.ready, ...consumers.map((c) => c.ready)]);
  const blockSizes = new Map(consumers[0].groupConfigs.map((g) => [g.groupId, g.blockSize]));
  return {
    prefill: producer,
    decode: consumers,
    producerIds: [producer.engineId],
    consumerIds: consumers.map((c) => c.engineId),
    consumerObservability: cObs,
    producerObservability: [pObs],
    consumerBlockSizes: blockSizes,
    async warm(side, k, ids) {
      const e = side === 'producer' ? producer : consumers[k];
      await e.generate(ids, { maxTokens: 1, ignoreEos: true });
    },
    async shutdown() {
      await producer.shutdown();
      for (const c of consumers) await c.shutdown();
    },
  };
}

/** What happened to one request in one run. */
export interface RequestOutcome {
  index: number;
  run: number;
  tokenIds: number[];
  text: string;
  finishReason: FinishKind;
  error?: string;
  /** The load's verdict (null: no load was verified). */
  verdict: Verdict | null;
  kind: VerdictKind;
  /** What the consumer did with the load (invalid blocks reported by the transport count as the failure policy). */
  action: 'use' | 'recompute' | 'fail' | null;
  /** The transport reported invalid blocks for the load. */
  invalidBlocks: boolean;
  /** Why the load failed in transit (kind `transfer-failed`), when it did. */
  loadError?: LoadError;
  /** A mismatched load's drill-down (`load-localized`, docs/localize.md): where the sides differ; null when none arrived. */
  localization: Localization | null;
  reference: number[];
  equalsReference: boolean;
  /** Consumer block positions whose loaded bytes the injector really changed, per group id. */
  injected: Map<number, number[]>;
  /** Fault kinds that hit the request (any side). */
  faultKinds: string[];
  /** Load wall time (first worker start to last worker finish), ms, and bytes loaded (all workers). */
  loadWallMs: number | null;
  loadBytes: number;
  /** Wall time of the request through the proxy, ms. */
  latencyMs: number;
}

/** One run of a scenario. */
export interface RunOutcome {
  label: string;
  spec: RunSpec;
  requests: RequestOutcome[];
  /** Checksum compute seconds and bytes summed (producer sends, consumer loads). */
  checksumSeconds: { send: number; recv: number };
  checksumBytes: { send: number; recv: number };
  records: InjectionRecord[];
  loads: LoadRecord[];
  wallMs: number;
}

/** One expectation line. */
export interface ExpectationResult {
  ok: boolean;
  line: string;
}

/** The result of a scenario. */
export interface ScenarioResult {
  scenario: Scenario;
  file?: string;
  /** Why the scenario did not run. */
  skipped?: string;
  runs: RunOutcome[];
  expectations: ExpectationResult[];
  durationMs: number;
}

/** Options of {@link runScenario}. */
export interface RunScenarioOptions {
  /** Where engines come from (default {@link inProcessTopology}). */
  topology?: Topology;
  /** Called when a request finishes (progress bars). */
  onRequestDone?: (o: RequestOutcome, total: number) => void;
  file?: string;
}

const tokenizer = new ByteTokenizer();

/** The scenario's requests: prompts as token ids and sampling; references of `continueFrom` / `appendFirstToken` come from `reference`. */
export async function prepareRequests(s: Scenario, reference: Engine): Promise<PreparedRequest[]> {
  const out: PreparedRequest[] = [];
  if (s.generate) {
    const g = s.generate;
    generatedPrompts(g).forEach((text, i) => out.push({ index: i, prompt: tokenizer.encode(text), text, sampling: { maxTokens: g.maxTokens ?? 8, ignoreEos: true } }));
    return out;
  }
  for (let i = 0; i < s.requests.length; i++) {
    const r = s.requests[i];
    const sampling: SamplingParams = { maxTokens: r.maxTokens ?? 8, temperature: r.temperature ?? 0, seed: r.seed ?? 0, ignoreEos: r.ignoreEos ?? true };
    let prompt: number[];
    let text: string | undefined;
    if (r.continueFrom !== undefined) {
      const prev = out[r.continueFrom];
      const ref = await reference.generate(prev.consumerPrompt ?? prev.prompt, prev.sampling);
      prompt = [...(prev.consumerPrompt ?? prev.prompt), ...ref.tokenIds];
    } else if (typeof r.prompt === 'string') {
      text = r.prompt;
      prompt = tokenizer.encode(r.prompt);
    } else if (Array.isArray(r.prompt)) prompt = r.prompt.slice();
    else {
      text = promptText(r.promptTokens!, r.promptSeed ?? i);
      prompt = tokenizer.encode(text);
    }
    const p: PreparedRequest = { index: i, prompt, sampling, text };
    if (r.appendFirstToken) {
      const first = await reference.generate(prompt, { ...sampling, maxTokens: 1 });
      p.consumerPrompt = [...prompt, first.tokenIds[0]];
    }
    out.push(p);
  }
  return out;
}

async function metricSum(obs: KVChecksumObservability[], which: 'seconds' | 'bytesSummed', side: 'send' | 'recv'): Promise<number> {
  let total = 0;
  for (const o of obs) {
    const m = await (o.metrics[which] as unknown as { get(): Promise<{ values: Array<{ value: number; labels: Record<string, string>; metricName?: string }> }> }).get();
    for (const v of m.values) {
      if (v.labels.side !== side) continue;
      if (which === 'seconds' && v.metricName && !v.metricName.endsWith('_sum')) continue;
      total += v.value;
    }
  }
  return total;
}

/** Runs one run of a scenario. */
async function runOnce(s: Scenario, model: ModelConfig, reqs: PreparedRequest[], references: number[][], runIndex: number, inner: string, topology: Topology, onDone?: RunScenarioOptions['onRequestDone']): Promise<RunOutcome> {
  const spec = s.runs[runIndex];
  const faults = spec.faults === false ? [] : s.faults;
  const topo = await topology({ scenario: s, model, run: spec, runIndex, innerConnector: inner, faults });
  const t0 = performance.now();
  // What each consumer engine decided per load (typed `load-outcome` events), by request index.
  const outcomes = new Map<number, LoadOutcomeEvent>();
  // Loads whose transfer failed, with the cause the connector gave (`load-transfer-failed`).
  const transferFailures = new Map<number, LoadError>();
  // Drill-downs of mismatched loads (`load-localized`), by request index.
  const localizations = new Map<number, Localization>();
  for (const obs of topo.consumerObservability) {
    obs.events.on('load-localized', (e) => {
      const i = requestIndexOf(e.requestId);
      if (i !== undefined) localizations.set(i, e);
    });
    obs.events.on('load-outcome', (e) => {
      const i = requestIndexOf(e.requestId);
      if (i !== undefined) outcomes.set(i, e);
    });
    obs.events.on('load-transfer-failed', (e) => {
      const i = requestIndexOf(e.requestId);
      if (i !== undefined) transferFailures.set(i, e.loadError);
    });
  }
  // Request i goes through its own proxy whose endpoints name it `r<i>.<proxy id>` on both sides
  // (faults/records.ts requestIndexOf reads the index back): no shared cursor.
  const indexed = (ep: PDEndpoint, i: number, prompt?: readonly number[]): PDEndpoint => ({
    engineId: ep.engineId,
    groupConfigs: ep.groupConfigs, // PDProxy: kv_checksum_block_sizes (docs/checksum-extensions.md section 1)
    generate: (p, sampling, params, requestId, call) => ep.generate(prompt ?? p, sampling, params, `r${i}.${requestId ?? 'x'}`, call),
    abort: ep.abort ? (requestId) => ep.abort!(`r${i}.${requestId}`) : undefined,
  });
  const proxyFor = (k: number, q: PreparedRequest) => new PDProxy({ prefill: indexed(topo.prefill, q.index), decode: indexed(topo.decode[k], q.index, q.consumerPrompt), mode: s.mode });
  const results = new Map<number, { r: GenerateResult | 'timeout'; ms: number }>();
  const dp = topo.decode.length;
  let next = 0;
  const worker = async () => {
    while (next < reqs.length) {
      const q = reqs[next++];
      const k = q.index % dp;
      const prefixP = s.producer.prefixHitTokens ?? 0;
      const prefixD = s.consumer.prefixHitTokens ?? 0;
      if (prefixP > 0) await topo.warm('producer', 0, q.prompt.slice(0, prefixP));
      if (prefixD > 0) await topo.warm('consumer', k, (q.consumerPrompt ?? q.prompt).slice(0, prefixD));
      const started = performance.now();
      const p = proxyFor(k, q).generate(q.prompt, q.sampling);
      let timer: NodeJS.Timeout | undefined;
      const r = await Promise.race([p, new Promise<'timeout'>((res) => (timer = setTimeout(() => res('timeout'), s.timeoutMs)))]);
      clearTimeout(timer);
      results.set(q.index, { r, ms: performance.now() - started });
      const o = outcome(q.index);
      if (o) onDone?.(o, reqs.length);
    }
  };
  const outcome = (i: number): RequestOutcome | null => {
    const res = results.get(i);
    if (!res) return null;
    const r = res.r;
    const v = outcomes.get(i);
    const tokenIds = r === 'timeout' ? [] : r.tokenIds;
    return {
      index: i,
      run: runIndex,
      tokenIds,
      text: r === 'timeout' ? '' : r.text,
      finishReason: r === 'timeout' ? 'timeout' : r.finishReason,
      error: r === 'timeout' ? `no answer within ${s.timeoutMs} ms` : r.error,
      verdict: v?.verdict ?? null,
      kind: v?.verdict ? v.verdict.verdict : transferFailures.has(i) ? 'transfer-failed' : 'none',
      loadError: transferFailures.get(i),
      localization: localizations.get(i) ?? null,
      action: v?.action ?? null,
      invalidBlocks: v?.reason === 'invalid-blocks',
      reference: references[i],
      equalsReference: sameIds(tokenIds, references[i]),
      injected: new Map(),
      faultKinds: [],
      loadWallMs: null,
      loadBytes: 0,
      latencyMs: res.ms,
    };
  };
  await Promise.all(Array.from({ length: Math.min(s.concurrency, reqs.length) }, worker));
  const wallMs = performance.now() - t0;
  // A drill-down ends after its load's decision (it never delays the request): wait for those of
  // mismatched loads, at most their deadline (checksum-localize.ts, 5 s by default) and a margin.
  const drilling = () => [...outcomes].filter(([i, e]) => e.verdict?.verdict === 'mismatch' && !e.verdict.wrongRequest && !localizations.has(i)).length;
  for (const until = performance.now() + 6000; drilling() > 0 && performance.now() < until; ) await new Promise((r) => setTimeout(r, 10));
  const checksumSeconds = { send: await metricSum(topo.producerObservability, 'seconds', 'send'), recv: await metricSum(topo.consumerObservability, 'seconds', 'recv') };
  const checksumBytes = { send: await metricSum(topo.producerObservability, 'bytesSummed', 'send'), recv: await metricSum(topo.consumerObservability, 'bytesSummed', 'recv') };
  await topo.shutdown();
  // Ground truth: the fault reports the engines returned with each request (producer and consumer).
  const ids = new Set([...topo.producerIds, ...topo.consumerIds]);
  const reports = [...results.values()].flatMap(({ r }) => (r === 'timeout' ? [] : [faultReportOf(r.kvTransferParams), faultReportOf((r as Partial<PDResult>).prefill?.kvTransferParams)]));
  const records = reports.flatMap((x) => (x && ids.has(x.engineId) ? x.injections : []));
  const loads = reports.flatMap((x) => (x && ids.has(x.engineId) ? x.loads : []));
  const requests = reqs.map((q) => outcome(q.index)!);
  const consumerIds = new Set(topo.consumerIds);
  for (const o of requests) applyGroundTruth(o, records, loads, consumerIds, (g) => topo.consumerBlockSizes.get(g) ?? 16);
  return { label: spec.label ?? (s.runs.length > 1 ? `run ${runIndex}` : ''), spec, requests, checksumSeconds, checksumBytes, records, loads, wallMs };
}

function sameIds(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

/**
 * Runs a scenario: every run of its request set through P/D, then its expectations.
 * A scenario whose connector is not available here is skipped (with the reason).
 */
export async function runScenario(s: Scenario, o: RunScenarioOptions = {}): Promise<ScenarioResult> {
  const hold = holdEventLoop();
  try {
    return await runScenarioHeld(s, o);
  } finally {
    hold.release();
  }
}

/**
 * Keeps Node's event loop alive (a ref'd timer that never fires) until `release()`. Connectors
 * keep their own timers and sockets `unref()`'d so that they never hold a process open (the NIXL
 * worker's notif poller sleeps on one: `packages/nixl-common/src/worker.ts`), so a run awaiting
 * only them, e.g. an engine shutdown waiting for the poller's last sleep, would otherwise let the
 * loop empty and the process exit mid-run (code 13, "unsettled top-level await", no output).
 */
export function holdEventLoop(): { release(): void } {
  const t = setInterval(() => {}, 1 << 30);
  return { release: () => clearInterval(t) };
}

async function runScenarioHeld(s: Scenario, o: RunScenarioOptions): Promise<ScenarioResult> {
  const t0 = performance.now();
  const conn = await resolveConnector(s.connector);
  if ('skip' in conn) return { scenario: s, file: o.file, skipped: conn.skip, runs: [], expectations: [], durationMs: performance.now() - t0 };
  const noTransfer = transferUnavailable(s.transfer);
  if (noTransfer) return { scenario: s, file: o.file, skipped: noTransfer, runs: [], expectations: [], durationMs: performance.now() - t0 };
  const model = resolveModelSpec(s.model);
  const reference = new Engine({ model, numBlocks: 4096, maxNumBatchedTokens: 512, engineId: `harness-ref${engineSeq++}` });
  let runs: RunOutcome[];
  try {
    const reqs = await prepareRequests(s, reference);
    const refs = await Promise.all(reqs.map((q) => reference.generate(q.consumerPrompt ?? q.prompt, q.sampling)));
    const references = refs.map((r) => r.tokenIds);
    runs = [];
    for (let k = 0; k < s.runs.length; k++) runs.push(await runOnce(s, model, reqs, references, k, conn.name, o.topology ?? inProcessTopology, o.onRequestDone));
  } finally {
    await reference.shutdown();
  }
  return { scenario: s, file: o.file, runs, expectations: checkExpectations(s, runs), durationMs: performance.now() - t0 };
}

// ---------------------------------------------------------------------------------------------
// Expectations
// ---------------------------------------------------------------------------------------------

const asList = <T>(x: T | T[] | undefined): T[] | undefined => (x === undefined ? undefined : Array.isArray(x) ? x : [x]);

function fmtMismatches(m: Array<{ groupId?: number; group?: number; positions: number[] }>): string {
  return m.map((x) => `g${x.groupId ?? x.group}[${x.positions.join(',')}]`).join(' ') || '-';
}

/** A one-line description of an outcome. */
export function describeOutcome(o: RequestOutcome): string {
  const v = o.verdict;
  const parts = [`verdict ${o.kind}`];
  if (v && v.mismatches.length) parts.push(`mismatch ${fmtMismatches(v.mismatches)}`);
  if (v && v.unverified.length) parts.push(`reasons ${v.unverified.map((u) => (u.groupId === null ? u.reason : `g${u.groupId}:${u.reason}`)).join(',')}`);
  if (v?.wrongRequest) parts.push('wrong request (SPEC 8.0)');
  if (o.loadError) parts.push(`load failed in transit (${o.loadError.reason}: ${o.loadError.message})`);
  else if (o.invalidBlocks) parts.push('transport reported invalid blocks');
  parts.push(`action ${o.action ?? '-'}`, `finish ${o.finishReason}`, o.equalsReference ? 'output = reference' : o.tokenIds.length ? 'output differs' : 'no output');
  return parts.join(', ');
}

function checkRequest(e: RequestExpectation, o: RequestOutcome): string[] {
  const bad: string[] = [];
  const verdicts = asList(e.verdict);
  if (verdicts && !verdicts.includes(o.kind)) bad.push(`verdict ${o.kind}, expected ${verdicts.join(' or ')}`);
  if (e.mismatches && o.kind === 'mismatch') {
    const got = (o.verdict?.mismatches ?? []).map((m) => ({ group: m.groupId, positions: m.positions }));
    const want = e.mismatches.map((m) => ({ group: m.group, positions: [...m.positions].sort((a, b) => a - b) })).sort((a, b) => a.group - b.group);
    if (JSON.stringify(got.sort((a, b) => a.group - b.group)) !== JSON.stringify(want)) bad.push(`mismatches ${fmtMismatches(got)}, expected ${fmtMismatches(want)}`);
  }
  if (e.wrongRequest !== undefined && (o.verdict?.wrongRequest ?? false) !== e.wrongRequest) bad.push(e.wrongRequest ? 'not reported as another request\'s KV (wrongRequest)' : 'reported as another request\'s KV (wrongRequest)');
  if (e.reasons && (verdicts === undefined || o.kind === 'unverified' || o.kind === 'mismatch')) {
    const got = o.verdict?.unverified ?? [];
    for (const r of e.reasons) {
      const ok = typeof r === 'string' ? got.some((u) => u.reason === r) : got.some((u) => u.reason === r.reason && u.groupId === r.group);
      if (!ok) bad.push(`reason ${typeof r === 'string' ? r : `${r.group === null ? 'load' : `g${r.group}`}:${r.reason}`} not reported (got ${got.map((u) => u.reason).join(',') || 'none'})`);
    }
  }
  const actions = asList(e.action);
  if (actions && !(o.action !== null && actions.includes(o.action))) bad.push(`action ${o.action ?? 'none'}, expected ${actions.join(' or ')}`);
  const fin = asList(e.finishReason);
  if (fin && !fin.includes(o.finishReason)) bad.push(`finish ${o.finishReason}, expected ${fin.join(' or ')}`);
  if (e.error !== undefined && (o.error !== undefined) !== e.error) bad.push(e.error ? 'expected an error' : `unexpected error: ${o.error}`);
  if (e.output === 'reference' && !o.equalsReference) bad.push(`output [${o.tokenIds.join(',')}] differs from the single instance [${o.reference.join(',')}]`);
  if (e.output === 'different' && o.equalsReference) bad.push('output equals the single instance');
  if (e.output === 'empty' && o.tokenIds.length > 0) bad.push(`${o.tokenIds.length} tokens returned, expected none`);
  return bad;
}

function describeExpectation(e: RequestExpectation): string {
  const parts: string[] = [];
  if (e.verdict) parts.push(`verdict ${asList(e.verdict)!.join('|')}`);
  if (e.mismatches) parts.push(`mismatch ${fmtMismatches(e.mismatches)}`);
  if (e.wrongRequest !== undefined) parts.push(e.wrongRequest ? 'wrong request' : 'not a wrong request');
  if (e.reasons) parts.push(`reasons ${e.reasons.map((r) => (typeof r === 'string' ? r : `${r.group === null ? 'load' : `g${r.group}`}:${r.reason}`)).join(',')}`);
  if (e.action) parts.push(`action ${asList(e.action)!.join('|')}`);
  if (e.finishReason) parts.push(`finish ${asList(e.finishReason)!.join('|')}`);
  if (e.error !== undefined) parts.push(e.error ? 'error' : 'no error');
  if (e.output && e.output !== 'any') parts.push(e.output === 'reference' ? 'output = single instance' : e.output === 'different' ? 'output differs' : 'no output');
  return parts.join(', ') || 'completes';
}

function injectedText(o: RequestOutcome): string {
  return [...o.injected].map(([g, p]) => `g${g}[${p.join(',')}]`).join(' ');
}

/** Checks a scenario's expectations against its runs: one result (line) per expectation and run. */
export function checkExpectations(s: Scenario, runs: RunOutcome[]): ExpectationResult[] {
  const out: ExpectationResult[] = [];
  const line = (ok: boolean, run: RunOutcome | null, what: string, detail: string[] = []) => {
    const label = run && run.label ? ` [${run.label}]` : '';
    const extra = ok || detail.length === 0 ? '' : ` -- ${detail.slice(0, 4).join('; ')}${detail.length > 4 ? `; ... (${detail.length - 4} more)` : ''}`;
    out.push({ ok, line: `${ok ? 'PASS' : 'FAIL'} ${s.name}${label}: ${what}${extra}` });
  };
  const e = s.expect;
  for (const run of runs) {
    const checksOn = run.spec.checksums ?? s.checksums;
    for (const x of e.requests ?? []) {
      if (x.run !== undefined && runs.indexOf(run) !== x.run) continue;
      const idx = x.request === '*' ? run.requests.map((r) => r.index) : asList(x.request)!;
      const bad: string[] = [];
      for (const i of idx) {
        const o = run.requests[i];
        const b = checkRequest(x, o);
        if (b.length) bad.push(`r${i}: ${b.join(', ')}`);
      }
      const sel = x.request === '*' ? `requests *` : idx.length === 1 ? `r${idx[0]}` : `r${idx.join(',r')}`;
      line(bad.length === 0, run, `${sel}: ${describeExpectation(x)}`, bad);
    }
    if ((e.noFalseVerify ?? true) && checksOn) {
      const bad = run.requests.filter((o) => o.injected.size > 0 && o.kind === 'verified').map((o) => `r${o.index} VERIFIED over changed bytes ${injectedText(o)}`);
      line(bad.length === 0, run, 'no load verified over bytes the injector changed', bad);
    }
    const failClosed = (s.consumer.failClosed ?? true) && checksOn;
    if (e.noTokensFromUnverified ?? failClosed) {
      const bad = run.requests.filter((o) => o.kind !== 'verified' && o.kind !== 'none' && o.action === 'use' && o.tokenIds.length > 0).map((o) => `r${o.index}: ${o.tokenIds.length} tokens from a ${o.kind} load`);
      line(bad.length === 0, run, 'no tokens produced from unverified KV', bad);
    }
    if (e.mismatchesAtInjections) {
      const bad: string[] = [];
      for (const o of run.requests) {
        if (o.injected.size === 0) {
          if (o.kind !== 'verified' && o.kind !== 'none') bad.push(`r${o.index}: ${o.kind} without an injection`);
          continue;
        }
        const got = new Map((o.verdict?.mismatches ?? []).map((m) => [m.groupId, m.positions.join(',')]));
        const want = new Map([...o.injected].map(([g, p]) => [g, p.join(',')]));
        if (o.kind !== 'mismatch' || got.size !== want.size || [...want].some(([g, p]) => got.get(g) !== p)) bad.push(`r${o.index}: injected ${injectedText(o)}, verdict ${o.kind} ${fmtMismatches(o.verdict?.mismatches ?? [])}`);
      }
      const n = run.requests.filter((o) => o.injected.size > 0).length;
      line(bad.length === 0, run, `mismatches exactly at the ${n} injected location(s), every other load verified`, bad);
    }
  }
  if (e.counts) {
    const all = runs.flatMap((r) => r.requests);
    const got: Record<string, number> = {
      verified: all.filter((o) => o.kind === 'verified').length,
      mismatch: all.filter((o) => o.kind === 'mismatch').length,
      unverified: all.filter((o) => o.kind === 'unverified').length,
      'transfer-failed': all.filter((o) => o.kind === 'transfer-failed').length,
      none: all.filter((o) => o.kind === 'none').length,
      recomputed: all.filter((o) => o.action === 'recompute').length,
      failed: all.filter((o) => o.action === 'fail').length,
      injected: all.filter((o) => o.injected.size > 0).length,
    };
    for (const [k, v] of Object.entries(e.counts)) line(got[k] === v, null, `count ${k} = ${v}`, [`got ${got[k]}`]);
  }
  if (e.sameOutputsAcrossRuns) {
    const bad: string[] = [];
    const first = runs[0];
    for (const run of runs.slice(1)) {
      for (const o of run.requests) if (!sameIds(o.tokenIds, first.requests[o.index].tokenIds)) bad.push(`r${o.index}: ${run.label || 'run'} [${o.tokenIds.join(',')}] vs ${first.label || 'run 0'} [${first.requests[o.index].tokenIds.join(',')}]`);
    }
    line(bad.length === 0, null, `identical token ids across ${runs.map((r) => r.label || 'run').join(' / ')}`, bad);
  }
  return out;
}

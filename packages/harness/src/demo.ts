/**
 * `kvconnect demo`: a batch of real text prompts through P/D with KV checksums on (fail-closed,
 * recompute), faults injected into a share of the loads, a progress bar, a summary, and a Markdown
 * report with plots in a folder of its own.
 *
 * Topologies: by default (`--connector pull | push | mooncake`) a proxy, a producer engine and a
 * consumer engine run as separate processes on 127.0.0.1 (see `topology-multiprocess.ts`), the KV
 * moving through the connector's embedded transfer agent (NIXL pull, NIXL push or Mooncake); the
 * consumer's connector is the FaultInjectingConnector (loaded by module path) around the chosen
 * one, so only consumer-side faults are injected. Every output is compared token for token with a
 * single engine of this process (greedy). `--connector in-process` runs producer and consumer as
 * engines of this process over the harness's in-process connector (every fault kind, with the
 * injector's ground truth); a custom {@link Topology} plugs into that path.
 * @module
 */
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import type { Verdict } from '@kvconnect/checksum';
import type { KVTransferParams, Localization } from '@kvconnect/core';
import { Engine, type LoadInfo, type ModelConfig } from '@kvconnect/engine';
import cliProgress from 'cli-progress';
import type { FaultSpec } from './faults.js';
import { applyGroundTruth, faultReportOf, requestIndexOf, type InjectionRecord, type LoadRecord } from './faults/index.js';
import { prng } from './locate.js';
import { resolveModelSpec } from './models.js';
import { generatedPrompts } from './prompts.js';
import { extensionLines, loadStatus, markdownReport, summarize, summaryLines, verdictLine, type RunSummary } from './report.js';
import { checkExpectations, resolveConnector, runScenario, type RequestOutcome, type RunOutcome, type ScenarioResult, type Topology } from './runner.js';
import { parseScenario, type ConnectorName, type Scenario, type VerdictKind } from './scenario.js';
import { PROCESS_CONNECTORS, startPDProcesses, type PDProcesses, type ProcessMetrics, type WorkersMode } from './topology-multiprocess.js';
import { loopbackTransferEnv, transferMismatch, transferUnavailable, type TransferEngine } from './transfer.js';

/** `--connector` values and the scenario connector each means (`in-process`: the name scenarios use). */
export const DEMO_CONNECTORS: Readonly<Record<string, ConnectorName>> = Object.freeze({ pull: 'nixl-pull', push: 'nixl-push', mooncake: 'mooncake', 'in-process': 'in-process' });

/** Deprecated `--connector` spellings, still accepted (with a note), and the value each stands for. */
export const DEMO_CONNECTOR_ALIASES: Readonly<Record<string, keyof typeof DEMO_CONNECTORS>> = Object.freeze({ inprocess: 'in-process' });

/**
 * The note the demo prints for the model's weights: the presets' weights are seeded random
 * (`packages/engine/src/model/`), so the generated text is arbitrary tokens; what the demo
 * checks is that P/D gives the same tokens as a single instance.
 */
export function weightsNote(model: string): string {
  return `model ${model} has seeded random weights (not trained): its outputs are arbitrary tokens; the demo checks that each equals a single instance's, token for token`;
}

/**
 * Whether the demo's fault `f` applies to `model`: `wrong-layout` swaps NHD and HND within a
 * block, so it needs paged attention with heads (`attention` or `sliding` layers, more than one KV
 * head); an MLA cache (one latent vector per token) is neither NHD nor HND
 * (`faults/kinds/wrong-layout.ts`). Every other demo fault applies to every preset.
 */
export function demoFaultApplies(f: Omit<FaultSpec, 'requests'>, model: ModelConfig): boolean {
  if (f.kind === 'wrong-layout') return model.numKvHeads > 1 && model.layerTypes.some((t) => t === 'attention' || t === 'sliding');
  return true;
}

/** Options of {@link runDemo}. */
export interface DemoOptions {
  /** Prompts (one per entry); default the lines of `examples/prompts/prompts.txt`. */
  prompts?: string[];
  /** Share of loads to inject a fault into, [0, 1] (default 0.25). */
  faultRate?: number;
  /**
   * `pull` (default: NixlConnector, sequential proxy), `push` (NixlPushConnector, sequential
   * proxy), `mooncake` (MooncakeConnector, concurrent proxy): proxy, producer and consumer as
   * separate processes; `in-process`: one process, the harness's in-process connector
   * (`inprocess`: deprecated spelling, see {@link DEMO_CONNECTOR_ALIASES}).
   */
  connector?: keyof typeof DEMO_CONNECTORS | string;
  /** Report folder (default a fresh `./kvconnect-demo-report-<time>`). */
  out?: string;
  /** Model preset (default `dense-gqa`). */
  model?: string;
  maxTokens?: number;
  seed?: number;
  /** KV checksums (default true), consumer fail-closed (default true), load failure policy (default recompute). */
  checksums?: boolean;
  failClosed?: boolean;
  policy?: 'fail' | 'recompute';
  /** Multi-process only: `kv_checksum_sample_rate` of both engines (docs/checksum-extensions.md; default 1). */
  sampleRate?: number;
  /** Requests in flight at once (default 4). */
  concurrency?: number;
  /** Show a progress bar (default: when stderr is a TTY). */
  progress?: boolean;
  /** Where lines go (default console.log). */
  print?: (line: string) => void;
  /** Copy the engine and proxy processes' stderr to this process's stderr (multi-process; default false). */
  echoStderr?: boolean;
  /**
   * Multi-process: where both engines run their TP x PP workers: `processes` (one worker process
   * each: the producer's TP2 is two worker processes) or `inprocess`. Default: processes on both
   * sides, for every connector (see `PROCESS_CONNECTORS` in topology-multiprocess.ts).
   */
  workers?: WorkersMode;
  /** A custom topology for the scenario runner (single-process path, whatever the connector). */
  topology?: Topology;
  /**
   * The transfer engine the connectors move KV with (multi-process connectors): `embedded`
   * (default), `nixl` (pull, push) or `mooncake` (mooncake); see `CONNECTOR_TRANSFERS` in
   * transfer.ts. A library engine that does not load here is a one-line error naming what to
   * install and `NIXL_PREFIX` / `MOONCAKE_PREFIX`, before any process starts.
   */
  transfer?: TransferEngine | string;
}

/** What {@link runDemo} returns. */
export interface DemoResult {
  result: ScenarioResult;
  summary: RunSummary;
  outDir: string;
  reportPath: string;
  /** The connector that ran (after any fallback). */
  connector: ConnectorName;
  /** The transfer engine its connectors used. */
  transfer: TransferEngine;
  /** `processes`: proxy, producer and consumer as child processes; `in-process`: engines of this process. */
  topology: 'processes' | 'in-process';
  /** What the engine processes' /metrics said (multi-process only). */
  metrics?: ProcessMetrics;
}

/** The fault kinds the demo cycles through, one per faulted load. */
export const DEMO_FAULTS: ReadonlyArray<Omit<FaultSpec, 'requests'>> = [
  { kind: 'bit-flip', note: 'one bit of one loaded cell flipped' },
  { kind: 'misplaced-block', note: 'first loaded block gets the next block' },
  { kind: 'stale', fill: 'random', note: 'producer reused the blocks before the read (lease expired)' },
  { kind: 'wrong-layout', note: 'HND read as NHD' },
  { kind: 'payload', mode: 'truncate', note: 'checksum payload truncated' },
  { kind: 'random-stale-range', note: 'one 16-token range keeps its previous owner bytes' },
  { kind: 'payload', mode: 'drop', note: 'checksum payload missing' },
] as FaultSpec[];

/**
 * The fault kinds of the multi-process demo, one per faulted load: consumer-side faults only (the
 * demo wraps only the consumer with the FaultInjectingConnector, so `stale` and producer-side
 * payload faults are not injected there).
 */
export const DEMO_PROCESS_FAULTS: ReadonlyArray<Omit<FaultSpec, 'requests'>> = [
  { kind: 'bit-flip', note: 'one bit of one loaded cell flipped' },
  { kind: 'misplaced-block', note: 'first loaded block gets the next block' },
  { kind: 'wrong-layout', note: 'HND read as NHD' },
  { kind: 'payload', mode: 'truncate', note: 'checksum payload truncated' },
  { kind: 'payload', mode: 'drop', note: 'checksum payload missing' },
] as FaultSpec[];

/** The default prompts file (`examples/prompts/prompts.txt` of the repository), if present. */
export function defaultPromptsFile(): string | null {
  const f = fileURLToPath(new URL('../../../examples/prompts/prompts.txt', import.meta.url));
  return existsSync(f) ? f : null;
}

/** Non-empty, non-comment lines of a prompts file. */
export function readPrompts(file: string): string[] {
  return readFileSync(file, 'utf8')
    .split(/\r?\n/)
    .map((l) => l.trim())
    .filter((l) => l.length > 0 && !l.startsWith('#'));
}

/** The seeded choice of faulted requests: an exact share of `n`, in order. */
export function faultedRequests(n: number, rate: number, seed: number): number[] {
  const r = prng(seed);
  const order = Array.from({ length: n }, (_, i) => i);
  for (let i = order.length - 1; i > 0; i--) {
    const j = r() % (i + 1);
    [order[i], order[j]] = [order[j], order[i]];
  }
  return order.slice(0, Math.round(rate * n)).sort((a, b) => a - b);
}

const faultLabel = (f: Omit<FaultSpec, 'requests'>) => `${f.kind}${'mode' in f ? ` ${(f as { mode: string }).mode}` : ''}`;

/** Runs the demo and writes its report. */
export async function runDemo(o: DemoOptions = {}): Promise<DemoResult> {
  const print = o.print ?? ((l: string) => console.log(l));
  const rate = o.faultRate ?? 0.25;
  if (!(rate >= 0 && rate <= 1)) throw new RangeError(`--faults must be in [0, 1], got ${rate}`);
  const seed = o.seed ?? 1;
  let prompts = o.prompts;
  if (!prompts) {
    const f = defaultPromptsFile();
    prompts = f ? readPrompts(f) : generatedPrompts({ count: 20, promptTokens: [40, 120], seed });
  }
  if (prompts.length === 0) throw new RangeError('no prompts');
  let wanted = o.connector ?? 'pull';
  const alias = DEMO_CONNECTOR_ALIASES[wanted];
  if (alias !== undefined) {
    print(`note: --connector ${wanted} is deprecated; use --connector ${alias}`);
    wanted = alias;
  }
  const connector = DEMO_CONNECTORS[wanted];
  if (!connector) throw new RangeError(`--connector must be one of ${Object.keys(DEMO_CONNECTORS).join(', ')}, got ${wanted}`);
  if (o.policy !== undefined && o.policy !== 'fail' && o.policy !== 'recompute') throw new RangeError(`--policy must be fail or recompute, got ${String(o.policy)}`);
  const transfer = (o.transfer ?? 'embedded') as TransferEngine;
  const mismatch = transferMismatch(connector, transfer);
  if (mismatch) throw new RangeError(`--transfer: ${mismatch}`);
  const missing = transferUnavailable(transfer);
  if (missing) throw new Error(missing);
  const concurrency = o.concurrency ?? 4;
  if (!(Number.isSafeInteger(concurrency) && concurrency >= 1)) throw new RangeError(`--concurrency must be a positive integer, got ${concurrency}`);
  const ctx: DemoContext = { o, print, rate, seed, prompts, concurrency, transfer, checksums: o.checksums ?? true, failClosed: o.failClosed ?? true, policy: o.policy ?? 'recompute', model: o.model ?? 'dense-gqa', maxTokens: o.maxTokens ?? 16 };
  if (o.topology && transfer !== 'embedded') throw new RangeError(`--transfer ${transfer} needs the multi-process demo (no custom topology)`);
  if (connector === 'in-process' || o.topology) return runInProcessDemo(ctx, connector);
  return runProcessDemo(ctx, connector);
}

interface DemoContext {
  o: DemoOptions;
  print: (line: string) => void;
  rate: number;
  seed: number;
  prompts: string[];
  concurrency: number;
  transfer: TransferEngine;
  checksums: boolean;
  failClosed: boolean;
  policy: 'fail' | 'recompute';
  model: string;
  maxTokens: number;
}

function demoScenario(c: DemoContext, connector: ConnectorName, faults: FaultSpec[], faulted: number, groundTruth = true): Scenario {
  return parseScenario({
    name: 'demo',
    description: `${c.prompts.length} prompts through P/D with KV checksums ${c.checksums ? `on (${c.failClosed ? 'fail-closed' : 'fail-open'}, ${c.policy})` : 'off'}; faults injected into ${faulted} loads.`,
    model: c.model,
    connector,
    checksums: c.checksums,
    producer: { tp: 2, blockSize: 16, maxBatchedTokens: 128 },
    consumer: { tp: 1, blockSize: 32, layout: 'HND', failClosed: c.failClosed, policy: c.policy },
    requests: c.prompts.map((p) => ({ prompt: p, maxTokens: c.maxTokens })),
    concurrency: c.concurrency,
    timeoutMs: 120_000,
    faults,
    // Without the injector's ground truth (faults injected in another process) the demo checks detection itself.
    expect: { requests: [{ request: '*', output: 'reference', error: false }], noFalseVerify: groundTruth },
  });
}

function progressBar(c: DemoContext) {
  const showBar = c.o.progress ?? Boolean(process.stderr.isTTY);
  const bar = showBar ? new cliProgress.SingleBar({ format: 'P/D requests [{bar}] {value}/{total} | {verdicts}', hideCursor: true }, cliProgress.Presets.shades_classic) : null;
  const counts: Record<VerdictKind, number> = { verified: 0, mismatch: 0, unverified: 0, 'transfer-failed': 0, none: 0 };
  bar?.start(c.prompts.length, 0, { verdicts: '' });
  return {
    done(kind: VerdictKind) {
      counts[kind]++;
      bar?.increment(1, { verdicts: `verified ${counts.verified}, mismatch ${counts.mismatch}, unverified ${counts.unverified}` });
    },
    stop: () => bar?.stop(),
  };
}

/** A request's line: its faults, its load as {@link loadStatus} names it (verdict and details), the consumer's action, the output. */
function requestLine(q: RequestOutcome, consumerChecksums: boolean): string {
  return `  r${q.index}: ${q.faultKinds.join('+') || 'no fault'} -> ${loadStatus(q, consumerChecksums)}${q.verdict?.mismatches.length ? ` ${q.verdict.mismatches.map((m) => `g${m.groupId}[${m.positions.join(',')}]`).join(' ')}` : ''}${q.verdict?.unverified.length ? ` (${q.verdict.unverified.map((u) => u.reason).join(', ')})` : ''}${q.action ? `, ${q.action}` : ''}, output ${q.equalsReference ? 'identical' : 'DIFFERENT'}${q.error ? ` (error: ${q.error})` : ''}`;
}

/** The report folder (created): `--out`, or a fresh `./kvconnect-demo-report-<time>`. */
function reportDir(c: DemoContext): string {
  const outDir = resolve(c.o.out ?? `kvconnect-demo-report-${new Date().toISOString().replace(/[:.]/g, '-')}`);
  mkdirSync(outDir, { recursive: true });
  return outDir;
}

/**
 * Fills `localization` of the mismatched outcomes from the consumer's log lines of its drill-downs
 * (core/src/checksum-localize.ts logs `requestId`, `status`, `detail`, `groups[].where`), waiting up
 * to 6 s (a drill-down's deadline is 5 s) for the lines of every mismatch.
 */
async function readLocalizations(path: string, outcomes: RequestOutcome[]): Promise<void> {
  const want = () => outcomes.filter((o) => o && o.kind === 'mismatch' && !o.verdict?.wrongRequest && !o.localization);
  for (const until = performance.now() + 6000; ; ) {
    let text = '';
    try {
      text = readFileSync(path, 'utf8');
    } catch {
      return;
    }
    for (const line of text.split('\n')) {
      if (!line.includes('"status"') || !line.includes('KV checksum mismatch')) continue;
      let x: { requestId?: unknown; status?: unknown; detail?: unknown; groups?: unknown; ms?: unknown };
      try {
        x = JSON.parse(line);
      } catch {
        continue;
      }
      const i = typeof x.requestId === 'string' ? requestIndexOf(x.requestId) : undefined;
      const o = i === undefined ? undefined : outcomes[i];
      if (!o || typeof x.status !== 'string') continue;
      const groups = Array.isArray(x.groups) ? (x.groups as Array<{ groupId: number; where: string[] }>).map((g) => ({ groupId: g.groupId, regions: [], text: g.where })) : [];
      o.localization = { requestId: x.requestId as string, status: x.status as Localization['status'], detail: String(x.detail ?? ''), groups, ms: typeof x.ms === 'number' ? x.ms : 0 };
    }
    if (want().length === 0 || performance.now() > until) return;
    await new Promise((r) => setTimeout(r, 50));
  }
}

function writeReport(c: DemoContext, result: ScenarioResult, summary: RunSummary, markdown: string, extra: Record<string, unknown> = {}, outDir = reportDir(c)) {
  const run = result.runs[0];
  const reportPath = join(outDir, 'report.md');
  writeFileSync(reportPath, markdown);
  writeFileSync(
    join(outDir, 'summary.json'),
    JSON.stringify(
      {
        summary,
        ...extra,
        requests: run.requests.map((q) => ({
          index: q.index,
          faults: q.faultKinds,
          changed: Object.fromEntries(q.injected),
          verdict: q.kind,
          load: loadStatus(q, summary.consumerChecksums),
          mismatches: q.verdict?.mismatches ?? [],
          unverified: q.verdict?.unverified ?? [],
          action: q.action,
          tokens: q.tokenIds.length,
          identical: q.equalsReference,
          error: q.error,
          latencyMs: q.latencyMs,
          loadWallMs: q.loadWallMs,
          loadBytes: q.loadBytes,
        })),
        checks: result.expectations,
      },
      null,
      2,
    ),
  );
  c.print(`report: ${reportPath}`);
  return { outDir, reportPath };
}

/** The single-process demo: engines of this process over the in-process connector (or a custom topology). */
async function runInProcessDemo(c: DemoContext, connector: ConnectorName): Promise<DemoResult> {
  const { print, seed, prompts } = c;
  if (c.o.sampleRate !== undefined && c.o.sampleRate !== 1) throw new Error('sampled checking (sampleRate) runs in the multi-process demo only');
  if (connector !== 'in-process') {
    const r = await resolveConnector(connector);
    if ('skip' in r) {
      print(`note: ${r.skip}; running over the in-process connector instead`);
      connector = 'in-process';
    }
  }
  // Faulted loads: an exact share of the requests, chosen from the seed; kinds in turn.
  const hit = faultedRequests(prompts.length, c.rate, seed);
  const kinds = DEMO_FAULTS.filter((f) => demoFaultApplies(f, resolveModelSpec(c.model)));
  const faults = hit.map((i, k) => ({ ...kinds[k % kinds.length], requests: [i], seed: seed + i }));
  const scenario = demoScenario(c, connector, faults as FaultSpec[], hit.length);
  const setup = [
    `one process: model ${c.model}; producer TP2, block 16, NHD; consumer TP1, block 32, HND`,
    `connector ${connector} (wrapped by FaultInjectingConnector, loaded by module path)`,
    `checksums ${c.checksums ? 'on' : 'off'}, ${c.failClosed ? 'fail-closed' : 'fail-open'}, policy ${c.policy}; fault rate ${c.rate} (seed ${seed})`,
    `faulted requests: ${faults.map((f) => `r${f.requests[0]} ${faultLabel(f)}`).join(', ') || 'none'}`,
  ];
  for (const l of setup) print(l);
  const bar = progressBar(c);
  let result: ScenarioResult;
  try {
    result = await runScenario(scenario, { topology: c.o.topology, onRequestDone: (q) => bar.done(q.kind) });
  } finally {
    bar.stop();
  }
  const run = result.runs[0];
  const summary = summarize(run, c.checksums);
  for (const l of summaryLines(summary)) print(l);
  for (const q of run.requests) print(requestLine(q, c.checksums));
  print(`note: ${weightsNote(c.model)}`);
  const md = replaceSummaryTable(markdownReport(result, { title: 'kvconnect demo: P/D with KV checksums under injected faults', setup, prompts }), [...summaryLines(summary), `note: ${weightsNote(c.model)}`]);
  const { outDir, reportPath } = writeReport(c, result, summary, md);
  return { result, summary, outDir, reportPath, connector, transfer: 'embedded', topology: 'in-process' };
}

/** A completion answer of the proxy process (the fields the demo reads). */
interface ProxyAnswer {
  choices?: Array<{ token_ids?: number[]; text?: string; finish_reason?: string }>;
  error?: { message?: string };
  kvconnect?: { decode?: { request_id?: string; engine_id?: string; load?: LoadInfo; error?: string; kv_transfer_params?: KVTransferParams } };
}

const fmt = (x: number, d = 1) => x.toFixed(d);
const bytesText = (n: number) => (n >= 1 << 20 ? `${fmt(n / (1 << 20), 2)} MiB` : n >= 1024 ? `${fmt(n / 1024, 1)} KiB` : `${n} B`);

/**
 * Summary lines of the multi-process demo: connector transfer time and checksum numbers from the
 * processes' metrics (n/a when not exposed), and the load wall time summed over requests from the
 * consumer's ground truth (a different figure: see `RunSummary.loadWallMs`, docs/scenarios.md).
 */
export function processSummaryLines(s: RunSummary, m: ProcessMetrics | null, faulted: number): string[] {
  const transfer =
    m && m.transferSeconds !== null
      ? `${fmt(m.transferSeconds * 1000)} ms${m.transfers !== null ? ` over ${m.transfers} transfers` : ''}${m.transferBytes !== null ? `, ${bytesText(m.transferBytes)} moved` : ''}`
      : `n/a (the engine processes expose no transfer metrics${m && m.connectorMetrics.length ? `; found ${m.connectorMetrics.join(', ')}` : ''})${m && m.transferBytes !== null ? `; ${bytesText(m.transferBytes)} moved` : ''}`;
  const cs = (sec: number | null, b: number | null) => (sec === null ? 'n/a' : `${fmt(sec * 1000, 2)} ms${b === null ? '' : ` over ${bytesText(b)}`}`);
  return [
    `requests: ${s.requests} (${faulted} with a consumer-side fault injected)`,
    verdictLine(s),
    `recomputed / failed / errors returned: ${s.recomputed} / ${s.failed} / ${s.errors}`,
    `outputs identical to a single instance: ${s.identical}/${s.requests}`,
    `connector transfer time: ${transfer}`,
    `load wall time: ${fmt(s.loadWallMs)} ms summed over requests, ${bytesText(s.loadBytes)} loaded`,
    `checksum time: producer ${m ? cs(m.checksumSeconds.send, m.checksumBytes.send) : 'n/a'}, consumer ${m ? cs(m.checksumSeconds.recv, m.checksumBytes.recv) : 'n/a'}`,
    ...extensionLines(s),
    `wall time: ${fmt(s.wallMs / 1000, 2)} s`,
  ];
}

/** Replaces the rows of the report's first Summary table with `lines` (`key: value`). */
function replaceSummaryTable(md: string, lines: string[]): string {
  const out = md.split('\n');
  const h = out.indexOf('## Summary');
  if (h < 0) return md;
  let i = h + 1;
  while (i < out.length && !out[i].startsWith('|---')) i++;
  if (i >= out.length) return md;
  let j = i + 1;
  while (j < out.length && out[j].startsWith('|')) j++;
  const esc = (s: string) => s.replace(/\|/g, '\\|').replace(/\n/g, ' ');
  const rows = lines.map((l) => {
    const [k, ...v] = l.split(': ');
    return `| ${esc(k)} | ${esc(v.join(': '))} |`;
  });
  out.splice(i + 1, j - i - 1, ...rows);
  return out.join('\n');
}

/** How the setup line names a transfer engine (with the loopback defaults the engine processes get). */
function transferLabel(t: TransferEngine): string {
  if (t === 'embedded') return 'the embedded transfer agent';
  const env = Object.entries(loopbackTransferEnv(t)).map(([k, v]) => `${k}=${v}`);
  return `${t === 'nixl' ? 'NIXL' : 'the Mooncake Transfer Engine'} (transfer ${t}${env.length ? `; engine processes get ${env.join(' ')}` : ''})`;
}

/** The consumer's block size in the demo (every group; see `demoScenario` and `startPDProcesses`). */
const CONSUMER_BLOCK_SIZE = 32;

/** The default demo: proxy, producer and consumer as separate processes on 127.0.0.1. */
async function runProcessDemo(c: DemoContext, connector: Exclude<ConnectorName, 'in-process'>): Promise<DemoResult> {
  const { print, seed, prompts } = c;
  const t0 = performance.now();
  const spec = PROCESS_CONNECTORS[connector];
  // Faults pick their request by its index, carried with the request: prompt i goes to the proxy
  // with request_id `r<i>.<run>`, so the consumer's request is `r<i>.<run>-d` (`requests: [i]`),
  // whatever the order requests arrive in. An exact, seeded share of the requests.
  const model = resolveModelSpec(c.model);
  if (c.o.workers !== undefined && c.o.workers !== 'processes' && c.o.workers !== 'inprocess') throw new RangeError(`--workers must be processes or inprocess, got ${String(c.o.workers)}`);
  const workers = c.o.workers === undefined ? spec.workers : { producer: c.o.workers, consumer: c.o.workers };
  const where = (w: WorkersMode, tp: number) => (w === 'processes' ? `${tp} worker process${tp > 1 ? 'es' : ''}` : 'in the engine process');
  const kinds = DEMO_PROCESS_FAULTS.filter((f) => demoFaultApplies(f, model));
  const hit = faultedRequests(prompts.length, c.rate, seed);
  const planned = new Map(hit.map((n, k) => [n, kinds[k % kinds.length]]));
  const faults = hit.map((n) => ({ ...planned.get(n)!, requests: [n], seed: seed + n }) as FaultSpec);
  const scenario = demoScenario(c, connector, [], hit.length);
  const runId = `demo-${process.pid}-${Date.now().toString(36)}`;
  const outDir = reportDir(c);
  const setup = [
    `processes on 127.0.0.1: proxy (${spec.mode}), producer engine (TP2, block 16, NHD), consumer engine (TP1, block 32, HND); model ${c.model}`,
    `workers: producer ${where(workers.producer, 2)}, consumer ${where(workers.consumer, 1)}`,
    `connector ${spec.name} over ${transferLabel(c.transfer)}; consumer side wrapped by FaultInjectingConnector (loaded by module path)`,
    `checksums ${c.checksums ? 'on' : 'off'}${c.o.sampleRate !== undefined && c.o.sampleRate < 1 ? ` (sampled, rate ${c.o.sampleRate})` : ''}, ${c.failClosed ? 'fail-closed' : 'fail-open'}, policy ${c.policy}; fault rate ${c.rate} (seed ${seed}), consumer-side faults only`,
    `faulted requests: ${hit.map((n) => `r${n} ${faultLabel(planned.get(n)!)}`).join(', ') || 'none'}`,
    `each process's stdout and stderr: proxy.log, producer.log, consumer.log in ${outDir}`,
  ];
  for (const l of setup) print(l);
  // The single instance: a greedy engine of this process, on the same prompts.
  const reference = new Engine({ model, numBlocks: 4096, maxNumBatchedTokens: 512, engineId: `demo-reference-${process.pid}` });
  let pd: PDProcesses | null = null;
  let interrupted: NodeJS.Signals | null = null;
  const onSignal = (sig: NodeJS.Signals) => {
    interrupted = sig;
    print(`${sig}: stopping the proxy and engine processes`);
    void (pd?.shutdown() ?? Promise.resolve()).finally(() => process.exit(sig === 'SIGINT' ? 130 : 143));
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  let bar: ReturnType<typeof progressBar> | null = null;
  try {
    const refP = Promise.all(prompts.map((p) => reference.generate(p, { maxTokens: c.maxTokens, temperature: 0, ignoreEos: true })));
    refP.catch(() => {});
    pd = await startPDProcesses({ connector, transfer: c.transfer, model, checksums: c.checksums, failClosed: c.failClosed, policy: c.policy, sampleRate: c.o.sampleRate, faults, workers: c.o.workers, idPrefix: `demo-${process.pid}`, echoStderr: c.o.echoStderr, logDir: outDir });
    if (interrupted) throw new Error(`interrupted (${interrupted})`);
    print(`started: proxy ${pd.url} (pid ${pd.proxy.pid}), producer ${pd.producer.url} (pid ${pd.producer.pid}), consumer ${pd.consumer.url} (pid ${pd.consumer.pid})`);
    const workerProcesses = await pd.workerPids();
    const references = (await refP).map((r) => r.tokenIds);
    const tRun = performance.now();
    const outcomes: RequestOutcome[] = new Array(prompts.length);
    const injections: InjectionRecord[] = [];
    const loadRecords: LoadRecord[] = [];
    bar = progressBar(c);
    let next = 0;
    const url = `${pd.url}/v1/completions`;
    const worker = async () => {
      while (next < prompts.length) {
        const i = next++;
        const started = performance.now();
        let body: ProxyAnswer = {};
        let error: string | undefined;
        try {
          const res = await fetch(url, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ prompt: prompts[i], max_tokens: c.maxTokens, temperature: 0, ignore_eos: true, request_id: `r${i}.${runId}` }),
            signal: AbortSignal.timeout(scenario.timeoutMs),
          });
          body = (await res.json().catch(() => ({}))) as ProxyAnswer;
          if (res.status !== 200) error = `HTTP ${res.status}: ${body.error?.message ?? 'no message'}`;
        } catch (e) {
          error = e instanceof Error ? e.message : String(e);
        }
        const choice = body.choices?.[0];
        const tokenIds = choice?.token_ids ?? [];
        const dec = body.kvconnect?.decode;
        const load = dec?.load;
        // The consumer's ground truth (what its fault connector injected and loaded), with the answer.
        let report: ReturnType<typeof faultReportOf> = null;
        try {
          report = faultReportOf(dec?.kv_transfer_params);
        } catch (e) {
          error ??= `consumer fault report: ${e instanceof Error ? e.message : String(e)}`;
        }
        if (report && report.engineId === pd!.consumer.engineId) {
          injections.push(...report.injections);
          loadRecords.push(...report.loads);
        }
        const verdict: Verdict | null = load
          ? { verdict: load.verdict, mismatches: load.mismatches, unverified: load.unverified as Verdict['unverified'], leftOut: [], wrongRequest: load.wrong_request ?? false, identity: load.identity ?? 'none', ...(load.sampled ? { sampled: load.sampled } : {}), ...(load.sub_block_groups ? { subBlockGroups: load.sub_block_groups } : {}) }
          : null;
        const o: RequestOutcome = {
          index: i,
          run: 0,
          tokenIds,
          text: choice?.text ?? '',
          finishReason: (error && !choice ? 'error' : (choice?.finish_reason ?? 'error')) as RequestOutcome['finishReason'],
          error: error ?? dec?.error,
          verdict,
          kind: load ? load.verdict : 'none',
          action: load ? load.action : null,
          invalidBlocks: false,
          localization: null,
          reference: references[i],
          equalsReference: tokenIds.length === references[i].length && tokenIds.every((t, k) => t === references[i][k]),
          injected: new Map(),
          faultKinds: [],
          loadWallMs: null,
          loadBytes: 0,
          latencyMs: performance.now() - started,
        };
        applyGroundTruth(o, injections, loadRecords, new Set([pd!.consumer.engineId]), () => CONSUMER_BLOCK_SIZE);
        // The planned fault's label (with its payload mode) for the kind the consumer recorded.
        const fault = planned.get(i);
        if (fault) o.faultKinds = o.faultKinds.map((k) => (k === fault.kind ? faultLabel(fault) : k));
        outcomes[i] = o;
        bar!.done(o.kind);
      }
    };
    await Promise.all(Array.from({ length: Math.min(c.concurrency, prompts.length) }, worker));
    bar.stop();
    bar = null;
    const wallMs = performance.now() - tRun;
    // Mismatch drill-downs end after their loads' decisions, in the consumer process: read them from its log.
    await readLocalizations(join(outDir, 'consumer.log'), outcomes);
    const metrics = await pd.metrics();
    const run: RunOutcome = {
      label: '',
      spec: scenario.runs[0],
      requests: outcomes,
      checksumSeconds: { send: metrics.checksumSeconds.send ?? 0, recv: metrics.checksumSeconds.recv ?? 0 },
      checksumBytes: { send: metrics.checksumBytes.send ?? 0, recv: metrics.checksumBytes.recv ?? 0 },
      records: injections,
      loads: loadRecords,
      wallMs,
    };
    const expectations = checkExpectations(scenario, [run]);
    // Every planned fault landed on the request it was planned for (the consumer's ground truth).
    const missing = hit.filter((n) => !outcomes[n].faultKinds.includes(faultLabel(planned.get(n)!))).map((n) => `r${n} ${faultLabel(planned.get(n)!)}: not injected`);
    const stray = outcomes.filter((q) => !planned.has(q.index) && q.faultKinds.length > 0).map((q) => `r${q.index}: ${q.faultKinds.join('+')} injected, none planned`);
    expectations.push({ ok: missing.length + stray.length === 0, line: `${missing.length + stray.length === 0 ? 'PASS' : 'FAIL'} demo: each of the ${hit.length} planned fault(s) injected into its own request, no other${missing.length + stray.length ? ` -- ${[...missing, ...stray].slice(0, 4).join('; ')}` : ''}` });
    if (c.checksums) {
      const missed = outcomes.filter((q) => q.faultKinds.length > 0 && q.kind === 'verified').map((q) => `r${q.index} (${q.faultKinds.join('+')}) verified`);
      const n = outcomes.filter((q) => q.faultKinds.length > 0).length;
      expectations.push({ ok: missed.length === 0, line: `${missed.length === 0 ? 'PASS' : 'FAIL'} demo: every one of the ${n} faulted load(s) detected (mismatch or unverified)${missed.length ? ` -- ${missed.slice(0, 4).join('; ')}` : ''}` });
    }
    const result: ScenarioResult = { scenario, runs: [run], expectations, durationMs: performance.now() - t0 };
    const summary = summarize(run, c.checksums);
    const faulted = outcomes.filter((q) => q.faultKinds.length > 0).length;
    const lines = [...processSummaryLines(summary, metrics, faulted), `note: ${weightsNote(c.model)}`];
    for (const l of lines) print(l);
    for (const q of run.requests) print(requestLine(q, c.checksums));
    const fullSetup = [
      ...setup,
      `proxy ${pd.url} (pid ${pd.proxy.pid}); producer ${pd.producer.engineId} ${pd.producer.url} (pid ${pd.producer.pid}); consumer ${pd.consumer.engineId} ${pd.consumer.url} (pid ${pd.consumer.pid})`,
      'single instance: a greedy engine of the demo process, same prompts',
    ];
    const ms = (x: number | null) => (x === null ? 'n/a' : fmt(x * 1000, 2));
    let md = markdownReport(result, { title: 'kvconnect demo: P/D across processes with KV checksums under injected faults', setup: fullSetup, prompts });
    md = replaceSummaryTable(md, lines);
    md += [
      '',
      '## Process metrics',
      '',
      'Scraped from each engine process\'s `GET /metrics` after the run (n/a: not exposed).',
      '',
      '| metric | value |',
      '|---|---|',
      `| consumer loads by verdict | ${metrics.loads ? Object.entries(metrics.loads).map(([k, v]) => `${k} ${v}`).join(', ') : 'n/a'} |`,
      `| consumer loads recomputed / failed | ${metrics.recomputed ?? 'n/a'} / ${metrics.failed ?? 'n/a'} |`,
      `| checksum time, ms (producer / consumer) | ${ms(metrics.checksumSeconds.send)} / ${ms(metrics.checksumSeconds.recv)} |`,
      `| checksum bytes summed (producer / consumer) | ${metrics.checksumBytes.send ?? 'n/a'} / ${metrics.checksumBytes.recv ?? 'n/a'} |`,
      `| connector transfer time, ms / transfers / bytes | ${ms(metrics.transferSeconds)} / ${metrics.transfers ?? 'n/a'} / ${metrics.transferBytes ?? 'n/a'} |`,
      `| connector metrics found | ${metrics.connectorMetrics.join(', ') || 'none'} |`,
      '',
      'Faults were injected by the consumer process; its fault connector returned each request\'s ground truth (fault kinds, the blocks whose bytes really changed, load time and bytes) with the request, which the Requests table shows. Producer-side faults (`stale`, producer-side `payload`) are not injected here (only the consumer is wrapped): run `--connector in-process` for them.',
      '',
    ].join('\n');
    const { reportPath } = writeReport(c, result, summary, md, { topology: 'processes', transfer: c.transfer, metrics, processes: { proxy: pd.proxy.pid, producer: pd.producer.pid, consumer: pd.consumer.pid }, workerProcesses, logs: ['proxy.log', 'producer.log', 'consumer.log'] }, outDir);
    return { result, summary, outDir, reportPath, connector, transfer: c.transfer, topology: 'processes', metrics };
  } finally {
    bar?.stop();
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    await pd?.shutdown();
    await reference.shutdown();
  }
}

/**
 * `kvconnect demo`: a batch of real text prompts through P/D with KV checksums on (fail-closed,
 * recompute), faults injected into a share of the loads, a progress bar, a summary, and a Markdown
 * report with plots in a folder of its own.
 *
 * The topology is pluggable ({@link DemoOptions.topology}): today producer and consumer run as
 * engines of this process over the harness's in-process connector (or a NIXL / Mooncake connector
 * when its package is installed); a multi-process topology (engine server processes) plugs in
 * through the same {@link Topology} type.
 * @module
 */
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import cliProgress from 'cli-progress';
import type { FaultSpec } from './faults.js';
import { prng } from './locate.js';
import { generatedPrompts } from './prompts.js';
import { markdownReport, summarize, summaryLines, type RunSummary } from './report.js';
import { resolveConnector, runScenario, type ScenarioResult, type Topology } from './runner.js';
import { parseScenario, type ConnectorName } from './scenario.js';

/** `--connector` values and the scenario connector each means. */
export const DEMO_CONNECTORS: Readonly<Record<string, ConnectorName>> = Object.freeze({ inprocess: 'in-process', pull: 'nixl-pull', push: 'nixl-push', mooncake: 'mooncake' });

/** Options of {@link runDemo}. */
export interface DemoOptions {
  /** Prompts (one per entry); default the lines of `examples/prompts/prompts.txt`. */
  prompts?: string[];
  /** Share of loads to inject a fault into, [0, 1] (default 0.25). */
  faultRate?: number;
  /** `inprocess` (default), `pull`, `push`, `mooncake`. */
  connector?: keyof typeof DEMO_CONNECTORS | string;
  /** Report folder (default a fresh `./kvconnect-demo-report-<time>`). */
  out?: string;
  /** Model preset (default `dense-gqa`). */
  model?: string;
  maxTokens?: number;
  seed?: number;
  /** Show a progress bar (default: when stderr is a TTY). */
  progress?: boolean;
  /** Where lines go (default console.log). */
  print?: (line: string) => void;
  topology?: Topology;
}

/** What {@link runDemo} returns. */
export interface DemoResult {
  result: ScenarioResult;
  summary: RunSummary;
  outDir: string;
  reportPath: string;
  /** The connector that ran (after any fallback). */
  connector: ConnectorName;
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
  const wanted = o.connector ?? 'inprocess';
  let connector = DEMO_CONNECTORS[wanted];
  if (!connector) throw new RangeError(`--connector must be one of ${Object.keys(DEMO_CONNECTORS).join(', ')}, got ${wanted}`);
  if (connector !== 'in-process') {
    const c = await resolveConnector(connector);
    if ('skip' in c) {
      print(`note: ${c.skip}; running over the in-process connector instead`);
      connector = 'in-process';
    }
  }
  // Faulted loads: an exact share of the requests, chosen from the seed; kinds in turn.
  const r = prng(seed);
  const order = prompts.map((_, i) => i);
  for (let i = order.length - 1; i > 0; i--) {
    const j = r() % (i + 1);
    [order[i], order[j]] = [order[j], order[i]];
  }
  const hit = order.slice(0, Math.round(rate * prompts.length)).sort((a, b) => a - b);
  const faults = hit.map((i, k) => ({ ...DEMO_FAULTS[k % DEMO_FAULTS.length], requests: [i], seed: seed + i }));
  const scenario = parseScenario({
    name: 'demo',
    description: `${prompts.length} prompts through P/D with KV checksums (fail-closed, recompute); faults injected into ${hit.length} loads.`,
    model: o.model ?? 'dense-gqa',
    connector,
    producer: { tp: 2, blockSize: 16, maxBatchedTokens: 128 },
    consumer: { tp: 1, blockSize: 32, layout: 'HND', failClosed: true, policy: 'recompute' },
    requests: prompts.map((p) => ({ prompt: p, maxTokens: o.maxTokens ?? 16 })),
    concurrency: 4,
    faults,
    expect: { requests: [{ request: '*', output: 'reference', error: false }] },
  });
  const setup = [
    `model ${o.model ?? 'dense-gqa'}; producer TP2, block 16, NHD; consumer TP1, block 32, HND`,
    `connector ${connector} (wrapped by FaultInjectingConnector, loaded by module path)`,
    `checksums on, fail-closed, policy recompute; fault rate ${rate} (seed ${seed})`,
    `faulted requests: ${faults.map((f) => `r${f.requests[0]} ${f.kind}${'mode' in f ? ` ${(f as { mode: string }).mode}` : ''}`).join(', ') || 'none'}`,
  ];
  for (const l of setup) print(l);
  const showBar = o.progress ?? Boolean(process.stderr.isTTY);
  const bar = showBar ? new cliProgress.SingleBar({ format: 'P/D requests [{bar}] {value}/{total} | {verdicts}', hideCursor: true }, cliProgress.Presets.shades_classic) : null;
  const counts = { verified: 0, mismatch: 0, unverified: 0, none: 0 };
  bar?.start(prompts.length, 0, { verdicts: '' });
  let result: ScenarioResult;
  try {
    result = await runScenario(scenario, {
      topology: o.topology,
      onRequestDone: (q) => {
        counts[q.kind]++;
        bar?.increment(1, { verdicts: `verified ${counts.verified}, mismatch ${counts.mismatch}, unverified ${counts.unverified}` });
      },
    });
  } finally {
    bar?.stop();
  }
  const run = result.runs[0];
  const summary = summarize(run);
  for (const l of summaryLines(summary)) print(l);
  for (const q of run.requests) {
    print(`  r${q.index}: ${q.faultKinds.join('+') || 'no fault'} -> ${q.kind}${q.verdict?.mismatches.length ? ` ${q.verdict.mismatches.map((m) => `g${m.groupId}[${m.positions.join(',')}]`).join(' ')}` : ''}${q.verdict?.unverified.length ? ` (${q.verdict.unverified.map((u) => u.reason).join(', ')})` : ''}, ${q.action ?? 'no load'}, output ${q.equalsReference ? 'identical' : 'DIFFERENT'}`);
  }
  const outDir = resolve(o.out ?? `kvconnect-demo-report-${new Date().toISOString().replace(/[:.]/g, '-')}`);
  mkdirSync(outDir, { recursive: true });
  const reportPath = join(outDir, 'report.md');
  writeFileSync(reportPath, markdownReport(result, { title: 'kvconnect demo: P/D with KV checksums under injected faults', setup, prompts }));
  writeFileSync(
    join(outDir, 'summary.json'),
    JSON.stringify(
      {
        summary,
        requests: run.requests.map((q) => ({
          index: q.index,
          faults: q.faultKinds,
          changed: Object.fromEntries(q.injected),
          verdict: q.kind,
          mismatches: q.verdict?.mismatches ?? [],
          unverified: q.verdict?.unverified ?? [],
          action: q.action,
          tokens: q.tokenIds.length,
          identical: q.equalsReference,
          transferMs: q.transferMs,
          loadBytes: q.loadBytes,
        })),
        checks: result.expectations,
      },
      null,
      2,
    ),
  );
  print(`report: ${reportPath}`);
  return { result, summary, outDir, reportPath, connector };
}

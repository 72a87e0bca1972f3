/**
 * Scenarios: a JSON description of a P/D setup, its requests, the faults to inject and the
 * expected outcome (`docs/scenarios.md` documents every field). {@link parseScenario} validates
 * strictly and reports every problem with its JSON path.
 * @module
 */
import { readFileSync } from 'node:fs';
import type { UnverifiedReason } from '@kvconnect/checksum';
import { checkFaultList, type FaultSpec } from './faults.js';
import { checkModel, type ModelSpec } from './models.js';
import { transferMismatch, type TransferEngine } from './transfer.js';
import { Checker, ValidationError, at, isObject } from './validate.js';

/** Connectors a scenario may name. `in-process` always runs; the others run when their package is installed. */
export const CONNECTORS = ['in-process', 'nixl-pull', 'nixl-push', 'mooncake'] as const;
/** A scenario connector. */
export type ConnectorName = (typeof CONNECTORS)[number];

/** One side of the P/D pair (all optional). */
export interface SideSpec {
  /** TP ranks per PP stage (default 1). */
  tp?: number;
  /** PP stages (default 1). */
  pp?: number;
  /** Tokens per KV block (default 16). */
  blockSize?: number;
  /** Attention cache layout inside a block (default NHD). */
  layout?: 'NHD' | 'HND';
  /** How K and V are stored (default kv-first). */
  kvLayout?: 'kv-first' | 'block-kv' | 'separate';
  /** KV cache dtype (default bfloat16). */
  dtype?: 'bfloat16' | 'float16' | 'float32';
  /** Before each request, compute its first N prompt tokens on this side so its prefix cache hits them. */
  prefixHitTokens?: number;
  /** Token budget per step (default 256; smaller chunks prefills). */
  maxBatchedTokens?: number;
  /** Blocks in the pool (default 256). */
  numBlocks?: number;
  /** Prefix caching (default true). */
  prefixCaching?: boolean;
  /**
   * Where this side's engine keeps its KV cache (the engine's `device`, default `cpu`): `cuda`
   * (GPU memory) or `cuda-emulated` (emulated device memory, CI). Device KV needs a device-capable
   * inner connector (NIXL over the embedded agent).
   */
  device?: 'cpu' | 'cuda' | 'cuda-emulated';
  /** KV checksums on this side (default: the scenario's `checksums`). */
  checksums?: boolean;
  /** Consumer: `kv_checksum_fail_closed` (default true). */
  failClosed?: boolean;
  /** Consumer: `kv_load_failure_policy` (default recompute). */
  policy?: 'fail' | 'recompute';
  /** Consumer: data-parallel consumer engines; requests go round robin (default 1). */
  dp?: number;
}

/** One request. Give `prompt` (text or token ids), or `promptTokens` (a generated text of exactly that many tokens, BOS included). */
export interface RequestSpec {
  prompt?: string | number[];
  promptTokens?: number;
  /** Seed of the generated prompt text (default the request index). */
  promptSeed?: number;
  /** The prompt is request `continueFrom`'s prompt plus its reference output (a multi-turn follow-up). */
  continueFrom?: number;
  /** The consumer's prompt is the producer's plus the first sampled token (a proxy that appends it). */
  appendFirstToken?: boolean;
  /** Tokens to generate (default 8). */
  maxTokens?: number;
  /** 0 = greedy (default). */
  temperature?: number;
  seed?: number;
  /** Default true (outputs of a fixed length). */
  ignoreEos?: boolean;
}

/** Generated requests: `count` prompts of real words, some sharing a prefix. */
export interface GenerateSpec {
  count: number;
  /** Prompt length range in tokens, BOS included (default [17, 64]). */
  promptTokens?: [number, number];
  /** Share of prompts that start with a common prefix (default 0). */
  sharedPrefix?: number;
  /** Length of that prefix in tokens (default 32). */
  prefixTokens?: number;
  maxTokens?: number;
  seed?: number;
}

/**
 * A verdict kind (SPEC 8), `transfer-failed` when the load failed in transit (nothing verified), or
 * `none` when the consumer did not load (nothing to verify).
 */
export type VerdictKind = 'verified' | 'mismatch' | 'unverified' | 'transfer-failed' | 'none';
/** How a request finished (`timeout`: the harness stopped waiting). */
export type FinishKind = 'stop' | 'length' | 'error' | 'abort' | 'timeout';

/** An expectation about some requests. */
export interface RequestExpectation {
  /** Request index, indices, or `*` (every request). */
  request: number | number[] | '*';
  /** Only this run (index into `runs`); default every run. */
  run?: number;
  /** Expected verdict (a list: any of them). */
  verdict?: VerdictKind | VerdictKind[];
  /** With a mismatch: exactly these groups and consumer block positions. */
  mismatches?: Array<{ group: number; positions: number[] }>;
  /** SPEC 8.0: the verdict says the KV and checksums belong to another request (true), or not (false). */
  wrongRequest?: boolean;
  /** Unverified reasons that must all be reported (a string: any group; an object: that group, null = load level). */
  reasons?: Array<UnverifiedReason | { group: number | null; reason: UnverifiedReason }>;
  /** What the consumer did with the load. */
  action?: 'use' | 'recompute' | 'fail' | Array<'use' | 'recompute' | 'fail'>;
  /** The output compared with a single instance: equal (`reference`), not equal, no tokens (`empty`), anything. */
  output?: 'reference' | 'different' | 'empty' | 'any';
  finishReason?: FinishKind | FinishKind[];
  /** The request ended with an error (true) or without one (false). */
  error?: boolean;
}

/** Scenario-wide expectations. */
export interface Expectations {
  requests?: RequestExpectation[];
  /** No request whose loaded bytes the injector changed is VERIFIED (default true). */
  noFalseVerify?: boolean;
  /** No request produced tokens from a load that was not verified (default: true when the consumer is fail-closed with checksums on). */
  noTokensFromUnverified?: boolean;
  /** Every request with changed bytes mismatches at exactly those positions; every other load verifies. */
  mismatchesAtInjections?: boolean;
  /** Exact counts over all runs: verdicts, recomputed / failed loads, requests with changed bytes (`injected`). */
  counts?: Partial<Record<VerdictKind | 'recomputed' | 'failed' | 'injected', number>>;
  /** Every run produced the same token ids for each request. */
  sameOutputsAcrossRuns?: boolean;
}

/** A run of the request set: checksums and faults can be switched per run (e.g. determinism). */
export interface RunSpec {
  label?: string;
  checksums?: boolean;
  faults?: boolean;
}

/** A validated scenario. */
export interface Scenario {
  name: string;
  description?: string;
  source?: string;
  model: ModelSpec;
  connector: ConnectorName;
  /** Extra config of the inner connector. */
  connectorConfig?: Record<string, unknown>;
  /**
   * The transfer engine the connector moves KV with (default `embedded`): `nixl` for `nixl-pull` /
   * `nixl-push`, `mooncake` for `mooncake` (`CONNECTOR_TRANSFERS` in transfer.ts). The runner
   * skips the scenario, with the one-line reason, where the library does not load.
   */
  transfer: TransferEngine;
  /** KV checksums on both sides (default true). */
  checksums: boolean;
  /** `sequential` (NIXL style, default) or `concurrent` (Mooncake style) proxying. */
  mode: 'sequential' | 'concurrent';
  producer: SideSpec;
  consumer: SideSpec;
  requests: RequestSpec[];
  generate?: GenerateSpec;
  /** Requests in flight at once (default 1). */
  concurrency: number;
  faults: FaultSpec[];
  runs: RunSpec[];
  /** Per-request wait limit in ms (default 30000). */
  timeoutMs: number;
  expect: Expectations;
}

const TOP = ['$schema', 'name', 'description', 'source', 'model', 'connector', 'connectorConfig', 'transfer', 'checksums', 'mode', 'producer', 'consumer', 'requests', 'generate', 'concurrency', 'faults', 'runs', 'timeoutMs', 'expect'];
const SIDE = ['tp', 'pp', 'blockSize', 'layout', 'kvLayout', 'dtype', 'prefixHitTokens', 'maxBatchedTokens', 'numBlocks', 'prefixCaching', 'device', 'checksums'];
const CONSUMER = [...SIDE, 'failClosed', 'policy', 'dp'];
const REQUEST = ['prompt', 'promptTokens', 'promptSeed', 'continueFrom', 'appendFirstToken', 'maxTokens', 'temperature', 'seed', 'ignoreEos'];
const GENERATE = ['count', 'promptTokens', 'sharedPrefix', 'prefixTokens', 'maxTokens', 'seed'];
const EXPECT = ['requests', 'noFalseVerify', 'noTokensFromUnverified', 'mismatchesAtInjections', 'counts', 'sameOutputsAcrossRuns'];
const REQ_EXPECT = ['request', 'run', 'verdict', 'mismatches', 'wrongRequest', 'reasons', 'action', 'output', 'finishReason', 'error'];
const VERDICTS: VerdictKind[] = ['verified', 'mismatch', 'unverified', 'transfer-failed', 'none'];
const FINISH: FinishKind[] = ['stop', 'length', 'error', 'abort', 'timeout'];
const ACTIONS = ['use', 'recompute', 'fail'] as const;
/** SPEC 8 reason codes. */
export const REASONS: UnverifiedReason[] = ['no-payload', 'malformed-payload', 'workers-missing', 'covered-one-side', 'fingerprint', 'rows-differ', 'replica-missing', 'uncovered-tokens', 'block-size', 'unaligned-prefix', 'nothing-to-verify'];
const COUNT_KEYS = [...VERDICTS, 'recomputed', 'failed', 'injected'];

function checkSide(c: Checker, raw: unknown, path: string, consumer: boolean): SideSpec | undefined {
  const o = c.object(raw, path, consumer ? CONSUMER : SIDE);
  if (!o) return undefined;
  const int = (k: string, min: number) => o[k] !== undefined && c.int(o[k], at(path, k), { min });
  int('tp', 1);
  int('pp', 1);
  int('blockSize', 1);
  int('prefixHitTokens', 0);
  int('maxBatchedTokens', 1);
  int('numBlocks', 1);
  int('dp', 1);
  if (o.layout !== undefined) c.oneOf(o.layout, at(path, 'layout'), ['NHD', 'HND']);
  if (o.kvLayout !== undefined) c.oneOf(o.kvLayout, at(path, 'kvLayout'), ['kv-first', 'block-kv', 'separate']);
  if (o.dtype !== undefined) c.oneOf(o.dtype, at(path, 'dtype'), ['bfloat16', 'float16', 'float32']);
  if (o.device !== undefined) c.oneOf(o.device, at(path, 'device'), ['cpu', 'cuda', 'cuda-emulated']);
  for (const k of ['prefixCaching', 'checksums', 'failClosed']) if (o[k] !== undefined) c.boolean(o[k], at(path, k));
  if (o.policy !== undefined) c.oneOf(o.policy, at(path, 'policy'), ['fail', 'recompute']);
  return o as SideSpec;
}

function checkRequest(c: Checker, raw: unknown, path: string, index: number): void {
  const o = c.object(raw, path, REQUEST);
  if (!o) return;
  const sources = ['prompt', 'promptTokens', 'continueFrom'].filter((k) => o[k] !== undefined);
  if (sources.length !== 1) c.fail(path, `give exactly one of prompt, promptTokens, continueFrom (got ${sources.length ? sources.join(', ') : 'none'})`);
  if (o.prompt !== undefined) {
    if (typeof o.prompt === 'string') {
      if (o.prompt.length === 0) c.fail(at(path, 'prompt'), 'must not be empty');
    } else c.intArray(o.prompt, at(path, 'prompt'), { min: 0, nonEmpty: true });
  }
  if (o.promptTokens !== undefined) c.int(o.promptTokens, at(path, 'promptTokens'), { min: 2 });
  if (o.promptSeed !== undefined) c.int(o.promptSeed, at(path, 'promptSeed'));
  if (o.continueFrom !== undefined && c.int(o.continueFrom, at(path, 'continueFrom'), { min: 0 }) !== undefined && (o.continueFrom as number) >= index) {
    c.fail(at(path, 'continueFrom'), `must name an earlier request (< ${index})`);
  }
  if (o.appendFirstToken !== undefined) c.boolean(o.appendFirstToken, at(path, 'appendFirstToken'));
  if (o.maxTokens !== undefined) c.int(o.maxTokens, at(path, 'maxTokens'), { min: 1 });
  if (o.temperature !== undefined) c.number(o.temperature, at(path, 'temperature'), { min: 0 });
  if (o.seed !== undefined) c.int(o.seed, at(path, 'seed'));
  if (o.ignoreEos !== undefined) c.boolean(o.ignoreEos, at(path, 'ignoreEos'));
}

function checkExpect(c: Checker, raw: unknown, path: string, numRequests: number | undefined, numRuns: number): Expectations | undefined {
  const o = c.object(raw, path, EXPECT);
  if (!o) return undefined;
  for (const k of ['noFalseVerify', 'noTokensFromUnverified', 'mismatchesAtInjections', 'sameOutputsAcrossRuns']) if (o[k] !== undefined) c.boolean(o[k], at(path, k));
  if (o.counts !== undefined) {
    const co = c.object(o.counts, at(path, 'counts'), COUNT_KEYS);
    if (co) for (const [k, v] of Object.entries(co)) c.int(v, at(at(path, 'counts'), k), { min: 0 });
  }
  if (o.requests !== undefined) {
    if (!Array.isArray(o.requests)) c.fail(at(path, 'requests'), 'expected an array of request expectations');
    else
      o.requests.forEach((e, i) => {
        const p = at(at(path, 'requests'), i);
        const x = c.object(e, p, REQ_EXPECT);
        if (!x) return;
        const idx = (v: unknown, pp: string) => {
          const n = c.int(v, pp, { min: 0 });
          if (n !== undefined && numRequests !== undefined && n >= numRequests) c.fail(pp, `request ${n} does not exist (${numRequests} requests)`);
        };
        if (c.required(x, 'request', p)) {
          if (x.request === '*') {
            /* every request */
          } else if (Array.isArray(x.request)) x.request.forEach((v, k) => idx(v, at(at(p, 'request'), k)));
          else idx(x.request, at(p, 'request'));
        }
        if (x.run !== undefined) {
          const r = c.int(x.run, at(p, 'run'), { min: 0 });
          if (r !== undefined && r >= numRuns) c.fail(at(p, 'run'), `run ${r} does not exist (${numRuns} runs)`);
        }
        const list = <T extends string>(v: unknown, pp: string, values: readonly T[]) => {
          if (Array.isArray(v)) {
            if (v.length === 0) c.fail(pp, 'must not be empty');
            v.forEach((y, k) => c.oneOf(y, at(pp, k), values));
          } else c.oneOf(v, pp, values);
        };
        if (x.verdict !== undefined) list(x.verdict, at(p, 'verdict'), VERDICTS);
        if (x.action !== undefined) list(x.action, at(p, 'action'), ACTIONS);
        if (x.finishReason !== undefined) list(x.finishReason, at(p, 'finishReason'), FINISH);
        if (x.output !== undefined) c.oneOf(x.output, at(p, 'output'), ['reference', 'different', 'empty', 'any']);
        if (x.error !== undefined) c.boolean(x.error, at(p, 'error'));
        if (x.wrongRequest !== undefined) c.boolean(x.wrongRequest, at(p, 'wrongRequest'));
        if (x.mismatches !== undefined) {
          if (!Array.isArray(x.mismatches)) c.fail(at(p, 'mismatches'), 'expected an array of { group, positions }');
          else
            x.mismatches.forEach((m, k) => {
              const mp = at(at(p, 'mismatches'), k);
              const mo = c.object(m, mp, ['group', 'positions']);
              if (!mo) return;
              if (c.required(mo, 'group', mp)) c.int(mo.group, at(mp, 'group'), { min: 0 });
              if (c.required(mo, 'positions', mp)) c.intArray(mo.positions, at(mp, 'positions'), { min: 0, nonEmpty: true });
            });
        }
        if (x.reasons !== undefined) {
          if (!Array.isArray(x.reasons)) c.fail(at(p, 'reasons'), 'expected an array of reason codes or { group, reason }');
          else
            x.reasons.forEach((r, k) => {
              const rp = at(at(p, 'reasons'), k);
              if (typeof r === 'string') return void c.oneOf(r, rp, REASONS);
              const ro = c.object(r, rp, ['group', 'reason']);
              if (!ro) return;
              if (c.required(ro, 'group', rp) && ro.group !== null) c.int(ro.group, at(rp, 'group'), { min: 0 });
              if (c.required(ro, 'reason', rp)) c.oneOf(ro.reason, at(rp, 'reason'), REASONS);
            });
        }
      });
  }
  return o as Expectations;
}

/**
 * Validates a raw scenario (parsed JSON) and fills in defaults.
 * @throws ValidationError listing every problem with its JSON path.
 */
export function parseScenario(raw: unknown, what = 'scenario'): Scenario {
  const c = new Checker();
  const o = c.object(raw, '', TOP);
  if (!o) throw new ValidationError(what, c.problems);
  if (c.required(o, 'name', '')) c.string(o.name, 'name', { nonEmpty: true });
  for (const k of ['description', 'source']) if (o[k] !== undefined) c.string(o[k], k);
  if (c.required(o, 'model', '')) checkModel(c, o.model, 'model');
  if (o.connector !== undefined) c.oneOf(o.connector, 'connector', CONNECTORS);
  if (o.connectorConfig !== undefined && !isObject(o.connectorConfig)) c.fail('connectorConfig', 'expected an object');
  if (o.transfer !== undefined) {
    const bad = transferMismatch((o.connector ?? 'in-process') as ConnectorName, o.transfer);
    if (bad) c.fail('transfer', bad);
  }
  if (o.checksums !== undefined) c.boolean(o.checksums, 'checksums');
  if (o.mode !== undefined) c.oneOf(o.mode, 'mode', ['sequential', 'concurrent']);
  if (o.producer !== undefined) checkSide(c, o.producer, 'producer', false);
  if (o.consumer !== undefined) checkSide(c, o.consumer, 'consumer', true);
  let numRequests: number | undefined;
  if ((o.requests === undefined) === (o.generate === undefined)) c.fail('requests', 'give exactly one of requests, generate');
  if (o.requests !== undefined) {
    if (!Array.isArray(o.requests) || o.requests.length === 0) c.fail('requests', 'expected a non-empty array of requests');
    else {
      numRequests = o.requests.length;
      o.requests.forEach((r, i) => checkRequest(c, r, at('requests', i), i));
    }
  }
  if (o.generate !== undefined) {
    const g = c.object(o.generate, 'generate', GENERATE);
    if (g) {
      if (c.required(g, 'count', 'generate')) numRequests = c.int(g.count, 'generate.count', { min: 1 });
      if (g.promptTokens !== undefined) {
        const r = c.range(g.promptTokens, 'generate.promptTokens', 2);
        void r;
      }
      if (g.sharedPrefix !== undefined) c.number(g.sharedPrefix, 'generate.sharedPrefix', { min: 0, max: 1 });
      if (g.prefixTokens !== undefined) c.int(g.prefixTokens, 'generate.prefixTokens', { min: 1 });
      if (g.maxTokens !== undefined) c.int(g.maxTokens, 'generate.maxTokens', { min: 1 });
      if (g.seed !== undefined) c.int(g.seed, 'generate.seed');
    }
  }
  if (o.concurrency !== undefined) c.int(o.concurrency, 'concurrency', { min: 1 });
  if (o.timeoutMs !== undefined) c.int(o.timeoutMs, 'timeoutMs', { min: 1 });
  if (o.faults !== undefined) checkFaultList(c, o.faults, 'faults');
  let numRuns = 1;
  if (o.runs !== undefined) {
    if (!Array.isArray(o.runs) || o.runs.length === 0) c.fail('runs', 'expected a non-empty array of runs');
    else {
      numRuns = o.runs.length;
      o.runs.forEach((r, i) => {
        const ro = c.object(r, at('runs', i), ['label', 'checksums', 'faults']);
        if (!ro) return;
        if (ro.label !== undefined) c.string(ro.label, at(at('runs', i), 'label'));
        for (const k of ['checksums', 'faults']) if (ro[k] !== undefined) c.boolean(ro[k], at(at('runs', i), k));
      });
    }
  }
  if (c.required(o, 'expect', '')) checkExpect(c, o.expect, 'expect', numRequests, numRuns);
  if (Array.isArray(o.faults) && numRequests !== undefined) {
    o.faults.forEach((f, i) => {
      if (isObject(f) && Array.isArray(f.requests)) f.requests.forEach((r, k) => typeof r === 'number' && r >= numRequests! && c.fail(at(at(at('faults', i), 'requests'), k), `request ${r} does not exist (${numRequests} requests)`));
      if (isObject(f) && f.kind === 'replay-params' && typeof f.from === 'number' && f.from >= numRequests!) c.fail(at(at('faults', i), 'from'), `request ${f.from} does not exist`);
    });
  }
  if (c.problems.length > 0) throw new ValidationError(what, c.problems);
  return {
    name: o.name as string,
    description: o.description as string | undefined,
    source: o.source as string | undefined,
    model: o.model as ModelSpec,
    connector: (o.connector as ConnectorName | undefined) ?? 'in-process',
    connectorConfig: o.connectorConfig as Record<string, unknown> | undefined,
    transfer: (o.transfer as TransferEngine | undefined) ?? 'embedded',
    checksums: (o.checksums as boolean | undefined) ?? true,
    mode: (o.mode as Scenario['mode'] | undefined) ?? 'sequential',
    producer: (o.producer as SideSpec | undefined) ?? {},
    consumer: (o.consumer as SideSpec | undefined) ?? {},
    requests: (o.requests as RequestSpec[] | undefined) ?? [],
    generate: o.generate as GenerateSpec | undefined,
    concurrency: (o.concurrency as number | undefined) ?? 1,
    faults: (o.faults as FaultSpec[] | undefined) ?? [],
    runs: (o.runs as RunSpec[] | undefined) ?? [{}],
    timeoutMs: (o.timeoutMs as number | undefined) ?? 30_000,
    expect: o.expect as Expectations,
  };
}

/**
 * Reads and validates a scenario file.
 * @throws ValidationError (problems prefixed by nothing; the message names the file), or a
 *   SyntaxError-derived ValidationError for bad JSON.
 */
export function loadScenarioFile(file: string): Scenario {
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(file, 'utf8'));
  } catch (e) {
    throw new ValidationError(`scenario file ${file}`, [{ path: '', message: `not JSON: ${e instanceof Error ? e.message : String(e)}` }]);
  }
  return parseScenario(raw, `scenario file ${file}`);
}

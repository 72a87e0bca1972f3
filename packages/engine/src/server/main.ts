/**
 * The programs behind `bin/kvconnect-engine.js` and `bin/kvconnect-proxy.js`: parse CLI flags and
 * JSON configs, start an engine server or a proxy server, print one JSON `ready` line on stdout,
 * and exit cleanly on SIGTERM, SIGINT or `POST /shutdown`.
 *
 * stdout carries only JSON event lines (`{"event":"ready",...}`, then `{"event":"exit",...}`);
 * logs (pino, KV checksum events) and errors go to stderr. Exit codes: 0 clean shutdown, 1 runtime
 * failure (engine setup, port in use, crash), 2 bad flags or config.
 * @module
 */
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { KVChecksumObservability, defaultRegistry } from '@kvconnect/core';
import { Engine, type EngineOptions } from '../engine.js';
import { PRESETS, type ModelConfig, type PresetName } from '../model/config.js';
import { startEngineServer } from './engine-server.js';
import { isPlainObject } from './protocol.js';
import { startProxyServer } from './proxy-server.js';

/** A config error (bad flag, bad JSON, wrong type): exit code 2. */
export class UsageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'UsageError';
  }
}

/**
 * What an engine process runs: {@link EngineOptions} (JSON-able ones) plus the server's and the
 * process's settings. The keys of `--config FILE` and `--config-json`.
 */
export interface EngineProcessConfig {
  /** A preset name or a full model config. */
  model?: PresetName | ModelConfig;
  preset?: PresetName;
  tpSize?: number;
  ppSize?: number;
  blockSize?: number;
  numBlocks?: number;
  cacheLayout?: { layout: 'NHD' | 'HND'; kvLayout: 'kv-first' | 'block-kv' | 'separate' };
  kvDtype?: 'bfloat16' | 'float16' | 'float32';
  ssmDtype?: 'bfloat16' | 'float16' | 'float32';
  maxNumBatchedTokens?: number;
  maxNumSeqs?: number;
  /** See `EngineOptions.longPrefillTokenThreshold` (0 = no cap). */
  longPrefillTokenThreshold?: number;
  /** vLLM `kv_transfer_config` (may name `kv_connector_module_path`). */
  kvTransferConfig?: Record<string, unknown>;
  enablePrefixCaching?: boolean;
  engineId?: string;
  /** `cuda` sums KV in GPU memory (`device` `cuda`); `cuda-emulated` is for tests (the device path without a GPU). */
  checksumBackend?: 'auto' | 'ts' | 'native' | 'cuda' | 'cuda-emulated';
  /** Where the KV cache lives: host memory (default), GPU memory, or emulated device memory (tests). */
  device?: 'cpu' | 'cuda' | 'cuda-emulated';
  /** Modules to import before the engine starts (connector packages register themselves); worker processes import them too. */
  imports?: string[];
  /** Where the workers run (default `inprocess`; `processes`: one process per TP rank x PP stage). */
  executor?: 'inprocess' | 'processes';
  /** Interface to listen on (default 127.0.0.1). */
  host?: string;
  /** Port (default 0: any free port; the ready line says which). */
  port?: number;
  maxBodyBytes?: number;
  requestTimeoutMs?: number;
  maxTokens?: number;
  maxModelLen?: number;
  /** Model names requests may give in `model` (vLLM `--served-model-name`; default the model's name). */
  servedModelName?: string[];
  /** Log level of the KV checksum logger (pino; default `warn`), written to stderr. */
  logLevel?: 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace' | 'silent';
}

/** What a proxy process runs: the keys of its `--config FILE` and `--config-json`. */
export interface ProxyProcessConfig {
  prefill?: string[];
  decode?: string[];
  mode?: 'sequential' | 'concurrent';
  host?: string;
  port?: number;
  timeoutMs?: number;
  connectTimeoutMs?: number;
  maxBodyBytes?: number;
  maxTokens?: number;
}

type Kind = 'int' | 'nat' | 'string' | 'bool' | 'object' | 'strings' | readonly string[];

const ENGINE_KEYS: Record<keyof EngineProcessConfig, Kind> = {
  model: 'string', // or an object: checked apart
  preset: Object.keys(PRESETS),
  tpSize: 'int',
  ppSize: 'int',
  blockSize: 'int',
  numBlocks: 'int',
  cacheLayout: 'object',
  kvDtype: ['bfloat16', 'float16', 'float32'],
  ssmDtype: ['bfloat16', 'float16', 'float32'],
  maxNumBatchedTokens: 'int',
  maxNumSeqs: 'int',
  longPrefillTokenThreshold: 'nat',
  kvTransferConfig: 'object',
  enablePrefixCaching: 'bool',
  engineId: 'string',
  checksumBackend: ['auto', 'ts', 'native', 'cuda', 'cuda-emulated'],
  device: ['cpu', 'cuda', 'cuda-emulated'],
  imports: 'strings',
  executor: ['inprocess', 'processes'],
  host: 'string',
  port: 'nat',
  maxBodyBytes: 'int',
  requestTimeoutMs: 'nat',
  maxTokens: 'int',
  maxModelLen: 'int',
  servedModelName: 'strings',
  logLevel: ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'],
};

const PROXY_KEYS: Record<keyof ProxyProcessConfig, Kind> = {
  prefill: 'strings',
  decode: 'strings',
  mode: ['sequential', 'concurrent'],
  host: 'string',
  port: 'nat',
  timeoutMs: 'int',
  connectTimeoutMs: 'nat',
  maxBodyBytes: 'int',
  maxTokens: 'int',
};

function kindOf(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  return typeof v;
}

function checkConfig<T extends object>(raw: unknown, keys: Record<string, Kind>, where: string): T {
  if (!isPlainObject(raw)) throw new UsageError(`${where}: expected a JSON object, got ${kindOf(raw)}`);
  const problems: string[] = [];
  for (const [k, v] of Object.entries(raw)) {
    const kind = keys[k];
    if (kind === undefined) {
      problems.push(`${k}: unknown key (known: ${Object.keys(keys).join(', ')})`);
      continue;
    }
    if (k === 'model') {
      if (!(typeof v === 'string' || isPlainObject(v))) problems.push(`model: expected a preset name or a model config object, got ${kindOf(v)}`);
      continue;
    }
    if (k === 'port') {
      if (!(Number.isInteger(v) && (v as number) >= 0 && (v as number) <= 65535)) problems.push(`port: expected an integer in [0, 65535], got ${JSON.stringify(v)}`);
      continue;
    }
    if (kind === 'int' && !(Number.isSafeInteger(v) && (v as number) >= 1)) problems.push(`${k}: expected a positive integer, got ${JSON.stringify(v)}`);
    else if (kind === 'nat' && !(Number.isSafeInteger(v) && (v as number) >= 0)) problems.push(`${k}: expected a non-negative integer, got ${JSON.stringify(v)}`);
    else if (kind === 'string' && !(typeof v === 'string' && v.length > 0)) problems.push(`${k}: expected a non-empty string, got ${kindOf(v)}`);
    else if (kind === 'bool' && typeof v !== 'boolean') problems.push(`${k}: expected a boolean, got ${kindOf(v)}`);
    else if (kind === 'object' && !isPlainObject(v)) problems.push(`${k}: expected an object, got ${kindOf(v)}`);
    else if (kind === 'strings' && !(Array.isArray(v) && v.every((x) => typeof x === 'string' && x.length > 0))) problems.push(`${k}: expected an array of non-empty strings`);
    else if (Array.isArray(kind) && !kind.includes(v as string)) problems.push(`${k}: expected one of ${kind.join(', ')}, got ${JSON.stringify(v)}`);
  }
  const cl = raw.cacheLayout;
  if (isPlainObject(cl) && keys === ENGINE_KEYS) {
    for (const k of Object.keys(cl)) if (k !== 'layout' && k !== 'kvLayout') problems.push(`cacheLayout.${k}: unknown key (known: layout, kvLayout)`);
    if (!['NHD', 'HND'].includes(cl.layout as string)) problems.push(`cacheLayout.layout: expected NHD or HND, got ${JSON.stringify(cl.layout)}`);
    if (!['kv-first', 'block-kv', 'separate'].includes(cl.kvLayout as string)) problems.push(`cacheLayout.kvLayout: expected kv-first, block-kv or separate, got ${JSON.stringify(cl.kvLayout)}`);
  }
  if (problems.length > 0) throw new UsageError(`${where}: ${problems.join('; ')}`);
  return raw as T;
}

function parseJson(text: string, where: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch (e) {
    throw new UsageError(`${where}: not valid JSON: ${e instanceof Error ? e.message : String(e)}`);
  }
}

function readConfigFile(path: string): unknown {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    throw new UsageError(`--config ${path}: ${e instanceof Error ? e.message : String(e)}`);
  }
  return parseJson(text, `--config ${path}`);
}

function intFlag(v: string | undefined, name: string): number | undefined {
  if (v === undefined) return undefined;
  if (!/^\d+$/.test(v)) throw new UsageError(`--${name}: expected a non-negative integer, got ${JSON.stringify(v)}`);
  return Number(v);
}

function parse(argv: readonly string[], options: NonNullable<Parameters<typeof parseArgs>[0]>['options']): Record<string, string | boolean | string[] | undefined> {
  try {
    return parseArgs({ args: [...argv], options, strict: true, allowPositionals: false }).values as Record<string, string | boolean | string[] | undefined>;
  } catch (e) {
    throw new UsageError(e instanceof Error ? e.message : String(e));
  }
}

/** Usage of `kvconnect-engine`. */
export const ENGINE_USAGE = `Usage: kvconnect-engine [options]

Starts one kvconnect engine behind an OpenAI-compatible HTTP API (POST /v1/completions,
POST /v1/chat/completions, GET /v1/models, GET /version, GET /health, GET /metrics, POST /shutdown) and prints {"event":"ready","url":...,"engineId":...} on stdout.

Config (later wins): --config FILE < --config-json JSON < flags. Config keys are EngineOptions
(camelCase: preset, tpSize, ppSize, blockSize, numBlocks, cacheLayout, kvDtype, kvTransferConfig,
engineId, ...) plus host, port, imports, maxBodyBytes, requestTimeoutMs, maxTokens, maxModelLen, logLevel.

  --config FILE                 JSON config file
  --config-json JSON            JSON config
  --preset NAME                 ${Object.keys(PRESETS).join(' | ')}
  --tp-size N, --pp-size N      TP ranks per stage, PP stages
  --block-size N                tokens per KV block
  --num-blocks N                KV blocks in the pool
  --cache-layout NHD|HND        --kv-layout kv-first|block-kv|separate
  --kv-dtype bfloat16|float16|float32
  --max-num-batched-tokens N    --max-num-seqs N
  --long-prefill-token-threshold N  most prompt tokens of one request per step while others run (default max-num-batched-tokens / 4; 0 = no cap)
  --disable-prefix-caching
  --engine-id ID
  --kv-transfer-config JSON     vLLM kv_transfer_config
  --kv-connector-module-path M  sets kv_transfer_config.kv_connector_module_path
  --checksum-backend auto|ts|native|cuda|cuda-emulated   (auto: cuda with --device cuda; cuda-emulated: tests)
  --device cpu|cuda|cuda-emulated   KV cache in host memory (default), GPU memory (addon built with
                                CUDA), or emulated device memory (tests); the model computes on the host
  --import MODULE               import a module first (repeatable; connector packages register themselves)
  --workers inprocess|processes where the TP x PP workers run (default inprocess; processes: one
                                worker process each); also --distributed-executor-backend uni|mp
  --host HOST                   default 127.0.0.1
  --port N                      default 0 (any free port)
  --max-body-bytes N            --request-timeout-ms N (0 = none)  --max-tokens N  --max-model-len N
  --served-model-name NAME      a name requests may give in "model" (repeatable; default the model's)
  --log-level LEVEL             pino level of KV checksum logs on stderr (default warn)
  --exit-with-parent            exit when stdin closes (set by the launcher)
  -h, --help
`;

/** Usage of `kvconnect-proxy`. */
export const PROXY_USAGE = `Usage: kvconnect-proxy --prefill URL --decode URL [options]

Starts the P/D proxy over engine servers (POST /v1/completions, GET /health, POST /shutdown) and
prints {"event":"ready","url":...} on stdout.

  --config FILE, --config-json JSON   keys: prefill, decode, mode, host, port, timeoutMs, connectTimeoutMs, maxBodyBytes, maxTokens
  --prefill URL                 a producer engine server (repeatable: round robin)
  --decode URL                  a consumer engine server (repeatable: round robin)
  --mode sequential|concurrent  NIXL style (default) or Mooncake style
  --host HOST                   default 127.0.0.1
  --port N                      default 0 (any free port)
  --timeout-ms N                deadline of one engine request (default 120000)
  --connect-timeout-ms N        how long to wait for the engines at start (default 10000)
  --max-body-bytes N  --max-tokens N
  --exit-with-parent            exit when stdin closes (set by the launcher)
  -h, --help
`;

/** The result of parsing a command line: a config, or a request for help. */
export type Parsed<T> = { help: true } | { help: false; config: T; exitWithParent: boolean };

/**
 * Parses `kvconnect-engine` flags into an {@link EngineProcessConfig} (config file, then JSON, then flags).
 * @throws UsageError for unknown flags, bad values or config keys.
 */
export function parseEngineArgs(argv: readonly string[]): Parsed<EngineProcessConfig> {
  const v = parse(argv, {
    config: { type: 'string' },
    'config-json': { type: 'string' },
    preset: { type: 'string' },
    model: { type: 'string' },
    'tp-size': { type: 'string' },
    'pp-size': { type: 'string' },
    'block-size': { type: 'string' },
    'num-blocks': { type: 'string' },
    'cache-layout': { type: 'string' },
    'kv-layout': { type: 'string' },
    'kv-dtype': { type: 'string' },
    'ssm-dtype': { type: 'string' },
    'max-num-batched-tokens': { type: 'string' },
    'max-num-seqs': { type: 'string' },
    'long-prefill-token-threshold': { type: 'string' },
    'disable-prefix-caching': { type: 'boolean' },
    'engine-id': { type: 'string' },
    'kv-transfer-config': { type: 'string' },
    'kv-connector-module-path': { type: 'string' },
    'checksum-backend': { type: 'string' },
    device: { type: 'string' },
    import: { type: 'string', multiple: true },
    workers: { type: 'string' },
    'distributed-executor-backend': { type: 'string' },
    host: { type: 'string' },
    port: { type: 'string' },
    'max-body-bytes': { type: 'string' },
    'request-timeout-ms': { type: 'string' },
    'max-tokens': { type: 'string' },
    'max-model-len': { type: 'string' },
    'served-model-name': { type: 'string', multiple: true },
    'log-level': { type: 'string' },
    'exit-with-parent': { type: 'boolean' },
    help: { type: 'boolean', short: 'h' },
  });
  if (v.help) return { help: true };
  let cfg: Record<string, unknown> = {};
  if (typeof v.config === 'string') cfg = { ...checkConfig<EngineProcessConfig>(readConfigFile(v.config), ENGINE_KEYS, `--config ${v.config}`) };
  if (typeof v['config-json'] === 'string') {
    const j = checkConfig<EngineProcessConfig>(parseJson(v['config-json'], '--config-json'), ENGINE_KEYS, '--config-json');
    cfg = { ...cfg, ...j, imports: [...((cfg.imports as string[]) ?? []), ...(j.imports ?? [])] };
  }
  const s = (k: string) => v[k] as string | undefined;
  const flags: Record<string, unknown> = {
    preset: s('preset'),
    model: s('model'),
    tpSize: intFlag(s('tp-size'), 'tp-size'),
    ppSize: intFlag(s('pp-size'), 'pp-size'),
    blockSize: intFlag(s('block-size'), 'block-size'),
    numBlocks: intFlag(s('num-blocks'), 'num-blocks'),
    kvDtype: s('kv-dtype'),
    ssmDtype: s('ssm-dtype'),
    maxNumBatchedTokens: intFlag(s('max-num-batched-tokens'), 'max-num-batched-tokens'),
    maxNumSeqs: intFlag(s('max-num-seqs'), 'max-num-seqs'),
    longPrefillTokenThreshold: intFlag(s('long-prefill-token-threshold'), 'long-prefill-token-threshold'),
    enablePrefixCaching: v['disable-prefix-caching'] ? false : undefined,
    engineId: s('engine-id'),
    checksumBackend: s('checksum-backend'),
    device: s('device'),
    host: s('host'),
    port: intFlag(s('port'), 'port'),
    maxBodyBytes: intFlag(s('max-body-bytes'), 'max-body-bytes'),
    requestTimeoutMs: intFlag(s('request-timeout-ms'), 'request-timeout-ms'),
    maxTokens: intFlag(s('max-tokens'), 'max-tokens'),
    maxModelLen: intFlag(s('max-model-len'), 'max-model-len'),
    servedModelName: v['served-model-name'] as string[] | undefined,
    logLevel: s('log-level'),
  };
  const backend = s('distributed-executor-backend');
  if (backend !== undefined && backend !== 'mp' && backend !== 'uni') throw new UsageError(`--distributed-executor-backend: expected mp or uni, got ${JSON.stringify(backend)}`);
  flags.executor = s('workers') ?? (backend === undefined ? undefined : backend === 'mp' ? 'processes' : 'inprocess');
  if (s('kv-transfer-config') !== undefined) flags.kvTransferConfig = parseJson(s('kv-transfer-config')!, '--kv-transfer-config');
  if (s('cache-layout') !== undefined || s('kv-layout') !== undefined) {
    const base = isPlainObject(cfg.cacheLayout) ? cfg.cacheLayout : {};
    flags.cacheLayout = { layout: s('cache-layout') ?? base.layout ?? 'NHD', kvLayout: s('kv-layout') ?? base.kvLayout ?? 'kv-first' };
  }
  for (const [k, x] of Object.entries(flags)) if (x !== undefined) cfg[k] = x;
  const modulePath = s('kv-connector-module-path');
  if (modulePath !== undefined) {
    if (!isPlainObject(cfg.kvTransferConfig)) throw new UsageError('--kv-connector-module-path needs a kv_transfer_config (--kv-transfer-config or the config)');
    cfg.kvTransferConfig = { ...cfg.kvTransferConfig, kv_connector_module_path: modulePath };
  }
  const imports = [...((cfg.imports as string[] | undefined) ?? []), ...((v.import as string[] | undefined) ?? [])];
  if (imports.length > 0) cfg.imports = imports;
  else delete cfg.imports;
  const config = checkConfig<EngineProcessConfig>(cfg, ENGINE_KEYS, 'engine config');
  if (config.model === undefined && config.preset === undefined) throw new UsageError('engine config: give a model (--preset NAME, or model/preset in the config)');
  return { help: false, config, exitWithParent: v['exit-with-parent'] === true };
}

/**
 * Parses `kvconnect-proxy` flags into a {@link ProxyProcessConfig}.
 * @throws UsageError for unknown flags, bad values, or no prefill/decode URL.
 */
export function parseProxyArgs(argv: readonly string[]): Parsed<ProxyProcessConfig> {
  const v = parse(argv, {
    config: { type: 'string' },
    'config-json': { type: 'string' },
    prefill: { type: 'string', multiple: true },
    decode: { type: 'string', multiple: true },
    mode: { type: 'string' },
    host: { type: 'string' },
    port: { type: 'string' },
    'timeout-ms': { type: 'string' },
    'connect-timeout-ms': { type: 'string' },
    'max-body-bytes': { type: 'string' },
    'max-tokens': { type: 'string' },
    'exit-with-parent': { type: 'boolean' },
    help: { type: 'boolean', short: 'h' },
  });
  if (v.help) return { help: true };
  let cfg: Record<string, unknown> = {};
  if (typeof v.config === 'string') cfg = { ...checkConfig<ProxyProcessConfig>(readConfigFile(v.config), PROXY_KEYS, `--config ${v.config}`) };
  if (typeof v['config-json'] === 'string') cfg = { ...cfg, ...checkConfig<ProxyProcessConfig>(parseJson(v['config-json'], '--config-json'), PROXY_KEYS, '--config-json') };
  const s = (k: string) => v[k] as string | undefined;
  const flags: Record<string, unknown> = {
    prefill: v.prefill,
    decode: v.decode,
    mode: s('mode'),
    host: s('host'),
    port: intFlag(s('port'), 'port'),
    timeoutMs: intFlag(s('timeout-ms'), 'timeout-ms'),
    connectTimeoutMs: intFlag(s('connect-timeout-ms'), 'connect-timeout-ms'),
    maxBodyBytes: intFlag(s('max-body-bytes'), 'max-body-bytes'),
    maxTokens: intFlag(s('max-tokens'), 'max-tokens'),
  };
  for (const [k, x] of Object.entries(flags)) if (x !== undefined) cfg[k] = x;
  const config = checkConfig<ProxyProcessConfig>(cfg, PROXY_KEYS, 'proxy config');
  for (const k of ['prefill', 'decode'] as const) {
    const urls = config[k] ?? [];
    if (urls.length === 0) throw new UsageError(`proxy config: at least one --${k} URL is needed`);
    for (const u of urls) {
      let ok = false;
      try {
        ok = ['http:', 'https:'].includes(new URL(u).protocol);
      } catch {
        // not a URL
      }
      if (!ok) throw new UsageError(`--${k}: not an http URL: ${JSON.stringify(u)}`);
    }
  }
  return { help: false, config, exitWithParent: v['exit-with-parent'] === true };
}

/** Builds the {@link EngineOptions} of an {@link EngineProcessConfig} (logs to stderr). */
export function engineOptionsOf(c: EngineProcessConfig): EngineOptions {
  const o: EngineOptions = {
    model: c.model,
    preset: c.preset,
    tpSize: c.tpSize,
    ppSize: c.ppSize,
    blockSize: c.blockSize,
    numBlocks: c.numBlocks,
    cacheLayout: c.cacheLayout,
    kvDtype: c.kvDtype,
    ssmDtype: c.ssmDtype,
    maxNumBatchedTokens: c.maxNumBatchedTokens,
    maxNumSeqs: c.maxNumSeqs,
    longPrefillTokenThreshold: c.longPrefillTokenThreshold,
    kvTransferConfig: c.kvTransferConfig,
    enablePrefixCaching: c.enablePrefixCaching,
    engineId: c.engineId,
    checksumBackend: c.checksumBackend,
    device: c.device,
    executor: c.executor,
    workerImports: c.imports,
    observability: new KVChecksumObservability({ level: c.logLevel ?? 'warn', destination: { write: (line: string) => process.stderr.write(line) } }),
  };
  for (const k of Object.keys(o) as (keyof EngineOptions)[]) if (o[k] === undefined) delete o[k];
  return o;
}

function emit(event: Record<string, unknown>): void {
  process.stdout.write(`${JSON.stringify(event)}\n`);
}

function fail(e: unknown): never {
  const usage = e instanceof UsageError;
  process.stderr.write(`${usage ? 'error' : 'fatal'}: ${e instanceof Error ? (usage ? e.message : (e.stack ?? e.message)) : String(e)}\n`);
  process.exit(usage ? 2 : 1);
}

/** Installs SIGTERM/SIGINT (and, with `exitWithParent`, stdin end) handlers calling `stop` once; a second signal exits at once. */
function onStop(stop: (why: string) => Promise<void>, exitWithParent: boolean): void {
  let stopping = false;
  const go = (why: string) => {
    if (stopping) {
      if (why === 'SIGINT' || why === 'SIGTERM') process.exit(1);
      return;
    }
    stopping = true;
    const hard = setTimeout(() => {
      process.stderr.write(`kvconnect: shutdown (${why}) took too long; exiting\n`);
      process.exit(1);
    }, 15_000);
    hard.unref();
    stop(why).then(
      () => {
        emit({ event: 'exit', reason: why });
        process.exit(0);
      },
      (e: unknown) => fail(e),
    );
  };
  process.on('SIGTERM', () => go('SIGTERM'));
  process.on('SIGINT', () => go('SIGINT'));
  if (exitWithParent) {
    process.stdin.on('end', () => go('parent-exit'));
    process.stdin.on('error', () => go('parent-exit'));
    process.stdin.resume();
  }
  process.on('uncaughtException', (e) => fail(e));
  process.on('unhandledRejection', (e) => fail(e));
  stopHook = go;
}

let stopHook: ((why: string) => void) | null = null;

/**
 * `kvconnect-engine`: imports `imports` (connector packages), starts the engine and its server,
 * waits for the engine's setup, prints the ready line, and serves until SIGTERM, SIGINT or
 * `POST /shutdown` (then closes the server, shuts the engine down, prints `{"event":"exit"}` and
 * exits 0).
 */
export async function runEngineMain(argv: readonly string[]): Promise<void> {
  let parsed: Parsed<EngineProcessConfig>;
  try {
    parsed = parseEngineArgs(argv);
  } catch (e) {
    fail(e);
  }
  if (parsed.help) {
    process.stdout.write(ENGINE_USAGE);
    return;
  }
  const { config } = parsed;
  try {
    for (const m of config.imports ?? []) await defaultRegistry.loadModule(m);
    let engine: Engine;
    try {
      engine = new Engine(engineOptionsOf(config));
    } catch (e) {
      throw new UsageError(`engine options: ${e instanceof Error ? e.message : String(e)}`);
    }
    const server = await startEngineServer(engine, {
      host: config.host,
      port: config.port,
      maxBodyBytes: config.maxBodyBytes,
      requestTimeoutMs: config.requestTimeoutMs,
      maxTokens: config.maxTokens,
      maxModelLen: config.maxModelLen,
      servedModelNames: config.servedModelName,
      onShutdown: () => stopHook?.('shutdown'),
    });
    onStop(async () => {
      await server.close();
      await engine.shutdown();
    }, parsed.exitWithParent);
    await engine.ready;
    const cfg = engine.transferConfig;
    emit({
      event: 'ready',
      url: server.url,
      port: server.port,
      engineId: engine.engineId,
      pid: process.pid,
      model: engine.model.name,
      kvConnector: cfg?.kv_connector ?? null,
      kvRole: cfg?.kv_role ?? null,
      registeredConnectors: defaultRegistry.names(),
    });
  } catch (e) {
    fail(e);
  }
}

/**
 * `kvconnect-proxy`: connects to the engines, starts the proxy server, prints the ready line, and
 * serves until SIGTERM, SIGINT or `POST /shutdown`.
 */
export async function runProxyMain(argv: readonly string[]): Promise<void> {
  let parsed: Parsed<ProxyProcessConfig>;
  try {
    parsed = parseProxyArgs(argv);
  } catch (e) {
    fail(e);
  }
  if (parsed.help) {
    process.stdout.write(PROXY_USAGE);
    return;
  }
  const { config } = parsed;
  try {
    const server = await startProxyServer({
      prefill: config.prefill!,
      decode: config.decode!,
      mode: config.mode,
      host: config.host,
      port: config.port,
      timeoutMs: config.timeoutMs,
      connectTimeoutMs: config.connectTimeoutMs,
      maxBodyBytes: config.maxBodyBytes,
      maxTokens: config.maxTokens,
      onShutdown: () => stopHook?.('shutdown'),
    });
    onStop(() => server.close(), parsed.exitWithParent);
    emit({
      event: 'ready',
      url: server.url,
      port: server.port,
      pid: process.pid,
      mode: server.mode,
      prefill: server.prefill.map((c) => ({ url: c.url, engineId: c.engineId })),
      decode: server.decode.map((c) => ({ url: c.url, engineId: c.engineId })),
    });
  } catch (e) {
    fail(e);
  }
}

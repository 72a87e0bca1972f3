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
import { Command, InvalidArgumentError, Option } from 'commander';
import {
  ConnectorModuleError,
  KVChecksumObservability,
  KVTransferConfigError,
  UnknownConnectorError,
  createLogger,
  defaultRegistry,
  isPlainObject,
  kindOf,
  plainObject,
  strictObject,
  z,
  zodProblems,
} from '@kvconnect/core';
import { Engine, type EngineOptions } from '../engine.js';
import { PRESETS, type ModelConfig, type PresetName } from '../model/config.js';
import { startEngineServer } from './engine-server.js';
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
  /** Log level (pino) of the proxy's logs on stderr, access log included (default `info`). */
  logLevel?: 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace' | 'silent';
}

// ---- the option tables: each config key's shape and flags, the one source of schema, flags and help ----

/**
 * What a flag's text parses as: `integer` (digits only, `natArg`; the key's shape says which
 * integers are good), `string`, `strings` (repeatable, or `<x...>` variadic), `json` (a JSON
 * text), or `boolean` (no text: the flag gives true, a `--no-` flag false).
 */
type ArgKind = 'integer' | 'string' | 'strings' | 'json' | 'boolean';

/**
 * The shape of one config key: its zod type (with the messages kvconnect has always given),
 * what a flag's text for it parses as, and, for a choice, its values (a flag's description
 * writes them where it says `{choices}`).
 */
interface Shape<T> {
  readonly type: z.ZodType<T>;
  readonly arg: ArgKind;
  readonly choices?: readonly string[];
}

const shape = <T>(arg: ArgKind, type: z.ZodType<T>, choices?: readonly string[]): Shape<T> => ({ type, arg, ...(choices ? { choices } : {}) });
const got = (v: unknown) => (v === undefined ? 'nothing' : JSON.stringify(v));
const posInt = () => shape('integer', z.custom<number>((v) => Number.isSafeInteger(v) && (v as number) >= 1, { error: (iss) => `expected a positive integer, got ${got(iss.input)}` }));
const natInt = () => shape('integer', z.custom<number>((v) => Number.isSafeInteger(v) && (v as number) >= 0, { error: (iss) => `expected a non-negative integer, got ${got(iss.input)}` }));
const portNum = () => shape('integer', z.custom<number>((v) => Number.isInteger(v) && (v as number) >= 0 && (v as number) <= 65535, { error: (iss) => `expected an integer in [0, 65535], got ${got(iss.input)}` }));
const text = () => shape('string', z.custom<string>((v) => typeof v === 'string' && v.length > 0, { error: (iss) => `expected a non-empty string, got ${kindOf(iss.input)}` }));
const flag = () => shape('boolean', z.custom<boolean>((v) => typeof v === 'boolean', { error: (iss) => `expected a boolean, got ${kindOf(iss.input)}` }));
const texts = () => shape('strings', z.custom<string[]>((v) => Array.isArray(v) && v.every((x) => typeof x === 'string' && x.length > 0), { error: 'expected an array of non-empty strings' }));
const choice = <const T extends readonly string[]>(values: T) =>
  shape('string', z.custom<T[number]>((v) => (values as readonly string[]).includes(v as string), { error: (iss) => `expected one of ${values.join(', ')}, got ${got(iss.input)}` }), values);
const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;
const DTYPES = ['bfloat16', 'float16', 'float32'] as const;

/**
 * One command-line flag of a config key: `flags` in commander's syntax (vLLM's name where vLLM has
 * the same setting, e.g. `--tensor-parallel-size <n>`), the older kvconnect spellings that still
 * work (`aliases`, hidden from the help), and, for flags that combine into their key, `apply`
 * (the key's next value from the flag's value and the key's value so far; `arg` then says what
 * the flag's text parses as, when not as the key's).
 */
export interface FlagSpec {
  flags: string;
  description: string;
  aliases?: readonly string[];
  arg?: ArgKind;
  apply?: (value: unknown, current: unknown) => unknown;
}

/** One config key: its {@link Shape} and its flags (in help order; none for a config-only key). */
interface OptionSpec<T> extends Shape<T> {
  readonly flags: readonly FlagSpec[];
}

/**
 * Every key of a config `C`, in the order of `C`'s docs: the one source of the zod schema (its
 * key order is the order of `unknown key (known: ...)`), the commander options and the help.
 * Adding a flag = adding a row to its key.
 */
type OptionTable<C> = { readonly [K in keyof C]-?: OptionSpec<NonNullable<C[K]>> };

const option = <T>(s: Shape<T>, ...flags: FlagSpec[]): OptionSpec<T> => ({ ...s, flags });

/** The zod schema of a config: a strict object of the table's keys, each optional. */
function schemaOf<C extends object>(table: OptionTable<C>): z.ZodType<C> {
  const keys: Record<string, z.ZodType> = {};
  for (const [k, o] of Object.entries(table) as [string, OptionSpec<unknown>][]) keys[k] = o.type.optional();
  // the table's type gives each key of C a Shape of C[key]
  return strictObject(keys) as unknown as z.ZodType<C>;
}

/** The flags of a table, in help order, with the key each sets. */
function flagsOf<C>(table: OptionTable<C>): Array<FlagSpec & { key: keyof C }> {
  return (Object.entries(table) as [keyof C & string, OptionSpec<unknown>][]).flatMap(([key, o]) => o.flags.map((f) => ({ ...f, key })));
}

function checkConfig<T extends object>(raw: unknown, schema: z.ZodType<T>, where: string): T {
  if (!isPlainObject(raw)) throw new UsageError(`${where}: expected a JSON object, got ${kindOf(raw)}`);
  const r = schema.safeParse(raw);
  if (!r.success) throw new UsageError(`${where}: ${zodProblems(r.error).map((p) => `${p.path}: ${p.message}`).join('; ')}`);
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

/** Flags every program has (the config sources, help, the launcher's hook); handled by {@link parseWithTable}. */
const COMMON_FLAGS = [
  { flags: '--config <file>', description: 'JSON config file' },
  { flags: '--config-json <json>', description: 'JSON config (wins over --config; flags win over both)' },
  { flags: '--exit-with-parent', description: 'exit when stdin closes (set by the launcher)' },
  { flags: '-h, --help', description: 'this help' },
] as const;

const backendToExecutor = (v: unknown): string => {
  if (v !== 'mp' && v !== 'uni') throw new UsageError(`--distributed-executor-backend: expected mp or uni, got ${JSON.stringify(v)}`);
  return v === 'mp' ? 'processes' : 'inprocess';
};

/** `cacheLayout` so far (the config's, or an earlier flag's) with the defaults filled in. */
function cacheLayoutOf(current: unknown): Record<string, unknown> {
  const b = isPlainObject(current) ? current : {};
  return { layout: b.layout ?? 'NHD', kvLayout: b.kvLayout ?? 'kv-first' };
}

/** The keys and flags of `kvconnect-engine` (an {@link EngineProcessConfig}). */
export const ENGINE_OPTIONS: OptionTable<EngineProcessConfig> = {
  model: option(
    shape('string', z.custom<PresetName | ModelConfig>((v) => typeof v === 'string' || isPlainObject(v), { error: (iss) => `expected a preset name or a model config object, got ${kindOf(iss.input)}` })),
    { flags: '--model <name>', description: 'a preset name (or, in the config, a model config object)' },
  ),
  preset: option(choice(Object.keys(PRESETS) as PresetName[]), { flags: '--preset <name>', description: 'model preset: {choices}' }),
  tpSize: option(posInt(), { flags: '--tensor-parallel-size <n>', aliases: ['--tp-size'], description: 'TP ranks per PP stage' }),
  ppSize: option(posInt(), { flags: '--pipeline-parallel-size <n>', aliases: ['--pp-size'], description: 'PP stages' }),
  blockSize: option(posInt(), { flags: '--block-size <n>', description: 'tokens per KV block (default 16)' }),
  numBlocks: option(posInt(), { flags: '--num-blocks <n>', aliases: ['--num-gpu-blocks-override'], description: 'KV blocks in the pool (default 512)' }),
  cacheLayout: option(
    shape(
      'json',
      strictObject({
        layout: z.custom<'NHD' | 'HND'>((v) => v === 'NHD' || v === 'HND', { error: (iss) => `expected NHD or HND, got ${got(iss.input)}` }),
        kvLayout: z.custom<'kv-first' | 'block-kv' | 'separate'>((v) => ['kv-first', 'block-kv', 'separate'].includes(v as string), { error: (iss) => `expected kv-first, block-kv or separate, got ${got(iss.input)}` }),
      }),
    ),
    { flags: '--cache-layout <layout>', description: 'NHD | HND (default NHD)', arg: 'string', apply: (v, cur) => ({ ...cacheLayoutOf(cur), layout: v }) },
    { flags: '--kv-layout <layout>', description: 'kv-first | block-kv | separate (default kv-first)', arg: 'string', apply: (v, cur) => ({ ...cacheLayoutOf(cur), kvLayout: v }) },
  ),
  kvDtype: option(choice(DTYPES), { flags: '--kv-dtype <dtype>', description: '{choices} (default bfloat16)' }),
  ssmDtype: option(choice(DTYPES), { flags: '--ssm-dtype <dtype>', description: 'Mamba state: {choices} (default float32)' }),
  maxNumBatchedTokens: option(posInt(), { flags: '--max-num-batched-tokens <n>', description: 'token budget of one step (default 256)' }),
  maxNumSeqs: option(posInt(), { flags: '--max-num-seqs <n>', description: 'most running requests (default 256)' }),
  longPrefillTokenThreshold: option(natInt(), {
    flags: '--long-prefill-token-threshold <n>',
    description: 'most prompt tokens of one request per step while others run (default max-num-batched-tokens / 4; 0 = no cap)',
  }),
  kvTransferConfig: option(
    shape('json', plainObject()),
    { flags: '--kv-transfer-config <json>', description: "vLLM's kv_transfer_config (JSON)" },
    {
      flags: '--kv-connector-module-path <module>',
      description: 'sets kv_transfer_config.kv_connector_module_path',
      arg: 'string',
      apply: (v, cur) => {
        if (!isPlainObject(cur)) throw new UsageError('--kv-connector-module-path needs a kv_transfer_config (--kv-transfer-config or the config)');
        return { ...cur, kv_connector_module_path: v };
      },
    },
  ),
  enablePrefixCaching: option(
    flag(),
    { flags: '--enable-prefix-caching', description: 'prefix caching (the default)' },
    { flags: '--no-enable-prefix-caching', aliases: ['--disable-prefix-caching'], description: 'no prefix caching' },
  ),
  engineId: option(text(), { flags: '--engine-id <id>', description: 'the engine id connectors name this engine by (default kv_transfer_config.engine_id, else random)' }),
  checksumBackend: option(choice(['auto', 'ts', 'native', 'cuda', 'cuda-emulated'] as const), {
    flags: '--checksum-backend <name>',
    description: '{choices} (auto: cuda with --device cuda; cuda-emulated: tests)',
  }),
  device: option(choice(['cpu', 'cuda', 'cuda-emulated'] as const), {
    flags: '--device <device>',
    description: '{choices}: KV cache in host memory (default), GPU memory (addon built with CUDA), or emulated device memory (tests); the model computes on the host',
  }),
  imports: option(texts(), {
    flags: '--import <module>',
    description: 'import a module first (repeatable; connector packages register themselves)',
    apply: (v, cur) => [...((cur as string[] | undefined) ?? []), ...(v as string[])],
  }),
  executor: option(
    choice(['inprocess', 'processes'] as const),
    { flags: '--workers <kind>', description: 'where the TP x PP workers run: inprocess (default) | processes (one worker process each)' },
    { flags: '--distributed-executor-backend <backend>', description: "vLLM's spelling of --workers: uni (inprocess) | mp (processes)", apply: (v, cur) => cur ?? backendToExecutor(v) },
  ),
  host: option(text(), { flags: '--host <host>', description: 'interface to listen on (default 127.0.0.1)' }),
  port: option(portNum(), { flags: '--port <n>', description: 'port (default 0: any free port)' }),
  maxBodyBytes: option(posInt(), { flags: '--max-body-bytes <n>', description: 'largest request body' }),
  requestTimeoutMs: option(natInt(), { flags: '--request-timeout-ms <n>', description: 'deadline of one request (0 = none)' }),
  maxTokens: option(posInt(), { flags: '--max-tokens <n>', description: 'largest max_tokens a request may ask for' }),
  maxModelLen: option(posInt(), { flags: '--max-model-len <n>', description: 'longest prompt + output, tokens' }),
  servedModelName: option(texts(), { flags: '--served-model-name <name...>', description: 'names requests may give in "model" (repeatable; default the model\'s)' }),
  logLevel: option(choice(LOG_LEVELS), { flags: '--log-level <level>', description: 'pino level of the logs on stderr: {choices} (default warn)' }),
};

/** The keys and flags of `kvconnect-proxy` (a {@link ProxyProcessConfig}). */
export const PROXY_OPTIONS: OptionTable<ProxyProcessConfig> = {
  prefill: option(texts(), { flags: '--prefill <url>', description: 'a producer engine server (repeatable: round robin)' }),
  decode: option(texts(), { flags: '--decode <url>', description: 'a consumer engine server (repeatable: round robin)' }),
  mode: option(choice(['sequential', 'concurrent'] as const), { flags: '--mode <mode>', description: 'sequential (NIXL style, default) | concurrent (Mooncake style)' }),
  host: option(text(), { flags: '--host <host>', description: 'interface to listen on (default 127.0.0.1)' }),
  port: option(portNum(), { flags: '--port <n>', description: 'port (default 0: any free port)' }),
  timeoutMs: option(posInt(), { flags: '--timeout-ms <n>', description: 'deadline of one engine request (default 120000)' }),
  connectTimeoutMs: option(natInt(), { flags: '--connect-timeout-ms <n>', description: 'how long to wait for the engines at start (default 10000)' }),
  maxBodyBytes: option(posInt(), { flags: '--max-body-bytes <n>', description: 'largest request body' }),
  maxTokens: option(posInt(), { flags: '--max-tokens <n>', description: 'largest max_tokens a request may ask for' }),
  logLevel: option(choice(LOG_LEVELS), { flags: '--log-level <level>', description: 'pino level of the logs (access log: info) on stderr (default info)' }),
};

/** The zod schema of an {@link EngineProcessConfig} (the keys of `--config` and `--config-json`), from {@link ENGINE_OPTIONS}. */
export const engineProcessConfigSchema: z.ZodType<EngineProcessConfig> = schemaOf(ENGINE_OPTIONS);

/** The zod schema of a {@link ProxyProcessConfig}, from {@link PROXY_OPTIONS}. */
export const proxyProcessConfigSchema: z.ZodType<ProxyProcessConfig> = schemaOf(PROXY_OPTIONS);

/** The flags of `kvconnect-engine`, in help order (from {@link ENGINE_OPTIONS}). */
export const ENGINE_FLAGS: readonly FlagSpec[] = flagsOf(ENGINE_OPTIONS);

/** The flags of `kvconnect-proxy`, in help order (from {@link PROXY_OPTIONS}). */
export const PROXY_FLAGS: readonly FlagSpec[] = flagsOf(PROXY_OPTIONS);

function natArg(v: string): number {
  if (!/^\d+$/.test(v)) throw new InvalidArgumentError('expected a non-negative integer');
  return Number(v);
}

function collect(v: string, prev: string[] | undefined): string[] {
  return [...(prev ?? []), v];
}

/** One flag of a table, with its key and what its text parses as. */
type FlagOf<C> = { spec: FlagSpec; key: keyof C; arg: ArgKind; attr: string; alias: boolean };

function optionsOf(spec: FlagSpec, arg: ArgKind, choices: readonly string[] | undefined, flags: string, hidden: boolean): Option {
  const o = new Option(flags, choices ? spec.description.replace('{choices}', choices.join(' | ')) : spec.description);
  if (hidden) o.hideHelp();
  if (arg === 'integer') o.argParser(natArg);
  else if (arg === 'strings' && !flags.includes('...')) o.argParser(collect);
  return o;
}

/** The commander program of an option table (not parsed; throws instead of exiting). */
function programOf<C>(name: string, summary: string, table: OptionTable<C>): { program: Command; attrs: FlagOf<C>[] } {
  const program = new Command(name).description(summary).allowExcessArguments(false).helpOption(false).exitOverride().configureOutput({ writeOut: () => {}, writeErr: () => {} });
  for (const c of COMMON_FLAGS) program.addOption(new Option(c.flags, c.description));
  const attrs: FlagOf<C>[] = [];
  for (const { key, ...spec } of flagsOf(table)) {
    const { arg: keyArg, choices } = table[key] as OptionSpec<unknown>;
    const arg = spec.arg ?? keyArg;
    for (const [i, flags] of [spec.flags, ...(spec.aliases ?? []).map((a) => `${a}${spec.flags.slice(spec.flags.indexOf(' ') < 0 ? spec.flags.length : spec.flags.indexOf(' '))}`)].entries()) {
      const o = optionsOf(spec, arg, choices, flags, i > 0);
      program.addOption(o);
      attrs.push({ spec, key, arg, attr: o.attributeName(), alias: i > 0 });
    }
  }
  return { program, attrs };
}

/**
 * Parses `argv` with an option table: `--config FILE`, then `--config-json`, then the flags (later
 * wins; `imports` accumulate), checked against the table's schema.
 * @throws UsageError for unknown flags, bad values or config keys.
 */
function parseWithTable<C extends object>(argv: readonly string[], name: string, table: OptionTable<C>, schema: z.ZodType<C>): Parsed<C> {
  const { program, attrs } = programOf(name, '', table);
  try {
    program.parse([...argv], { from: 'user' });
  } catch (e) {
    const msg = e instanceof Error ? e.message.replace(/^error: /, '') : String(e);
    throw new UsageError(msg);
  }
  const v = program.opts<Record<string, unknown>>();
  if (v.help) return { help: true };
  let cfg: Record<string, unknown> = {};
  if (typeof v.config === 'string') cfg = { ...(checkConfig<C>(readConfigFile(v.config), schema, `--config ${v.config}`) as Record<string, unknown>) };
  if (typeof v.configJson === 'string') {
    const j = checkConfig<C>(parseJson(v.configJson, '--config-json'), schema, '--config-json') as Record<string, unknown>;
    const imports = [...((cfg.imports as string[]) ?? []), ...((j.imports as string[] | undefined) ?? [])];
    cfg = { ...cfg, ...j };
    if (imports.length > 0) cfg.imports = imports;
  }
  for (const { spec, key, arg, attr, alias } of attrs) {
    const x = v[attr];
    const negated = spec.flags.startsWith('--no-');
    // `--x` and `--no-x` share commander's attribute (true / false); a hidden alias has its own (true)
    const given = arg === 'boolean' ? x === (negated && !alias ? false : true) : x !== undefined;
    if (!given) continue;
    const value = arg === 'json' ? parseJson(x as string, spec.flags.split(' ')[0]) : arg === 'boolean' ? !negated : x;
    cfg[key as string] = spec.apply ? spec.apply(value, cfg[key as string]) : value;
  }
  const config = checkConfig<C>(cfg, schema, `${name.replace('kvconnect-', '')} config`);
  return { help: false, config, exitWithParent: v.exitWithParent === true };
}

function usageOf<C>(name: string, head: string, table: OptionTable<C>): string {
  const { program } = programOf(name, head, table);
  program.usage('[options]');
  const aliases = flagsOf(table).filter((s) => s.aliases?.length).map((s) => `${s.aliases!.join(', ')} = ${s.flags.split(' ')[0]}`);
  return aliases.length ? `${program.helpInformation()}\nOlder spellings that still work: ${aliases.join('; ')}\n` : program.helpInformation();
}

/** Usage of `kvconnect-engine`. */
export const ENGINE_USAGE = usageOf(
  'kvconnect-engine',
  [
    'Starts one kvconnect engine behind an OpenAI-compatible HTTP API (POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /version, GET /health, GET /metrics, POST /shutdown) and prints {"event":"ready","url":...,"engineId":...} on stdout. Flags take vLLM\'s names where vLLM has the same setting.',
    'Config (later wins): --config FILE < --config-json JSON < flags. Config keys are EngineOptions (camelCase: preset, tpSize, ppSize, blockSize, numBlocks, cacheLayout, kvDtype, kvTransferConfig, engineId, ...) plus host, port, imports, maxBodyBytes, requestTimeoutMs, maxTokens, maxModelLen, servedModelName, logLevel.',
  ].join('\n\n'),
  ENGINE_OPTIONS,
);

/** Usage of `kvconnect-proxy`. */
export const PROXY_USAGE = usageOf(
  'kvconnect-proxy',
  [
    'Starts the P/D proxy over engine servers (POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health, GET /metrics, POST /shutdown) and prints {"event":"ready","url":...} on stdout.',
    'Config keys (--config, --config-json): prefill, decode, mode, host, port, timeoutMs, connectTimeoutMs, maxBodyBytes, maxTokens, logLevel.',
  ].join('\n\n'),
  PROXY_OPTIONS,
);

/** The result of parsing a command line: a config, or a request for help. */
export type Parsed<T> = { help: true } | { help: false; config: T; exitWithParent: boolean };

/**
 * Parses `kvconnect-engine` flags ({@link ENGINE_FLAGS}) into an {@link EngineProcessConfig}
 * (config file, then JSON, then flags).
 * @throws UsageError for unknown flags, bad values or config keys.
 */
export function parseEngineArgs(argv: readonly string[]): Parsed<EngineProcessConfig> {
  const parsed = parseWithTable(argv, 'kvconnect-engine', ENGINE_OPTIONS, engineProcessConfigSchema);
  if (!parsed.help && parsed.config.model === undefined && parsed.config.preset === undefined) throw new UsageError('engine config: give a model (--preset NAME, or model/preset in the config)');
  return parsed;
}

/**
 * Parses `kvconnect-proxy` flags ({@link PROXY_FLAGS}) into a {@link ProxyProcessConfig}.
 * @throws UsageError for unknown flags, bad values, or no prefill/decode URL.
 */
export function parseProxyArgs(argv: readonly string[]): Parsed<ProxyProcessConfig> {
  const parsed = parseWithTable(argv, 'kvconnect-proxy', PROXY_OPTIONS, proxyProcessConfigSchema);
  if (parsed.help) return parsed;
  const { config } = parsed;
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
  return parsed;
}

/**
 * The engine id of a config (`engineId`, else `kvTransferConfig.engine_id`, else a random one) and
 * its role (`kv_role`, or `none` without a transfer config): the fields every log line carries.
 */
function identityOf(c: EngineProcessConfig): { engine: string; role: string } {
  const t = c.kvTransferConfig;
  const engine = c.engineId ?? (typeof t?.engine_id === 'string' && t.engine_id.length > 0 ? t.engine_id : `engine-${Math.random().toString(36).slice(2, 10)}`);
  return { engine, role: typeof t?.kv_role === 'string' ? t.kv_role : 'none' };
}

/**
 * Builds the {@link EngineOptions} of an {@link EngineProcessConfig}: logs go to stderr (pino,
 * `logLevel`, default `warn`), every line naming the engine and its role.
 */
export function engineOptionsOf(c: EngineProcessConfig): EngineOptions {
  const id = identityOf(c);
  const logger = createLogger({ level: c.logLevel ?? 'warn', destination: { write: (line: string) => process.stderr.write(line) }, bindings: id });
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
    engineId: id.engine,
    servedModelName: c.servedModelName?.[0],
    checksumBackend: c.checksumBackend,
    device: c.device,
    executor: c.executor,
    workerImports: c.imports,
    observability: new KVChecksumObservability({ logger }),
  };
  for (const k of Object.keys(o) as (keyof EngineOptions)[]) if (o[k] === undefined) delete o[k];
  return o;
}

/**
 * A setup error that is the operator's config, as a {@link UsageError} (one `error:` line, exit 2):
 * a bad `kv_connector_extra_config` (the connector's `KVTransferConfigError`), an unknown connector
 * (which names the package to import), a connector module that does not import. Else null.
 */
function configErrorOf(e: unknown): UsageError | null {
  if (e instanceof KVTransferConfigError || e instanceof UnknownConnectorError || e instanceof ConnectorModuleError) return new UsageError(`engine options: ${e.message}`);
  return null;
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
    for (const m of config.imports ?? []) {
      try {
        await defaultRegistry.loadModule(m);
      } catch (e) {
        throw configErrorOf(e) ?? e;
      }
    }
    let engine: Engine;
    const options = engineOptionsOf(config);
    // worker processes log at the engine's level (worker-process.ts)
    if (config.logLevel !== undefined) process.env.KVCONNECT_LOG_LEVEL = config.logLevel;
    try {
      engine = new Engine(options);
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
      logger: options.observability!.logger,
      onShutdown: () => stopHook?.('shutdown'),
    });
    onStop(async () => {
      await server.close();
      await engine.shutdown();
    }, parsed.exitWithParent);
    try {
      await engine.ready;
    } catch (e) {
      throw configErrorOf(e) ?? e;
    }
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
      logger: createLogger({ level: config.logLevel ?? 'info', destination: { write: (line: string) => process.stderr.write(line) }, bindings: { component: 'proxy' } }),
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

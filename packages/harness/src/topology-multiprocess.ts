/**
 * The multi-process P/D topology of `kvconnect demo`: a producer engine, a consumer engine and a
 * P/D proxy as three child processes (`kvconnect-engine` / `kvconnect-proxy`, started with the
 * engine's launcher, listening on 127.0.0.1 only). The KV moves between the engine processes
 * through the connector's embedded transfer agent over 127.0.0.1 TCP, or the transfer engine of
 * `transfer` (NIXL, the Mooncake Transfer Engine): NIXL pull (`NixlConnector`,
 * sequential proxy), NIXL push (`NixlPushConnector`, sequential proxy) or Mooncake
 * (`MooncakeConnector`, concurrent proxy).
 *
 * The consumer's `kv_transfer_config` names the `FaultInjectingConnector`, loaded by module path
 * from the harness's built `dist/fault-connector.js`, with the chosen connector as `inner`, so
 * consumer-side faults can be injected into real loads. The producer is not wrapped, so
 * producer-side faults (`stale`, producer-side `payload`) are not available here.
 *
 * Processes run the compiled `dist/` of the packages (`npm run build` first).
 * @module
 */
import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import * as net from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { launchEngineProcess, launchProxyProcess, type EngineProcessConfig, type LaunchedEngine, type LaunchedProcess, type LaunchedProxy, type ModelConfig } from '@kvconnect/engine';
import { CLUSTER_SECRET_ENV, generateClusterSecret } from '@kvconnect/transfer';
import { FAULT_INJECTING_CONNECTOR } from './faults/config.js';
import type { FaultSpec } from './faults.js';
import { loopbackTransferEnv, transferExtraConfig, transferMismatch, type TransferEngine } from './transfer.js';

/** The connectors a multi-process topology can run. */
export type ProcessConnector = 'nixl-pull' | 'nixl-push' | 'mooncake';

/** Where an engine process runs its TP x PP workers (the engine's `executor`). */
export type WorkersMode = 'processes' | 'inprocess';

/**
 * Package, registered name and proxy mode of each {@link ProcessConnector}, and where each side's
 * engine runs its workers by default: one process per worker on both sides, as the connectors'
 * halves talk only through the connector contract (Mooncake: bootstrap server and ZeroMQ,
 * producer workers registered by the handshake hooks; NIXL: the producer's scheduler half serves
 * the side channel from its workers' handshake metadata, leases and push registrations cross in
 * the step metadata, packages/nixl-common/src/scheduler.ts).
 */
export const PROCESS_CONNECTORS: Readonly<Record<ProcessConnector, { pkg: string; name: string; mode: 'sequential' | 'concurrent'; workers: { producer: WorkersMode; consumer: WorkersMode } }>> = Object.freeze({
  'nixl-pull': { pkg: '@kvconnect/nixl-pull', name: 'NixlConnector', mode: 'sequential', workers: { producer: 'processes', consumer: 'processes' } },
  'nixl-push': { pkg: '@kvconnect/nixl-push', name: 'NixlPushConnector', mode: 'sequential', workers: { producer: 'processes', consumer: 'processes' } },
  mooncake: { pkg: '@kvconnect/mooncake', name: 'MooncakeConnector', mode: 'concurrent', workers: { producer: 'processes', consumer: 'processes' } },
});

/**
 * The harness's built fault-connector module (`dist/fault-connector.js`; the same path from `src/`
 * and from `dist/`): what engine processes load by `kv_connector_module_path` (they run plain
 * Node, so never the TypeScript source).
 */
export const FAULT_CONNECTOR_DIST: string = fileURLToPath(new URL('../dist/fault-connector.js', import.meta.url));

/**
 * The built entry (`dist/index.js`) of a connector package, resolved as plain Node resolves it
 * (never the TypeScript source a test runner may prefer).
 * @throws Error when the package is not installed or not built.
 */
export function connectorModulePath(c: ProcessConnector): string {
  const { pkg } = PROCESS_CONNECTORS[c];
  let found: string;
  try {
    found = createRequire(import.meta.url).resolve(pkg);
  } catch (e) {
    throw new Error(`connector ${c} needs ${pkg}, which is not installed (${e instanceof Error ? e.message.split('\n')[0] : String(e)})`);
  }
  // A runner with custom resolve conditions (tests) may land on the TypeScript source: take the
  // package's plain `default` export instead.
  let file = found;
  for (let d = dirname(found); d !== dirname(d); d = dirname(d)) {
    const pj = join(d, 'package.json');
    if (!existsSync(pj)) continue;
    const j = JSON.parse(readFileSync(pj, 'utf8')) as { name?: string; main?: string; exports?: unknown };
    if (j.name !== pkg) continue;
    const root = (j.exports as Record<string, unknown> | undefined)?.['.'] ?? j.exports;
    const def = typeof root === 'string' ? root : (root as Record<string, unknown> | undefined)?.default;
    if (typeof def === 'string') file = join(d, def);
    else if (j.main) file = join(d, j.main);
    break;
  }
  if (!existsSync(file)) throw new Error(`${pkg} is not built (${file} is missing): run npm run build`);
  return file;
}

/** One side's engine settings. */
export interface ProcessSide {
  tp?: number;
  blockSize?: number;
  layout?: 'NHD' | 'HND';
  maxBatchedTokens?: number;
  numBlocks?: number;
  /** Where the engine keeps its KV cache (the engine's `device`; default `cpu`). */
  device?: 'cpu' | 'cuda' | 'cuda-emulated';
}

/** Options of {@link startPDProcesses}. */
export interface PDProcessOptions {
  connector: ProcessConnector;
  /** The model (a full config: both engines and the reference use the same weights). */
  model: ModelConfig;
  producer?: ProcessSide;
  consumer?: ProcessSide;
  /** KV checksums (default true), consumer fail-closed (default true), load failure policy (default recompute). */
  checksums?: boolean;
  failClosed?: boolean;
  policy?: 'fail' | 'recompute';
  /** Consumer-side faults (FaultInjectingConnector around the connector); empty: the wrapper only measures. */
  faults?: FaultSpec[];
  /** Where both engines run their workers (default per side: the connector's {@link PROCESS_CONNECTORS} `workers`). */
  workers?: WorkersMode;
  /**
   * The transfer engine both engines' connectors move KV with (`kv_connector_extra_config.backend`;
   * default `embedded`): `nixl` for the NIXL connectors, `mooncake` for the Mooncake connector
   * (`CONNECTOR_TRANSFERS` in transfer.ts). The engine processes get {@link loopbackTransferEnv}'s
   * defaults. Whether the library loads is the caller's check (`transferUnavailable`); an engine
   * process that cannot load it fails to start with the one-line reason in its stderr.
   */
  transfer?: TransferEngine;
  /** Engine id prefix (default `demo`). */
  idPrefix?: string;
  /** Copy the children's stderr to this process's stderr (default false). */
  echoStderr?: boolean;
  /** A folder that gets each process's stdout and stderr: `producer.log`, `consumer.log`, `proxy.log` (default none). */
  logDir?: string;
  readyTimeoutMs?: number;
  /**
   * The cluster secret both engines get in `KVCONNECT_CLUSTER_SECRET` (default: a fresh one from
   * `generateClusterSecret`, so their side channels and agents authenticate each other; see
   * `docs/security.md`).
   */
  clusterSecret?: string;
  /** `kv_checksum_sample_rate` of both engines (docs/checksum-extensions.md; default absent: every block). */
  sampleRate?: number;
}

/** Running producer, consumer and proxy processes. */
export interface PDProcesses {
  readonly connector: ProcessConnector;
  /** The transfer engine the connectors use. */
  readonly transfer: TransferEngine;
  readonly mode: 'sequential' | 'concurrent';
  /** Where each engine runs its workers. */
  readonly workers: { producer: WorkersMode; consumer: WorkersMode };
  readonly producer: LaunchedEngine;
  readonly consumer: LaunchedEngine;
  readonly proxy: LaunchedProxy;
  /** The proxy's URL (clients send `POST /v1/completions` there). */
  readonly url: string;
  /** The consumer's `kv_transfer_config` (for reports). */
  readonly consumerTransferConfig: Record<string, unknown>;
  /** Every engine's `GET /metrics`, parsed. */
  metrics(): Promise<ProcessMetrics>;
  /** The pids of each engine's worker processes (`GET /health` `worker_pids`; empty with in-process workers). */
  workerPids(): Promise<{ producer: number[]; consumer: number[] }>;
  /** Stops the proxy, then both engines (SIGTERM, then SIGKILL). Idempotent. */
  shutdown(): Promise<void>;
}

/** A TCP port on 127.0.0.1 free at the time of the call (bound to 0 and closed again). */
export async function freePort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((r, j) => {
    s.once('error', j);
    s.listen(0, '127.0.0.1', () => r());
  });
  const port = (s.address() as net.AddressInfo).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

function engineConfig(model: ModelConfig, s: ProcessSide, defaults: Required<Omit<ProcessSide, 'device'>>, workers: WorkersMode): EngineProcessConfig {
  return {
    model,
    executor: workers,
    tpSize: s.tp ?? defaults.tp,
    blockSize: s.blockSize ?? defaults.blockSize,
    cacheLayout: { layout: s.layout ?? defaults.layout, kvLayout: 'kv-first' },
    maxNumBatchedTokens: s.maxBatchedTokens ?? defaults.maxBatchedTokens,
    numBlocks: s.numBlocks ?? defaults.numBlocks,
    ...(s.device !== undefined ? { device: s.device } : {}),
    host: '127.0.0.1',
    port: 0,
  };
}

/**
 * Starts the producer and consumer engine processes, then the proxy process (sequential for NIXL,
 * concurrent for Mooncake). When any of them fails to start, the others are stopped and the error
 * (with the child's stderr tail) is raised.
 */
export async function startPDProcesses(o: PDProcessOptions): Promise<PDProcesses> {
  const spec = PROCESS_CONNECTORS[o.connector];
  if (!spec) throw new RangeError(`unknown connector ${String(o.connector)}`);
  const module = connectorModulePath(o.connector);
  if (!existsSync(FAULT_CONNECTOR_DIST)) throw new Error(`${FAULT_CONNECTOR_DIST} is missing: build @kvconnect/harness first (npm run build)`);
  const checksums = o.checksums ?? true;
  const workers = o.workers === undefined ? spec.workers : { producer: o.workers, consumer: o.workers };
  const prefix = o.idPrefix ?? 'demo';
  const transfer = o.transfer ?? 'embedded';
  const mismatch = transferMismatch(o.connector, transfer);
  if (mismatch) throw new RangeError(mismatch);
  const extra: Record<string, unknown> = { ...transferExtraConfig(transfer) };
  let consumerExtra: Record<string, unknown> = { ...extra };
  if (o.connector === 'mooncake') {
    const port = await freePort();
    Object.assign(extra, { bootstrap_port: port, abort_timeout_ms: 20_000, transfer_timeout_ms: 30_000 });
    consumerExtra = { ...extra, remote_bootstrap_addr: `127.0.0.1:${port}` };
  } else {
    // NIXL: the producer keeps a request's blocks 5 s after the consumer read them, so that a
    // mismatching consumer can localize the difference (docs/localize.md).
    extra.localize_hold_ms = 5000;
  }
  const sampling = o.sampleRate !== undefined ? { kv_checksum_sample_rate: o.sampleRate } : {};
  const producerTransfer: Record<string, unknown> = { kv_connector: spec.name, kv_role: 'kv_producer', enable_kv_checksum: checksums, ...sampling, kv_connector_extra_config: extra };
  const consumerTransfer: Record<string, unknown> = {
    kv_connector: FAULT_INJECTING_CONNECTOR,
    kv_connector_module_path: FAULT_CONNECTOR_DIST,
    kv_role: 'kv_consumer',
    enable_kv_checksum: checksums,
    kv_checksum_fail_closed: o.failClosed ?? true,
    kv_load_failure_policy: o.policy ?? 'recompute',
    ...sampling,
    kv_connector_extra_config: { inner: { kv_connector: spec.name, kv_connector_extra_config: consumerExtra }, faults: o.faults ?? [] },
  };
  const launch = { echoStderr: o.echoStderr, readyTimeoutMs: o.readyTimeoutMs };
  const logFile = (name: string) => (o.logDir !== undefined ? { logFile: join(o.logDir, `${name}.log`) } : {});
  const engineEnv = { ...process.env, ...loopbackTransferEnv(transfer), [CLUSTER_SECRET_ENV]: o.clusterSecret ?? generateClusterSecret() };
  const started: LaunchedProcess[] = [];
  const stopAll = async () => {
    await Promise.all(started.splice(0).reverse().map((c) => c.stop().catch(() => undefined)));
  };
  try {
    const [p, d] = await Promise.allSettled([
      launchEngineProcess({
        ...launch,
        ...logFile('producer'),
        env: engineEnv,
        config: { ...engineConfig(o.model, o.producer ?? {}, { tp: 2, blockSize: 16, layout: 'NHD', maxBatchedTokens: 128, numBlocks: 512 }, workers.producer), engineId: `${prefix}-producer`, imports: [module], kvTransferConfig: producerTransfer },
      }),
      launchEngineProcess({
        ...launch,
        ...logFile('consumer'),
        env: engineEnv,
        config: { ...engineConfig(o.model, o.consumer ?? {}, { tp: 1, blockSize: 32, layout: 'HND', maxBatchedTokens: 256, numBlocks: 256 }, workers.consumer), engineId: `${prefix}-consumer`, imports: [module], kvTransferConfig: consumerTransfer },
      }),
    ]);
    for (const r of [p, d]) if (r.status === 'fulfilled') started.push(r.value);
    if (p.status === 'rejected') throw p.reason;
    if (d.status === 'rejected') throw d.reason;
    const producer = p.value;
    const consumer = d.value;
    const proxy = await launchProxyProcess({ ...launch, ...logFile('proxy'), config: { prefill: [producer.url], decode: [consumer.url], mode: spec.mode, host: '127.0.0.1', port: 0 } });
    started.push(proxy);
    let down: Promise<void> | null = null;
    return {
      connector: o.connector,
      transfer,
      mode: proxy.mode,
      workers,
      producer,
      consumer,
      proxy,
      url: proxy.url,
      consumerTransferConfig: consumerTransfer,
      metrics: async () => {
        const [pt, ct] = await Promise.all([scrape(producer.url), scrape(consumer.url)]);
        return processMetrics(pt, ct);
      },
      workerPids: async () => {
        const pids = async (url: string) => ((await (await fetch(`${url}/health`, { signal: AbortSignal.timeout(5000) })).json()) as { worker_pids?: number[][] }).worker_pids?.flat() ?? [];
        const [p, c] = await Promise.all([pids(producer.url), pids(consumer.url)]);
        return { producer: p, consumer: c };
      },
      shutdown: () => {
        down ??= (async () => {
          await proxy.stop().catch(() => undefined);
          await stopAll();
        })();
        return down;
      },
    };
  } catch (e) {
    await stopAll();
    throw e;
  }
}

// ---------------------------------------------------------------------------------------------
// Prometheus text from the engines' GET /metrics
// ---------------------------------------------------------------------------------------------

/** One sample of a Prometheus text exposition. */
export interface MetricSample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** Parses a Prometheus text exposition (comments and malformed lines are skipped). */
export function parsePrometheus(text: string): MetricSample[] {
  const out: MetricSample[] = [];
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels: Record<string, string> = {};
    if (m[2]) for (const l of m[2].matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2].replace(/\\(.)/g, (_, c: string) => (c === 'n' ? '\n' : c));
    const value = Number(m[3]);
    if (Number.isFinite(value)) out.push({ name: m[1], labels, value });
  }
  return out;
}

async function scrape(url: string): Promise<MetricSample[] | null> {
  try {
    const r = await fetch(`${url}/metrics`, { signal: AbortSignal.timeout(5000) });
    if (!r.ok) return null;
    return parsePrometheus(await r.text());
  } catch {
    return null;
  }
}

/** What the engine processes' metrics say (null: not exposed). */
export interface ProcessMetrics {
  /** Checksum compute seconds and bytes summed: producer sends, consumer loads. */
  checksumSeconds: { send: number | null; recv: number | null };
  checksumBytes: { send: number | null; recv: number | null };
  /** Consumer loads by verdict, recomputed and failed loads (checksum metrics). */
  loads: Record<string, number> | null;
  recomputed: number | null;
  failed: number | null;
  /** Transfer time (seconds, sum over transfers), bytes moved and transfers done by the connector (NIXL / Mooncake metrics), both processes. */
  transferSeconds: number | null;
  transferBytes: number | null;
  transfers: number | null;
  /** The connector metric names found. */
  connectorMetrics: string[];
  /** Whether each engine's /metrics answered. */
  scraped: { producer: boolean; consumer: boolean };
}

function sum(samples: MetricSample[] | null, name: string, where: (l: Record<string, string>) => boolean = () => true): number | null {
  if (!samples) return null;
  const hits = samples.filter((s) => s.name === name && where(s.labels));
  return hits.length ? hits.reduce((a, s) => a + s.value, 0) : null;
}

/** Reduces the producer's and consumer's metrics to the demo's numbers. */
export function processMetrics(producer: MetricSample[] | null, consumer: MetricSample[] | null): ProcessMetrics {
  const all = [...(producer ?? []), ...(consumer ?? [])];
  const conn = all.filter((s) => /^kvconnect_(nixl|mooncake)_/.test(s.name));
  const names = [...new Set(conn.map((s) => s.name.replace(/_(sum|count|bucket)$/, '')))].sort();
  const connSum = (re: RegExp) => {
    const hits = conn.filter((s) => re.test(s.name));
    return hits.length ? hits.reduce((a, s) => a + s.value, 0) : null;
  };
  let loads: Record<string, number> | null = null;
  if (consumer) {
    for (const s of consumer.filter((x) => x.name === 'kvconnect_kv_checksum_loads_total')) {
      loads ??= {};
      const v = s.labels.verdict ?? 'all';
      loads[v] = (loads[v] ?? 0) + s.value;
    }
  }
  return {
    checksumSeconds: { send: sum(producer, 'kvconnect_kv_checksum_seconds_sum', (l) => l.side === 'send'), recv: sum(consumer, 'kvconnect_kv_checksum_seconds_sum', (l) => l.side === 'recv') },
    checksumBytes: { send: sum(producer, 'kvconnect_kv_checksum_bytes_summed_total', (l) => l.side === 'send'), recv: sum(consumer, 'kvconnect_kv_checksum_bytes_summed_total', (l) => l.side === 'recv') },
    loads,
    recomputed: sum(consumer, 'kvconnect_kv_checksum_recomputed_total'),
    failed: sum(consumer, 'kvconnect_kv_checksum_failed_total'),
    // Transfer wall time, bytes and count: the connectors' vLLM-named histograms (nixl-common/src/metrics.ts, mooncake/src/metrics.ts)
    transferSeconds: connSum(/^kvconnect_(nixl|mooncake)_xfer_time_seconds_sum$/),
    transferBytes: connSum(/^kvconnect_(nixl|mooncake)_bytes_transferred_sum$/),
    transfers: connSum(/^kvconnect_(nixl|mooncake)_xfer_time_seconds_count$/),
    connectorMetrics: names,
    scraped: { producer: producer !== null, consumer: consumer !== null },
  };
}

/**
 * `kv_connector_extra_config` of the NIXL connectors, validated with defaults.
 * @module
 */
import { KVTransferConfigError, type ConfigProblem, type KVTransferConfig } from '@kvconnect/core';
import { resolveClusterSecret, type TransferAgent } from '@kvconnect/transfer';
import type { Registry } from 'prom-client';
import { isRegistry } from './metrics.js';

/** Creates a worker's transfer agent (test hook and custom backends). */
export type AgentFactory = (o: { backend: string; name: string; host: string; nixlLibrary?: string; nixlBackendParams?: Record<string, string>; clusterSecret?: Uint8Array | null }) => Promise<TransferAgent>;

/** The validated options. */
export interface NixlConfig {
  /** Transfer agent: `embedded` (TCP, default) or `nixl` (libnixl through the native addon). */
  backend: 'embedded' | 'nixl';
  /**
   * Side channel (producer): listen address (default `127.0.0.1`) and port (0 = any free port). A
   * non-loopback address needs {@link clusterSecret} (`checkBindHost`, `docs/security.md`).
   */
  sideChannelHost: string;
  sideChannelPort: number;
  /** Address the embedded agent listens on (default the side channel host; non-loopback needs {@link clusterSecret}). */
  agentHost: string;
  /**
   * The cluster secret (`cluster_secret`, else env `KVCONNECT_CLUSTER_SECRET`; `resolveClusterSecret`
   * in @kvconnect/transfer), or null: side-channel connections and embedded-agent connections prove
   * knowledge of it (`docs/security.md`).
   */
  clusterSecret: Buffer | null;
  /** Producer lease, ms (default 30 000). */
  leaseMs: number;
  /** Consumer heartbeat period, ms (default 5 000; 0 = none). */
  heartbeatMs: number;
  /**
   * Producer: how long a request's blocks stay held after the consumer is done with them (pull: every
   * consumer rank read them; push: every producer rank wrote them), so that a consumer whose load
   * mismatched can still ask for fine sums (`LOCALIZE`, docs/localize.md), ms (default 0: freed at once,
   * a later `LOCALIZE` is answered `gone`). A consumer's `RELEASE` ends the hold early.
   */
  localizeHoldMs: number;
  /** Deadline of one transfer, ms (default 30 000); also how long a consumer pins the lease before a READ. */
  transferTimeoutMs: number;
  /** Consumer (push): how long to wait for the producer's completion notifs, ms (default 60 000). */
  pushTimeoutMs: number;
  /** Side-channel request deadline, ms (default 5 000); the first handshake with a producer waits {@link transferTimeoutMs}. */
  handshakeTimeoutMs: number;
  /** Consumer (pull): check the lease with the producer before reading (default true; false is a test hook). */
  leaseCheck: boolean;
  /** `nixl` backend: path of libnixl_capi.so (default: the transfer package's search). */
  nixlLibrary?: string;
  /** `nixl` backend: backend plugin parameters (e.g. `{ ucx_error_handling_mode: 'none' }`). */
  nixlBackendParams?: Record<string, string>;
  /** Added to the compatibility hash (operators can keep deployments apart). */
  compatSalt: string;
  agentFactory: AgentFactory | null;
  metricsRegistry: Registry | null;
}

const KEYS = [
  'backend',
  'side_channel_host',
  'side_channel_port',
  'agent_host',
  'cluster_secret',
  'lease_ms',
  'heartbeat_ms',
  'localize_hold_ms',
  'transfer_timeout_ms',
  'push_timeout_ms',
  'handshake_timeout_ms',
  'lease_check',
  'compat_salt',
  'nixl_library',
  'nixl_backend_params',
  'agent_factory',
  'metrics_registry',
];

/**
 * Validates `config.kv_connector_extra_config`. Unknown keys are rejected (typos would silently
 * fall back to defaults otherwise).
 * @throws KVTransferConfigError listing every problem.
 */
export function parseNixlConfig(config: KVTransferConfig): NixlConfig {
  const x = config.kv_connector_extra_config ?? {};
  const problems: ConfigProblem[] = [];
  const p = (k: string) => `kv_connector_extra_config.${k}`;
  for (const k of Object.keys(x)) if (!KEYS.includes(k)) problems.push({ path: p(k), message: `unknown key (known: ${KEYS.join(', ')})` });
  const int = (k: string, def: number, min: number, max: number): number => {
    const v = x[k];
    if (v === undefined) return def;
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min || v > max) {
      problems.push({ path: p(k), message: `expected an integer in ${min}..${max}` });
      return def;
    }
    return v;
  };
  const text = (k: string, def: string): string => {
    const v = x[k];
    if (v === undefined) return def;
    if (typeof v !== 'string' || v.length === 0) {
      problems.push({ path: p(k), message: 'expected a non-empty string' });
      return def;
    }
    return v;
  };
  const backend = text('backend', 'embedded');
  if (backend !== 'embedded' && backend !== 'nixl') problems.push({ path: p('backend'), message: `expected 'embedded' or 'nixl', got ${JSON.stringify(backend)}` });
  const host = text('side_channel_host', '127.0.0.1');
  const leaseCheck = x.lease_check === undefined ? true : x.lease_check;
  if (typeof leaseCheck !== 'boolean') problems.push({ path: p('lease_check'), message: 'expected a boolean' });
  const factory = x.agent_factory ?? null;
  if (factory !== null && typeof factory !== 'function') problems.push({ path: p('agent_factory'), message: 'expected a function' });
  let clusterSecret: Buffer | null = null;
  try {
    clusterSecret = resolveClusterSecret(x.cluster_secret);
  } catch (e) {
    problems.push({ path: p('cluster_secret'), message: e instanceof Error ? e.message : String(e) });
  }
  const registry = x.metrics_registry ?? null;
  if (registry !== null && !isRegistry(registry)) problems.push({ path: p('metrics_registry'), message: 'expected a prom-client Registry' });
  const out: NixlConfig = {
    backend: backend as NixlConfig['backend'],
    sideChannelHost: host,
    sideChannelPort: int('side_channel_port', 0, 0, 65535),
    agentHost: text('agent_host', host),
    clusterSecret,
    leaseMs: int('lease_ms', 30_000, 1, 24 * 3600 * 1000),
    heartbeatMs: int('heartbeat_ms', 5_000, 0, 3600 * 1000),
    localizeHoldMs: int('localize_hold_ms', 0, 0, 3600 * 1000),
    transferTimeoutMs: int('transfer_timeout_ms', 30_000, 1, 3600 * 1000),
    pushTimeoutMs: int('push_timeout_ms', 60_000, 1, 24 * 3600 * 1000),
    handshakeTimeoutMs: int('handshake_timeout_ms', 5_000, 1, 600 * 1000),
    leaseCheck: leaseCheck === true,
    compatSalt: typeof x.compat_salt === 'string' ? x.compat_salt : '',
    agentFactory: typeof factory === 'function' ? (factory as AgentFactory) : null,
    metricsRegistry: isRegistry(registry) ? registry : null,
  };
  if (x.nixl_library !== undefined) {
    if (typeof x.nixl_library === 'string' && x.nixl_library.length > 0) out.nixlLibrary = x.nixl_library;
    else problems.push({ path: p('nixl_library'), message: 'expected a non-empty string' });
  }
  const bp = x.nixl_backend_params;
  if (bp !== undefined) {
    if (typeof bp === 'object' && bp !== null && !Array.isArray(bp) && Object.values(bp).every((v) => typeof v === 'string')) out.nixlBackendParams = { ...(bp as Record<string, string>) };
    else problems.push({ path: p('nixl_backend_params'), message: 'expected an object of strings' });
  }
  if (x.compat_salt !== undefined && typeof x.compat_salt !== 'string') problems.push({ path: p('compat_salt'), message: 'expected a string' });
  if (problems.length > 0) throw new KVTransferConfigError(problems);
  return out;
}

/**
 * `kv_connector_extra_config` of the NIXL connectors, validated with defaults.
 * @module
 */
import { KVTransferConfigError, int, strictObject, z, zodProblems, type ConfigProblem, type KVTransferConfig } from '@kvconnect/core';
import { MAX_LANES, resolveClusterSecret, type TransferAgent } from '@kvconnect/transfer';
import type { Registry } from 'prom-client';
import { DEFAULT_LOCALIZE_MAX_INFLIGHT, DEFAULT_LOCALIZE_RANGES_PER_SECOND } from './consumer-binding.js';
import { isRegistry } from './metrics.js';

/** Creates a worker's transfer agent (test hook and custom backends). */
export type AgentFactory = (o: { backend: string; name: string; host: string; nixlLibrary?: string; nixlBackendParams?: Record<string, string>; nixlBackend?: string; clusterSecret?: Uint8Array | null; lanes?: number; stallTimeoutMs?: number }) => Promise<TransferAgent>;

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
  /**
   * `embedded` backend: TCP connections per peer agent (`transfer_lanes`, 1..8, default 1), the
   * embedded agent's `lanes` option (striping, `@kvconnect/transfer` README "Striping"). Other
   * backends refuse a value other than 1 (NIXL stripes by its own UCX settings).
   */
  transferLanes: number;
  /**
   * `embedded` backend: the agent's stalled-connection bound, ms (`transfer_stall_timeout_ms`,
   * 0..2^31-1; 0 = off; unset: the agent's default, 5000 with `transfer_lanes` > 1, off with one
   * lane), the embedded agent's `stallTimeoutMs` (`@kvconnect/transfer` README "Striping").
   */
  transferStallTimeoutMs: number | undefined;
  /** Producer lease, ms: `lease_ms`, or vLLM's `kv_lease_duration` in seconds (default 30 000). */
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
  /**
   * Producer: `LOCALIZE` requests of one side-channel connection being computed at once, at most
   * (`localize_max_inflight_per_peer`, default 4); more are refused `busy` (docs/localize.md, "Binding and budget").
   */
  localizeMaxInflightPerPeer: number;
  /**
   * Producer: token ranges that may be asked about one request per second, charged to the request
   * whatever consumer key or connection asks (`localize_ranges_per_second_per_peer`, default 65 536:
   * one largest request, 64 groups x 1024 ranges); more are refused `busy`.
   */
  localizeRangesPerSecondPerPeer: number;
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
  /** `nixl` backend: the NIXL backend plugin (vLLM's `backends: ["UCX"]`; default UCX). */
  nixlBackend?: string;
  /** Added to the compatibility hash (operators can keep deployments apart). */
  compatSalt: string;
  agentFactory: AgentFactory | null;
  metricsRegistry: Registry | null;
}

const text = () => z.string({ error: 'expected a non-empty string' }).min(1, { error: 'expected a non-empty string' });

/**
 * The zod schema of the NIXL connectors' `kv_connector_extra_config`. kvconnect's keys plus
 * vLLM's NixlConnector keys (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py):
 * `backends` (NIXL backend plugins, e.g. `["UCX"]`; one is supported) and `kv_lease_duration`
 * (seconds; the same lease as `lease_ms`, which it may not be given with).
 */
export const nixlExtraConfigSchema = strictObject({
  backend: z.enum(['embedded', 'nixl'], { error: (iss) => `expected 'embedded' or 'nixl', got ${JSON.stringify(iss.input)}` }).optional(),
  side_channel_host: text().optional(),
  side_channel_port: int(0, 65535).optional(),
  agent_host: text().optional(),
  cluster_secret: z.unknown().optional(),
  lease_ms: int(1, 24 * 3600 * 1000).optional(),
  kv_lease_duration: z
    .number({ error: 'expected a number of seconds in (0, 86400]' })
    .refine((v) => v > 0 && v <= 86_400, { error: 'expected a number of seconds in (0, 86400]' })
    .optional(),
  heartbeat_ms: int(0, 3600 * 1000).optional(),
  localize_hold_ms: int(0, 3600 * 1000).optional(),
  localize_max_inflight_per_peer: int(1, 4096).optional(),
  localize_ranges_per_second_per_peer: int(1, 1 << 30).optional(),
  transfer_timeout_ms: int(1, 3600 * 1000).optional(),
  transfer_lanes: int(1, MAX_LANES).optional(),
  transfer_stall_timeout_ms: int(0, 2 ** 31 - 1).optional(),
  push_timeout_ms: int(1, 24 * 3600 * 1000).optional(),
  handshake_timeout_ms: int(1, 600 * 1000).optional(),
  lease_check: z.boolean({ error: 'expected a boolean' }).optional(),
  compat_salt: z.string({ error: 'expected a string' }).optional(),
  nixl_library: text().optional(),
  nixl_backend_params: z.record(z.string(), z.string(), { error: 'expected an object of strings' }).optional(),
  backends: z
    .array(text(), { error: 'expected an array of NIXL backend names, e.g. ["UCX"]' })
    .length(1, { error: 'expected one NIXL backend (kvconnect drives one backend plugin per agent), e.g. ["UCX"]' })
    .optional(),
  agent_factory: z.custom<AgentFactory>((v) => typeof v === 'function', { error: 'expected a function' }).optional(),
  metrics_registry: z.custom<Registry>((v) => isRegistry(v), { error: 'expected a prom-client Registry' }).optional(),
});

/**
 * Validates `config.kv_connector_extra_config` ({@link nixlExtraConfigSchema}). Unknown keys are
 * rejected (typos would silently fall back to defaults otherwise).
 * @throws KVTransferConfigError listing every problem, at `kv_connector_extra_config.<key>`.
 */
export function parseNixlConfig(config: KVTransferConfig): NixlConfig {
  const raw = config.kv_connector_extra_config ?? {};
  const p = (k: string) => `kv_connector_extra_config.${k}`;
  const r = nixlExtraConfigSchema.safeParse(raw);
  const problems: ConfigProblem[] = r.success ? [] : zodProblems(r.error, 'kv_connector_extra_config');
  let clusterSecret: Buffer | null = null;
  try {
    clusterSecret = resolveClusterSecret((raw as Record<string, unknown>).cluster_secret);
  } catch (e) {
    problems.push({ path: p('cluster_secret'), message: e instanceof Error ? e.message : String(e) });
  }
  if (r.success && r.data.lease_ms !== undefined && r.data.kv_lease_duration !== undefined) {
    problems.push({ path: p('kv_lease_duration'), message: 'give kv_lease_duration (seconds, vLLM) or lease_ms, not both' });
  }
  if (r.success && r.data.transfer_lanes !== undefined && r.data.transfer_lanes !== 1 && r.data.backend === 'nixl') {
    problems.push({ path: p('transfer_lanes'), message: "applies to backend 'embedded' only (NIXL stripes by its UCX settings, nixl_backend_params)" });
  }
  if (r.success && r.data.transfer_stall_timeout_ms !== undefined && r.data.backend === 'nixl') {
    problems.push({ path: p('transfer_stall_timeout_ms'), message: "applies to backend 'embedded' only (NIXL's UCX transports have their own timeouts)" });
  }
  if (!r.success || problems.length > 0) throw new KVTransferConfigError(problems);
  const x = r.data;
  const host = x.side_channel_host ?? '127.0.0.1';
  const out: NixlConfig = {
    backend: x.backend ?? 'embedded',
    sideChannelHost: host,
    sideChannelPort: x.side_channel_port ?? 0,
    agentHost: x.agent_host ?? host,
    clusterSecret,
    transferLanes: x.transfer_lanes ?? 1,
    transferStallTimeoutMs: x.transfer_stall_timeout_ms,
    leaseMs: x.lease_ms ?? (x.kv_lease_duration !== undefined ? Math.round(x.kv_lease_duration * 1000) : 30_000),
    heartbeatMs: x.heartbeat_ms ?? 5_000,
    localizeHoldMs: x.localize_hold_ms ?? 0,
    localizeMaxInflightPerPeer: x.localize_max_inflight_per_peer ?? DEFAULT_LOCALIZE_MAX_INFLIGHT,
    localizeRangesPerSecondPerPeer: x.localize_ranges_per_second_per_peer ?? DEFAULT_LOCALIZE_RANGES_PER_SECOND,
    transferTimeoutMs: x.transfer_timeout_ms ?? 30_000,
    pushTimeoutMs: x.push_timeout_ms ?? 60_000,
    handshakeTimeoutMs: x.handshake_timeout_ms ?? 5_000,
    leaseCheck: x.lease_check ?? true,
    compatSalt: x.compat_salt ?? '',
    agentFactory: x.agent_factory ?? null,
    metricsRegistry: x.metrics_registry ?? null,
  };
  if (x.nixl_library !== undefined) out.nixlLibrary = x.nixl_library;
  if (x.nixl_backend_params !== undefined) out.nixlBackendParams = { ...x.nixl_backend_params };
  if (x.backends !== undefined) out.nixlBackend = x.backends[0];
  return out;
}

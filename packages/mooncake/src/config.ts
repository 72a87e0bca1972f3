/**
 * `kv_connector_extra_config` of `MooncakeConnector`, validated into {@link MooncakeOptions}.
 * @module
 */
import { KVTransferConfigError, int, strictObject, z, zodProblems, type ConfigProblem } from '@kvconnect/core';
import { DEFAULT_LOCALIZE_MAX_INFLIGHT, DEFAULT_LOCALIZE_RANGES_PER_SECOND } from '@kvconnect/nixl-common';
import { MAX_LANES, resolveClusterSecret } from '@kvconnect/transfer';

/** The transfer backends `MooncakeConnector` can move bytes with. */
export type MooncakeBackend = 'embedded' | 'mooncake';

/** Options of the connector (extra config keys in brackets). */
export interface MooncakeOptions {
  /** [`backend`] `embedded` (default: the embedded agent over TCP) or `mooncake` (the Mooncake Transfer Engine through the addon). */
  backend: MooncakeBackend;
  /** [`bootstrap_host`] Where the producer's bootstrap server listens (default `127.0.0.1`). */
  bootstrapHost: string;
  /** [`bootstrap_port`] Its port (default 8998; 0 = any free port, see `MooncakeScheduler.bootstrapAddress`). */
  bootstrapPort: number;
  /**
   * [`bootstrap_addr`] Producer: an external bootstrap server (`host:port`) to register with instead
   * of starting one. Default: the engine's own.
   */
  bootstrapAddr?: string;
  /** [`remote_bootstrap_addr`] Consumer: the producer's bootstrap server, when the request's params do not name one. */
  remoteBootstrapAddr?: string;
  /** [`side_channel_host`] Where producer workers bind their ROUTER and agents listen (default `127.0.0.1`). */
  host: string;
  /**
   * [`transfer_lanes`] `embedded` backend: TCP connections per peer agent (1..8, default 1), the
   * embedded agent's `lanes` option (striping, `@kvconnect/transfer` README "Striping"). The
   * `mooncake` backend refuses a value other than 1.
   */
  transferLanes: number;
  /**
   * [`transfer_stall_timeout_ms`] `embedded` backend: the agent's stalled-connection bound, ms
   * (0..2^31-1; 0 = off; unset: the agent's default, 5000 with `transfer_lanes` > 1, off with one
   * lane), the embedded agent's `stallTimeoutMs` (`@kvconnect/transfer` README "Striping"). The
   * `mooncake` backend refuses it.
   */
  transferStallTimeoutMs: number | undefined;
  /**
   * [`abort_timeout_ms`] Producer: how long a consumer's request waits for the prefill, and how long
   * finished blocks are kept for consumers that have not asked (vLLM's abort timeout; default 480 000).
   */
  abortTimeoutMs: number;
  /** [`transfer_timeout_ms`] Consumer: deadline of a load from its start (default `abort_timeout_ms` + 60 000). */
  transferTimeoutMs: number;
  /** [`bootstrap_timeout_ms`] Consumer: deadline to find the producer's workers (default 30 000). */
  bootstrapTimeoutMs: number;
  /** [`max_message_bytes`] Largest side-channel message (default 64 MiB). */
  maxMessageBytes: number;
  /**
   * [`cluster_secret`, else the environment variable `KVCONNECT_CLUSTER_SECRET`] The cluster
   * secret (`@kvconnect/transfer`'s `resolveClusterSecret`), or null: every bootstrap and
   * side-channel exchange is then proven (`docs/security.md (Mooncake)`); without one every
   * listener must be on loopback.
   */
  clusterSecret: Buffer | null;
  /** [`max_waiters`] Producer: most consumer requests waiting for their prefill, over all peers (default 65 536). */
  maxWaiters: number;
  /** [`max_waiters_per_peer`] Producer: the same per consumer worker connection (default 16 384). */
  maxWaitersPerPeer: number;
  /** [`max_pending_bytes`] Producer: most bytes of metadata messages whose requests are not all answered, over all peers (default 256 MiB). */
  maxPendingBytes: number;
  /** [`max_pending_bytes_per_peer`] Producer: the same per consumer worker connection (default 64 MiB). */
  maxPendingBytesPerPeer: number;
  /** [`max_sessions`] Producer: most side-channel sessions (consumer worker connections) kept (default 4096; the least recently used goes). */
  maxSessions: number;
  /** [`session_idle_ms`] Producer: a session unused this long is forgotten (default 600 000). */
  sessionIdleMs: number;
  /**
   * [`localize_hold_ms`] Producer: how long a request's blocks stay held after every consumer
   * worker was served, so that a consumer whose load mismatched can still ask for fine sums
   * (`loc`, `docs/localize.md`), ms. Default 0: freed at once (a drill-down then finds `gone`).
   * The hold ends early once every producer worker answered the `loc` of its consumer. As NIXL's
   * `localize_hold_ms` (`@kvconnect/nixl-common` config).
   */
  localizeHoldMs: number;
  /**
   * [`localize_max_inflight_per_peer`] Producer: `loc` requests of one connection being computed
   * at once, at most (default 4; a worker computes one at a time, so this bounds nothing more than
   * NIXL's); more are refused `busy` (`docs/localize.md`, "Binding and budget").
   */
  localizeMaxInflightPerPeer: number;
  /**
   * [`localize_ranges_per_second_per_peer`] Producer: token ranges that may be asked about one
   * transfer per second and worker, whatever consumer key or connection asks (default 65 536: one
   * largest request); more are refused `busy`.
   */
  localizeRangesPerSecondPerPeer: number;
}

const text = () => z.string({ error: 'expected a non-empty string' }).min(1, { error: 'expected a non-empty string' });

/**
 * The zod schema of `MooncakeConnector`'s `kv_connector_extra_config` (one schema library for
 * every config: `@kvconnect/core`'s building blocks, as the NIXL connectors' extra config). The
 * bounds are the ones {@link MooncakeOptions} documents; `cluster_secret` is resolved apart
 * (`resolveClusterSecret`, which also reads the environment).
 */
export const mooncakeExtraConfigSchema = strictObject({
  backend: z
    .unknown()
    .refine((v) => v === 'embedded' || v === 'mooncake', { error: (iss) => (typeof iss.input === 'string' && iss.input.length > 0 ? `expected "embedded" or "mooncake", got ${JSON.stringify(iss.input)}` : 'expected a non-empty string') })
    .transform((v) => v as MooncakeBackend)
    .optional(),
  bootstrap_host: text().optional(),
  bootstrap_port: int(0, 65535).optional(),
  bootstrap_addr: text().optional(),
  remote_bootstrap_addr: text().optional(),
  side_channel_host: text().optional(),
  transfer_lanes: int(1, MAX_LANES).optional(),
  transfer_stall_timeout_ms: int(0, 2 ** 31 - 1).optional(),
  abort_timeout_ms: int(1, 86_400_000).optional(),
  transfer_timeout_ms: int(1, 86_400_000).optional(),
  bootstrap_timeout_ms: int(1, 86_400_000).optional(),
  max_message_bytes: int(1024, 1024 * 1024 * 1024).optional(),
  cluster_secret: z.unknown().optional(),
  max_waiters: int(1, 1 << 24).optional(),
  max_waiters_per_peer: int(1, 1 << 24).optional(),
  max_pending_bytes: int(1024, 2 ** 40).optional(),
  max_pending_bytes_per_peer: int(1024, 2 ** 40).optional(),
  max_sessions: int(1, 1 << 20).optional(),
  session_idle_ms: int(1, 86_400_000).optional(),
  localize_hold_ms: int(0, 3600 * 1000).optional(),
  localize_max_inflight_per_peer: int(1, 4096).optional(),
  localize_ranges_per_second_per_peer: int(1, 1 << 30).optional(),
});

/**
 * Validates `MooncakeConnector`'s extra config. Unknown keys are rejected (a typo would otherwise
 * be silently ignored).
 * @param env where `KVCONNECT_CLUSTER_SECRET` is read (default `process.env`).
 * @throws KVTransferConfigError listing every problem (paths under `kv_connector_extra_config`;
 *   a bad cluster secret is one).
 */
export function parseMooncakeOptions(extra: Record<string, unknown>, env: NodeJS.ProcessEnv = process.env): MooncakeOptions {
  const r = mooncakeExtraConfigSchema.safeParse(extra);
  const problems: ConfigProblem[] = r.success ? [] : zodProblems(r.error, 'kv_connector_extra_config');
  let clusterSecret: Buffer | null = null;
  try {
    clusterSecret = resolveClusterSecret(extra.cluster_secret, env);
  } catch (e) {
    problems.push({ path: 'kv_connector_extra_config.cluster_secret', message: e instanceof Error ? e.message : String(e) });
  }
  if (r.success && r.data.transfer_lanes !== undefined && r.data.transfer_lanes !== 1 && r.data.backend === 'mooncake') {
    problems.push({ path: 'kv_connector_extra_config.transfer_lanes', message: "applies to backend 'embedded' only (the Mooncake Transfer Engine has its own transports)" });
  }
  if (r.success && r.data.transfer_stall_timeout_ms !== undefined && r.data.backend === 'mooncake') {
    problems.push({ path: 'kv_connector_extra_config.transfer_stall_timeout_ms', message: "applies to backend 'embedded' only (the Mooncake Transfer Engine has its own timeouts)" });
  }
  if (!r.success || problems.length) throw new KVTransferConfigError(problems);
  const x = r.data;
  const abortTimeoutMs = x.abort_timeout_ms ?? 480_000;
  return {
    backend: x.backend ?? 'embedded',
    bootstrapHost: x.bootstrap_host ?? '127.0.0.1',
    bootstrapPort: x.bootstrap_port ?? 8998,
    bootstrapAddr: x.bootstrap_addr,
    remoteBootstrapAddr: x.remote_bootstrap_addr,
    host: x.side_channel_host ?? '127.0.0.1',
    transferLanes: x.transfer_lanes ?? 1,
    transferStallTimeoutMs: x.transfer_stall_timeout_ms,
    abortTimeoutMs,
    transferTimeoutMs: x.transfer_timeout_ms ?? abortTimeoutMs + 60_000,
    bootstrapTimeoutMs: x.bootstrap_timeout_ms ?? 30_000,
    maxMessageBytes: x.max_message_bytes ?? 64 * 1024 * 1024,
    clusterSecret,
    maxWaiters: x.max_waiters ?? 65_536,
    maxWaitersPerPeer: x.max_waiters_per_peer ?? 16_384,
    maxPendingBytes: x.max_pending_bytes ?? 256 * 1024 * 1024,
    maxPendingBytesPerPeer: x.max_pending_bytes_per_peer ?? 64 * 1024 * 1024,
    maxSessions: x.max_sessions ?? 4096,
    sessionIdleMs: x.session_idle_ms ?? 600_000,
    localizeHoldMs: x.localize_hold_ms ?? 0,
    localizeMaxInflightPerPeer: x.localize_max_inflight_per_peer ?? DEFAULT_LOCALIZE_MAX_INFLIGHT,
    localizeRangesPerSecondPerPeer: x.localize_ranges_per_second_per_peer ?? DEFAULT_LOCALIZE_RANGES_PER_SECOND,
  };
}

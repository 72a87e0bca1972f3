/**
 * `kv_connector_extra_config` of `MooncakeConnector`, validated into {@link MooncakeOptions}.
 * @module
 */
import { KVTransferConfigError, type ConfigProblem } from '@kvconnect/core';
import { resolveClusterSecret } from '@kvconnect/transfer';

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
}

const KEYS = [
  'backend',
  'bootstrap_host',
  'bootstrap_port',
  'bootstrap_addr',
  'remote_bootstrap_addr',
  'side_channel_host',
  'abort_timeout_ms',
  'transfer_timeout_ms',
  'bootstrap_timeout_ms',
  'max_message_bytes',
  'cluster_secret',
  'max_waiters',
  'max_waiters_per_peer',
  'max_pending_bytes',
  'max_pending_bytes_per_peer',
  'max_sessions',
  'session_idle_ms',
  'localize_hold_ms',
] as const;

/**
 * Validates `MooncakeConnector`'s extra config. Unknown keys are rejected (a typo would otherwise
 * be silently ignored).
 * @param env where `KVCONNECT_CLUSTER_SECRET` is read (default `process.env`).
 * @throws KVTransferConfigError listing every problem (paths under `kv_connector_extra_config`;
 *   a bad cluster secret is one).
 */
export function parseMooncakeOptions(extra: Record<string, unknown>, env: NodeJS.ProcessEnv = process.env): MooncakeOptions {
  const problems: ConfigProblem[] = [];
  const path = (k: string) => `kv_connector_extra_config.${k}`;
  for (const k of Object.keys(extra)) if (!(KEYS as readonly string[]).includes(k)) problems.push({ path: path(k), message: `unknown key (known: ${KEYS.join(', ')})` });
  const str = (k: string): string | undefined => {
    const v = extra[k];
    if (v === undefined) return undefined;
    if (typeof v !== 'string' || v.length === 0) {
      problems.push({ path: path(k), message: 'expected a non-empty string' });
      return undefined;
    }
    return v;
  };
  const int = (k: string, dflt: number, min: number, max: number): number => {
    const v = extra[k];
    if (v === undefined) return dflt;
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min || v > max) {
      problems.push({ path: path(k), message: `expected an integer in ${min}..${max}` });
      return dflt;
    }
    return v;
  };
  const backend = str('backend') ?? 'embedded';
  if (backend !== 'embedded' && backend !== 'mooncake') problems.push({ path: path('backend'), message: `expected "embedded" or "mooncake", got ${JSON.stringify(backend)}` });
  const abortTimeoutMs = int('abort_timeout_ms', 480_000, 1, 86_400_000);
  const o: MooncakeOptions = {
    backend: backend as MooncakeBackend,
    bootstrapHost: str('bootstrap_host') ?? '127.0.0.1',
    bootstrapPort: int('bootstrap_port', 8998, 0, 65535),
    bootstrapAddr: str('bootstrap_addr'),
    remoteBootstrapAddr: str('remote_bootstrap_addr'),
    host: str('side_channel_host') ?? '127.0.0.1',
    abortTimeoutMs,
    transferTimeoutMs: int('transfer_timeout_ms', abortTimeoutMs + 60_000, 1, 86_400_000),
    bootstrapTimeoutMs: int('bootstrap_timeout_ms', 30_000, 1, 86_400_000),
    maxMessageBytes: int('max_message_bytes', 64 * 1024 * 1024, 1024, 1024 * 1024 * 1024),
    clusterSecret: null,
    maxWaiters: int('max_waiters', 65_536, 1, 1 << 24),
    maxWaitersPerPeer: int('max_waiters_per_peer', 16_384, 1, 1 << 24),
    maxPendingBytes: int('max_pending_bytes', 256 * 1024 * 1024, 1024, 2 ** 40),
    maxPendingBytesPerPeer: int('max_pending_bytes_per_peer', 64 * 1024 * 1024, 1024, 2 ** 40),
    maxSessions: int('max_sessions', 4096, 1, 1 << 20),
    sessionIdleMs: int('session_idle_ms', 600_000, 1, 86_400_000),
    localizeHoldMs: int('localize_hold_ms', 0, 0, 3600 * 1000),
  };
  try {
    o.clusterSecret = resolveClusterSecret(extra.cluster_secret, env);
  } catch (e) {
    problems.push({ path: path('cluster_secret'), message: e instanceof Error ? e.message : String(e) });
  }
  if (problems.length) throw new KVTransferConfigError(problems);
  return o;
}

/**
 * The transfer agent a MooncakeConnector worker moves bytes with: the embedded agent by default,
 * or the Mooncake Transfer Engine (through `@kvconnect/transfer`'s Mooncake agent and the native
 * addon) with `backend: 'mooncake'`.
 * @module
 */
import * as transfer from '@kvconnect/transfer';
import type { TransferAgent } from '@kvconnect/transfer';
import type { MooncakeBackend } from './config.js';

/** Raised when `backend: 'mooncake'` is asked for and the Mooncake Transfer Engine cannot be used. */
export class MooncakeUnavailableError extends Error {
  constructor(reason: string, options?: { cause?: unknown }) {
    super(`Mooncake Transfer Engine not available: ${reason}`, options);
    this.name = 'MooncakeUnavailableError';
  }
}

const PREFIX = 'Mooncake Transfer Engine not available: ';

function messageOf(e: unknown): string {
  const m = e instanceof Error ? e.message : String(e);
  return m.startsWith(PREFIX) ? m.slice(PREFIX.length) : m;
}

/**
 * Why `backend: 'mooncake'` cannot be used (the Transfer Engine library cannot be loaded: one
 * line naming what to install and `MOONCAKE_PREFIX`, then every path tried;
 * `transfer.transferEngineUnavailable`), or null when it may be (the engine itself may still fail
 * to start: {@link createAgent} reports that). The library is looked for as
 * `transfer.mooncakeLibraryCandidates` says: `$MOONCAKE_LIBRARY`, then `$MOONCAKE_PREFIX/lib`,
 * `lib/<arch>-linux-gnu`, `lib64`, then the library path.
 */
export function mooncakeUnavailableReason(): string | null {
  return transfer.transferEngineUnavailable('mooncake');
}

/**
 * Creates a worker's agent: an `EmbeddedAgent` listening on `host`, or for `mooncake` a
 * `MooncakeAgent` (one Transfer Engine per worker, P2PHANDSHAKE metadata, `host` as its
 * `local_server_name`: the host of its segment name, which peers connect to). `lanes`: the
 * embedded agent's TCP connections per peer (`transfer_lanes`, default 1); `stallTimeoutMs`: its
 * stalled-connection bound (`transfer_stall_timeout_ms`; undefined: the agent's default). The bind rule
 * applies to `host` first (`checkBindHost`: loopback, or any host with a cluster secret). The real
 * Transfer Engine's handshake and data listeners bind to every interface whatever `host` says
 * (Mooncake has no bind-address setting for them; `docs/security.md (Mooncake)`).
 * @throws ClusterSecretError for a non-loopback `host` without `secret`; MooncakeUnavailableError
 *   for `mooncake` when the library is missing or the engine fails to start.
 */
export async function createAgent(backend: MooncakeBackend, name: string, host: string, secret: Uint8Array | null = null, lanes = 1, stallTimeoutMs?: number): Promise<TransferAgent> {
  transfer.checkBindHost(host, secret, backend === 'embedded' ? 'Mooncake connector embedded agent' : 'Mooncake Transfer Engine');
  if (backend === 'embedded') return transfer.EmbeddedAgent.create({ name, host, clusterSecret: secret ?? undefined, lanes, ...(stallTimeoutMs !== undefined ? { stallTimeoutMs } : {}) });
  const why = mooncakeUnavailableReason();
  if (why) throw new MooncakeUnavailableError(why);
  try {
    return await transfer.MooncakeAgent.create({ name, host });
  } catch (e) {
    throw new MooncakeUnavailableError(messageOf(e), { cause: e });
  }
}

/**
 * The transfer agent a worker uses, by `kv_connector_extra_config.backend`: `embedded` (TCP,
 * `EmbeddedAgent`) or `nixl` (libnixl through the native addon, `NixlAgent`, when the transfer
 * package provides it).
 * @module
 */
import * as transfer from '@kvconnect/transfer';
import type { TransferAgent } from '@kvconnect/transfer';
import type { AgentFactory } from './config.js';

/** No agent for a backend (e.g. `nixl` without libnixl). */
export class AgentUnavailableError extends Error {
  override readonly name: string = 'AgentUnavailableError';
}

/**
 * Creates the agent of `backend` named `name`: the embedded agent listens on `host` (any free
 * port; a non-loopback host needs `clusterSecret`, which its connections then prove) and opens
 * `lanes` TCP connections per peer (default 1; `transfer_lanes`) and `stallTimeoutMs` (`transfer_stall_timeout_ms`; unset: the agent's default); the NIXL agent loads `nixlLibrary` (default: the transfer package's search, e.g.
 * `NIXL_LIBRARY` / `NIXL_PREFIX`) with the backend plugin `nixlBackend` (default UCX) and `nixlBackendParams`.
 * @throws AgentUnavailableError for an unknown backend, and for `nixl` when libnixl_capi.so does not
 *   load (one line: what to install, `NIXL_PREFIX`; `transferEngineUnavailable`); the agent's error
 *   when it cannot start.
 */
export const createAgent: AgentFactory = async ({ backend, name, host, nixlLibrary, nixlBackendParams, nixlBackend, clusterSecret, lanes, stallTimeoutMs }) => {
  if (backend === 'embedded') return transfer.EmbeddedAgent.create({ name, host, clusterSecret: clusterSecret ?? null, lanes: lanes ?? 1, ...(stallTimeoutMs !== undefined ? { stallTimeoutMs } : {}) });
  if (backend === 'nixl') {
    const why = transfer.transferEngineUnavailable('nixl', { library: nixlLibrary });
    if (why) throw new AgentUnavailableError(why);
    return transfer.NixlAgent.create({ name, library: nixlLibrary, backend: nixlBackend, backendParams: nixlBackendParams }) as Promise<TransferAgent>;
  }
  throw new AgentUnavailableError(`unknown transfer backend ${JSON.stringify(backend)}`);
};

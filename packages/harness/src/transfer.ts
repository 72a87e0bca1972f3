/**
 * Which transfer engine the connectors of a demo or scenario move KV with (`kvconnect demo
 * --transfer`, a scenario's `transfer`): the names of `@kvconnect/transfer`'s
 * `TRANSFER_ENGINES`, the engines each connector can use, and what the connectors'
 * `kv_connector_extra_config` gets for one (its `backend` key: `packages/nixl-common/src/config.ts`,
 * `packages/mooncake/src/config.ts`).
 * @module
 */
import { TRANSFER_ENGINES, isTransferEngine, transferEngineUnavailable, type TransferEngine } from '@kvconnect/transfer';
import type { ConnectorName } from './scenario.js';

export { TRANSFER_ENGINES, type TransferEngine };

/**
 * The transfer engines each scenario connector can use, default first: the NIXL connectors take
 * the embedded agent or NIXL, the Mooncake connector the embedded agent or the Mooncake Transfer
 * Engine; the in-process connector moves no bytes through an agent (`embedded` only, the default).
 */
export const CONNECTOR_TRANSFERS: Readonly<Record<ConnectorName, readonly TransferEngine[]>> = Object.freeze({
  'in-process': ['embedded'],
  'nixl-pull': ['embedded', 'nixl'],
  'nixl-push': ['embedded', 'nixl'],
  mooncake: ['embedded', 'mooncake'],
});

/**
 * Why `connector` cannot run over `transfer` (not an engine name, or not one the connector takes),
 * or null when it can. Says nothing of whether the library is installed: see
 * {@link transferUnavailable}.
 */
export function transferMismatch(connector: ConnectorName, transfer: unknown): string | null {
  if (!isTransferEngine(transfer)) return `transfer must be one of ${TRANSFER_ENGINES.join(', ')}, got ${JSON.stringify(transfer)}`;
  const ok = CONNECTOR_TRANSFERS[connector];
  return ok.includes(transfer) ? null : `connector ${connector} cannot use transfer engine ${transfer} (it takes ${ok.join(' or ')})`;
}

/** Why `transfer`'s library cannot be loaded here (one line: what to install, which variable), or null. */
export function transferUnavailable(transfer: TransferEngine, env: NodeJS.ProcessEnv = process.env): string | null {
  return transferEngineUnavailable(transfer, { env });
}

/** The connectors' `kv_connector_extra_config` entries that select `transfer` (none for the default, `embedded`). */
export function transferExtraConfig(transfer: TransferEngine): Record<string, unknown> {
  return transfer === 'embedded' ? {} : { backend: transfer };
}

/**
 * Environment defaults that keep a library engine's traffic on loopback in the engine processes
 * of the demo (every process there listens on 127.0.0.1): `UCX_NET_DEVICES=lo` for NIXL over UCX
 * (else UCX's TCP also uses the host's other interfaces), `MC_FORCE_TCP=1` for Mooncake (its TCP
 * transport, no RDMA probing). A variable already set in `env` is kept.
 */
export function loopbackTransferEnv(transfer: TransferEngine, env: NodeJS.ProcessEnv = process.env): Record<string, string> {
  const want: Record<string, string> = transfer === 'nixl' ? { UCX_NET_DEVICES: 'lo' } : transfer === 'mooncake' ? { MC_FORCE_TCP: '1' } : {};
  return Object.fromEntries(Object.entries(want).filter(([k]) => env[k] === undefined));
}

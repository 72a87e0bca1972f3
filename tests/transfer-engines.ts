/**
 * The transfer engines the connector test matrices (tests/nixl, tests/mooncake) run over: the
 * embedded agent always, and the real library of the connector (`nixl`, `mooncake`) where its
 * prefix variable (`NIXL_PREFIX`, `MOONCAKE_PREFIX`) names an install; otherwise that half of the
 * matrix is skipped, the reason in its suite name. A prefix that is set but does not hold a
 * loadable library is not skipped: its tests fail with the one-line reason
 * (`transferEngineUnavailable` in packages/transfer/src/engines.ts).
 */
import { TRANSFER_ENGINE_LIBRARIES, type TransferEngine } from '@kvconnect/transfer';

/** One transfer engine of a matrix. */
export interface TransferUnderTest {
  readonly engine: TransferEngine;
  /** Suite name: the engine, and the reason when skipped. */
  readonly label: string;
  /** Why this engine's half is skipped here, or null. */
  readonly skip: string | null;
  /** `kv_connector_extra_config` entries that select the engine (`backend`; none for embedded). */
  readonly extra: Readonly<Record<string, unknown>>;
}

/** The engines `real`'s connector matrix runs over: the embedded agent, then the real library. */
export function transfersUnderTest(real: 'nixl' | 'mooncake', env: NodeJS.ProcessEnv = process.env): TransferUnderTest[] {
  const { prefixEnv } = TRANSFER_ENGINE_LIBRARIES[real];
  const prefix = env[prefixEnv];
  const skip = prefix ? null : `${prefixEnv} is not set: no real ${real === 'nixl' ? 'NIXL' : 'Mooncake Transfer Engine'} install to run over`;
  return [
    { engine: 'embedded', label: 'transfer embedded (the embedded agent, TCP)', skip: null, extra: {} },
    { engine: real, label: `transfer ${real} (real library${prefix ? ` at ${prefixEnv}=${prefix}` : ''})${skip ? ` (skipped: ${skip})` : ''}`, skip, extra: { backend: real } },
  ];
}

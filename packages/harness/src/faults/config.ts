/**
 * The FaultInjectingConnector's config: strict validation of its `kv_connector_extra_config`
 * (`inner`, `faults`); an unknown key or fault kind is a `KVTransferConfigError` at config time.
 * @module
 */
import { KVTransferConfigError, parseKVTransferConfig, type KVTransferConfig } from '@kvconnect/core';
import { checkFaultList, type FaultSpec } from '../faults.js';
import { Checker } from '../validate.js';

/** The registered name. */
export const FAULT_INJECTING_CONNECTOR = 'FaultInjectingConnector';

/** The extra config of a FaultInjectingConnector. */
export interface FaultConnectorConfig {
  /** The wrapped connector: its name, extra config and optional module path. */
  inner: { kv_connector: string; kv_connector_extra_config?: Record<string, unknown>; kv_connector_module_path?: string };
  /** Faults to inject (see `faults.ts`). Default none: the wrapper only measures loads. */
  faults?: FaultSpec[];
}

/**
 * Validates a FaultInjectingConnector transfer config and returns the inner connector's config
 * (inheriting role and checksum settings) and the faults.
 * @throws KVTransferConfigError listing every problem (paths under `kv_connector_extra_config`):
 *   unknown keys, a missing or bad `inner`, a fault of unknown kind or with bad fields.
 */
export function parseFaultConfig(config: KVTransferConfig): { inner: KVTransferConfig; faults: FaultSpec[] } {
  const c = new Checker();
  const base = 'kv_connector_extra_config';
  const x = c.object(config.kv_connector_extra_config, base, ['inner', 'faults']);
  let inner: KVTransferConfig | undefined;
  let faults: FaultSpec[] = [];
  if (x) {
    const io = c.required(x, 'inner', base) ? c.object(x.inner, `${base}.inner`, ['kv_connector', 'kv_connector_extra_config', 'kv_connector_module_path']) : undefined;
    if (io) {
      try {
        inner = parseKVTransferConfig(
          {
            kv_connector: io.kv_connector,
            kv_role: config.kv_role,
            enable_kv_checksum: config.enable_kv_checksum,
            kv_checksum_fail_closed: config.kv_checksum_fail_closed,
            kv_load_failure_policy: config.kv_load_failure_policy,
            kv_connector_extra_config: io.kv_connector_extra_config ?? {},
            ...(io.kv_connector_module_path !== undefined ? { kv_connector_module_path: io.kv_connector_module_path } : {}),
          },
          `${base}.inner`,
        );
        if (inner.kv_connector === FAULT_INJECTING_CONNECTOR) c.fail(`${base}.inner.kv_connector`, 'cannot wrap itself');
      } catch (e) {
        if (e instanceof KVTransferConfigError) c.problems.push(...e.problems);
        else throw e;
      }
    }
    if (x.faults !== undefined) faults = checkFaultList(c, x.faults, `${base}.faults`) ?? [];
  }
  if (c.problems.length > 0) throw new KVTransferConfigError(c.problems);
  return { inner: inner!, faults };
}

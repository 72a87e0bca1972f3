/**
 * `MooncakeConnector`: the factory of both halves, registered in core's default registry when
 * this package is imported.
 * @module
 */
import { defaultRegistry, type KVConnectorFactory, type KVConnectorRegistry } from '@kvconnect/core';
import { MooncakeUnavailableError, mooncakeUnavailableReason } from './agent.js';
import { parseMooncakeOptions } from './config.js';
import { MooncakeScheduler } from './scheduler.js';
import { MooncakeWorker, type MooncakeConnectorHooks } from './worker.js';

/** The registered name (`kv_connector`). */
export const MOONCAKE_CONNECTOR = 'MooncakeConnector';

/**
 * A `MooncakeConnector` factory. `hooks` are for tests and embedders (fault injection); the
 * registered factory has none. Both halves validate `kv_connector_extra_config`.
 * @throws KVTransferConfigError (from `createScheduler` / `createWorker`) for a bad extra config;
 *   MooncakeUnavailableError for `backend: 'mooncake'` when `@kvconnect/transfer` has no Mooncake agent.
 */
export function createMooncakeConnectorFactory(hooks: MooncakeConnectorHooks = {}, name: string = MOONCAKE_CONNECTOR): KVConnectorFactory {
  const check = (backend: string) => {
    if (backend === 'mooncake') {
      const why = mooncakeUnavailableReason();
      if (why) throw new MooncakeUnavailableError(why);
    }
  };
  return {
    name,
    createScheduler(config, ctx) {
      const o = parseMooncakeOptions(config.kv_connector_extra_config);
      check(o.backend);
      return new MooncakeScheduler(config, ctx, o);
    },
    createWorker(config, ctx) {
      const o = parseMooncakeOptions(config.kv_connector_extra_config);
      check(o.backend);
      return new MooncakeWorker(config.kv_role, ctx, o, hooks);
    },
    // The payload travels with the written KV (MooncakeScheduler.kvChecksumCarrier).
    kvChecksumCarriers: () => ['connector'],
  };
}

/** The factory registered as `MooncakeConnector`. */
export const mooncakeConnectorFactory: KVConnectorFactory = createMooncakeConnectorFactory();

/** Registers `MooncakeConnector` in `registry` (default: core's default registry) unless the name is taken. */
export function registerMooncakeConnector(registry: KVConnectorRegistry = defaultRegistry): void {
  if (!registry.has(MOONCAKE_CONNECTOR)) registry.register(mooncakeConnectorFactory);
}

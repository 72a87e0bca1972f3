/**
 * `HarnessInProcessConnector`: the harness's KV connector that copies blocks between engines of
 * ONE process (the in-process topology of `runner.ts`). It is the engine's test-support
 * `InProcessConnector` (`@kvconnect/engine/testing`, not for production), registered under the
 * harness's own name over a bus the caller creates: every engine of one run is built from one
 * registry holding the connector over that run's {@link InProcessBus}.
 * @module
 */
import type { KVConnectorRegistry } from '@kvconnect/core';
import { createInProcessConnectorFactory, InProcessBus, type InProcessConnectorFactory } from '@kvconnect/engine/testing';

export { InProcessBus, type CopyContext, type InProcessMeta } from '@kvconnect/engine/testing';

/** The registered name. */
export const IN_PROCESS_CONNECTOR = 'HarnessInProcessConnector';

/** The connector's factory over `bus`. */
export function inProcessConnectorFactory(bus: InProcessBus): InProcessConnectorFactory {
  return createInProcessConnectorFactory({ name: IN_PROCESS_CONNECTOR, bus });
}

/** Registers `HarnessInProcessConnector` over `bus` (default: a new bus) in `registry`, unless the name is taken. */
export function registerInProcessConnector(registry: KVConnectorRegistry, bus: InProcessBus = new InProcessBus()): void {
  if (!registry.has(IN_PROCESS_CONNECTOR)) registry.register(inProcessConnectorFactory(bus));
}

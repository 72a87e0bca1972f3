/**
 * `HarnessInProcessConnector`: the harness's KV connector that copies blocks between engines of one
 * process. It is the engine's test-support `InProcessConnector` (`@kvconnect/engine/testing`, not
 * for production), registered under the harness's own name; every name shares the one process-wide
 * {@link inProcessBus}.
 * @module
 */
import { defaultRegistry, type KVConnectorFactory, type KVConnectorRegistry } from '@kvconnect/core';
import { createInProcessConnectorFactory } from '@kvconnect/engine/testing';

export { InProcessBus, inProcessBus, type CopyContext } from '@kvconnect/engine/testing';

/** The registered name. */
export const IN_PROCESS_CONNECTOR = 'HarnessInProcessConnector';

/** The connector's factory. */
export const inProcessConnectorFactory: KVConnectorFactory = createInProcessConnectorFactory(IN_PROCESS_CONNECTOR);

/** Registers `HarnessInProcessConnector` in `registry` (default: the core's default registry), once. */
export function registerInProcessConnector(registry: KVConnectorRegistry = defaultRegistry): void {
  if (!registry.has(IN_PROCESS_CONNECTOR)) registry.register(inProcessConnectorFactory);
}

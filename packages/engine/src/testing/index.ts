/**
 * `@kvconnect/engine/testing`: test support for the engine and its users (the harness, the
 * cross-package tests). Not for production: nothing here is hardened or meant to serve requests.
 *
 * - `InProcessConnector`: a KV connector that copies blocks between engines of one process over a
 *   bus the test creates and passes in, with fault hooks (see {@link InProcessBus}).
 * @packageDocumentation
 */
export {
  IN_PROCESS_CONNECTOR,
  InProcessBus,
  createInProcessConnectorFactory,
  inProcessRegistry,
  registerInProcessConnector,
  type CopyContext,
  type InProcessConnectorFactory,
  type InProcessConnectorOptions,
  type InProcessLease,
  type InProcessLoad,
  type InProcessMeta,
} from './in-process-connector.js';

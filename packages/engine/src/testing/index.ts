/**
 * `@kvconnect/engine/testing`: test support for the engine and its users (the harness, the
 * cross-package tests). Not for production: nothing here is hardened or meant to serve requests.
 *
 * - `InProcessConnector`: a KV connector that copies blocks between engines of one process over a
 *   process-wide bus, with fault hooks (see {@link InProcessBus}).
 * @packageDocumentation
 */
export {
  IN_PROCESS_CONNECTOR,
  InProcessBus,
  createInProcessConnectorFactory,
  inProcessBus,
  inProcessConnectorFactory,
  registerInProcessConnector,
  type CopyContext,
} from './in-process-connector.js';

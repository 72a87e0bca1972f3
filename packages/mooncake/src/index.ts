/**
 * `@kvconnect/mooncake`: `MooncakeConnector` (P2P). The proxy sends a request to the producer and
 * the consumer at once with a shared `transfer_id`; consumer workers find the producer's workers
 * through the producer's bootstrap HTTP server, send their transfer metadata over a ZeroMQ
 * side channel (DEALER -> ROUTER, MessagePack), and the producer workers WRITE the KV into the
 * consumer's blocks through a `TransferAgent` (the embedded agent, or the Mooncake Transfer
 * Engine) and answer with a transfer response that carries the KV checksums (SPEC 7,
 * `kv_checksums`).
 *
 * Importing the package registers `MooncakeConnector` in `@kvconnect/core`'s `defaultRegistry`.
 * @packageDocumentation
 */
import { registerMooncakeConnector } from './connector.js';

export { MOONCAKE_CONNECTOR, createMooncakeConnectorFactory, mooncakeConnectorFactory, registerMooncakeConnector } from './connector.js';
export { MooncakeScheduler, type MooncakeConnectorMetadata, type MooncakeLoadSpec, type MooncakeSendSpec } from './scheduler.js';
export { MooncakeWorker, type MooncakeConnectorHooks, type MooncakeWorkerStats } from './worker.js';
export { MOONCAKE_METRIC_NAMES, mooncakeMetrics, type MooncakeMetrics } from './metrics.js';
export { parseMooncakeOptions, type MooncakeBackend, type MooncakeOptions } from './config.js';
export { MooncakeUnavailableError, createAgent, mooncakeUnavailableReason } from './agent.js';
export * from './protocol.js';
export { LayoutMismatchError, describeLayout, partOffset, planWrites, stateStrides, workerMemory, type ConsumerSide, type ProducerSide, type WritePlan } from './layout.js';
export * from './bootstrap.js';
export { ConsumerSession, ProducerSessions, SIDE_CHANNEL_AUTH_WINDOW_MS, SideChannelAuthError, helloProof, messageProof, welcomeProof, type ProducerSessionOptions } from './channel.js';

registerMooncakeConnector();
export { askProducerWorker, localizeAtProducer, type LocalizeTarget } from './localize.js';

/**
 * @kvconnect/nixl-common: the code NIXL pull (`NixlConnector`) and push (`NixlPushConnector`)
 * share, written once: the side-channel handshake and control protocol (strict decoders with
 * size limits), the mapping of a consumer rank's caches onto the producer's ranks as descriptor
 * pairs (TP sizes, replicated GQA heads, MLA, Mamba state splits, block sizes, prefix hits), the
 * notif codec (SPEC 7), producer leases, metrics, the producer side channel (owned by the scheduler half), side-channel clients (owned by each half that uses them), and the scheduler and worker
 * halves' common parts.
 * @packageDocumentation
 */
export * from './codec.js';
export * from './protocol.js';
export * from './side-channel.js';
export * from './mapping.js';
export * from './notif.js';
export * from './lease.js';
export * from './metrics.js';
export * from './config.js';
export * from './agent.js';
export * from './peers.js';
export * from './producer.js';
export * from './scheduler.js';
export * from './worker.js';
export * from './localize.js';
export * from './consumer-binding.js';

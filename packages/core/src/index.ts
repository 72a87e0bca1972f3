/**
 * @kvconnect/core: the KV connector API (scheduler and worker halves), the connector registry and
 * config, the KV checksum scheduler and worker that plug into any connector through its carrier
 * (SPEC 6-8), `MultiConnector`, and the metrics, events and logs of KV checksums.
 * @packageDocumentation
 */
export type * from './connector.js';
export { workerKey, hostRegions, DeviceMemoryUnsupportedError } from './connector.js';
export { loadBlockIds } from './blocks.js';
export type * from './checksum-hooks.js';
export * from './config.js';
export * from './schema.js';
export * from './registry.js';
export * from './multi-connector.js';
export * from './observability.js';
export * from './checksum-report.js';
export { KVChecksumWorker, type KVChecksumWorkerOptions } from './checksum-worker.js';
export * from './checksum-scheduler.js';
export * from './unusable-params.js';
export * from './checksum-localize.js';
export * from './checksum-block-sizes.js';
export * from './lease-capability.js';

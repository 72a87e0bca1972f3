/**
 * `FaultInjectingConnector`: a KV connector that wraps any other connector and injects the
 * faults seen in the field (`../shared/cases/field-cases.md`) into real loads, so that the KV
 * checksums can be shown to catch them (or not). Engines load it by module path
 * (`../fault-connector.ts`, whose `register(registry)` the registry calls), or a caller registers
 * it ({@link registerFaultInjectingConnector}); importing this folder registers nothing.
 *
 * ```json
 * { "kv_connector": "FaultInjectingConnector",
 *   "kv_connector_module_path": "<path or file: URL of fault-connector.js>",
 *   "kv_role": "kv_consumer", "enable_kv_checksum": true, "kv_checksum_fail_closed": true,
 *   "kv_connector_extra_config": {
 *     "inner": { "kv_connector": "NixlConnector", "kv_connector_extra_config": { } },
 *     "faults": [ { "kind": "bit-flip", "rate": 0.1, "seed": 7 } ] } }
 * ```
 *
 * The halves follow the connector contract (`@kvconnect/core` connector.ts) and share nothing: the
 * scheduler half sends loads and `stale` orders in the step metadata, the workers send what they
 * injected and their load timings back in their worker metadata, and the scheduler half returns
 * each request's ground truth ({@link FaultReport}: which fault hit it, the block positions whose
 * bytes really changed, load times and bytes) in the `kv_transfer_params` it returns for the
 * request, under {@link FAULT_REPORT_PARAM} ({@link faultReportOf} reads it). All of it is plain
 * data, so scheduler and workers may run in different processes.
 *
 * Layout: `config.ts` (strict config), `scheduler.ts` and `worker.ts` (the two wrappers),
 * `fault.ts` (the {@link Fault} interface; where each hook runs; how to add a fault), `kinds/`
 * (one module per fault kind, `kinds/index.ts` the exhaustive switch), `bytes.ts` and
 * `select.ts` (helpers the faults share), `kv-bytes.ts` (byte access to host or device KV regions),
 * `records.ts` (what crosses and what is reported).
 * @module
 */
export { FAULT_INJECTING_CONNECTOR, parseFaultConfig, type FaultConnectorConfig } from './config.js';
export { FaultInjectingConnectorFactory, prepareFaultInjection, registerFaultInjectingConnector, type ConnectorLookup, type RegisterFaultOptions } from './factory.js';
export type { BlocksInput, Fault, HeldReport, Injected, LoadInput, NotifState, ParamsInput, ResultHit, ResultsInput, WorkerPlace } from './fault.js';
export { createFault, mutatePayload, UnknownFaultKindError } from './kinds/index.js';
export {
  FAULT_REPORT_PARAM,
  applyGroundTruth,
  faultReportOf,
  requestIndexOf,
  withoutFaultReport,
  type ChangedGroup,
  type FaultMeta,
  type FaultReport,
  type FaultWorkerMeta,
  type GroundTruthFields,
  type InjectionRecord,
  type LoadRecord,
  type StaleOrder,
  type WorkerInjection,
  type WorkerLoadRecord,
} from './records.js';
export { FaultScheduler } from './scheduler.js';
export { faultSelects, requestKeySeed } from './select.js';
export { FaultWorker } from './worker.js';
export type { LoadMeta } from './bytes.js';
export { DEVICE_PAGE_BYTES, DeviceKvBytes, HostKvBytes, kvBytesOf, type DeviceKvCopies, type FaultCaches, type KvBytes } from './kv-bytes.js';

/**
 * @kvconnect/harness: the fault-injecting connector, scenarios with expectations, the scenario
 * runner, the demo and its report, and the `kvconnect` CLI (`run`, `demo`).
 * @packageDocumentation
 */
export * from './validate.js';
export * from './faults.js';
export * from './locate.js';
export * from './models.js';
export * from './prompts.js';
export * from './scenario.js';
export * from './faults/index.js';
export { FAULT_CONNECTOR_MODULE } from './fault-connector.js';
export { IN_PROCESS_CONNECTOR, InProcessBus, inProcessConnectorFactory, registerInProcessConnector, type CopyContext } from './in-process-connector.js';
export * from './runner.js';
export * from './run-files.js';
export * from './demo.js';
export * from './topology-multiprocess.js';
export * from './transfer.js';
export * from './report.js';

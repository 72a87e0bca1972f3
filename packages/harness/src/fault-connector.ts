/**
 * The FaultInjectingConnector's module for `kv_connector_module_path`: the registry that loads it
 * calls its {@link register} with itself (`KVConnectorRegistry.loadModule`). Importing it
 * registers nothing. The connector itself is in `faults/`.
 * @module
 */
import type { KVConnectorRegistry } from '@kvconnect/core';
import { registerFaultInjectingConnector } from './faults/factory.js';

/** This module's URL: give it as `kv_connector_module_path` to load the connector by module path. */
export const FAULT_CONNECTOR_MODULE: string = import.meta.url;

/** Registers `FaultInjectingConnector` and the harness's in-process connector (over a new bus) in `registry`; called by `KVConnectorRegistry.loadModule`. */
export function register(registry: KVConnectorRegistry): void {
  registerFaultInjectingConnector(registry);
}

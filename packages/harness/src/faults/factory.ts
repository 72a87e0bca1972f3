/**
 * The FaultInjectingConnector's factory and registration (explicit: importing this module
 * registers nothing).
 * @module
 */
import type { KVChecksumCarrierKind, KVConnectorFactory, KVConnectorRegistry, KVTransferConfig, SchedulerContext, WorkerContext } from '@kvconnect/core';
import { registerInProcessConnector, type InProcessBus } from '../in-process-connector.js';
import { FAULT_INJECTING_CONNECTOR, parseFaultConfig } from './config.js';
import type { Fault } from './fault.js';
import { createFault } from './kinds/index.js';
import type { FaultMeta, FaultWorkerMeta } from './records.js';
import { FaultScheduler } from './scheduler.js';
import { FaultWorker } from './worker.js';

/** What the factory needs of a registry: factories by name. */
export interface ConnectorLookup {
  get(name: string): KVConnectorFactory;
  has?(name: string): boolean;
}

/** The faults of a validated fault list, in list order. */
function faultsOf(specs: ReturnType<typeof parseFaultConfig>['faults']): Fault[] {
  return specs.map((s, i) => createFault(s, i));
}

/**
 * The `FaultInjectingConnector` factory; the inner connector is created from `lookup`. Its halves
 * exchange {@link FaultMeta} (scheduler to workers) and {@link FaultWorkerMeta} (workers to
 * scheduler), each wrapping the inner connector's; handshake metadata is the inner connector's.
 */
export class FaultInjectingConnectorFactory implements KVConnectorFactory<FaultMeta | null, FaultWorkerMeta, unknown> {
  readonly name = FAULT_INJECTING_CONNECTOR;
  constructor(private readonly lookup: ConnectorLookup) {}

  private innerFactory(inner: KVTransferConfig): KVConnectorFactory {
    if (this.lookup.has && !this.lookup.has(inner.kv_connector) && inner.kv_connector_module_path) {
      throw new Error(`FaultInjectingConnector: inner connector ${JSON.stringify(inner.kv_connector)} is not registered yet; await prepareFaultInjection(registry, config) first (it imports ${inner.kv_connector_module_path})`);
    }
    return this.lookup.get(inner.kv_connector);
  }

  /** @throws KVTransferConfigError for a bad extra config (unknown fault kinds included). */
  createScheduler(config: KVTransferConfig, ctx: SchedulerContext): FaultScheduler {
    const { inner, faults } = parseFaultConfig(config);
    return new FaultScheduler(this.innerFactory(inner).createScheduler(inner, ctx), faultsOf(faults), config, ctx);
  }

  /** @throws KVTransferConfigError for a bad extra config (unknown fault kinds included). */
  createWorker(config: KVTransferConfig, ctx: WorkerContext): FaultWorker {
    const { inner, faults } = parseFaultConfig(config);
    return new FaultWorker(this.innerFactory(inner).createWorker(inner, ctx), faultsOf(faults), ctx);
  }

  /** The inner connector's declared carriers (the fault injector carries what its inner connector carries). */
  kvChecksumCarriers(config: KVTransferConfig): readonly KVChecksumCarrierKind[] | undefined {
    const { inner } = parseFaultConfig(config);
    return this.innerFactory(inner).kvChecksumCarriers?.(inner);
  }
}

/** Options of {@link registerFaultInjectingConnector}. */
export interface RegisterFaultOptions {
  /** The bus of the harness's in-process connector registered alongside (default: a new bus, one per registry). */
  bus?: InProcessBus;
}

/**
 * Registers `FaultInjectingConnector` (its inner connectors are looked up in `registry`) and the
 * harness's in-process connector (over `o.bus`), each unless its name is taken.
 */
export function registerFaultInjectingConnector(registry: KVConnectorRegistry, o: RegisterFaultOptions = {}): void {
  if (!registry.has(FAULT_INJECTING_CONNECTOR)) registry.register(new FaultInjectingConnectorFactory(registry));
  registerInProcessConnector(registry, o.bus);
}

/**
 * Makes a FaultInjectingConnector config usable in `registry`: registers the connector and imports
 * the inner connector's `kv_connector_module_path` when its name is not registered yet.
 */
export async function prepareFaultInjection(registry: KVConnectorRegistry, config: KVTransferConfig): Promise<void> {
  registerFaultInjectingConnector(registry);
  const { inner } = parseFaultConfig(config);
  await registry.prepare(inner);
}

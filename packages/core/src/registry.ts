/**
 * The connector registry (vLLM's `KVConnectorFactory`): connectors register a
 * {@link KVConnectorFactory} under their `kv_connector` name; engines create both halves from a
 * {@link KVTransferConfig}. Third-party connectors load from `kv_connector_module_path` without
 * engine changes.
 * @module
 */
import { isAbsolute, resolve as resolvePath } from 'node:path';
import { pathToFileURL } from 'node:url';
import type { KVConnectorFactory, KVConnectorScheduler, KVConnectorWorker, KVTransferConfig, SchedulerContext, WorkerContext } from './connector.js';
import { MultiConnectorFactory, multiConnectorChildConfigs } from './multi-connector.js';

/** Raised by {@link KVConnectorRegistry.register} for a name already registered. */
export class DuplicateConnectorError extends Error {
  constructor(readonly connectorName: string) {
    super(`a KV connector named ${JSON.stringify(connectorName)} is already registered`);
    this.name = 'DuplicateConnectorError';
  }
}

/**
 * The kvconnect packages that register a connector when imported, by `kv_connector` name (the
 * names their packages export: `NIXL_CONNECTOR`, `NIXL_PUSH_CONNECTOR`, `MOONCAKE_CONNECTOR`,
 * `IN_PROCESS_CONNECTOR`); {@link UnknownConnectorError} names the package to import.
 */
export const CONNECTOR_PACKAGES: Readonly<Record<string, string>> = Object.freeze({
  NixlConnector: '@kvconnect/nixl-pull',
  NixlPushConnector: '@kvconnect/nixl-push',
  MooncakeConnector: '@kvconnect/mooncake',
  InProcessConnector: '@kvconnect/engine/testing',
});

/**
 * Raised for a `kv_connector` name no factory is registered under. `registered` lists the known
 * names; for a kvconnect connector whose package was not imported, the message names the package
 * ({@link CONNECTOR_PACKAGES}) and how to import it (`--import` on the engine CLI).
 */
export class UnknownConnectorError extends Error {
  constructor(
    readonly connectorName: string,
    readonly registered: readonly string[],
  ) {
    const pkg = CONNECTOR_PACKAGES[connectorName];
    const hint = pkg ? `; it is in ${pkg}: import it first (kvconnect-engine --import ${pkg}, or kv_connector_module_path)` : '';
    super(`unknown KV connector ${JSON.stringify(connectorName)}; registered: ${registered.length ? registered.join(', ') : '(none)'}${hint}`);
    this.name = 'UnknownConnectorError';
  }
}

/** Raised when `kv_connector_module_path` cannot be imported or registers nothing usable. */
export class ConnectorModuleError extends Error {
  constructor(
    readonly modulePath: string,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(`KV connector module ${JSON.stringify(modulePath)}: ${message}`, options);
    this.name = 'ConnectorModuleError';
  }
}

/** What {@link KVConnectorRegistry.create} needs: the scheduler's and one worker's context. */
export interface ConnectorCreateContext {
  scheduler: SchedulerContext;
  worker: WorkerContext;
}

/** Both halves of a connector, from {@link KVConnectorRegistry.create}. */
export interface ConnectorHalves {
  factory: KVConnectorFactory;
  scheduler: KVConnectorScheduler;
  worker: KVConnectorWorker;
}

/** Options of a {@link KVConnectorRegistry}. */
export interface RegistryOptions {
  /** Register the built-in connectors (`MultiConnector`, resolving its children in this registry). Default true. */
  builtins?: boolean;
}

function isFactory(x: unknown): x is KVConnectorFactory {
  if (typeof x !== 'object' || x === null) return false;
  const f = x as Record<string, unknown>;
  return typeof f.name === 'string' && typeof f.createScheduler === 'function' && typeof f.createWorker === 'function';
}

/**
 * A map of connector names to factories.
 *
 * A third-party module works in either of two ways (both are supported by {@link loadModule}):
 * its top-level code calls `defaultRegistry.register(factory)`, or it exports
 * `register(registry)` (called with the registry that loads it). A module whose default export
 * is a factory is registered too.
 */
export class KVConnectorRegistry {
  private readonly factories = new Map<string, KVConnectorFactory>();
  private readonly loaded = new Map<string, Promise<void>>();

  constructor(options: RegistryOptions = {}) {
    if (options.builtins !== false) this.register(new MultiConnectorFactory(this));
  }

  /**
   * Registers `factory` under `factory.name`.
   * @throws DuplicateConnectorError if the name is taken; TypeError if `factory` is not a factory
   *   (a non-empty `name`, `createScheduler` and `createWorker`).
   */
  register(factory: KVConnectorFactory): void {
    if (!isFactory(factory) || factory.name.length === 0) throw new TypeError('register() needs a KVConnectorFactory (name, createScheduler, createWorker)');
    if (this.factories.has(factory.name)) throw new DuplicateConnectorError(factory.name);
    this.factories.set(factory.name, factory);
  }

  /** True if `name` is registered. */
  has(name: string): boolean {
    return this.factories.has(name);
  }

  /** Registered names, sorted. */
  names(): string[] {
    return [...this.factories.keys()].sort();
  }

  /**
   * The factory registered under `name`.
   * @throws UnknownConnectorError listing the registered names.
   */
  get(name: string): KVConnectorFactory {
    const f = this.factories.get(name);
    if (!f) throw new UnknownConnectorError(name, this.names());
    return f;
  }

  /**
   * Both halves of the connector `config.kv_connector` (synchronous: call {@link prepare} first
   * when the config names a module path).
   * @throws UnknownConnectorError; whatever the factory throws (e.g. a `KVTransferConfigError`
   *   for a bad extra config).
   */
  create(config: KVTransferConfig, ctx: ConnectorCreateContext): ConnectorHalves {
    const factory = this.get(config.kv_connector);
    return { factory, scheduler: factory.createScheduler(config, ctx.scheduler), worker: factory.createWorker(config, ctx.worker) };
  }

  /** The scheduler half only (an engine whose workers run elsewhere). */
  createScheduler(config: KVTransferConfig, ctx: SchedulerContext): KVConnectorScheduler {
    return this.get(config.kv_connector).createScheduler(config, ctx);
  }

  /** A worker half only (one per TP rank x PP stage). */
  createWorker(config: KVTransferConfig, ctx: WorkerContext): KVConnectorWorker {
    return this.get(config.kv_connector).createWorker(config, ctx);
  }

  /**
   * Makes `config`'s connector available: imports `kv_connector_module_path` when the name is not
   * registered yet (and does the same for every `MultiConnector` child), then returns the factory.
   * @throws UnknownConnectorError when the name is still unknown; ConnectorModuleError when the
   *   import fails.
   */
  async prepare(config: KVTransferConfig): Promise<KVConnectorFactory> {
    if (!this.has(config.kv_connector) && config.kv_connector_module_path) await this.loadModule(config.kv_connector_module_path);
    const factory = this.get(config.kv_connector);
    if (factory instanceof MultiConnectorFactory) {
      for (const child of multiConnectorChildConfigs(config)) await this.prepare(child);
    }
    return factory;
  }

  /**
   * Imports a connector module so the connectors it registers are available.
   *
   * `path` is a file path (absolute, or relative to the working directory: `./x.js`, `../x.mjs`),
   * a `file:` URL, or a package specifier (`my-connector`, resolved from this package). After the
   * import: an exported `register(registry)` function is called with this registry; a default
   * export that is a factory is registered unless its name is taken; top-level code may have
   * registered into {@link defaultRegistry}. A module is imported and registered once per registry.
   * @throws ConnectorModuleError when the import fails or `register` throws.
   */
  loadModule(path: string): Promise<void> {
    const specifier = path.startsWith('file:') || !(isAbsolute(path) || path.startsWith('./') || path.startsWith('../')) ? path : pathToFileURL(resolvePath(path)).href;
    let p = this.loaded.get(specifier);
    if (!p) {
      p = this.importAndRegister(path, specifier);
      this.loaded.set(specifier, p);
      p.catch(() => this.loaded.delete(specifier));
    }
    return p;
  }

  private async importAndRegister(path: string, specifier: string): Promise<void> {
    let mod: Record<string, unknown>;
    try {
      mod = (await import(specifier)) as Record<string, unknown>;
    } catch (e) {
      throw new ConnectorModuleError(path, `import failed: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
    }
    try {
      if (typeof mod.register === 'function') await (mod.register as (r: KVConnectorRegistry) => unknown)(this);
      if (isFactory(mod.default) && !this.has(mod.default.name)) this.register(mod.default);
    } catch (e) {
      throw new ConnectorModuleError(path, `registering failed: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
    }
  }
}

/** The process-wide registry; connector packages register into it when imported. Holds `MultiConnector`. */
export const defaultRegistry = new KVConnectorRegistry();

import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { pathToFileURL } from 'node:url';
import { describe, expect, it } from 'vitest';
import type { KVConnectorFactory, KVConnectorScheduler, KVConnectorWorker } from '../src/connector.js';
import { KVTransferConfigError, parseKVTransferConfig } from '../src/config.js';
import { ConnectorModuleError, defaultRegistry, DuplicateConnectorError, KVConnectorRegistry, UnknownConnectorError } from '../src/registry.js';
import { MultiConnectorScheduler } from '../src/multi-connector.js';

const schedCtx = { engineId: 'e', tpSize: 1, ppSize: 1, groupConfigs: [] };
const workerCtx = { engineId: 'e', tpRank: 0, tpSize: 1, ppRank: 0, ppSize: 1 };

function factory(name: string): KVConnectorFactory & { made: string[] } {
  const made: string[] = [];
  return {
    name,
    made,
    createScheduler: (c) => {
      made.push(`scheduler:${c.kv_connector}`);
      return { name } as unknown as KVConnectorScheduler;
    },
    createWorker: (c) => {
      made.push(`worker:${c.kv_connector}`);
      return { name } as unknown as KVConnectorWorker;
    },
  };
}

const cfg = (kv_connector: string, extra: Record<string, unknown> = {}) => parseKVTransferConfig({ kv_connector, kv_role: 'kv_both', ...extra });

describe('KVConnectorRegistry', () => {
  it('registers, lists and creates both halves', () => {
    const r = new KVConnectorRegistry();
    const f = factory('A');
    r.register(f);
    expect(r.has('A')).toBe(true);
    expect(r.names()).toEqual(['A', 'MultiConnector']);
    const halves = r.create(cfg('A'), { scheduler: schedCtx, worker: workerCtx });
    expect(halves.factory).toBe(f);
    expect(f.made).toEqual(['scheduler:A', 'worker:A']);
    r.createWorker(cfg('A'), workerCtx);
    expect(f.made).toHaveLength(3);
  });

  it('refuses duplicate names and non-factories', () => {
    const r = new KVConnectorRegistry({ builtins: false });
    r.register(factory('A'));
    expect(() => r.register(factory('A'))).toThrow(DuplicateConnectorError);
    expect(() => r.register({ name: '' } as unknown as KVConnectorFactory)).toThrow(TypeError);
    expect(r.names()).toEqual(['A']);
  });

  it('an unknown name lists the registered ones', () => {
    const r = new KVConnectorRegistry();
    r.register(factory('Zed'));
    expect(() => r.get('Nope')).toThrow(UnknownConnectorError);
    expect(() => r.create(cfg('Nope'), { scheduler: schedCtx, worker: workerCtx })).toThrow(/unknown KV connector "Nope"; registered: MultiConnector, Zed$/);
  });

  it("a kvconnect connector whose package was not imported names the package to import", () => {
    const r = new KVConnectorRegistry();
    expect(() => r.get('NixlConnector')).toThrow('unknown KV connector "NixlConnector"; registered: MultiConnector; it is in @kvconnect/nixl-pull: import it first (kvconnect-engine --import @kvconnect/nixl-pull, or kv_connector_module_path)');
    expect(() => r.get('MooncakeConnector')).toThrow(/it is in @kvconnect\/mooncake/);
    expect(() => r.get('NixlPushConnector')).toThrow(/it is in @kvconnect\/nixl-push/);
  });

  it('the default registry holds MultiConnector', () => {
    expect(defaultRegistry.has('MultiConnector')).toBe(true);
  });

  it('loads a connector module that exports register(registry), from a path in a temp dir', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvconnect-reg-'));
    const file = join(dir, 'third-party.mjs');
    writeFileSync(
      file,
      `let calls = 0;
export function register(registry) {
  calls++;
  registry.register({ name: 'ThirdParty', createScheduler: () => ({ kind: 'sched', calls }), createWorker: () => ({ kind: 'worker' }) });
}`,
    );
    const r = new KVConnectorRegistry();
    const config = cfg('ThirdParty', { kv_connector_module_path: file });
    expect(() => r.create(config, { scheduler: schedCtx, worker: workerCtx })).toThrow(UnknownConnectorError);
    await r.prepare(config);
    const halves = r.create(config, { scheduler: schedCtx, worker: workerCtx });
    expect(halves.scheduler).toEqual({ kind: 'sched', calls: 1 });
    // Once per registry: loading again (relative path, same file) does not register twice.
    await r.loadModule(relative(process.cwd(), file).startsWith('.') ? relative(process.cwd(), file) : `./${relative(process.cwd(), file)}`);
    await r.loadModule(pathToFileURL(file).href);
    // Another registry gets its own register() call.
    const r2 = new KVConnectorRegistry();
    await r2.loadModule(file);
    expect(r2.has('ThirdParty')).toBe(true);
  });

  it('loads a module whose top-level code registers into the default registry, and one with a default-export factory', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvconnect-reg-'));
    const registryUrl = new URL('../src/registry.ts', import.meta.url).href;
    const top = join(dir, 'top-level.mjs');
    writeFileSync(top, `import { defaultRegistry } from ${JSON.stringify(registryUrl)};
defaultRegistry.register({ name: 'TopLevelConnector', createScheduler: () => ({}), createWorker: () => ({}) });`);
    await defaultRegistry.prepare(cfg('TopLevelConnector', { kv_connector_module_path: top }));
    expect(defaultRegistry.has('TopLevelConnector')).toBe(true);

    const def = join(dir, 'default.mjs');
    writeFileSync(def, `export default { name: 'DefaultExport', createScheduler: () => ({}), createWorker: () => ({}) };`);
    const r = new KVConnectorRegistry();
    await r.loadModule(def);
    expect(r.has('DefaultExport')).toBe(true);
  });

  it('a module that fails to import or register gives a ConnectorModuleError', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvconnect-reg-'));
    const r = new KVConnectorRegistry();
    await expect(r.loadModule(join(dir, 'missing.mjs'))).rejects.toThrow(ConnectorModuleError);
    const bad = join(dir, 'bad.mjs');
    writeFileSync(bad, `export function register(registry) { registry.register({ name: 'MultiConnector', createScheduler() {}, createWorker() {} }); }`);
    await expect(r.loadModule(bad)).rejects.toThrow(/registering failed: .*already registered/);
    const throws = join(dir, 'throws.mjs');
    writeFileSync(throws, `throw new Error('boom at import');`);
    await expect(r.loadModule(throws)).rejects.toThrow(/import failed: boom at import/);
  });

  it('prepare() loads MultiConnector children from their module paths', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvconnect-reg-'));
    const child = join(dir, 'child.mjs');
    writeFileSync(child, `export function register(r) { r.register({ name: 'Child', createScheduler: () => ({ kvChecksumCarrier: () => 'connector' }), createWorker: () => ({}) }); }`);
    const r = new KVConnectorRegistry();
    const config = cfg('MultiConnector', { kv_connector_extra_config: { connectors: [{ kv_connector: 'Child', kv_connector_module_path: child }] } });
    await r.prepare(config);
    const s = r.createScheduler(config, schedCtx);
    expect(s).toBeInstanceOf(MultiConnectorScheduler);
    expect(() => r.createScheduler(cfg('MultiConnector', { kv_connector_extra_config: { connectors: [] } }), schedCtx)).toThrow(KVTransferConfigError);
  });
});

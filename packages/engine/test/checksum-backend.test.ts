/**
 * The engine's checksum backend choice against its KV memory (src/checksum-device.ts): the `cuda`
 * backend on an engine whose KV is in host memory is refused with an error that says the backend
 * needs the KV on the GPU (`--device cuda`), in process and as an engine process (exit code 2, not
 * the old "not a host backend" crash); `cuda-emulated` is accepted by the CLI and gives the
 * checksum worker device regions over the worker's own KV bytes; connectors that move host memory
 * refuse device regions with a typed error.
 */
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { beforeAll, describe, expect, it } from 'vitest';
import { EmulatedDevice, isDeviceRegion, type DeviceMemoryRegion } from '@kvconnect/checksum';
import { DeviceMemoryUnsupportedError, hostRegions } from '@kvconnect/core';
import { Engine } from '../src/engine.js';
import { ChecksumBackendMemoryError, checksumWorkerSetup } from '../src/checksum-device.js';
import { parseEngineArgs } from '../src/server/main.js';
import { LaunchError, launchEngineProcess } from '../src/server/launcher.js';
import { IN_PROCESS_CONNECTOR, InProcessBus, createInProcessConnectorFactory, inProcessRegistry } from '../src/testing/index.js';

const ENGINE_DIR = fileURLToPath(new URL('..', import.meta.url));
const TRANSFER = { kv_connector: IN_PROCESS_CONNECTOR, kv_role: 'kv_producer', enable_kv_checksum: true } as const;

describe('checksum backend vs KV memory', () => {
  it('cuda on host KV: refused, naming the device KV it needs', () => {
    const { registry } = inProcessRegistry();
    let err: unknown;
    try {
      new Engine({ preset: 'dense-gqa', numBlocks: 16, kvTransferConfig: TRANSFER, checksumBackend: 'cuda', registry });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ChecksumBackendMemoryError);
    expect((err as Error).message).toMatch(/cuda sums KV in GPU memory, but this engine keeps its KV cache in host memory.*--device cuda/);
    // Without checksums the backend is not used: no error.
    expect(() => new Engine({ preset: 'dense-gqa', numBlocks: 16, kvTransferConfig: { ...TRANSFER, enable_kv_checksum: false }, checksumBackend: 'cuda', registry })).not.toThrow();
  });

  it('cuda-emulated: the CLI takes it; the checksum worker gets device regions over the same bytes', async () => {
    const parsed = parseEngineArgs(['--preset', 'dense-gqa', '--checksum-backend', 'cuda-emulated']);
    expect(parsed.help ? null : parsed.config.checksumBackend).toBe('cuda-emulated');
    expect(() => parseEngineArgs(['--preset', 'dense-gqa', '--checksum-backend', 'gpu'])).toThrow(/cuda-emulated/);
    const { registry } = inProcessRegistry();
    const e = new Engine({ preset: 'dense-gqa', numBlocks: 16, kvTransferConfig: TRANSFER, checksumBackend: 'cuda-emulated', registry });
    await e.ready;
    const caches = e.workers[0][0].kvCaches();
    const dev = new EmulatedDevice();
    const setup = checksumWorkerSetup(dev, caches);
    expect(setup.backend).toBe(dev);
    expect(setup.caches.regions.every((r) => isDeviceRegion(r))).toBe(true);
    const r0 = setup.caches.regions[0] as DeviceMemoryRegion;
    const host = caches.regions[0] as Uint8Array;
    host[3] = 0xa5;
    expect(dev.memory(r0.address, r0.bytes)[3]).toBe(0xa5);
    await e.shutdown();
  });

  it('connectors that move host memory refuse device regions (typed error)', () => {
    const dev = new EmulatedDevice();
    const caches = { rank: { tpRank: 0, tpSize: 1 }, ppRank: 0, ppSize: 1, regions: [dev.expose(new Uint8Array(64))], groups: [], groupConfigs: [] };
    expect(() => hostRegions(caches, 'SomeConnector')).toThrow(DeviceMemoryUnsupportedError);
    const w = createInProcessConnectorFactory({ bus: new InProcessBus() }).createWorker({ ...TRANSFER, kv_checksum_fail_closed: false, kv_load_failure_policy: 'recompute', kv_connector_extra_config: {} }, { engineId: 'dev-guard', tpRank: 0, tpSize: 1, ppRank: 0, ppSize: 1 });
    expect(() => w.registerKvCaches(caches)).toThrow(/InProcessConnector moves host memory only, but KV region 0 of this worker is device memory/);
  });
});

describe('kvconnect-engine --checksum-backend cuda (process)', () => {
  beforeAll(() => {
    const tsc = join(dirname(createRequire(import.meta.url).resolve('typescript/package.json')), 'bin/tsc');
    const r = spawnSync(process.execPath, [tsc, '--build', join(ENGINE_DIR, 'tsconfig.json')], { encoding: 'utf8', timeout: 120_000 });
    if (r.status !== 0 && !existsSync(join(ENGINE_DIR, 'dist/server/main.js'))) throw new Error(`tsc --build packages/engine failed:\n${`${r.stdout}${r.stderr}`.slice(-4000)}`);
  }, 120_000);

  it('exits 2 saying the cuda backend needs device KV', async () => {
    const config = {
      preset: 'dense-gqa' as const,
      numBlocks: 16,
      checksumBackend: 'cuda' as const,
      imports: ['@kvconnect/nixl-pull'],
      kvTransferConfig: { kv_connector: 'NixlConnector', kv_role: 'kv_producer', enable_kv_checksum: true },
    };
    const err = await launchEngineProcess({ config }).catch((x: unknown) => x);
    expect(err).toBeInstanceOf(LaunchError);
    expect((err as LaunchError).message).toMatch(/code 2/);
    expect((err as LaunchError).stderr).toMatch(/checksum backend cuda sums KV in GPU memory.*--device cuda/);
    expect((err as LaunchError).stderr).not.toMatch(/not a host backend/);
  }, 60_000);
});

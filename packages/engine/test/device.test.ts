/**
 * The engine's device flag: `--device` parsing and its way into EngineOptions, the typed error of
 * `cuda` without a CUDA build (or GPU), and a `cuda-emulated` engine whose workers' KV is device
 * memory that equals its host mirror after a step (the P/D paths: tests/nixl/device.test.ts).
 */
import { describe, expect, it } from 'vitest';
import { isDeviceRegion, type DeviceMemoryRegion } from '@kvconnect/checksum';
import { cudaDeviceMemory, DeviceMemoryError, emulatedDeviceMemory, NO_CUDA_MESSAGE } from '@kvconnect/transfer';
import { Engine } from '../src/engine.js';
import { engineOptionsOf, parseEngineArgs } from '../src/server/main.js';

let gpu = false;
try {
  const dm = cudaDeviceMemory();
  dm.free(dm.alloc(0, 1));
  gpu = true;
} catch (e) {
  console.log(`engine --device cuda: no GPU here (${e instanceof Error ? e.message : String(e)})`);
}

describe('engine device mode', () => {
  it('parses --device and passes it to the engine options; refuses other values', () => {
    const r = parseEngineArgs(['--preset', 'dense-gqa', '--device', 'cuda-emulated']);
    expect(r.help).toBe(false);
    const config = (r as Extract<typeof r, { help: false }>).config;
    expect(config.device).toBe('cuda-emulated');
    expect(engineOptionsOf(config).device).toBe('cuda-emulated');
    expect(() => parseEngineArgs(['--preset', 'dense-gqa', '--device', 'gpu'])).toThrow(/device/);
  });

  it.skipIf(gpu)('--device cuda without CUDA: a typed error naming the CUDA build', () => {
    let err: unknown;
    try {
      new Engine({ preset: 'dense-gqa', numBlocks: 8, device: 'cuda' });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(DeviceMemoryError);
    expect((err as DeviceMemoryError).code).toBe('no-cuda');
    expect((err as Error).message.startsWith(NO_CUDA_MESSAGE)).toBe(true);
  });

  it('cuda-emulated: KV regions are device memory, equal to the host mirror after a step, freed at shutdown', async () => {
    const e = new Engine({ preset: 'hybrid-mamba2', numBlocks: 16, tpSize: 2, device: 'cuda-emulated' });
    const dm = emulatedDeviceMemory();
    const out = await e.generate('device mirror', { maxTokens: 3, ignoreEos: true });
    expect(out.tokenIds).toHaveLength(3);
    const ref = await new Engine({ preset: 'hybrid-mamba2', numBlocks: 16, tpSize: 2 }).generate('device mirror', { maxTokens: 3, ignoreEos: true });
    expect(out.tokenIds).toEqual(ref.tokenIds);
    const regions: DeviceMemoryRegion[] = [];
    for (const w of e.workers.flat()) {
      const caches = w.kvCaches();
      expect(caches.regions.every((r) => isDeviceRegion(r))).toBe(true);
      caches.regions.forEach((r, i) => {
        if (!isDeviceRegion(r)) throw new Error(`region ${i} is host memory`);
        regions.push(r);
        expect(Buffer.compare(dm.hostView(r.address, r.bytes), w.regions[i]!)).toBe(0);
      });
    }
    await e.shutdown();
    for (const r of regions) expect(dm.owns(r.address)).toBe(false);
  });
});

/**
 * Device KV (engine `device: 'cuda-emulated'`) with the device checksum path
 * (`checksumBackend: 'cuda-emulated'` / an `EmulatedDevice`, results steps after the submit) over
 * NIXL pull and push with the embedded agent: the checksum workers sum the same device regions the
 * connectors register (the emulated device reads the emulated device memory at those addresses),
 * every load verifies and the outputs equal a single host instance; a consumer device that never
 * completes makes the load unverified after the deadline and fail-closed recomputes. The `cuda`
 * checksum backend on emulated device memory is refused at construction. On a GPU (skipped with
 * its reason elsewhere): `device: 'cuda'` on both sides, the checksum backend `auto` (= `cuda`).
 */
import { describe, expect, it } from 'vitest';
import { cudaSyncCallCount, cudaUnavailableReason, EmulatedDevice, isDeviceRegion, type DeviceMemoryRegion } from '@kvconnect/checksum';
import { ChecksumBackendMemoryError, checksumWorkerSetup, Engine } from '@kvconnect/engine';
import type { LoadEvent } from '@kvconnect/core';
import { checksumCounter, makeNixlPD, single } from './utils.js';

const PROMPT = 'Device KV checksums: summed on the device, verified before decoding.';
const S = { maxTokens: 6, ignoreEos: true };

describe('device KV with device checksums (emulated), over NIXL', () => {
  for (const mode of ['pull', 'push'] as const) {
    it(`${mode}: producer TP2 -> consumer TP1, both device: verified, equal to a single instance`, async () => {
      const ref = await single('dense-gqa').generate(PROMPT, S);
      const pdev = new EmulatedDevice({ completeAfterPolls: 3 });
      const cdev = new EmulatedDevice({ completeAfterPolls: 3 });
      const pd = await makeNixlPD({
        mode,
        model: 'dense-gqa',
        producer: { tpSize: 2, device: 'cuda-emulated', checksumBackend: pdev },
        consumer: { device: 'cuda-emulated', checksumBackend: cdev },
        policy: 'fail',
      });
      try {
        const r = await pd.proxy.generate(PROMPT, S);
        expect(r.error).toBeUndefined();
        expect(r.tokenIds).toEqual(ref.tokenIds);
        expect(await checksumCounter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
        expect(pdev.submits).toBeGreaterThanOrEqual(2);
        expect(cdev.submits).toBeGreaterThanOrEqual(1);
        expect(pdev.syncCalls + cdev.syncCalls).toBe(0);
      } finally {
        await pd.shutdown();
      }
    });
  }

  it('the checksum worker gets the very device regions the connector registers', async () => {
    const e = new Engine({ preset: 'dense-gqa', numBlocks: 16, device: 'cuda-emulated' });
    await e.ready;
    try {
      const w = e.workers[0][0];
      const dev = new EmulatedDevice();
      const setup = checksumWorkerSetup(dev, w.kvCaches(), w.checksumKvCaches());
      expect(setup.backend).toBe(dev);
      const regions = setup.caches.regions as DeviceMemoryRegion[];
      expect(regions.every((r) => isDeviceRegion(r))).toBe(true);
      expect(regions.map((r) => r.address)).toEqual((w.kvCaches().regions as DeviceMemoryRegion[]).map((r) => r.address));
      // what the device memory holds, the emulated checksum device reads
      const host = w.checksumKvCaches().regions[0] as Uint8Array;
      host[5] = 0x3c;
      expect(dev.memory(regions[0].address, regions[0].bytes)[5]).toBe(0x3c);
      // auto on emulated device memory: a host backend over the host views
      expect(checksumWorkerSetup('auto', w.kvCaches(), w.checksumKvCaches()).caches.regions.every((r) => r instanceof Uint8Array)).toBe(true);
      expect(() => checksumWorkerSetup('cuda', w.kvCaches(), w.checksumKvCaches())).toThrow(ChecksumBackendMemoryError);
      expect(() => checksumWorkerSetup('cuda', w.kvCaches(), w.checksumKvCaches())).toThrow(/emulated \(--device cuda-emulated\)/);
    } finally {
      await e.shutdown();
    }
  });

  it('a consumer device that never completes: unverified (workers-missing) after the deadline, recomputed', async () => {
    const ref = await single('dense-gqa').generate(PROMPT, S);
    const stalled = new EmulatedDevice();
    stalled.stall(true);
    const pd = await makeNixlPD({
      mode: 'pull',
      model: 'dense-gqa',
      producer: { device: 'cuda-emulated', checksumBackend: 'cuda-emulated' },
      consumer: { device: 'cuda-emulated', checksumBackend: stalled, checksumInFlightTimeoutMs: 50 },
      policy: 'recompute',
    });
    try {
      const events: LoadEvent[] = [];
      pd.obs.events.on('load-unverified', (ev) => events.push(ev));
      const r = await pd.proxy.generate(PROMPT, S);
      expect(r.tokenIds).toEqual(ref.tokenIds);
      expect(events.map((ev) => [ev.verdict.unverified, ev.action])).toEqual([[[{ groupId: null, reason: 'workers-missing' }], 'recompute']]);
    } finally {
      await pd.shutdown();
    }
  });
});

const gpuReason = cudaUnavailableReason();
if (gpuReason) console.log(`GPU P/D device checksum test skipped: ${gpuReason}`);

describe.skipIf(gpuReason !== null)('device KV in GPU memory with the cuda checksum backend (GPU only)', () => {
  it('pull, producer TP2 -> consumer TP1, --device cuda both sides: verified, equal to a single instance, no synchronizing checksum call per step', async () => {
    const ref = await single('dense-gqa').generate(PROMPT, S);
    const pd = await makeNixlPD({ mode: 'pull', model: 'dense-gqa', producer: { tpSize: 2, device: 'cuda' }, consumer: { device: 'cuda' }, policy: 'fail' });
    try {
      await pd.proxy.generate(PROMPT, S); // warm-up request (contexts, staging)
      const before = cudaSyncCallCount()!;
      const r = await pd.proxy.generate(PROMPT, S);
      expect(r.error).toBeUndefined();
      expect(r.tokenIds).toEqual(ref.tokenIds);
      expect(await checksumCounter(pd.obs, 'loads', { verdict: 'verified' })).toBe(2);
      expect(cudaSyncCallCount()! - before).toBe(0);
    } finally {
      await pd.shutdown();
    }
  });
});

/**
 * Which KV memory a worker's KV checksum worker reads, per checksum backend and KV memory
 * (`EngineOptions.device`, worker.ts device mode):
 *
 * | KV memory | host backends (`ts`, `native`) | `auto` | `cuda` | `cuda-emulated` |
 * | --- | --- | --- | --- | --- |
 * | host (`cpu`) | the host KV | a host backend | refused (needs `--device cuda`) | host KV placed on an emulated device |
 * | emulated device (`cuda-emulated`) | host views of it | a host backend | refused (not real GPU memory) | the device regions, read through the emulated device |
 * | GPU (`cuda`) | refused (use `cuda`) | `cuda` | the device regions | refused (not host readable) |
 *
 * `cuda-emulated` is the device path's host side without a GPU (`EmulatedDevice` of
 * @kvconnect/checksum: one submit per step, results in a later step), for tests and CI.
 * @module
 */
import { EmulatedDevice, isDeviceRegion, type BackendName, type ChecksumBackend, type DeviceChecksumProvider, type DeviceMemoryRegion } from '@kvconnect/checksum';
import type { WorkerKVCaches } from './contracts.js';

/** A checksum backend as the engine takes it (`EngineOptions.checksumBackend`). */
export type EngineChecksumBackend = BackendName | 'auto' | ChecksumBackend | DeviceChecksumProvider;

/** Raised when the checksum backend cannot read the engine's KV memory (e.g. `cuda` on host KV). */
export class ChecksumBackendMemoryError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ChecksumBackendMemoryError';
  }
}

const nameOf = (b: EngineChecksumBackend) => (typeof b === 'object' ? b.name : b);
const allDevice = (c: WorkerKVCaches) => c.regions.length > 0 && c.regions.every((r) => isDeviceRegion(r));
const allHost = (c: WorkerKVCaches) => c.regions.every((r) => !isDeviceRegion(r));

type Plan =
  | { use: 'host'; backend: EngineChecksumBackend }
  | { use: 'device'; backend: EngineChecksumBackend }
  | { use: 'emulate-host' | 'emulate-device'; device: EmulatedDevice };

/** The decision of the module table. @throws ChecksumBackendMemoryError for a refused cell. */
function plan(backend: EngineChecksumBackend, caches: WorkerKVCaches, hostViews: WorkerKVCaches): Plan {
  const name = nameOf(backend);
  const device = allDevice(caches);
  const readable = allHost(hostViews);
  if (name === 'cuda-emulated') {
    if (device && !readable) throw new ChecksumBackendMemoryError('checksum backend cuda-emulated reads emulated device memory, but this engine keeps its KV cache in GPU memory: use --checksum-backend cuda');
    const dev = backend instanceof EmulatedDevice ? backend : new EmulatedDevice({ device: device ? (caches.regions[0] as DeviceMemoryRegion).device : 0 });
    return { use: device ? 'emulate-device' : 'emulate-host', device: dev };
  }
  if (name === 'cuda') {
    if (!device) throw new ChecksumBackendMemoryError('checksum backend cuda sums KV in GPU memory, but this engine keeps its KV cache in host memory: start the engine with its KV on the GPU (--device cuda)');
    if (readable) throw new ChecksumBackendMemoryError('checksum backend cuda sums KV in GPU memory, but this engine\'s device memory is emulated (--device cuda-emulated): use --checksum-backend cuda-emulated or a host backend');
    return { use: 'device', backend };
  }
  if (readable) return { use: 'host', backend };
  if (name === 'auto') return { use: 'device', backend: 'cuda' };
  throw new ChecksumBackendMemoryError(`checksum backend ${name} sums host memory, but this engine keeps its KV cache in GPU memory: use --checksum-backend cuda (or auto)`);
}

/**
 * Checks that `backend` can sum a worker's KV: `caches` as the connector sees it, `hostViews` the
 * same KV where the host can read it (worker.ts `checksumKvCaches()`; default `caches`).
 * @throws ChecksumBackendMemoryError for the refused cells of the module table.
 */
export function checkChecksumBackend(backend: EngineChecksumBackend, caches: WorkerKVCaches, hostViews: WorkerKVCaches = caches): void {
  plan(backend, caches, hostViews);
}

/**
 * The backend and caches a worker's `KVChecksumWorker` gets (the module table). `cuda-emulated`
 * by name makes one {@link EmulatedDevice} per call (per worker); a given `EmulatedDevice` is used
 * as is. The bytes stay shared: what the engine (or a connector) writes, the device sums.
 * @throws ChecksumBackendMemoryError as {@link checkChecksumBackend}.
 */
export function checksumWorkerSetup(
  backend: EngineChecksumBackend,
  caches: WorkerKVCaches,
  hostViews: WorkerKVCaches = caches,
): { backend: Exclude<EngineChecksumBackend, 'cuda-emulated'>; caches: WorkerKVCaches } {
  const p = plan(backend, caches, hostViews);
  switch (p.use) {
    case 'host':
      return { backend: p.backend as Exclude<EngineChecksumBackend, 'cuda-emulated'>, caches: hostViews };
    case 'device':
      return { backend: p.backend as Exclude<EngineChecksumBackend, 'cuda-emulated'>, caches };
    case 'emulate-host':
      return { backend: p.device, caches: { ...caches, regions: caches.regions.map((r) => p.device.expose(r as Uint8Array)) } };
    case 'emulate-device':
      return { backend: p.device, caches: { ...caches, regions: caches.regions.map((r, i) => p.device.adopt(r as DeviceMemoryRegion, hostViews.regions[i] as Uint8Array)) } };
  }
}

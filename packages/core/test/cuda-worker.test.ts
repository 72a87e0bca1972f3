/**
 * KVChecksumWorker on real device KV with the `cuda` backend (GPU only): KV in device memory
 * (`cuda.devAlloc`), one submit per side per step, records collected without blocking in a later
 * (or the same) step's `takeReport`, equal to a host worker's (`ts` backend) over the same bytes,
 * and zero synchronizing CUDA calls per step after the warm-up step (the addon's counter,
 * `cuda.syncCallCount()`). Without a CUDA-built addon or without a GPU (always on CI) the tests are
 * skipped and the reason is printed.
 *
 * On the GPU machine: `KVCONNECT_WITH_CUDA=1 npm ci` (or `npm run build:cuda -w @kvconnect/native`),
 * then `npx vitest run packages/core/test/cuda-worker.test.ts` (bench/cuda/README.md).
 */
import { describe, expect, it } from 'vitest';
import { cudaBindings, cudaSyncCallCount, cudaUnavailableReason, pagedAttentionBytes, pagedAttentionCache, type DeviceMemoryRegion, type GroupSpec } from '@kvconnect/checksum';
import { KVChecksumWorker } from '../src/checksum-worker.js';
import type { ChecksumStepMeta, ReportEntry } from '../src/checksum-report.js';
import type { WorkerKVCaches } from '../src/connector.js';

const reason = cudaUnavailableReason() ?? (cudaSyncCallCount() === null ? 'the CUDA addon has no syncCallCount (rebuild it)' : null);
if (reason) console.log(`cuda KVChecksumWorker tests skipped: ${reason}`);

const SEED = 7;
const geometry = { dtype: 'bfloat16', numBlocks: 256, blockSize: 16, numHeads: 4, headSize: 128, kvLayout: 'kv-first' } as const;
const LAYERS = 4;
const STEPS = 40;

/** Host KV of LAYERS layers (fixed seed) and their group (one full-attention group). */
function hostCaches(): WorkerKVCaches {
  let s = SEED;
  const regions = Array.from({ length: LAYERS }, () => {
    const b = new Uint8Array(pagedAttentionBytes(geometry));
    for (let i = 0; i < b.length; i++) {
      s = (s * 1103515245 + 12345) >>> 0;
      b[i] = s >>> 24;
    }
    return b;
  });
  const names = regions.map((_, l) => `model.layers.${l}.self_attn.attn`);
  const groups: GroupSpec[] = [{ groupId: 0, caches: names.map((name, l) => pagedAttentionCache({ name, ...geometry, layout: 'NHD', at: { region: l } })) }];
  return { rank: { tpRank: 0, tpSize: 1 }, ppRank: 0, ppSize: 1, regions, groups, groupConfigs: [{ groupId: 0, kind: 'full-attention', blockSize: 16, layerNames: names }] };
}

/** Step `i`: one send (producer) and one load (consumer) of a few blocks each. */
function stepMeta(i: number): ChecksumStepMeta {
  const ids = (k: number) => Array.from({ length: 4 }, (_, j) => (i * 13 + k * 5 + j * 31) % geometry.numBlocks);
  return {
    send: [{ requestId: `s${i}`, numTokens: 60, groups: [{ groupId: 0, start: 0, blockIds: ids(0) }] }],
    recv: [{ requestId: `r${i}`, numTokens: 64, groups: [{ groupId: 0, start: 0, blockIds: ids(1) }] }],
    drop: [],
  };
}

const results = (id: string) => ({ finishedSending: new Set<string>(), finishedRecving: new Set([id]), invalidBlockIds: new Set<number>(), kvChecksums: new Map<string, Uint8Array>() });

describe.skipIf(reason !== null)('KVChecksumWorker with the cuda backend (device KV)', () => {
  it('one submit per side per step, records later, equal to the host worker, no synchronizing call per step', async () => {
    const cuda = cudaBindings()!;
    const host = hostCaches();
    const device: DeviceMemoryRegion[] = (host.regions as Uint8Array[]).map((b) => {
      const address = cuda.devAlloc(0, b.byteLength);
      cuda.copyToDevice(0, address, b);
      return { kind: 'device', device: 0, address, bytes: b.byteLength };
    });
    try {
      const ref = new KVChecksumWorker({ backend: 'ts' });
      ref.registerKvCaches(host);
      const gpu = new KVChecksumWorker({ backend: 'cuda' });
      gpu.registerKvCaches({ ...host, regions: device, stream: 0n });
      const want = new Map<string, ReportEntry>();
      const got = new Map<string, ReportEntry>();
      const perStep: number[] = [];
      let announced = 0;
      for (let i = 0; i < STEPS + 50 && (i < STEPS || gpu.stepsInFlight > 0); i++) {
        const meta = i < STEPS ? stepMeta(i) : null;
        ref.bindStepMeta(meta);
        ref.afterForward();
        if (meta) ref.afterTransferResults(results(`r${i}`));
        const refReport = ref.takeReport();
        for (const e of [...(refReport?.sends ?? []), ...(refReport?.recvs ?? [])]) want.set(e.requestId, e);
        const before = cudaSyncCallCount()!;
        gpu.bindStepMeta(meta);
        gpu.afterForward();
        if (meta) gpu.afterTransferResults(results(`r${i}`));
        const r = gpu.takeReport();
        perStep.push(cudaSyncCallCount()! - before);
        announced += (r?.inFlight?.sends.length ?? 0) + (r?.inFlight?.recvs.length ?? 0);
        for (const e of [...(r?.sends ?? []), ...(r?.recvs ?? [])]) got.set(e.requestId, e);
        await new Promise<void>((res) => setImmediate(res)); // an engine step takes a while
      }
      console.log(`cuda worker: ${STEPS} steps, ${announced} sums announced in flight, synchronizing calls per step: ${perStep.join(',')}`);
      expect(gpu.stepsInFlight).toBe(0);
      expect(want.size).toBe(2 * STEPS);
      expect(got.size).toBe(2 * STEPS);
      for (const [id, e] of want) expect(got.get(id), id).toEqual(e);
      expect(perStep.slice(1).every((d) => d === 0)).toBe(true); // step 0 may warm up
      gpu.close();
    } finally {
      for (const r of device) cuda.devFree(0, r.address);
    }
  });
});

describe('the cuda backend without device KV', () => {
  it('host KV with the cuda backend is refused (no GPU needed)', () => {
    expect(() => new KVChecksumWorker({ backend: 'cuda' }).registerKvCaches(hostCaches())).toThrow(/sums device memory, but these KV regions are host memory/);
  });
});

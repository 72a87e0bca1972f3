/**
 * MooncakeConnector with KV in device memory (issue 10, part 4): the reference engine's device
 * mode (`device: 'cuda-emulated'`, the CI stand-in for `--device cuda`) on either side. The
 * Mooncake workers register their device regions as `VRAM` with their CUDA device, tell the
 * producer the consumer's memory on the side channel (`memory`, protocol 3), and the producer
 * WRITEs into it through the embedded agent: by (emulated) CUDA IPC when both sides are device
 * memory of one host, with pinned host staging over TCP when one side is host memory. Outputs
 * equal a single host instance and every load verifies its KV checksums.
 *
 * `backend: 'mooncake'` over the fake Transfer Engine library: the workers register device
 * regions with location `cuda:<device>` (the fake library logs the locations it was given). The
 * fake copies with `memcpy`, which cannot reach (emulated or real) device memory, so no transfer
 * runs there; device-to-device moves over the real Transfer Engine need a GPU and a real library.
 */
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { isDeviceRegion } from '@kvconnect/checksum';
import type { WorkerContext } from '@kvconnect/core';
import type { PresetName } from '@kvconnect/engine';
import { decodeMooncakeMetadata, emulatedDeviceMemory, type EmbeddedAgent, type KVDeviceMode, type TransferAgent } from '@kvconnect/transfer';
import { counter, makeMooncakePD, single, type SideOptions } from './utils.js';

const PROMPT = 'Device KV over Mooncake: what the producer writes is what the decode engine reads from GPU memory.';
const S = { maxTokens: 6, ignoreEos: true };

/** Hooks that keep every agent the workers made (to read the embedded agents' device statistics). */
function recording(): { hooks: { wrapAgent(a: TransferAgent, ctx: WorkerContext): TransferAgent }; agents: TransferAgent[] } {
  const agents: TransferAgent[] = [];
  return {
    agents,
    hooks: {
      wrapAgent(a) {
        agents.push(a);
        return a;
      },
    },
  };
}

const sum = (agents: TransferAgent[], k: 'ipcTransfers' | 'stagedFrames') => agents.reduce((n, a) => n + (a as EmbeddedAgent).deviceStats[k], 0);

describe('MooncakeConnector with device KV (cuda-emulated), embedded agent', () => {
  const cases: Array<[string, PresetName, SideOptions, SideOptions, KVDeviceMode, KVDeviceMode, 'ipc' | 'staged']> = [
    ['dense TP2 -> TP1, both device: IPC', 'dense-gqa', { tpSize: 2 }, {}, 'cuda-emulated', 'cuda-emulated', 'ipc'],
    ['dense TP1 -> TP1, both device: IPC', 'dense-gqa', {}, {}, 'cuda-emulated', 'cuda-emulated', 'ipc'],
    ['hybrid-mamba2, device producer -> host consumer: staged', 'hybrid-mamba2', {}, {}, 'cuda-emulated', 'cpu', 'staged'],
    ['dense TP1 -> TP2, host producer -> device consumer: staged', 'dense-gqa', {}, { tpSize: 2 }, 'cpu', 'cuda-emulated', 'staged'],
  ];
  for (const [name, model, p, d, pdev, ddev, path] of cases) {
    it(name, async () => {
      const ref = await single(model).generate(PROMPT, S);
      const rec = recording();
      const pd = await makeMooncakePD({ model, producer: { ...p, device: pdev }, consumer: { ...d, device: ddev }, failClosed: true, policy: 'fail', hooks: rec.hooks });
      try {
        for (const [engine, dev] of [[pd.producer, pdev], [pd.consumer, ddev]] as const) {
          for (const w of engine.workers.flat()) expect(w.kvCaches().regions.every((r) => isDeviceRegion(r))).toBe(dev !== 'cpu');
        }
        const before = emulatedDeviceMemory().copies;
        const r = await pd.proxy.generate(PROMPT, S);
        expect(r.error).toBeUndefined();
        expect(r.tokenIds).toEqual(ref.tokenIds);
        expect(await counter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
        expect(pd.consumer.stats.loadsUsed).toBe(1);
        expect(pd.producerWorkers().every((w) => w.stats.bytesWritten > 0)).toBe(true);
        expect(emulatedDeviceMemory().copies).toBeGreaterThan(before);
        if (path === 'ipc') {
          expect(sum(rec.agents, 'ipcTransfers')).toBeGreaterThan(0);
          expect(sum(rec.agents, 'stagedFrames')).toBe(0);
        } else {
          expect(sum(rec.agents, 'ipcTransfers')).toBe(0);
          expect(sum(rec.agents, 'stagedFrames')).toBeGreaterThan(0);
        }
      } finally {
        await pd.shutdown();
      }
    });
  }

  it('a write outside the consumer\'s device regions is refused by the agent (bounds checks hold for VRAM)', async () => {
    const pd = await makeMooncakePD({ model: 'dense-gqa', producer: { device: 'cuda-emulated' }, consumer: { device: 'cuda-emulated' }, failClosed: true, policy: 'fail' });
    try {
      const [w] = pd.producerWorkers();
      const a = w.transferAgent!;
      const [c] = pd.consumerWorkers();
      const peer = await a.loadRemoteMetadata(await c.transferAgent!.getLocalMetadata());
      const region = pd.consumer.workers[0][0].kvCaches().regions[0];
      if (!isDeviceRegion(region)) throw new Error('expected a device region');
      const end = Number(region.address) + region.bytes;
      await expect(a.prepDescList(peer, 'VRAM', [{ addr: end - 8, length: 16, deviceId: region.device }])).rejects.toThrow(/not inside a registered VRAM region/);
      await expect(a.prepDescList(peer, 'DRAM', [{ addr: Number(region.address), length: 16 }])).rejects.toThrow(/not inside a registered DRAM region/);
    } finally {
      await pd.shutdown();
    }
  });
});

const FAKE = fileURLToPath(new URL('../../native/build/test/libfake_transfer_engine.so', import.meta.url));
const native = createRequire(import.meta.url)('@kvconnect/native') as { addon: { mooncake?: unknown } | null };
const missing = !native.addon?.mooncake ? 'the native addon has no Mooncake bindings' : !existsSync(FAKE) ? `${FAKE} is not built` : null;

describe.skipIf(!!missing)(`MooncakeConnector with device KV, backend mooncake (fake library)${missing ? ` (skipped: ${missing})` : ''}`, () => {
  it('the workers register their device regions with location cuda:<device> and advertise them as VRAM', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvc-mc-dev-'));
    const log = join(dir, 'register.log');
    const saved = { lib: process.env.MOONCAKE_LIBRARY, log: process.env.FAKE_MOONCAKE_REGISTER_LOG };
    process.env.MOONCAKE_LIBRARY = FAKE;
    process.env.FAKE_MOONCAKE_REGISTER_LOG = log;
    const rec = recording();
    try {
      const pd = await makeMooncakePD({ model: 'dense-gqa', producer: { tpSize: 2, device: 'cuda-emulated' }, consumer: { device: 'cuda-emulated' }, extra: { backend: 'mooncake' }, hooks: rec.hooks });
      try {
        const regions = [pd.producer, pd.consumer].flatMap((e) => e.workers.flat().flatMap((w) => w.kvCaches().regions));
        expect(regions.length).toBeGreaterThan(0);
        const lines = readFileSync(log, 'utf8').trim().split('\n');
        for (const r of regions) {
          if (!isDeviceRegion(r)) throw new Error('expected device regions');
          expect(lines).toContain(`${r.address.toString(16)} ${r.bytes} cuda:${r.device}`);
        }
        expect(rec.agents.map((a) => a.backend)).toEqual(['mooncake', 'mooncake', 'mooncake']);
        for (const a of rec.agents) {
          const md = decodeMooncakeMetadata(await a.getLocalMetadata());
          expect(md.regions.length).toBeGreaterThan(0);
          expect(md.regions.every((x) => x.kind === 'VRAM')).toBe(true);
        }
      } finally {
        await pd.shutdown();
      }
    } finally {
      for (const [k, v] of [['MOONCAKE_LIBRARY', saved.lib], ['FAKE_MOONCAKE_REGISTER_LOG', saved.log]] as const) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

/**
 * The reference engine's device mode (`device: 'cuda-emulated'`, the CI stand-in for `--device
 * cuda`): the KV cache is emulated device memory, the model computes from a host mirror, and the
 * NIXL connectors move and the checksums read the device memory. Outputs equal a single host
 * instance token for token and every load verifies, with the embedded agent moving device regions
 * by IPC (both sides device, one process: one host id) or over TCP with staging (a host side).
 */
import { describe, expect, it } from 'vitest';
import { isDeviceRegion } from '@kvconnect/checksum';
import { createAgent, type AgentFactory } from '@kvconnect/nixl-common';
import { emulatedDeviceMemory, type EmbeddedAgent, type KVDeviceMode } from '@kvconnect/transfer';
import { checksumCounter, makeNixlPD, single, type SideOptions } from './utils.js';

const PROMPT = 'Device KV: what the connector sends is what the decode engine reads from GPU memory.';
const S = { maxTokens: 6, ignoreEos: true };

/** An agent factory that keeps the agents it made (to read their device statistics). */
function recording(): { factory: AgentFactory; agents: EmbeddedAgent[] } {
  const agents: EmbeddedAgent[] = [];
  const factory: AgentFactory = async (o) => {
    const a = await createAgent(o);
    agents.push(a as EmbeddedAgent);
    return a;
  };
  return { factory, agents };
}

const sum = (agents: EmbeddedAgent[], k: 'ipcTransfers' | 'stagedFrames') => agents.reduce((n, a) => n + a.deviceStats[k], 0);

describe('engine device mode (cuda-emulated) over NIXL', () => {
  const cases: Array<[string, 'pull' | 'push', 'dense-gqa' | 'hybrid-mamba2', SideOptions, SideOptions, KVDeviceMode, KVDeviceMode, 'ipc' | 'staged']> = [
    ['pull dense TP2 -> TP1, both device: IPC', 'pull', 'dense-gqa', { tpSize: 2 }, {}, 'cuda-emulated', 'cuda-emulated', 'ipc'],
    ['push hybrid-mamba2 TP1 -> TP2, both device: IPC', 'push', 'hybrid-mamba2', {}, { tpSize: 2 }, 'cuda-emulated', 'cuda-emulated', 'ipc'],
    ['pull hybrid-mamba2, device producer -> host consumer: staged', 'pull', 'hybrid-mamba2', {}, {}, 'cuda-emulated', 'cpu', 'staged'],
    ['pull dense block 16 -> 32, host producer -> device consumer: staged', 'pull', 'dense-gqa', { blockSize: 16 }, { blockSize: 32 }, 'cpu', 'cuda-emulated', 'staged'],
  ];
  for (const [name, mode, model, p, d, pdev, ddev, path] of cases) {
    it(name, async () => {
      const ref = await single(model).generate(PROMPT, S);
      const prod = recording();
      const cons = recording();
      const pd = await makeNixlPD({
        mode,
        model,
        producer: { ...p, device: pdev },
        consumer: { ...d, device: ddev },
        policy: 'fail',
        producerExtra: { agent_factory: prod.factory },
        consumerExtra: { agent_factory: cons.factory },
      });
      try {
        // The connectors registered device memory where the engine is in device mode.
        for (const [engine, dev] of [[pd.producer, pdev], [pd.consumer, ddev]] as const) {
          for (const w of engine.workers.flat()) {
            expect(w.kvCaches().regions.every((r) => isDeviceRegion(r))).toBe(dev !== 'cpu');
          }
        }
        const before = emulatedDeviceMemory().copies;
        const r = await pd.proxy.generate(PROMPT, S);
        expect(r.error).toBeUndefined();
        expect(r.tokenIds).toEqual(ref.tokenIds);
        expect(await checksumCounter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
        expect(pd.consumer.stats.loadsUsed).toBe(1);
        expect(emulatedDeviceMemory().copies).toBeGreaterThan(before); // the mirror and the agents copied through the device layer
        const all = [...prod.agents, ...cons.agents];
        if (path === 'ipc') {
          expect(sum(all, 'ipcTransfers')).toBeGreaterThan(0);
          expect(sum(all, 'stagedFrames')).toBe(0);
        } else {
          expect(sum(all, 'ipcTransfers')).toBe(0);
          expect(sum(all, 'stagedFrames')).toBeGreaterThan(0);
        }
      } finally {
        await pd.shutdown();
      }
    });
  }

  it('a consumer whose device KV is not mirrored back to the host computes from stale KV (the mirror is what makes loaded device KV visible)', async () => {
    // Control for the mirror: the same P/D with the device-to-host copy of loaded blocks
    // disabled must differ from the single instance, or the test above would prove nothing.
    const ref = await single('dense-gqa').generate(PROMPT, S);
    const pd = await makeNixlPD({ mode: 'pull', model: 'dense-gqa', producer: { device: 'cuda-emulated' }, consumer: { device: 'cuda-emulated' }, policy: 'fail' });
    try {
      for (const w of pd.consumer.workers.flat()) (w as unknown as { mirrorIn: () => void }).mirrorIn = () => {};
      const r = await pd.proxy.generate(PROMPT, S);
      expect(r.tokenIds).not.toEqual(ref.tokenIds);
    } finally {
      await pd.shutdown();
    }
  });
});

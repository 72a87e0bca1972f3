/**
 * Faults on KV in device memory (`device: 'cuda-emulated'`, the engine's emulated device memory,
 * packages/transfer/src/device.ts; NIXL pull over the embedded agent, which moves the device
 * regions): every fault kind lands in the device memory the checksum worker sums (the checksum
 * backend `auto` reads host views of that same emulated memory, the connector moved it there) and
 * is caught exactly as on host KV; a control without faults verifies. The device byte layer
 * (`kv-bytes.ts`) is also checked on its own: pages read once, only written ranges copied back.
 */
import { describe, expect, it } from 'vitest';
import { DeviceKvBytes, DEVICE_PAGE_BYTES, kvBytesOf, parseScenario, runScenario, type FaultSpec, type RequestOutcome, type ScenarioResult } from '../src/index.js';
import { EmulatedDeviceMemory } from '@kvconnect/transfer';

/** What must be equal on host and device KV (everything the harness reports about a request but timings and bytes moved). */
const summary = (o: RequestOutcome) => ({ i: o.index, kind: o.kind, mismatches: o.verdict?.mismatches, unverified: o.verdict?.unverified, action: o.action, invalid: o.invalidBlocks, loadError: o.loadError?.reason, finish: o.finishReason, injected: [...o.injected], faults: [...o.faultKinds].sort(), tokens: o.tokenIds, same: o.equalsReference });
const mm = (o: RequestOutcome) => (o.verdict?.mismatches ?? []).map((m) => [m.groupId, m.positions]);

async function hostAndDevice(raw: Record<string, unknown>): Promise<{ host: ScenarioResult; device: ScenarioResult }> {
  const side = (d: string, s: Record<string, unknown> = {}) => ({ ...s, device: d });
  const run = (d: string) => runScenario(parseScenario({ ...raw, producer: side(d, raw.producer as Record<string, unknown>), consumer: side(d, raw.consumer as Record<string, unknown>) }));
  return { host: await run('cpu'), device: await run('cuda-emulated') };
}

describe('faults on device KV (cuda-emulated) are caught as on host KV', () => {
  it('nixl-pull TP2 -> TP1, GQA-S: every byte fault kind, params, payload and notif faults, a transport error and a control', async () => {
    const faults: FaultSpec[] = [
      { kind: 'bit-flip', requests: [0], layer: 1, head: 1, token: 20, piece: 1, bit: 9 },
      { kind: 'corrupt-region', fill: 'random', tokens: [33, 35], requests: [1] },
      { kind: 'misplaced-block', position: 1, requests: [2] },
      { kind: 'misplaced-tokens', tokens: [3, 5], sourceOffset: 2, requests: [3] },
      { kind: 'random-stale-range', requests: [4] },
      { kind: 'stale', requests: [5] },
      { kind: 'replay-params', from: 0, producerBlocks: 'zeroed', requests: [6] },
      { kind: 'transport-error', tokens: [16, 39], requests: [7] },
      { kind: 'payload', mode: 'truncate', requests: [9] },
      { kind: 'notif', target: 'finished-recving', mode: 'delay', steps: 3, requests: [10] },
    ];
    const { host, device } = await hostAndDevice({
      name: 'device-faults',
      model: 'GQA-S',
      connector: 'nixl-pull',
      producer: { tp: 2 },
      requests: Array.from({ length: 11 }, (_, i) => ({ promptTokens: 40, promptSeed: i })),
      faults,
      expect: {},
    });
    const q = device.runs[0].requests;
    expect(mm(q[0])).toEqual([[0, [1]]]);
    expect(q[0].injected).toEqual(new Map([[0, [1]]]));
    expect(mm(q[1])).toEqual([[0, [2]]]);
    expect(mm(q[2])).toEqual([[0, [1]]]);
    expect(mm(q[3])).toEqual([[0, [0]]]);
    for (const i of [4, 5]) {
      expect(q[i].kind, `request ${i}`).toBe('mismatch');
      expect(mm(q[i]), `request ${i}`).toEqual([...q[i].injected]);
    }
    expect(mm(q[5])).toEqual([[0, [0, 1, 2]]]);
    // Request 0's params replayed: over NIXL its producer blocks were released after request 0's
    // read, so the producer refuses the read (never a verified load of the wrong KV).
    expect(q[6].kind).toBe('transfer-failed');
    expect(q[6].faultKinds).toEqual(['replay-params']);
    expect(q[7].kind).toBe('transfer-failed');
    expect(q[7].loadError?.reason).toBe('transport-error');
    expect(q[8].kind).toBe('verified');
    expect(q[8].faultKinds).toEqual([]);
    expect(q[9].verdict!.unverified).toEqual([{ groupId: null, reason: 'malformed-payload' }]);
    // A delayed finishedRecving only delays: the load still verifies.
    expect(q[10].kind).toBe('verified');
    expect(q[10].faultKinds).toEqual(['notif']);
    expect(q.every((o) => o.equalsReference)).toBe(true);
    expect(q.map(summary)).toEqual(host.runs[0].requests.map(summary));
  }, 120_000);

  it('wrong layout (consumer HND) and Mamba B/C re-sliced (HYB-S, consumer TP2): caught as on host KV', async () => {
    const a = await hostAndDevice({ name: 'wl', model: 'GQA-S', connector: 'nixl-pull', consumer: { layout: 'HND' }, requests: [{ promptTokens: 40 }, { promptTokens: 40, promptSeed: 3 }], faults: [{ kind: 'wrong-layout', requests: [0] }], expect: {} });
    expect(mm(a.device.runs[0].requests[0])).toEqual([[0, [0, 1, 2]]]);
    expect(a.device.runs[0].requests[1].kind).toBe('verified');
    expect(a.device.runs[0].requests.map(summary)).toEqual(a.host.runs[0].requests.map(summary));
    const b = await hostAndDevice({
      name: 'm',
      model: { preset: 'HYB-S', overrides: { mamba: { nGroups: 1 } } },
      connector: 'nixl-pull',
      consumer: { tp: 2 },
      requests: [{ promptTokens: 40 }, { promptTokens: 40, promptSeed: 9 }],
      faults: [{ kind: 'mamba-bc-sharded', requests: [0] }],
      expect: {},
    });
    expect(mm(b.device.runs[0].requests[0])).toEqual([[1, [0]]]);
    expect(b.device.runs[0].requests[1].kind).toBe('verified');
    expect(b.device.runs[0].requests.map(summary)).toEqual(b.host.runs[0].requests.map(summary));
  }, 120_000);
});

describe('DeviceKvBytes: the device byte layer of the faults', () => {
  it('reads whole pages once, writes back exactly the written ranges (merged), never bytes only read', () => {
    const dm = new EmulatedDeviceMemory();
    const r = dm.alloc(0, 3 * DEVICE_PAGE_BYTES + 100);
    const init = Uint8Array.from({ length: r.bytes }, (_, i) => (i * 7) & 0xff);
    dm.copy(0, 'h2d', r.address, init, r.bytes);
    const b = new DeviceKvBytes([r], () => dm);
    expect([...b.read(0, DEVICE_PAGE_BYTES - 2, 4)]).toEqual([...init.subarray(DEVICE_PAGE_BYTES - 2, DEVICE_PAGE_BYTES + 2)]);
    expect(b.copies).toMatchObject({ d2h: 1, d2hBytes: 2 * DEVICE_PAGE_BYTES });
    b.write(0, 10, Uint8Array.of(1, 2, 3));
    b.write(0, 13, Uint8Array.of(4));
    b.write(0, 3 * DEVICE_PAGE_BYTES + 99, Uint8Array.of(9)); // the last (partial) page
    expect([...b.read(0, 9, 6)]).toEqual([init[9], 1, 2, 3, 4, init[14]]);
    // Not on the device before the flush (what the checksum would read).
    expect([...dm.hostView(r.address + 10n, 4)]).toEqual([...init.subarray(10, 14)]);
    // Someone else's bytes change on the device meanwhile (a load landing): the flush must keep them.
    dm.copy(0, 'h2d', r.address + 20n, Uint8Array.of(0xee), 1);
    b.flush();
    expect(b.copies).toMatchObject({ d2h: 2, h2d: 2, h2dBytes: 5 });
    const after = dm.hostView(r.address, r.bytes);
    expect([...after.subarray(10, 14)]).toEqual([1, 2, 3, 4]);
    expect(after[20]).toBe(0xee);
    expect(after[3 * DEVICE_PAGE_BYTES + 99]).toBe(9);
    expect(() => b.read(0, r.bytes - 1, 2)).toThrow(RangeError);
    expect(() => b.write(1, 0, Uint8Array.of(1))).toThrow(RangeError);
  });

  it('kvBytesOf: host regions in place, device regions through the device layer, mixed refused', () => {
    const dm = new EmulatedDeviceMemory();
    const geometry = { rank: { tpRank: 0, tpSize: 1 }, ppRank: 0, ppSize: 1, groups: [], groupConfigs: [] };
    const host = new Uint8Array(8);
    kvBytesOf({ ...geometry, regions: [host] }).write(0, 2, Uint8Array.of(5));
    expect(host[2]).toBe(5);
    const r = dm.alloc(0, 64);
    expect(kvBytesOf({ ...geometry, regions: [r] }, () => dm)).toBeInstanceOf(DeviceKvBytes);
    expect(() => kvBytesOf({ ...geometry, regions: [host, r] })).toThrow(TypeError);
  });
});

/**
 * The device path's host side on the emulated device (`cuda-emulated`, src/backend-emulated.ts):
 * BlockChecksummer over device regions submits one step and returns its records from a later
 * poll, equal to the TypeScript reference over the same bytes; KV written after the submit does
 * not change it (stream order); a steady-state step makes no synchronizing call; a submit past the
 * slots collects the oldest (counted) without losing it; regions and backends that do not go
 * together, and invalid rows, are refused. The seed of the random KV is fixed and printed.
 */
import { describe, expect, it } from 'vitest';
import { EmulatedDevice } from '../src/backend-emulated.js';
import { tsBackend } from '../src/backend-ts.js';
import { BlockChecksummer, type BlockRun, type CompletedStep } from '../src/compute.js';
import type { GroupSpec } from '../src/plan.js';
import type { DeviceMemoryRegion, WorkerGroupRecord } from '../src/types.js';
import { pagedAttentionBytes, pagedAttentionCache } from '../src/views.js';
import { Rng } from './layouts.js';

const SEED = 20261201;
console.log(`device (emulated) tests: seed ${SEED}`);

const geometry = { dtype: 'bfloat16', numBlocks: 32, blockSize: 16, numHeads: 2, headSize: 32, kvLayout: 'kv-first' } as const;

/** Two layers of one attention group over two host regions of random KV. */
function fixture(): { groups: GroupSpec[]; host: Uint8Array[] } {
  const rng = new Rng(SEED);
  const host = [0, 1].map(() => rng.fill(new Uint8Array(pagedAttentionBytes(geometry))));
  const caches = [0, 1].map((l) => pagedAttentionCache({ name: `model.layers.${l}.self_attn.attn`, ...geometry, layout: 'NHD', at: { region: l } }));
  return { groups: [{ groupId: 0, caches }], host };
}

const RANK = { tpRank: 0, tpSize: 1, role: 'consumer' } as const;
const RUNS: BlockRun[] = [
  { group: 0, blockIds: [5, 9, 2], start: 0, numTokens: 40 },
  { group: 0, blockIds: [17], start: 3, numTokens: 60 },
];

/** The reference records: the ts backend over the host bytes (synchronous compute). */
function reference(groups: GroupSpec[], host: Uint8Array[], runs = RUNS): WorkerGroupRecord[] {
  return new BlockChecksummer(groups, RANK, host, tsBackend).compute(runs);
}

function records(done: CompletedStep[]): WorkerGroupRecord[][] {
  return done.map((d) => {
    if ('error' in d) throw d.error;
    return d.records;
  });
}

describe('BlockChecksummer on the emulated device', () => {
  it('submit returns at once; the records arrive in a later poll and equal the reference', () => {
    const { groups, host } = fixture();
    const dev = new EmulatedDevice({ completeAfterPolls: 3 });
    const regions = host.map((h) => dev.expose(h));
    const ck = new BlockChecksummer(groups, RANK, regions, dev);
    expect(ck.isDevice).toBe(true);
    const t = ck.submit(RUNS);
    expect(ck.poll()).toEqual([]);
    expect(ck.poll()).toEqual([]);
    expect(ck.pending).toBe(1);
    const done = ck.poll();
    expect(done.map((d) => d.ticket)).toEqual([t]);
    expect(records(done)[0]).toEqual(reference(groups, host));
    expect(ck.pending).toBe(0);
    expect(dev.syncCalls).toBe(0);
  });

  it('KV written after the submit does not change its records (the GPU stream order)', () => {
    const { groups, host } = fixture();
    const before = reference(groups, host);
    const dev = new EmulatedDevice({ completeAfterPolls: 1 });
    const ck = new BlockChecksummer(groups, RANK, host.map((h) => dev.expose(h)), dev);
    ck.submit(RUNS);
    host[0].fill(0x55);
    const [rec] = records(ck.poll());
    expect(rec).toEqual(before);
    expect(reference(groups, host)).not.toEqual(before); // the write does change a later step
  });

  it('steady state: one submit per step, polled done, makes no synchronizing call', () => {
    const { groups, host } = fixture();
    const dev = new EmulatedDevice({ completeAfterPolls: 2, slots: 4 });
    const ck = new BlockChecksummer(groups, RANK, host.map((h) => dev.expose(h)), dev);
    let got = 0;
    for (let step = 0; step < 20; step++) {
      ck.submit(RUNS);
      got += ck.poll().length; // what the worker does once per step
    }
    while (ck.pending > 0) got += ck.poll().length;
    expect(got).toBe(20);
    expect(dev.submits).toBe(20);
    expect(dev.syncCalls).toBe(0);
  });

  it('past the slots the oldest step is collected first (a counted wait), never lost', () => {
    const { groups, host } = fixture();
    const dev = new EmulatedDevice({ completeAfterPolls: 100, slots: 2 });
    const ck = new BlockChecksummer(groups, RANK, host.map((h) => dev.expose(h)), dev);
    const tickets = [ck.submit(RUNS), ck.submit(RUNS), ck.submit(RUNS)];
    expect(dev.syncCalls).toBe(1);
    const first = ck.poll();
    expect(first.map((d) => d.ticket)).toEqual([tickets[0]]);
    expect(records(first)[0]).toEqual(reference(groups, host));
  });

  it('a stalled device completes nothing; a step with no rows needs no device work', () => {
    const { groups, host } = fixture();
    const dev = new EmulatedDevice({ completeAfterPolls: 0 });
    const ck = new BlockChecksummer(groups, RANK, host.map((h) => dev.expose(h)), dev);
    dev.stall(true);
    ck.submit(RUNS);
    for (let i = 0; i < 5; i++) expect(ck.poll()).toEqual([]);
    // numTokens 0: no block holds a valid token, so no rows
    const t = ck.submit([{ group: 0, blockIds: [1, 2], start: 0, numTokens: 0 }]);
    const done = ck.poll();
    expect(done.map((d) => d.ticket)).toEqual([t]);
    expect(dev.submits).toBe(1);
    dev.stall(false);
    expect(ck.poll()).toHaveLength(1);
  });

  it('invalid rows are refused at submit and nothing is in flight', () => {
    const { groups, host } = fixture();
    const dev = new EmulatedDevice();
    const ck = new BlockChecksummer(groups, RANK, host.map((h) => dev.expose(h)), dev);
    expect(() => ck.submit([{ group: 0, blockIds: [geometry.numBlocks], start: 0, numTokens: 10 }])).toThrow(RangeError);
    expect(ck.pending).toBe(0);
    expect(dev.submits).toBe(0);
  });

  it('host backends complete a submit at once (one path for both)', () => {
    const { groups, host } = fixture();
    const ck = new BlockChecksummer(groups, RANK, host, tsBackend);
    const t = ck.submit(RUNS);
    const done = ck.poll();
    expect(done.map((d) => d.ticket)).toEqual([t]);
    expect(records(done)[0]).toEqual(reference(groups, host));
  });
});

describe('regions and backends that do not go together', () => {
  const { groups, host } = fixture();
  const dev = new EmulatedDevice();
  const device = host.map((h) => dev.expose(h));

  it('host KV with a device backend: the cuda backend needs device memory', () => {
    expect(() => new BlockChecksummer(groups, RANK, host, dev)).toThrow(/sums device memory, but these KV regions are host memory/);
    expect(() => new BlockChecksummer(groups, RANK, host, 'cuda')).toThrow(TypeError);
  });

  it('device KV with a host backend, mixed regions, several devices', () => {
    expect(() => new BlockChecksummer(groups, RANK, device, 'ts')).toThrow(/need a device checksum backend/);
    expect(() => new BlockChecksummer(groups, RANK, [host[0], device[1]], dev)).toThrow(/all host memory or all device memory/);
    const other: DeviceMemoryRegion = { ...device[1], device: 1 };
    expect(() => new BlockChecksummer(groups, RANK, [device[0], other], dev)).toThrow(/on one device/);
  });

  it('compute() is host only; a region outside the emulated memory is refused', () => {
    const ck = new BlockChecksummer(groups, RANK, device, dev);
    expect(() => ck.compute(RUNS)).toThrow(/submit\(\) and poll\(\)/);
    const bogus: DeviceMemoryRegion = { kind: 'device', device: 0, address: 0x1000n, bytes: host[0].byteLength };
    expect(() => new BlockChecksummer(groups, RANK, [bogus, device[1]], dev)).toThrow(/not inside an allocation/);
  });
});

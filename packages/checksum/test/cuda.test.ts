/**
 * The `cuda` backend (src/backend-cuda.ts over native/cuda): on a GPU, its sums equal the CPU
 * backend's (the native kernel; the TypeScript reference where the addon lacks it) for ATTN
 * (NHD with K/V split and kernel blocks, HND, unaligned parts), ROWS (2- and 4-byte, strided) and
 * STREAM tables, through sumRows and through submit/collectAsync; invalid rows are refused.
 * Without a CUDA-built addon or without a GPU (always on CI) every test is skipped and the reason
 * is printed. The C++ test (native/cuda/test_cuda.cc) covers the kernel far more widely.
 */
import { describe, expect, it } from 'vitest';
import { ENTRY_ATTN, ENTRY_ROWS, ENTRY_STREAM, type PackedTables } from '../src/backend.js';
import { cudaBindings, cudaUnavailableReason, loadCudaBackend, type CudaChecksumBackend, type DeviceRegion } from '../src/backend-cuda.js';
import { loadNativeBackend } from '../src/backend-native.js';
import { tsBackend } from '../src/backend-ts.js';
import { makeEntry, packEntryGroups, type Entry } from '../src/plan.js';
import { Rng } from './layouts.js';

const reason = cudaUnavailableReason();

function entry(e: Partial<Entry> & Pick<Entry, 'kind' | 'numBlocks'>): Entry {
  return makeEntry(e.kind, e);
}

const pack = packEntryGroups;

interface Fixture {
  tables: PackedTables;
  host: Uint8Array[];
  rows: Uint32Array;
  outLen: number;
}

/**
 * Three groups over four regions: attention (NHD K/V split with 2 kernel blocks, and an HND cache
 * whose 20-byte cells split 12/8 so parts end inside a piece), a state (bf16 [6, 4, 10] rows, and a
 * transposed fp32 state), and a stream (a 64 KiB state then a 13-byte one).
 */
function fixture(rng: Rng): Fixture {
  const NB = 24, BT = 16, KBT = 8, H = 4, D = 64;
  // region 0: K then V, each [block][kblock][token][head][D*2]
  const part = D * 2, ts = H * part, kbs = KBT * ts, bs = (BT / KBT) * kbs;
  const attn = rng.fill(new Uint8Array(2 * NB * bs));
  // region 1: HND [block][head][token][cell 24 bytes] split at 12
  const C = 24, bs1 = H * BT * C;
  const hnd = rng.fill(new Uint8Array(NB * bs1 + 16));
  // region 2: states: bf16 [6 rows][4][10] then fp32 stored [3][5 rows] (axis 1)
  const s0 = 6 * 4 * 10 * 2, s1 = 3 * 5 * 4, sb = s0 + s1 + 4;
  const states = rng.fill(new Uint8Array(NB * sb));
  // region 3: stream states
  const big = 1 << 16, small = 13, sb3 = big + 16;
  const stream = rng.fill(new Uint8Array(NB * sb3));
  const g0: Entry[] = [
    entry({ kind: ENTRY_ATTN, numBlocks: NB, region: 0, offset: 0, factorBase: 5n * 65536n, blockStride: bs, outerStride: part, kblockStride: kbs, tokenStride: ts, outerCount: H, kblockTokens: KBT, blockTokens: BT, byteStart: 0, byteCount: part, cellPieces: (2 * part) / 8 }),
    entry({ kind: ENTRY_ATTN, numBlocks: NB, region: 0, offset: NB * bs, factorBase: 5n * 65536n, blockStride: bs, outerStride: part, kblockStride: kbs, tokenStride: ts, outerCount: H, kblockTokens: KBT, blockTokens: BT, byteStart: part, byteCount: part, cellPieces: (2 * part) / 8 }),
    entry({ kind: ENTRY_ATTN, numBlocks: NB, region: 1, column: 1, offset: 0, factorBase: 6n * 65536n + 8n, blockStride: bs1, outerStride: BT * C, kblockStride: 0, tokenStride: C, outerCount: H, kblockTokens: BT, blockTokens: BT, byteStart: 0, byteCount: 12, cellPieces: C / 8 }),
    entry({ kind: ENTRY_ATTN, numBlocks: NB, region: 1, column: 1, offset: 12, factorBase: 6n * 65536n + 8n, blockStride: bs1, outerStride: BT * C, kblockStride: 0, tokenStride: C, outerCount: H, kblockTokens: BT, blockTokens: BT, byteStart: 12, byteCount: 12, cellPieces: C / 8 }),
  ];
  const g1: Entry[] = [
    entry({ kind: ENTRY_ROWS, numBlocks: NB, region: 2, offset: 0, factorBase: 7n * 65536n, blockStride: sb, outerStride: 80, outerCount: 4, elemCount: [1, 4, 10], elemStride: [0, 20, 2], elemBytes: 2 }),
    entry({ kind: ENTRY_ROWS, numBlocks: NB, region: 2, column: 1, offset: 160, factorBase: 7n * 65536n + 100n, blockStride: sb, outerStride: 80, outerCount: 2, elemCount: [1, 4, 10], elemStride: [0, 20, 2], elemBytes: 2 }),
    entry({ kind: ENTRY_ROWS, numBlocks: NB, region: 2, offset: s0, factorBase: 7n * 65536n + 6n, blockStride: sb, outerStride: 4, outerCount: 5, elemCount: [1, 1, 3], elemStride: [0, 0, 20], elemBytes: 4 }),
  ];
  const g2: Entry[] = [
    entry({ kind: ENTRY_STREAM, numBlocks: NB, region: 3, offset: 0, factorBase: 9n * 65536n + 1n, blockStride: sb3, byteStart: 0, byteCount: big }),
    entry({ kind: ENTRY_STREAM, numBlocks: NB, region: 3, offset: big, factorBase: 9n * 65536n + 1n, blockStride: sb3, byteStart: big, byteCount: small }),
  ];
  const rowList: number[][] = [];
  let out = 0;
  for (let i = 0; i < 40; i++) {
    const g = rng.int(0, 2);
    const valid = rng.pick([BT, BT, BT, rng.int(0, BT)]);
    rowList.push([g, rng.int(0, NB - 1), rng.int(0, 1000) * BT, g === 0 ? valid : 0, out, 0]);
    out += 2;
  }
  return { tables: pack([g0, g1, g2]), host: [attn, hnd, states, stream], rows: new Uint32Array(rowList.flat()), outLen: out };
}

/** Device copies of host regions; free() releases them. */
function upload(host: Uint8Array[], device: number): { regions: DeviceRegion[]; free: () => void } {
  const cuda = cudaBindings()!;
  const regions = host.map((h) => {
    const address = cuda.devAlloc(device, h.byteLength);
    cuda.copyToDevice(device, address, h);
    return { address, bytes: h.byteLength };
  });
  return { regions, free: () => regions.forEach((r) => cuda.devFree(device, r.address)) };
}

/** The CPU result: the native kernel where the addon has it (on a GPU machine it does), else the TS reference. */
function cpuSums(f: Fixture): BigUint64Array {
  const want = new BigUint64Array(f.outLen);
  (loadNativeBackend() ?? tsBackend).sumRows(f.tables, f.host, f.rows, want);
  return want;
}

describe.skipIf(reason !== null)(`cuda backend${reason ? ` (skipped: ${reason})` : ''}`, () => {
  const withBackend = (fn: (b: CudaChecksumBackend) => void | Promise<void>) => async () => {
    const b = loadCudaBackend()!;
    try {
      await fn(b);
    } finally {
      b.close();
    }
  };

  it(
    'sumRows equals the CPU backend bit for bit (ATTN, ROWS, STREAM; several seeds)',
    withBackend((b) => {
      for (const seed of [1, 2, 3]) {
        const f = fixture(new Rng(seed));
        const want = cpuSums(f);
        const dev = upload(f.host, b.device);
        try {
          const got = new BigUint64Array(f.outLen);
          b.sumRows(f.tables, dev.regions, f.rows, got);
          expect(got).toEqual(want);
          expect(got.some((v) => v !== 0n)).toBe(true);
        } finally {
          dev.free();
        }
      }
    }),
  );

  it(
    'submit never waits; collectAsync adds the results; tickets are single-use',
    withBackend(async (b) => {
      const f = fixture(new Rng(9));
      const want = cpuSums(f);
      const dev = upload(f.host, b.device);
      try {
        b.setTables(f.tables, dev.regions);
        const tickets = [b.submit(f.rows, f.outLen), b.submit(f.rows, f.outLen, 0n)];
        for (const t of tickets) {
          const got = new BigUint64Array(f.outLen).fill(1n);
          await b.collectAsync(t, got);
          expect(got).toEqual(want.map((v) => BigInt.asUintN(64, v + 1n)));
          expect(() => b.collect(t, got)).toThrow(RangeError);
        }
      } finally {
        dev.free();
      }
    }),
  );

  it(
    'refuses invalid rows and tables with RangeError, enqueuing nothing',
    withBackend((b) => {
      const f = fixture(new Rng(4));
      const dev = upload(f.host, b.device);
      try {
        b.setTables(f.tables, dev.regions);
        expect(() => b.submit(new Uint32Array([0, 24, 0, 1, 0, 0]), 2)).toThrow(RangeError); // block id past num_blocks
        expect(() => b.submit(new Uint32Array([0, 0, 0, 17, 0, 0]), 2)).toThrow(RangeError); // valid tokens past the block
        expect(() => b.submit(new Uint32Array([3, 0, 0, 1, 0, 0]), 2)).toThrow(RangeError); // no such group
        expect(() => b.submit(new Uint32Array([0, 0, 0, 1, 1, 0]), 2)).toThrow(RangeError); // output past outLen
        const short = dev.regions.map((r, i) => (i === 3 ? { address: r.address, bytes: r.bytes >> 1 } : r));
        expect(() => b.setTables(f.tables, short)).toThrow(RangeError);
      } finally {
        dev.free();
      }
    }),
  );
});

/**
 * The native addon (`@kvconnect/native`) and the `native` backend: argument checking (TypeError /
 * RangeError, nothing written on error) and hand-built ATTN, ROWS and STREAM tables whose values
 * are computed here, in plain BigInt arithmetic, straight from SPEC sections 2 and 3 over the
 * logical data (not from the addon, and not through the kernel's address formulas).
 */
import { createRequire } from 'node:module';
import { describe, expect, it } from 'vitest';
import type { KvconnectNativeAddon } from '@kvconnect/native';
import { loadNativeBackend, nativeUnavailableReason, plainSum64, weightedSum64 } from '../src/backend-native.js';

const { addon, loadError } = createRequire(import.meta.url)('@kvconnect/native') as {
  addon: KvconnectNativeAddon | null;
  loadError: Error | null;
};
const missing = addon === null;
/** A test that needs the addon: skipped, with the reason in its title, when the addon did not load. */
const nativeIt = (title: string, fn: () => void | Promise<void>) =>
  it.skipIf(missing)(missing ? `${title} (skipped: the addon did not load: ${loadError?.message ?? nativeUnavailableReason()})` : title, fn);
/** The addon, for tests that run only when it loaded. */
const A = (): KvconnectNativeAddon => addon as KvconnectNativeAddon;

const M64 = (1n << 64n) - 1n;
const u64 = (x: bigint): bigint => x & M64;

// ---- kvc_entry packing (independent of plan.ts: the header's byte layout) --------------------

interface E {
  kind: number;
  offset?: number;
  factorBase?: bigint;
  blockStride?: number;
  outerStride?: number;
  kblockStride?: number;
  tokenStride?: number;
  elemStride?: [number, number, number];
  elemCount?: [number, number, number];
  region?: number;
  column?: number;
  outerCount?: number;
  kblockTokens?: number;
  byteStart?: number;
  byteCount?: number;
  cellPieces?: number;
  elemBytes?: number;
  numBlocks: number;
  blockTokens?: number;
}

function pack(list: E[], byteOffset = 0): Uint8Array {
  const buf = new Uint8Array(byteOffset + 128 * list.length).subarray(byteOffset);
  const dv = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  list.forEach((e, i) => {
    const at = 128 * i;
    const w64 = (o: number, v: number | bigint) => dv.setBigUint64(at + o, BigInt.asUintN(64, BigInt(v)), true);
    const w32 = (o: number, v: number) => dv.setUint32(at + o, v, true);
    w64(0, e.offset ?? 0);
    w64(8, e.factorBase ?? 0n);
    w64(16, e.blockStride ?? 0);
    w64(24, e.outerStride ?? 0);
    w64(32, e.kblockStride ?? 0);
    w64(40, e.tokenStride ?? 0);
    const es = e.elemStride ?? [0, 0, 0];
    const ec = e.elemCount ?? [1, 1, 1];
    for (let d = 0; d < 3; d++) {
      w64(48 + 8 * d, es[d]);
      w32(72 + 4 * d, ec[d]);
    }
    w32(84, e.kind);
    w32(88, e.region ?? 0);
    w32(92, e.column ?? 0);
    w32(96, e.outerCount ?? 1);
    w32(100, e.kblockTokens ?? 0);
    w32(104, e.byteStart ?? 0);
    w32(108, e.byteCount ?? 0);
    w32(112, e.cellPieces ?? 0);
    w32(116, e.elemBytes ?? 0);
    w32(120, e.numBlocks);
    w32(124, e.blockTokens ?? 0);
  });
  return buf;
}

function rowsOf(list: Array<[group: number, block: number, firstToken: number, valid: number, outOffset: number]>): Uint32Array {
  const r = new Uint32Array(6 * list.length);
  list.forEach((x, i) => r.set([...x, 0], 6 * i));
  return r;
}

/** Deterministic bytes. */
function bytes(n: number, seed: number): Uint8Array {
  const b = new Uint8Array(n);
  let s = seed >>> 0 || 1;
  for (let i = 0; i < n; i++) {
    s ^= s << 13;
    s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5;
    s >>>= 0;
    b[i] = s & 0xff;
  }
  return b;
}

/** LE uint64 of up to 8 bytes (missing bytes are 0). */
function le(b: ArrayLike<number>, from: number, to: number): bigint {
  let x = 0n;
  for (let i = Math.min(to, b.length) - 1; i >= from; i--) x = (x << 8n) | BigInt(b[i]);
  return x;
}

// ---- the fixtures ------------------------------------------------------------------------------

// ATTN (SPEC 2): layer 3, 2 local heads at global heads 1 and 2, blocks of 4 tokens, cells of 72
// bytes (P = 9). Logical cells cell(block, h, t) = 72 bytes. Group 0 stores them NHD with kernel
// blocks of 2 tokens (a gap between kernel blocks), K (first 37 bytes) and V (35 bytes) in separate
// regions, so both parts start or end inside a piece. Groups 3 and 4 store the same cells HND
// (whole cells, one head per entry; and kernel blocks of 2 tokens with a gap): same values.
const NB = 3;
const BT = 4;
const KBT = 2;
const H = 2;
const CELL = 72;
const P = CELL / 8;
const KB = 37; // K bytes per cell: the K/V boundary is inside piece 4
const LAYER = 3n;
const HEAD0 = 1n;
const logical = bytes(NB * H * BT * CELL, 7); // [block][head][token][cell]
const cellAt = (b: number, h: number, t: number) => logical.subarray(((b * H + h) * BT + t) * CELL, ((b * H + h) * BT + t + 1) * CELL);

function physical(partStart: number, partBytes: number, lead: number) {
  // [block][kblock][token in kblock][head][part], kernel block stride padded by 8 bytes
  const ts = H * partBytes;
  const kbs = KBT * ts + 8;
  const bstr = (BT / KBT) * kbs;
  const mem = new Uint8Array(lead + NB * bstr);
  for (let b = 0; b < NB; b++)
    for (let h = 0; h < H; h++)
      for (let t = 0; t < BT; t++) {
        const at = lead + b * bstr + Math.floor(t / KBT) * kbs + (t % KBT) * ts + h * partBytes;
        mem.set(cellAt(b, h, t).subarray(partStart, partStart + partBytes), at);
      }
  const entry: E = {
    kind: 1,
    offset: lead,
    factorBase: LAYER * 65536n + HEAD0,
    blockStride: bstr,
    outerStride: partBytes,
    kblockStride: kbs,
    tokenStride: ts,
    outerCount: H,
    kblockTokens: KBT,
    byteStart: partStart,
    byteCount: partBytes,
    cellPieces: P,
    numBlocks: NB,
    blockTokens: BT,
  };
  return { mem, entry };
}
const kPart = physical(0, KB, 3);
const vPart = physical(KB, CELL - KB, 1);

/** HND: [block][kernel block][head][token in kernel block][cell], kernel blocks `pad` bytes apart. */
function hnd(kbt: number, pad: number) {
  const kbs = H * kbt * CELL + pad;
  const bstr = (BT / kbt) * kbs;
  const mem = new Uint8Array(NB * bstr);
  for (let b = 0; b < NB; b++)
    for (let h = 0; h < H; h++)
      for (let t = 0; t < BT; t++) mem.set(cellAt(b, h, t), b * bstr + Math.floor(t / kbt) * kbs + h * kbt * CELL + (t % kbt) * CELL);
  const entry: E = {
    kind: 1,
    factorBase: LAYER * 65536n + HEAD0,
    blockStride: bstr,
    outerStride: kbt * CELL,
    kblockStride: kbs,
    tokenStride: CELL,
    outerCount: H,
    kblockTokens: kbt,
    byteCount: CELL,
    cellPieces: P,
    numBlocks: NB,
    blockTokens: BT,
  };
  return { mem, entry };
}
const hndWhole = hnd(BT, 0);
const hndSplit = hnd(2, 8);

/** SPEC 2 block value over the logical cells: sum over h, t < valid, p of x * m * (2j + 1). */
function attnValue(block: number, firstToken: number, valid: number): bigint {
  let s = 0n;
  for (let h = 0; h < H; h++) {
    const m = 2n * (LAYER * 65536n + HEAD0 + BigInt(h)) + 1n;
    for (let t = 0; t < valid; t++) {
      const c = cellAt(block, h, t);
      for (let p = 0; p < P; p++) {
        const j = BigInt((firstToken + t) * P + p);
        s += le(c, 8 * p, 8 * p + 8) * m * (2n * j + 1n);
      }
    }
  }
  return u64(s);
}

// ROWS (SPEC 3): a bf16 segment of 3 local rows x [2, 5] elements, global rows 10.. of layer 1,
// stored with the rows innermost (memory [a][b][row]); and a float32 segment of 2 rows x 3.
const R16 = 3;
const D0 = 2;
const D1 = 5;
const rowsLogical16 = Array.from({ length: R16 }, (_, i) => Array.from({ length: D0 * D1 }, (_, e) => (i * 7919 + e * 104729 + 65521) & 0xffff));
const mem16 = new Uint8Array(2 + D0 * D1 * R16 * 2);
{
  const dv = new DataView(mem16.buffer);
  for (let i = 0; i < R16; i++)
    for (let a = 0; a < D0; a++) for (let b = 0; b < D1; b++) dv.setUint16(2 + ((a * D1 + b) * R16 + i) * 2, rowsLogical16[i][a * D1 + b], true);
}
const rows16: E = {
  kind: 2,
  offset: 2,
  factorBase: 65536n + 10n,
  outerCount: R16,
  outerStride: 2,
  elemCount: [1, D0, D1],
  elemStride: [0, D1 * R16 * 2, R16 * 2],
  elemBytes: 2,
  numBlocks: 1,
  column: 1,
};
const rowsLogical32 = [
  [0xffffffff, 1, 2],
  [3, 0x80000000, 5],
];
const mem32 = new Uint8Array(new Uint32Array(rowsLogical32.flat()).buffer);
const rows32: E = { kind: 2, factorBase: 65536n + 20n, outerCount: 2, outerStride: 12, elemCount: [1, 1, 3], elemStride: [0, 0, 4], elemBytes: 4, numBlocks: 1 };

function rowsValue(rows: number[][], factorBase: bigint): bigint {
  let s = 0n;
  rows.forEach((row, i) => {
    const m = 2n * (factorBase + BigInt(i)) + 1n;
    row.forEach((x, e) => (s += BigInt(x) * m * (2n * BigInt(e) + 1n)));
  });
  return u64(s);
}

// STREAM (SPEC 3, no split): states of 12 and 20 bytes concatenated into a 32-byte stream; layer 6,
// tpRank 1. Stored at unaligned offsets of a SharedArrayBuffer-backed region.
const st1 = bytes(12, 11);
const st2 = bytes(20, 12);
const streamMem = new Uint8Array(new SharedArrayBuffer(48));
streamMem.set(st1, 1);
streamMem.set(st2, 17);
const STREAM_FB = 6n * 65536n + 1n;
const stream: E[] = [
  { kind: 3, offset: 1, byteStart: 0, byteCount: 12, factorBase: STREAM_FB, numBlocks: 1 },
  { kind: 3, offset: 17, byteStart: 12, byteCount: 20, factorBase: STREAM_FB, numBlocks: 1 },
];
function streamValue(): bigint {
  const s = new Uint8Array([...st1, ...st2]);
  let v = 0n;
  for (let k = 0; 8 * k < s.length; k++) v += le(s, 8 * k, 8 * k + 8) * (2n * BigInt(k) + 1n);
  return u64(v * (2n * STREAM_FB + 1n));
}

/** The entries of all groups (see {@link fixture}). */
const ENTRIES: E[] = [
  kPart.entry,
  { ...vPart.entry, region: 1 },
  { ...rows16, region: 2 },
  { ...rows32, region: 3 },
  ...stream.map((e) => ({ ...e, region: 4 })),
  // one head per entry, each head's cells one contiguous run
  { ...hndWhole.entry, region: 5, outerCount: 1 },
  { ...hndWhole.entry, region: 5, outerCount: 1, offset: BT * CELL, factorBase: LAYER * 65536n + HEAD0 + 1n },
  { ...hndSplit.entry, region: 6 },
];
const OUT_LEN = 10;

/**
 * Group 0: ATTN NHD (K, V parts; regions 0, 1). Group 1: ROWS (regions 2, 3). Group 2: STREAM
 * (region 4). Groups 3 and 4: the group 0 cells stored HND (regions 5, 6).
 */
function fixture() {
  const entries = pack(ENTRIES);
  const groupStart = new Uint32Array([0, 2, 4, 6, 8, 9]);
  const regions: Array<Uint8Array | ArrayBuffer | SharedArrayBuffer> = [kPart.mem, vPart.mem, mem16, mem32.buffer, streamMem.buffer as SharedArrayBuffer, hndWhole.mem, hndSplit.mem];
  const rows = rowsOf([
    [0, 2, 0, 4, 0], // block id 2 at position 0, full
    [0, 0, 4, 3, 1], // block id 0 at position 1, 3 valid tokens
    [0, 1, 8, 0, 2], // no valid token: adds nothing
    [1, 0, 0, 0, 3], // state rows: columns 0 (f32) and 1 (bf16) at 3, 4
    [2, 0, 0, 0, 5],
    [3, 2, 0, 4, 6],
    [3, 0, 4, 3, 7],
    [4, 2, 0, 4, 8],
    [4, 0, 4, 3, 9],
  ]);
  const a = attnValue(2, 0, 4);
  const b = attnValue(0, 4, 3);
  const want = [a, b, 0n, rowsValue(rowsLogical32, 65536n + 20n), rowsValue(rowsLogical16, 65536n + 10n), streamValue(), a, b, a, b];
  return { entries, groupStart, regions, rows, want };
}

const SENTINEL = 0x1234_5678_9abc_def0n;

/** Runs `sumRows` on a broken fixture: must throw `type` matching `msg` and leave `out` untouched. */
function expectRejected(type: typeof TypeError | typeof RangeError, msg: RegExp, breakIt: (f: ReturnType<typeof fixture> & { out: BigUint64Array }) => unknown[] | void) {
  const f = { ...fixture(), out: new BigUint64Array(OUT_LEN).fill(SENTINEL) };
  const args = breakIt(f) ?? [f.entries, f.groupStart, f.regions, f.rows, f.out];
  const fn = A().sumRows as (...a: unknown[]) => void;
  let thrown: unknown = null;
  try {
    fn(...args);
  } catch (e) {
    thrown = e;
  }
  expect(thrown).toBeInstanceOf(type);
  expect((thrown as Error).message).toMatch(msg);
  expect([...f.out]).toEqual(new Array(OUT_LEN).fill(SENTINEL));
}

// ---- tests -------------------------------------------------------------------------------------

describe('native addon', () => {
  it('is built when KVCONNECT_REQUIRE_NATIVE=1 (CI)', () => {
    if (process.env.KVCONNECT_REQUIRE_NATIVE === '1') {
      expect(loadError?.message ?? null).toBeNull();
      expect(addon).not.toBeNull();
      expect(loadNativeBackend()).not.toBeNull();
    }
    // Without the variable the addon is optional; the backend and its reason must agree.
    expect(loadNativeBackend() === null).toBe(nativeUnavailableReason() !== null);
  });

  nativeIt('exports its constants', () => {
    expect(A().abiVersion).toBe(1);
    expect(A().entryBytes).toBe(128);
    expect(A().rowWords).toBe(6);
    expect(typeof A().withCuda).toBe('boolean');
  });

  nativeIt('sums hand-built ATTN, ROWS and STREAM tables to the SPEC values', () => {
    const f = fixture();
    const out = new BigUint64Array(OUT_LEN);
    A().sumRows(f.entries, f.groupStart, f.regions, f.rows, out);
    expect([...out]).toEqual(f.want);
    // out is added to, not cleared (mod 2^64)
    out.fill(M64);
    A().sumRows(f.entries, f.groupStart, f.regions, f.rows, out);
    expect([...out]).toEqual(f.want.map((w) => u64(w + M64)));
  });

  nativeIt('reads every kind of byte source and misaligned entries', () => {
    const f = fixture();
    const want = f.want;
    const asDataView = (b: Uint8Array) => new DataView(b.buffer, b.byteOffset, b.byteLength);
    const variants: Array<Array<Uint8Array | ArrayBuffer | SharedArrayBuffer | DataView>> = [
      [Buffer.from(kPart.mem), asDataView(vPart.mem), new Uint8Array(mem16), mem32, new Uint8Array(streamMem.buffer), hndWhole.mem.buffer, asDataView(hndSplit.mem)],
      // regions as views at an odd byte offset of a larger buffer
      f.regions.map((r) => {
        const b = r instanceof Uint8Array ? r : new Uint8Array(r);
        const big = new Uint8Array(b.length + 3);
        big.set(b, 3);
        return big.subarray(3);
      }),
    ];
    for (const regions of variants) {
      const out = new BigUint64Array(OUT_LEN);
      A().sumRows(f.entries, f.groupStart, regions, f.rows, out);
      expect([...out]).toEqual(want);
    }
    const odd = pack(ENTRIES, 1);
    expect(odd.byteOffset % 8).toBe(1);
    const out = new BigUint64Array(OUT_LEN);
    A().sumRows(odd, f.groupStart, f.regions, f.rows, out);
    expect([...out]).toEqual(want);
  });

  nativeIt('the native backend sums PackedTables the same way', () => {
    const f = fixture();
    const be = loadNativeBackend()!;
    expect(be.name).toBe('native');
    const regions = f.regions.map((r) => (r instanceof Uint8Array ? r : new Uint8Array(r)));
    const out = new BigUint64Array(OUT_LEN);
    be.sumRows({ entries: f.entries, groupStart: f.groupStart, nGroups: 5 }, regions, f.rows, out);
    expect([...out]).toEqual(f.want);
    expect(() => be.sumRows({ entries: f.entries, groupStart: f.groupStart, nGroups: 4 }, regions, f.rows, out)).toThrow(RangeError);
  });

  nativeIt('rejects arguments of the wrong type with TypeError, writing nothing', () => {
    const T = TypeError;
    expectRejected(T, /5 arguments/, (f) => [f.entries, f.groupStart, f.regions, f.rows]);
    expectRejected(T, /entries must be a Uint8Array/, (f) => [Array.from(f.entries), f.groupStart, f.regions, f.rows, f.out]);
    expectRejected(T, /entries must be a Uint8Array/, (f) => [new Uint16Array(f.entries.buffer), f.groupStart, f.regions, f.rows, f.out]);
    expectRejected(T, /groupStart must be a Uint32Array/, (f) => [f.entries, new Int32Array(f.groupStart), f.regions, f.rows, f.out]);
    expectRejected(T, /regions must be an Array/, (f) => [f.entries, f.groupStart, f.regions[0], f.rows, f.out]);
    expectRejected(T, /regions\[2\] must be/, (f) => {
      f.regions[2] = 42 as unknown as Uint8Array;
    });
    expectRejected(T, /regions\[0\] must be/, (f) => {
      f.regions[0] = 'bytes' as unknown as Uint8Array;
    });
    expectRejected(T, /rows must be a Uint32Array/, (f) => [f.entries, f.groupStart, f.regions, Array.from(f.rows), f.out]);
    expectRejected(T, /out must be a BigUint64Array/, (f) => [f.entries, f.groupStart, f.regions, f.rows, new BigInt64Array(6)]);
    expectRejected(T, /out must be a BigUint64Array/, (f) => [f.entries, f.groupStart, f.regions, f.rows, new Float64Array(6)]);
  });

  nativeIt('rejects malformed tables and rows with RangeError, writing nothing', () => {
    const R = RangeError;
    const sub = (f: { entries: Uint8Array }, n: number) => f.entries.subarray(0, n);
    expectRejected(R, /not a multiple of 128/, (f) => [sub(f, f.entries.length - 1), f.groupStart, f.regions, f.rows, f.out]);
    expectRejected(R, /groupStart\[5\] = 9 but entries holds 8/, (f) => [sub(f, 8 * 128), f.groupStart, f.regions, f.rows, f.out]);
    expectRejected(R, /groupStart\[0\] must be 0/, (f) => {
      f.groupStart[0] = 1;
    });
    expectRejected(R, /at least 1/, (f) => [f.entries, new Uint32Array(0), f.regions, f.rows, f.out]);
    expectRejected(R, /groupStart\[2\]: group_start is not non-decreasing/, (f) => {
      f.groupStart[1] = 5;
    });
    expectRejected(R, /rows.length \(29\) is not a multiple of 6/, (f) => [f.entries, f.groupStart, f.regions, f.rows.subarray(0, 29), f.out]);
    // an entry whose extent exceeds its region: the V region one byte short of the last byte read
    // (the region ends with 8 bytes of kernel-block padding that no entry reads)
    expectRejected(R, /entries\[1\]: entry extent exceeds its region/, (f) => {
      f.regions[1] = vPart.mem.subarray(0, vPart.mem.length - 9);
    });
    expectRejected(R, /entries\[4\]: entry extent exceeds its region/, (f) => {
      f.regions[4] = new Uint8Array(12);
    });
    // region index past the regions array
    expectRejected(R, /entries\[8\]: entry region index is past/, (f) => {
      f.regions.pop();
    });
    // invalid entries
    const patch = (f: { entries: Uint8Array }, index: number, at: number, v: number) =>
      new DataView(f.entries.buffer, f.entries.byteOffset).setUint32(128 * index + at, v, true);
    expectRejected(R, /entries\[3\]: unknown entry kind/, (f) => patch(f, 3, 84, 9));
    expectRejected(R, /entries\[0\]: .*block_tokens is not a multiple of kblock_tokens/, (f) => patch(f, 0, 100, 3));
    expectRejected(R, /entries\[1\]: .*byte_start \+ byte_count exceeds the cell/, (f) => patch(f, 1, 104, KB + 1));
    expectRejected(R, /entries\[2\]: .*elem_bytes is not 2 or 4/, (f) => patch(f, 2, 116, 8));
    expectRejected(R, /entries\[4\]: num_blocks is 0/, (f) => patch(f, 4, 120, 0));
    // a row with a block id past num_blocks
    expectRejected(R, /rows\[1\]: row block_id is past/, (f) => {
      f.rows[6 + 1] = NB;
    });
    expectRejected(R, /rows\[3\]: row block_id is past/, (f) => {
      f.rows[18 + 1] = 1;
    });
    expectRejected(R, /rows\[0\]: row valid_tokens exceeds/, (f) => {
      f.rows[3] = BT + 1;
    });
    expectRejected(R, /rows\[4\]: row group index is past/, (f) => {
      f.rows[24] = 5;
    });
    // out too short: row 8 writes out[9]
    expectRejected(R, /rows\[8\]: row out_offset \+ entry column is past the output/, (f) => [f.entries, f.groupStart, f.regions, f.rows, f.out.subarray(0, 9)]);
    // out sharing memory with the rows
    expectRejected(R, /out overlaps/, (f) => {
      const shared = new ArrayBuffer(f.rows.byteLength + 8 * OUT_LEN);
      const rows = new Uint32Array(shared, 0, f.rows.length);
      rows.set(f.rows);
      return [f.entries, f.groupStart, f.regions, rows, new BigUint64Array(shared, 0, OUT_LEN)];
    });
  });

  nativeIt('entryExtent gives [lo, hi) and rejects bad indexes and entries', () => {
    const entries = pack([kPart.entry, { kind: 2, offset: 10, numBlocks: 2, blockStride: 100, outerCount: 3, outerStride: 20, elemCount: [2, 1, 5], elemStride: [-4, 0, 2], elemBytes: 2 }, { kind: 7, numBlocks: 1 }]);
    // K part: from its 3 leading bytes to the end of its last cell (8 bytes of padding follow it)
    expect(A().entryExtent(entries, 0)).toEqual([3n, BigInt(kPart.mem.length - 8)]);
    // 10 - 4 = 6; 10 + 100 + 40 + 8 + 2 = 160
    expect(A().entryExtent(entries, 1)).toEqual([6n, 160n]);
    expect(() => A().entryExtent(entries, 2)).toThrow(/entries\[2\]: unknown entry kind/);
    expect(() => A().entryExtent(entries, 3)).toThrow(RangeError);
    expect(() => A().entryExtent(entries, -1)).toThrow(RangeError);
    expect(() => A().entryExtent(entries, 0.5)).toThrow(RangeError);
    expect(() => (A().entryExtent as (...a: unknown[]) => unknown)(entries, '0')).toThrow(TypeError);
    expect(() => (A().entryExtent as (...a: unknown[]) => unknown)([1, 2], 0)).toThrow(TypeError);
  });

  nativeIt('plainSum64 and weightedSum64 wrap mod 2^64', () => {
    const w = [1n, M64, 5n, 7n, 1n << 63n];
    const buf = new BigUint64Array(w);
    const plain = u64(w.reduce((a, b) => a + b, 0n));
    const weighted = u64(w.reduce((a, x, j) => a + x * (2n * BigInt(j) + 1n), 0n));
    expect(A().plainSum64(buf)).toBe(plain);
    expect(A().weightedSum64(new Uint8Array(buf.buffer))).toBe(weighted);
    expect(A().weightedSum64(buf.buffer)).toBe(weighted);
    const sab = new SharedArrayBuffer(40);
    new BigUint64Array(sab).set(w);
    expect(A().weightedSum64(sab)).toBe(weighted);
    expect(plainSum64(buf)).toBe(plain);
    expect(weightedSum64(buf)).toBe(weighted);
    expect(() => A().plainSum64(new Uint8Array(12))).toThrow(RangeError);
    expect(() => (A().weightedSum64 as (...a: unknown[]) => unknown)(42)).toThrow(TypeError);
    expect(() => (A().plainSum64 as (...a: unknown[]) => unknown)()).toThrow(TypeError);
  });
});

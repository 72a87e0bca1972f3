/**
 * The TypeScript reference backend: sums a step's rows over packed tables exactly as SPEC 2-3
 * define it, in plain BigInt arithmetic mod 2^64. It is the readable definition the native and
 * CUDA backends are tested against (besides the conformance vectors), and the fallback where the
 * addon is not built.
 * @module
 */
import { ENTRY_ATTN, ENTRY_BYTES, ENTRY_ROWS, ENTRY_STREAM, ROW_WORDS, type ChecksumBackend, type PackedTables } from './backend.js';
import { entryExtent, readEntry, type Entry } from './plan.js';

const decoded = new WeakMap<Uint8Array, Entry[]>();

/** Decodes (once per table set) the entries of `tables`. */
export function tableEntries(tables: PackedTables): Entry[] {
  let list = decoded.get(tables.entries);
  if (!list) {
    const dv = new DataView(tables.entries.buffer, tables.entries.byteOffset, tables.entries.byteLength);
    list = [];
    for (let at = 0; at + ENTRY_BYTES <= tables.entries.byteLength; at += ENTRY_BYTES) list.push(readEntry(dv, at));
    decoded.set(tables.entries, list);
  }
  return list;
}

/** Output columns of group `g`: 1 + the largest column of its entries (0 for an empty group). */
function groupColumns(entries: Entry[], tables: PackedTables, g: number): number {
  let n = 0;
  for (let k = tables.groupStart[g]; k < tables.groupStart[g + 1]; k++) n = Math.max(n, entries[k].column + 1);
  return n;
}

/**
 * Checks tables, regions and rows before anything is summed: every entry's extent inside its
 * region, every row's group, block id, token count and output index in range. Only the regions'
 * sizes are read (device regions are checked through `{ byteLength: bytes }`).
 * @throws RangeError naming the first invalid entry or row.
 */
export function validateStep(tables: PackedTables, regions: readonly { readonly byteLength: number }[], rows: Uint32Array, out: BigUint64Array): void {
  const entries = tableEntries(tables);
  if (tables.entries.byteLength % ENTRY_BYTES !== 0) throw new RangeError(`entries: ${tables.entries.byteLength} bytes is not a multiple of ${ENTRY_BYTES}`);
  if (tables.groupStart.length !== tables.nGroups + 1 || tables.groupStart[0] !== 0 || tables.groupStart[tables.nGroups] !== entries.length) {
    throw new RangeError('groupStart does not describe the entries');
  }
  for (let g = 0; g < tables.nGroups; g++) if (tables.groupStart[g] > tables.groupStart[g + 1]) throw new RangeError('groupStart is not sorted');
  entries.forEach((e, k) => {
    const r = regions[e.region];
    if (!r) throw new RangeError(`entry ${k}: region ${e.region} of ${regions.length}`);
    const [lo, hi] = entryExtent(e);
    if (lo < 0 || hi > r.byteLength || !Number.isSafeInteger(hi)) throw new RangeError(`entry ${k}: reads bytes [${lo}, ${hi}) of a ${r.byteLength}-byte region`);
    // Work bound (as the native kernel): one row may not read more bytes than the region holds,
    // so zero or overlapping strides cannot make a small table run a huge loop.
    const work =
      e.kind === ENTRY_ATTN ? e.outerCount * e.blockTokens * e.byteCount : e.kind === ENTRY_ROWS ? e.outerCount * e.elemCount[0] * e.elemCount[1] * e.elemCount[2] * e.elemBytes : e.byteCount;
    if (work > r.byteLength) throw new RangeError(`entry ${k}: reads ${work} bytes per row from a ${r.byteLength}-byte region`);
  });
  if (rows.length % ROW_WORDS !== 0) throw new RangeError(`rows: ${rows.length} words is not a multiple of ${ROW_WORDS}`);
  for (let i = 0; i < rows.length; i += ROW_WORDS) {
    const g = rows[i];
    if (g >= tables.nGroups) throw new RangeError(`row ${i / ROW_WORDS}: group ${g} of ${tables.nGroups}`);
    const cols = groupColumns(entries, tables, g);
    if (rows[i + 4] + cols > out.length) throw new RangeError(`row ${i / ROW_WORDS}: output ${rows[i + 4]} + ${cols} columns past ${out.length}`);
    for (let k = tables.groupStart[g]; k < tables.groupStart[g + 1]; k++) {
      const e = entries[k];
      if (rows[i + 1] >= e.numBlocks) throw new RangeError(`row ${i / ROW_WORDS}: block id ${rows[i + 1]} >= ${e.numBlocks}`);
      if (e.kind === ENTRY_ATTN && rows[i + 3] > e.blockTokens) throw new RangeError(`row ${i / ROW_WORDS}: ${rows[i + 3]} valid tokens > block of ${e.blockTokens}`);
    }
  }
}

/** Memory of one region with a u64 view when it is 8-aligned. */
export interface Mem {
  bytes: Uint8Array;
  dv: DataView;
  /** 32-bit LE words of the region when it starts 8-aligned (little-endian host). */
  u32: Uint32Array | null;
}

const LITTLE_ENDIAN_HOST = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/** The {@link Mem} of a region (any byte view, read as bytes). */
export function memOf(region: Uint8Array | ArrayBufferView | ArrayBuffer): Mem {
  // Any byte view (or a bare ArrayBuffer) is read as bytes, as the native backend does.
  const r = region instanceof Uint8Array ? region : ArrayBuffer.isView(region) ? new Uint8Array(region.buffer, region.byteOffset, region.byteLength) : new Uint8Array(region);
  return {
    bytes: r,
    dv: new DataView(r.buffer, r.byteOffset, r.byteLength),
    u32: LITTLE_ENDIAN_HOST && r.byteOffset % 8 === 0 ? new Uint32Array(r.buffer, r.byteOffset, r.byteLength >>> 2) : null,
  };
}

const TWO32 = 2n ** 32n;

/**
 * Sum of `x_q * (2 * (jFirst + q) + 1)` over `n` whole aligned pieces starting at 32-bit word
 * `w` (piece q = words w+2q (low) and w+2q+1 (high), LE), mod 2^64.
 *
 * The same value as the plain loop `acc += x_q * (2j + 1)`, with fewer BigInt operations: with
 * `x_q = lo_q + 2^32 hi_q`, a chunk's sum is `(2 jFirst + 1) * S + 2 * Q` where `S = sum x_q` and
 * `Q = sum q x_q`; the partial sums of `lo`, `hi`, `q lo`, `q hi` are exact in doubles because a
 * chunk has at most {@link CHUNK} = 256 pieces (`q lo < 2^40`, sums < 2^48 < 2^53).
 */
function weightedAligned(u32: Uint32Array, w: number, n: number, jFirst: number): bigint {
  let acc = 0n;
  for (let c = 0; c < n; c += CHUNK) {
    const m = Math.min(CHUNK, n - c);
    let sLo = 0;
    let sHi = 0;
    let qLo = 0;
    let qHi = 0;
    for (let q = 0, i = w + 2 * c; q < m; q++, i += 2) {
      const lo = u32[i];
      const hi = u32[i + 1];
      sLo += lo;
      sHi += hi;
      qLo += q * lo;
      qHi += q * hi;
    }
    const S = BigInt(sLo) + BigInt(sHi) * TWO32;
    const Q = BigInt(qLo) + BigInt(qHi) * TWO32;
    acc += BigInt(2 * (jFirst + c) + 1) * S + 2n * Q;
  }
  return BigInt.asUintN(64, acc);
}

/** Pieces per exact double chunk: q < 2^8 and word < 2^32 keep q*word sums of 2^8 terms < 2^48. */
const CHUNK = 256;

/**
 * Sum over the pieces overlapping bytes `[from, from+count)` of a logical byte sequence (a cell or
 * a state stream) that lie at `addr` in memory: each piece `q` (bytes `[8q, 8q+8)`, LE) weighs
 * `2 * (jBase + q) + 1`. Bytes of a piece outside the range count as zero, so the parts of a cell
 * add up to the whole cell (the sum is linear in the bytes).
 */
export function weightedPieces(mem: Mem, addr: number, from: number, count: number, jBase: number): bigint {
  let acc = 0n;
  const end = from + count;
  if (from % 8 === 0 && count % 8 === 0 && mem.u32 && addr % 8 === 0) {
    // Whole aligned pieces: the common case.
    return weightedAligned(mem.u32, addr >>> 2, count / 8, jBase + from / 8);
  }
  for (let q = Math.floor(from / 8); q * 8 < end; q++) {
    const a = Math.max(from, q * 8);
    const b = Math.min(end, q * 8 + 8);
    let x: bigint;
    if (b - a === 8) x = mem.dv.getBigUint64(addr + (a - from), true);
    else {
      x = 0n;
      for (let c = a; c < b; c++) x |= BigInt(mem.bytes[addr + (c - from)]) << BigInt(8 * (c - q * 8));
    }
    acc = BigInt.asUintN(64, acc + x * BigInt(2 * (jBase + q) + 1));
  }
  return acc;
}

function sumAttn(e: Entry, mem: Mem, block: number, firstToken: number, valid: number): bigint {
  let total = 0n;
  const P = e.cellPieces;
  const base = e.offset + block * e.blockStride;
  for (let h = 0; h < e.outerCount; h++) {
    let acc = 0n;
    for (let t = 0; t < valid; t++) {
      const addr = base + Math.floor(t / e.kblockTokens) * e.kblockStride + (t % e.kblockTokens) * e.tokenStride + h * e.outerStride;
      acc += weightedPieces(mem, addr, e.byteStart, e.byteCount, (firstToken + t) * P);
    }
    const m = BigInt.asUintN(64, 2n * (e.factorBase + BigInt(h)) + 1n);
    total += acc * m;
  }
  return BigInt.asUintN(64, total);
}

function sumRows_(e: Entry, mem: Mem, block: number): bigint {
  let total = 0n;
  const [c0, c1, c2] = e.elemCount;
  const [s0, s1, s2] = e.elemStride;
  const read = e.elemBytes === 2 ? (a: number) => mem.dv.getUint16(a, true) : (a: number) => mem.dv.getUint32(a, true);
  for (let i = 0; i < e.outerCount; i++) {
    const row = e.offset + block * e.blockStride + i * e.outerStride;
    let acc = 0n;
    let j = 0;
    for (let a = 0; a < c0; a++) {
      for (let b = 0; b < c1; b++) {
        for (let c = 0; c < c2; c++, j++) {
          acc += BigInt(read(row + a * s0 + b * s1 + c * s2)) * BigInt(2 * j + 1);
        }
      }
    }
    const m = BigInt.asUintN(64, 2n * (e.factorBase + BigInt(i)) + 1n);
    total += BigInt.asUintN(64, acc) * m;
  }
  return BigInt.asUintN(64, total);
}

function sumStream(e: Entry, mem: Mem, block: number): bigint {
  const acc = weightedPieces(mem, e.offset + block * e.blockStride, e.byteStart, e.byteCount, 0);
  return BigInt.asUintN(64, acc * BigInt.asUintN(64, 2n * e.factorBase + 1n));
}

/** The TypeScript reference backend (see module doc). */
export const tsBackend: ChecksumBackend = {
  name: 'ts',
  sumRows(tables: PackedTables, regions: readonly Uint8Array[], rows: Uint32Array, out: BigUint64Array): void {
    validateStep(tables, regions, rows, out);
    const entries = tableEntries(tables);
    const mems = regions.map(memOf);
    for (let i = 0; i < rows.length; i += ROW_WORDS) {
      const g = rows[i];
      const block = rows[i + 1];
      const first = rows[i + 2];
      const valid = rows[i + 3];
      const o = rows[i + 4];
      for (let k = tables.groupStart[g]; k < tables.groupStart[g + 1]; k++) {
        const e = entries[k];
        const mem = mems[e.region];
        const v = e.kind === ENTRY_ATTN ? sumAttn(e, mem, block, first, valid) : e.kind === ENTRY_ROWS ? sumRows_(e, mem, block) : e.kind === ENTRY_STREAM ? sumStream(e, mem, block) : 0n;
        out[o + e.column] = BigInt.asUintN(64, out[o + e.column] + v);
      }
    }
  },
};

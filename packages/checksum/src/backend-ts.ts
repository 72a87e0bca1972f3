/**
 * The TypeScript reference backend: sums a step's rows over packed tables exactly as SPEC 2-3
 * define it, mod 2^64. It is the readable definition the native and CUDA backends are tested
 * against (besides the conformance vectors), and the fallback where the addon is not built.
 * Attention parts of whole pieces at 4-aligned addresses (the common case) are summed with
 * numbers only (`sumAttnWhole`); everything else in plain BigInt arithmetic.
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

const TWO32_N = 4294967296;

/**
 * Pieces one chunk of {@link sumAttnWhole} sums in doubles. A chunk holds each piece index
 * `r < SPAN` (counted from the chunk's first piece) at most once, so its sums stay exact integers:
 * the weighted ones below `(2^32 - 1) * SPAN * (SPAN - 1) / 2 < 2^53`, the plain ones below
 * `2^32 * SPAN = 2^43`.
 */
const SPAN = 2048;

/**
 * `acc[o]` (low 32 bits) and `acc[o + 1]` (high 32 bits) += a * b mod 2^64, with a and b given as
 * 32-bit halves (numbers in [0, 2^32)). `aLo * bLo` is formed exactly from two products of at
 * most 48 bits; the cross terms only reach the high word, so `Math.imul` (mod 2^32) suffices.
 */
function mulAdd64(acc: Uint32Array, o: number, aLo: number, aHi: number, bLo: number, bHi: number): void {
  const x = aLo * (bLo & 0xffff); // < 2^48
  const y = aLo * (bLo >>> 16); // < 2^48
  const y0 = y % 65536;
  const t = x + y0 * 65536; // aLo * bLo = t + (y - y0) * 2^16, t < 2^49
  const tLo = t % TWO32_N;
  const lo = acc[o] + tLo;
  // Every term is an exact integer below 2^35 in magnitude; the Uint32Array stores reduce mod 2^32.
  acc[o + 1] = acc[o + 1] + (t - tLo) / TWO32_N + (y - y0) / 65536 + Math.imul(aLo, bHi) + Math.imul(aHi, bLo) + (lo >= TWO32_N ? 1 : 0);
  acc[o] = lo;
}

/** `acc[o], acc[o + 1]` += the 64-bit value `lo + 2^32 * hi` given as two exact doubles below 2^53. */
function mulAddSplit(acc: Uint32Array, o: number, lo: number, hi: number, bLo: number, bHi: number): void {
  const l = lo % TWO32_N;
  mulAdd64(acc, o, l, ((lo - l) / TWO32_N + hi) % TWO32_N, bLo, bHi);
}

/**
 * {@link sumAttn} for a part of whole pieces at 4-aligned addresses of a region with a 32-bit view:
 * the same value with no BigInt in the loop. Per head, the pieces of up to {@link SPAN}
 * consecutive piece numbers form a chunk with sums `S = sum x` and `Q = sum r x` (`r`: piece
 * number minus the chunk's first piece number `jc`), each split by 32-bit half of x: the low
 * halves' sums as exact doubles, the high halves' (worth 2^32 each) mod 2^32 in int32 arithmetic.
 * The chunk adds `(2 jc + 1) S + 2 Q` (SPEC 2: `sum x (2j + 1)`), and the head's total is
 * multiplied by its slice factor once, as the native kernel does (native/src/checksum_kernel.inc).
 * Arithmetic mod 2^64 is on 32-bit halves in `sc` (scratch: words 0-1 the result, 2-3 the head,
 * 4-5 the chunk weight). Edges are tested in test/ts-backend.test.ts.
 */
function sumAttnWhole(e: Entry, u32: Uint32Array, block: number, firstToken: number, valid: number, sc: Uint32Array): void {
  const P = e.cellPieces;
  const n = e.byteCount / 8;
  const p0 = e.byteStart / 8;
  const kbt = e.kblockTokens;
  const kbs = e.kblockStride;
  const ts = e.tokenStride;
  const base = e.offset + block * e.blockStride; // address of the part (byte byteStart of the cell)
  // Tokens per chunk and pieces of a token's part per chunk: whole parts of floor(SPAN / P)
  // tokens, or (a cell longer than SPAN pieces) one token's part in runs of SPAN pieces.
  const per = P <= SPAN ? Math.floor(SPAN / P) : 1;
  const sub = P <= SPAN ? n : SPAN;
  const twoP = 2 * P; // < 2^33
  const twoPLo = twoP % TWO32_N;
  const twoPHi = (twoP - twoPLo) / TWO32_N;
  const fbLo = Number(e.factorBase & 0xffffffffn);
  const fbHi = Number(e.factorBase >> 32n);
  sc[0] = 0;
  sc[1] = 0;
  for (let h = 0; h < e.outerCount; h++) {
    sc[2] = 0;
    sc[3] = 0;
    const hb = base + h * e.outerStride;
    for (let t0 = 0; t0 < valid; t0 += per) {
      const t1 = Math.min(valid, t0 + per);
      for (let c = 0; c < n; c += sub) {
        const m = Math.min(sub, n - c);
        let sLo = 0;
        let sHi = 0;
        let qLo = 0;
        let qHi = 0;
        for (let t = t0; t < t1; t++) {
          const kb = Math.floor(t / kbt);
          let i = (hb + kb * kbs + (t - kb * kbt) * ts) / 4 + 2 * c;
          // Two pieces per iteration, no multiplication: after K iterations a piece 2k (in a0/a1)
          // has been added K - k times to b0/b1, so sum 2k x = 2 (K a0 - b0); likewise the odd
          // pieces 2k + 1: sum (2k + 1) x = 2 (K c0 - d0) + c0. The high halves count 2^32 times,
          // so only their sums mod 2^32 matter: int32 arithmetic (| 0, Math.imul) for them.
          const K = m >>> 1;
          const pairsEnd = i + 4 * K;
          let a0 = 0;
          let a1 = 0;
          let b0 = 0;
          let b1 = 0;
          let c0 = 0;
          let c1 = 0;
          let d0 = 0;
          let d1 = 0;
          for (; i < pairsEnd; i += 4) {
            a0 += u32[i];
            a1 = (a1 + u32[i + 1]) | 0;
            c0 += u32[i + 2];
            c1 = (c1 + u32[i + 3]) | 0;
            b0 += a0;
            b1 = (b1 + a1) | 0;
            d0 += c0;
            d1 = (d1 + c1) | 0;
          }
          let lo = a0 + c0;
          let hi = (a1 + c1) | 0;
          let wLo = 2 * (K * a0 - b0) + 2 * (K * c0 - d0) + c0;
          let wHi = (2 * ((Math.imul(K, a1) - b1 + Math.imul(K, c1) - d1) | 0) + c1) | 0;
          if (m & 1) {
            const xLo = u32[i];
            const xHi = u32[i + 1] | 0;
            lo += xLo;
            hi = (hi + xHi) | 0;
            wLo += (m - 1) * xLo;
            wHi = (wHi + Math.imul(m - 1, xHi)) | 0;
          }
          // the token's pieces are r = rt .. rt + m - 1 of the chunk
          const rt = (t - t0) * P;
          sLo += lo;
          sHi = (sHi + hi) | 0;
          qLo += rt * lo + wLo;
          qHi = (qHi + Math.imul(rt, hi) + wHi) | 0;
        }
        // weight 2 jc + 1 with jc = (firstToken + t0) * P + p0 + c, mod 2^64
        const a = firstToken + t0; // < 2^33
        const aLo = a % TWO32_N;
        const wb = 2 * (p0 + c) + 1; // < 2^34
        const wbLo = wb % TWO32_N;
        sc[4] = wbLo;
        sc[5] = (wb - wbLo) / TWO32_N;
        mulAdd64(sc, 4, aLo, (a - aLo) / TWO32_N, twoPLo, twoPHi);
        mulAddSplit(sc, 2, sLo, sHi >>> 0, sc[4], sc[5]);
        mulAddSplit(sc, 2, qLo, qHi >>> 0, 2, 0);
      }
    }
    // slice factor m = 2 (factorBase + h) + 1, mod 2^64
    const mLo = 2 * fbLo + 2 * h + 1; // < 2^34
    const mLo32 = mLo % TWO32_N;
    mulAdd64(sc, 0, sc[2], sc[3], mLo32, (2 * fbHi + (mLo - mLo32) / TWO32_N) % TWO32_N);
  }
}

/** True when {@link sumAttnWhole} can read entry `e`'s parts: whole pieces at 4-aligned addresses. */
function wholePieces(e: Entry, mem: Mem): boolean {
  return mem.u32 !== null && e.byteStart % 8 === 0 && e.byteCount % 8 === 0 && (e.offset % 4 | e.blockStride % 4 | e.outerStride % 4 | e.kblockStride % 4 | e.tokenStride % 4) === 0;
}

function sumAttn(e: Entry, mem: Mem, block: number, firstToken: number, valid: number, sc: Uint32Array): bigint {
  if (wholePieces(e, mem)) {
    sumAttnWhole(e, mem.u32!, block, firstToken, valid, sc);
    return (BigInt(sc[1]) << 32n) | BigInt(sc[0]);
  }
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
    const sc = new Uint32Array(6);
    for (let i = 0; i < rows.length; i += ROW_WORDS) {
      const g = rows[i];
      const block = rows[i + 1];
      const first = rows[i + 2];
      const valid = rows[i + 3];
      const o = rows[i + 4];
      for (let k = tables.groupStart[g]; k < tables.groupStart[g + 1]; k++) {
        const e = entries[k];
        const mem = mems[e.region];
        const v = e.kind === ENTRY_ATTN ? sumAttn(e, mem, block, first, valid, sc) : e.kind === ENTRY_ROWS ? sumRows_(e, mem, block) : e.kind === ENTRY_STREAM ? sumStream(e, mem, block) : 0n;
        out[o + e.column] = BigInt.asUintN(64, out[o + e.column] + v);
      }
    }
  },
};

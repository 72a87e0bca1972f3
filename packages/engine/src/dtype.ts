/**
 * KV cache element types the engine stores (bf16, fp16, fp32) and exact conversions between them
 * and float32, little-endian. Rounding is round-to-nearest-even everywhere; NaN stays NaN (quiet),
 * infinities and signed zeros are kept; fp16 has subnormals.
 * @module
 */

/** Element types of the engine's KV caches, as @kvconnect/checksum names them. */
export type KvDtype = 'bfloat16' | 'float16' | 'float32';

/** Bytes per element of a {@link KvDtype}. */
export const KV_DTYPE_BYTES: Readonly<Record<KvDtype, number>> = Object.freeze({ bfloat16: 2, float16: 2, float32: 4 });

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** float32 bits of `x` (after rounding `x` to float32). */
export function f32Bits(x: number): number {
  f32[0] = x;
  return u32[0];
}

/** The float32 whose bits are `bits`. */
export function f32FromBits(bits: number): number {
  u32[0] = bits >>> 0;
  return f32[0];
}

/** bfloat16 bits of `x` (float32 first, then round to nearest even on the low 16 bits). */
export function toBf16Bits(x: number): number {
  const b = f32Bits(x);
  if ((b & 0x7f800000) === 0x7f800000 && (b & 0x007fffff) !== 0) return ((b >>> 16) | 0x0040) & 0xffff; // quiet NaN
  const lsb = (b >>> 16) & 1;
  return ((b + 0x7fff + lsb) >>> 16) & 0xffff;
}

/** The value of bfloat16 bits `h` (exact). */
export function fromBf16Bits(h: number): number {
  return f32FromBits((h & 0xffff) << 16);
}

/** IEEE binary16 bits of `x` (float32 first, then round to nearest even; overflow to infinity). */
export function toF16Bits(x: number): number {
  const b = f32Bits(x);
  const sign = (b >>> 16) & 0x8000;
  const exp = (b >>> 23) & 0xff;
  let mant = b & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant !== 0 ? 0x200 | (mant >>> 13) : 0);
  // Unbiased exponent.
  const e = exp - 127;
  if (e > 15) return sign | 0x7c00;
  if (e >= -14) {
    // Normal half: 10 mantissa bits, round the low 13 bits.
    let h = ((e + 15) << 10) | (mant >>> 13);
    const rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest === 0x1000 && (h & 1) === 1)) h += 1; // may carry into the exponent (to inf): correct
    return sign | h;
  }
  if (e < -25) return sign; // below half the smallest subnormal: rounds to zero
  // Subnormal half: value = mant24 * 2^(e-23); half subnormal unit = 2^-24.
  mant |= 0x800000; // implicit bit
  // Count units of 2^-24: value / 2^-24 = mant24 * 2^(e + 1), so drop -(e + 1) bits (14..24).
  const drop = -(e + 1);
  const q = mant >>> drop;
  const rem = mant & ((1 << drop) - 1);
  const halfway = 1 << (drop - 1);
  let h = q;
  if (rem > halfway || (rem === halfway && (q & 1) === 1)) h += 1;
  return sign | h;
}

/** The value of binary16 bits `h` (exact). */
export function fromF16Bits(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >>> 10) & 0x1f;
  const mant = h & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 0x1f) return mant === 0 ? sign * Infinity : NaN;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}

/** `x` rounded to `dtype` and back to a number (what a cache write then read gives). */
export function roundTo(dtype: KvDtype, x: number): number {
  switch (dtype) {
    case 'float32':
      return Math.fround(x);
    case 'bfloat16':
      return fromBf16Bits(toBf16Bits(x));
    case 'float16':
      return fromF16Bits(toF16Bits(x));
  }
}

/** Writes `x` as one `dtype` element at byte `at` of `mem` (little-endian). */
export function writeElem(mem: Uint8Array, at: number, dtype: KvDtype, x: number): void {
  if (dtype === 'float32') {
    const b = f32Bits(x);
    mem[at] = b & 0xff;
    mem[at + 1] = (b >>> 8) & 0xff;
    mem[at + 2] = (b >>> 16) & 0xff;
    mem[at + 3] = b >>> 24;
    return;
  }
  const h = dtype === 'bfloat16' ? toBf16Bits(x) : toF16Bits(x);
  mem[at] = h & 0xff;
  mem[at + 1] = h >>> 8;
}

/** Reads one `dtype` element at byte `at` of `mem` (little-endian). */
export function readElem(mem: Uint8Array, at: number, dtype: KvDtype): number {
  if (dtype === 'float32') return f32FromBits(mem[at] | (mem[at + 1] << 8) | (mem[at + 2] << 16) | (mem[at + 3] << 24));
  const h = mem[at] | (mem[at + 1] << 8);
  return dtype === 'bfloat16' ? fromBf16Bits(h) : fromF16Bits(h);
}

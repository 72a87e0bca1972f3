import { describe, expect, it } from 'vitest';
import { f32Bits, fromBf16Bits, fromF16Bits, readElem, roundTo, toBf16Bits, toF16Bits, writeElem } from '../src/dtype.js';
import { SeededRng } from '../src/rng.js';
import { ByteTokenizer, BOS_TOKEN_ID } from '../src/tokenizer.js';

describe('bfloat16', () => {
  it('rounds to nearest even on the low 16 bits', () => {
    expect(toBf16Bits(1)).toBe(0x3f80);
    expect(toBf16Bits(-2)).toBe(0xc000);
    // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even (1).
    expect(toBf16Bits(1 + 2 ** -8)).toBe(0x3f80);
    // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up.
    expect(toBf16Bits(1 + 3 * 2 ** -8)).toBe(0x3f82);
    expect(toBf16Bits(1 + 2 ** -8 + 2 ** -20)).toBe(0x3f81);
    expect(toBf16Bits(Infinity)).toBe(0x7f80);
    expect(toBf16Bits(-0)).toBe(0x8000);
    expect(Number.isNaN(fromBf16Bits(toBf16Bits(NaN)))).toBe(true);
    // The largest float32 rounds to infinity in bf16.
    expect(toBf16Bits(3.4028234663852886e38)).toBe(0x7f80);
  });

  it('every non-NaN bf16 value round-trips', () => {
    const bad: number[] = [];
    for (let h = 0; h < 0x10000; h++) {
      const x = fromBf16Bits(h);
      if (!Number.isNaN(x) && toBf16Bits(x) !== h) bad.push(h);
    }
    expect(bad).toEqual([]);
  });

  it('matches a reference rounding of random float32s', () => {
    const rng = new SeededRng(1);
    for (let i = 0; i < 20000; i++) {
      const x = Math.fround((rng.next() - 0.5) * 2 ** (((rng.next() * 60) | 0) - 30));
      const b = f32Bits(x);
      const lo = b & 0xffff;
      let hi = b >>> 16;
      if (lo > 0x8000 || (lo === 0x8000 && (hi & 1) === 1)) hi++;
      expect(toBf16Bits(x)).toBe(hi & 0xffff);
    }
  });
});

describe('float16', () => {
  it('converts normals, subnormals, overflow and ties', () => {
    expect(toF16Bits(1)).toBe(0x3c00);
    expect(toF16Bits(-2)).toBe(0xc000);
    expect(toF16Bits(65504)).toBe(0x7bff);
    expect(toF16Bits(65520)).toBe(0x7c00); // halfway to 65536: ties to even = infinity
    expect(toF16Bits(65519)).toBe(0x7bff);
    expect(toF16Bits(2 ** -24)).toBe(0x0001);
    expect(toF16Bits(2 ** -25)).toBe(0x0000); // tie: to even (0)
    expect(toF16Bits(3 * 2 ** -25)).toBe(0x0002); // tie between 1 and 2 units: even (2)
    expect(toF16Bits(2 ** -14)).toBe(0x0400);
    expect(toF16Bits(1 + 2 ** -11)).toBe(0x3c00); // tie: even
    expect(toF16Bits(1 + 3 * 2 ** -11)).toBe(0x3c02);
    expect(toF16Bits(-0)).toBe(0x8000);
    expect(toF16Bits(1e-10)).toBe(0);
    expect(Number.isNaN(fromF16Bits(toF16Bits(NaN)))).toBe(true);
  });

  it('every non-NaN fp16 value round-trips, and rounding is nearest', () => {
    const rng = new SeededRng(2);
    const bad: number[] = [];
    for (let h = 0; h < 0x10000; h++) {
      const x = fromF16Bits(h);
      if (!Number.isNaN(x) && toF16Bits(x) !== h) bad.push(h);
    }
    expect(bad).toEqual([]);
    for (let i = 0; i < 20000; i++) {
      const x = Math.fround((rng.next() - 0.5) * 2 ** (((rng.next() * 40) | 0) - 26));
      const r = roundTo('float16', x);
      // No representable fp16 is nearer: check the neighbours.
      const h = toF16Bits(x);
      for (const n of [h - 1, h + 1]) {
        if ((n & 0x7fff) >= 0x7c00 || n < 0 || ((h ^ n) & 0x8000) !== 0) continue;
        expect(Math.abs(fromF16Bits(n) - x)).toBeGreaterThanOrEqual(Math.abs(r - x));
      }
    }
  });
});

describe('element io', () => {
  it('writes and reads every dtype little-endian', () => {
    const m = new Uint8Array(8);
    writeElem(m, 2, 'float32', 1.5);
    expect([...m.subarray(2, 6)]).toEqual([0, 0, 0xc0, 0x3f]);
    expect(readElem(m, 2, 'float32')).toBe(1.5);
    writeElem(m, 0, 'bfloat16', -1);
    expect([m[0], m[1]]).toEqual([0x80, 0xbf]);
    expect(readElem(m, 0, 'bfloat16')).toBe(-1);
    writeElem(m, 6, 'float16', 0.5);
    expect([m[6], m[7]]).toEqual([0x00, 0x38]);
    expect(readElem(m, 6, 'float16')).toBe(0.5);
  });
});

describe('byte tokenizer', () => {
  it('round-trips UTF-8 text with BOS', () => {
    const t = new ByteTokenizer();
    const ids = t.encode('héllo ✓');
    expect(ids[0]).toBe(BOS_TOKEN_ID);
    expect(ids.length).toBe(1 + new TextEncoder().encode('héllo ✓').length);
    expect(t.decode(ids)).toBe('héllo ✓');
    expect(t.decode([104, 257, 105, 258])).toBe('hi');
  });
});

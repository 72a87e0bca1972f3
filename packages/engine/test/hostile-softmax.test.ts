import { createRequire } from 'node:module';
import { describe, expect, it } from 'vitest';
import { softmaxExp } from '../src/model/softmax-exp.js';

const { addon } = createRequire(import.meta.url)('@kvconnect/native') as { addon: { fwdSoftmaxExp: (...a: unknown[]) => void; setForwardIsa(n: string): boolean } };

describe('hostile: fwdSoftmaxExp', () => {
  it('bad arguments throw a typed error and write nothing', () => {
    const y = new Float64Array(8).fill(42);
    const bad: unknown[][] = [[], [new Float64Array(8)], [new Float32Array(8), y], [new Float64Array(9), y], [[1, 2], y], [new Float64Array(8), new Float32Array(16)], [null, y], [new Float64Array(8), y.buffer], [new DataView(new ArrayBuffer(64)), y], [new BigInt64Array(8), y], [new Float64Array(8), new Float64Array(new ArrayBuffer(64 + 8), 8, 7)]];
    for (const a of bad) {
      let e: unknown;
      try { addon.fwdSoftmaxExp(...a); } catch (x) { e = x; }
      expect(e instanceof TypeError || e instanceof RangeError, String(a.map((v) => v?.constructor?.name))).toBe(true);
      expect([...y].every((v) => v === 42)).toBe(true);
    }
    // detached and zero-length are no-ops
    const d = new Float64Array(4); structuredClone(d.buffer, { transfer: [d.buffer] });
    addon.fwdSoftmaxExp(d, d);
    addon.fwdSoftmaxExp(new Float64Array(0), new Float64Array(0));
  });
  it('bit for bit with softmaxExp on special and random-bit inputs, every ISA, all tail lengths', () => {
    const specials = [0, -0, NaN, -NaN, Infinity, -Infinity, 1e-320, -1e-320, 5e-324, -87.33654, -87.33655, -103.97, -103.98, 88.72, 88.73, -(2 ** 22), -(2 ** 23) * 0.6931, -1e10, 1e10, 3.4028235677973366e38, -3.4028235677973366e38, 3.5e38, -3.5e38, Number.MAX_VALUE, -Number.MAX_VALUE];
    const buf = new Float64Array(4096);
    const u = new Uint32Array(buf.buffer);
    let s = 0x9e3779b9;
    for (let i = 0; i < u.length; i++) { s ^= s << 13; s ^= s >>> 17; s ^= s << 5; u[i] = s >>> 0; }
    buf.set(specials);
    for (let i = specials.length; i < 2048; i++) buf[i] = -((i * 0.0371) % 110); // softmax range
    const bad: string[] = [];
    for (const isa of ['generic', 'avx2', 'avx512']) {
      if (!addon.setForwardIsa(isa)) continue;
      for (const n of [1, 3, 7, 9, 17, 33, 4096]) {
        const x = buf.subarray(4096 - n);
        const y = new Float64Array(n);
        addon.fwdSoftmaxExp(x, y);
        for (let i = 0; i < n; i++) {
          const want = softmaxExp(x[i]);
          if (!Object.is(want, y[i]) && !(Number.isNaN(want) && Number.isNaN(y[i]))) bad.push(`${isa} n${n} x=${x[i]} js=${want} native=${y[i]}`);
        }
      }
      const y = new Float64Array(specials.length);
      addon.fwdSoftmaxExp(Float64Array.from(specials), y);
      specials.forEach((v, i) => { const w = softmaxExp(v); if (!Object.is(w, y[i]) && !(Number.isNaN(w) && Number.isNaN(y[i]))) bad.push(`${isa} special x=${v} js=${w} native=${y[i]}`); });
    }
    addon.setForwardIsa('auto');
    expect(bad.slice(0, 20)).toEqual([]);
  });
});

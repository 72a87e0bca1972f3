// The softmax's float32 exponential (packages/engine/src/model/softmax-exp.ts) against V8's
// Math.exp (fdlibm, an independent implementation), and its defined edges. Its native twin is
// tested bit for bit in native-forward.test.ts.
import { describe, expect, it } from 'vitest';
import { softmaxExp } from '../src/model/softmax-exp.js';
import { SeededRng } from '../src/rng.js';

/** The float32 ulp at |v| (normal range). */
const ulp32 = (v: number) => 2 ** (Math.floor(Math.log2(Math.abs(v))) - 23);

describe('softmaxExp', () => {
  it('is within 1.5 float32 ulps of exp(fround(x)) where the result is a normal float32', () => {
    const seed = 5;
    console.log(`softmaxExp accuracy seed ${seed}`);
    const rng = new SeededRng(seed);
    let worst = 0;
    const notF32: number[] = [];
    for (let i = 0; i < 100000; i++) {
      const x = i % 2 ? -rng.next() * 87.3 : (rng.next() - 0.5) * 2;
      const want = Math.exp(Math.fround(x));
      const got = softmaxExp(x);
      if (got !== Math.fround(got)) notF32.push(x);
      worst = Math.max(worst, Math.abs(got - want) / ulp32(want));
    }
    console.log(`worst error ${worst.toFixed(2)} float32 ulps`);
    expect(notF32).toEqual([]); // every result a float32 value
    expect(worst).toBeLessThanOrEqual(1.5);
  });

  it('rounds x to float32 first', () => {
    for (const x of [-0.1, -1.3, -7.77, -50.123456789]) expect(softmaxExp(x)).toBe(softmaxExp(Math.fround(x)));
  });

  it('gives 1 at zero, float32 subnormals near -87.5, 0 below its flush, Infinity past 88.4, NaN for NaN', () => {
    expect(softmaxExp(0)).toBe(1);
    expect(softmaxExp(-0)).toBe(1);
    expect(softmaxExp(-1)).toBe(0.3678794503211975); // fround(e^-1)
    const sub = softmaxExp(-87.5); // e^-87.5 = 1.0e-38 < 2^-126
    expect(sub).toBeGreaterThan(0);
    expect(sub).toBeLessThan(2 ** -126);
    expect(Math.abs(sub - Math.exp(-87.5))).toBeLessThanOrEqual(2 ** -149);
    for (const x of [-88, -100, -745, -1e300, -Infinity]) expect(softmaxExp(x), `x ${x}`).toBe(0);
    expect(softmaxExp(88)).toBeCloseTo(Math.exp(88), -32);
    for (const x of [88.5, 1000, Infinity]) expect(softmaxExp(x), `x ${x}`).toBe(Infinity);
    expect(softmaxExp(NaN)).toBeNaN();
  });
});

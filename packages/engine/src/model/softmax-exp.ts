/**
 * The exponential of the reference model's softmax (worker.ts `softmaxAttend`), computed in float32
 * arithmetic: every operation below is one IEEE float32 operation (`Math.fround` of the float64
 * result, which equals the float32 operation for +, - and * of float32 operands, since float64 has
 * more than 2 * 24 + 2 significant bits), so the native kernels (native/src/forward_kernel.inc
 * `vexp_softmax`, `exp_softmax`) compute the same bits with float32 vectors, eight or sixteen lanes
 * at a time, without the division of fdlibm's float64 `exp` that `Math.exp` uses.
 *
 * Why: `Math.exp` (fdlibm in float64, a division per call) was about a quarter of the native
 * prefill's attention time on the GPU machine's host (bench/README.md, "Forward pass"); a float32
 * exponential, as GPU attention kernels use, runs on full-width float32 vectors while the JS and
 * native paths keep agreeing bit for bit. It changed the demo model's outputs relative to
 * `Math.exp` (every comparison in the repository is against a run of the same code).
 *
 * The algorithm is Cephes `expf` (S. L. Moshier, Cephes Math Library, `cephes/single/expf.c`:
 * Cody-Waite reduction x = n ln 2 + r with ln 2 split as 0.693359375 - 2.12194440e-4, |r| <= ln 2 / 2,
 * then `1 + r + r^2 P(r)` with Moshier's degree-5 P), with n rounded to nearest (ties to even) by
 * adding and subtracting 1.5 * 2^23, and the scaling by 2^n one float32 multiplication (so results
 * below 2^-126 round as float32 subnormals). Accuracy: within 1.5 float32 ulps of exp(fround(x))
 * where the result is a normal float32 (asserted over 100 000 seeded points in
 * packages/engine/test/softmax-exp.test.ts; worst seen 0.93); the rounding of x to float32 first costs up
 * to |x| * 2^-24 of relative error, which only matters where the weight is negligible.
 *
 * Defined for every float64 x: NaN for NaN; 0 where n < -126 (x below about -87.68, and -Infinity);
 * +Infinity where n > 127 (x above about 88.37; the softmax only asks x <= 0).
 * @module
 */

const F = Math.fround;
// float32 constants, written as their exact values (float64 literals equal to float32 values).
const LOG2E = 1.4426950216293335; // fround(log2(e)), 0x3FB8AA3B
const SHIFT = 12582912; // 1.5 * 2^23: t + SHIFT - SHIFT rounds t to an integer, ties to even, for |t| < 2^22
const LN2_HI = 0.693359375; // 0x3F318000: n * LN2_HI is exact for |n| < 2^15
const LN2_LO = -0.00021219444170128554; // fround(-2.12194440e-4)
const P0 = 0.00019875691214110702;
const P1 = 0.001398199936375022;
const P2 = 0.008333452045917511;
const P3 = 0.04166579619050026;
const P4 = 0.1666666567325592;
const P5 = 0.5; // Moshier's 5.0000001201e-1, in float32

/** 2^n for n in [-126, 127] (POW2[n + 126]), each exact. */
const POW2 = (() => {
  const a = new Float64Array(254);
  a[126] = 1;
  for (let i = 127; i < 254; i++) a[i] = a[i - 1] * 2;
  for (let i = 125; i >= 0; i--) a[i] = a[i + 1] / 2;
  return a;
})();

/**
 * e^x in float32 arithmetic (see the module comment); returns a float32 value as a number.
 * @param x any float64; rounded to float32 first.
 */
export function softmaxExp(x: number): number {
  const xf = F(x);
  const t = F(xf * LOG2E);
  const n = F(F(t + SHIFT) - SHIFT);
  if (n !== n) return NaN;
  if (n < -126) return 0;
  if (n > 127) return Infinity;
  let r = F(xf - F(n * LN2_HI));
  r = F(r - F(n * LN2_LO));
  const z = F(r * r);
  let y = P0;
  y = F(F(y * r) + P1);
  y = F(F(y * r) + P2);
  y = F(F(y * r) + P3);
  y = F(F(y * r) + P4);
  y = F(F(y * r) + P5);
  y = F(F(y * z) + r);
  y = F(y + 1);
  return F(y * POW2[n + 126]);
}

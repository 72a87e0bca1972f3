/**
 * The forward pass on the native kernels (src/model/native-forward.ts, native/src/forward_kernel.inc)
 * and on the JavaScript path: each path's logits are invariant bit for bit under TP, PP, block
 * size, layout and chunking; the two paths give the same bits; every instruction set of the
 * kernels gives the same bits; the kernels' exp is Math.exp bit for bit; bad sizes throw.
 * Tests of the native path are skipped, with the reason, where the addon has no forward kernels.
 */
import { createRequire } from 'node:module';
import { afterAll, describe, expect, it } from 'vitest';
import { buildGroupConfigs } from '../src/engine.js';
import { forward } from '../src/executor.js';
import { resolveModel, type PresetName } from '../src/model/config.js';
import { forwardPath, setForwardPath } from '../src/model/native-forward.js';
import { applyRope, buildWeights } from '../src/model/weights.js';
import { softmaxExp } from '../src/model/softmax-exp.js';
import { Worker, type CacheLayout } from '../src/worker.js';
import { argmax } from '../src/request.js';
import { SeededRng } from '../src/rng.js';
import { KV_DTYPE_BYTES, readElem, writeElem, type KvDtype } from '../src/dtype.js';

interface Config {
  tp: number;
  pp: number;
  B: number;
  layout?: CacheLayout;
  chunk?: number;
}

interface FwdAddon {
  fwdExp(x: Float64Array, y: Float64Array): void;
  fwdSoftmaxExp(x: Float64Array, y: Float64Array): void;
  fwdMatmul(w: Float32Array, rows: number, cols: number, x: Float32Array, xStride: number, T: number, y: Float32Array, yStride: number, residual: boolean): void;
  fwdAttend(q: Float32Array, qStride: number, n: number, k: Float32Array, v: Float32Array, hd: number, start: number, window: number, scale: number, out: Float32Array, outStride: number): void;
  fwdRope(x: Float32Array, stride: number, T: number, heads: number, dim: number, cos: Float64Array, sin: Float64Array, tableOffset: number): void;
  fwdKvWrite(mem: Uint8Array, addr: Float64Array, dtype: KvDtype, hd: number, src: Float32Array): void;
  fwdKvRead(mem: Uint8Array, addr: Float64Array, dtype: KvDtype, hd: number, dst: Float32Array): void;
  forwardIsa(): string;
  setForwardIsa(name: string): boolean;
}

const native = setForwardPath('native');
const reason = native ? '' : `native forward kernels unavailable: ${forwardPath().reason}`;
setForwardPath('auto');
const addon = native ? (createRequire(import.meta.url)('@kvconnect/native') as { addon: FwdAddon }).addon : null;
afterAll(() => {
  setForwardPath('auto');
  addon?.setForwardIsa('auto');
});

const PROMPT = Array.from(new TextEncoder().encode('A prompt long enough to span blocks, windows and chunks: 0123456789 abcdefghij.'));

/** Prefill `PROMPT` in chunks, then greedy-decode 3 tokens; logits of each sampled position. */
function run(preset: PresetName, c: Config): Float32Array[] {
  const m = resolveModel(preset);
  const w = buildWeights(m);
  const groups = buildGroupConfigs(m, c.B);
  const numBlocks = 128;
  const workers = Array.from({ length: c.pp }, (_, pp) =>
    Array.from({ length: c.tp }, (_, tp) => new Worker({ model: m, tpRank: tp, tpSize: c.tp, ppRank: pp, ppSize: c.pp, numBlocks, blockSize: c.B, cacheLayout: c.layout ?? { layout: 'NHD', kvLayout: 'kv-first' }, kvDtype: 'bfloat16', groupConfigs: groups })),
  );
  const blocks = groups.map((_, gi) => Array.from({ length: Math.ceil(100 / c.B) }, (_, i) => (numBlocks - 3 - i * 3 - gi + 2 * numBlocks) % numBlocks));
  const tokens = [...PROMPT];
  const out: Float32Array[] = [];
  let done = 0;
  const chunk = c.chunk ?? tokens.length;
  while (out.length < 4) {
    const n = Math.min(chunk, tokens.length - done);
    const last = done + n === tokens.length;
    const l = forward(m, w, workers, [{ requestId: 'r', start: done, tokenIds: tokens.slice(done, done + n), blocks, cacheFilled: done, needLogits: last }]);
    done += n;
    if (last) {
      out.push(l.get('r')!);
      tokens.push(argmax(l.get('r')!));
    }
  }
  return out;
}

const bits = (a: Float32Array[]) => Buffer.concat(a.map((x) => Buffer.from(x.buffer, x.byteOffset, x.byteLength)));

const configs: Config[] = [
  { tp: 2, pp: 1, B: 16, chunk: 9 },
  { tp: 1, pp: 2, B: 4, layout: { layout: 'HND', kvLayout: 'separate' } },
  { tp: 2, pp: 2, B: 8, layout: { layout: 'HND', kvLayout: 'block-kv' }, chunk: 13 },
];
const reference: Config = { tp: 1, pp: 1, B: 16 };

describe('forward paths (logits bit for bit)', () => {
  for (const preset of ['dense-gqa', 'sliding-window'] as const) {
    it(`${preset}, JavaScript path: TP, PP, block size, layout and chunking`, () => {
      setForwardPath('js');
      const ref = bits(run(preset, reference));
      for (const c of configs) expect(bits(run(preset, c)).equals(ref), JSON.stringify(c)).toBe(true);
    });
    it.skipIf(!native)(`${preset}, native path: TP, PP, block size, layout and chunking ${reason}`, () => {
      setForwardPath('native');
      const ref = bits(run(preset, reference));
      for (const c of configs) expect(bits(run(preset, c)).equals(ref), JSON.stringify(c)).toBe(true);
    });
    it.skipIf(!native)(`${preset}: the native path gives the JavaScript path's bits ${reason}`, () => {
      setForwardPath('js');
      const js = bits(run(preset, { tp: 2, pp: 2, B: 8, chunk: 11 }));
      setForwardPath('native');
      expect(bits(run(preset, { tp: 2, pp: 2, B: 8, chunk: 11 })).equals(js)).toBe(true);
    });
  }

  it.skipIf(!native)(`every instruction set of the kernels gives the same bits ${reason}`, () => {
    setForwardPath('native');
    const isas = ['generic', 'avx2', 'avx512'].filter((n) => addon!.setForwardIsa(n));
    const out = isas.map((n) => (addon!.setForwardIsa(n), bits(run('dense-gqa', { tp: 2, pp: 1, B: 8, chunk: 17 }))));
    addon!.setForwardIsa('auto');
    for (let i = 1; i < out.length; i++) expect(out[i].equals(out[0]), isas[i]).toBe(true);
  });
});

describe('native forward kernels', () => {
  it.skipIf(!native)(`fwdExp is Math.exp bit for bit, on every instruction set ${reason}`, () => {
    const seed = 16;
    console.log(`fwdExp property test seed ${seed}`);
    const rng = new SeededRng(seed);
    const edge = [0, -0, 1, -1, 0.5, -0.5, 0.3465, 0.35, 1.03972, 1.04, -1e-9, 1e-9, 2 ** -29, -745.2, -745, -708.5, -709.9, 709.7, 710, 511.9, -512, Infinity, -Infinity, NaN, 5e-324];
    const n = 20000;
    let x = new Float64Array(n + edge.length);
    for (let i = 0; i < n; i++) {
      const r = i % 4;
      x[i] = r === 0 ? -rng.next() * 40 : r === 1 ? (rng.next() - 0.5) * 3 : r === 2 ? (rng.next() - 0.5) * 1500 : (rng.next() - 0.5) * 1e-7;
    }
    x.set(edge, n);
    // Non-positive runs (softmax's exp(s - max) takes its own branch when a whole vector is in
    // (-512, 0]): random magnitudes, and both neighbours of each of fdlibm's |x| thresholds.
    const bits = new BigUint64Array(1);
    const f64 = new Float64Array(bits.buffer);
    const near = (b: bigint) => [-1n, 0n, 1n].map((d) => ((bits[0] = b + d), -f64[0]));
    const thresholds = [0x3fd62e4300000000n, 0x3ff0a2b200000000n, 0x3e30000000000000n, 0x4080000000000000n, 0x3fe62e42fefa39efn];
    const nonpos: number[] = [-0, 0, ...thresholds.flatMap(near)];
    // Dense around each threshold's high word (fdlibm compares only the upper 32 bits).
    for (const t of thresholds) for (let i = 0; i < 4000; i++) nonpos.push(((bits[0] = t + BigInt(Math.floor((rng.next() - 0.5) * 2 ** 34))), -f64[0]));
    for (let k = 2; k < 740; k += 37) nonpos.push(-(k + 0.5) * Math.LN2, -(k + 0.5) * Math.LN2 * (1 + 2 ** -52), -k * Math.LN2);
    for (let i = 0; i < n; i++) {
      const r = i % 4;
      nonpos.push(r === 0 ? -rng.next() * 40 : r === 1 ? -rng.next() * 3 : r === 2 ? -rng.next() * 511.99 : -rng.next() * 1e-7);
    }
    // Mixed signs within (-512, 512) (the MLP's exp(-g) takes another branch): the same values and
    // their negations interleaved, so that every vector holds both signs.
    const mixed = nonpos.flatMap((v, i) => (i % 2 ? [v, -v] : [-v, v])).filter((v) => Math.abs(v) < 512);
    mixed.push(1, -1, 1, 0.5, 1, 2 ** -29, 1, -(2 ** -29));
    x = Float64Array.from([...x, ...nonpos, ...mixed]);
    for (const isa of ['generic', 'avx2', 'avx512']) {
      if (!addon!.setForwardIsa(isa)) continue;
      const y = new Float64Array(x.length);
      addon!.fwdExp(x, y);
      const bad: number[] = [];
      for (let i = 0; i < x.length; i++) if (!Object.is(y[i], Math.exp(x[i]))) bad.push(x[i]);
      expect(bad, isa).toEqual([]);
    }
    addon!.setForwardIsa('auto');
  });

  it.skipIf(!native)(`fwdSoftmaxExp is softmaxExp bit for bit, on every instruction set ${reason}`, () => {
    const seed = 17;
    console.log(`fwdSoftmaxExp property test seed ${seed}`);
    const rng = new SeededRng(seed);
    const xs: number[] = [0, -0, -1, 1, -1e-9, -1e-30, 5e-324, -87.3, -87.5, -87.7, -88, -88.5, -103, -104, -150, -1e6, -1e30, 88, 88.5, 89, 1e30, Infinity, -Infinity, NaN];
    // Ties of the rounding of n (t = x * log2(e) in float32 exactly k + 0.5) and their neighbours,
    // the flush and overflow edges (n = -126 / -127, 127 / 128) and float32 subnormal results.
    const f32 = new Float32Array(1);
    const u32 = new Uint32Array(f32.buffer);
    const nextF = (v: number, d: number) => ((f32[0] = v), (u32[0] += v < 0 ? -d : d), f32[0]);
    for (let k = -130; k <= 130; k++) {
      const x = Math.fround((k + 0.5) / 1.4426950216293335);
      for (let d = -3; d <= 3; d++) xs.push(nextF(x, d));
    }
    for (let i = 0; i < 20000; i++) {
      const r = i % 5;
      xs.push(r === 0 ? -rng.next() * 20 : r === 1 ? -rng.next() * 100 : r === 2 ? -87 - rng.next() * 1.5 : r === 3 ? -rng.next() * 1e-6 : (rng.next() - 0.5) * 200);
    }
    // Lengths that are not a multiple of any vector width run the scalar tail too.
    const x = Float64Array.from(xs.slice(0, xs.length - (xs.length % 8) + 3));
    for (const isa of ['generic', 'avx2', 'avx512']) {
      if (!addon!.setForwardIsa(isa)) continue;
      const y = new Float64Array(x.length);
      addon!.fwdSoftmaxExp(x, y);
      const bad: number[] = [];
      for (let i = 0; i < x.length; i++) if (!Object.is(y[i], softmaxExp(x[i]))) bad.push(x[i]);
      expect(bad, isa).toEqual([]);
    }
    addon!.setForwardIsa('auto');
  });

  it.skipIf(!native)(`fwdAttend, fwdMatmul and fwdRope are their JavaScript loops bit for bit at odd shapes, on every instruction set ${reason}`, () => {
    // The JavaScript each kernel replaces (worker.ts attention + softmaxAttend, weights.ts dotRow and
    // applyRope), written out plainly: shapes the demo model never has (head sizes that are not a
    // whole number of vectors, row counts with tails, windows, decode-sized calls) reach every
    // branch of the kernels.
    const seed = 18;
    console.log(`kernel shapes test seed ${seed}`);
    const rng = new SeededRng(seed);
    const rand = (n: number) => Float32Array.from({ length: n }, () => Math.fround((rng.next() - 0.5) * 4));
    const attendRef = (q: Float32Array, qs: number, n: number, k: Float32Array, v: Float32Array, hd: number, start: number, window: number, scale: number, out: Float32Array, os: number) => {
      for (let j = 0; j < n; j++) {
        const pos = start + j;
        const lo = window > 0 ? Math.max(0, pos - window + 1) : 0;
        const len = pos - lo + 1;
        const sc = new Float64Array(len);
        let mx = -Infinity;
        for (let t = 0; t < len; t++) {
          let a = 0;
          for (let d = 0; d < hd; d++) a += q[j * qs + d] * k[(lo + t) * hd + d];
          sc[t] = a * scale;
          if (sc[t] > mx) mx = sc[t];
        }
        let sum = 0;
        for (let t = 0; t < len; t++) {
          sc[t] = softmaxExp(sc[t] - mx);
          sum += sc[t];
        }
        const o = new Float64Array(hd); // float64 sums, one float32 rounding per element (worker.ts softmaxAttend)
        for (let t = 0; t < len; t++) for (let d = 0; d < hd; d++) o[d] += (sc[t] / sum) * v[(lo + t) * hd + d];
        out.set(o, j * os);
      }
    };
    const attendCases: [number, number, number, number][] = [];
    for (const hd of [16, 12, 20, 8, 3]) for (const [start, n, window] of [[0, 37, 0], [5, 1, 0], [3, 2, 0], [3, 3, 0], [0, 19, 5], [40, 11, 7], [9, 30, 2], [0, 9, 1]]) attendCases.push([hd, start, n, window]);
    const mmCases: [number, number, number][] = [[13, 7, 5], [64, 64, 17], [9, 33, 1], [24, 16, 13], [3, 5, 7], [40, 12, 6]];
    const isas = ['generic', 'avx2', 'avx512'].filter((i) => addon!.setForwardIsa(i));
    for (const isa of isas) {
      addon!.setForwardIsa(isa);
      // Scales past 1/sqrt(hd) spread a row's scores over hundreds to thousands: softmaxExp(s - max)
      // then reaches float32's subnormals and its flush to zero, which the kernels' softmax
      // division (native/src/forward_kernel.inc normalize) keeps on its one-division path.
      for (const [hd, start, n, window] of attendCases) {
        for (const scale of [1 / Math.sqrt(hd), 40, 400]) {
          const qs = hd + 3, os = hd + 5, end = start + n;
          const q = rand(n * qs), k = rand(end * hd), v = rand(end * hd);
          const want = new Float32Array(n * os), got = new Float32Array(n * os);
          attendRef(q, qs, n, k, v, hd, start, window, scale, want, os);
          addon!.fwdAttend(q, qs, n, k, v, hd, start, window, scale, got, os);
          expect(Buffer.from(got.buffer).equals(Buffer.from(want.buffer)), `${isa} attend hd ${hd} start ${start} n ${n} window ${window} scale ${scale}`).toBe(true);
        }
      }
      for (const [rows, cols, T] of mmCases) {
        for (const residual of [false, true]) {
          const xs = cols + 2, ys = rows + 1;
          const w = rand(rows * cols), x = rand(T * xs), y0 = rand(T * ys);
          const want = y0.slice(), got = y0.slice();
          for (let t = 0; t < T; t++) {
            for (let r = 0; r < rows; r++) {
              let a = 0;
              for (let i = 0; i < cols; i++) a += w[r * cols + i] * x[t * xs + i];
              want[t * ys + r] = residual ? Math.fround(want[t * ys + r] + Math.fround(a)) : Math.fround(a);
            }
          }
          addon!.fwdMatmul(w, rows, cols, x, xs, T, got, ys, residual);
          expect(Buffer.from(got.buffer).equals(Buffer.from(want.buffer)), `${isa} matmul ${rows}x${cols} T ${T} residual ${residual}`).toBe(true);
        }
      }
      {
        const heads = 3, dim = 6, T = 5, stride = 20, pos0 = 7, theta = 10000;
        const x = rand(T * stride);
        const want = x.slice(), got = x.slice();
        for (let t = 0; t < T; t++) for (let h = 0; h < heads; h++) applyRope(want, t * stride + h * dim, dim, pos0 + t, theta);
        const half = dim / 2;
        const cos = new Float64Array((pos0 + T) * half), sin = new Float64Array((pos0 + T) * half);
        for (let p = 0; p < pos0 + T; p++) for (let i = 0; i < half; i++) ((cos[p * half + i] = Math.cos(p / Math.pow(theta, (2 * i) / dim))), (sin[p * half + i] = Math.sin(p / Math.pow(theta, (2 * i) / dim))));
        addon!.fwdRope(got, stride, T, heads, dim, cos, sin, pos0 * half);
        expect(Buffer.from(got.buffer).equals(Buffer.from(want.buffer)), `${isa} rope`).toBe(true);
      }
    }
    addon!.setForwardIsa('auto');
  });

  it.skipIf(!native)(`fwdKvWrite / fwdKvRead are dtype.ts writeElem / readElem byte for byte ${reason}`, () => {
    const seed = 17;
    console.log(`fwdKvWrite property test seed ${seed}`);
    const rng = new SeededRng(seed);
    // float32 bit patterns: random, every class (zeros, subnormals, near float16 / bfloat16 rounding
    // ties and overflow, infinities, quiet and signalling NaNs), both signs.
    const pats: number[] = [0, 0x80000000, 1, 0x807fffff, 0x7f7fffff, 0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001, 0xffa00000, 0x477fe000, 0x477ff000, 0x477fefff, 0x38800000, 0x33000000, 0x33000001, 0x337fffff, 0x3f808000, 0x3f818000, 0x3f807fff];
    for (let i = 0; i < 4000; i++) pats.push(Math.floor(rng.next() * 2 ** 32));
    for (let i = 0; i < 2000; i++) pats.push(((Math.floor(rng.next() * 512) << 23) | (Math.floor(rng.next() * 8) << 12) | 0x1000) >>> 0);
    const hd = 4;
    const rows = Math.ceil(pats.length / hd);
    const src = new Float32Array(rows * hd);
    new Uint32Array(src.buffer).set(pats);
    for (const dt of ['float32', 'bfloat16', 'float16'] as const) {
      const eb = KV_DTYPE_BYTES[dt];
      // rows scattered over the region, out of order, with a gap between them
      const addr = Float64Array.from({ length: rows }, (_, i) => ((i * 7919) % rows) * (hd * eb + 3) + 1);
      const size = rows * (hd * eb + 3) + 1;
      const want = new Uint8Array(size);
      for (let i = 0; i < rows; i++) for (let d = 0; d < hd; d++) writeElem(want, addr[i] + d * eb, dt, src[i * hd + d]);
      const got = new Uint8Array(size);
      addon!.fwdKvWrite(got, addr, dt, hd, src);
      expect(Buffer.from(got).equals(Buffer.from(want)), dt).toBe(true);
      // reads: the bytes just written, and for 2-byte types every bit pattern
      const mem = new Uint8Array(Math.max(size, 65536 * 2));
      mem.set(want);
      if (eb === 2) for (let h = 0; h < 65536; h++) ((mem[2 * h] = h & 0xff), (mem[2 * h + 1] = h >> 8));
      const raddr = eb === 2 ? Float64Array.from({ length: 65536 / hd }, (_, i) => i * hd * 2) : addr;
      const dst = new Float32Array(raddr.length * hd);
      addon!.fwdKvRead(mem, raddr, dt, hd, dst);
      const ref = new Float32Array(raddr.length * hd);
      for (let i = 0; i < raddr.length; i++) for (let d = 0; d < hd; d++) ref[i * hd + d] = readElem(mem, raddr[i] + d * eb, dt);
      expect(Buffer.from(dst.buffer).equals(Buffer.from(ref.buffer)), dt).toBe(true);
    }
    // A row past the end, or an address that is not an integer: RangeError, nothing written.
    const mem = new Uint8Array(64);
    expect(() => addon!.fwdKvWrite(mem, Float64Array.from([0, 57]), 'bfloat16', 4, new Float32Array(8).fill(1))).toThrow(RangeError);
    expect(() => addon!.fwdKvWrite(mem, Float64Array.from([0, 1.5]), 'bfloat16', 4, new Float32Array(8).fill(1))).toThrow(RangeError);
    expect(() => addon!.fwdKvWrite(mem, Float64Array.from([-2]), 'bfloat16', 4, new Float32Array(4).fill(1))).toThrow(RangeError);
    expect(() => addon!.fwdKvRead(mem, Float64Array.from([0, 49]), 'float32', 4, new Float32Array(8))).toThrow(RangeError);
    expect(() => addon!.fwdKvWrite(mem, Float64Array.from([0]), 'int8' as KvDtype, 4, new Float32Array(4))).toThrow(RangeError);
    expect(mem.every((b) => b === 0)).toBe(true);
  });

  it.skipIf(!native)(`a size that does not fit its array throws a RangeError and writes nothing ${reason}`, () => {
    const w = new Float32Array(4 * 8).fill(1);
    const x = new Float32Array(3 * 8).fill(1);
    const y = new Float32Array(3 * 4);
    expect(() => addon!.fwdMatmul(w, 4, 8, x, 8, 4, y, 4, false)).toThrow(RangeError);
    expect(() => addon!.fwdMatmul(w, 5, 8, x, 8, 3, y, 4, false)).toThrow(RangeError);
    expect(() => addon!.fwdMatmul(w, 4, 8, x, 8, 3, new Float32Array(11), 4, false)).toThrow(RangeError);
    expect(y.every((v) => v === 0)).toBe(true);
    expect(() => addon!.fwdMatmul(w, 4, 8, new Float64Array(24) as unknown as Float32Array, 8, 3, y, 4, false)).toThrow(TypeError);
    const q = new Float32Array(2 * 16);
    const out = new Float32Array(2 * 16);
    expect(() => addon!.fwdAttend(q, 16, 2, new Float32Array(16 * 4), new Float32Array(16 * 4), 16, 3, 0, 0.25, out, 16)).toThrow(RangeError);
    expect(() => addon!.fwdAttend(q, 16, 2, new Float32Array(16 * 5), new Float32Array(16 * 5), 16, 3, 0, 0.25, out, 8)).toThrow(RangeError);
    addon!.fwdMatmul(w, 4, 8, x, 8, 3, y, 4, false);
    expect([...y]).toEqual(new Array(12).fill(8));
  });
});

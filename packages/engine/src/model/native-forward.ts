/**
 * The forward pass's hot loops in the native addon (`@kvconnect/native`, native/src/forward_kernel.inc):
 * projections, the MLP and attention over the cached context. Where the addon is missing (not
 * built, failed to load, an older build without the kernels) or `KVC_FORWARD=js` is set, the engine
 * keeps its JavaScript forward pass (executor.ts, worker.ts); {@link forwardPath} says which one runs.
 *
 * The kernels compute the same float operations in the same order as the JavaScript
 * (weights.ts `dotRow`: float32 operands, float64 accumulation in index order, one rounding to
 * float32; `softmaxAttend`: two-pass softmax with model/softmax-exp.ts's float32 `exp`, float64 accumulation of the
 * output rounded to float32 once per row), and RoPE angles come from the same `Math.pow` / `Math.cos` / `Math.sin` calls as
 * weights.ts `applyRope`, so each path is invariant under TP, PP and block size, and the two
 * paths agree bit for bit with each other (tested in packages/engine/test/native-forward.test.ts).
 * @module
 */
import { createRequire } from 'node:module';
import type { AttentionPart } from '@kvconnect/checksum';
import type { KvDtype } from '../dtype.js';
import type { ModelConfig } from './config.js';
import type { AttentionWeights, Matrix } from './weights.js';
import type { ForwardSegment } from '../worker.js';
import { partAddress } from '../worker.js';

/** The forward kernels of the addon (declared in native/index.d.ts, `fwd*`). */
export interface ForwardKernels {
  fwdMatmul(w: Float32Array, rows: number, cols: number, x: Float32Array, xStride: number, T: number, y: Float32Array, yStride: number, residual: boolean): void;
  fwdMlp(h: Float32Array, T: number, H: number, norm: Float32Array, gate: Float32Array, up: Float32Array, down: Float32Array, I: number): void;
  fwdAttend(q: Float32Array, qStride: number, n: number, k: Float32Array, v: Float32Array, hd: number, start: number, window: number, scale: number, out: Float32Array, outStride: number): void;
  fwdRope(x: Float32Array, stride: number, T: number, heads: number, dim: number, cos: Float64Array, sin: Float64Array, tableOffset: number): void;
  fwdKvWrite(mem: Uint8Array, addr: Float64Array, dtype: KvDtype, hd: number, src: Float32Array): void;
  fwdKvRead(mem: Uint8Array, addr: Float64Array, dtype: KvDtype, hd: number, dst: Float32Array): void;
  forwardIsa(): string;
}

let loaded: { kernels: ForwardKernels | null; reason: string | null } | undefined;
let chosen: 'auto' | 'js' | 'native' = process.env.KVC_FORWARD === 'js' ? 'js' : 'auto';

function load(): { kernels: ForwardKernels | null; reason: string | null } {
  if (loaded) return loaded;
  try {
    const mod = createRequire(import.meta.url)('@kvconnect/native') as { addon: Partial<ForwardKernels> | null; loadError: Error | null };
    const a = mod.addon;
    if (!a) loaded = { kernels: null, reason: `the addon is not built or failed to load: ${mod.loadError?.message ?? 'no reason given'}` };
    else if ((['fwdMatmul', 'fwdMlp', 'fwdAttend', 'fwdRope', 'fwdKvWrite', 'fwdKvRead'] as const).some((f) => typeof a[f] !== 'function')) loaded = { kernels: null, reason: 'the addon has no forward kernels (rebuild it)' };
    else loaded = { kernels: a as ForwardKernels, reason: null };
  } catch (e) {
    loaded = { kernels: null, reason: `cannot load @kvconnect/native: ${e instanceof Error ? e.message : String(e)}` };
  }
  return loaded;
}

/** The kernels the forward pass uses now, or null for the JavaScript path. */
export function nativeForward(): ForwardKernels | null {
  return chosen === 'js' ? null : load().kernels;
}

/** Which path the forward pass takes now, and why not native when it is `js`. */
export function forwardPath(): { path: 'js' | 'native'; reason: string | null } {
  if (chosen === 'js') return { path: 'js', reason: 'chosen (KVC_FORWARD=js or setForwardPath)' };
  const l = load();
  return l.kernels ? { path: 'native', reason: null } : { path: 'js', reason: l.reason };
}

/**
 * Chooses the path of this process's forward passes (default `auto`: native when the addon has
 * the kernels; `KVC_FORWARD=js` in the environment starts at `js`). Worker processes choose on
 * their own (they inherit the environment). Returns false, changing nothing, for `native` without
 * the kernels.
 */
export function setForwardPath(path: 'auto' | 'js' | 'native'): boolean {
  if (path === 'native' && !load().kernels) return false;
  chosen = path;
  return true;
}

/** `cos` and `sin` of weights.ts applyRope's angles, per (theta, dim): `[pos * dim/2 + i]`. */
const ropeTables = new Map<string, { cos: Float64Array; sin: Float64Array; positions: number }>();

function ropeTable(theta: number, dim: number, positions: number): { cos: Float64Array; sin: Float64Array } {
  const key = `${theta}/${dim}`;
  const have = ropeTables.get(key);
  if (have && have.positions >= positions) return have;
  const n = Math.max(positions, 2 * (have?.positions ?? 0), 64);
  const half = dim / 2;
  const cos = new Float64Array(n * half);
  const sin = new Float64Array(n * half);
  for (let pos = 0; pos < n; pos++) {
    for (let i = 0; i < half; i++) {
      const freq = pos / Math.pow(theta, (2 * i) / dim); // exactly applyRope's angle
      cos[pos * half + i] = Math.cos(freq);
      sin[pos * half + i] = Math.sin(freq);
    }
  }
  const t = { cos, sin, positions: n };
  ropeTables.set(key, t);
  return t;
}

/** weights.ts applyRope on `heads` heads of `T` rows of `x` (row t at position `pos0 + t`), on the kernels. */
function ropeRows(k: ForwardKernels, x: Float32Array, stride: number, T: number, heads: number, dim: number, pos0: number, theta: number): void {
  const { cos, sin } = ropeTable(theta, dim, pos0 + T);
  k.fwdRope(x, stride, T, heads, dim, cos, sin, pos0 * (dim / 2));
}

/**
 * Float32 scratch of {@link attentionNative}, by slot, grown as needed (contents undefined). Its
 * arrays never escape a call and the forward pass is synchronous, so one set serves every call;
 * fresh arrays per layer cost page faults and zeroing comparable to a layer's kernels.
 */
const scratchBufs: Float32Array[] = [];

function scratch(slot: number, n: number): Float32Array {
  let b = scratchBufs[slot];
  if (!b || b.length < n) {
    b = new Float32Array(Math.max(n, 2 * (b?.length ?? 0)));
    scratchBufs[slot] = b;
  }
  return b.subarray(0, n);
}

/** Byte addresses of cache rows for fwdKvWrite / fwdKvRead, as {@link scratch}. */
const addrBufs: Float64Array[] = [];

function addrScratch(slot: number, n: number): Float64Array {
  let b = addrBufs[slot];
  if (!b || b.length < n) {
    b = new Float64Array(Math.max(n, 2 * (b?.length ?? 0)));
    addrBufs[slot] = b;
  }
  return b.subarray(0, n);
}

/** Rows `[r0, r0 + n)` of `w` times `T` rows of `x` (stride `xStride`) into `y` (stride `yStride`). */
export function matmulRows(k: ForwardKernels, w: Matrix, r0: number, n: number, x: Float32Array, xStride: number, T: number, y: Float32Array, yStride: number, residual = false): void {
  k.fwdMatmul(w.data.subarray(r0 * w.cols, (r0 + n) * w.cols), n, w.cols, x, xStride, T, y, yStride, residual);
}

/** What {@link attentionNative} needs of a worker's attention layer (worker.ts `Worker.attention`). */
export interface AttentionLayerContext {
  model: ModelConfig;
  kp: AttentionPart;
  vp: AttentionPart;
  kmem: Uint8Array;
  vmem: Uint8Array;
  dtype: KvDtype;
  eb: number;
  blockSize: number;
  /** KV heads this rank holds, and which shard of them (`global head = shard * local + h`). */
  local: number;
  shard: number;
  /** This rank's query heads `[q0, q0 + nq)`. */
  q0: number;
  nq: number;
  /** Sliding window in tokens, Infinity for full attention. */
  window: number;
  /** KV cache group of the layer (index into `seg.blocks`). */
  group: number;
}

/**
 * worker.ts `Worker.attention` on the native kernels: writes the new tokens' K/V of the rank's KV
 * heads into the cache, reads the context's K/V, and attends for the rank's query heads; same
 * inputs, outputs and cache bytes as the JavaScript body.
 */
export function attentionNative(k: ForwardKernels, c: AttentionLayerContext, w: AttentionWeights, hn: Float32Array, segs: readonly ForwardSegment[], out: Float32Array): void {
  const m = c.model;
  const H = m.hiddenSize;
  const hd = m.headDim;
  const { kp, vp, kmem, vmem, dtype: dt, local, shard, q0, nq } = c;
  const B = c.blockSize;
  const qPerKv = m.numHeads / m.numKvHeads;
  const scale = 1 / Math.sqrt(hd);
  const kvw = local * hd;
  let t0 = 0;
  for (const seg of segs) {
    const n = seg.tokenIds.length;
    const blocks = seg.blocks[c.group];
    const j0 = Math.min(n, Math.max(0, seg.cacheFilled - seg.start));
    if (j0 < n) {
      const nw = n - j0;
      const kn = scratch(0, nw * kvw);
      const vn = scratch(1, nw * kvw);
      const x = hn.subarray((t0 + j0) * H);
      matmulRows(k, w.k, shard * kvw, kvw, x, H, nw, kn, kvw);
      matmulRows(k, w.v, shard * kvw, kvw, x, H, nw, vn, kvw);
      ropeRows(k, kn, kvw, nw, local, hd, seg.start + j0, m.ropeTheta);
      // Row (j - j0) * local + h of kn / vn is token j's head h.
      const ka = addrScratch(0, nw * local);
      const va = addrScratch(1, nw * local);
      for (let j = j0; j < n; j++) {
        const pos = seg.start + j;
        const block = blocks[Math.floor(pos / B)];
        for (let h = 0; h < local; h++) {
          ka[(j - j0) * local + h] = partAddress(kp, B, block, h, pos % B);
          va[(j - j0) * local + h] = partAddress(vp, B, block, h, pos % B);
        }
      }
      k.fwdKvWrite(kmem, ka, dt, hd, kn);
      k.fwdKvWrite(vmem, va, dt, hd, vn);
    }
    const end = seg.start + n;
    const lo0 = Number.isFinite(c.window) ? Math.max(0, seg.start - c.window + 1) : 0;
    const K: Float32Array[] = [];
    const V: Float32Array[] = [];
    const ka = addrScratch(0, end - lo0);
    const va = addrScratch(1, end - lo0);
    for (let h = 0; h < local; h++) {
      // Positions before lo0 are never read (fwdAttend reads [lo0, end)).
      K.push(scratch(3 + 2 * h, end * hd));
      V.push(scratch(4 + 2 * h, end * hd));
      for (let pos = lo0; pos < end; pos++) {
        const block = blocks[Math.floor(pos / B)];
        ka[pos - lo0] = partAddress(kp, B, block, h, pos % B);
        va[pos - lo0] = partAddress(vp, B, block, h, pos % B);
      }
      k.fwdKvRead(kmem, ka, dt, hd, K[h].subarray(lo0 * hd));
      k.fwdKvRead(vmem, va, dt, hd, V[h].subarray(lo0 * hd));
    }
    const qw = nq * hd;
    const q = scratch(2, n * qw);
    matmulRows(k, w.q, q0 * hd, qw, hn.subarray(t0 * H), H, n, q, qw);
    ropeRows(k, q, qw, n, nq, hd, seg.start, m.ropeTheta);
    const ow = m.numHeads * hd;
    for (let qh = q0; qh < q0 + nq; qh++) {
      const hl = Math.floor(qh / qPerKv) - shard * local;
      k.fwdAttend(q.subarray((qh - q0) * hd), qw, n, K[hl], V[hl], hd, seg.start, Number.isFinite(c.window) ? c.window : 0, scale, out.subarray(t0 * ow + qh * hd), ow);
    }
    t0 += n;
  }
}

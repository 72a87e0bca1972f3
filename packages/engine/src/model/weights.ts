/**
 * Seeded weights of the small transformer. Every tensor is generated from its own seed (model seed,
 * layer, tensor), so weights do not depend on TP, PP or what else is built. Matrices are row-major
 * `[out, in]` Float32Arrays.
 * @module
 */
import { SeededRng } from '../rng.js';
import type { LayerType, ModelConfig } from './config.js';

/** A row-major `[rows, cols]` matrix. */
export interface Matrix {
  rows: number;
  cols: number;
  data: Float32Array;
}

/** MLP weights (SwiGLU). */
export interface MlpWeights {
  norm: Float32Array;
  gate: Matrix;
  up: Matrix;
  down: Matrix;
}

/** GQA attention weights: q `[numHeads*headDim, hidden]`, k/v `[numKvHeads*headDim, hidden]`, o `[hidden, numHeads*headDim]`. */
export interface AttentionWeights {
  kind: 'attention' | 'sliding';
  norm: Float32Array;
  q: Matrix;
  k: Matrix;
  v: Matrix;
  o: Matrix;
}

/** MLA weights: queries per head `[nope + rope]`, latent down-projection, RoPE key, up-projections, indexer. */
export interface MlaWeights {
  kind: 'mla';
  norm: Float32Array;
  q: Matrix; // [numHeads*(nope+rope), hidden]
  dkv: Matrix; // [kvLoraRank, hidden]
  kr: Matrix; // [ropeDim, hidden]
  uk: Matrix; // [numHeads*nope, kvLoraRank]
  uv: Matrix; // [numHeads*vDim, kvLoraRank]
  o: Matrix; // [hidden, numHeads*vDim]
  iq: Matrix | null; // [indexerDim, hidden]
  ik: Matrix | null; // [indexerDim, hidden]
}

/** Mamba2 weights; channel order of the conv is `[x, B, C]` (global). */
export interface Mamba2Weights {
  kind: 'mamba2';
  norm: Float32Array;
  z: Matrix; // [inner, hidden]
  x: Matrix; // [inner, hidden]
  b: Matrix; // [nGroups*dState, hidden]
  c: Matrix; // [nGroups*dState, hidden]
  dt: Matrix; // [numHeads, hidden]
  /** Conv taps per global channel `[x | B | C]`, `convKernel - 1` each. */
  convW: Float32Array;
  convB: Float32Array;
  aLog: Float32Array; // [numHeads]
  dtBias: Float32Array; // [numHeads]
  d: Float32Array; // [numHeads]
  out: Matrix; // [hidden, inner]
}

/** One layer: its mixer and its MLP. */
export interface LayerWeights {
  type: LayerType;
  mixer: AttentionWeights | MlaWeights | Mamba2Weights;
  mlp: MlpWeights;
}

/** All weights of a model. */
export interface ModelWeights {
  embed: Matrix; // [vocab, hidden]
  layers: LayerWeights[];
  finalNorm: Float32Array;
  lmHead: Matrix; // [vocab, hidden]
}

function matrix(seed: number, rows: number, cols: number, scale: number): Matrix {
  const rng = new SeededRng(seed);
  const data = new Float32Array(rows * cols);
  for (let i = 0; i < data.length; i++) data[i] = rng.normal() * scale;
  return { rows, cols, data };
}

function vector(seed: number, n: number, mean: number, scale: number): Float32Array {
  const rng = new SeededRng(seed);
  const v = new Float32Array(n);
  for (let i = 0; i < n; i++) v[i] = mean + rng.normal() * scale;
  return v;
}

/** Builds the seeded weights of `m`. */
export function buildWeights(m: ModelConfig): ModelWeights {
  const H = m.hiddenSize;
  const s = (layer: number, k: number) => (m.seed * 7919 + layer * 131 + k * 17 + 1) >>> 0;
  const inv = (n: number) => 1 / Math.sqrt(n);
  const layers: LayerWeights[] = m.layerTypes.map((type, i): LayerWeights => {
    const L = i + 1;
    let mixer: LayerWeights['mixer'];
    if (type === 'attention' || type === 'sliding') {
      mixer = {
        kind: type,
        norm: vector(s(L, 1), H, 1, 0.05),
        q: matrix(s(L, 2), m.numHeads * m.headDim, H, 1.5 * inv(H)),
        k: matrix(s(L, 3), m.numKvHeads * m.headDim, H, 1.5 * inv(H)),
        v: matrix(s(L, 4), m.numKvHeads * m.headDim, H, inv(H)),
        o: matrix(s(L, 5), H, m.numHeads * m.headDim, inv(m.numHeads * m.headDim)),
      };
    } else if (type === 'mla') {
      const c = m.mla!;
      mixer = {
        kind: 'mla',
        norm: vector(s(L, 1), H, 1, 0.05),
        q: matrix(s(L, 2), m.numHeads * (c.nopeDim + c.ropeDim), H, 1.5 * inv(H)),
        dkv: matrix(s(L, 3), c.kvLoraRank, H, inv(H)),
        kr: matrix(s(L, 4), c.ropeDim, H, 1.5 * inv(H)),
        uk: matrix(s(L, 5), m.numHeads * c.nopeDim, c.kvLoraRank, 1.5 * inv(c.kvLoraRank)),
        uv: matrix(s(L, 6), m.numHeads * c.vDim, c.kvLoraRank, inv(c.kvLoraRank)),
        o: matrix(s(L, 7), H, m.numHeads * c.vDim, inv(m.numHeads * c.vDim)),
        iq: c.indexerDim > 0 ? matrix(s(L, 8), c.indexerDim, H, inv(H)) : null,
        ik: c.indexerDim > 0 ? matrix(s(L, 9), c.indexerDim, H, inv(H)) : null,
      };
    } else {
      const mb = m.mamba!;
      const inner = mb.numHeads * mb.headDim;
      const gn = mb.nGroups * mb.dState;
      const convDim = inner + 2 * gn;
      mixer = {
        kind: 'mamba2',
        norm: vector(s(L, 1), H, 1, 0.05),
        z: matrix(s(L, 2), inner, H, inv(H)),
        x: matrix(s(L, 3), inner, H, inv(H)),
        b: matrix(s(L, 4), gn, H, inv(H)),
        c: matrix(s(L, 5), gn, H, inv(H)),
        dt: matrix(s(L, 6), mb.numHeads, H, inv(H)),
        convW: vector(s(L, 7), convDim * (mb.convKernel - 1), 0, 0.5),
        convB: vector(s(L, 8), convDim, 0, 0.1),
        aLog: vector(s(L, 9), mb.numHeads, -0.5, 0.3),
        dtBias: vector(s(L, 10), mb.numHeads, -0.5, 0.2),
        d: vector(s(L, 11), mb.numHeads, 1, 0.1),
        out: matrix(s(L, 12), H, inner, inv(inner)),
      };
    }
    return {
      type,
      mixer,
      mlp: {
        norm: vector(s(L, 20), H, 1, 0.05),
        gate: matrix(s(L, 21), m.intermediateSize, H, inv(H)),
        up: matrix(s(L, 22), m.intermediateSize, H, inv(H)),
        down: matrix(s(L, 23), H, m.intermediateSize, inv(m.intermediateSize)),
      },
    };
  });
  return {
    embed: matrix(s(0, 1), m.vocabSize, H, 1),
    layers,
    finalNorm: vector(s(0, 2), H, 1, 0.05),
    lmHead: matrix(s(0, 3), m.vocabSize, H, 2 * inv(H)),
  };
}

/** Row `r` of `w` dotted with `x[xOff..xOff+cols)`, accumulated in order (deterministic). */
export function dotRow(w: Matrix, r: number, x: Float32Array, xOff = 0): number {
  const c = w.cols;
  const d = w.data;
  let acc = 0;
  const o = r * c;
  for (let i = 0; i < c; i++) acc += d[o + i] * x[xOff + i];
  return Math.fround(acc);
}

/** `y = W x` for every row (output Float32Array of `w.rows`). */
export function matVec(w: Matrix, x: Float32Array, xOff = 0, out?: Float32Array): Float32Array {
  const y = out ?? new Float32Array(w.rows);
  for (let r = 0; r < w.rows; r++) y[r] = dotRow(w, r, x, xOff);
  return y;
}

/** RMSNorm of `x` (length n) with weight `w`, eps 1e-6. */
export function rmsNorm(x: Float32Array, w: Float32Array, xOff = 0, out?: Float32Array): Float32Array {
  const n = w.length;
  let ss = 0;
  for (let i = 0; i < n; i++) ss += x[xOff + i] * x[xOff + i];
  const inv = 1 / Math.sqrt(ss / n + 1e-6);
  const y = out ?? new Float32Array(n);
  for (let i = 0; i < n; i++) y[i] = x[xOff + i] * inv * w[i];
  return y;
}

/** SiLU. */
export function silu(x: number): number {
  return x / (1 + Math.exp(-x));
}

/** Applies rotary embedding in place to `v[off..off+dim)` at token position `pos` (rotate-half pairs i, i+dim/2). */
export function applyRope(v: Float32Array, off: number, dim: number, pos: number, theta: number): void {
  const half = dim / 2;
  for (let i = 0; i < half; i++) {
    const freq = pos / Math.pow(theta, (2 * i) / dim);
    const c = Math.cos(freq);
    const sn = Math.sin(freq);
    const a = v[off + i];
    const b = v[off + i + half];
    v[off + i] = a * c - b * sn;
    v[off + i + half] = a * sn + b * c;
  }
}

/**
 * The model executor: runs a step's forward pass through the PP stages in order and, inside a
 * stage, through its TP workers. Each worker computes its heads/channels of a mixer into a shared
 * buffer in global order (the all-gather); projections after the gather (o_proj, MLP, final norm,
 * LM head) see the whole vector, so no partial sums are reduced and the numerics equal TP 1.
 * @module
 */
import type { ModelConfig } from './model/config.js';
import { dotRow, matVec, rmsNorm, silu, type Mamba2Weights, type MlpWeights, type ModelWeights } from './model/weights.js';
import type { ForwardSegment, Worker } from './worker.js';

/**
 * Forward pass of `segs` over `workers[pp][tp]`. Calls each worker's connector
 * `waitForLayerLoad(name)` before a layer reads its caches and `saveKvLayer(name)` after it wrote them.
 * @returns logits (length vocab) of the last token of every segment with `needLogits`, by request id.
 */
export function forward(m: ModelConfig, w: ModelWeights, workers: readonly (readonly Worker[])[], segs: readonly ForwardSegment[]): Map<string, Float32Array> {
  const H = m.hiddenSize;
  let T = 0;
  for (const s of segs) T += s.tokenIds.length;
  const h = new Float32Array(T * H);
  let t = 0;
  for (const s of segs) {
    for (const id of s.tokenIds) {
      h.set(w.embed.data.subarray(id * H, (id + 1) * H), t * H);
      t++;
    }
  }
  const hn = new Float32Array(T * H);
  const row = new Float32Array(H);
  for (const stage of workers) {
    const [l0, l1] = stage[0].layers;
    for (let li = l0; li < l1; li++) {
      const lw = w.layers[li];
      const mixer = lw.mixer;
      for (let i = 0; i < T; i++) hn.set(rmsNorm(h, mixer.norm, i * H, row), i * H);
      let gathered: Float32Array;
      let proj: { rows: number; cols: number; data: Float32Array };
      if (mixer.kind === 'attention' || mixer.kind === 'sliding') {
        gathered = new Float32Array(T * m.numHeads * m.headDim);
        for (const wk of stage) withLayerHooks(wk, li, () => wk.attention(li, mixer, hn, segs, gathered));
        proj = mixer.o;
      } else if (mixer.kind === 'mla') {
        gathered = new Float32Array(T * m.numHeads * m.mla!.vDim);
        for (const wk of stage) withLayerHooks(wk, li, () => wk.mla(li, mixer, hn, segs, gathered));
        proj = mixer.o;
      } else {
        const mw = mixer as Mamba2Weights;
        const inner = m.mamba!.numHeads * m.mamba!.headDim;
        gathered = new Float32Array(T * inner);
        for (const wk of stage) withLayerHooks(wk, li, () => wk.mamba(li, mw, hn, segs, gathered));
        proj = mw.out;
      }
      for (let i = 0; i < T; i++) {
        for (let r = 0; r < H; r++) h[i * H + r] = Math.fround(h[i * H + r] + dotRow(proj, r, gathered, i * proj.cols));
      }
      mlp(lw.mlp, h, T, H);
    }
  }
  const logits = new Map<string, Float32Array>();
  t = 0;
  for (const s of segs) {
    t += s.tokenIds.length;
    if (!s.needLogits) continue;
    const x = rmsNorm(h, w.finalNorm, (t - 1) * H);
    logits.set(s.requestId, matVec(w.lmHead, x));
  }
  return logits;
}

function withLayerHooks(wk: Worker, li: number, run: () => void): void {
  const names = wk.cacheNames(li);
  const c = wk.connector;
  if (c?.waitForLayerLoad) for (const n of names) c.waitForLayerLoad(n);
  run();
  if (c?.saveKvLayer) for (const n of names) c.saveKvLayer(n);
}

function mlp(w: MlpWeights, h: Float32Array, T: number, H: number): void {
  const I = w.gate.rows;
  const x = new Float32Array(H);
  const a = new Float32Array(I);
  for (let i = 0; i < T; i++) {
    rmsNorm(h, w.norm, i * H, x);
    for (let r = 0; r < I; r++) a[r] = Math.fround(silu(dotRow(w.gate, r, x)) * dotRow(w.up, r, x));
    for (let r = 0; r < H; r++) h[i * H + r] = Math.fround(h[i * H + r] + dotRow(w.down, r, a));
  }
}

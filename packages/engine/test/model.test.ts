/**
 * The model's numerics do not depend on TP, PP, block size, physical layout or prefill chunking:
 * logits are equal bit for bit. And decoding reads the KV cache: a changed cache byte changes them.
 */
import { describe, expect, it } from 'vitest';
import { buildGroupConfigs } from '../src/engine.js';
import { forward } from '../src/executor.js';
import { PRESETS, resolveModel, type ModelConfig, type PresetName } from '../src/model/config.js';
import { buildWeights } from '../src/model/weights.js';
import type { KvDtype } from '../src/dtype.js';
import { Worker, partAddress, type CacheLayout } from '../src/worker.js';
import { argmax } from '../src/request.js';

interface Config {
  tp: number;
  pp: number;
  B: number;
  layout?: CacheLayout;
  chunk?: number;
  dtype?: KvDtype;
}

const PROMPT = Array.from(new TextEncoder().encode('Numerics must not depend on the parallel layout.'));

/** Prefill `PROMPT` in chunks, then greedy-decode `decode` tokens; logits of each sampled position. */
function run(preset: PresetName | ModelConfig, c: Config, decode = 3, corrupt?: (workers: Worker[][], blocks: number[][]) => void): Float32Array[] {
  const m = resolveModel(preset);
  const w = buildWeights(m);
  const groups = buildGroupConfigs(m, c.B);
  const numBlocks = 64;
  const workers = Array.from({ length: c.pp }, (_, pp) =>
    Array.from({ length: c.tp }, (_, tp) => new Worker({ model: m, tpRank: tp, tpSize: c.tp, ppRank: pp, ppSize: c.pp, numBlocks, blockSize: c.B, cacheLayout: c.layout ?? { layout: 'NHD', kvLayout: 'kv-first' }, kvDtype: c.dtype ?? 'bfloat16', groupConfigs: groups })),
  );
  // Non-contiguous block ids, different per group.
  const blocks = groups.map((g, gi) => (g.kind === 'state' ? [numBlocks - 1 - gi] : Array.from({ length: Math.ceil(60 / c.B) }, (_, i) => (numBlocks - 3 - i * 3 - gi + 2 * numBlocks) % numBlocks)));
  const tokens = [...PROMPT];
  const out: Float32Array[] = [];
  let done = 0;
  const chunk = c.chunk ?? tokens.length;
  while (done < tokens.length) {
    const n = Math.min(chunk, tokens.length - done);
    const last = done + n === tokens.length;
    const l = forward(m, w, workers, [{ requestId: 'r', start: done, tokenIds: tokens.slice(done, done + n), blocks, cacheFilled: done, needLogits: last }]);
    done += n;
    if (last) {
      out.push(l.get('r')!);
      if (out.length > decode) break;
      if (out.length === 1 && corrupt) corrupt(workers, blocks);
      tokens.push(argmax(l.get('r')!));
    }
  }
  return out;
}

const same = (a: Float32Array[], b: Float32Array[]) => {
  expect(a.length).toBe(b.length);
  for (let i = 0; i < a.length; i++) expect(Buffer.from(b[i].buffer).equals(Buffer.from(a[i].buffer))).toBe(true);
};

describe('model invariance (logits bit for bit)', () => {
  const configs: Config[] = [
    { tp: 2, pp: 1, B: 16 },
    { tp: 4, pp: 1, B: 8 },
    { tp: 1, pp: 2, B: 32, chunk: 7 },
    { tp: 2, pp: 2, B: 16, layout: { layout: 'HND', kvLayout: 'separate' }, chunk: 13 },
    { tp: 1, pp: 4, B: 4, layout: { layout: 'HND', kvLayout: 'block-kv' } },
    { tp: 1, pp: 3, B: 16, chunk: 5 },
  ];
  for (const preset of ['dense-gqa', 'mla', 'hybrid-mamba2', 'sliding-window'] as const) {
    it(`${preset}: TP, PP, block size, layout and chunking`, () => {
      const ref = run(preset, { tp: 1, pp: 1, B: 16 });
      for (const c of configs) same(ref, run(preset, c));
    });
  }

  it('Mamba2 with n_groups = 2 (B and C sharded at TP 2, replicated at TP 4)', () => {
    const m: ModelConfig = { ...PRESETS['hybrid-mamba2'], name: 'mamba-g2', mamba: { ...PRESETS['hybrid-mamba2'].mamba!, nGroups: 2 } };
    const ref = run(m, { tp: 1, pp: 1, B: 16 });
    same(ref, run(m, { tp: 2, pp: 1, B: 16, chunk: 9 }));
    same(ref, run(m, { tp: 4, pp: 2, B: 8 }));
    expect(Buffer.from(ref[0].buffer).equals(Buffer.from(run('hybrid-mamba2', { tp: 1, pp: 1, B: 16 })[0].buffer))).toBe(false);
  });

  it('the KV dtype changes numerics only through rounding (fp32 != bf16, each invariant)', () => {
    const a = run('dense-gqa', { tp: 1, pp: 1, B: 16, dtype: 'float32' }, 1);
    same(a, run('dense-gqa', { tp: 2, pp: 2, B: 8, dtype: 'float32' }, 1));
    const b = run('dense-gqa', { tp: 1, pp: 1, B: 16, dtype: 'float16' }, 1);
    same(b, run('dense-gqa', { tp: 4, pp: 1, B: 32, dtype: 'float16' }, 1));
    expect(Buffer.from(a[0].buffer).equals(Buffer.from(b[0].buffer))).toBe(false);
  });
});

describe('decoding reads the KV cache', () => {
  it('a flipped exponent bit in a past token K changes the logits', () => {
    const clean = run('dense-gqa', { tp: 1, pp: 1, B: 16 }, 2);
    const bad = run('dense-gqa', { tp: 1, pp: 1, B: 16 }, 2, (ws, blocks) => {
      const wk = ws[0][0];
      const v = wk.groups[0].caches[1];
      if (v.kind !== 'attention') throw new Error('attention view expected');
      const k = v.parts[0];
      wk.regions[k.region][partAddress(k, v.blockSize, blocks[0][0], 0, 3) + 1] ^= 0x40;
    });
    expect(Buffer.from(bad[1].buffer).equals(Buffer.from(clean[1].buffer))).toBe(false);
  });

  it('a changed Mamba SSM state changes the logits', () => {
    const clean = run('hybrid-mamba2', { tp: 2, pp: 1, B: 16 }, 2);
    const bad = run('hybrid-mamba2', { tp: 2, pp: 1, B: 16 }, 2, (ws, blocks) => {
      const wk = ws[0][1];
      const v = wk.groups[1].caches[0];
      if (v.kind !== 'state') throw new Error('state view expected');
      const s = v.states[1];
      wk.regions[s.region][s.offset + blocks[1][0] * s.blockStride + 3] ^= 0x40;
    });
    expect(Buffer.from(bad[1].buffer).equals(Buffer.from(clean[1].buffer))).toBe(false);
  });
});

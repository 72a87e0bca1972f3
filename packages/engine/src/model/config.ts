/**
 * Model configurations of the engine's small transformer, and the named presets tests use.
 * @module
 */
import { BOS_TOKEN_ID, BYTE_VOCAB_SIZE, EOS_TOKEN_ID } from '../tokenizer.js';

/**
 * Kind of one decoder layer:
 * - `attention`: GQA attention with RoPE over the full context (KV cache group "full-attention");
 * - `sliding`: the same over the last `slidingWindow` tokens (group "sliding-window");
 * - `mla`: MLA-style attention over a latent cache (one vector per token, held whole by every TP
 *   rank) plus an indexer key cache (full-attention group);
 * - `mamba2`: a Mamba2-style SSM mixer with conv and SSM states (group "state").
 */
export type LayerType = 'attention' | 'sliding' | 'mla' | 'mamba2';

/** Mamba2-style mixer sizes. The inner size is `numHeads * headDim`. */
export interface Mamba2Config {
  /** SSM heads (sharded over TP). */
  numHeads: number;
  /** Channels per head. */
  headDim: number;
  /** SSM state size N per head. */
  dState: number;
  /** B/C groups; `nGroups = 1` replicates B and C on every TP rank. */
  nGroups: number;
  /** Conv kernel width K; the conv state holds the last K - 1 inputs of each channel. */
  convKernel: number;
}

/** MLA-style attention sizes. */
export interface MlaConfig {
  /** Latent width (kv_lora_rank). */
  kvLoraRank: number;
  /** RoPE key width stored next to the latent. */
  ropeDim: number;
  /** Per-head no-RoPE query/key width. */
  nopeDim: number;
  /** Per-head value width. */
  vDim: number;
  /** Indexer key width; 0 = no indexer cache. */
  indexerDim: number;
}

/** A model of the engine (all sizes in elements). */
export interface ModelConfig {
  name: string;
  vocabSize: number;
  hiddenSize: number;
  /** MLP inner size. */
  intermediateSize: number;
  /** One entry per layer. */
  layerTypes: LayerType[];
  /** Query heads of attention and MLA layers. */
  numHeads: number;
  /** KV heads of attention layers (GQA). */
  numKvHeads: number;
  headDim: number;
  ropeTheta: number;
  /** Window in tokens of `sliding` layers. */
  slidingWindow?: number;
  mamba?: Mamba2Config;
  mla?: MlaConfig;
  /** Weight seed. */
  seed: number;
  bosTokenId: number;
  eosTokenId: number;
}

const base = {
  vocabSize: BYTE_VOCAB_SIZE,
  hiddenSize: 64,
  intermediateSize: 128,
  numHeads: 4,
  numKvHeads: 2,
  headDim: 16,
  ropeTheta: 10000,
  seed: 1234,
  bosTokenId: BOS_TOKEN_ID,
  eosTokenId: EOS_TOKEN_ID,
};

/** Preset names, by what they exercise. */
export type PresetName = 'dense-gqa' | 'mla' | 'hybrid-mamba2' | 'sliding-window';

/** The named presets (small: hidden 64, 4 layers, head dim 16, vocab 259). */
export const PRESETS: Readonly<Record<PresetName, ModelConfig>> = Object.freeze({
  /** Four GQA attention layers, 4 query heads over 2 KV heads. */
  'dense-gqa': { ...base, name: 'dense-gqa', layerTypes: ['attention', 'attention', 'attention', 'attention'] },
  /** Four MLA layers: latent cache (32 + 8 RoPE) and a 16-wide indexer cache per layer. */
  mla: {
    ...base,
    name: 'mla',
    layerTypes: ['mla', 'mla', 'mla', 'mla'],
    mla: { kvLoraRank: 32, ropeDim: 8, nopeDim: 16, vDim: 16, indexerDim: 16 },
  },
  /** Mamba2 / attention / Mamba2 / attention, n_groups = 1 (B and C replicated over TP). */
  'hybrid-mamba2': {
    ...base,
    name: 'hybrid-mamba2',
    layerTypes: ['mamba2', 'attention', 'mamba2', 'attention'],
    mamba: { numHeads: 4, headDim: 16, dState: 8, nGroups: 1, convKernel: 4 },
  },
  /** Full / sliding (window 8) / full / sliding: two attention KV cache groups. */
  'sliding-window': {
    ...base,
    name: 'sliding-window',
    layerTypes: ['attention', 'sliding', 'attention', 'sliding'],
    slidingWindow: 8,
  },
});

/** The config of a preset name, or `config` itself. */
export function resolveModel(model: PresetName | ModelConfig): ModelConfig {
  if (typeof model === 'string') {
    const p = PRESETS[model];
    if (!p) throw new RangeError(`unknown model preset ${JSON.stringify(model)} (known: ${Object.keys(PRESETS).join(', ')})`);
    return structuredClone(p);
  }
  return model;
}

/** Layer name of the attention-like cache of layer `i` (SPEC 4: one all-digit component). */
export function attnLayerName(i: number): string {
  return `model.layers.${i}.self_attn.attn`;
}
/** Layer name of the indexer cache of MLA layer `i`. */
export function indexerLayerName(i: number): string {
  return `model.layers.${i}.self_attn.indexer.k_cache`;
}
/** Layer name of the state cache of Mamba2 layer `i`. */
export function mambaLayerName(i: number): string {
  return `model.layers.${i}.mixer`;
}

/** The layers `[start, end)` of PP stage `ppRank` (vLLM-style even split; earlier stages get the remainder last). */
export function stageLayers(numLayers: number, ppSize: number, ppRank: number): [number, number] {
  const per = Math.floor(numLayers / ppSize);
  const extra = numLayers % ppSize;
  // Later stages take the extra layers (the first stage also embeds).
  const start = ppRank * per + Math.max(0, ppRank - (ppSize - extra));
  const end = start + per + (ppRank >= ppSize - extra ? 1 : 0);
  return [start, end];
}

/**
 * Checks that the model shards over `tpSize` ranks and `ppSize` stages.
 * @throws RangeError naming the first size that does not divide.
 */
export function validateModel(m: ModelConfig, tpSize: number, ppSize: number): void {
  const need = (ok: boolean, msg: string) => {
    if (!ok) throw new RangeError(`${m.name}: ${msg}`);
  };
  need(Number.isInteger(tpSize) && tpSize >= 1, `tpSize ${tpSize}`);
  need(Number.isInteger(ppSize) && ppSize >= 1 && ppSize <= m.layerTypes.length, `ppSize ${ppSize} for ${m.layerTypes.length} layers`);
  need(m.headDim % 2 === 0, 'headDim must be even (RoPE)');
  const hasAttn = m.layerTypes.some((t) => t === 'attention' || t === 'sliding' || t === 'mla');
  if (hasAttn) need(m.numHeads % tpSize === 0, `numHeads ${m.numHeads} not divisible by TP ${tpSize}`);
  if (m.layerTypes.some((t) => t === 'attention' || t === 'sliding')) {
    need(m.numHeads % m.numKvHeads === 0, 'numHeads must be a multiple of numKvHeads');
    need(m.numKvHeads % tpSize === 0 || tpSize % m.numKvHeads === 0, `numKvHeads ${m.numKvHeads} vs TP ${tpSize}`);
  }
  if (m.layerTypes.includes('sliding')) need((m.slidingWindow ?? 0) >= 1, 'sliding layers need slidingWindow');
  if (m.layerTypes.includes('mla')) need(!!m.mla && m.mla.ropeDim % 2 === 0, 'mla layers need an mla config with an even ropeDim');
  if (m.layerTypes.includes('mamba2')) {
    const mb = m.mamba;
    need(!!mb, 'mamba2 layers need a mamba config');
    if (mb) {
      need(mb.numHeads % tpSize === 0, `mamba heads ${mb.numHeads} vs TP ${tpSize}`);
      need(mb.numHeads % mb.nGroups === 0, 'mamba heads must be a multiple of nGroups');
      need(mb.nGroups % tpSize === 0 || tpSize % mb.nGroups === 0, `mamba nGroups ${mb.nGroups} vs TP ${tpSize}`);
      need(mb.convKernel >= 2, 'convKernel >= 2');
    }
  }
}

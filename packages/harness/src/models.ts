/**
 * Model presets of scenarios: the engine's presets plus the toy models of the field cases
 * (`field-cases.md` 0.1), and overrides of their sizes.
 * @module
 */
import { PRESETS, type LayerType, type ModelConfig, type PresetName } from '@kvconnect/engine';
import { Checker, at, isObject } from './validate.js';

const ENGINE_PRESETS = Object.keys(PRESETS) as PresetName[];

const base = PRESETS['dense-gqa'];

/**
 * Field-case toy models (CPU sized). Differences from the document: the engine stores KV in
 * bf16/fp16/fp32 only, so MLA-S uses bf16 instead of fp8_e4m3 with a per-layer scale.
 */
export const HARNESS_PRESETS: Readonly<Record<'GQA-S' | 'MLA-S' | 'HYB-S', ModelConfig>> = Object.freeze({
  /** Dense GQA: 2 layers, 8 query heads over 4 KV heads, head dim 8. */
  'GQA-S': { ...base, name: 'GQA-S', hiddenSize: 64, intermediateSize: 96, numHeads: 8, numKvHeads: 4, headDim: 8, layerTypes: ['attention', 'attention'] },
  /** MLA: 2 layers, latent 16 + RoPE 4 per token (bf16), no indexer. */
  'MLA-S': {
    ...base,
    name: 'MLA-S',
    hiddenSize: 64,
    intermediateSize: 96,
    numHeads: 4,
    numKvHeads: 1,
    headDim: 8,
    layerTypes: ['mla', 'mla'],
    mla: { kvLoraRank: 16, ropeDim: 4, nopeDim: 8, vDim: 8, indexerDim: 0 },
  },
  /** Hybrid: layer 0 attention (2 KV heads, head dim 8), layers 1-2 Mamba2 (4 heads of 4, d_state 4, conv 4, n_groups 2). */
  'HYB-S': {
    ...base,
    name: 'HYB-S',
    hiddenSize: 32,
    intermediateSize: 64,
    numHeads: 4,
    numKvHeads: 2,
    headDim: 8,
    layerTypes: ['attention', 'mamba2', 'mamba2'],
    mamba: { numHeads: 4, headDim: 4, dState: 4, nGroups: 2, convKernel: 4 },
  },
});

/** Every preset name a scenario may use. */
export const MODEL_PRESET_NAMES: readonly string[] = [...Object.keys(HARNESS_PRESETS), ...ENGINE_PRESETS];

/** A scenario's model: a preset name, or a preset with overrides. */
export type ModelSpec = string | { preset: string; overrides?: ModelOverrides };

/** Sizes a scenario may override (`numLayers` repeats the preset's layer pattern). */
export interface ModelOverrides {
  numLayers?: number;
  layerTypes?: LayerType[];
  hiddenSize?: number;
  intermediateSize?: number;
  numHeads?: number;
  numKvHeads?: number;
  headDim?: number;
  slidingWindow?: number;
  seed?: number;
  mamba?: Partial<NonNullable<ModelConfig['mamba']>>;
  mla?: Partial<NonNullable<ModelConfig['mla']>>;
}

const OVERRIDE_KEYS = ['numLayers', 'layerTypes', 'hiddenSize', 'intermediateSize', 'numHeads', 'numKvHeads', 'headDim', 'slidingWindow', 'seed', 'mamba', 'mla'];
const LAYER_TYPES: LayerType[] = ['attention', 'sliding', 'mla', 'mamba2'];

/** Checks a model spec, adding problems to `c`. */
export function checkModel(c: Checker, raw: unknown, path: string): ModelSpec | undefined {
  if (typeof raw === 'string') {
    if (!MODEL_PRESET_NAMES.includes(raw)) return c.fail(path, `unknown model preset ${JSON.stringify(raw)} (known: ${MODEL_PRESET_NAMES.join(', ')})`);
    return raw;
  }
  const o = c.object(raw, path, ['preset', 'overrides']);
  if (!o) return undefined;
  const before = c.problems.length;
  if (c.required(o, 'preset', path)) {
    const p = c.string(o.preset, at(path, 'preset'));
    if (p !== undefined && !MODEL_PRESET_NAMES.includes(p)) c.fail(at(path, 'preset'), `unknown model preset ${JSON.stringify(p)} (known: ${MODEL_PRESET_NAMES.join(', ')})`);
  }
  if (o.overrides !== undefined) {
    const ov = c.object(o.overrides, at(path, 'overrides'), OVERRIDE_KEYS);
    if (ov) {
      const op = at(path, 'overrides');
      for (const k of ['numLayers', 'hiddenSize', 'intermediateSize', 'numHeads', 'numKvHeads', 'headDim', 'slidingWindow']) if (ov[k] !== undefined) c.int(ov[k], at(op, k), { min: 1 });
      if (ov.seed !== undefined) c.int(ov.seed, at(op, 'seed'));
      if (ov.layerTypes !== undefined) {
        if (!Array.isArray(ov.layerTypes) || ov.layerTypes.length === 0) c.fail(at(op, 'layerTypes'), 'expected a non-empty array of layer types');
        else ov.layerTypes.forEach((t, i) => c.oneOf(t, at(at(op, 'layerTypes'), i), LAYER_TYPES));
      }
      for (const k of ['mamba', 'mla'] as const) {
        if (ov[k] === undefined) continue;
        if (!isObject(ov[k])) c.fail(at(op, k), 'expected an object');
        else for (const [kk, v] of Object.entries(ov[k])) c.int(v, at(at(op, k), kk), { min: 0 });
      }
    }
  }
  return c.problems.length === before ? (o as unknown as ModelSpec) : undefined;
}

/** The engine model config of a spec. */
export function resolveModelSpec(spec: ModelSpec): ModelConfig {
  const name = typeof spec === 'string' ? spec : spec.preset;
  const preset = (HARNESS_PRESETS as Record<string, ModelConfig>)[name] ?? (PRESETS as Record<string, ModelConfig>)[name];
  if (!preset) throw new RangeError(`unknown model preset ${JSON.stringify(name)}`);
  const m: ModelConfig = structuredClone(preset);
  if (typeof spec === 'string' || !spec.overrides) return m;
  const o = spec.overrides;
  if (o.layerTypes) m.layerTypes = o.layerTypes.slice();
  if (o.numLayers !== undefined) {
    const pattern = m.layerTypes.slice();
    m.layerTypes = Array.from({ length: o.numLayers }, (_, i) => pattern[i % pattern.length]);
  }
  for (const k of ['hiddenSize', 'intermediateSize', 'numHeads', 'numKvHeads', 'headDim', 'slidingWindow', 'seed'] as const) if (o[k] !== undefined) (m as unknown as Record<string, number>)[k] = o[k]!;
  if (o.mamba) m.mamba = { ...(m.mamba ?? { numHeads: 4, headDim: 4, dState: 4, nGroups: 1, convKernel: 4 }), ...o.mamba };
  if (o.mla) m.mla = { ...(m.mla ?? { kvLoraRank: 16, ropeDim: 4, nopeDim: 8, vDim: 8, indexerDim: 0 }), ...o.mla };
  m.name = `${name}*`;
  return m;
}

/**
 * Deterministic prompt text for scenarios: real words, exact token counts (the engine's byte
 * tokenizer: BOS plus one token per byte).
 * @module
 */
import { prng } from './locate.js';

const WORDS = [
  'the', 'cache', 'of', 'keys', 'and', 'values', 'moves', 'from', 'prefill', 'to', 'decode', 'over', 'a', 'fast', 'link', 'while',
  'every', 'block', 'carries', 'its', 'checksum', 'so', 'that', 'nothing', 'wrong', 'is', 'ever', 'used', 'model', 'layer', 'head',
  'token', 'tensor', 'parallel', 'pipeline', 'stage', 'lease', 'expires', 'mamba', 'state', 'window', 'latent', 'proxy', 'engine',
];

/** Text of `n - 1` ASCII bytes (so a prompt of exactly `n` tokens with BOS), made of words, from `seed`. */
export function promptText(n: number, seed: number): string {
  if (n < 2) throw new RangeError(`a prompt needs at least 2 tokens (BOS and one byte), got ${n}`);
  const r = prng(seed * 2654435761 + 17);
  let s = '';
  while (s.length < n - 1) s += (s ? ' ' : '') + WORDS[r() % WORDS.length];
  s = s.slice(0, n - 1);
  if (s.endsWith(' ')) s = `${s.slice(0, -1)}.`;
  return s;
}

/** `count` prompts of `[min, max]` tokens; a `shared` share starts with one common prefix of `prefixTokens - 1` bytes. */
export function generatedPrompts(o: { count: number; promptTokens?: [number, number]; sharedPrefix?: number; prefixTokens?: number; seed?: number }): string[] {
  const [lo, hi] = o.promptTokens ?? [17, 64];
  const r = prng((o.seed ?? 1) * 7919 + 3);
  const prefix = promptText(o.prefixTokens ?? 32, (o.seed ?? 1) + 100000);
  const out: string[] = [];
  for (let i = 0; i < o.count; i++) {
    const n = lo + (r() % (hi - lo + 1));
    const shared = (r() / 4294967296) < (o.sharedPrefix ?? 0) && n > prefix.length + 2;
    const text = shared ? prefix + promptText(n - prefix.length, (o.seed ?? 1) * 1000 + i) : promptText(n, (o.seed ?? 1) * 1000 + i);
    out.push(text);
  }
  return out;
}

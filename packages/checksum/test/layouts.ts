/**
 * Test utilities: random logical KV (per layer, per global head, per token, one cell of bytes) and
 * writers that lay it into any physical view, so properties can compare layouts, TP splits,
 * block sizes and backends on the same logical data. Independent of the code under test except
 * for the views' documented addressing formula.
 */
import type { AttentionCacheView } from '../src/views.js';

/** A seeded xorshift32 generator. */
export class Rng {
  private s: number;
  constructor(seed: number) {
    this.s = seed >>> 0 || 0x9e3779b9;
  }
  u32(): number {
    let x = this.s;
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    this.s = x;
    return x;
  }
  int(lo: number, hi: number): number {
    return lo + (this.u32() % (hi - lo + 1));
  }
  pick<T>(xs: readonly T[]): T {
    return xs[this.u32() % xs.length];
  }
  fill(b: Uint8Array): Uint8Array {
    for (let i = 0; i < b.length; i++) b[i] = this.u32() & 0xff;
    return b;
  }
}

/** Logical KV of one layer: `cells[token][globalHead]` = cellBytes bytes. */
export interface LogicalLayer {
  name: string;
  heads: number;
  cellBytes: number;
  tokens: number;
  data: Uint8Array; // [tokens, heads, cellBytes]
}

export function randomLayer(rng: Rng, name: string, heads: number, cellBytes: number, tokens: number): LogicalLayer {
  return { name, heads, cellBytes, tokens, data: rng.fill(new Uint8Array(tokens * heads * cellBytes)) };
}

export function cellOf(l: LogicalLayer, token: number, head: number): Uint8Array {
  const at = (token * l.heads + head) * l.cellBytes;
  return l.data.subarray(at, at + l.cellBytes);
}

/**
 * Writes cell bytes into a view's memory by the documented part addressing: byte b of part q for
 * (block, h, t) at offset + block*blockStride + floor(t/kbt)*kbs + (t%kbt)*tokenStride + h*headStride + b.
 */
export function writeCell(view: AttentionCacheView, regions: Uint8Array[], block: number, h: number, t: number, cell: Uint8Array): void {
  let at = 0;
  for (const p of view.parts) {
    const kbt = p.kernelBlockTokens ?? view.blockSize;
    const addr = p.offset + block * p.blockStride + Math.floor(t / kbt) * (p.kernelBlockStride ?? 0) + (t % kbt) * p.tokenStride + h * p.headStride;
    regions[p.region].set(cell.subarray(at, at + p.bytes), addr);
    at += p.bytes;
  }
}

/**
 * Lays the tokens of `layer` for heads [headStart, headStart+localHeads) into `view` with the
 * request's block positions mapped to the given block ids.
 */
export function layTokens(layer: LogicalLayer, view: AttentionCacheView, regions: Uint8Array[], blockIds: number[], headStart: number): void {
  const B = view.blockSize;
  for (let tok = 0; tok < layer.tokens; tok++) {
    const block = blockIds[Math.floor(tok / B)];
    for (let h = 0; h < view.localHeads; h++) writeCell(view, regions, block, h, tok % B, cellOf(layer, tok, headStart + h));
  }
}

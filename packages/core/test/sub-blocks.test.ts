/**
 * Unaligned prefix hits verified with sub-block values (docs/checksum-extensions.md section 1),
 * through the checksum scheduler and workers: producer block sizes that are multiples of the
 * consumer's (consumer/producer 16/32, 16/64, 32/128), a consumer prefix hit at every consumer block
 * boundary, and a fault inside the unaligned part caught. Prints the payload bytes with and without
 * the sub-block values.
 */
import { describe, expect, it } from 'vitest';
import { decodePayloadBase64, type AttentionCacheView } from '@kvconnect/checksum';
import { KV_CHECKSUM_BLOCK_SIZES_PARAM, KV_CHECKSUMS_PARAM } from '../src/checksum-scheduler.js';
import { METRIC_NAMES } from '../src/observability.js';
import { cellAddress, logicalKV, metricValue, runConsumer, runProducer, type FakeWorker, type SideShape } from './fake-pd.js';

interface Pair {
  name: string;
  p: SideShape;
  d: SideShape;
  tokens: number;
}
const PAIRS: Pair[] = [
  { name: '16/32 (TP1 NHD -> TP1 HND)', p: { tp: 1, pp: 1, blockSize: 32, layout: 'NHD', kvLayout: 'kv-first' }, d: { tp: 1, pp: 1, blockSize: 16, layout: 'HND', kvLayout: 'kv-first' }, tokens: 200 },
  { name: '16/64 (TP2 PP2 -> TP1)', p: { tp: 2, pp: 2, blockSize: 64, layout: 'HND', kvLayout: 'block-kv' }, d: { tp: 1, pp: 1, blockSize: 16, layout: 'NHD', kvLayout: 'kv-first' }, tokens: 230 },
  { name: '32/128 (TP1 -> TP2)', p: { tp: 1, pp: 1, blockSize: 128, layout: 'HND', kvLayout: 'kv-first' }, d: { tp: 2, pp: 1, blockSize: 32, layout: 'NHD', kvLayout: 'block-kv' }, tokens: 500 },
];

/** Flips one bit of token `t` of consumer block position `pos` (group 0, layer 1, head 0) on every worker holding it. */
function corrupt(pos: number, t: number) {
  return (workers: FakeWorker[], blocks: number[][]) => {
    for (const w of workers) {
      const c = w.groups[0].caches.find((x) => x.name.includes('layers.1.')) as AttentionCacheView | undefined;
      if (c) w.region[cellAddress(c, blocks[0][pos], 0, t)] ^= 2;
    }
  };
}

function load(pair: Pair, numLocal: number, withSizes: boolean, fault?: ReturnType<typeof corrupt>) {
  const kv = logicalKV(11, pair.tokens);
  const sizes = { [KV_CHECKSUM_BLOCK_SIZES_PARAM]: { 0: pair.d.blockSize, 1: pair.d.blockSize, 2: pair.d.blockSize } };
  const prod = runProducer({ shape: pair.p, kv, carrier: 'kv_transfer_params', ...(withSizes ? { params: sizes } : {}) });
  const cons = runConsumer({ shape: pair.d, kv, carrier: 'kv_transfer_params', params: prod.params, numLocal, corrupt: fault });
  return { prod, cons, bytes: Buffer.from(prod.params![KV_CHECKSUMS_PARAM] as string, 'base64').length };
}

describe.each(PAIRS)('consumer/producer block sizes $name', (pair) => {
  const bd = pair.d.blockSize;
  const bp = pair.p.blockSize;
  const boundaries = Array.from({ length: Math.ceil(pair.tokens / bd) }, (_, h) => h);

  it('every consumer block boundary verifies; unaligned ones through the sub-block values', async () => {
    for (const h of boundaries) {
      const { cons } = load(pair, h * bd, true);
      const v = cons.decision.verdict!;
      expect({ h, verdict: v.verdict, unverified: v.unverified }).toEqual({ h, verdict: 'verified', unverified: [] });
      const unaligned = (h * bd) % bp !== 0;
      // Groups 0 and 1 are attention groups; group 2 (state) has no blocks to align.
      expect({ h, sub: v.subBlockGroups ?? [] }).toEqual({ h, sub: unaligned ? [0, 1] : [] });
      if (unaligned) expect(await metricValue(cons.obs, METRIC_NAMES.subBlockGroups)).toBe(2);
    }
  });

  it('without the consumer block sizes an unaligned hit stays unaligned-prefix (the upstream limitation)', () => {
    for (const h of boundaries) {
      const { cons } = load(pair, h * bd, false);
      const reasons = cons.decision.verdict!.unverified.map((u) => u.reason);
      expect({ h, reasons }).toEqual({ h, reasons: (h * bd) % bp !== 0 ? ['unaligned-prefix', 'unaligned-prefix'] : [] });
    }
  });

  it('sub-block records survive the JSON report form (worker processes)', () => {
    const h = boundaries.find((x) => (x * bd) % bp !== 0)!;
    const kv = logicalKV(11, pair.tokens);
    const prod = runProducer({ shape: pair.p, kv, carrier: 'kv_transfer_params', jsonReports: true, params: { [KV_CHECKSUM_BLOCK_SIZES_PARAM]: { 0: bd, 1: bd } } });
    const cons = runConsumer({ shape: pair.d, kv, carrier: 'kv_transfer_params', params: prod.params, numLocal: h * bd, jsonReports: true });
    expect(cons.decision.verdict).toMatchObject({ verdict: 'verified', subBlockGroups: [0, 1] });
  });

  it('a fault inside the unaligned part is caught at its consumer block', () => {
    for (const h of boundaries) {
      if ((h * bd) % bp === 0) continue;
      // The first loaded consumer block lies inside a producer block that starts before the hit.
      const { cons } = load(pair, h * bd, true, corrupt(h, 5));
      expect({ h, m: cons.decision.verdict?.mismatches }).toEqual({ h, m: [{ groupId: 0, positions: [h] }] });
    }
  });

  it('payload growth is bounded by the block-size ratio (printed)', () => {
    const without = load(pair, 0, false).bytes;
    const withSub = load(pair, 0, true);
    const p = decodePayloadBase64(withSub.prod.params![KV_CHECKSUMS_PARAM] as string);
    expect(p.version).toBe(16);
    const coarse = p.groups.filter((g) => g.groupId !== 2).reduce((n, g) => n + g.values.length, 0);
    const fine = (p.subBlocks ?? []).reduce((n, s) => n + s.values.length, 0);
    expect(fine).toBe(coarse * (bp / bd));
    // Each sub value is 8 bytes plus at most 16 bytes of headers per group: growth <= 8 * fine + 16 * groups + 2.
    expect(withSub.bytes - without).toBeLessThanOrEqual(8 * fine + 16 * (p.subBlocks ?? []).length + 2);
    console.log(`sub-block payload, consumer/producer ${bd}/${bp}, ${pair.tokens} tokens: ${without} -> ${withSub.bytes} bytes (x${(withSub.bytes / without).toFixed(2)}; ${coarse} block values + ${fine} sub-block values)`);
  });
});

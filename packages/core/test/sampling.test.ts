/**
 * Sampled checking through the checksum scheduler and workers (docs/checksum-extensions.md
 * section 2): `kv_checksum_sample_rate` in the config, both sides summing the same keyed subset,
 * the extension payload, the verdict's `sampled`, metrics, and a fault inside and outside the sample.
 */
import { createHmac, createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { decodePayloadBase64, type AttentionCacheView } from '@kvconnect/checksum';
import { parseKVTransferConfig, KVTransferConfigError } from '../src/config.js';
import { KVChecksumSampleError, KVChecksumScheduler, KV_CHECKSUMS_PARAM } from '../src/checksum-scheduler.js';
import { METRIC_NAMES } from '../src/observability.js';
import { cellAddress, config, FakeConnector, groupConfigs, logicalKV, metricValue, runConsumer, runProducer, type FakeWorker, type SideShape } from './fake-pd.js';

const SECRET = 'sampling-test-cluster-secret-0123';
const B = 32;
const TOKENS = 512; // 16 blocks of 32 tokens: spans 0 and 1 of 256 tokens
const side: SideShape = { tp: 1, pp: 1, blockSize: B, layout: 'NHD', kvLayout: 'kv-first' };
const over = (rate: number) => ({ kv_checksum_sample_rate: rate, kv_connector_extra_config: { cluster_secret: SECRET } });

/** Span sampled at rate 0.5, computed from the documented rule (not sampling.ts). */
function spanSampled(prompt: number[], groupId: number, span: number): boolean {
  const ids = Buffer.alloc(4 * prompt.length);
  prompt.forEach((t, i) => ids.writeUInt32LE(t, 4 * i));
  const key = createHash('sha256').update(ids).digest().readBigUInt64LE(0);
  const msg = Buffer.alloc(20);
  msg.writeBigUInt64LE(key, 0);
  msg.writeUInt32LE(groupId, 8);
  msg.writeBigUInt64LE(BigInt(span), 12);
  const h = createHmac('sha256', Buffer.from(SECRET)).update('kvconnect-kv-checksum-sample-v1\0').update(msg).digest().readUInt32BE(0);
  return h < 2 ** 31;
}

/** A prompt whose group-0 span 0 is sampled and span 1 is not (at rate 0.5). */
function promptSplit(): number[] {
  for (let s = 0; ; s++) {
    const p = Array.from({ length: TOKENS }, (_, i) => (i * 7 + s) % 1000);
    if (spanSampled(p, 0, 0) && !spanSampled(p, 0, 1)) return p;
  }
}

function corruptBlock(pos: number) {
  return (workers: FakeWorker[], blocks: number[][]) => {
    for (const w of workers) {
      const c = w.groups[0].caches.find((x) => x.name.includes('layers.1.')) as AttentionCacheView | undefined;
      if (c) w.region[cellAddress(c, blocks[0][pos], 0, 3)] ^= 4;
    }
  };
}

function transfer(rate: number, prompt: number[], corrupt?: ReturnType<typeof corruptBlock>, consumerRate = rate) {
  const kv = logicalKV(7, TOKENS);
  const prod = runProducer({ shape: side, kv, carrier: 'kv_transfer_params', promptTokenIds: prompt, configOver: over(rate) });
  const cons = runConsumer({ shape: side, kv, carrier: 'kv_transfer_params', params: prod.params, promptTokenIds: prompt, corrupt, configOver: over(consumerRate) });
  return { prod, cons };
}

describe('kv_checksum_sample_rate', () => {
  it('is a config key in (0, 1], absent by default', () => {
    const base = { kv_connector: 'X', kv_role: 'kv_consumer' };
    expect(parseKVTransferConfig(base).kv_checksum_sample_rate).toBeUndefined();
    expect(parseKVTransferConfig({ ...base, kv_checksum_sample_rate: 0.25 }).kv_checksum_sample_rate).toBe(0.25);
    for (const bad of [0, 1.5, -1, '0.5', null]) expect(() => parseKVTransferConfig({ ...base, kv_checksum_sample_rate: bad })).toThrow(KVTransferConfigError);
  });

  it('below 1 it needs the cluster secret', () => {
    const mk = (extra: Record<string, unknown>) =>
      new KVChecksumScheduler({ config: config({ kv_checksum_sample_rate: 0.5, kv_connector_extra_config: extra }), connector: new FakeConnector('kv_transfer_params'), tpSize: 1, ppSize: 1, groupConfigs: groupConfigs(B) });
    const env = process.env.KVCONNECT_CLUSTER_SECRET;
    delete process.env.KVCONNECT_CLUSTER_SECRET;
    try {
      expect(() => mk({})).toThrow(KVChecksumSampleError);
      expect(mk({ cluster_secret: SECRET }).enabled).toBe(true);
    } finally {
      if (env !== undefined) process.env.KVCONNECT_CLUSTER_SECRET = env;
    }
  });
});

describe('sampled loads', () => {
  const prompt = promptSplit();

  it('both sides sum the same sample; the payload is the extension payload with the threshold; the verdict says sampled', async () => {
    const { prod, cons } = transfer(0.5, prompt);
    const payload = decodePayloadBase64(prod.params![KV_CHECKSUMS_PARAM] as string);
    expect(payload.version).toBe(16);
    expect(payload.sampleThreshold).toBe(2 ** 31);
    const g0 = payload.groups.find((g) => g.groupId === 0)!;
    // Span 1 (blocks 8..15) is not sampled: the producer summed nothing there.
    expect(Array.from(g0.values.subarray(8)).every((v) => v === 0n)).toBe(true);
    expect(Array.from(g0.values.subarray(0, 8)).every((v) => v !== 0n)).toBe(true);
    const v = cons.decision.verdict!;
    expect(v.verdict).toBe('verified');
    expect(v.sampled?.rate).toBe(0.5);
    expect(v.sampled!.checked).toBeGreaterThanOrEqual(8);
    expect(v.sampled!.skipped).toBeGreaterThanOrEqual(8);
    expect(await metricValue(cons.obs, METRIC_NAMES.sampledBlocks, { outcome: 'checked' })).toBe(v.sampled!.checked);
    expect(await metricValue(cons.obs, METRIC_NAMES.sampledBlocks, { outcome: 'skipped' })).toBe(v.sampled!.skipped);
    expect(cons.logs.find((l) => l.msg === 'KV load verified')?.sampled).toEqual(v.sampled);
  });

  it('sums fewer bytes than rate 1 on both sides', async () => {
    const half = transfer(0.5, prompt);
    const full = transfer(1, prompt);
    for (const [a, b, s] of [[half.prod, full.prod, 'send'], [half.cons, full.cons, 'recv']] as const) {
      const x = await metricValue(a.obs, METRIC_NAMES.bytesSummed, { side: s });
      const y = await metricValue(b.obs, METRIC_NAMES.bytesSummed, { side: s });
      expect(x).toBeGreaterThan(0);
      expect(x).toBeLessThan(y);
    }
    expect(full.cons.decision.verdict?.sampled).toBeUndefined();
  });

  it('a corrupted block in a sampled span is a mismatch; in an unsampled span it is not seen (verified, sampled)', () => {
    const bad = transfer(0.5, prompt, corruptBlock(3));
    expect(bad.cons.decision.verdict?.mismatches).toEqual([{ groupId: 0, positions: [3] }]);
    const missed = transfer(0.5, prompt, corruptBlock(12));
    expect(missed.cons.decision.verdict).toMatchObject({ verdict: 'verified', sampled: { rate: 0.5 } });
    expect(bad.cons.logs.find((l) => l.msg === 'KV load mismatch: recompute' || String(l.msg).startsWith('KV load mismatch'))?.summary).toMatch(/sampled at rate 0\.5 \(\d+ blocks checked, \d+ left out\)/);
    // Rate 1 catches both.
    expect(transfer(1, prompt, corruptBlock(12)).cons.decision.verdict?.mismatches).toEqual([{ groupId: 0, positions: [12] }]);
  });

  it('a producer summing more than the consumer (rate 1 -> 0.5) verifies on the consumer sample only', () => {
    const { prod, cons } = transfer(1, prompt, undefined, 0.5);
    expect(decodePayloadBase64(prod.params![KV_CHECKSUMS_PARAM] as string).version).toBe(2);
    expect(cons.decision.verdict).toMatchObject({ verdict: 'verified', sampled: { rate: 0.5 } });
    expect(transfer(1, prompt, corruptBlock(3), 0.5).cons.decision.verdict?.mismatches).toEqual([{ groupId: 0, positions: [3] }]);
  });

  it('a producer sampling below the consumer rate leaves the load unverified (sample-rate), so a fail-closed consumer never trusts less than it asked for', () => {
    const { cons } = transfer(0.25, prompt, undefined, 0.5);
    expect(cons.decision.verdict?.unverified).toEqual([{ groupId: null, reason: 'sample-rate' }]);
    const noSample = transfer(0.5, prompt, undefined, 1);
    expect(noSample.cons.decision.verdict?.unverified).toEqual([{ groupId: null, reason: 'sample-rate' }]);
  });
});

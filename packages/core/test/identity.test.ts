/**
 * The checksum scheduler with payload version 2 (SPEC 6.1) and identity first (SPEC 8.0): the
 * producer binds its checksums to the prompt, a consumer given another request's params and
 * checksums (that request's KV intact) never verifies, version-1 payloads say identity unchecked,
 * and a load whose transfer failed is a `transfer-failed` outcome with its cause, never a mismatch.
 */
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { decodePayloadBase64, encodePayloadBase64 } from '@kvconnect/checksum';
import { KV_CHECKSUMS_PARAM } from '../src/checksum-scheduler.js';
import { KVChecksumObservability, METRIC_NAMES } from '../src/observability.js';
import { captureLogger, logicalKV, metricValue, runConsumer, runProducer, type SideShape } from './fake-pd.js';

const TOKENS = 40;
const TP2: SideShape = { tp: 2, pp: 1, blockSize: 16, layout: 'NHD', kvLayout: 'kv-first' };
const TP1: SideShape = { tp: 1, pp: 1, blockSize: 16, layout: 'HND', kvLayout: 'kv-first' };
const promptA = Array.from({ length: TOKENS }, (_, i) => 3000 + 11 * i);
const promptB = promptA.map((t, i) => (i === 17 ? t + 1 : t)); // another request, one token apart

/** SPEC 6.1, written from the SPEC text here: SHA-256 over LE uint32 ids, first 8 bytes LE. */
function digestOf(ids: readonly number[]): bigint {
  const b = Buffer.alloc(4 * ids.length);
  ids.forEach((t, i) => b.writeUInt32LE(t, 4 * i));
  return createHash('sha256').update(b).digest().readBigUInt64LE(0);
}

/** Producer of prompt A (TP2), NIXL-pull carrier; its params as a consumer receives them. */
function producerParams(): Record<string, unknown> {
  const prod = runProducer({ shape: TP2, kv: logicalKV(42, TOKENS), carrier: 'kv_transfer_params', promptTokenIds: promptA });
  return { ...prod.params!, do_remote_prefill: true };
}

describe('producer: payload version 2', () => {
  it('binds the checksums to the first numTokens prompt token ids', () => {
    const p = decodePayloadBase64(producerParams()[KV_CHECKSUMS_PARAM] as string);
    expect(p.version).toBe(2);
    expect(p.numTokens).toBe(TOKENS);
    expect(p.tokenDigest).toBe(digestOf(promptA));
  });

  it('sends no payload (encode-error) when the prompt holds fewer tokens than the blocks', async () => {
    const prod = runProducer({ shape: TP1, kv: logicalKV(42, TOKENS), carrier: 'kv_transfer_params', promptTokenIds: promptA.slice(0, 10) });
    expect(prod.params?.[KV_CHECKSUMS_PARAM]).toBeUndefined();
    expect(await metricValue(prod.obs, METRIC_NAMES.payloadsNotSent, { reason: 'encode-error' })).toBe(1);
  });
});

describe('consumer: identity (SPEC 8.0)', () => {
  it('the right request verifies with identity checked', async () => {
    const cons = runConsumer({ shape: TP1, kv: logicalKV(42, TOKENS), carrier: 'kv_transfer_params', params: producerParams(), promptTokenIds: promptA });
    expect(cons.decision).toMatchObject({ action: 'use', verdict: { verdict: 'verified', wrongRequest: false, identity: 'checked' } });
    expect(await metricValue(cons.obs, METRIC_NAMES.identityUnchecked)).toBe(0);
  });

  it('another request given A\'s params while A\'s blocks are intact: mismatch everywhere, wrongRequest, never verified', async () => {
    for (const failClosed of [false, true]) {
      const cons = runConsumer({ shape: TP1, kv: logicalKV(42, TOKENS), carrier: 'kv_transfer_params', params: producerParams(), promptTokenIds: promptB, failClosed });
      expect(cons.decision.action).toBe(failClosed ? 'recompute' : 'use');
      const v = cons.decision.verdict!;
      expect(v).toMatchObject({ verdict: 'mismatch', wrongRequest: true, identity: 'checked', unverified: [] });
      // Every loaded block of every covered group: 3 attention blocks (groups 0, 1), the state block (group 2).
      expect(v.mismatches).toEqual([
        { groupId: 0, positions: [0, 1, 2] },
        { groupId: 1, positions: [0, 1, 2] },
        { groupId: 2, positions: [0] },
      ]);
      expect(await metricValue(cons.obs, METRIC_NAMES.wrongRequest)).toBe(1);
      expect(await metricValue(cons.obs, METRIC_NAMES.loads, { verdict: 'mismatch' })).toBe(1);
      expect(cons.logs.find((l) => String(l.msg).startsWith('KV load belongs to another request'))).toMatchObject({ requestId: 'req-1', level: 50 });
    }
  });

  it('a version-1 payload is checked as before, and logs and counts identity unchecked', async () => {
    const params = producerParams();
    const v2 = decodePayloadBase64(params[KV_CHECKSUMS_PARAM] as string);
    const v1 = encodePayloadBase64({ ...v2, version: 1, tokenDigest: undefined });
    const logs: Array<Record<string, unknown>> = [];
    const obs = new KVChecksumObservability({ logger: captureLogger(logs), level: 'debug' });
    for (const id of ['a', 'b']) {
      const cons = runConsumer({ shape: TP1, kv: logicalKV(42, TOKENS), carrier: 'kv_transfer_params', params: { ...params, [KV_CHECKSUMS_PARAM]: v1 }, promptTokenIds: promptB, obs, requestId: id });
      expect(cons.decision.verdict).toMatchObject({ verdict: 'verified', wrongRequest: false, identity: 'unchecked' });
    }
    expect(await metricValue(obs, METRIC_NAMES.identityUnchecked)).toBe(2);
    expect(logs.filter((l) => String(l.msg).includes('identity unchecked'))).toHaveLength(1); // warned once
    expect(logs.filter((l) => l.msg === 'KV load verified').map((l) => l.identity)).toEqual(['unchecked', 'unchecked']);
  });
});

describe('consumer: a load that failed in transit', () => {
  const loadError = { reason: 'unreachable', message: 'connect ECONNREFUSED 127.0.0.1:5600' };

  it('is transfer-failed with its cause, under the failure policy, fail-open or closed, never a mismatch', async () => {
    for (const [failClosed, policy] of [[false, 'fail'], [true, 'recompute'], [false, 'recompute']] as const) {
      const obs = new KVChecksumObservability({ level: 'silent' });
      const events: string[] = [];
      for (const ev of ['load-transfer-failed', 'load-recomputed', 'load-failed', 'load-mismatch', 'load-unverified', 'load-verified'] as const) obs.events.on(ev, () => events.push(ev));
      const cons = runConsumer({ shape: TP1, kv: logicalKV(42, TOKENS), carrier: 'kv_transfer_params', params: producerParams(), promptTokenIds: promptA, failClosed, policy, obs, loadError });
      expect(cons.decision).toEqual({ action: policy, verdict: null, loadError });
      expect(events).toEqual(['load-transfer-failed', policy === 'fail' ? 'load-failed' : 'load-recomputed']);
      expect(await metricValue(obs, METRIC_NAMES.loads, { verdict: 'transfer-failed' })).toBe(1);
      expect(await metricValue(obs, METRIC_NAMES.loads, { verdict: 'mismatch' })).toBe(0);
      expect(await metricValue(obs, METRIC_NAMES.transferFailed, { reason: 'unreachable' })).toBe(1);
      expect(await metricValue(obs, policy === 'fail' ? METRIC_NAMES.failed : METRIC_NAMES.recomputed)).toBe(1);
      expect(cons.scheduler.pendingCounts()).toEqual({ sends: 0, recvs: 0 });
    }
  });

  it('logs the cause, not a checksum mismatch', () => {
    const cons = runConsumer({ shape: TP1, kv: logicalKV(42, TOKENS), carrier: 'kv_transfer_params', params: producerParams(), promptTokenIds: promptA, loadError });
    expect(cons.logs.find((l) => String(l.msg).startsWith('KV load failed in transit'))).toMatchObject({ requestId: 'req-1', reason: 'unreachable', detail: loadError.message, action: 'recompute' });
    expect(cons.logs.some((l) => l.msg === 'KV checksum mismatch')).toBe(false);
  });
});

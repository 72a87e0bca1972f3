/**
 * The checksum scheduler and workers end to end, without an engine: a fake producer and consumer
 * (checksum views over Uint8Arrays holding the same logical KV), hooks in engine order, one tiny
 * fake connector per carrier.
 */
import { describe, expect, it } from 'vitest';
import { encodePayload, type AttentionCacheView, type StateCacheView } from '@kvconnect/checksum';
import type { KVChecksumCarrier } from '../src/connector.js';
import { KVChecksumCarrierError, KVChecksumScheduler, KV_CHECKSUMS_PARAM } from '../src/checksum-scheduler.js';
import { KVChecksumObservability, METRIC_NAMES } from '../src/observability.js';
import { captureLogger, cellAddress, config, FakeConnector, fp8State, groupConfigs, logicalKV, metricValue, runConsumer, runProducer, type FakeWorker, type SideShape } from './fake-pd.js';

const TOKENS = 40;
const side = (tp: number, pp: number, blockSize: number, layout: 'NHD' | 'HND' = 'NHD', kvLayout: 'kv-first' | 'block-kv' = 'kv-first'): SideShape => ({ tp, pp, blockSize, layout, kvLayout });

/** Producer then consumer; returns the consumer run and the producer's carried payload. */
function transfer(
  carrier: Exclude<KVChecksumCarrier, null>,
  p: SideShape,
  d: SideShape,
  o: Partial<Parameters<typeof runConsumer>[0]> & { producer?: Partial<Parameters<typeof runProducer>[0]> } = {},
) {
  const kv = logicalKV(42, TOKENS);
  const prod = runProducer({ shape: p, kv, carrier, ...o.producer });
  const params = prod.params;
  const payload = prod.payload;
  const cons = runConsumer({
    shape: d,
    kv,
    carrier,
    params: carrier === 'kv_transfer_params' ? params : { do_remote_prefill: true },
    connectorPayloads: carrier === 'connector' ? (o.connectorPayloads ?? [payload]) : undefined,
    ...o,
  });
  return { prod, cons, params, payload };
}

/** Flips one byte of token `t` (within the block), local head 0, of the group-0 layer-1 cache at block position `pos` on every worker holding it. */
function corruptAttention(pos: number, t: number, onlyTp?: number) {
  return (workers: FakeWorker[], blocks: number[][]) => {
    for (const w of workers) {
      if (onlyTp !== undefined && w.tpRank !== onlyTp) continue;
      const c = w.groups[0].caches.find((x) => x.name.includes('layers.1.')) as AttentionCacheView | undefined;
      if (c) w.region[cellAddress(c, blocks[0][pos], 0, t)] ^= 1;
    }
  };
}

const CARRIERS = ['kv_transfer_params', 'connector'] as const;

describe('a correct load verifies', () => {
  const cases: Array<[string, SideShape, SideShape]> = [
    ['TP2 -> TP1', side(2, 1, 16), side(1, 1, 16, 'HND')],
    ['TP1 -> TP2', side(1, 1, 16, 'HND'), side(2, 1, 16, 'NHD', 'block-kv')],
    ['TP2 PP2 -> TP1', side(2, 2, 16), side(1, 1, 16, 'HND')],
    ['TP1 -> TP2 PP2', side(1, 1, 16), side(2, 2, 16, 'HND')],
    ['block 16 -> 32', side(2, 1, 16), side(1, 1, 32, 'HND')],
    ['block 32 -> 16', side(1, 1, 32), side(2, 1, 16)],
  ];
  for (const carrier of CARRIERS) {
    for (const [name, p, d] of cases) {
      it(`${name} (${carrier})`, async () => {
        const { cons, params, payload } = transfer(carrier, p, d);
        if (carrier === 'kv_transfer_params') {
          expect(typeof params?.[KV_CHECKSUMS_PARAM]).toBe('string');
          expect(payload).toBeUndefined();
        } else {
          expect(params?.[KV_CHECKSUMS_PARAM]).toBeUndefined();
          expect(payload).toBeInstanceOf(Uint8Array);
        }
        expect(cons.decision.verdict?.unverified).toEqual([]);
        expect(cons.decision).toMatchObject({ action: 'use', verdict: { verdict: 'verified', mismatches: [] } });
        expect(await metricValue(cons.obs, METRIC_NAMES.loads, { verdict: 'verified' })).toBe(1);
        expect(cons.scheduler.pendingCounts()).toEqual({ sends: 0, recvs: 0 });
      });
    }
  }

  it('verifies reports that travelled as JSON (encodeReport / decodeReport)', () => {
    const { cons } = transfer('kv_transfer_params', side(2, 2, 16), side(2, 1, 32), { jsonReports: true, producer: { jsonReports: true } });
    expect(cons.decision.verdict?.verdict).toBe('verified');
  });
});

describe('which blocks', () => {
  it('a prefix hit verifies only the loaded blocks', () => {
    // The consumer's first block is a local prefix hit holding other bytes: not re-checked.
    const { cons } = transfer('kv_transfer_params', side(2, 1, 16), side(1, 1, 16), { numLocal: 16 });
    expect(cons.decision.verdict?.verdict).toBe('verified');
    expect(new Set(cons.recvStarts)).toEqual(new Set([1]));
  });

  it('a corrupted byte in the local prefix block is not checked; one in a loaded block is', () => {
    const ok = transfer('kv_transfer_params', side(1, 1, 16), side(1, 1, 16), { numLocal: 16, corrupt: corruptAttention(0, 3) });
    expect(ok.cons.decision.verdict?.verdict).toBe('verified');
    const bad = transfer('kv_transfer_params', side(1, 1, 16), side(1, 1, 16), { numLocal: 16, corrupt: corruptAttention(1, 3) });
    expect(bad.cons.decision.verdict?.mismatches).toEqual([{ groupId: 0, positions: [1] }]);
  });

  it('bytes past numTokens in the last block do not count', () => {
    // Token 45 of block 2 (40 tokens, block 16) is not a valid token.
    const { cons } = transfer('kv_transfer_params', side(1, 1, 16), side(2, 1, 16), { corrupt: corruptAttention(2, 45 - 32) });
    expect(cons.decision.verdict?.verdict).toBe('verified');
  });

  it('the state group sums the running-state block (the last of the list), not the others', () => {
    const scratch = (workers: FakeWorker[], blocks: number[][]) => {
      for (const w of workers) {
        const c = w.groups[2].caches[0] as StateCacheView | undefined;
        if (c) w.region[c.states[0].offset + blocks[2][0] * c.states[0].blockStride] ^= 0xff;
      }
    };
    expect(transfer('connector', side(2, 1, 16), side(1, 1, 16), { corrupt: scratch }).cons.decision.verdict?.verdict).toBe('verified');
    const running = (workers: FakeWorker[], blocks: number[][]) => {
      const w = workers[workers.length - 1];
      const c = w.groups[2].caches[0] as StateCacheView;
      w.region[c.states[1].offset + blocks[2][1] * c.states[1].blockStride + 5] ^= 0x10;
    };
    expect(transfer('connector', side(2, 1, 16), side(2, 1, 16), { corrupt: running }).cons.decision.verdict?.mismatches).toEqual([{ groupId: 2, positions: [0] }]);
  });
});

describe('a corrupted load', () => {
  it('fail-open: mismatch is logged (request, group, blocks) and the KV is used', async () => {
    const { cons } = transfer('kv_transfer_params', side(2, 1, 16), side(1, 1, 16), { corrupt: corruptAttention(1, 5) });
    expect(cons.decision.action).toBe('use');
    expect(cons.decision.verdict).toMatchObject({ verdict: 'mismatch', mismatches: [{ groupId: 0, positions: [1] }] });
    const line = cons.logs.find((l) => l.msg === 'KV checksum mismatch');
    expect(line).toMatchObject({ requestId: 'req-1', groupId: 0, blockIds: [cons.blocks[0][1]], positions: [1], reason: 'mismatch', action: 'use', level: 50 });
    expect(await metricValue(cons.obs, METRIC_NAMES.loads, { verdict: 'mismatch' })).toBe(1);
    expect(await metricValue(cons.obs, METRIC_NAMES.failed)).toBe(0);
  });

  it('fail-closed + fail: the request fails', async () => {
    const events: string[] = [];
    const obs = new KVChecksumObservability({ level: 'silent' });
    obs.events.on('load-mismatch', (e) => events.push(`mismatch:${e.requestId}`));
    obs.events.on('load-failed', (e) => events.push(`failed:${e.action}`));
    const { cons } = transfer('connector', side(2, 1, 16), side(2, 1, 32), { corrupt: corruptAttention(1, 1), failClosed: true, policy: 'fail', obs });
    expect(cons.decision).toMatchObject({ action: 'fail', verdict: { verdict: 'mismatch', mismatches: [{ groupId: 0, positions: [1] }] } });
    expect(events).toEqual(['mismatch:req-1', 'failed:fail']);
    expect(await metricValue(cons.obs, METRIC_NAMES.failed)).toBe(1);
  });

  it('fail-closed + recompute: the load is recomputed', async () => {
    const { cons } = transfer('kv_transfer_params', side(1, 1, 32), side(2, 2, 16), { corrupt: corruptAttention(1, 4), failClosed: true, policy: 'recompute' });
    // Consumer block 1 (tokens 16..31) is corrupted; with producer blocks of 32 the whole chunk 0 (blocks 0, 1) is bad.
    expect(cons.decision).toMatchObject({ action: 'recompute', verdict: { verdict: 'mismatch', mismatches: [{ groupId: 0, positions: [0, 1] }] } });
    expect(await metricValue(cons.obs, METRIC_NAMES.recomputed)).toBe(1);
  });

  it('a corrupted replica of a replicated (MLA-like) cache is caught by its replica check', () => {
    const corruptMla = (workers: FakeWorker[], blocks: number[][]) => {
      const w = workers.find((x) => x.tpRank === 1)!;
      const c = w.groups[1].caches[0] as AttentionCacheView;
      w.region[cellAddress(c, blocks[1][0], 0, 2)] ^= 4;
    };
    const { cons } = transfer('kv_transfer_params', side(1, 1, 16), side(2, 1, 16), { corrupt: corruptMla });
    expect(cons.decision.verdict?.mismatches).toEqual([{ groupId: 1, positions: [0] }]);
  });
});

describe('loads that cannot be verified', () => {
  it('no payload: unverified (no-payload); fail-closed recomputes', async () => {
    const kv = logicalKV(42, TOKENS);
    const cons = runConsumer({ shape: side(1, 1, 16), kv, carrier: 'kv_transfer_params', params: { do_remote_prefill: true }, failClosed: true });
    expect(cons.decision).toMatchObject({ action: 'recompute', verdict: { verdict: 'unverified', unverified: [{ groupId: null, reason: 'no-payload' }] } });
    expect(await metricValue(cons.obs, METRIC_NAMES.unverified, { reason: 'no-payload' })).toBe(1);
    const viaConnector = runConsumer({ shape: side(1, 1, 16), kv, carrier: 'connector' });
    expect(viaConnector.decision).toMatchObject({ action: 'use', verdict: { verdict: 'unverified', unverified: [{ reason: 'no-payload' }] } });
  });

  it('malformed payloads: unverified (malformed-payload), never an exception', () => {
    const kv = logicalKV(42, TOKENS);
    const nested = new Uint8Array(100_000).fill(0x91); // deeply nested MessagePack arrays
    const texts: unknown[] = ['not base64!!', 'kwE=', 42, { a: 1 }, Buffer.from(nested).toString('base64'), ''];
    for (const t of texts) {
      const cons = runConsumer({ shape: side(1, 1, 16), kv, carrier: 'kv_transfer_params', params: { do_remote_prefill: true, [KV_CHECKSUMS_PARAM]: t } });
      expect(cons.decision.verdict?.unverified, String(t)).toEqual([{ groupId: null, reason: 'malformed-payload' }]);
    }
    for (const bytes of [nested, new Uint8Array([0x93, 0x01]), new Uint8Array(0)]) {
      const cons = runConsumer({ shape: side(1, 1, 16), kv, carrier: 'connector', connectorPayloads: [bytes], failClosed: true, policy: 'fail' });
      expect(cons.decision).toMatchObject({ action: 'fail', verdict: { unverified: [{ reason: 'malformed-payload' }] } });
    }
  });

  it('a producer missing a worker report sends nothing; the consumer is unverified', async () => {
    const { prod, cons } = transfer('kv_transfer_params', side(2, 1, 16), side(1, 1, 16), { producer: { dropReportOf: 1 } });
    expect(prod.params?.[KV_CHECKSUMS_PARAM]).toBeUndefined();
    expect(await metricValue(prod.obs, METRIC_NAMES.payloadsNotSent, { reason: 'workers-missing' })).toBe(1);
    expect(cons.decision.verdict?.unverified).toEqual([{ groupId: null, reason: 'no-payload' }]);
  });

  it('an aborted producer request sends no checksums and leaves no state', () => {
    const kv = logicalKV(42, TOKENS);
    for (const carrier of CARRIERS) {
      const prod = runProducer({ shape: side(2, 1, 16), kv, carrier, reason: 'abort' });
      expect(prod.params?.[KV_CHECKSUMS_PARAM]).toBeUndefined();
      expect(prod.payload).toBeUndefined();
      expect(prod.scheduler.pendingCounts()).toEqual({ sends: 0, recvs: 0 });
    }
  });

  it('a group skipped on one side only is covered-one-side; on both sides it is ignored', async () => {
    const { decodePayloadBase64 } = await import('@kvconnect/checksum');
    const kv = logicalKV(42, TOKENS);
    const prod = runProducer({ shape: side(2, 1, 16), kv, carrier: 'kv_transfer_params' });
    const one = runConsumer({ shape: side(1, 1, 16), kv, carrier: 'kv_transfer_params', params: prod.params, prepare: fp8State });
    expect(one.decision.verdict?.unverified).toEqual([{ groupId: 2, reason: 'covered-one-side' }]);
    const skipping = runProducer({ shape: side(2, 1, 16), kv, carrier: 'kv_transfer_params', prepare: fp8State });
    expect(decodePayloadBase64(skipping.params![KV_CHECKSUMS_PARAM] as string).groups.map((g) => g.groupId)).toEqual([0, 1]);
    const both = runConsumer({ shape: side(1, 1, 16), kv, carrier: 'kv_transfer_params', params: skipping.params, prepare: fp8State });
    expect(both.decision.verdict).toMatchObject({ verdict: 'verified', unverified: [] });
    const other = runConsumer({ shape: side(1, 1, 16), kv, carrier: 'kv_transfer_params', params: skipping.params });
    expect(other.decision.verdict?.unverified).toEqual([{ groupId: 2, reason: 'covered-one-side' }]);
  });
});

describe('carriers', () => {
  it('connector carrier: the payload goes through sendKvChecksums, the first delivered copy wins', () => {
    const kv = logicalKV(42, TOKENS);
    const prod = runProducer({ shape: side(2, 1, 16), kv, carrier: 'connector' });
    expect(prod.payload).toBeDefined();
    expect(prod.params).toEqual({ do_remote_prefill: true, remote_engine_id: 'P0', remote_request_id: 'req-1' });
    const garbage = new Uint8Array([0xc1]);
    const first = runConsumer({ shape: side(2, 1, 16), kv, carrier: 'connector', connectorPayloads: [prod.payload, garbage] });
    expect(first.decision.verdict?.verdict).toBe('verified');
    const second = runConsumer({ shape: side(2, 1, 16), kv, carrier: 'connector', connectorPayloads: [garbage, prod.payload] });
    expect(second.decision.verdict?.unverified).toEqual([{ groupId: null, reason: 'malformed-payload' }]);
    // A connector copy of a params-carried load is not used.
    const params = runConsumer({ shape: side(2, 1, 16), kv, carrier: 'kv_transfer_params', params: { do_remote_prefill: true }, connectorPayloads: [prod.payload] });
    expect(params.decision.verdict?.unverified).toEqual([{ groupId: null, reason: 'no-payload' }]);
  });

  it('a payload of another request does not verify this one', () => {
    const other = runProducer({ shape: side(1, 1, 16), kv: logicalKV(7, TOKENS), carrier: 'kv_transfer_params' });
    const cons = runConsumer({ shape: side(1, 1, 16), kv: logicalKV(42, TOKENS), carrier: 'kv_transfer_params', params: other.params });
    expect(cons.decision.verdict?.verdict).toBe('mismatch');
  });

  it('kv_transfer_params carrier without returned params: not sent', async () => {
    const kv = logicalKV(42, TOKENS);
    const connector = new FakeConnector('kv_transfer_params');
    connector.requestFinished = () => ({ delayFree: false });
    const prod = runProducer({ shape: side(1, 1, 16), kv, carrier: 'kv_transfer_params', connector });
    expect(prod.params).toBeUndefined();
    expect(await metricValue(prod.obs, METRIC_NAMES.payloadsNotSent, { reason: 'no-params' })).toBe(1);
  });

  it('a connector without a carrier: refused under fail-closed, checksums disabled under fail-open', async () => {
    const none = new FakeConnector(null);
    const args = { connector: none, tpSize: 1, ppSize: 1, groupConfigs: groupConfigs(16) };
    expect(() => new KVChecksumScheduler({ ...args, config: config({ kv_checksum_fail_closed: true }), observability: new KVChecksumObservability({ level: 'silent' }) })).toThrow(KVChecksumCarrierError);
    const logs: Array<Record<string, unknown>> = [];
    const obs = new KVChecksumObservability({ logger: captureLogger(logs) });
    const disabled: string[] = [];
    obs.events.on('checksums-disabled', (e) => disabled.push(e.reason));
    const s = new KVChecksumScheduler({ ...args, config: config({ kv_role: 'kv_both' }), observability: obs });
    expect(s.enabled).toBe(false);
    expect(disabled).toHaveLength(1);
    expect(logs.some((l) => l.level === 40 && String(l.msg).includes('KV checksums are disabled'))).toBe(true);
    const req = { requestId: 'r', promptTokenIds: [1], numComputedTokens: 0, numTokens: 1, kvTransferParams: { do_remote_decode: true } };
    s.onPromptComplete(req, [[0], [0], [0]], 1);
    s.onLoadScheduled(req, [[0], [0], [0]], 0, 1);
    expect(s.buildStepMeta()).toBeNull();
    expect(s.onLoadFinished(req)).toEqual({ action: 'use', verdict: null });
    // Checksums off in the config: enabled false, no probe needed.
    expect(new KVChecksumScheduler({ ...args, config: config({ enable_kv_checksum: false, kv_checksum_fail_closed: true }) }).enabled).toBe(false);
  });

  it('a load whose connector has no carrier for that request is not checksummed', () => {
    const kv = logicalKV(42, TOKENS);
    const connector = new FakeConnector('kv_transfer_params');
    const obs = new KVChecksumObservability({ level: 'silent' });
    const s = new KVChecksumScheduler({ config: config({ kv_role: 'kv_consumer', kv_checksum_fail_closed: true }), connector, tpSize: 1, ppSize: 1, groupConfigs: groupConfigs(16), observability: obs });
    connector.carrier = null;
    const req = { requestId: 'r', promptTokenIds: [], numComputedTokens: 0, numTokens: kv.tokens };
    s.onLoadScheduled(req, [[0, 1, 2], [3, 4, 5], [0]], 0, kv.tokens);
    expect(s.buildStepMeta()).toBeNull();
    expect(s.onLoadFinished(req)).toEqual({ action: 'use', verdict: null });
  });
});

describe('metrics and state', () => {
  it('counts bytes summed, compute time and payloads sent', async () => {
    const { prod, cons } = transfer('kv_transfer_params', side(2, 1, 16), side(1, 1, 16));
    // Producer, replica 0 only: 2 layers x 4 heads x 16 bytes + the MLA vector once (rank 0) per token, plus the state rows.
    const attn = TOKENS * (2 * 4 * 16 + 16);
    const state = 8 * 3 * 2 + 4 * 4 * 4;
    expect(await metricValue(prod.obs, METRIC_NAMES.bytesSummed, { side: 'send' })).toBe(attn + state);
    // Consumer TP1: the same bytes.
    expect(await metricValue(cons.obs, METRIC_NAMES.bytesSummed, { side: 'recv' })).toBe(attn + state);
    expect(await metricValue(prod.obs, METRIC_NAMES.payloadsSent, { carrier: 'kv_transfer_params' })).toBe(1);
    const hist = await prod.obs.registry.getSingleMetric(METRIC_NAMES.seconds)!.get();
    expect(hist.values.find((v) => (v as { metricName?: string }).metricName === `${METRIC_NAMES.seconds}_count` && v.labels.side === 'send')?.value).toBe(2);
    expect(await prod.obs.registry.metrics()).toContain('kvconnect_kv_checksum_loads_total');
  });

  it('metrics live on a registry per engine, not the global one', async () => {
    const a = new KVChecksumObservability({ level: 'silent' });
    const b = new KVChecksumObservability({ level: 'silent' });
    a.metrics.failed.inc();
    expect(await metricValue(a, METRIC_NAMES.failed)).toBe(1);
    expect(await metricValue(b, METRIC_NAMES.failed)).toBe(0);
    const { register } = await import('prom-client');
    expect(register.getSingleMetric(METRIC_NAMES.failed)).toBeUndefined();
  });

  it('an aborted load is dropped from the workers at the next step', () => {
    const kv = logicalKV(42, TOKENS);
    const s = new KVChecksumScheduler({ config: config({ kv_role: 'kv_consumer' }), connector: new FakeConnector('kv_transfer_params'), tpSize: 1, ppSize: 1, groupConfigs: groupConfigs(16), observability: new KVChecksumObservability({ level: 'silent' }) });
    const cons = runConsumer({ shape: side(1, 1, 16), kv, carrier: 'kv_transfer_params' });
    const w = cons.workers[0].hooks;
    const req = { requestId: 'gone', promptTokenIds: [], numComputedTokens: 0, numTokens: kv.tokens };
    s.onLoadScheduled(req, [[0, 1, 2], [3, 4, 5], [0, 1]], 0, kv.tokens);
    w.bindStepMeta(s.buildStepMeta());
    expect(w.pendingLoads()).toEqual(['gone']);
    s.onRequestFinished(req, { delayFree: false }, 'abort');
    expect(s.pendingCounts()).toEqual({ sends: 0, recvs: 0 });
    w.bindStepMeta(s.buildStepMeta());
    expect(w.pendingLoads()).toEqual([]);
    expect(s.buildStepMeta()).toBeNull();
  });

  it('the payload carries numTokens, the producer TP size and every covered group', async () => {
    const { decodePayloadBase64 } = await import('@kvconnect/checksum');
    const prod = runProducer({ shape: side(2, 2, 16), kv: logicalKV(42, TOKENS), carrier: 'kv_transfer_params' });
    const p = decodePayloadBase64(prod.params![KV_CHECKSUMS_PARAM] as string);
    expect(p.numTokens).toBe(TOKENS);
    expect(p.producerTpSize).toBe(2);
    expect(p.groups.map((g) => [g.groupId, g.blockSize, g.start, g.values.length])).toEqual([
      [0, 16, 0, 3],
      [1, 16, 0, 3],
      [2, 16, 0, 1],
    ]);
    expect(encodePayload(p)).toEqual(new Uint8Array(Buffer.from(prod.params![KV_CHECKSUMS_PARAM] as string, 'base64')));
  });
});

describe('replicas', () => {
  it('a producer worker reports replica 0 only; a consumer worker every replica it holds', () => {
    const kv = logicalKV(42, TOKENS);
    const prod = runProducer({ shape: side(2, 1, 16), kv, carrier: 'kv_transfer_params' });
    expect(prod.params?.[KV_CHECKSUMS_PARAM]).toBeDefined();
    // Sum again on fresh workers to look at the reports themselves.
    const s = new KVChecksumScheduler({ config: config({ kv_role: 'kv_both' }), connector: new FakeConnector('kv_transfer_params'), tpSize: 2, ppSize: 1, groupConfigs: groupConfigs(16), observability: new KVChecksumObservability({ level: 'silent' }) });
    const req = { requestId: 'x', promptTokenIds: [], numComputedTokens: 0, numTokens: TOKENS, kvTransferParams: { do_remote_decode: true } };
    const blocks = [[0, 1, 2], [3, 4, 5], [1, 2]];
    s.onPromptComplete(req, blocks, TOKENS);
    s.onLoadScheduled({ ...req, requestId: 'y', kvTransferParams: {} }, blocks, 0, TOKENS);
    const meta = s.buildStepMeta();
    const keys = prod.workers.map((w) => {
      w.hooks.bindStepMeta(meta);
      w.hooks.afterForward();
      w.hooks.afterTransferResults({ finishedSending: new Set(), finishedRecving: new Set(['y']), invalidBlockIds: new Set(), kvChecksums: new Map() });
      const r = w.hooks.takeReport()!;
      const mla = (e: { groups: Array<{ groupId: number; partials: Map<string, BigUint64Array> }> }) => [...e.groups.find((g) => g.groupId === 1)!.partials.keys()];
      return { tp: w.tpRank, send: mla(r.sends[0]), recv: mla(r.recvs[0]) };
    });
    expect(keys).toEqual([
      { tp: 0, send: ['2:0'], recv: ['2:0'] },
      { tp: 1, send: [], recv: ['2:1'] },
    ]);
  });
});

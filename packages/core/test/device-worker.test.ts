/**
 * KVChecksumWorker and KVChecksumScheduler on device KV (emulated device, no GPU): the worker makes
 * one submit per side per step, announces the requests in its report's `inFlight` and reports the
 * records in the later step whose `takeReport` polled them done, equal to a host worker's; a
 * refused submit reports the request skipped at once; the scheduler's `sumsInFlight` holds while
 * announced sums are missing, ends when they arrive, and gives up after its deadline; the report's
 * `inFlight` survives the JSON form.
 */
import { describe, expect, it } from 'vitest';
import { EmulatedDevice, pagedAttentionBytes, pagedAttentionCache, type GroupSpec } from '@kvconnect/checksum';
import { KVChecksumWorker } from '../src/checksum-worker.js';
import { KVChecksumScheduler } from '../src/checksum-scheduler.js';
import { decodeReport, encodeReport, ReportFormatError, type ChecksumStepMeta, type KVChecksumReport } from '../src/checksum-report.js';
import type { KVConnectorScheduler, KVTransferConfig, WorkerKVCaches } from '../src/connector.js';
import { KVChecksumObservability } from '../src/observability.js';

const geometry = { dtype: 'bfloat16', numBlocks: 16, blockSize: 16, numHeads: 2, headSize: 16, kvLayout: 'kv-first' } as const;

function hostCaches(): WorkerKVCaches {
  const bytes = new Uint8Array(pagedAttentionBytes(geometry));
  for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 131 + 7) & 0xff; // fixed, non-trivial KV
  const groups: GroupSpec[] = [{ groupId: 0, caches: [pagedAttentionCache({ name: 'model.layers.0.self_attn.attn', ...geometry, layout: 'NHD', at: { region: 0 } })] }];
  return { rank: { tpRank: 0, tpSize: 1 }, ppRank: 0, ppSize: 1, regions: [bytes], groups, groupConfigs: [{ groupId: 0, kind: 'full-attention', blockSize: 16, layerNames: ['model.layers.0.self_attn.attn'] }] };
}

const META: ChecksumStepMeta = { send: [{ requestId: 'r1', numTokens: 40, groups: [{ groupId: 0, start: 0, blockIds: [3, 7, 1] }] }], recv: [], drop: [] };

function deviceWorker(dev: EmulatedDevice, caches = hostCaches()): KVChecksumWorker {
  const w = new KVChecksumWorker({ backend: dev });
  w.registerKvCaches({ ...caches, regions: caches.regions.map((r) => dev.expose(r as Uint8Array)) });
  return w;
}

describe('KVChecksumWorker on device KV', () => {
  it('announces the sums in flight, reports them when polled done, equal to a host worker', () => {
    const caches = hostCaches();
    const host = new KVChecksumWorker({ backend: 'ts' });
    host.registerKvCaches(caches);
    host.bindStepMeta(META);
    host.afterForward();
    const expected = host.takeReport()!.sends;

    const dev = new EmulatedDevice({ completeAfterPolls: 3 });
    const w = deviceWorker(dev, caches);
    w.bindStepMeta(META);
    w.afterForward();
    const first = w.takeReport()!;
    expect(first.sends).toEqual([]);
    expect(first.inFlight).toEqual({ sends: ['r1'], recvs: [] });
    expect(w.stepsInFlight).toBe(1);
    w.bindStepMeta(null);
    expect(w.takeReport()).toBeNull(); // second poll: still pending
    w.bindStepMeta(null);
    const later = w.takeReport()!;
    expect(later.inFlight).toBeUndefined();
    expect(later.sends).toEqual(expected);
    expect(first.bytes.send).toBe(0); // device bytes count when the sums arrive
    expect(later.bytes.send).toBe(40 * 2 * 2 * 16 * 2); // 40 tokens x 2 heads x (K + V) x 16 bf16 x 2 bytes
    expect(w.stepsInFlight).toBe(0);
    expect(dev.submits).toBe(1);
    expect(dev.syncCalls).toBe(0);
  });

  it('a refused submit (block id out of range) reports the request skipped at once', () => {
    const errors: string[][] = [];
    const dev = new EmulatedDevice();
    const w = new KVChecksumWorker({ backend: dev, onError: (_e, ids) => errors.push(ids) });
    const caches = hostCaches();
    w.registerKvCaches({ ...caches, regions: caches.regions.map((r) => dev.expose(r as Uint8Array)) });
    w.bindStepMeta({ ...META, send: [...META.send, { requestId: 'bad', numTokens: 16, groups: [{ groupId: 0, start: 0, blockIds: [99] }] }] });
    w.afterForward();
    const r = w.takeReport()!;
    expect(errors).toEqual([['bad']]);
    expect(r.sends.map((e) => [e.requestId, e.groups[0].skipReason])).toEqual([['bad', 'compute-error']]);
    expect(r.inFlight?.sends).toEqual(['r1']);
  });
});

describe('KVChecksumScheduler.sumsInFlight', () => {
  const config: KVTransferConfig = { kv_connector: 'X', kv_role: 'kv_producer', enable_kv_checksum: true, kv_checksum_fail_closed: false, kv_load_failure_policy: 'recompute', kv_connector_extra_config: {} };
  const connector = { kvChecksumCarrier: () => 'kv_transfer_params' } as unknown as KVConnectorScheduler;
  const request = { requestId: 'r1', promptTokenIds: [], numComputedTokens: 0, numTokens: 40 };
  const report = (over: Partial<KVChecksumReport>): KVChecksumReport => ({ ppRank: 0, tpRank: 0, sends: [], recvs: [], received: [], seconds: { send: 0, recv: 0 }, bytes: { send: 0, recv: 0 }, ...over });
  const out = (r: KVChecksumReport) => ({ ppRank: 0, tpRank: 0, finishedSending: new Set<string>(), finishedRecving: new Set<string>(), invalidBlockIds: new Set<number>(), kvChecksums: new Map(), kvChecksumReport: r });

  function scheduler(timeout: number): KVChecksumScheduler {
    const s = new KVChecksumScheduler({ config, connector, tpSize: 1, ppSize: 1, groupConfigs: hostCaches().groupConfigs, observability: new KVChecksumObservability({ level: 'silent' }), inFlightTimeoutMs: timeout });
    s.onPromptComplete(request, [[3, 7, 1]], 40);
    return s;
  }

  it('holds while announced sums are missing; ends when they arrive', () => {
    const s = scheduler(60_000);
    expect(s.sumsInFlight(request)).toBe(false);
    s.updateFromOutputs([out(report({ inFlight: { sends: ['r1'], recvs: [] } }))]);
    expect(s.sumsInFlight(request)).toBe(true);
    const entry = { requestId: 'r1', numTokens: 40, groups: [{ groupId: 0, kind: 'attention' as const, fingerprint: 1n, start: 0, nBlocks: 3, skipped: false, partials: new Map([['1:0', new BigUint64Array([1n, 2n, 3n])]]) }] };
    s.updateFromOutputs([out(report({ sends: [entry] }))]);
    expect(s.sumsInFlight(request)).toBe(false);
  });

  it('gives up after the deadline', async () => {
    const s = scheduler(20);
    s.updateFromOutputs([out(report({ inFlight: { sends: ['r1'], recvs: [] } }))]);
    expect(s.sumsInFlight(request)).toBe(true);
    await new Promise((r) => setTimeout(r, 30));
    expect(s.sumsInFlight(request)).toBe(false);
  });
});

describe('the report JSON form carries inFlight', () => {
  it('round trip, and a bad inFlight is a ReportFormatError', () => {
    const r: KVChecksumReport = { ppRank: 1, tpRank: 0, sends: [], recvs: [], received: [], seconds: { send: 0, recv: 0 }, bytes: { send: 0, recv: 0 }, inFlight: { sends: ['a'], recvs: ['b', 'c'] } };
    expect(decodeReport(JSON.parse(JSON.stringify(encodeReport(r))))).toEqual(r);
    const { inFlight: _, ...without } = r;
    expect(decodeReport(JSON.parse(JSON.stringify(encodeReport(without))))).toEqual(without);
    expect(() => decodeReport({ ...encodeReport(r), inFlight: { sends: [1], recvs: [] } })).toThrow(ReportFormatError);
  });
});

/**
 * The FaultInjectingConnector as a connector: its halves share nothing (it works unchanged when
 * they only see serialized copies of what crosses), config is strict (an unknown fault kind is a
 * typed error at config time), params faults never mutate the params a request arrived with, and
 * the contract's hooks reach the inner connector.
 */
import { describe, expect, it } from 'vitest';
import { KVTransferConfigError, KV_CHECKSUMS_PARAM, parseKVTransferConfig, type ConnectorRequest, type KVConnectorFactory, type KVConnectorScheduler, type KVConnectorWorker, type KVTransferParams, type SchedulerContext } from '@kvconnect/core';
import {
  FAULT_INJECTING_CONNECTOR,
  FAULT_REPORT_PARAM,
  FaultInjectingConnectorFactory,
  UnknownFaultKindError,
  createFault,
  faultReportOf,
  inProcessEngines,
  parseFaultConfig,
  parseScenario,
  runScenario,
  type FaultSpec,
  type RequestOutcome,
  type ScenarioResult,
} from '../src/index.js';
import { assertPlain, crossProcessFactory, NotPlainDataError, type CrossCounts } from './cross-process.js';

/** What a test compares of an outcome (everything the harness reports about a request). */
const summary = (o: RequestOutcome) => ({ i: o.index, kind: o.kind, mismatches: o.verdict?.mismatches, unverified: o.verdict?.unverified, action: o.action, invalid: o.invalidBlocks, finish: o.finishReason, injected: [...o.injected], faults: [...o.faultKinds].sort(), tokens: o.tokenIds, loaded: o.loadBytes > 0 });

async function bothWays(raw: Record<string, unknown>): Promise<{ plain: ScenarioResult; crossed: ScenarioResult; counts: CrossCounts }> {
  const s = parseScenario(raw);
  const plain = await runScenario(s);
  const counts: CrossCounts = new Map();
  const crossed = await runScenario(s, { topology: (ctx) => inProcessEngines(ctx, (f) => crossProcessFactory(f, counts)) });
  return { plain, crossed, counts };
}

const mm = (o: RequestOutcome) => (o.verdict?.mismatches ?? []).map((m) => [m.groupId, m.positions]);

describe('halves that only see serialized copies of what crosses (worker processes)', () => {
  it('sequential P/D, producer TP1 -> consumer TP2: every fault lands and is reported exactly as with shared objects', async () => {
    const faults: FaultSpec[] = [
      { kind: 'stale', requests: [0] },
      { kind: 'bit-flip', requests: [1], layer: 1, head: 2, token: 20, piece: 1, bit: 9 },
      { kind: 'payload', mode: 'drop', requests: [2] },
      { kind: 'notif', target: 'finished-recving', mode: 'delay', steps: 3, tpRanks: [1], requests: [3] },
      { kind: 'misplaced-block', position: 1, requests: [4] },
      { kind: 'corrupt-region', fill: 'zero', tokens: [33, 35], requests: [5] },
    ];
    const { plain, crossed, counts } = await bothWays({
      name: 'x',
      model: 'GQA-S',
      consumer: { tp: 2 },
      requests: Array.from({ length: 7 }, (_, i) => ({ promptTokens: 40, promptSeed: i })),
      faults,
      expect: {},
    });
    const q = crossed.runs[0].requests;
    expect(mm(q[0])).toEqual([[0, [0, 1, 2]]]);
    expect(q[0].faultKinds).toEqual(['stale']);
    expect(mm(q[1])).toEqual([[0, [1]]]);
    expect(q[1].injected).toEqual(new Map([[0, [1]]]));
    expect(q[2].verdict!.unverified).toEqual([{ groupId: null, reason: 'no-payload' }]);
    expect(q[3].kind).toBe('verified');
    expect(q[3].faultKinds).toEqual(['notif']);
    expect(mm(q[4])).toEqual([[0, [1]]]);
    expect(mm(q[5])).toEqual([[0, [2]]]);
    expect(q[6].kind).toBe('verified');
    expect(q.every((o) => o.equalsReference)).toBe(true);
    expect(q.every((o) => o.loadBytes > 0 && o.loadWallMs !== null)).toBe(true);
    expect(crossed.runs[0].requests.map(summary)).toEqual(plain.runs[0].requests.map(summary));
    // The wrapper was in the path of every hook that carries data between the halves.
    for (const hook of ['buildConnectorMeta', 'bindConnectorMetadata', 'startLoadKv', 'getTransferResults', 'updateConnectorOutput', 'requestFinished']) expect(counts.get(hook) ?? 0, hook).toBeGreaterThan(0);
  });

  it('concurrent P/D (connector carrier): payload and kv-checksums notif faults as with shared objects', async () => {
    const { plain, crossed } = await bothWays({
      name: 'c',
      model: 'GQA-S',
      mode: 'concurrent',
      requests: Array.from({ length: 4 }, (_, i) => ({ promptTokens: 40, promptSeed: i })),
      faults: [
        { kind: 'payload', mode: 'truncate', requests: [0] },
        { kind: 'notif', target: 'kv-checksums', mode: 'drop', requests: [1] },
        { kind: 'payload', mode: 'garbage', side: 'producer', requests: [2] },
      ],
      expect: {},
    });
    const q = crossed.runs[0].requests;
    expect(q[0].verdict!.unverified[0].reason).toBe('malformed-payload');
    expect(q[1].verdict!.unverified[0].reason).toBe('no-payload');
    expect(q[2].verdict!.unverified[0].reason).toBe('malformed-payload');
    expect(crossed.runs[0].records.filter((r) => r.index === 2).map((r) => [r.kind, r.side, r.detail])).toEqual([['payload', 'producer', 'producer payload garbage']]);
    expect(q[3].kind).toBe('verified');
    expect(q.map(summary)).toEqual(plain.runs[0].requests.map(summary));
  });

  it('the test harness rejects what is not plain data', () => {
    class Box {
      x = 1;
    }
    expect(() => assertPlain({ a: [1, new Map([['k', new Set([new Uint8Array(2)])]])] }, 'ok')).not.toThrow();
    expect(() => assertPlain({ a: [{ b: new Box() }] }, 'meta')).toThrow(NotPlainDataError);
    expect(() => assertPlain({ f: () => 1 }, 'meta')).toThrow(/f is a function/);
  });
});

const base = { kv_connector: FAULT_INJECTING_CONNECTOR, kv_role: 'kv_consumer', enable_kv_checksum: true } as const;

describe('config: strict, typed errors', () => {
  it('an unknown fault kind is a KVTransferConfigError at config time, with its path', () => {
    const cfg = parseKVTransferConfig({ ...base, kv_connector_extra_config: { inner: { kv_connector: 'X' }, faults: [{ kind: 'bit-flip' }, { kind: 'bit-flop' }] } });
    let err: unknown;
    try {
      parseFaultConfig(cfg);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(KVTransferConfigError);
    expect((err as KVTransferConfigError).problems.map((p) => p.path)).toEqual(['kv_connector_extra_config.faults[1].kind']);
    // Creating either half fails the same way, before any inner connector is looked up.
    const f = new FaultInjectingConnectorFactory({ get: () => expect.unreachable('inner looked up') as never });
    expect(() => f.createScheduler(cfg, { engineId: 'e', tpSize: 1, ppSize: 1, groupConfigs: [] })).toThrow(KVTransferConfigError);
    expect(() => f.createWorker(cfg, { engineId: 'e', tpRank: 0, tpSize: 1, ppRank: 0, ppSize: 1 })).toThrow(KVTransferConfigError);
  });

  it('a spec that skipped validation never falls through the switch', () => {
    expect(() => createFault({ kind: 'bit-flop' } as unknown as FaultSpec, 0)).toThrow(UnknownFaultKindError);
  });
});

/** An inner connector that records the params its scheduler half sees; handshake data on its workers. */
function recordingInner(seen: KVTransferParams[], handshakes: unknown[]): KVConnectorFactory {
  return {
    name: 'Rec',
    createScheduler: (): KVConnectorScheduler => ({
      getNumNewMatchedTokens: (r) => {
        seen.push(r.kvTransferParams!);
        return { count: 0, loadAsync: false };
      },
      setXferHandshakeMetadata: (m) => void handshakes.push(m),
      updateStateAfterAlloc: () => {},
      buildConnectorMeta: () => null,
      updateConnectorOutput: () => {},
      requestFinished: () => ({ delayFree: false }),
      kvChecksumCarrier: () => 'kv_transfer_params',
    }),
    createWorker: (): KVConnectorWorker => ({
      registerKvCaches: () => {},
      getHandshakeMetadata: () => ({ agent: 'w0' }),
      bindConnectorMetadata: () => {},
      startLoadKv: () => {},
      getTransferResults: () => ({ finishedSending: new Set(), finishedRecving: new Set(), invalidBlockIds: new Set(), kvChecksums: new Map() }),
      clearConnectorMetadata: () => {},
    }),
  };
}

const deepFreeze = <T>(x: T): T => {
  if (typeof x === 'object' && x !== null) for (const v of Object.values(x)) deepFreeze(v);
  return Object.freeze(x);
};

describe('params faults work on a copy', () => {
  const ctx: SchedulerContext = { engineId: 'd', tpSize: 1, ppSize: 1, groupConfigs: [] };
  const faults: FaultSpec[] = [
    { kind: 'payload', mode: 'drop', requests: [0] },
    { kind: 'replay-params', from: 0, requests: [1] },
  ];
  const cfg = parseKVTransferConfig({ ...base, kv_connector_extra_config: { inner: { kv_connector: 'Rec' }, faults } });

  it("the params a request arrived with are never changed; the request, the inner connector and the report see the faulted copy", () => {
    const seen: KVTransferParams[] = [];
    const inner = recordingInner(seen, []);
    const s = new FaultInjectingConnectorFactory({ get: () => inner }).createScheduler(cfg, ctx);
    const arrived0 = deepFreeze({ do_remote_prefill: true, remote_request_id: 'p0', [KV_CHECKSUMS_PARAM]: 'AAAA', [FAULT_REPORT_PARAM]: { engineId: 'p', injections: [], loads: [] } });
    const arrived1 = deepFreeze({ do_remote_prefill: true, remote_request_id: 'p1', [KV_CHECKSUMS_PARAM]: 'BBBB' });
    const before = [structuredClone(arrived0), structuredClone(arrived1)];
    const r0: ConnectorRequest = { requestId: 'r0.a-d', promptTokenIds: [1, 2], numComputedTokens: 0, numTokens: 2, kvTransferParams: arrived0 };
    const r1: ConnectorRequest = { requestId: 'r1.b-d', promptTokenIds: [1, 2], numComputedTokens: 0, numTokens: 2, kvTransferParams: arrived1 };
    s.getNumNewMatchedTokens(r0, 0);
    s.getNumNewMatchedTokens(r1, 0);
    // Frozen objects: any write would have thrown; and nothing changed.
    expect([arrived0, arrived1]).toEqual(before);
    // r0: digest dropped (and the producer's report, forwarded by the proxy, left out).
    expect(r0.kvTransferParams).toEqual({ do_remote_prefill: true, remote_request_id: 'p0' });
    // r1: r0's transfer fields as r0 arrived (its digest included), r1's routing flag.
    expect(r1.kvTransferParams).toEqual({ do_remote_prefill: true, remote_request_id: 'p0', [KV_CHECKSUMS_PARAM]: 'AAAA' });
    expect(seen).toEqual([r0.kvTransferParams, r1.kvTransferParams]);
    // The ground truth comes back with each request.
    const rep = faultReportOf(s.requestFinished(r1, [], 'stop').kvTransferParams)!;
    expect(rep.injections).toMatchObject([{ engineId: 'd', requestId: 'r1.b-d', index: 1, kind: 'replay-params', side: 'consumer', detail: 'params of request 0 replayed' }]);
    expect(faultReportOf(s.requestFinished(r0, [], 'stop').kvTransferParams)!.injections.map((x) => x.kind)).toEqual(['payload']);
  });

  it('a request no fault hits keeps its params object', () => {
    const s = new FaultInjectingConnectorFactory({ get: () => recordingInner([], []) }).createScheduler(cfg, ctx);
    const params = { do_remote_prefill: true, remote_request_id: 'p7' };
    const r: ConnectorRequest = { requestId: 'r7.x-d', promptTokenIds: [1], numComputedTokens: 0, numTokens: 1, kvTransferParams: params };
    s.getNumNewMatchedTokens(r, 0);
    expect(r.kvTransferParams).toBe(params);
    expect(s.requestFinished(r, [], 'stop')).toEqual({ delayFree: false });
  });

  it('handshake metadata passes through to and from the inner connector', () => {
    const handshakes: unknown[] = [];
    const inner = recordingInner([], handshakes);
    const f = new FaultInjectingConnectorFactory({ get: () => inner });
    const w = f.createWorker(cfg, { engineId: 'd', tpRank: 0, tpSize: 1, ppRank: 0, ppSize: 1 });
    const s = f.createScheduler(cfg, ctx);
    const h = w.getHandshakeMetadata();
    expect(h).toEqual({ agent: 'w0' });
    void s.setXferHandshakeMetadata(new Map([['0:0', h]]));
    expect(handshakes).toEqual([new Map([['0:0', { agent: 'w0' }]])]);
  });
});

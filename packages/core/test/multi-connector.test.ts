import { describe, expect, it } from 'vitest';
import type {
  ConnectorRequest,
  KVChecksumCarrier,
  KVConnectorFactory,
  KVConnectorScheduler,
  KVConnectorWorker,
  MatchedTokens,
  RequestFinishedResult,
  SchedulerOutput,
  TransferResults,
} from '../src/connector.js';
import { KVTransferConfigError, parseKVTransferConfig } from '../src/config.js';
import { KVConnectorRegistry, UnknownConnectorError } from '../src/registry.js';
import { multiConnectorChildConfigs, MultiConnectorScheduler, MultiConnectorWorker, type MultiConnectorMetadata } from '../src/multi-connector.js';
import { KVChecksumScheduler } from '../src/checksum-scheduler.js';
import { KVChecksumObservability } from '../src/observability.js';
import { groupConfigs, logicalKV, runConsumer, runProducer } from './fake-pd.js';
import type { LocalizeAnswer, LocalizeQuery } from '../src/checksum-localize.js';

class ChildScheduler implements KVConnectorScheduler {
  readonly calls: string[] = [];
  readonly sent = new Map<string, Uint8Array>();
  constructor(
    readonly tag: string,
    public match: number | null,
    public carrier: KVChecksumCarrier,
    public finish: RequestFinishedResult = { delayFree: false },
  ) {}
  getNumNewMatchedTokens(): MatchedTokens {
    return { count: this.match, loadAsync: true };
  }
  updateStateAfterAlloc(r: ConnectorRequest, blocks: number[][], n: number): void {
    this.calls.push(`alloc:${r.requestId}:${JSON.stringify(blocks)}:${n}`);
  }
  buildConnectorMeta(): unknown {
    return `meta-${this.tag}`;
  }
  updateConnectorOutput(): void {
    this.calls.push('update');
  }
  requestFinished(): RequestFinishedResult {
    return this.finish;
  }
  kvChecksumCarrier(): KVChecksumCarrier {
    return this.carrier;
  }
  sendKvChecksums(r: ConnectorRequest, payload: Uint8Array): void {
    this.sent.set(r.requestId, payload);
  }
  shutdown(): void {
    this.calls.push('shutdown');
  }
}

class ChildWorker implements KVConnectorWorker {
  readonly bound: unknown[] = [];
  next: TransferResults = empty();
  registerKvCaches(): void {}
  bindConnectorMetadata(meta: unknown): void {
    this.bound.push(meta);
  }
  startLoadKv(output: SchedulerOutput): void {
    this.bound.push(`start:${String(output.kvConnectorMetadata)}`);
  }
  getTransferResults(): TransferResults {
    const r = this.next;
    this.next = empty();
    return r;
  }
  clearConnectorMetadata(): void {}
}

function empty(): TransferResults {
  return { finishedSending: new Set(), finishedRecving: new Set(), invalidBlockIds: new Set(), kvChecksums: new Map() };
}

const req = (id: string, params?: Record<string, unknown>): ConnectorRequest => ({ requestId: id, promptTokenIds: [1, 2, 3], numComputedTokens: 0, numTokens: 3, kvTransferParams: params });
const stepOut = { stepId: 1, numScheduledTokens: new Map(), finishedRequestIds: new Set<string>() };

describe('MultiConnector scheduler', () => {
  it('the first child that matches tokens loads the request; the others get no blocks', () => {
    const a = new ChildScheduler('a', 0, 'kv_transfer_params');
    const b = new ChildScheduler('b', 32, 'connector');
    const c = new ChildScheduler('c', 16, 'kv_transfer_params');
    const m = new MultiConnectorScheduler([a, b, c]);
    expect(m.getNumNewMatchedTokens(req('r'), 0)).toEqual({ count: 32, loadAsync: true });
    expect(m.loadingChild('r')).toBe(1);
    m.updateStateAfterAlloc(req('r'), [[1, 2], [3]], 32);
    expect(a.calls).toEqual(['alloc:r:[[],[]]:0']);
    expect(b.calls).toEqual(['alloc:r:[[1,2],[3]]:32']);
    expect(c.calls).toEqual(['alloc:r:[[],[]]:0']);
    // The load's checksum carrier is the loading child's, not the first child's with a carrier.
    expect(m.kvChecksumCarrier(req('r'))).toBe('connector');
    // A child that does not know yet makes the answer "ask again".
    a.match = null;
    expect(m.getNumNewMatchedTokens(req('s'), 0)).toEqual({ count: null, loadAsync: false });
  });

  it('a sent request is carried by the first child with a carrier, which gets sendKvChecksums', () => {
    const a = new ChildScheduler('a', 0, null);
    const b = new ChildScheduler('b', 0, 'connector');
    const c = new ChildScheduler('c', 0, 'kv_transfer_params');
    const m = new MultiConnectorScheduler([a, b, c]);
    expect(m.kvChecksumCarrier(req('p'))).toBe('connector');
    m.requestFinished(req('p'), [], 'length');
    m.sendKvChecksums(req('p'), new Uint8Array([1, 2]));
    expect(b.sent.get('p')).toEqual(new Uint8Array([1, 2]));
    expect(c.sent.size).toBe(0);
    expect(() => new MultiConnectorScheduler([a]).sendKvChecksums(req('q'), new Uint8Array())).toThrow(/no child carries/);
  });

  it('requestFinished merges params (first child wins a shared key) and keeps blocks while any child sends', () => {
    const a = new ChildScheduler('a', 0, null, { delayFree: true, kvTransferParams: { remote_engine_id: 'A', a: 1 } });
    const b = new ChildScheduler('b', 0, null, { delayFree: true, kvTransferParams: { remote_engine_id: 'B', b: 2 } });
    const c = new ChildScheduler('c', 0, null, { delayFree: false });
    const m = new MultiConnectorScheduler([a, b, c]);
    expect(m.requestFinished(req('r'), [], 'stop')).toEqual({ delayFree: true, kvTransferParams: { remote_engine_id: 'A', a: 1, b: 2 } });
    const meta = m.buildConnectorMeta(stepOut);
    expect(meta).toEqual({ children: ['meta-a', 'meta-b', 'meta-c'], expectedSends: { r: 2 } });
    expect(m.buildConnectorMeta(stepOut).expectedSends).toEqual({});
    expect(new MultiConnectorScheduler([c]).requestFinished(req('x'), [], 'abort')).toEqual({ delayFree: false });
  });

  it('forwards localizeKvChecksums to the child that loaded the request (absent when no child has one)', async () => {
    const asked: string[] = [];
    const localizing = (tag: string, match: number) =>
      Object.assign(new ChildScheduler(tag, match, 'connector'), {
        localizeKvChecksums: async (r: ConnectorRequest, q: LocalizeQuery, t: number): Promise<LocalizeAnswer> => {
          asked.push(`${tag}:${r.requestId}:${q.rangeTokens}:${t}`);
          return { status: 'gone', detail: `from ${tag}` };
        },
      });
    const a = localizing('a', 0);
    const b = localizing('b', 16);
    const plain = new ChildScheduler('c', 32, 'connector');
    const m = new MultiConnectorScheduler([a, b, plain]);
    const query: LocalizeQuery = { rangeTokens: 16, groups: [{ groupId: 0, tokenStart: 0, tokenEnd: 16 }] };
    m.getNumNewMatchedTokens(req('r'), 0);
    expect(m.loadingChild('r')).toBe(1);
    await expect(m.localizeKvChecksums!(req('r'), query, 250)).resolves.toEqual({ status: 'gone', detail: 'from b' });
    expect(asked).toEqual(['b:r:16:250']);
    // No child loaded it, or the loading child cannot localize: a clear rejection.
    await expect(m.localizeKvChecksums!(req('nobody'), query, 250)).rejects.toThrow(/no child loaded request nobody/);
    const n = new MultiConnectorScheduler([plain, a]);
    n.getNumNewMatchedTokens(req('s'), 0);
    await expect(n.localizeKvChecksums!(req('s'), query, 250)).rejects.toThrow(/child 0, which loaded s, cannot localize/);
    expect(new MultiConnectorScheduler([plain]).localizeKvChecksums).toBeUndefined();
  });

  it('forwards outputs and shuts every child down', async () => {
    const a = new ChildScheduler('a', 0, null);
    const b = new ChildScheduler('b', 0, null);
    const m = new MultiConnectorScheduler([a, b]);
    m.updateConnectorOutput([]);
    await m.shutdown();
    expect(a.calls).toEqual(['update', 'shutdown']);
    expect(b.calls).toEqual(['update', 'shutdown']);
  });
});

describe('MultiConnector worker', () => {
  it('binds each child its metadata and merges transfer results (first checksum copy wins)', () => {
    const wa = new ChildWorker();
    const wb = new ChildWorker();
    const w = new MultiConnectorWorker([wa, wb]);
    const meta: MultiConnectorMetadata = { children: ['ma', 'mb'], expectedSends: {} };
    w.bindConnectorMetadata(meta);
    w.startLoadKv({ ...stepOut, kvConnectorMetadata: meta, kvChecksumMetadata: null });
    expect(wa.bound).toEqual(['ma', 'start:ma']);
    expect(wb.bound).toEqual(['mb', 'start:mb']);
    wa.next = { ...empty(), finishedRecving: new Set(['r1']), kvChecksums: new Map([['r1', new Uint8Array([1])]]), invalidBlockIds: new Set([4]) };
    wb.next = { ...empty(), finishedRecving: new Set(['r2']), kvChecksums: new Map([['r1', new Uint8Array([2])], ['r2', new Uint8Array([3])]]) };
    const r = w.getTransferResults();
    expect(r.finishedRecving).toEqual(new Set(['r1', 'r2']));
    expect(r.invalidBlockIds).toEqual(new Set([4]));
    expect(r.kvChecksums).toEqual(new Map([['r1', new Uint8Array([1])], ['r2', new Uint8Array([3])]]));
  });

  it('reports a request finished sending once every child that kept its blocks has', () => {
    const wa = new ChildWorker();
    const wb = new ChildWorker();
    const w = new MultiConnectorWorker([wa, wb]);
    w.bindConnectorMetadata({ children: [null, null], expectedSends: { r: 2 } });
    wa.next = { ...empty(), finishedSending: new Set(['r', 'solo']) };
    expect(w.getTransferResults().finishedSending).toEqual(new Set(['solo']));
    wb.next = { ...empty(), finishedSending: new Set(['r']) };
    expect(w.getTransferResults().finishedSending).toEqual(new Set(['r']));
  });
});

describe('MultiConnector across processes: per-child handshake and worker metadata', () => {
  /** A child that records what reaches its scheduler half and hands out its own worker data. */
  class MetaScheduler extends ChildScheduler {
    readonly handshakes: Array<Map<string, unknown>> = [];
    readonly workerMetas: unknown[][] = [];
    setXferHandshakeMetadata(m: ReadonlyMap<string, unknown>): void {
      this.handshakes.push(new Map(m));
    }
    override updateConnectorOutput(...args: unknown[]): void {
      const outputs = args[0] as readonly { kvConnectorWorkerMeta?: unknown }[];
      this.workerMetas.push(outputs.map((o) => ('kvConnectorWorkerMeta' in o ? o.kvConnectorWorkerMeta : 'absent')));
    }
  }
  class MetaWorker extends ChildWorker {
    constructor(
      readonly handshake: unknown,
      public meta: unknown,
    ) {
      super();
    }
    getHandshakeMetadata(): unknown {
      return this.handshake;
    }
    override getTransferResults(): TransferResults {
      return this.meta === undefined ? empty() : { ...empty(), workerMeta: this.meta };
    }
  }

  it('each child gets, per worker, only its own handshake metadata; workers that gave null are left out', async () => {
    // Two workers (pp 0, tp 0 and 1); child a has handshake data on tp 0 only, child b on both.
    const workers = [new MultiConnectorWorker([new MetaWorker({ a: 0 }, undefined), new MetaWorker({ b: 0 }, undefined)]), new MultiConnectorWorker([new MetaWorker(null, undefined), new MetaWorker({ b: 1 }, undefined)])];
    const hs = workers.map((w) => w.getHandshakeMetadata());
    expect(hs).toEqual([{ children: [{ a: 0 }, { b: 0 }] }, { children: [null, { b: 1 }] }]);
    expect(new MultiConnectorWorker([new MetaWorker(null, undefined)]).getHandshakeMetadata()).toBeNull();
    const a = new MetaScheduler('a', 0, null);
    const b = new MetaScheduler('b', 0, null);
    const c = new ChildScheduler('c', 0, null); // no hook: skipped
    const m = new MultiConnectorScheduler([a, b, c]);
    await m.setXferHandshakeMetadata(new Map([['0:0', hs[0]!], ['0:1', hs[1]!]]));
    expect(a.handshakes).toEqual([new Map([['0:0', { a: 0 }]])]);
    expect(b.handshakes).toEqual([new Map([['0:0', { b: 0 }], ['0:1', { b: 1 }]])]);
  });

  it("each child's workerMeta reaches only that child's updateConnectorOutput", () => {
    const w = new MultiConnectorWorker([new MetaWorker(null, { leases: ['r1'] }), new MetaWorker(null, undefined)]);
    const r = w.getTransferResults();
    expect(r.workerMeta).toEqual({ children: [{ leases: ['r1'] }, null] });
    expect(new MultiConnectorWorker([new MetaWorker(null, undefined)]).getTransferResults().workerMeta).toBeUndefined();
    const a = new MetaScheduler('a', 0, null);
    const b = new MetaScheduler('b', 0, null);
    const m = new MultiConnectorScheduler([a, b]);
    const out = (meta: unknown) => ({ ppRank: 0, tpRank: 0, finishedSending: new Set<string>(), finishedRecving: new Set<string>(), invalidBlockIds: new Set<number>(), kvChecksums: new Map(), ...(meta === undefined ? {} : { kvConnectorWorkerMeta: meta as never }) });
    m.updateConnectorOutput([out(r.workerMeta), out(undefined), out({ children: [null, 7] })]);
    expect(a.workerMetas).toEqual([[{ leases: ['r1'] }, 'absent', 'absent']]);
    expect(b.workerMetas).toEqual([['absent', 'absent', 7]]);
  });
});

describe('MultiConnector config and registry', () => {
  const base = { kv_role: 'kv_consumer', enable_kv_checksum: true };

  it("children inherit the parent's role and checksum settings", () => {
    const c = parseKVTransferConfig({ ...base, kv_connector: 'MultiConnector', kv_checksum_fail_closed: true, kv_connector_extra_config: { connectors: [{ kv_connector: 'A', kv_connector_extra_config: { x: 1 } }, { kv_connector: 'B', kv_role: 'kv_both' }] } });
    const kids = multiConnectorChildConfigs(c);
    expect(kids.map((k) => [k.kv_connector, k.kv_role, k.enable_kv_checksum, k.kv_checksum_fail_closed, k.kv_connector_extra_config])).toEqual([
      ['A', 'kv_consumer', true, true, { x: 1 }],
      ['B', 'kv_both', true, true, {}],
    ]);
  });

  it('bad child entries give every problem with its path', () => {
    const c = parseKVTransferConfig({ ...base, kv_connector: 'MultiConnector', kv_connector_extra_config: { connectors: [{ kv_connector_extra_config: 3 }, 'x', { kv_connector: 'A', bogus: 1 }] } });
    try {
      multiConnectorChildConfigs(c);
      throw new Error('no error');
    } catch (e) {
      expect(e).toBeInstanceOf(KVTransferConfigError);
      expect((e as KVTransferConfigError).problems.map((p) => p.path)).toEqual([
        'kv_connector_extra_config.connectors[0].kv_connector',
        'kv_connector_extra_config.connectors[0].kv_connector_extra_config',
        'kv_connector_extra_config.connectors[1]',
        'kv_connector_extra_config.connectors[2].bogus',
      ]);
    }
  });

  it("is registered as 'MultiConnector' and creates its children from the registry", () => {
    const r = new KVConnectorRegistry();
    const made: string[] = [];
    const f = (name: string): KVConnectorFactory => ({
      name,
      createScheduler: () => {
        made.push(name);
        return new ChildScheduler(name, 0, null);
      },
      createWorker: () => new ChildWorker(),
    });
    r.register(f('A'));
    r.register(f('B'));
    const c = parseKVTransferConfig({ ...base, kv_connector: 'MultiConnector', kv_connector_extra_config: { connectors: [{ kv_connector: 'B' }, { kv_connector: 'A' }] } });
    const h = r.create(c, { scheduler: { engineId: 'e', tpSize: 1, ppSize: 1, groupConfigs: [] }, worker: { engineId: 'e', tpRank: 0, tpSize: 1, ppRank: 0, ppSize: 1 } });
    expect(made).toEqual(['B', 'A']);
    expect((h.scheduler as MultiConnectorScheduler).children.map((x) => (x as ChildScheduler).tag)).toEqual(['B', 'A']);
    expect(h.worker).toBeInstanceOf(MultiConnectorWorker);
    const unknown = parseKVTransferConfig({ ...base, kv_connector: 'MultiConnector', kv_connector_extra_config: { connectors: [{ kv_connector: 'C' }] } });
    expect(() => r.createScheduler(unknown, { engineId: 'e', tpSize: 1, ppSize: 1, groupConfigs: [] })).toThrow(UnknownConnectorError);
  });

  it('carries KV checksums end to end through the child that carries the request', () => {
    const kv = logicalKV(42, 40);
    const shape = { tp: 2, pp: 1, blockSize: 16, layout: 'NHD' as const, kvLayout: 'kv-first' as const };
    // Producer: child 0 has no carrier, child 1 carries through the connector.
    const pa = new ChildScheduler('a', 0, null, { delayFree: true, kvTransferParams: { remote_engine_id: 'P' } });
    const pb = new ChildScheduler('b', 0, 'connector', { delayFree: true });
    const prod = runProducer({ shape, kv, carrier: 'connector', connector: new MultiConnectorScheduler([pa, pb]) });
    expect(prod.params).toEqual({ remote_engine_id: 'P' });
    const payload = pb.sent.get('req-1');
    expect(payload).toBeInstanceOf(Uint8Array);
    // Consumer: child 0 carries in params but matches nothing; child 1 loads and carries through the connector.
    const da = new ChildScheduler('a', 0, 'kv_transfer_params');
    const db = new ChildScheduler('b', 40, 'connector');
    const multi = new MultiConnectorScheduler([da, db]);
    multi.getNumNewMatchedTokens(req('req-1'), 0);
    const cons = runConsumer({ shape: { ...shape, tp: 1 }, kv, carrier: 'connector', connector: multi, connectorPayloads: [payload], failClosed: true });
    expect(cons.decision).toMatchObject({ action: 'use', verdict: { verdict: 'verified' } });
    // Under fail-closed, a MultiConnector none of whose children carries checksums is refused.
    const none = new MultiConnectorScheduler([new ChildScheduler('x', 0, null)]);
    expect(
      () =>
        new KVChecksumScheduler({
          config: parseKVTransferConfig({ kv_connector: 'MultiConnector', kv_role: 'kv_consumer', enable_kv_checksum: true, kv_checksum_fail_closed: true }),
          connector: none,
          tpSize: 1,
          ppSize: 1,
          groupConfigs: groupConfigs(16),
          observability: new KVChecksumObservability({ level: 'silent' }),
        }),
    ).toThrow(/does not carry KV checksums/);
  });
});

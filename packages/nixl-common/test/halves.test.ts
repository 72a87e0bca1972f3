/**
 * The NIXL scheduler half without a process-global hub: it learns its workers' ranks only from
 * `setXferHandshakeMetadata` (and serves them on the producer's side channel), owns the lease
 * table, tells each worker in the step metadata which requests to report in `finishedSending`,
 * applies the workers' metadata (read-done notifs, finished push writes), and passes push
 * registrations to the workers. Two halves with the same engine id share nothing.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { workerKey, type ConnectorRequest, type KVConnectorOutput, type KVTransferConfig } from '@kvconnect/core';
import { Registry } from 'prom-client';
import { NIXL_METRIC_NAMES, NixlPeers, NixlScheduler, SideChannelError, nixlMetrics, type NixlHandshakeMetadata, type NixlWorkerMeta, type TransferMode } from '../src/index.js';
import { makeRank } from './fixtures.js';

const model = { kind: 'gqa' as const, layers: 2, kvHeads: 2, headDim: 8 };
const r0 = makeRank(model, 0, 2, { numBlocks: 4, blockSize: 16 });
const r1 = makeRank(model, 1, 2, { numBlocks: 4, blockSize: 16 });
const groups = r0.caches.groupConfigs;
const cfg = (mode: TransferMode, role: KVTransferConfig['kv_role']): KVTransferConfig => ({
  kv_connector: mode === 'pull' ? 'NixlConnector' : 'NixlPushConnector',
  kv_role: role,
  enable_kv_checksum: false,
  kv_checksum_fail_closed: false,
  kv_load_failure_policy: 'recompute',
  kv_connector_extra_config: { lease_ms: 60_000, handshake_timeout_ms: 2000 },
});
const md = (r: typeof r0, name: string): NixlHandshakeMetadata => ({ rank: { ...r.info, agentName: name }, backend: 'embedded' });
const req = (id: string): ConnectorRequest => ({ requestId: id, promptTokenIds: [1, 2, 3], numComputedTokens: 3, numTokens: 4, kvTransferParams: { do_remote_decode: true } });
const out = (pp: number, tp: number, meta?: NixlWorkerMeta): KVConnectorOutput<NixlWorkerMeta> => ({ ppRank: pp, tpRank: tp, finishedSending: new Set(), finishedRecving: new Set(), invalidBlockIds: new Set(), kvChecksums: new Map(), kvConnectorWorkerMeta: meta });

const open: Array<{ shutdown(): Promise<void> | void }> = [];
afterEach(async () => {
  for (const s of open.splice(0)) await s.shutdown();
});
let n = 0;
function producer(mode: TransferMode, registry = new Registry(), engineId = `halves-${n++}`): NixlScheduler {
  const s = new NixlScheduler(cfg(mode, 'kv_producer'), { engineId, tpSize: 2, ppSize: 1, groupConfigs: groups, metricsRegistry: registry }, mode);
  open.push(s);
  return s;
}
function peers(mode: TransferMode): NixlPeers {
  const p = new NixlPeers({ mode, config: { handshakeTimeoutMs: 2000, clusterSecret: null }, metrics: nixlMetrics() });
  open.push({ shutdown: () => p.close() });
  return p;
}

describe('NIXL scheduler half: handshake metadata', () => {
  it('serves INFO from the workers it was given, only once every worker reported', async () => {
    const s = producer('pull');
    // No side channel before the handshake metadata: no params, the blocks are freed.
    expect(s.requestFinished(req('early'), [[1]], 'stop')).toEqual({ delayFree: false });
    await s.setXferHandshakeMetadata(new Map([[workerKey(0, 0), md(r0, 'agent-a')]]));
    const addr = s.channel!.address!;
    const c = peers('pull');
    await expect(c.peerInfo(addr.host, addr.port, undefined, 'x'.repeat(64))).rejects.toMatchObject({ code: 'not-ready' });
    // Both workers (given out of order): INFO lists them by TP rank with their agent names.
    await s.setXferHandshakeMetadata(new Map([[workerKey(0, 1), md(r1, 'agent-b')], [workerKey(0, 0), md(r0, 'agent-a')]]));
    expect(s.channel!.address).toEqual(addr);
    await expect(c.peerInfo(addr.host, addr.port, undefined, 'x'.repeat(64))).rejects.toMatchObject({ code: 'incompatible' });
    const info = s.channel!.info!;
    const got = await c.peerInfo(addr.host, addr.port, s.ctx.engineId, info.compatHash);
    expect(got.ranks.map((r) => [r.tpRank, r.agentName])).toEqual([[0, 'agent-a'], [1, 'agent-b']]);
    expect(got).toMatchObject({ engineId: s.ctx.engineId, tpSize: 2, ppSize: 1, blockSizes: [16] });
  });

  it('two scheduler halves with the same engine id in one process share nothing', async () => {
    const a = producer('pull', new Registry(), 'same-engine');
    const b = producer('pull', new Registry(), 'same-engine');
    await a.setXferHandshakeMetadata(new Map([[workerKey(0, 0), md(r0, 'a0')], [workerKey(0, 1), md(r1, 'a1')]]));
    await b.setXferHandshakeMetadata(new Map([[workerKey(0, 0), md(r0, 'b0')], [workerKey(0, 1), md(r1, 'b1')]]));
    expect(a.channel!.address!.port).not.toBe(b.channel!.address!.port);
    a.requestFinished(req('p1'), [[1]], 'stop');
    expect(a.channel!.leases.isHeld('p1')).toBe(true);
    expect(b.channel!.leases.stateOf('p1')).toBeUndefined();
  });
});

describe('NIXL scheduler half: leases through the step metadata', () => {
  it('pull: read-done notifs reported by a worker end the lease; every worker is told once to report it', async () => {
    const registry = new Registry();
    const s = producer('pull', registry);
    await s.setXferHandshakeMetadata(new Map([[workerKey(0, 0), md(r0, 'a0')], [workerKey(0, 1), md(r1, 'a1')]]));
    expect(s.requestFinished(req('p1'), [[1]], 'stop').delayFree).toBe(true);
    expect(s.buildConnectorMeta()).toMatchObject({ finished: {}, leasesHeld: 1 });
    // A consumer of world 2: one reader is not enough.
    s.updateConnectorOutput([out(0, 0, { readDone: [['p1', 'consumer-r0', 2]] }), out(0, 1)]);
    expect(s.buildConnectorMeta().finished).toEqual({});
    s.updateConnectorOutput([out(0, 1, { readDone: [['p1', 'consumer-r1', 2], ['nope', 'consumer-r1', 2]] })]);
    expect(s.buildConnectorMeta()).toMatchObject({ finished: { '0:0': ['p1'], '0:1': ['p1'] }, leasesHeld: 0 });
    expect(s.buildConnectorMeta().finished).toEqual({});
    // The read-done of an unknown request is a failed notif.
    const failed = (await registry.getSingleMetric(NIXL_METRIC_NAMES.failedNotifs)!.get()).values.reduce((a, v) => a + v.value, 0);
    expect(failed).toBe(1);
  });

  it('RELEASE on the side channel reaches the workers in the next step metadata', async () => {
    const s = producer('pull');
    await s.setXferHandshakeMetadata(new Map([[workerKey(0, 0), md(r0, 'a0')], [workerKey(0, 1), md(r1, 'a1')]]));
    const params = s.requestFinished(req('p1'), [[1]], 'stop').kvTransferParams!;
    peers('pull').release(params.remote_host as string, params.remote_port as number, ['p1'], null, [params.lease_capability as string]);
    const t0 = Date.now();
    while (s.channel!.leases.stateOf('p1') === 'held' && Date.now() - t0 < 2000) await new Promise((r) => setTimeout(r, 5));
    expect(s.buildConnectorMeta().finished).toEqual({ '0:0': ['p1'], '0:1': ['p1'] });
  });

  it('push: PUSH_REG reaches the workers in the step metadata with the producer info (once); a worker reports its part done', async () => {
    const s = producer('push');
    await s.setXferHandshakeMetadata(new Map([[workerKey(0, 0), md(r0, 'a0')], [workerKey(0, 1), md(r1, 'a1')]]));
    const first = s.buildConnectorMeta();
    expect(first.producer?.ranks.map((r) => r.agentName)).toEqual(['a0', 'a1']);
    expect(s.buildConnectorMeta().producer).toBeUndefined();
    const params = s.requestFinished(req('p1'), [[1]], 'stop').kvTransferParams!;
    const c = peers('push');
    const reg = { consumerRequestId: 'd1', producerRequestId: 'p1', consumerEngineId: 'consumer', rank: r0.info, firstToken: 0, numTokens: 3, blockIds: [[2]] };
    await c.pushRegister(params.remote_host as string, params.remote_port as number, reg, undefined, null, params.lease_capability as string);
    const err = await c.pushRegister(params.remote_host as string, params.remote_port as number, { ...reg, producerRequestId: 'unknown' }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SideChannelError);
    expect((err as SideChannelError).code).toBe('unknown-request');
    const meta = s.buildConnectorMeta();
    expect(meta.pushes.map((p) => p.requestId)).toEqual(['p1']);
    expect(meta.pushRegs).toEqual([expect.objectContaining({ consumerRequestId: 'd1', producerRequestId: 'p1', numTokens: 3, blockIds: [[2]] })]);
    expect(s.buildConnectorMeta().pushRegs).toEqual([]);
    // Worker 0:1 wrote its part: only it reports the request (the lease stays held for 0:0).
    s.updateConnectorOutput([out(0, 1, { pushDone: ['p1'] })]);
    expect(s.buildConnectorMeta().finished).toEqual({ '0:1': ['p1'] });
    s.updateConnectorOutput([out(0, 0, { pushDone: ['p1'] })]);
    expect(s.buildConnectorMeta()).toMatchObject({ finished: { '0:0': ['p1'] }, leasesHeld: 0 });
  });
});

/**
 * Leases (expiry, heartbeats, pins, transfers in flight, per-worker reporting), the side channel
 * over real TCP (requests, refusals, a misbehaving peer disconnected while others are served,
 * deadlines), consumer heartbeats extending a producer's lease, and the extra config.
 */
import * as net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { KVTransferConfigError, type ConnectorRequest, type KVTransferConfig } from '@kvconnect/core';
import { Registry } from 'prom-client';
import {
  LeaseTable,
  NIXL_METRIC_NAMES,
  NixlScheduler,
  SideChannelClient,
  SideChannelError,
  SideChannelServer,
  NixlProducerChannel,
  nixlMetrics,
  decodeEmptyBody,
  decodeLeaseBody,
  parseNixlConfig,
  decodeLocalizeBody,
} from '../src/index.js';

describe('LeaseTable', () => {
  let t = 0;
  const table = (o: Partial<{ leaseMs: number; workers: number }> = {}, expired: string[] = []) =>
    new LeaseTable({ leaseMs: o.leaseMs ?? 100, workers: o.workers ?? 2, now: () => t, onExpired: (id) => expired.push(id) });

  it('expires after leaseMs; each worker reports once, then the entry is forgotten', () => {
    t = 0;
    const expired: string[] = [];
    const l = table({}, expired);
    expect(l.add('a')).toBe(100);
    t = 100;
    expect(l.take('0:0')).toEqual([]);
    t = 101;
    expect(l.take('0:0')).toEqual(['a']);
    expect(l.take('0:0')).toEqual([]);
    expect(expired).toEqual(['a']);
    expect(l.size).toBe(1);
    expect(l.take('0:1')).toEqual(['a']);
    expect(l.size).toBe(0);
    expect(l.endedAs('a')).toBe('expired');
  });
  it('heartbeats extend, pins keep alive, transfers in flight block expiry', () => {
    t = 0;
    const l = table();
    l.add('a');
    t = 90;
    expect(l.touch(['a', 'zz'], 0)).toEqual(new Map([['a', 190], ['zz', 0]]));
    t = 150;
    expect(l.isHeld('a')).toBe(true);
    l.touch(['a'], 500);
    t = 400;
    expect(l.isHeld('a')).toBe(true);
    t = 700;
    l.inflight('a', 1);
    expect(l.isHeld('a')).toBe(true);
    l.inflight('a', -1);
    expect(l.isHeld('a')).toBe(false);
    expect(l.touch(['a'], 0).get('a')).toBe(0);
  });
  it('pull: done once every consumer rank sent read-done (distinct senders)', () => {
    t = 0;
    const l = table({ workers: 1 });
    l.add('a');
    l.readerDone('a', 'd0', 2);
    l.readerDone('a', 'd0', 2);
    expect(l.take('0:0')).toEqual([]);
    l.readerDone('a', 'd1', 2);
    expect(l.take('0:0')).toEqual(['a']);
    expect(l.readerDone('unknown', 'd0', 1)).toBe(false);
  });
  it('push: a worker reports its part when done; release ends the lease for all', () => {
    t = 0;
    const l = table();
    l.add('a');
    l.add('b');
    l.workerDone('a', '0:0');
    expect(l.take('0:0')).toEqual(['a']);
    expect(l.take('0:1')).toEqual([]);
    l.release('b');
    expect(l.take('0:1').sort()).toEqual(['b']);
  });
});

describe('side channel over TCP', () => {
  const closers: Array<() => unknown> = [];
  afterEach(async () => {
    for (const c of closers.splice(0).reverse()) await c();
  });
  async function serve(errors: string[] = []) {
    const server = new SideChannelServer(
      (req) => {
        if (req.type === 'lease') return { ok: req.requestIds.map((id) => [id, id === 'gone' ? 0 : 42]) };
        if (req.type === 'release') return { ok: [] };
        return { refuse: 'incompatible', message: 'no' };
      },
      { onProtocolError: (_p, m) => errors.push(m) },
    );
    const addr = await server.listen('127.0.0.1', 0);
    closers.push(() => server.close());
    return addr;
  }

  it('answers requests and refusals', async () => {
    const a = await serve();
    const c = new SideChannelClient(a.host, a.port);
    closers.push(() => c.close());
    expect(await c.request({ type: 'lease', requestIds: ['x', 'gone'], pinMs: 0 }, decodeLeaseBody)).toEqual(new Map([['x', 42], ['gone', 0]]));
    await c.request({ type: 'release', requestIds: ['x'] }, decodeEmptyBody);
    const e = await c.request({ type: 'info', version: 15, mode: 'pull', compatHash: 'h' }, decodeEmptyBody).catch((x) => x);
    expect(e).toBeInstanceOf(SideChannelError);
    expect(e.code).toBe('incompatible');
  });
  it('disconnects a peer that sends an oversized or undecodable frame, and keeps serving others', async () => {
    const errors: string[] = [];
    const a = await serve(errors);
    for (const junk of [Buffer.from([0xff, 0xff, 0xff, 0xff]), Buffer.from([3, 0, 0, 0, 0xc1, 0xc1, 0xc1])]) {
      const s = net.createConnection(a.port, a.host);
      await new Promise<void>((r) => s.once('connect', () => r()));
      const closed = new Promise<void>((r) => s.once('close', () => r()));
      s.write(junk);
      await closed;
    }
    expect(errors).toHaveLength(2);
    const c = new SideChannelClient(a.host, a.port);
    closers.push(() => c.close());
    expect((await c.request({ type: 'lease', requestIds: ['y'], pinMs: 0 }, decodeLeaseBody)).get('y')).toBe(42);
  });
  it('a peer that never answers times out; an unreachable one fails with transport', async () => {
    const accepted: net.Socket[] = [];
    const silent = net.createServer((s) => void accepted.push(s));
    await new Promise<void>((r) => silent.listen(0, '127.0.0.1', () => r()));
    closers.push(() => {
      for (const s of accepted) s.destroy();
      return new Promise((r) => silent.close(r));
    });
    const port = (silent.address() as net.AddressInfo).port;
    const c = new SideChannelClient('127.0.0.1', port, { timeoutMs: 100 });
    closers.push(() => c.close());
    await expect(c.request({ type: 'release', requestIds: [] }, decodeEmptyBody)).rejects.toMatchObject({ code: 'timeout' });
    const d = new SideChannelClient('127.0.0.1', 1, { timeoutMs: 500 });
    await expect(d.request({ type: 'release', requestIds: [] }, decodeEmptyBody)).rejects.toMatchObject({ code: 'transport' });
    // A per-request timeout overrides the client's.
    const t0 = Date.now();
    await expect(c.request({ type: 'release', requestIds: [] }, decodeEmptyBody, 300)).rejects.toMatchObject({ code: 'timeout' });
    expect(Date.now() - t0).toBeGreaterThanOrEqual(290);
  });
  it('an answer that arrived while this process was busy past the deadline wins over the timeout', async () => {
    // The server answers, then this process blocks (a long engine step) past the client's
    // deadline: the expired timer runs before the socket is polled, yet the answer is there.
    const server = new SideChannelServer((req) => {
      setImmediate(() => {
        const t = Date.now();
        while (Date.now() - t < 200) {
          /* busy */
        }
      });
      return req.type === 'lease' ? { ok: req.requestIds.map((id) => [id, 7]) } : { ok: [] };
    });
    const a = await server.listen('127.0.0.1', 0);
    closers.push(() => server.close());
    const c = new SideChannelClient(a.host, a.port, { timeoutMs: 50 });
    closers.push(() => c.close());
    expect((await c.request({ type: 'lease', requestIds: ['z'], pinMs: 0 }, decodeLeaseBody)).get('z')).toBe(7);
  });
});

const cfg = (role: KVTransferConfig['kv_role'], extra: Record<string, unknown> = {}): KVTransferConfig => ({
  kv_connector: 'NixlConnector',
  kv_role: role,
  enable_kv_checksum: false,
  kv_checksum_fail_closed: false,
  kv_load_failure_policy: 'recompute',
  kv_connector_extra_config: extra,
});

describe('consumer heartbeats extend the producer lease', () => {
  for (const [name, hb, held] of [['with heartbeats', 20, true], ['without', 0, false]] as const) {
    it(`${name}: the producer ${held ? 'still holds' : 'expired'} the lease`, async () => {
      const registry = new Registry();
      const producer = new NixlProducerChannel({ engineId: `hb-producer-${hb}`, mode: 'pull', workers: 1, config: parseNixlConfig(cfg('kv_producer', { lease_ms: 80 })), metrics: nixlMetrics(registry) });
      const addr = await producer.listen();
      producer.leases.add('p-1');
      const sched = new NixlScheduler(cfg('kv_consumer', { heartbeat_ms: hb }), { engineId: `hb-consumer-${hb}`, tpSize: 1, ppSize: 1, groupConfigs: [] }, 'pull');
      const req: ConnectorRequest = {
        requestId: 'd-1',
        promptTokenIds: [1, 2, 3],
        numComputedTokens: 0,
        numTokens: 3,
        kvTransferParams: { do_remote_prefill: true, remote_engine_id: 'x', remote_request_id: 'p-1', remote_block_ids: [[0]], remote_host: addr.host, remote_port: addr.port, remote_tp_size: 1 },
      };
      expect(sched.getNumNewMatchedTokens(req, 0)).toEqual({ count: 3, loadAsync: true });
      await new Promise((r) => setTimeout(r, 300));
      expect(producer.leases.isHeld('p-1')).toBe(held);
      const expired = (await registry.getSingleMetric(NIXL_METRIC_NAMES.expiredLeases)!.get()).values.reduce((a, v) => a + v.value, 0);
      expect(expired).toBe(held ? 0 : 1);
      // Abort: the consumer releases the producer's blocks.
      sched.requestFinished(req, [[0]], 'abort');
      if (held) {
        await new Promise((r) => setTimeout(r, 50));
        expect(producer.leases.stateOf('p-1')).toBe('released');
      }
      await sched.shutdown();
      await producer.close();
    });
  }
});

describe('extra config', () => {
  it('defaults', () => {
    expect(parseNixlConfig(cfg('kv_producer'))).toMatchObject({ backend: 'embedded', sideChannelHost: '127.0.0.1', sideChannelPort: 0, leaseMs: 30_000, heartbeatMs: 5_000, leaseCheck: true });
  });
  it('lists every problem', () => {
    try {
      parseNixlConfig(cfg('kv_producer', { backend: 'ucx', lease_ms: 0, side_channel_port: 70000, lease_check: 'yes', metrics_registry: {}, typo: 1 }));
      expect.unreachable();
    } catch (e) {
      expect(e).toBeInstanceOf(KVTransferConfigError);
      expect((e as KVTransferConfigError).problems.map((p) => p.path.split('.')[1]).sort()).toEqual(['backend', 'lease_check', 'lease_ms', 'metrics_registry', 'side_channel_port', 'typo']);
      expect((e as KVTransferConfigError).problems.find((p) => p.path === 'kv_connector_extra_config.typo')?.message).toMatch(/^unknown key \(known: backend, .*kv_lease_duration.*backends/);
      expect((e as KVTransferConfigError).problems.find((p) => p.path === 'kv_connector_extra_config.side_channel_port')?.message).toBe('expected an integer in 0..65535');
    }
  });
  it("takes vLLM's NixlConnector keys: backends, kv_lease_duration in seconds", () => {
    expect(parseNixlConfig(cfg('kv_producer', { backends: ['UCX'], kv_lease_duration: 2.5 }))).toMatchObject({ nixlBackend: 'UCX', leaseMs: 2500 });
    const problems = (extra: Record<string, unknown>) => {
      try {
        parseNixlConfig(cfg('kv_producer', extra));
      } catch (e) {
        return (e as KVTransferConfigError).problems;
      }
      throw new Error('no error');
    };
    expect(problems({ backends: ['UCX', 'GDS'] })).toEqual([{ path: 'kv_connector_extra_config.backends', message: 'expected one NIXL backend (kvconnect drives one backend plugin per agent), e.g. ["UCX"]' }]);
    expect(problems({ backends: 'UCX' })).toEqual([{ path: 'kv_connector_extra_config.backends', message: 'expected an array of NIXL backend names, e.g. ["UCX"]' }]);
    expect(problems({ kv_lease_duration: 0 })).toEqual([{ path: 'kv_connector_extra_config.kv_lease_duration', message: 'expected a number of seconds in (0, 86400]' }]);
    expect(problems({ kv_lease_duration: 30, lease_ms: 30_000 })).toEqual([{ path: 'kv_connector_extra_config.kv_lease_duration', message: 'give kv_lease_duration (seconds, vLLM) or lease_ms, not both' }]);
  });
});

describe('LOCALIZE over the side channel (hostile trial)', () => {
  it('one LOCALIZE per request at a time: copies sent while one waits for the workers are refused busy, another request is still served', async () => {
    const registry = new Registry();
    const producer = new NixlProducerChannel({ engineId: 'loc-producer', mode: 'pull', workers: 1, config: parseNixlConfig(cfg('kv_producer', { lease_ms: 10_000 })), metrics: nixlMetrics(registry) });
    const a = await producer.listen();
    const caps = new Map<string, string>();
    for (const id of ['r1', 'r2']) {
      producer.leases.add(id);
      caps.set(id, producer.heldBlocks(id, [[0]], 16));
    }
    const c = new SideChannelClient(a.host, a.port);
    const query = { rangeTokens: 16, groups: [{ groupId: 0, tokenStart: 0, tokenEnd: 16 }] };
    try {
      const first = c.request({ type: 'localize', requestId: 'r1', query, capability: caps.get('r1') }, decodeLocalizeBody, 5_000);
      first.catch(() => {});
      await new Promise((r) => setTimeout(r, 50));
      const copies = await Promise.allSettled(Array.from({ length: 5 }, () => c.request({ type: 'localize', requestId: 'r1', query, capability: caps.get('r1') }, decodeLocalizeBody, 5_000)));
      expect(copies.every((x) => x.status === 'rejected' && /already being served/.test(String((x as PromiseRejectedResult).reason)))).toBe(true);
      const other = c.request({ type: 'localize', requestId: 'r2', query, capability: caps.get('r2') }, decodeLocalizeBody, 5_000);
      other.catch(() => {});
      await new Promise((r) => setTimeout(r, 50));
      // two orders wait for the workers (one per request), not six
      expect(producer.takeLocalizeOrders().map((o) => o.requestId).sort()).toEqual(['r1', 'r2']);
    } finally {
      c.close();
      await producer.close();
    }
  });
});

/**
 * Binding and budget of questions about a served request (consumer-binding.ts, docs/localize.md
 * "Binding and budget"): the rules themselves (LeaseCapabilities, ConsumerBindings, LocalizeBudget
 * with a test clock), and the NIXL producer's side channel with a cluster secret and authenticated
 * consumers: the real one, which holds the request's lease capability, and another that knows
 * only the request id. The other's `LEASE`, `LOCALIZE` and `RELEASE` are refused `forbidden` and
 * change nothing, even when it asks first; the `LOCALIZE` budget is charged per request (fresh
 * keys and connections buy none) and computations in flight per connection.
 */
import { afterEach, describe, expect, it } from 'vitest';
import type { KVTransferConfig, LocalizeQuery } from '@kvconnect/core';
import { Registry } from 'prom-client';
import {
  ConsumerBindings,
  LocalizeBudget,
  NixlProducerChannel,
  SideChannelClient,
  decodeEmptyBody,
  decodeLeaseBody,
  decodeLocalizeBody,
  LeaseCapabilities,
  isLeaseCapability,
  localizeQueryRanges,
  newConsumerKey,
  newLeaseCapability,
  sameCapability,
  nixlMetrics,
  parseNixlConfig,
  NIXL_PROTOCOL_VERSION,
  decodeRequest,
  encodeRequest,
  packr,
  type SideRequest,
} from '../src/index.js';

const SECRET = 'the-cluster-secret-of-the-binding-test';
const cfg = (extra: Record<string, unknown> = {}): KVTransferConfig => ({
  kv_connector: 'NixlConnector',
  kv_role: 'kv_producer',
  enable_kv_checksum: false,
  kv_checksum_fail_closed: false,
  kv_load_failure_policy: 'recompute',
  kv_connector_extra_config: { lease_ms: 10_000, localize_hold_ms: 60_000, cluster_secret: SECRET, ...extra },
});
const small: LocalizeQuery = { rangeTokens: 16, groups: [{ groupId: 0, tokenStart: 0, tokenEnd: 16 }] };
/** The largest question the decoder accepts: 64 groups of 1024 ranges. */
const largest: LocalizeQuery = { rangeTokens: 1, groups: Array.from({ length: 64 }, (_, g) => ({ groupId: g, tokenStart: 0, tokenEnd: 1024 })) };

const closers: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
});

async function producerWith(ids: string[], extra: Record<string, unknown> = {}) {
  const producer = new NixlProducerChannel({ engineId: 'bind-producer', mode: 'pull', workers: 1, config: parseNixlConfig(cfg(extra)), metrics: nixlMetrics(new Registry()) });
  const a = await producer.listen();
  closers.push(() => producer.close());
  /** Each request's lease capability (what its kv_transfer_params would carry to the real consumer). */
  const caps = new Map<string, string>();
  for (const id of ids) {
    producer.leases.add(id);
    caps.set(id, producer.heldBlocks(id, [[0]], 16));
  }
  /** An authenticated consumer: its own connection (the cluster secret) and its own consumer key. */
  const consumer = () => {
    const c = new SideChannelClient(a.host, a.port, { clusterSecret: Buffer.from(SECRET) });
    closers.push(() => c.close());
    return { c, key: newConsumerKey() };
  };
  return { producer, consumer, caps };
}

const settle = () => new Promise((r) => setTimeout(r, 30));

describe('consumer keys and lease capabilities on the NIXL wire (protocols 18, 19)', () => {
  it('LEASE, RELEASE and LOCALIZE end with the key and the capabilities (nil without) and read them back; malformed ones are refused without echoing them (PUSH_REG: tests/nixl/binding.test.ts, push)', () => {
    const key = newConsumerKey();
    const cap = newLeaseCapability();
    const cases: Array<[SideRequest, number, unknown]> = [
      [{ type: 'lease', requestIds: ['a'], pinMs: 0, consumerKey: key, capabilities: [cap] }, 4, [cap]],
      [{ type: 'release', requestIds: ['a'], consumerKey: key, capabilities: [cap] }, 3, [cap]],
      [{ type: 'localize', requestId: 'a', query: small, consumerKey: key, capability: cap }, 5, cap],
    ];
    for (const [req, at, capOnWire] of cases) {
      const wire = packr.unpack(encodeRequest(3, req)) as unknown[];
      expect(wire).toHaveLength(at + 2);
      expect(wire[at]).toBe(key);
      expect(wire[at + 1]).toEqual(capOnWire);
      expect(decodeRequest(encodeRequest(3, req))).toEqual({ seq: 3, req });
      const { consumerKey: _, capabilities: _c, capability: _d, ...bare } = req as SideRequest & { consumerKey?: string; capabilities?: unknown; capability?: unknown };
      const bareWire = packr.unpack(encodeRequest(3, bare as SideRequest)) as unknown[];
      expect(bareWire[at]).toBeNull();
      expect(bareWire[at + 1]).toEqual(Array.isArray(capOnWire) ? [null] : null);
      expect(decodeRequest(encodeRequest(3, bare as SideRequest))).toEqual({ seq: 3, req: bare });
      for (const bad of ['AB'.repeat(16), 'ab'.repeat(15), 5]) {
        const w = [...wire];
        w[at] = bad;
        expect(() => decodeRequest(packr.pack(w)), `${req.type} ${String(bad)}`).toThrow(/consumerKey: expected nil or 32 lowercase hex digits/);
      }
      const secretLooking = 'Ab'.repeat(32);
      for (const bad of [secretLooking, 'ab'.repeat(31), 5, ...(Array.isArray(capOnWire) ? [[cap, cap], []] : [])]) {
        const w = [...wire];
        w[at + 1] = Array.isArray(capOnWire) && !Array.isArray(bad) ? [bad] : bad;
        let err: unknown;
        try {
          decodeRequest(packr.pack(w));
        } catch (e) {
          err = e;
        }
        expect(err, `${req.type} ${JSON.stringify(bad)}`).toBeInstanceOf(Error);
        expect((err as Error).message).toMatch(/capabilit(y|ies): expected (nil or 64 lowercase hex digits|one entry per request id)/);
        expect((err as Error).message).not.toContain(secretLooking);
      }
    }
    expect(NIXL_PROTOCOL_VERSION).toBe(19);
  });
});

describe('LeaseCapabilities', () => {
  it('grants 64 random hex digits per request; only that value passes (constant-time compare), none or another is refused with a text that holds no capability; unknown requests pass', () => {
    const c = new LeaseCapabilities();
    const a = c.grant('r');
    const b = c.grant('s');
    expect(a).toMatch(/^[0-9a-f]{64}$/);
    expect(a).not.toBe(b);
    expect(isLeaseCapability(a)).toBe(true);
    expect(c.check('r', a)).toBeNull();
    expect(c.check('r', b)).toBe('another lease capability');
    expect(c.check('r', null)).toBe('no lease capability given');
    expect(c.check('r', undefined)).toBe('no lease capability given');
    expect(c.check('r', a.slice(0, 63))).toBe('another lease capability');
    expect(c.check('unknown', null)).toBeNull();
    expect(sameCapability(a, a.toUpperCase())).toBe(false);
    c.forget('r');
    expect(c.has('r')).toBe(false);
    expect(c.check('r', null)).toBeNull();
    expect(c.size).toBe(1);
  });
});

describe('ConsumerBindings', () => {
  it('the first key binds; the same key passes, another key or none is refused; unbound requests bind to the asker', () => {
    const b = new ConsumerBindings();
    const k1 = newConsumerKey();
    const k2 = newConsumerKey();
    expect(k1).toMatch(/^[0-9a-f]{32}$/);
    b.claim('r', null); // no key binds nothing
    b.claim('r', k1);
    b.claim('r', k2); // already bound
    expect(b.check('r', k1)).toBeNull();
    expect(b.check('r', k2)).toMatch(/served to another consumer \(another consumer key\)/);
    expect(b.check('r', null)).toMatch(/served to another consumer \(no consumer key given\)/);
    expect(b.check('s', k2)).toBeNull(); // unbound: now bound to k2
    expect(b.check('s', k1)).toMatch(/another consumer key/);
    b.forget('r');
    expect(b.check('r', k2)).toBeNull();
  });
});

describe('LocalizeBudget', () => {
  it('caps token ranges per second per request and computations in flight per slot (connection); a refusal takes nothing; requests are independent', () => {
    let now = 0;
    const b = new LocalizeBudget({ maxInFlight: 2, rangesPerSecond: 1000, now: () => now });
    expect(localizeQueryRanges(largest)).toBe(65_536);
    expect(localizeQueryRanges({ rangeTokens: 16, groups: [{ groupId: 2, tokenStart: 5, tokenEnd: 5 }, { groupId: 0, tokenStart: 0, tokenEnd: 33 }] })).toBe(4);
    // The bucket holds at least one largest request.
    expect(b.take('request a', 65_536, 'conn 1')).toBeNull();
    b.done('conn 1');
    // Another slot (a new connection) buys nothing for the same request.
    expect(b.take('request a', 1, 'conn 2')).toMatch(/more than 1000 token ranges per second asked about this request \(1 asked, 0 left\)/);
    expect(b.take('request b', 65_536, 'conn 1')).toBeNull(); // another request: its own budget
    b.done('conn 1');
    now += 10; // 10 ms: 10 ranges back
    expect(b.take('request a', 11, 'conn 1')).toMatch(/11 asked, 10 left/);
    expect(b.take('request a', 5, 'conn 1')).toBeNull();
    expect(b.take('request a', 5, 'conn 1')).toBeNull();
    expect(b.take('request c', 0, 'conn 1')).toMatch(/2 localizations of this connection are being computed \(at most 2\)/);
    expect(b.take('request c', 0, 'conn 2')).toBeNull(); // another connection
    b.done('conn 1');
    now += 1000;
    expect(b.take('request a', 1000, 'conn 1')).toBeNull();
  });
});

describe('NIXL producer: a request is acted on only with its lease capability (protocol 19)', () => {
  it("a cluster member that knows the request id but not its capability cannot pre-empt the real consumer: its LEASE, LOCALIZE and RELEASE are refused forbidden and change nothing; then the real consumer's LEASE, LOCALIZE and RELEASE work", async () => {
    const { producer, consumer, caps } = await producerWith(['r1']);
    const cap = caps.get('r1')!;
    const other = consumer();
    const real = consumer();
    const texts: string[] = [];
    const refused = async (p: Promise<unknown>) => {
      const e = (await p.then(
        () => null,
        (x: unknown) => x,
      )) as { code: string; message: string } | null;
      expect(e).toMatchObject({ code: 'forbidden' });
      texts.push(e!.message);
    };
    // The other member asks first, with its own key (and no or a guessed capability): nothing binds to it.
    for (const guess of [undefined, newLeaseCapability()]) {
      await refused(other.c.request({ type: 'lease', requestIds: ['r1'], pinMs: 3_600_000, consumerKey: other.key, capabilities: [guess ?? null] }, decodeLeaseBody, 2_000));
      await refused(other.c.request({ type: 'localize', requestId: 'r1', query: small, consumerKey: other.key, capability: guess }, decodeLocalizeBody, 2_000));
      await refused(other.c.request({ type: 'release', requestIds: ['r1'], consumerKey: other.key, capabilities: [guess ?? null] }, decodeEmptyBody, 2_000));
    }
    // A LEASE or RELEASE naming r1 among requests it may name is refused whole.
    await refused(other.c.request({ type: 'release', requestIds: ['unknown', 'r1'], consumerKey: other.key }, decodeEmptyBody, 2_000));
    expect(texts.join('\n')).toMatch(/request r1: no lease capability given; nothing leased/);
    expect(texts.join('\n')).toMatch(/request r1: another lease capability; nothing released/);
    for (const t of texts) expect(t).not.toContain(cap);
    expect(producer.leases.stateOf('r1')).toBe('held');
    expect(producer.leases.blocksHeld('r1')).toBe(true);
    expect(producer.takeLocalizeOrders()).toEqual([]);
    // The refused pin of an hour was not applied: the real consumer's heartbeat sees the plain lease.
    const expiry = (await real.c.request({ type: 'lease', requestIds: ['r1'], pinMs: 0, consumerKey: real.key, capabilities: [cap] }, decodeLeaseBody)).get('r1')!;
    expect(expiry).toBeGreaterThan(Date.now());
    expect(expiry).toBeLessThanOrEqual(Date.now() + 10_000);
    const asked = real.c.request({ type: 'localize', requestId: 'r1', query: small, consumerKey: real.key, capability: cap }, decodeLocalizeBody, 5_000);
    await settle();
    const [order] = producer.takeLocalizeOrders();
    expect(order).toMatchObject({ requestId: 'r1', query: small });
    producer.onLocalized('0:0', { ticket: order!.ticket, groups: [{ groupId: 0, sums: [] }] });
    expect(await asked).toEqual({ status: 'held', groups: [{ groupId: 0, sums: [] }] });
    await real.c.request({ type: 'release', requestIds: ['r1'], consumerKey: real.key, capabilities: [cap] }, decodeEmptyBody, 2_000);
    expect(producer.leases.stateOf('r1')).toBe('released');
  });

  it('a LEASE naming requests with and without their capability extends only the former (the others answer 0, unpinned); one without any is refused', async () => {
    const { producer, consumer, caps } = await producerWith(['h1', 'h2']);
    const c = consumer();
    const m = await c.c.request({ type: 'lease', requestIds: ['h1', 'h2'], pinMs: 3_600_000, consumerKey: c.key, capabilities: [caps.get('h1')!, newLeaseCapability()] }, decodeLeaseBody);
    expect(m.get('h1')).toBeGreaterThan(Date.now() + 3_000_000);
    expect(m.get('h2')).toBe(0);
    // h2 was not pinned: its own heartbeat sees the plain lease.
    expect((await c.c.request({ type: 'lease', requestIds: ['h2'], pinMs: 0, capabilities: [caps.get('h2')!] }, decodeLeaseBody)).get('h2')).toBeLessThanOrEqual(Date.now() + 10_000);
    await expect(c.c.request({ type: 'lease', requestIds: ['h1', 'h2'], pinMs: 0, capabilities: [null, null] }, decodeLeaseBody)).rejects.toMatchObject({ code: 'forbidden' });
    expect(producer.leases.stateOf('h2')).toBe('held');
  });

  it('the capability, not a consumer key, is the binding: a holder of it with another key is served', async () => {
    const { producer, consumer, caps } = await producerWith(['r2']);
    const first = consumer();
    const second = consumer();
    await first.c.request({ type: 'lease', requestIds: ['r2'], pinMs: 1_000, consumerKey: first.key, capabilities: [caps.get('r2')!] }, decodeLeaseBody);
    const asked = second.c.request({ type: 'localize', requestId: 'r2', query: small, consumerKey: second.key, capability: caps.get('r2') }, decodeLocalizeBody, 5_000);
    await settle();
    const [order] = producer.takeLocalizeOrders();
    producer.onLocalized('0:0', { ticket: order!.ticket, groups: [] });
    expect((await asked).status).toBe('held');
  });
});

describe('NIXL producer: LOCALIZE budget per request, computations per connection', () => {
  it('a flood of LOCALIZE on one connection is capped (busy: in flight), another connection is still served', async () => {
    const ids = Array.from({ length: 10 }, (_, i) => `f${i}`);
    const { producer, consumer, caps } = await producerWith([...ids, 'b1'], { localize_max_inflight_per_peer: 3 });
    const flood = consumer();
    const quiet = consumer();
    const asks = ids.map((id) => flood.c.request({ type: 'localize', requestId: id, query: small, consumerKey: flood.key, capability: caps.get(id) }, decodeLocalizeBody, 5_000));
    for (const a of asks) a.catch(() => {});
    await settle();
    const refused = (await Promise.allSettled(asks.slice(3))).map((x) => (x.status === 'rejected' ? (x.reason as { code: string; message: string }) : null));
    expect(refused.every((r) => r?.code === 'busy' && /3 localizations of this connection are being computed \(at most 3\)/.test(r.message))).toBe(true);
    const other = quiet.c.request({ type: 'localize', requestId: 'b1', query: small, consumerKey: quiet.key, capability: caps.get('b1') }, decodeLocalizeBody, 5_000);
    await settle();
    const orders = producer.takeLocalizeOrders();
    expect(orders.map((o) => o.requestId).sort()).toEqual(['b1', 'f0', 'f1', 'f2']);
    for (const o of orders) producer.onLocalized('0:0', { ticket: o.ticket, groups: [{ groupId: 0, sums: [] }] });
    expect((await other).status).toBe('held');
    await Promise.all(asks.slice(0, 3));
    // Answered: the slots are free again.
    const again = flood.c.request({ type: 'localize', requestId: 'f5', query: small, consumerKey: flood.key, capability: caps.get('f5') }, decodeLocalizeBody, 5_000);
    await settle();
    const [o] = producer.takeLocalizeOrders();
    producer.onLocalized('0:0', { ticket: o!.ticket, groups: [{ groupId: 0, sums: [] }] });
    expect((await again).status).toBe('held');
  });

  it('a peer cycling consumer keys and connections on one request is refused busy once its budget is spent; another request is still served', async () => {
    // 1 range per second: the bucket (one largest question) does not refill between the asks, however slow the machine.
    const { producer, consumer, caps } = await producerWith(['a1', 'b1'], { localize_ranges_per_second_per_peer: 1 });
    const ask = async (id: string) => {
      const peer = consumer(); // a fresh connection and a fresh consumer key each time
      let settled = false;
      const p = peer.c.request({ type: 'localize', requestId: id, query: largest, consumerKey: peer.key, capability: caps.get(id) }, decodeLocalizeBody, 10_000);
      p.then(
        () => (settled = true),
        () => (settled = true),
      );
      // Answer the order as the workers would, once it is queued (or the producer refused).
      for (const t0 = Date.now(); !settled && Date.now() - t0 < 10_000; await new Promise((r) => setTimeout(r, 5))) {
        const orders = producer.takeLocalizeOrders();
        for (const o of orders) producer.onLocalized('0:0', { ticket: o.ticket, groups: [] });
        if (orders.length > 0) break;
      }
      return p;
    };
    expect((await ask('a1')).status).toBe('held');
    for (let i = 0; i < 3; i++) await expect(ask('a1')).rejects.toMatchObject({ code: 'busy', message: expect.stringMatching(/more than 1 token ranges per second asked about this request/) });
    expect((await ask('b1')).status).toBe('held');
  });
});

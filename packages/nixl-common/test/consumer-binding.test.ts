/**
 * Binding and budget of questions about a served request (consumer-binding.ts, docs/localize.md
 * "Binding and budget"): the rule itself (ConsumerBindings, LocalizeBudget with a test clock), and
 * the NIXL producer's side channel with a cluster secret and two authenticated consumers: the one
 * the lease was served to, and another that knows the request id. The other's `LOCALIZE` and
 * `RELEASE` are refused `forbidden` and change nothing; a flood of `LOCALIZE` from one consumer
 * is refused `busy` past its budget while another consumer is still served.
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
  localizeQueryRanges,
  newConsumerKey,
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
  for (const id of ids) {
    producer.leases.add(id);
    producer.heldBlocks(id, [[0]], 16);
  }
  /** An authenticated consumer: its own connection (the cluster secret) and its own consumer key. */
  const consumer = () => {
    const c = new SideChannelClient(a.host, a.port, { clusterSecret: Buffer.from(SECRET) });
    closers.push(() => c.close());
    return { c, key: newConsumerKey() };
  };
  return { producer, consumer };
}

const settle = () => new Promise((r) => setTimeout(r, 30));

describe('consumer keys on the NIXL wire (protocol 18)', () => {
  it('LEASE, RELEASE and LOCALIZE end with the key (nil without one) and read it back; a malformed key is refused (PUSH_REG: tests/nixl/binding.test.ts, push)', () => {
    const key = newConsumerKey();
    const cases: Array<[SideRequest, number]> = [
      [{ type: 'lease', requestIds: ['a'], pinMs: 0, consumerKey: key }, 4],
      [{ type: 'release', requestIds: ['a'], consumerKey: key }, 3],
      [{ type: 'localize', requestId: 'a', query: small, consumerKey: key }, 5],
    ];
    for (const [req, at] of cases) {
      const wire = packr.unpack(encodeRequest(3, req)) as unknown[];
      expect(wire).toHaveLength(at + 1);
      expect(wire[at]).toBe(key);
      expect(decodeRequest(encodeRequest(3, req))).toEqual({ seq: 3, req });
      const { consumerKey: _, ...bare } = req as SideRequest & { consumerKey?: string };
      expect((packr.unpack(encodeRequest(3, bare as SideRequest)) as unknown[])[at]).toBeNull();
      expect(decodeRequest(encodeRequest(3, bare as SideRequest))).toEqual({ seq: 3, req: bare });
      for (const bad of ['AB'.repeat(16), 'ab'.repeat(15), 5]) {
        wire[at] = bad;
        expect(() => decodeRequest(packr.pack(wire)), `${req.type} ${String(bad)}`).toThrow(/consumerKey: expected nil or 32 lowercase hex digits/);
      }
    }
    expect(NIXL_PROTOCOL_VERSION).toBe(18);
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
  it('caps computations in flight and token ranges per second per consumer; a refusal takes nothing; consumers are independent', () => {
    let now = 0;
    const b = new LocalizeBudget({ maxInFlight: 2, rangesPerSecond: 1000, now: () => now });
    expect(localizeQueryRanges(largest)).toBe(65_536);
    expect(localizeQueryRanges({ rangeTokens: 16, groups: [{ groupId: 2, tokenStart: 5, tokenEnd: 5 }, { groupId: 0, tokenStart: 0, tokenEnd: 33 }] })).toBe(4);
    // The bucket holds at least one largest request.
    expect(b.take('a', 65_536)).toBeNull();
    b.done('a');
    expect(b.take('a', 1)).toMatch(/more than 1000 token ranges per second \(1 asked, 0 left\)/);
    expect(b.take('b', 65_536)).toBeNull(); // another consumer: its own budget
    b.done('b');
    now += 10; // 10 ms: 10 ranges back
    expect(b.take('a', 11)).toMatch(/11 asked, 10 left/);
    expect(b.take('a', 5)).toBeNull();
    expect(b.take('a', 5)).toBeNull();
    expect(b.take('a', 0)).toMatch(/2 localizations of this consumer are being computed \(at most 2\)/);
    b.done('a');
    now += 1000;
    expect(b.take('a', 1000)).toBeNull();
  });
});

describe('NIXL producer: LOCALIZE and RELEASE are bound to the consumer the lease was served to', () => {
  it("another authenticated consumer with the request id is refused forbidden, the hold and lease stay; then the real consumer's LOCALIZE and RELEASE work", async () => {
    const { producer, consumer } = await producerWith(['r1']);
    const real = consumer();
    const other = consumer();
    // The real consumer's pin before its READ binds the request to its key.
    expect((await real.c.request({ type: 'lease', requestIds: ['r1'], pinMs: 5_000, consumerKey: real.key }, decodeLeaseBody)).get('r1')).toBeGreaterThan(0);
    // A LEASE of the other consumer does not rebind.
    await other.c.request({ type: 'lease', requestIds: ['r1'], pinMs: 0, consumerKey: other.key }, decodeLeaseBody);
    for (const key of [other.key, undefined]) {
      await expect(other.c.request({ type: 'localize', requestId: 'r1', query: small, consumerKey: key }, decodeLocalizeBody, 2_000)).rejects.toMatchObject({ code: 'forbidden', message: expect.stringMatching(/request r1 was served to another consumer/) });
      await expect(other.c.request({ type: 'release', requestIds: ['r1'], consumerKey: key }, decodeEmptyBody, 2_000)).rejects.toMatchObject({ code: 'forbidden', message: expect.stringMatching(/nothing released/) });
    }
    // A RELEASE naming r1 among unknown ids releases nothing either.
    await expect(other.c.request({ type: 'release', requestIds: ['unknown', 'r1'], consumerKey: other.key }, decodeEmptyBody, 2_000)).rejects.toMatchObject({ code: 'forbidden' });
    expect(producer.leases.stateOf('r1')).toBe('held');
    expect(producer.leases.blocksHeld('r1')).toBe(true);
    expect(producer.takeLocalizeOrders()).toEqual([]);
    // The consumer the lease was served to: its LOCALIZE is ordered and answered, its RELEASE ends the lease.
    const asked = real.c.request({ type: 'localize', requestId: 'r1', query: small, consumerKey: real.key }, decodeLocalizeBody, 5_000);
    await settle();
    const [order] = producer.takeLocalizeOrders();
    expect(order).toMatchObject({ requestId: 'r1', query: small });
    producer.onLocalized('0:0', { ticket: order!.ticket, groups: [{ groupId: 0, sums: [] }] });
    expect(await asked).toEqual({ status: 'held', groups: [{ groupId: 0, sums: [] }] });
    await real.c.request({ type: 'release', requestIds: ['r1'], consumerKey: real.key }, decodeEmptyBody, 2_000);
    expect(producer.leases.stateOf('r1')).toBe('released');
  });

  it('a request nobody claimed binds to its first LOCALIZE', async () => {
    const { producer, consumer } = await producerWith(['r2']);
    const first = consumer();
    const second = consumer();
    const asked = first.c.request({ type: 'localize', requestId: 'r2', query: small, consumerKey: first.key }, decodeLocalizeBody, 5_000);
    asked.catch(() => {});
    await settle();
    expect(producer.takeLocalizeOrders()).toHaveLength(1);
    await expect(second.c.request({ type: 'localize', requestId: 'r2', query: small, consumerKey: second.key }, decodeLocalizeBody, 2_000)).rejects.toMatchObject({ code: 'forbidden' });
  });
});

describe('NIXL producer: LOCALIZE budget per consumer', () => {
  it('a flood of LOCALIZE from one consumer is capped (busy: in flight), another consumer is still served', async () => {
    const ids = Array.from({ length: 10 }, (_, i) => `f${i}`);
    const { producer, consumer } = await producerWith([...ids, 'b1'], { localize_max_inflight_per_peer: 3 });
    const flood = consumer();
    const quiet = consumer();
    await flood.c.request({ type: 'lease', requestIds: ids, pinMs: 0, consumerKey: flood.key }, decodeLeaseBody);
    await quiet.c.request({ type: 'lease', requestIds: ['b1'], pinMs: 0, consumerKey: quiet.key }, decodeLeaseBody);
    const asks = ids.map((id) => flood.c.request({ type: 'localize', requestId: id, query: small, consumerKey: flood.key }, decodeLocalizeBody, 5_000));
    for (const a of asks) a.catch(() => {});
    await settle();
    const refused = (await Promise.allSettled(asks.slice(3))).map((x) => (x.status === 'rejected' ? (x.reason as { code: string; message: string }) : null));
    expect(refused.every((r) => r?.code === 'busy' && /3 localizations of this consumer are being computed \(at most 3\)/.test(r.message))).toBe(true);
    const other = quiet.c.request({ type: 'localize', requestId: 'b1', query: small, consumerKey: quiet.key }, decodeLocalizeBody, 5_000);
    await settle();
    const orders = producer.takeLocalizeOrders();
    expect(orders.map((o) => o.requestId).sort()).toEqual(['b1', 'f0', 'f1', 'f2']);
    for (const o of orders) producer.onLocalized('0:0', { ticket: o.ticket, groups: [{ groupId: 0, sums: [] }] });
    expect((await other).status).toBe('held');
    await Promise.all(asks.slice(0, 3));
    // Answered: the slots are free again.
    const again = flood.c.request({ type: 'localize', requestId: 'f5', query: small, consumerKey: flood.key }, decodeLocalizeBody, 5_000);
    await settle();
    const [o] = producer.takeLocalizeOrders();
    producer.onLocalized('0:0', { ticket: o!.ticket, groups: [{ groupId: 0, sums: [] }] });
    expect((await again).status).toBe('held');
  });

  it('token ranges per second: a second largest question at once is refused busy, another consumer is still served', async () => {
    const { producer, consumer } = await producerWith(['a1', 'a2', 'b1']);
    const a = consumer();
    const b = consumer();
    await a.c.request({ type: 'lease', requestIds: ['a1', 'a2'], pinMs: 0, consumerKey: a.key }, decodeLeaseBody);
    await b.c.request({ type: 'lease', requestIds: ['b1'], pinMs: 0, consumerKey: b.key }, decodeLeaseBody);
    const first = a.c.request({ type: 'localize', requestId: 'a1', query: largest, consumerKey: a.key }, decodeLocalizeBody, 5_000);
    await settle();
    const [o1] = producer.takeLocalizeOrders();
    producer.onLocalized('0:0', { ticket: o1!.ticket, groups: [] });
    expect((await first).status).toBe('held');
    await expect(a.c.request({ type: 'localize', requestId: 'a2', query: largest, consumerKey: a.key }, decodeLocalizeBody, 5_000)).rejects.toMatchObject({ code: 'busy', message: expect.stringMatching(/more than 65536 token ranges per second/) });
    const other = b.c.request({ type: 'localize', requestId: 'b1', query: largest, consumerKey: b.key }, decodeLocalizeBody, 5_000);
    await settle();
    const [o2] = producer.takeLocalizeOrders();
    expect(o2!.requestId).toBe('b1');
    producer.onLocalized('0:0', { ticket: o2!.ticket, groups: [] });
    expect((await other).status).toBe('held');
  });
});

/**
 * Who may use a Mooncake producer's transfer (`@kvconnect/nixl-common` consumer-binding.ts;
 * docs/localize.md "Binding and budget"), with real engines, ZeroMQ, embedded agents and a
 * cluster secret:
 * - with a lease capability (protocol 6, `kv_transfer_params.lease_capability`, as the P/D proxy
 *   draws it): another authenticated consumer engine that knows the transfer id and sends its `md`
 *   first is refused `forbidden` (nothing written into its memory) and the real consumer still
 *   loads; its `loc` without the capability is refused too;
 * - without one (a proxy that draws none): the first consumer key served binds the transfer; an
 *   `md` or `loc` of another consumer key is refused `forbidden` and the hold stays;
 * - the `loc` budget is charged per transfer: a peer cycling consumer keys and connections on one
 *   transfer is refused `busy` once it is spent, while another transfer is still served.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { KVChecksumObservability, KVConnectorRegistry, LocalizeBusyError, type ConnectorRequest, type LocalizeQuery } from '@kvconnect/core';
import { Engine } from '@kvconnect/engine';
import { MOONCAKE_CONNECTOR, SideChannelAuthError, askProducerWorker, createMooncakeConnectorFactory, type MooncakeScheduler } from '@kvconnect/mooncake';
import { newConsumerKey, newLeaseCapability } from '@kvconnect/nixl-common';
import { bootstrapAddressOfEngine, counter, makeMooncakePD, until, type MooncakePD } from './utils.js';

const PROMPT = 'Whose transfer is it? Only the consumer it was written to may ask about it.';
const S = { maxTokens: 2, ignoreEos: true };
const SECRET = 'the-cluster-secret-of-the-mooncake-binding-test';
const small: LocalizeQuery = { rangeTokens: 16, groups: [{ groupId: 0, tokenStart: 0, tokenEnd: 16 }] };
/** The largest question the decoder accepts: 64 groups of 1024 ranges (65 536 ranges, the default budget of a second). */
const largest: LocalizeQuery = { rangeTokens: 1, groups: Array.from({ length: 64 }, (_, g) => ({ groupId: g, tokenStart: 0, tokenEnd: 1024 })) };

const schedulerOf = (e: Engine) => (e as unknown as { connector: MooncakeScheduler }).connector;
const request = (transferId: string, producer: Engine): ConnectorRequest => ({ requestId: `ask-${transferId}`, promptTokenIds: [], numComputedTokens: 0, numTokens: 0, kvTransferParams: { transfer_id: transferId, remote_engine_id: producer.engineId } });

const open: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const f of open.splice(0).reverse()) await f();
});

async function pair(extra: Record<string, unknown> = {}): Promise<MooncakePD> {
  const pd = await makeMooncakePD({ model: 'dense-gqa', extra: { localize_hold_ms: 60_000, cluster_secret: SECRET, ...extra } });
  open.push(() => pd.shutdown());
  return pd;
}

/** One load of `transferId` from the pair's producer into `consumer` (Mooncake's concurrent P/D), verified; `capability`: the proxy's `lease_capability` for both sides. */
async function load(pd: MooncakePD, consumer: Engine, transferId: string, capability?: string): Promise<void> {
  const cap = capability ? { lease_capability: capability } : {};
  const [p, d] = await Promise.all([
    pd.producer.generate(PROMPT, { maxTokens: 1 }, { do_remote_decode: true, transfer_id: transferId, ...cap }),
    consumer.generate(PROMPT, S, { do_remote_prefill: true, transfer_id: transferId, remote_engine_id: pd.producer.engineId, ...cap }),
  ]);
  expect(p.error).toBeUndefined();
  expect(d.error).toBeUndefined();
}

/** Another consumer engine of the pair's producer (its own consumer key), configured as the pair's. */
async function secondConsumer(pd: MooncakePD): Promise<Engine> {
  const registry = new KVConnectorRegistry();
  registry.register(createMooncakeConnectorFactory({}));
  const remote_bootstrap_addr = await bootstrapAddressOfEngine(pd.producer);
  const e = new Engine({
    model: 'dense-gqa',
    numBlocks: 256,
    maxNumBatchedTokens: 256,
    registry,
    engineId: `mc-consumer-2-${process.pid}`,
    kvTransferConfig: {
      kv_connector: MOONCAKE_CONNECTOR,
      kv_role: 'kv_consumer',
      enable_kv_checksum: true,
      kv_checksum_fail_closed: false,
      kv_load_failure_policy: 'recompute',
      kv_connector_extra_config: { bootstrap_port: 0, abort_timeout_ms: 10_000, transfer_timeout_ms: 15_000, bootstrap_timeout_ms: 5_000, localize_hold_ms: 60_000, cluster_secret: SECRET, remote_bootstrap_addr },
    },
    observability: new KVChecksumObservability({ level: 'silent' }),
  });
  await e.ready;
  open.push(() => e.shutdown());
  return e;
}

describe('Mooncake transfers with a lease capability (protocol 6)', () => {
  it("another consumer engine that knows the transfer id and sends its md first is refused forbidden, nothing is written into its memory, and the real consumer still loads; its loc without the capability is refused", async () => {
    const pd = await pair();
    const other = await secondConsumer(pd);
    const cap = newLeaseCapability();
    const [w] = pd.producerWorkers();
    // The other engine asks for the transfer before the producer even has it (its md waits), without the capability.
    const stolen = other.generate(PROMPT, S, { do_remote_prefill: true, transfer_id: 'tid-c', remote_engine_id: pd.producer.engineId });
    await until(() => w.stats.metadataReceived >= 1, 5000);
    await load(pd, pd.consumer, 'tid-c', cap);
    const s2 = await stolen;
    expect(s2.error).toBeUndefined(); // its load failed (forbidden) and it recomputed locally
    expect(w.stats.metadataForbidden).toBe(1);
    expect(w.stats.writes).toBe(1); // the real consumer's write only
    expect(await counter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
    expect(pd.producer.scheduler.delayedFree.size).toBe(1); // localize_hold_ms: held for the real consumer
    for (const leaseCapability of [null, newLeaseCapability()]) {
      const err = await askProducerWorker(w.sideChannelAddr!, 'tid-c', small, { secret: Buffer.from(SECRET), maxMessageBytes: 1 << 26, timeoutMs: 3000, consumerKey: newConsumerKey(), leaseCapability }).catch((e: unknown) => e);
      expect(err).toMatchObject({ code: 'forbidden', message: expect.stringMatching(/transfer tid-c: (no|another) lease capability/) });
      expect(String((err as Error).message)).not.toContain(cap);
    }
    expect(w.lastError ?? '').not.toContain(cap);
    const a = await schedulerOf(pd.consumer).localizeKvChecksums({ ...request('tid-c', pd.producer), kvTransferParams: { transfer_id: 'tid-c', remote_engine_id: pd.producer.engineId, lease_capability: cap } }, small, 5000);
    expect(a.status).toBe('held');
    await until(() => pd.producer.scheduler.delayedFree.size === 0, 3000);
  });
});

describe('Mooncake transfers without a lease capability: bound to the first consumer key served', () => {
  it("another consumer's loc is refused forbidden and the hold stays; then the real consumer's loc is answered and ends it", async () => {
    const pd = await pair();
    await load(pd, pd.consumer, 'tid-1');
    expect(await counter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
    expect(pd.producer.scheduler.delayedFree.size).toBe(1);
    const [w] = pd.producerWorkers();
    // The other consumer holds the cluster secret (its hello and loc are proven) and knows the transfer id.
    for (const consumerKey of [newConsumerKey(), null]) {
      const err = await askProducerWorker(w.sideChannelAddr!, 'tid-1', small, { secret: Buffer.from(SECRET), maxMessageBytes: 1 << 26, timeoutMs: 3000, consumerKey }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(SideChannelAuthError);
      expect(err).toMatchObject({ code: 'forbidden', message: expect.stringMatching(/transfer tid-1: served to another consumer/) });
    }
    expect(w.stats.localizeRefused).toBe(2);
    expect(w.stats.localizeAnswered).toBe(0);
    expect(pd.producer.scheduler.delayedFree.size).toBe(1);
    // The consumer the transfer was served to: answered from the held blocks; the answer ends the hold.
    const a = await schedulerOf(pd.consumer).localizeKvChecksums(request('tid-1', pd.producer), small, 5000);
    expect(a.status).toBe('held');
    expect(a.status === 'held' && a.groups[0].sums.length).toBeGreaterThan(0);
    await until(() => pd.producer.scheduler.delayedFree.size === 0, 3000);
  });

  it('an md of another consumer key for a served transfer is refused forbidden: nothing is written into its memory, the hold stays', async () => {
    const pd = await pair();
    const other = await secondConsumer(pd);
    await load(pd, pd.consumer, 'tid-2');
    const [w] = pd.producerWorkers();
    expect(w.stats.writes).toBe(1);
    expect(pd.producer.scheduler.delayedFree.size).toBe(1); // held (localize_hold_ms) and bound to the consumer's key
    const d = await other.generate(PROMPT, S, { do_remote_prefill: true, transfer_id: 'tid-2', remote_engine_id: pd.producer.engineId });
    expect(d.error).toBeUndefined(); // its load failed (forbidden); it recomputed
    expect(w.stats.metadataForbidden).toBe(1);
    expect(w.stats.writes).toBe(1);
    expect(w.lastError).toMatch(/^forbidden: transfer tid-2: served to another consumer \(another consumer key\)/);
    expect(pd.producer.scheduler.delayedFree.size).toBe(1);
  });
});

describe('Mooncake loc budget per transfer', () => {
  it('a peer cycling consumer keys and connections on one transfer is refused busy once its budget is spent; another transfer is still served', async () => {
    // 1 range per second: the bucket (one largest question) does not refill between the asks, however slow the machine.
    const pd = await pair({ localize_ranges_per_second_per_peer: 1 });
    const cap = newLeaseCapability();
    const cap2 = newLeaseCapability();
    const [w] = pd.producerWorkers();
    // Prefilled, not yet asked for by a consumer: held (not served, so an answer does not end the hold).
    for (const [t, c] of [['b1', cap], ['b2', cap2]] as const) expect((await pd.producer.generate(PROMPT, { maxTokens: 1 }, { do_remote_decode: true, transfer_id: t, lease_capability: c })).error).toBeUndefined();
    await until(() => w.pendingCounts().sends === 2, 5000);
    const ask = (t: string, c: string) => askProducerWorker(w.sideChannelAddr!, t, largest, { secret: Buffer.from(SECRET), maxMessageBytes: 1 << 26, timeoutMs: 5000, consumerKey: newConsumerKey(), leaseCapability: c });
    expect((await ask('b1', cap)).status).toBe('held');
    for (let i = 0; i < 3; i++) {
      const e = await ask('b1', cap).catch((x: unknown) => x);
      expect(e).toBeInstanceOf(LocalizeBusyError);
      expect(String((e as Error).message)).toMatch(/more than 1 token ranges per second asked about this request/);
    }
    expect((await ask('b2', cap2)).status).toBe('held');
  });
});

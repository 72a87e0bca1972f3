/**
 * Mooncake `loc` is bound to the consumer the transfer was served to, and budgeted per consumer
 * (`@kvconnect/nixl-common` consumer-binding.ts; docs/localize.md "Binding and budget"), with real
 * engines, ZeroMQ, embedded agents and a cluster secret: another authenticated consumer that knows
 * the transfer id is refused `forbidden` and the producer's hold stays, so the real consumer's
 * later `loc` is answered; a flood of `loc` from one consumer is refused `busy` (its drill-down's
 * `LocalizeBusyError`) while another consumer engine is still served.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { KVChecksumObservability, KVConnectorRegistry, LocalizeBusyError, type ConnectorRequest, type LocalizeQuery } from '@kvconnect/core';
import { Engine } from '@kvconnect/engine';
import { MOONCAKE_CONNECTOR, SideChannelAuthError, askProducerWorker, createMooncakeConnectorFactory, type MooncakeScheduler } from '@kvconnect/mooncake';
import { newConsumerKey } from '@kvconnect/nixl-common';
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

async function pair(): Promise<MooncakePD> {
  const pd = await makeMooncakePD({ model: 'dense-gqa', extra: { localize_hold_ms: 60_000, cluster_secret: SECRET } });
  open.push(() => pd.shutdown());
  return pd;
}

/** One load of `transferId` from the pair's producer into `consumer` (Mooncake's concurrent P/D), verified. */
async function load(pd: MooncakePD, consumer: Engine, transferId: string): Promise<void> {
  const [p, d] = await Promise.all([
    pd.producer.generate(PROMPT, { maxTokens: 1 }, { do_remote_decode: true, transfer_id: transferId }),
    consumer.generate(PROMPT, S, { do_remote_prefill: true, transfer_id: transferId, remote_engine_id: pd.producer.engineId }),
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

describe('Mooncake loc is bound to the consumer the transfer was served to', () => {
  it("another authenticated consumer's loc is refused forbidden and the hold stays; then the real consumer's loc is answered and ends it", async () => {
    const pd = await pair();
    await load(pd, pd.consumer, 'tid-1');
    expect(await counter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
    expect(pd.producer.scheduler.delayedFree.size).toBe(1);
    const [w] = pd.producerWorkers();
    // The other consumer holds the cluster secret (its hello and loc are proven) and knows the transfer id.
    for (const consumerKey of [newConsumerKey(), null]) {
      const err = await askProducerWorker(w.sideChannelAddr!, 'tid-1', small, { secret: Buffer.from(SECRET), maxMessageBytes: 1 << 26, timeoutMs: 3000, consumerKey }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(SideChannelAuthError);
      expect(err).toMatchObject({ code: 'forbidden', message: expect.stringMatching(/transfer tid-1 was served to another consumer/) });
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
});

describe('Mooncake loc budget per consumer', () => {
  it('a flood of loc from one consumer is refused busy past its token ranges per second; another consumer is still served', async () => {
    const pd = await pair();
    const other = await secondConsumer(pd);
    for (const t of ['f1', 'f2', 'f3']) await load(pd, pd.consumer, t);
    await load(pd, other, 'o1');
    expect(pd.producer.scheduler.delayedFree.size).toBe(4);
    const mine = schedulerOf(pd.consumer);
    const asks = await Promise.allSettled(['f1', 'f2', 'f3'].map((t) => mine.localizeKvChecksums(request(t, pd.producer), largest, 5000)));
    // The producer worker answers them one at a time, in the order they arrive: the first spends the budget.
    expect(asks.map((x) => x.status).sort()).toEqual(['fulfilled', 'rejected', 'rejected']);
    for (const x of asks.filter((y) => y.status === 'rejected')) {
      const e = (x as PromiseRejectedResult).reason as unknown;
      expect(e).toBeInstanceOf(LocalizeBusyError);
      expect(String((e as Error).message)).toMatch(/more than 65536 token ranges per second/);
    }
    // Refused busy: those holds stay (their consumer may ask again later).
    expect(pd.producer.scheduler.delayedFree.size).toBe(3);
    const theirs = await schedulerOf(other).localizeKvChecksums(request('o1', pd.producer), largest, 5000);
    expect(theirs.status).toBe('held');
    await until(() => pd.producer.scheduler.delayedFree.size === 2, 3000);
  });
});

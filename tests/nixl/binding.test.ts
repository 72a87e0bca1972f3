/**
 * A NIXL producer's request is acted on only with its lease capability (protocol 19,
 * `@kvconnect/nixl-common` consumer-binding.ts; docs/localize.md "Binding and budget"), with real
 * engines, embedded agents and a cluster secret, pull and push: the producer returns the
 * capability in `kv_transfer_params.lease_capability`; another authenticated cluster member that
 * knows the request id, even one that asks before the real consumer, is refused `forbidden` for
 * `LEASE`, `RELEASE` and `LOCALIZE` (the refusals never hold the capability), the real consumer
 * still loads, its later `LOCALIZE` is answered and its `RELEASE` ends the hold.
 */
import { describe, expect, it } from 'vitest';
import type { ConnectorRequest, KVTransferConfig, LocalizeQuery } from '@kvconnect/core';
import type { Engine } from '@kvconnect/engine';
import { NixlPeers, decodeEmptyBody, newConsumerKey, newLeaseCapability, nixlMetrics, parseNixlConfig, type NixlScheduler } from '@kvconnect/nixl-common';
import { Registry } from 'prom-client';
import { checksumCounter, connectorOf, makeNixlPD, until } from './utils.js';

const PROMPT = 'Whose lease is it? Only the consumer it was served to may end it or ask about it.';
const S = { maxTokens: 2, ignoreEos: true };
const SECRET = 'the-cluster-secret-of-the-nixl-binding-test';
const small: LocalizeQuery = { rangeTokens: 16, groups: [{ groupId: 0, tokenStart: 0, tokenEnd: 16 }] };
const schedulerOf = (e: Engine) => (e as unknown as { connector: NixlScheduler }).connector;

/** Another authenticated consumer's side-channel clients (it holds the cluster secret). */
function intruder(mode: 'pull' | 'push'): NixlPeers {
  const cfg: KVTransferConfig = { kv_connector: connectorOf(mode), kv_role: 'kv_consumer', enable_kv_checksum: true, kv_checksum_fail_closed: false, kv_load_failure_policy: 'recompute', kv_connector_extra_config: { cluster_secret: SECRET } };
  const config = parseNixlConfig(cfg);
  return new NixlPeers({ mode, config, metrics: nixlMetrics(new Registry()) });
}

for (const mode of ['pull', 'push'] as const) {
  describe(`NIXL ${mode}: LOCALIZE and RELEASE of a served request`, () => {
    it("another authenticated member that knows the request id, even one that asks first, is refused forbidden (LEASE, RELEASE, LOCALIZE); the real consumer still loads, its LOCALIZE is answered and its RELEASE ends the hold", async () => {
      const pd = await makeNixlPD({ mode, model: 'dense-gqa', producerExtra: { localize_hold_ms: 60_000, cluster_secret: SECRET }, consumerExtra: { heartbeat_ms: 0, cluster_secret: SECRET } });
      const other = intruder(mode);
      try {
        const p = await pd.producer.generate(PROMPT, { maxTokens: 1 }, { do_remote_decode: true });
        const params: Record<string, unknown> = { ...p.kvTransferParams, do_remote_prefill: true };
        const host = params.remote_host as string;
        const port = params.remote_port as number;
        const id = params.remote_request_id as string;
        const cap = params.lease_capability as string;
        expect(cap).toMatch(/^[0-9a-f]{64}$/);
        const channel = schedulerOf(pd.producer).channel!;
        const texts: string[] = [];
        const forbidden = async (x: Promise<unknown>, why: RegExp) => {
          const e = (await x.then(() => null, (y: unknown) => y)) as { code: string; message: string } | null;
          expect(e).toMatchObject({ code: 'forbidden', message: expect.stringMatching(why) });
          texts.push(e!.message);
        };
        // Before the real consumer's first message: the other member knows the request id, not its capability.
        for (const [key, guess] of [[newConsumerKey(), null], [null, newLeaseCapability()]] as const) {
          const c = other.client(host, port);
          const no = guess === null ? /no lease capability given/ : /another lease capability/;
          await forbidden(other.lease(host, port, [id], 3_600_000, 3000, key, [guess]), no);
          await forbidden(c.request({ type: 'release', requestIds: [id], consumerKey: key, capabilities: [guess] }, decodeEmptyBody, 3000), no);
          await forbidden(other.localize(host, port, id, small, 3000, key, guess), no);
        }
        for (const t of texts) expect(t).not.toContain(cap);
        expect(channel.leases.stateOf(id)).toBe('held');
        // The real consumer still loads (its pin / PUSH_REG carry the capability).
        const d = await pd.consumer.generate(PROMPT, S, params);
        expect(d.error).toBeUndefined();
        expect(await checksumCounter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
        expect(pd.producer.scheduler.delayedFree.size).toBe(1);
        for (const key of [newConsumerKey(), null]) {
          await forbidden(other.localize(host, port, id, small, 3000, key), new RegExp(`request ${id}: no lease capability given`));
          await forbidden(other.client(host, port).request({ type: 'release', requestIds: [id], consumerKey: key }, decodeEmptyBody, 3000), /nothing released/);
        }
        expect(channel.leases.blocksHeld(id)).toBe(true);
        expect(pd.producer.scheduler.delayedFree.size).toBe(1);
        const ask: ConnectorRequest = { requestId: 'ask', promptTokenIds: [], numComputedTokens: 0, numTokens: 0, kvTransferParams: params };
        const a = await schedulerOf(pd.consumer).localizeKvChecksums(ask, small, 5000);
        expect(a.status).toBe('held');
        expect(a.status === 'held' && a.groups[0].sums.length).toBeGreaterThan(0);
        // localizeKvChecksums releases after its LOCALIZE: the hold (60 s) ends now.
        await until(() => pd.producer.scheduler.delayedFree.size === 0, 5000);
      } finally {
        other.close();
        await pd.shutdown();
      }
    });
  });
}

/**
 * A lease capability (`kv_transfer_params.lease_capability`, `@kvconnect/core` lease-capability.ts)
 * never reaches a log line, a metric or an error text: a NIXL pull and push P/D pair logs at level
 * debug into a capture while a load verifies, a load with a tampered capability fails (refused
 * `forbidden`, the load failure policy recomputes) and another cluster member is refused; then
 * no captured line, no metrics text, and no error text holds either capability (the positive
 * control: the producer's returned params do hold it, so the search would find it). The proxy
 * forwards the field untouched to the consumer (sequential), draws one for both sides
 * (concurrent), and leaves it out of the producer's params in its answer to the HTTP client.
 */
import { describe, expect, it } from 'vitest';
import type { KVTransferConfig, LocalizeQuery } from '@kvconnect/core';
import { NixlPeers, SideChannelError, newLeaseCapability, nixlMetrics, parseNixlConfig } from '@kvconnect/nixl-common';
import { PDProxy, startEngineServer, startProxyServer } from '@kvconnect/engine';
import { Registry } from 'prom-client';
import { checksumCounter, connectorOf, makeNixlPD } from './utils.js';

const PROMPT = 'A capability is a secret: it goes to the consumer and nowhere else.';
const S = { maxTokens: 2, ignoreEos: true };
const SECRET = 'the-cluster-secret-of-the-capability-leak-test';
const small: LocalizeQuery = { rangeTokens: 16, groups: [{ groupId: 0, tokenStart: 0, tokenEnd: 16 }] };

for (const mode of ['pull', 'push'] as const) {
  describe(`NIXL ${mode}: the lease capability stays out of logs, metrics and errors`, () => {
    it('a verified load, a load with a tampered capability (forbidden) and an intruder leave no capability in any log line, metric or error text', async () => {
      const lines: string[] = [];
      const pd = await makeNixlPD({ mode, model: 'dense-gqa', logs: { write: (l) => void lines.push(l) }, producerExtra: { cluster_secret: SECRET }, consumerExtra: { cluster_secret: SECRET, heartbeat_ms: 50 }, failClosed: true, policy: 'recompute' });
      const cfg: KVTransferConfig = { kv_connector: connectorOf(mode), kv_role: 'kv_consumer', enable_kv_checksum: true, kv_checksum_fail_closed: false, kv_load_failure_policy: 'recompute', kv_connector_extra_config: { cluster_secret: SECRET } };
      const other = new NixlPeers({ mode, config: parseNixlConfig(cfg), metrics: nixlMetrics(new Registry()) });
      const caps: string[] = [];
      const errors: string[] = [];
      try {
        // 1. A load that verifies.
        const p1 = await pd.producer.generate(PROMPT, { maxTokens: 1 }, { do_remote_decode: true });
        const good = p1.kvTransferParams!;
        caps.push(good.lease_capability as string);
        expect(JSON.stringify(good)).toContain(caps[0]); // positive control
        expect((await pd.consumer.generate(PROMPT, S, { ...good, do_remote_prefill: true })).error).toBeUndefined();
        expect(await checksumCounter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
        // 2. A load whose params carry another capability: refused forbidden, the consumer recomputes.
        const p2 = await pd.producer.generate(PROMPT, { maxTokens: 1 }, { do_remote_decode: true });
        caps.push(p2.kvTransferParams!.lease_capability as string);
        const tampered = newLeaseCapability();
        caps.push(tampered);
        const d2 = await pd.consumer.generate(PROMPT, S, { ...p2.kvTransferParams, do_remote_prefill: true, lease_capability: tampered });
        expect(d2.error).toBeUndefined();
        expect(d2.kvTransferParams ? JSON.stringify(d2.kvTransferParams) : '').not.toContain(tampered);
        expect(await checksumCounter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
        // 3. An intruder that knows the request id, with no or a guessed capability.
        const host = good.remote_host as string;
        const port = good.remote_port as number;
        for (const guess of [null, tampered]) {
          for (const call of [other.lease(host, port, [p2.kvTransferParams!.remote_request_id as string], 1000, 3000, null, [guess]), other.localize(host, port, p2.kvTransferParams!.remote_request_id as string, small, 3000, null, guess)]) {
            const e = await call.then(() => null, (x: unknown) => x);
            expect(e).toBeInstanceOf(SideChannelError);
            expect((e as SideChannelError).code).toBe('forbidden');
            errors.push((e as Error).message);
          }
        }
        await new Promise((r) => setTimeout(r, 150)); // heartbeats and their answers
        const text = [lines.join('\n'), errors.join('\n'), await pd.producerMetrics.metrics(), await pd.consumerMetrics.metrics(), await pd.obs.registry.metrics()].join('\n');
        expect(lines.some((l) => /KV load failed/.test(l))).toBe(true); // the forbidden load was logged
        expect(text).toMatch(/lease capability/); // the refusals say why ...
        for (const c of caps) expect(text).not.toContain(c); // ... never with the capability
      } finally {
        other.close();
        await pd.shutdown();
      }
    });
  });
}

describe('the P/D proxy and the lease capability', () => {
  it('sequential: forwards the producer params untouched to the consumer; concurrent: draws one per request for both sides', async () => {
    const seen: Array<Record<string, unknown> | undefined> = [];
    const cap = newLeaseCapability();
    const endpoint = (engineId: string, returned?: Record<string, unknown>) => ({
      engineId,
      generate: async (_p: unknown, _s: unknown, kv?: Record<string, unknown>) => {
        seen.push(kv);
        return { requestId: engineId, tokenIds: [1], text: 'x', finishReason: 'length' as const, numPreemptions: 0, ...(returned ? { kvTransferParams: returned } : {}) };
      },
    });
    await new PDProxy({ prefill: endpoint('p', { remote_request_id: 'x-p', lease_capability: cap }), decode: endpoint('d') }).generate('hi');
    expect(seen[1]).toMatchObject({ remote_request_id: 'x-p', lease_capability: cap, do_remote_prefill: true });
    seen.length = 0;
    const proxy = new PDProxy({ prefill: endpoint('p'), decode: endpoint('d'), mode: 'concurrent' });
    await proxy.generate('hi');
    await proxy.generate('hi');
    const [p1, d1, p2, d2] = seen.map((k) => k?.lease_capability);
    expect(p1).toMatch(/^[0-9a-f]{64}$/);
    expect(d1).toBe(p1);
    expect(d2).toBe(p2);
    expect(p2).not.toBe(p1);
  });

  it("the proxy server's answer shows the producer's params without lease_capability; the load verifies", async () => {
    const pd = await makeNixlPD({ mode: 'pull', model: 'dense-gqa' });
    const p = await startEngineServer(pd.producer);
    const d = await startEngineServer(pd.consumer);
    const proxy = await startProxyServer({ prefill: [p.url], decode: [d.url] });
    try {
      const res = await fetch(`${proxy.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ prompt: PROMPT, max_tokens: 2, ignore_eos: true }) });
      expect(res.status).toBe(200);
      const body = (await res.json()) as { kvconnect: { prefill: { kv_transfer_params: Record<string, unknown> }; decode: { load?: { verdict: string } } } };
      expect(body.kvconnect.prefill.kv_transfer_params).toMatchObject({ remote_engine_id: pd.producer.engineId });
      expect(body.kvconnect.prefill.kv_transfer_params).not.toHaveProperty('lease_capability');
      expect(body.kvconnect.decode.load?.verdict).toBe('verified');
    } finally {
      await proxy.close();
      await p.close();
      await d.close();
      await pd.shutdown();
    }
  });
});

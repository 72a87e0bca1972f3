/**
 * NIXL pull and push end to end with a cluster secret (`docs/security.md`): the genuine consumer
 * loads and verifies; a consumer without the secret gets no INFO (its load fails and is
 * recomputed, never used). And recovery: a producer restarted on the same side-channel port (new
 * agents, new regions) is handshaken again after the first failed load, so loads recover without
 * restarting the consumer.
 */
import * as net from 'node:net';
import { describe, expect, it } from 'vitest';
import { KVChecksumObservability } from '@kvconnect/core';
import { Engine, PDProxy } from '@kvconnect/engine';
import { NIXL_METRIC_NAMES, type NixlScheduler } from '@kvconnect/nixl-common';
import { Registry } from 'prom-client';
import { checksumCounter, connectorOf, makeNixlPD, metricValue, single, until } from './utils.js';

const SECRET = 'nixl-e2e-cluster-secret-0123456789abcdef';
const PROMPT = 'Only engines that hold the cluster secret may read the producer KV cache blocks.';
const S = { maxTokens: 4, ignoreEos: true };

/** The producer side channel of an engine's NIXL scheduler half (its counters). */
const channelOf = (e: Engine) => (e.kvConnectorScheduler as unknown as NixlScheduler).channel!;

for (const mode of ['pull', 'push'] as const) {
  describe(`NIXL ${mode} with a cluster secret`, () => {
    it('the consumer holding the secret loads and verifies', async () => {
      const ref = await single('dense-gqa').generate(PROMPT, S);
      const extra = { cluster_secret: SECRET };
      const pd = await makeNixlPD({ mode, model: 'dense-gqa', policy: 'fail', producerExtra: extra, consumerExtra: extra });
      try {
        const r = await pd.proxy.generate(PROMPT, S);
        expect(r.error).toBeUndefined();
        expect(r.tokenIds).toEqual(ref.tokenIds);
        expect(await checksumCounter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
        expect(pd.consumer.stats.loadsUsed).toBe(1);
        expect(channelOf(pd.producer).sideChannelStats()?.droppedPeers).toBe(0);
        await until(() => pd.producer.scheduler.delayedFree.size === 0);
      } finally {
        await pd.shutdown();
      }
    });

    it('a consumer without the secret gets no INFO: its load fails and is recomputed', async () => {
      const ref = await single('dense-gqa').generate(PROMPT, S);
      const pd = await makeNixlPD({ mode, model: 'dense-gqa', policy: 'recompute', producerExtra: { cluster_secret: SECRET } });
      try {
        const r = await pd.proxy.generate(PROMPT, S);
        expect(r.tokenIds).toEqual(ref.tokenIds);
        expect(pd.consumer.stats.loadsUsed).toBe(0);
        expect(pd.consumer.stats.loadsRecomputed).toBe(1);
        expect(await metricValue(pd.consumerMetrics, NIXL_METRIC_NAMES.failedTransfers, { reason: 'handshake' })).toBe(1);
        expect(await metricValue(pd.consumerMetrics, NIXL_METRIC_NAMES.handshakes, { result: 'unauthenticated' })).toBe(1);
        expect(channelOf(pd.producer).sideChannelStats()?.droppedPeers).toBeGreaterThanOrEqual(1);
        expect(await checksumCounter(pd.obs, 'loads', { verdict: 'verified' })).toBe(0);
      } finally {
        await pd.shutdown();
      }
    });
  });
}

describe('a flood on the producer side channel during loads', () => {
  for (const mode of ['pull', 'push'] as const) {
    it(`${mode}: peers announcing 64 MiB and 8 MiB frames and trickling are dropped, buffered bytes stay bounded, the load verifies`, async () => {
      const ref = await single('dense-gqa').generate(PROMPT, S);
      const extra = { cluster_secret: SECRET };
      const pd = await makeNixlPD({ mode, model: 'dense-gqa', policy: 'fail', producerExtra: extra, consumerExtra: extra });
      const channel = channelOf(pd.producer);
      const addr = channel.address!;
      const socks: net.Socket[] = [];
      const timers: NodeJS.Timeout[] = [];
      try {
        for (const bytes of [64 << 20, 64 << 20, 64 << 20, 8 << 20, 8 << 20, 8 << 20]) {
          const s = net.createConnection(addr.port, addr.host);
          s.on('error', () => {});
          socks.push(s);
          const pre = Buffer.alloc(4);
          pre.writeUInt32LE(bytes, 0);
          s.write(pre); // queued before any trickled bytes
          timers.push(setInterval(() => s.writable && s.write(Buffer.alloc(4096)), 5));
        }
        let maxBuffered = 0;
        const poll = setInterval(() => (maxBuffered = Math.max(maxBuffered, channel.sideChannelStats()!.bufferedBytes)), 2);
        timers.push(poll);
        const r = await pd.proxy.generate(PROMPT, S);
        expect(r.tokenIds).toEqual(ref.tokenIds);
        expect(await checksumCounter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
        // Before authentication a frame is at most 8 KiB: every flooder is dropped at its prefix.
        await until(() => socks.every((s) => s.destroyed || s.readableEnded), 5000);
        expect(channel.sideChannelStats()!.droppedPeers).toBe(6);
        expect(maxBuffered).toBeLessThanOrEqual(64 * 1024);
      } finally {
        timers.forEach(clearInterval);
        socks.forEach((s) => s.destroy());
        await pd.shutdown();
      }
    });
  }
});

async function freePort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', () => r()));
  const port = (s.address() as net.AddressInfo).port;
  await new Promise((r) => s.close(r));
  return port;
}

describe('recovery after a producer restart on the same side-channel port', () => {
  for (const mode of ['pull', 'push'] as const) {
    it(`${mode}: loads recover without restarting the consumer`, async () => {
      const ref = await single('dense-gqa').generate(PROMPT, S);
      const port = await freePort();
      const base = { model: 'dense-gqa', numBlocks: 128, maxNumBatchedTokens: 256 } as const;
      const extra = { cluster_secret: SECRET, side_channel_port: port };
      const obs = new KVChecksumObservability({ level: 'silent' });
      const producer = () =>
        new Engine({
          ...base,
          engineId: `restart-producer-${mode}`,
          kvTransferConfig: { kv_connector: connectorOf(mode), kv_role: 'kv_producer', enable_kv_checksum: true, kv_connector_extra_config: { ...extra, metrics_registry: new Registry() } },
          observability: new KVChecksumObservability({ level: 'silent' }),
        });
      const consumer = new Engine({
        ...base,
        engineId: `restart-consumer-${mode}`,
        kvTransferConfig: {
          kv_connector: connectorOf(mode),
          kv_role: 'kv_consumer',
          enable_kv_checksum: true,
          kv_checksum_fail_closed: true,
          kv_load_failure_policy: 'recompute',
          kv_connector_extra_config: { cluster_secret: SECRET, metrics_registry: new Registry(), push_timeout_ms: 3000 },
        },
        observability: obs,
      });
      let p = producer();
      await Promise.all([p.ready, consumer.ready]);
      try {
        expect((await new PDProxy({ prefill: p, decode: consumer }).generate(PROMPT, S)).tokenIds).toEqual(ref.tokenIds);
        expect(consumer.stats.loadsUsed).toBe(1);
        await p.shutdown();
        p = producer();
        await p.ready;
        expect(channelOf(p).address?.port).toBe(port);
        const proxy = new PDProxy({ prefill: p, decode: consumer });
        const K = 4;
        for (let i = 0; i < K; i++) expect((await proxy.generate(PROMPT, S)).tokenIds).toEqual(ref.tokenIds);
        // At most the first load after the restart used the old handshake and failed.
        expect(consumer.stats.loadsUsed).toBeGreaterThanOrEqual(1 + K - 1);
        expect(consumer.stats.loadsRecomputed).toBeLessThanOrEqual(1);
        expect(await checksumCounter(obs, 'loads', { verdict: 'verified' })).toBeGreaterThanOrEqual(1 + K - 1);
      } finally {
        await p.shutdown();
        await consumer.shutdown();
      }
    });
  }
});

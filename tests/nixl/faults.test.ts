/**
 * NIXL pull and push under faults, end to end with real EmbeddedAgents: a bit flipped in transit
 * is detected (fail-closed) and recomputed to the single-instance output; an expired lease is
 * caught (consumer lease check, refused PUSH_REG, or a checksum mismatch on reused blocks) and
 * never decoded silently; malformed, unexpected or missing push notifs fail the load instead of
 * hanging; pull and push peers refuse each other; a consumer prefix hit loads only the rest.
 */
import { describe, expect, it } from 'vitest';
import { NIXL_METRIC_NAMES, decodeNotif } from '@kvconnect/nixl-common';
import { checksumCounter, corruptingFactory, makeNixlPD, metricValue, single, until } from './utils.js';
import { transfersUnderTest } from '../transfer-engines.js';

const PROMPT = 'A bit flipped on the wire must never reach the decoder unnoticed, says the spec.';
const OTHER = 'Another prompt entirely, which the producer runs to reuse the freed blocks now!';
const S = { maxTokens: 5, ignoreEos: true };

for (const t of transfersUnderTest('nixl')) {
  describe.skipIf(t.skip !== null)(t.label, () => {
    describe('bit flipped in transit', () => {
      for (const mode of ['pull', 'push'] as const) {
        for (const [name, tp] of [['TP1 -> TP1', 1], ['TP2 -> TP1', 2]] as const) {
          it(`${mode} ${name}: mismatch, fail-closed recompute equals a single instance`, async () => {
            const ref = await single('dense-gqa').generate(PROMPT, S);
            const c = corruptingFactory();
            // The READ's initiator is the consumer; the WRITE's the producer.
            const pd = await makeNixlPD({
              transfer: t.engine,
              mode,
              model: 'dense-gqa',
              producer: { tpSize: tp },
              policy: 'recompute',
              ...(mode === 'pull' ? { consumerExtra: { agent_factory: c.factory } } : { producerExtra: { agent_factory: c.factory } }),
            });
            try {
              c.agents[0].corrupt = 1;
              const r = await pd.proxy.generate(PROMPT, S);
              expect(c.agents[0].corrupted).toBe(1);
              expect(r.error).toBeUndefined();
              expect(r.tokenIds).toEqual(ref.tokenIds);
              expect(await checksumCounter(pd.obs, 'loads', { verdict: 'mismatch' })).toBe(1);
              expect(await checksumCounter(pd.obs, 'recomputed')).toBe(1);
              expect(pd.consumer.stats.loadsRecomputed).toBe(1);
              // A clean request afterwards verifies.
              const r2 = await pd.proxy.generate(PROMPT, S);
              expect(r2.tokenIds).toEqual(ref.tokenIds);
              expect(await checksumCounter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
            } finally {
              await pd.shutdown();
            }
          });
        }
      }

      it('hybrid-mamba2 push TP1 -> TP2 with policy fail ends the request with an error', async () => {
        const c = corruptingFactory();
        const pd = await makeNixlPD({ transfer: t.engine,  mode: 'push', model: 'hybrid-mamba2', consumer: { tpSize: 2 }, policy: 'fail', producerExtra: { agent_factory: c.factory } });
        try {
          c.agents[0].corrupt = 1;
          const r = await pd.proxy.generate(PROMPT, S);
          expect(r.finishReason).toBe('error');
          expect(r.tokenIds).toEqual([]);
          expect(await checksumCounter(pd.obs, 'failed')).toBe(1);
        } finally {
          await pd.shutdown();
        }
      });
    });

    describe('lease expiry (F02)', () => {
      it('pull: the consumer checks the lease before reading; expired -> load fails -> recompute', async () => {
        const ref = await single('dense-gqa').generate(PROMPT, S);
        const pd = await makeNixlPD({ transfer: t.engine,  mode: 'pull', model: 'dense-gqa', producerExtra: { lease_ms: 50 }, consumerExtra: { heartbeat_ms: 0 } });
        try {
          const p = await pd.producer.generate(PROMPT, { maxTokens: 1 }, { do_remote_decode: true });
          expect(typeof p.kvTransferParams?.lease_expiry).toBe('number');
          await until(() => pd.producer.scheduler.delayedFree.size === 0);
          const r = await pd.consumer.generate(PROMPT, S, { ...p.kvTransferParams, do_remote_prefill: true });
          expect(r.tokenIds).toEqual(ref.tokenIds);
          expect(pd.consumer.stats.loadsRecomputed).toBe(1);
          expect(pd.consumer.stats.loadsUsed).toBe(0);
          expect(await metricValue(pd.consumerMetrics, NIXL_METRIC_NAMES.failedTransfers, { reason: 'lease-expired' })).toBe(1);
          expect(await metricValue(pd.producerMetrics, NIXL_METRIC_NAMES.expiredLeases)).toBe(1);
          // Named truthfully: a failed transfer with its cause, never a checksum mismatch.
          expect(await checksumCounter(pd.obs, 'loads', { verdict: 'transfer-failed' })).toBe(1);
          expect(await checksumCounter(pd.obs, 'transferFailed', { reason: 'lease-expired' })).toBe(1);
          expect(await checksumCounter(pd.obs, 'loads', { verdict: 'mismatch' })).toBe(0);
          // Nothing was read.
          expect(await metricValue(pd.consumerMetrics, NIXL_METRIC_NAMES.bytes)).toBe(0);
        } finally {
          await pd.shutdown();
        }
      });

      it('pull without the lease check: blocks reused by another request -> checksum mismatch -> recompute', async () => {
        const ref = await single('dense-gqa').generate(PROMPT, S);
        // 6 blocks: the second prompt must reuse the freed ones.
        const pd = await makeNixlPD({ transfer: t.engine,  mode: 'pull', model: 'dense-gqa', producer: { numBlocks: 6 }, producerExtra: { lease_ms: 50 }, consumerExtra: { heartbeat_ms: 0, lease_check: false } });
        try {
          const p = await pd.producer.generate(PROMPT, { maxTokens: 1 }, { do_remote_decode: true });
          await until(() => pd.producer.scheduler.delayedFree.size === 0);
          await pd.producer.generate(OTHER, { maxTokens: 1 });
          const r = await pd.consumer.generate(PROMPT, S, { ...p.kvTransferParams, do_remote_prefill: true });
          expect(await metricValue(pd.consumerMetrics, NIXL_METRIC_NAMES.bytes)).toBeGreaterThan(0);
          expect(await checksumCounter(pd.obs, 'loads', { verdict: 'mismatch' })).toBe(1);
          expect(r.tokenIds).toEqual(ref.tokenIds);
          expect(pd.consumer.stats.loadsRecomputed).toBe(1);
        } finally {
          await pd.shutdown();
        }
      });

      it('push: a registration after expiry is refused -> load fails -> recompute', async () => {
        const ref = await single('dense-gqa').generate(PROMPT, S);
        const pd = await makeNixlPD({ transfer: t.engine,  mode: 'push', model: 'dense-gqa', producerExtra: { lease_ms: 50 }, consumerExtra: { heartbeat_ms: 0 } });
        try {
          const p = await pd.producer.generate(PROMPT, { maxTokens: 1 }, { do_remote_decode: true });
          await until(() => pd.producer.scheduler.delayedFree.size === 0);
          const r = await pd.consumer.generate(PROMPT, S, { ...p.kvTransferParams, do_remote_prefill: true });
          expect(r.tokenIds).toEqual(ref.tokenIds);
          expect(pd.consumer.stats.loadsRecomputed).toBe(1);
          expect(await metricValue(pd.consumerMetrics, NIXL_METRIC_NAMES.failedTransfers, { reason: 'lease-expired' })).toBe(1);
          expect(await metricValue(pd.producerMetrics, NIXL_METRIC_NAMES.bytes)).toBe(0);
        } finally {
          await pd.shutdown();
        }
      });
    });

    describe('push notifs', () => {
      const cases: Array<[string, (n: Uint8Array) => Uint8Array | undefined, Record<string, unknown>]> = [
        ['malformed (undecodable checksum form)', () => new Uint8Array([...new TextEncoder().encode('KV_CHECKSUM:'), 0xc1]), {}],
        ['malformed (plain form without a size)', () => new TextEncoder().encode('no-size-here'), {}],
        ['unexpected producer TP size', (n) => new TextEncoder().encode(`${decodeNotif(n).remoteRequestId}:7`), {}],
        ['missing (never sent)', () => undefined, { push_timeout_ms: 300 }],
      ];
      for (const [name, mangle, extra] of cases) {
        it(`${name}: the load fails (recompute), never hangs`, async () => {
          const ref = await single('dense-gqa').generate(PROMPT, S);
          const c = corruptingFactory();
          const pd = await makeNixlPD({ transfer: t.engine,  mode: 'push', model: 'dense-gqa', producerExtra: { agent_factory: c.factory }, consumerExtra: extra });
          try {
            c.agents[0].mangleNotif = mangle;
            const r = await pd.proxy.generate(PROMPT, S);
            expect(r.tokenIds).toEqual(ref.tokenIds);
            expect(pd.consumer.stats.loadsRecomputed).toBe(1);
            expect(pd.consumer.stats.loadsUsed).toBe(0);
            const reason = name.startsWith('missing') ? 'timeout' : name.startsWith('unexpected') ? 'unexpected-notif' : 'malformed-notif';
            expect(await metricValue(pd.consumerMetrics, NIXL_METRIC_NAMES.failedTransfers, { reason })).toBe(1);
            expect(await checksumCounter(pd.obs, 'transferFailed', { reason })).toBe(1);
            expect(await checksumCounter(pd.obs, 'loads', { verdict: 'mismatch' })).toBe(0);
          } finally {
            await pd.shutdown();
          }
        });
      }
    });

    describe('handshake compatibility', () => {
      for (const [p, d] of [['pull', 'push'], ['push', 'pull']] as const) {
        it(`a ${p} producer and a ${d} consumer refuse each other: the load fails -> recompute`, async () => {
          const ref = await single('dense-gqa').generate(PROMPT, S);
          const pd = await makeNixlPD({ transfer: t.engine,  mode: p, model: 'dense-gqa', consumerConnector: d === 'pull' ? 'NixlConnector' : 'NixlPushConnector', checksums: false });
          try {
            const r = await pd.proxy.generate(PROMPT, S);
            expect(r.tokenIds).toEqual(ref.tokenIds);
            expect(pd.consumer.stats.loadsRecomputed).toBe(1);
            expect(await metricValue(pd.consumerMetrics, NIXL_METRIC_NAMES.failedTransfers, { reason: 'handshake' })).toBe(1);
            expect(await metricValue(pd.producerMetrics, NIXL_METRIC_NAMES.handshakes, { result: 'refused' })).toBe(1);
          } finally {
            await pd.shutdown();
          }
        });
      }
    });

    describe('consumer prefix hit (F05)', () => {
      for (const mode of ['pull', 'push'] as const) {
        it(`${mode}: only the tokens past the local hit move; output equals a single instance`, async () => {
          const prefix = 'Shared system prompt that the decoder already holds in its prefix cache. ';
          const prompt = `${prefix}Then the question follows.`;
          const ref = await single('dense-gqa').generate(prompt, S);
          const pd = await makeNixlPD({ transfer: t.engine,  mode, model: 'dense-gqa' });
          try {
            await pd.consumer.generate(prefix, { maxTokens: 1 });
            const r = await pd.proxy.generate(prompt, S);
            expect(r.tokenIds).toEqual(ref.tokenIds);
            expect(await checksumCounter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
            const n = pd.consumer.tokenizer.encode(prompt).length;
            const hit = Math.floor(pd.consumer.tokenizer.encode(prefix).length / 16) * 16;
            expect(hit).toBeGreaterThan(0);
            // dense-gqa, bf16: 4 layers x 2 KV heads x (16 K + 16 V) x 2 bytes per token.
            const initiator = mode === 'pull' ? pd.consumerMetrics : pd.producerMetrics;
            expect(await metricValue(initiator, NIXL_METRIC_NAMES.bytes)).toBe((n - hit) * 4 * 2 * 32 * 2);
          } finally {
            await pd.shutdown();
          }
        });
      }
    });
  });
}

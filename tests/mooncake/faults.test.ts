/**
 * MooncakeConnector under faults, end to end in one process (real ZeroMQ, bootstrap and embedded
 * agents): a bit flipped in transit, the consumer asking before the producer has the request, an
 * error response, an older producer without `kv_checksums`, malformed responses, unknown response
 * fields, and a producer request aborted while the consumer waits.
 */
import { describe, expect, it } from 'vitest';
import type { LoadEvent } from '@kvconnect/core';
import { Packr, Unpackr } from 'msgpackr';
import { ConsumerSession, decodeEnvelope, decodeTransferResponse, encodeEnvelope, encodeTransferResponse } from '@kvconnect/mooncake';
import { FlippingAgent, counter, makeMooncakePD, single, until, type MooncakePD } from './utils.js';
import { transfersUnderTest } from '../transfer-engines.js';

const packr = new Packr({ useRecords: false, variableMapSize: true });
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: false });
const PROMPT = 'Mooncake moves the KV cache from the prefill to the decode instance.';
const S = { maxTokens: 6, ignoreEos: true };

function events(pd: MooncakePD, name: 'load-mismatch' | 'load-unverified'): LoadEvent[] {
  const out: LoadEvent[] = [];
  pd.obs.events.on(name, (e: LoadEvent) => void out.push(e));
  return out;
}

for (const t of transfersUnderTest('mooncake')) {
  describe.skipIf(t.skip !== null)(t.label, () => {
    describe('a bit flipped in transit', () => {
      for (const tp of [1, 2]) {
        it(`TP${tp} -> TP1, fail-closed + recompute: detected, recomputed, output equals a single instance`, async () => {
          const agents: FlippingAgent[] = [];
          const pd = await makeMooncakePD({
            transfer: t.engine,
            model: 'dense-gqa',
            producer: { tpSize: tp },
            failClosed: true,
            policy: 'recompute',
            hooks: { wrapAgent: (a, ctx) => (ctx.engineId.startsWith('mc-producer') ? (agents[ctx.tpRank] = new FlippingAgent(a)) : a) },
          });
          try {
            const mism = events(pd, 'load-mismatch');
            agents[agents.length - 1].armed = 1;
            const want = await single('dense-gqa').generate(PROMPT, S);
            const got = await pd.proxy.generate(PROMPT, S);
            expect(agents[agents.length - 1].flipped).toBe(1);
            expect(got.error).toBeUndefined();
            expect(got.tokenIds).toEqual(want.tokenIds);
            expect(mism).toHaveLength(1);
            expect(mism[0].action).toBe('recompute');
            expect(mism[0].verdict.mismatches.length).toBeGreaterThan(0);
            expect(await counter(pd.obs, 'loads', { verdict: 'mismatch' })).toBe(1);
            expect(pd.consumer.stats.loadsRecomputed).toBe(1);
            // A clean request afterwards verifies.
            const again = await pd.proxy.generate(`${PROMPT} Again.`, S);
            expect(again.tokenIds).toEqual((await single('dense-gqa').generate(`${PROMPT} Again.`, S)).tokenIds);
            expect(await counter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
          } finally {
            await pd.shutdown();
          }
        });
      }

      it('fail-closed + fail: the request ends with an error', async () => {
        let agent: FlippingAgent | null = null;
        const pd = await makeMooncakePD({
          transfer: t.engine,
          model: 'hybrid-mamba2',
          failClosed: true,
          policy: 'fail',
          hooks: { wrapAgent: (a, ctx) => (ctx.engineId.startsWith('mc-producer') ? (agent = new FlippingAgent(a)) : a) },
        });
        try {
          agent!.armed = 1;
          const got = await pd.proxy.generate(PROMPT, S);
          expect(got.finishReason).toBe('error');
          expect(got.error).toMatch(/KV checksum mismatch/);
        } finally {
          await pd.shutdown();
        }
      });
    });

    describe('timing', () => {
      it('the consumer asks before the producer has the request: the producer waits for the prefill', async () => {
        const pd = await makeMooncakePD({ transfer: t.engine, model: 'hybrid-mamba2', producer: { tpSize: 2 }, failClosed: true, policy: 'fail' });
        try {
          const want = await single('hybrid-mamba2').generate(PROMPT, S);
          const transfer_id = 'early-transfer';
          const d = pd.consumer.generate(PROMPT, S, { do_remote_prefill: true, transfer_id, remote_engine_id: pd.producer.engineId }, 'early-d');
          // Both producer workers hold the consumer's request before the producer has it.
          await until(() => pd.producerWorkers().every((w) => w.pendingCounts().waiters === 1));
          expect(pd.producerWorkers().every((w) => w.stats.waitedForPrefill === 1)).toBe(true);
          await new Promise((r) => setTimeout(r, 30));
          const p = await pd.producer.generate(PROMPT, { maxTokens: 1 }, { do_remote_decode: true, transfer_id }, 'early-p');
          expect(p.finishReason).toBe('length');
          const got = await d;
          expect(got.error).toBeUndefined();
          expect(got.tokenIds).toEqual(want.tokenIds);
          expect(await counter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
          await until(() => pd.producer.scheduler.delayedFree.size === 0);
        } finally {
          await pd.shutdown();
        }
      });

      it('a producer that never gets the request: the wait times out into an error response, the consumer recomputes', async () => {
        const pd = await makeMooncakePD({ transfer: t.engine, model: 'dense-gqa', extra: { abort_timeout_ms: 200 }, failClosed: true, policy: 'recompute' });
        try {
          const want = await single('dense-gqa').generate(PROMPT, S);
          const got = await pd.consumer.generate(PROMPT, S, { do_remote_prefill: true, transfer_id: 'never', remote_engine_id: pd.producer.engineId }, 'lonely-d');
          expect(got.tokenIds).toEqual(want.tokenIds);
          expect(pd.consumer.stats.loadsRecomputed).toBe(1);
          expect(pd.consumerWorkers()[0].lastError).toMatch(/timed out after 200 ms waiting for the prefill/);
          expect(pd.producerWorkers()[0].stats.errorsSent).toBe(1);
        } finally {
          await pd.shutdown();
        }
      });

      it('the producer request is aborted while the consumer waits: error response, recompute', async () => {
        const pd = await makeMooncakePD({ transfer: t.engine, model: 'dense-gqa', failClosed: true, policy: 'recompute' });
        try {
          const want = await single('dense-gqa').generate(PROMPT, S);
          const transfer_id = 'aborted-transfer';
          const d = pd.consumer.generate(PROMPT, S, { do_remote_prefill: true, transfer_id, remote_engine_id: pd.producer.engineId }, 'ab-d');
          await until(() => pd.producerWorkers()[0].pendingCounts().waiters === 1);
          const p = pd.producer.generate(PROMPT, { maxTokens: 10_000, ignoreEos: true }, { do_remote_decode: true, transfer_id }, 'ab-p');
          await until(() => (pd.producer.scheduler.requests.get('ab-p')?.outputTokenIds.length ?? 0) > 0);
          expect(pd.producer.abort('ab-p')).toBe(true);
          expect((await p).finishReason).toBe('abort');
          const got = await d;
          expect(got.tokenIds).toEqual(want.tokenIds);
          expect(pd.consumer.stats.loadsRecomputed).toBe(1);
          expect(pd.consumerWorkers()[0].lastError).toMatch(/aborted or failed/);
          expect(pd.producer.scheduler.kv.pool.numFree).toBe(pd.producer.scheduler.kv.pool.numBlocks);
        } finally {
          await pd.shutdown();
        }
      });
    });

    describe('responses', () => {
      it('an error response (the producer cannot write the layout: dtypes differ) fails the load; recompute completes it', async () => {
        const pd = await makeMooncakePD({ transfer: t.engine, model: 'dense-gqa', consumer: { kvDtype: 'float32' }, failClosed: true, policy: 'recompute' });
        try {
          const want = await single('dense-gqa', { kvDtype: 'float32' }).generate(PROMPT, S);
          const got = await pd.proxy.generate(PROMPT, S);
          expect(got.error).toBeUndefined();
          expect(got.tokenIds).toEqual(want.tokenIds);
          expect(pd.producerWorkers()[0].stats.errorsSent).toBe(1);
          expect(pd.consumerWorkers()[0].stats.loadsFailed).toBe(1);
          expect(pd.consumerWorkers()[0].lastError).toMatch(/dtype float32 on the consumer, bfloat16 on the producer/);
          expect(pd.consumer.stats.loadsRecomputed).toBe(1);
          await until(() => pd.producer.scheduler.delayedFree.size === 0);
        } finally {
          await pd.shutdown();
        }
      });

      it('an error response under policy fail ends the request with an error', async () => {
        const pd = await makeMooncakePD({ transfer: t.engine, model: 'dense-gqa', consumer: { kvDtype: 'float32' }, checksums: false, policy: 'fail' });
        try {
          const got = await pd.proxy.generate(PROMPT, S);
          expect(got.finishReason).toBe('error');
          // The cause reaches the request's error: the producer's error response, not "invalid blocks".
          expect(got.error).toMatch(/failed in transit \(producer-error: producer tcp:\/\/127\.0\.0\.1:\d+: .*dtype float32 on the consumer, bfloat16 on the producer\)/);
        } finally {
          await pd.shutdown();
        }
      });

      it('an older producer (no kv_checksums in its responses): the load is unverified; fail-closed recomputes', async () => {
        const pd = await makeMooncakePD({ transfer: t.engine, model: 'dense-gqa', producerChecksums: false, failClosed: true, policy: 'recompute' });
        try {
          const un = events(pd, 'load-unverified');
          const want = await single('dense-gqa').generate(PROMPT, S);
          const got = await pd.proxy.generate(PROMPT, S);
          expect(got.tokenIds).toEqual(want.tokenIds);
          expect(un).toHaveLength(1);
          expect(un[0].verdict.unverified.map((u) => u.reason)).toEqual(['no-payload']);
          expect(pd.consumerWorkers()[0].stats.loadsFinished).toBe(1); // the transfer itself worked
          expect(pd.consumer.stats.loadsRecomputed).toBe(1);
        } finally {
          await pd.shutdown();
        }
      });

      it('fail-open: an unverified load is used as loaded', async () => {
        const pd = await makeMooncakePD({ transfer: t.engine, model: 'dense-gqa', producerChecksums: false, failClosed: false });
        try {
          const want = await single('dense-gqa').generate(PROMPT, S);
          const got = await pd.proxy.generate(PROMPT, S);
          expect(got.tokenIds).toEqual(want.tokenIds);
          expect(await counter(pd.obs, 'loads', { verdict: 'unverified' })).toBe(1);
          expect(pd.consumer.stats.loadsUsed).toBe(1);
        } finally {
          await pd.shutdown();
        }
      });

      it('unknown response fields are ignored: the load verifies', async () => {
        const pd = await makeMooncakePD({
          transfer: t.engine,
          model: 'dense-gqa',
          failClosed: true,
          policy: 'fail',
          hooks: {
            onResponse: (b) => {
              const m = unpackr.unpack(b) as Map<string, unknown>;
              m.set('prefix_replay_checkpoints', [1, 2, 3]);
              m.set('future', new Map([['x', 1]]));
              return packr.pack(m);
            },
          },
        });
        try {
          const got = await pd.proxy.generate(PROMPT, S);
          expect(got.error).toBeUndefined();
          expect(await counter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
        } finally {
          await pd.shutdown();
        }
      });

      it('a malformed response (not a transfer response) fails the load without an exception; recompute completes it', async () => {
        let n = 0;
        const pd = await makeMooncakePD({
          transfer: t.engine,
          model: 'dense-gqa',
          failClosed: true,
          policy: 'recompute',
          hooks: { onResponse: (b) => (n++ === 0 ? new Uint8Array([0x93, 0x01, 0xc1, 0xff]) : b) },
        });
        try {
          const want = await single('dense-gqa').generate(PROMPT, S);
          const got = await pd.proxy.generate(PROMPT, S);
          expect(got.tokenIds).toEqual(want.tokenIds);
          const cw = pd.consumerWorkers()[0];
          expect(cw.stats.responsesMalformed).toBe(1);
          expect(cw.lastError).toMatch(/malformed transfer response/);
          expect(pd.consumer.stats.loadsRecomputed).toBe(1);
          // The next request is unaffected.
          const again = await pd.proxy.generate(PROMPT, S);
          expect(again.tokenIds).toEqual(want.tokenIds);
          expect(await counter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
        } finally {
          await pd.shutdown();
        }
      });

      for (const [what, mutate, reason] of [
        ['a payload that is not a checksum payload', (p: Uint8Array) => p.subarray(0, 3), 'malformed-payload'],
        ['a wrongly typed kv_checksums entry', null, 'malformed'],
      ] as const) {
        it(`${what}: no exception; the load is unverified or failed, and recomputed`, async () => {
          const pd = await makeMooncakePD({
            transfer: t.engine,
            model: 'hybrid-mamba2',
            failClosed: true,
            policy: 'recompute',
            hooks: {
              onResponse: (b) => {
                const r = decodeTransferResponse(b);
                if (mutate) {
                  for (const [k, p] of r.kvChecksums) r.kvChecksums.set(k, mutate(p));
                  return encodeTransferResponse(r);
                }
                const m = unpackr.unpack(b) as Map<string, unknown>;
                if (m.has('kv_checksums')) m.set('kv_checksums', new Map([...(m.get('kv_checksums') as Map<string, unknown>).keys()].map((k) => [k, 'not bytes'])));
                return packr.pack(m);
              },
            },
          });
          try {
            const un = events(pd, 'load-unverified');
            const want = await single('hybrid-mamba2').generate(PROMPT, S);
            const got = await pd.proxy.generate(PROMPT, S);
            expect(got.tokenIds).toEqual(want.tokenIds);
            expect(pd.consumer.stats.loadsRecomputed).toBe(1);
            if (reason === 'malformed-payload') {
              expect(un).toHaveLength(1);
              expect(un[0].verdict.unverified.map((u) => u.reason)).toEqual(['malformed-payload']);
            } else {
              // The whole response is rejected by the strict decoder: the load failed.
              expect(pd.consumerWorkers()[0].stats.responsesMalformed).toBe(1);
              expect(pd.consumerWorkers()[0].lastError).toMatch(/kv_checksums/);
            }
          } finally {
            await pd.shutdown();
          }
        });
      }
    });

    describe('producer robustness', () => {
      it('keeps finished blocks until every consumer worker was served, or until the lease expires', async () => {
        const pd = await makeMooncakePD({ transfer: t.engine, model: 'dense-gqa', extra: { abort_timeout_ms: 150 } });
        try {
          const r = await pd.producer.generate(PROMPT, { maxTokens: 1 }, { do_remote_decode: true, transfer_id: 'nobody-asks' }, 'lease-p');
          expect(r.kvTransferParams).toBeUndefined(); // the proxy already sent the consumer its params
          expect(pd.producer.scheduler.delayedFree.size).toBe(1);
          await new Promise((res) => setTimeout(res, 60));
          expect(pd.producer.scheduler.delayedFree.size).toBe(1);
          await until(() => pd.producer.scheduler.delayedFree.size === 0, 3000);
          expect(pd.producerWorkers()[0].stats.leasesExpired).toBe(1);
          expect(pd.producer.scheduler.kv.pool.numFree).toBe(pd.producer.scheduler.kv.pool.numBlocks);
          // A consumer asking after the lease: an error response at once (not a wait), then recompute.
          const want = await single('dense-gqa').generate(PROMPT, S);
          const got = await pd.consumer.generate(PROMPT, S, { do_remote_prefill: true, transfer_id: 'nobody-asks', remote_engine_id: pd.producer.engineId }, 'late-d');
          expect(got.tokenIds).toEqual(want.tokenIds);
          expect(pd.consumerWorkers()[0].lastError).toMatch(/lease of transfer nobody-asks expired/);
          expect(pd.producerWorkers()[0].stats.waitedForPrefill).toBe(0);
        } finally {
          await pd.shutdown();
        }
      });

      it('malformed metadata on the side channel gets an error response; the producer keeps serving', async () => {
        const zmq = await import('zeromq');
        const pd = await makeMooncakePD({ transfer: t.engine, model: 'dense-gqa', failClosed: true, policy: 'fail' });
        const dealer = new zmq.Dealer({ linger: 0 });
        try {
          const pw = pd.producerWorkers()[0];
          dealer.connect(pw.sideChannelAddr!);
          // Not an envelope, and a version-1 message (a bare map): refused with a reason.
          for (const [junk, code] of [
            [new Uint8Array([0xff, 0x00, 0x13]), 'bad-message'],
            [new Uint8Array(packr.pack(new Map([['tp_size', 'two']]))), 'incompatible'],
          ] as const) {
            await dealer.send(junk);
            const [reply] = await dealer.receive();
            const e = decodeEnvelope(reply);
            expect(e).toMatchObject({ kind: 'refuse', code });
            expect(e.message).toMatch(/mooncake side channel/);
          }
          // After the handshake, a malformed metadata body gets an error response.
          const session = new ConsumerSession(null);
          await dealer.send(encodeEnvelope(session.hello()));
          session.welcome(decodeEnvelope((await dealer.receive())[0]));
          await dealer.send(encodeEnvelope(session.seal(new Uint8Array(packr.pack(new Map([['tp_size', 'two']]))))));
          const r = decodeTransferResponse(session.open(decodeEnvelope((await dealer.receive())[0])));
          expect(r.status).toBe(2);
          expect(r.errMsg).toMatch(/mooncake side channel: tp_size/);
          expect(pw.stats.metadataRejected).toBe(3);
          const got = await pd.proxy.generate(PROMPT, S);
          expect(got.tokenIds).toEqual((await single('dense-gqa').generate(PROMPT, S)).tokenIds);
          expect(await counter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
        } finally {
          dealer.close();
          await pd.shutdown();
        }
      });
    });
  });
}

/** A producer agent that refuses the consumer's (remote) descriptors and counts its open descriptor lists. */
class RefusingRemoteAgent extends FlippingAgent {
  /** Descriptor lists prepared and not released. */
  open = 0;
  refused = 0;
  override async prepDescList(agent: string | null, kind: 'DRAM' | 'VRAM', descs: Parameters<FlippingAgent['prepDescList']>[2]) {
    if (agent !== null) {
      this.refused++;
      throw new Error('the consumer advertised regions this agent refuses');
    }
    const l = await super.prepDescList(agent, kind, descs);
    this.open++;
    return l;
  }
  override async releaseDescList(l: Parameters<FlippingAgent['releaseDescList']>[0]) {
    this.open--;
    return super.releaseDescList(l);
  }
}

describe('producer descriptor lists', () => {
  it('a refused remote descriptor list releases the local one (a peer cannot leak lists); the load fails and is recomputed', async () => {
    let agent: RefusingRemoteAgent | null = null;
    const pd = await makeMooncakePD({
      model: 'dense-gqa',
      policy: 'recompute',
      hooks: { wrapAgent: (a, ctx) => (ctx.engineId.startsWith('mc-producer') ? (agent = new RefusingRemoteAgent(a)) : a) },
    });
    try {
      for (let i = 0; i < 3; i++) {
        const got = await pd.proxy.generate(`${PROMPT} ${i}`, S);
        expect(got.error).toBeUndefined();
        expect(got.tokenIds).toEqual((await single('dense-gqa').generate(`${PROMPT} ${i}`, S)).tokenIds);
      }
      expect(agent!.refused).toBe(3);
      expect(agent!.open).toBe(0);
      expect(pd.consumerWorkers()[0].lastError).toMatch(/refuses/);
    } finally {
      await pd.shutdown();
    }
  });
});

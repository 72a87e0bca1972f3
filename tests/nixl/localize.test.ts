/**
 * `LOCALIZE` over the NIXL side channel (docs/localize.md) with real engines and embedded agents:
 * a verified load sends exactly the frames and bytes it sent before localization existed (no
 * `LOCALIZE`, and holding the blocks with `localize_hold_ms` changes nothing on the wire); a
 * mismatched load adds one `LOCALIZE` and one `RELEASE`; a producer that freed the blocks answers
 * `gone`.
 */
import { describe, expect, it } from 'vitest';
import type { Localization } from '@kvconnect/core';
import type { Engine } from '@kvconnect/engine';
import type { NixlScheduler } from '@kvconnect/nixl-common';
import { checksumCounter, corruptingFactory, makeNixlPD, until } from './utils.js';

const PROMPT = 'Where did the bit flip land? The consumer asks the producer, block by block, head by head.';
const S = { maxTokens: 3, ignoreEos: true };

/** The engine's connector scheduler half (private to the engine; a test reads the producer's side channel through it). */
const schedulerOf = (e: Engine) => (e as unknown as { connector: NixlScheduler }).connector;

/** What the producer's side channel received: frames, bytes, and requests by type. */
function received(e: Engine) {
  const ch = schedulerOf(e).channel!;
  const s = ch.sideChannelStats()!;
  return { frames: s.framesIn, bytes: s.bytesIn, served: { ...ch.served } };
}

describe('the verified path is unchanged', () => {
  it('same frames and bytes with and without localize_hold_ms; no LOCALIZE', async () => {
    const seen = [];
    for (const hold of [0, 2000]) {
      // heartbeat_ms 0: no timer-driven LEASE frames, so the count is the load's own.
      const pd = await makeNixlPD({ mode: 'pull', model: 'dense-gqa', producer: { tpSize: 2 }, producerExtra: { localize_hold_ms: hold }, consumerExtra: { heartbeat_ms: 0 } });
      try {
        const r = await pd.proxy.generate(PROMPT, S);
        expect(r.error).toBeUndefined();
        expect(await checksumCounter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
        seen.push(received(pd.producer));
        expect(await checksumCounter(pd.obs, 'localizations')).toBe(0);
      } finally {
        await pd.shutdown();
      }
    }
    expect(seen[0].served.localize).toBe(0);
    expect(seen[1]).toEqual(seen[0]);
  });

  it('a mismatched load adds exactly one LOCALIZE and one RELEASE, and is localized', async () => {
    const c = corruptingFactory();
    const pd = await makeNixlPD({ mode: 'pull', model: 'dense-gqa', producer: { tpSize: 2 }, policy: 'recompute', producerExtra: { localize_hold_ms: 3000 }, consumerExtra: { heartbeat_ms: 0, agent_factory: c.factory } });
    const events: Localization[] = [];
    pd.obs.events.on('load-localized', (e) => events.push(e));
    try {
      await pd.proxy.generate(PROMPT, S);
      const clean = received(pd.producer);
      c.agents[0].corrupt = 1;
      const r = await pd.proxy.generate(PROMPT, S);
      expect(r.error).toBeUndefined();
      expect(await checksumCounter(pd.obs, 'loads', { verdict: 'mismatch' })).toBe(1);
      await until(() => events.length > 0 && received(pd.producer).served.release > clean.served.release);
      const after = received(pd.producer);
      expect(after.served.localize - clean.served.localize).toBe(1);
      expect(after.served.release - clean.served.release).toBe(1);
      // Every other request type as for the clean load (LEASE pins only).
      expect(after.served.info).toBe(clean.served.info);
      expect(events.map((e) => e.status)).toEqual(['localized']);
      // The corrupting agent flips one bit of one READ's first byte: one layer, one head, K or V, one range.
      expect(events[0].groups).toHaveLength(1);
      expect(events[0].groups[0].regions).toHaveLength(1);
      expect(events[0].groups[0].regions[0].heads[0]).toBe(events[0].groups[0].regions[0].heads[1]);
    } finally {
      await pd.shutdown();
    }
  });
});

describe('the producer no longer holds the blocks', () => {
  it('LOCALIZE after the producer freed them: gone', async () => {
    const pd = await makeNixlPD({ mode: 'pull', model: 'dense-gqa', consumerExtra: { heartbeat_ms: 0 } });
    try {
      const p = await pd.producer.generate(PROMPT, { maxTokens: 1 }, { do_remote_decode: true });
      const params = { ...p.kvTransferParams, do_remote_prefill: true };
      await pd.consumer.generate(PROMPT, S, params);
      await until(() => pd.producer.scheduler.delayedFree.size === 0);
      const answer = await schedulerOf(pd.consumer).localizeKvChecksums({ requestId: 'x', promptTokenIds: [], numComputedTokens: 0, numTokens: 0, kvTransferParams: params }, { rangeTokens: 16, groups: [{ groupId: 0, tokenStart: 0, tokenEnd: 16 }] }, 2000);
      expect(answer.status).toBe('gone');
      expect(answer.status === 'gone' && answer.detail).toMatch(/blocks freed \(lease done\)/);
    } finally {
      await pd.shutdown();
    }
  });
});

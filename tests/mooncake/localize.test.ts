/**
 * Localization over MooncakeConnector's side channel (`loc`, protocol 4; docs/localize.md) with
 * real engines, ZeroMQ and embedded agents: a verified load sends exactly the messages it sent
 * before (no `loc`; holding the blocks with `localize_hold_ms` changes nothing on the wire), a
 * mismatched load adds one hello and one `loc` per producer worker and ends the hold early; with KV
 * in (emulated) device memory the mismatched blocks are read back from the device and localized.
 * (packages/harness/test/localize-mooncake.test.ts: where the drill-down points, and `gone`.)
 */
import { describe, expect, it } from 'vitest';
import type { Localization } from '@kvconnect/core';
import { emulatedDeviceMemory, type MakeTransferArgs, type TransferAgent, type TransferRequest } from '@kvconnect/transfer';
import { FlippingAgent, counter, makeMooncakePD, until, type MooncakePD } from './utils.js';

const PROMPT = 'Where did the bit flip land? The consumer asks the producer workers, head by head.';
const S = { maxTokens: 3, ignoreEos: true };

const producerStats = (pd: MooncakePD) => pd.producerWorkers().map((w) => ({ messagesIn: w.stats.messagesIn, localizeReceived: w.stats.localizeReceived }));

describe('Mooncake localization on the wire', () => {
  it('a verified load: the same producer messages with and without localize_hold_ms, no loc', async () => {
    const seen = [];
    for (const hold of [0, 2000]) {
      const pd = await makeMooncakePD({ model: 'dense-gqa', producer: { tpSize: 2 }, extra: { localize_hold_ms: hold } });
      try {
        const r = await pd.proxy.generate(PROMPT, S);
        expect(r.error).toBeUndefined();
        expect(await counter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
        expect(await counter(pd.obs, 'localizations')).toBe(0);
        // The hold keeps the producer's blocks; without one they are freed once served.
        if (hold > 0) expect(pd.producer.scheduler.delayedFree.size).toBe(1);
        else await until(() => pd.producer.scheduler.delayedFree.size === 0, 3000);
        seen.push(producerStats(pd));
      } finally {
        await pd.shutdown();
      }
    }
    expect(seen[0].every((s) => s.localizeReceived === 0 && s.messagesIn > 0)).toBe(true);
    expect(seen[1]).toEqual(seen[0]);
  });

  it('a mismatched load adds one hello and one loc per producer worker, is localized, and ends the hold', async () => {
    const agents: FlippingAgent[] = [];
    const pd = await makeMooncakePD({
      model: 'dense-gqa',
      producer: { tpSize: 2 },
      policy: 'recompute',
      extra: { localize_hold_ms: 60_000 },
      hooks: { wrapAgent: (a, ctx) => (ctx.engineId.startsWith('mc-producer') ? (agents[ctx.tpRank] = new FlippingAgent(a)) : a) },
    });
    const events: Localization[] = [];
    pd.obs.events.on('load-localized', (e: Localization) => events.push(e));
    try {
      const before = producerStats(pd);
      agents[1].armed = 1;
      const r = await pd.proxy.generate(PROMPT, S);
      expect(r.error).toBeUndefined();
      expect(agents[1].flipped).toBe(1);
      expect(await counter(pd.obs, 'loads', { verdict: 'mismatch' })).toBe(1);
      await until(() => events.length > 0, 5000);
      expect(events.map((e) => e.status)).toEqual(['localized']);
      // One bit of one WRITE's first descriptor: one layer, one head, K or V, one range.
      expect(events[0].groups).toHaveLength(1);
      expect(events[0].groups[0].regions).toHaveLength(1);
      expect(events[0].groups[0].regions[0].heads[0]).toBe(events[0].groups[0].regions[0].heads[1]);
      const after = producerStats(pd);
      // The load's own messages (hello + md per worker connection) plus the drill-down's hello + loc.
      expect(after.map((s, i) => s.messagesIn - before[i].messagesIn)).toEqual([4, 4]);
      expect(after.map((s) => s.localizeReceived)).toEqual([1, 1]);
      // Answered: the hold (60 s) ended at once.
      await until(() => pd.producer.scheduler.delayedFree.size === 0, 3000);
    } finally {
      await pd.shutdown();
    }
  });
});

/**
 * A producer agent (KV in emulated device memory, consumer too, one process) that, while armed,
 * flips bit 0x40 of byte 1 of the next WRITE's first remote descriptor once the WRITE is done: the
 * consumer's blocks then differ from what the producer holds and checksummed. `toDevice` turns a
 * descriptor address (the consumer agent's registered address) into the consumer's device address.
 */
function deviceFlipping(inner: TransferAgent, toDevice: (agentAddr: number) => { device: number; address: bigint }): { agent: TransferAgent; arm(): void; flipped(): number } {
  const dev = emulatedDeviceMemory();
  const first = new WeakMap<TransferRequest, { addr: number; deviceId: number }>();
  let armed = 0;
  let flipped = 0;
  const agent = new Proxy(inner, {
    get(t, k) {
      if (k === 'makeTransfer')
        return async (args: MakeTransferArgs) => {
          const req = await t.makeTransfer(args);
          const d = args.remote.descs[(args.remoteIndices ?? [0])[0]];
          if (d && args.remote.kind === 'VRAM') first.set(req, { addr: d.addr, deviceId: d.deviceId ?? 0 });
          return req;
        };
      if (k === 'post')
        return async (req: TransferRequest) => {
          const d = first.get(req);
          if (!d || req.op !== 'WRITE' || armed === 0) return t.post(req);
          armed--;
          let st = await t.post(req);
          if (st === 'in-progress') st = await t.wait(req);
          if (st === 'done') {
            flipped++;
            const at = toDevice(d.addr + 1);
            const b = new Uint8Array(1);
            dev.copy(at.device, 'd2h', b, at.address, 1);
            b[0] ^= 0x40;
            dev.copy(at.device, 'h2d', at.address, b, 1);
          }
          return st;
        };
      const v = Reflect.get(t, k, t) as unknown;
      return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(t) : v;
    },
  });
  return { agent, arm: () => void armed++, flipped: () => flipped };
}

/** The consumer worker's device address of agent address `x` (its registered regions, in order of its KV regions). */
function consumerDevice(pd: MooncakePD, x: number): { device: number; address: bigint } {
  const w = pd.consumerWorkers()[0];
  const regs = (w as unknown as { regions: ReadonlyArray<{ addr: number; length: number }> }).regions;
  const i = regs.findIndex((r) => x >= r.addr && x < r.addr + r.length);
  const r = pd.consumer.workers[0][0].kvCaches().regions[i] as { device: number; address: bigint };
  return { device: r.device, address: r.address + BigInt(x - regs[i].addr) };
}

describe('Mooncake localization with device KV (cuda-emulated)', () => {
  it('a bit flipped in device memory is localized: the mismatched blocks are read back from the device', async () => {
    let f: ReturnType<typeof deviceFlipping> | null = null;
    const pd: MooncakePD = await makeMooncakePD({
      model: 'dense-gqa',
      producer: { device: 'cuda-emulated' },
      consumer: { device: 'cuda-emulated' },
      policy: 'recompute',
      extra: { localize_hold_ms: 60_000 },
      hooks: { wrapAgent: (a, ctx) => (ctx.engineId.startsWith('mc-producer') ? (f = deviceFlipping(a, (x) => consumerDevice(pd, x))).agent : a) },
    });
    const events: Localization[] = [];
    pd.obs.events.on('load-localized', (e: Localization) => events.push(e));
    try {
      f!.arm();
      const r = await pd.proxy.generate(PROMPT, S);
      expect(r.error).toBeUndefined();
      expect(f!.flipped()).toBe(1);
      expect(await counter(pd.obs, 'loads', { verdict: 'mismatch' })).toBe(1);
      await until(() => events.length > 0, 5000);
      expect(events[0].status).toBe('localized');
      expect(events[0].groups).toHaveLength(1);
      expect(events[0].groups[0].regions).toHaveLength(1);
      expect(events[0].groups[0].regions[0].heads[0]).toBe(events[0].groups[0].regions[0].heads[1]);
    } finally {
      await pd.shutdown();
    }
  });
});

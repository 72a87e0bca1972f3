/**
 * More hostile targets for lanes and the stall check (`stallTimeoutMs`, `OutConn.checkStall`,
 * `EmbeddedAgent.laneStalled`, `OutLink` reopening): late bytes around a stall verdict, a target
 * that drips one byte at a time to keep a lane "alive", every lane silent at once, and a target
 * that admits lanes and closes them at once (reopen storm), then the agent's close.
 */
import { describe, expect, it } from 'vitest';
import { EmbeddedAgent } from '../src/index.js';
import { encodeFrame, F } from '../src/wire.js';
import { FakeTarget, rdata } from './fake-target.js';
import { pattern } from './patterns.js';
import { answerOf, answering, io, lanesRig, sleep, until } from './lanes-rig.js';

const { uniq, cleanup, warmed } = lanesRig('h18');

const busy = (ms: number) => {
  const end = Date.now() + ms;
  while (Date.now() < end);
};

describe('bad lanes / stallTimeoutMs options', () => {
  it('lanes outside 1..8 or not an integer, stallTimeoutMs negative or not an integer: a typed TransferError (invalid), no agent', async () => {
    for (const lanes of [0, 9, -1, 2.5, '4', 1e9, 2 ** 53, NaN, Infinity, null, true]) {
      await expect(EmbeddedAgent.create({ name: uniq('bad'), lanes: lanes as number }), `lanes ${String(lanes)}`).rejects.toMatchObject({ name: 'TransferError', kind: 'invalid' });
    }
    for (const stallTimeoutMs of [-1, 2.5, '100', NaN, Infinity, 2 ** 53]) {
      await expect(EmbeddedAgent.create({ name: uniq('bad'), lanes: 2, stallTimeoutMs: stallTimeoutMs as number }), `stallTimeoutMs ${String(stallTimeoutMs)}`).rejects.toMatchObject({ name: 'TransferError', kind: 'invalid' });
    }
  });
});

describe('late bytes around a stall verdict', () => {
  for (const [n, chunkBytes] of [[1 << 20, 64 * 1024], [8 << 20, 4 << 20]] as const) it(`a stalled lane that sent half a wrong answer, then the rest after the verdict (${chunkBytes >> 10} KiB frames${chunkBytes >= 256 * 1024 ? ', read in place' : ''}): the re-requested READ lands the right bytes once; nothing changes 300 ms after the return`, async () => {
    const s = await warmed(2, n, { stallTimeoutMs: 200, transferTimeoutMs: 60_000, chunkBytes });
    const src = pattern(n, 21);
    s.local.fill(7);
    const lane = s.extra[0]!;
    const stop = answering(s.t, src, () => s.t.conns.filter((c) => c !== lane));
    cleanup.push(async () => stop());
    const req = await s.a.makeTransfer({ op: 'READ', local: s.l, remote: s.r });
    await s.a.post(req);
    await until(() => lane.frames.length > 0, 'frames on the lane');
    const h = io(lane.frames[0]!);
    // Half of a wrong answer, then silence: the lane stalls with this frame part-landed.
    lane.socket.write(encodeFrame([F.RDATA, h.id], h.bytes));
    lane.socket.write(new Uint8Array(h.bytes / 2).fill(0xee));
    await until(() => lane.closed, 'the stall verdict (the initiator closes the lane)');
    // The rest of the wrong answer and wrong answers of every other frame of the lane, late.
    lane.socket.write(new Uint8Array(h.bytes / 2).fill(0xee));
    for (const f of lane.frames.slice(1)) rdata(lane, io(f).id, new Uint8Array(io(f).bytes).fill(0xee));
    expect(await s.a.wait(req)).toBe('done');
    const atReturn = Buffer.from(s.local);
    expect(atReturn.equals(Buffer.from(src))).toBe(true);
    await sleep(300);
    expect(Buffer.from(s.local).equals(atReturn)).toBe(true);
    expect(s.a.laneEvents.stalled).toBe(1);
    expect(s.a.laneEvents.rerouted).toBe(lane.frames.length);
    // Each frame of the transfer was asked once more on a live connection.
    expect(s.t.conns.filter((c) => c !== lane).reduce((k, c) => k + c.frames.length, 0)).toBe(n / chunkBytes);
  });

  it('bytes that reach the kernel before a late stall timer fires (the event loop was busy) are no stall: the lane lives, the transfer completes', async () => {
    const n = 1 << 20;
    const s = await warmed(2, n, { stallTimeoutMs: 200, transferTimeoutMs: 60_000 });
    const src = pattern(n, 22);
    const lane = s.extra[0]!;
    const stop = answering(s.t, src, () => s.t.conns.filter((c) => c !== lane));
    cleanup.push(async () => stop());
    const req = await s.a.makeTransfer({ op: 'READ', local: s.l, remote: s.r });
    await s.a.post(req);
    await until(() => lane.frames.length > 0 && s.t.conns.reduce((k, c) => k + c.frames.length, 0) === 16, 'the 16 frames');
    await sleep(100);
    // The answers go to the kernel now; this process then does not poll for 300 ms, past the bound.
    // Blocked in the check phase (setImmediate): the next loop turn runs the due stall timer
    // before it polls the sockets, so the first verdict sees silence and only its confirmation,
    // after the poll, sees the bytes.
    await new Promise<void>((resolve) =>
      setImmediate(() => {
        for (const f of lane.frames) rdata(lane, io(f).id, answerOf(s.t, src, f));
        busy(300);
        resolve();
      }),
    );
    expect(await s.a.wait(req)).toBe('done');
    expect(Buffer.from(s.local).equals(Buffer.from(src))).toBe(true);
    expect(s.a.laneEvents.stalled).toBe(0);
    expect(lane.closed).toBe(false);
  });
});

describe('a target that drips bytes to look alive', () => {
  it('one byte per 20 ms on a lane: no stall verdict by bytes; the transfer ends at its deadline (timeout), and that closes the lane as stalled (no frame answered), so the next transfers, posted while it still drips, complete', async () => {
    const n = 1 << 20;
    // The frame deadline (frameTimeoutMs, default 30 s) is far away: only the deadline check can end the drip.
    const s = await warmed(2, n, { stallTimeoutMs: 100, transferTimeoutMs: 500 });
    const src = pattern(n, 23);
    const lane = s.extra[0]!;
    const stop = answering(s.t, src, () => s.t.conns.filter((c) => c !== lane));
    cleanup.push(async () => stop());
    const req = await s.a.makeTransfer({ op: 'READ', local: s.l, remote: s.r });
    const t0 = Date.now();
    await s.a.post(req);
    await until(() => lane.frames.length > 0, 'frames on the lane');
    const h = io(lane.frames[0]!);
    lane.socket.write(encodeFrame([F.RDATA, h.id], h.bytes));
    const drip = setInterval(() => lane.closed || lane.socket.write(new Uint8Array(1).fill(3)), 20);
    cleanup.push(async () => clearInterval(drip));
    await sleep(300);
    expect(s.a.laneEvents.stalled).toBe(0); // bytes keep coming: not a stall by the byte clock
    expect(await s.a.wait(req)).toBe('timeout');
    expect(Date.now() - t0).toBeLessThan(2000);
    expect(s.a.laneEvents.stalled).toBe(1);
    await until(() => lane.closed, 'the dripping lane closed');
    expect(s.first.closed).toBe(false);
    for (let k = 0; k < 3; k++) {
      s.local.fill(0);
      await s.a.post(req);
      expect(await s.a.wait(req)).toBe('done');
      expect(Buffer.from(s.local).equals(Buffer.from(src))).toBe(true);
    }
  });

  it('a transfer that times out while its lanes were quiet for less than the bound leaves them open', async () => {
    const n = 1 << 20;
    const s = await warmed(2, n, { stallTimeoutMs: 2000, transferTimeoutMs: 300 });
    const req = await s.a.makeTransfer({ op: 'READ', local: s.l, remote: s.r });
    await s.a.post(req);
    await until(() => s.first.frames.length + s.extra[0]!.frames.length === 16, 'the 16 frames');
    // Nobody answers: at the deadline (300 ms) the lanes were quiet less than the bound (2 s).
    expect(await s.a.wait(req)).toBe('timeout');
    await sleep(50);
    expect(s.first.closed || s.extra[0]!.closed).toBe(false);
    expect(s.a.laneEvents.stalled).toBe(0);
  });
});

describe('every lane silent at once', () => {
  for (const lanes of [2, 4]) {
    it(`lanes ${lanes}, the first connection included: the transfer fails remote-disconnect (stalled) soon after the bound, every connection closed; the next session works`, async () => {
      const n = 1 << 20;
      const s = await warmed(lanes, n, { stallTimeoutMs: 200, transferTimeoutMs: 60_000 });
      const src = pattern(n, 24);
      const conns = [s.first, ...s.extra];
      const req = await s.a.makeTransfer({ op: 'READ', local: s.l, remote: s.r });
      const t0 = Date.now();
      await s.a.post(req);
      await until(() => s.a.status(req) !== 'in-progress', 'the transfer to end', 10_000);
      expect(s.a.status(req)).toBe('remote-disconnect');
      expect(String(req.error)).toContain('stalled');
      expect(Date.now() - t0).toBeLessThan(3000);
      await until(() => conns.every((c) => c.closed), 'every connection closed');
      expect(s.a.laneEvents.stalled).toBeGreaterThanOrEqual(1);
      const stop = answering(s.t, src, () => s.t.conns);
      cleanup.push(async () => stop());
      await s.a.post(req);
      expect(await s.a.wait(req)).toBe('done');
      expect(Buffer.from(s.local).equals(Buffer.from(src))).toBe(true);
    });
  }
});

describe('a target that admits lanes and closes them at once (reopen storm)', () => {
  async function storm(lanes: number) {
    const laneConns: number[] = [];
    const t = await FakeTarget.listen(uniq('storm'), undefined, (c) => {
      if (c.hello!.session !== null) {
        laneConns.push(Date.now());
        setImmediate(() => c.socket.destroy()); // after the OK
      }
      return true;
    });
    const a = await EmbeddedAgent.create({ name: uniq('init'), lanes, chunkBytes: 64 * 1024 });
    let closed = false;
    cleanup.push(
      async () => {
        if (!closed) await a.close();
      },
      () => t.close(),
    );
    const n = 1 << 20;
    const local = new Uint8Array(n);
    const rl = await a.registerMemory([{ bytes: local }]);
    const name = await a.loadRemoteMetadata(t.metadata());
    const l = await a.prepDescList(null, 'DRAM', [{ addr: rl.regions[0]!.addr, length: n }]);
    const r = await a.prepDescList(name, 'DRAM', [{ addr: t.region.addr, length: n }]);
    const src = pattern(n, 25);
    const stop = answering(t, src, () => t.conns);
    cleanup.push(async () => stop());
    return { t, a, name, l, r, local, src, laneConns, close: async () => ((closed = true), await a.close()) };
  }

  it('lanes 2: the lane slot backs off (100, 200, 400 ms, ...): at most 5 lane connects in 1.2 s; transfers go over the first connection meanwhile', async () => {
    const s = await storm(2);
    const req = await s.a.makeTransfer({ op: 'READ', local: s.l, remote: s.r });
    await s.a.post(req);
    expect(await s.a.wait(req)).toBe('done');
    expect(Buffer.from(s.local).equals(Buffer.from(s.src))).toBe(true);
    await sleep(1200);
    // Backoff 100 + 200 + 400 (+ 800 due at 1.5 s): 4 connects, 5 with slack; a storm would be hundreds.
    expect(s.laneConns.length).toBeGreaterThanOrEqual(2);
    expect(s.laneConns.length).toBeLessThanOrEqual(5);
    const gaps = s.laneConns.slice(1).map((x, i) => x - s.laneConns[i]!);
    for (let i = 0; i < gaps.length; i++) expect(gaps[i]).toBeGreaterThanOrEqual(100 * 2 ** i - 5);
    expect(s.a.laneRefusal(s.name)).toBeNull();
    s.local.fill(0);
    await s.a.post(req);
    expect(await s.a.wait(req)).toBe('done');
    expect(Buffer.from(s.local).equals(Buffer.from(s.src))).toBe(true);
  });

  it('lanes 8: after close() no lane is opened again (the reopen timers are cleared) and every socket of the agent is closed', async () => {
    const s = await storm(8);
    const req = await s.a.makeTransfer({ op: 'READ', local: s.l, remote: s.r });
    await s.a.post(req);
    expect(await s.a.wait(req)).toBe('done');
    await until(() => s.laneConns.length >= 1, 'a lane connect');
    await s.close();
    const closedAt = Date.now();
    await sleep(50); // connections already on their way (accepted, HELLO sent before the close) reach the fake
    const at = s.laneConns.length;
    const conns = s.t.conns.length;
    await sleep(700); // beyond the first backoffs (100, 200, 400 ms)
    expect(s.laneConns.filter((x) => x > closedAt + 50), 'lane HELLOs after the close').toEqual([]);
    expect(s.laneConns.length).toBe(at);
    expect(s.t.conns.length).toBe(conns);
    await until(() => s.t.conns.every((c) => c.closed), 'every connection closed at the target');
  });
});

/**
 * Lanes (`lanes`, `embedded.ts` module note; `OutLink` of `embedded-conn.ts`) against a hostile
 * or broken target ({@link FakeTarget}, which speaks the wire by hand): a target that answers on
 * one lane for frames sent on another, a lane that stalls, a lane that closes while other lanes
 * still carry frames of the same transfer, late answers after a transfer failed.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { EmbeddedAgent, type EmbeddedAgentOptions } from '../src/index.js';
import { F, type Header } from '../src/wire.js';
import { FakeTarget, rdata, wack, type FakeConn } from './fake-target.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
let seq = 0;
const uniq = (p: string) => `${p}-${process.pid}-${++seq}`;
const cleanup: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const c of cleanup.splice(0)) await c();
});
async function until(cond: () => boolean, what: string, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(2);
  }
}
type Io = Extract<Header, { t: typeof F.READ | typeof F.WRITE }>;
const io = (f: { h: Header }) => f.h as Io;

/**
 * An initiator with `lanes` lanes and 64 KiB frames, `n` bytes of local memory, descriptor lists
 * of all of it at both ends, and a fake target; a first READ (answered with zeros) opens the lanes
 * and the test waits until every one is ready at both ends. Frames seen so far are cleared.
 */
async function warmed(lanes: number, n: number, o: Partial<EmbeddedAgentOptions> = {}) {
  const t = await FakeTarget.listen(uniq('fake'));
  const a = await EmbeddedAgent.create({ name: uniq('init'), lanes, chunkBytes: 64 * 1024, ...o });
  cleanup.push(
    () => a.close(),
    () => t.close(),
  );
  const local = new Uint8Array(n);
  const rl = await a.registerMemory([{ bytes: local }]);
  const name = await a.loadRemoteMetadata(t.metadata());
  const l = await a.prepDescList(null, 'DRAM', [{ addr: rl.regions[0]!.addr, length: n }]);
  const r = await a.prepDescList(name, 'DRAM', [{ addr: t.region.addr, length: n }]);
  const w = await a.makeTransfer({ op: 'READ', local: l, remote: r });
  await a.post(w);
  const answered = new Set<unknown>();
  const answer = setInterval(() => {
    for (const c of t.conns) for (const f of c.frames) if (!answered.has(f) && f.h.t === F.READ) (answered.add(f), rdata(c, io(f).id, new Uint8Array(io(f).bytes)));
  }, 2);
  try {
    expect(await a.wait(w)).toBe('done');
    await until(() => t.ready.length === lanes && a.laneStats(name).length === lanes && a.laneStats(name).every((s) => s.ready), `${lanes} ready lanes`);
  } finally {
    clearInterval(answer);
  }
  for (const c of t.conns) c.frames.length = 0;
  const [first, ...extra] = t.ready;
  return { t, a, local, l, r, name, first: first!, extra: extra as FakeConn[] };
}

describe('lanes against a hostile target', () => {
  it('a lane that never answers: the transfer fails at its deadline (timeout), the session goes on', async () => {
    const s = await warmed(2, 1 << 20, { transferTimeoutMs: 300 });
    const req = await s.a.makeTransfer({ op: 'READ', local: s.l, remote: s.r });
    const t0 = Date.now();
    await s.a.post(req);
    await until(() => s.first.frames.length + s.extra[0]!.frames.length === 16, 'the 16 frames');
    expect(s.extra[0]!.frames.length).toBeGreaterThan(0);
    for (const f of s.first.frames) rdata(s.first, io(f).id, new Uint8Array(io(f).bytes));
    expect(await s.a.wait(req)).toBe('timeout');
    expect(Date.now() - t0).toBeGreaterThanOrEqual(290);
    expect(Date.now() - t0).toBeLessThan(2000);
    expect(s.a.laneStats(s.name)[0]!.ready).toBe(true);
  });

  it('RDATA on a lane for an id only another lane sent closes that lane (invalid) and lands nothing; the first connection lives on', async () => {
    const s = await warmed(2, 1 << 20);
    s.local.fill(7);
    const req = await s.a.makeTransfer({ op: 'READ', local: s.l, remote: s.r });
    await s.a.post(req);
    await until(() => s.first.frames.length + s.extra[0]!.frames.length === 16, 'the 16 frames');
    const laneIds = new Set(s.extra[0]!.frames.map((f) => io(f).id));
    const foreign = s.first.frames.map((f) => io(f)).find((h) => !laneIds.has(h.id))!;
    expect(foreign).toBeDefined();
    rdata(s.extra[0]!, foreign.id, new Uint8Array(foreign.bytes).fill(1));
    expect(await s.a.wait(req)).toBe('invalid');
    expect(String(req.error)).toContain(`RDATA for unknown frame ${foreign.id}`);
    await until(() => s.extra[0]!.closed, 'the lane to close');
    // The first connection's late answers land nothing either: the transfer is over.
    for (const f of s.first.frames) rdata(s.first, io(f).id, new Uint8Array(io(f).bytes).fill(2));
    await sleep(100);
    expect(s.local.every((b) => b === 7)).toBe(true);
    expect(s.first.closed).toBe(false);
    expect(s.a.laneStats(s.name)[0]!.ready).toBe(true);
  });

  it('READ: a lane closed by the target fails the transfer at once; answers arriving later on the other lane land nothing', async () => {
    const s = await warmed(2, 1 << 20);
    s.local.fill(7);
    const req = await s.a.makeTransfer({ op: 'READ', local: s.l, remote: s.r });
    await s.a.post(req);
    await until(() => s.first.frames.length + s.extra[0]!.frames.length === 16, 'the 16 frames');
    s.extra[0]!.socket.destroy();
    expect(await s.a.wait(req)).toBe('remote-disconnect');
    for (const f of s.first.frames) rdata(s.first, io(f).id, new Uint8Array(io(f).bytes).fill(1));
    await sleep(100);
    expect(s.local.every((b) => b === 7)).toBe(true);
  });

  it('WRITE: a lane closed while another lane holds unacknowledged frames fails only once those are acknowledged; its unsent frames are never sent', async () => {
    // Two 64 KiB frames outstanding per lane: the rest of the 16 frames wait in the lanes' queues.
    const s = await warmed(2, 1 << 20, { maxInflightBytes: 128 * 1024 });
    const req = await s.a.makeTransfer({ op: 'WRITE', local: s.l, remote: s.r });
    await s.a.post(req);
    await until(() => s.first.frames.length === 2 && s.extra[0]!.frames.length === 2, 'two frames on each lane');
    s.extra[0]!.socket.destroy();
    await sleep(100);
    // The first connection's frames are still on the wire: the target may still copy them.
    expect(s.a.status(req)).toBe('in-progress');
    wack(s.first, io(s.first.frames[0]!).id);
    await sleep(100);
    expect(s.a.status(req)).toBe('in-progress');
    expect(s.first.frames.length).toBe(2); // the acknowledgement opened the window: still nothing more of it sent
    wack(s.first, io(s.first.frames[1]!).id);
    expect(await s.a.wait(req)).toBe('remote-disconnect');
    await sleep(100);
    expect(s.first.frames.length).toBe(2);
  });

  it('WRITE: a lane closed while another lane never answers its frames fails at the deadline (timeout), not later', async () => {
    const s = await warmed(2, 1 << 20, { transferTimeoutMs: 300 });
    const req = await s.a.makeTransfer({ op: 'WRITE', local: s.l, remote: s.r });
    const t0 = Date.now();
    await s.a.post(req);
    await until(() => s.first.frames.length + s.extra[0]!.frames.length === 16, 'the 16 frames');
    s.extra[0]!.socket.destroy();
    expect(await s.a.wait(req)).toBe('timeout');
    expect(Date.now() - t0).toBeLessThan(2000);
  });
});

/**
 * Striping of the embedded agent (`lanes`, `embedded.ts` module note; lane HELLO of `wire.ts`):
 * transfers spread over 1, 2 and 4 TCP connections land every byte where a single connection
 * would; a lane that dies fails only the transfers on it; an extra lane is admitted only with its
 * own proof into an open session of the same initiator; bad `lanes` values are refused.
 */
import type * as net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { EmbeddedAgent, TransferError, type TransferAgent } from '../src/index.js';
import { encodeFrame, F } from '../src/wire.js';
import { pattern } from './patterns.js';
import { RawPeer } from './raw-peer.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
let seq = 0;
const uniq = (p: string) => `${p}-${process.pid}-${++seq}`;
const open: TransferAgent[] = [];
const raws: RawPeer[] = [];
afterEach(async () => {
  for (const r of raws.splice(0)) r.socket.destroy();
  await Promise.all(open.splice(0).map((a) => a.close()));
});
const agent = async (o: Partial<Parameters<typeof EmbeddedAgent.create>[0]> = {}) => {
  const a = await EmbeddedAgent.create({ name: uniq('lanes'), ...o });
  open.push(a);
  return a;
};
const raw = async (a: EmbeddedAgent) => {
  const r = await RawPeer.connect(a);
  raws.push(r);
  return r;
};
/** Polls `cond` every 5 ms for up to 5 s. */
async function until(cond: () => boolean | Promise<boolean>, what: string): Promise<void> {
  const end = Date.now() + 5000;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(5);
  }
}

/**
 * An initiator with `lanes` lanes and a target, each with one region of `bytes`, and descriptors
 * of many lengths (`count` of them, 1 byte to ~70 KiB), laid out in a shuffled order at the target
 * so that a byte landing in another descriptor's place shows.
 */
async function pair(lanes: number, count = 120) {
  const lens = Array.from({ length: count }, (_, i) => 1 + ((i * 7919) % 70_000));
  const offsL: number[] = [];
  let at = 0;
  for (const n of lens) {
    offsL.push(at);
    at += n + 13; // gaps: bytes between descriptors must not change
  }
  const bytes = at;
  const order = lens.map((_, i) => i).sort((x, y) => ((x * 37) % count) - ((y * 37) % count));
  const offsR: number[] = new Array(count);
  at = 0;
  for (const i of order) {
    offsR[i] = at;
    at += lens[i]! + 5;
  }
  const a = await agent({ lanes, chunkBytes: 64 * 1024 });
  const b = await agent();
  const local = new Uint8Array(bytes);
  const remote = new Uint8Array(at);
  const rl = await a.registerMemory([{ bytes: local }]);
  const rr = await b.registerMemory([{ bytes: remote }]);
  const name = await a.loadRemoteMetadata(await b.getLocalMetadata());
  const l = await a.prepDescList(null, 'DRAM', lens.map((n, i) => ({ addr: rl.regions[0]!.addr + offsL[i]!, length: n })));
  const r = await a.prepDescList(name, 'DRAM', lens.map((n, i) => ({ addr: rr.regions[0]!.addr + offsR[i]!, length: n })));
  return { a, b, name, lens, offsL, offsR, local, remote, l, r };
}

/** Waits until every lane of `a` to `name` finished its handshake (after a first transfer opened them). */
async function warm(a: EmbeddedAgent, name: string, lanes: number): Promise<void> {
  await until(() => a.laneStats(name).length === lanes && a.laneStats(name).every((s) => s.ready), `${lanes} ready lanes`);
}

describe('lanes: transfers spread over several connections', () => {
  for (const lanes of [1, 2, 4]) {
    for (const op of ['READ', 'WRITE'] as const) {
      it(`${op} of 120 descriptors over ${lanes} lane(s): every byte in its place, frames on every lane, notif after the data`, async () => {
        const p = await pair(lanes);
        const { a, b, name } = p;
        // A first transfer opens the connections; the lanes are used once their handshakes are done.
        const w = await a.makeTransfer({ op: 'READ', local: p.l, remote: p.r });
        await a.post(w);
        expect(await a.wait(w)).toBe('done');
        await warm(a, name, lanes);
        expect(b.incomingLanes).toBe(lanes - 1);
        const before = a.laneStats(name).map((s) => s.framesSent);
        const [src, dst, srcOffs, dstOffs] = op === 'READ' ? [p.remote, p.local, p.offsR, p.offsL] : [p.local, p.remote, p.offsL, p.offsR];
        src.set(pattern(src.length, 17 + lanes));
        dst.set(pattern(dst.length, 99));
        const gapsBefore = pattern(dst.length, 99);
        const notif = new TextEncoder().encode(`done-${lanes}-${op}`);
        const req = await a.makeTransfer({ op, local: p.l, remote: p.r, notif });
        await a.post(req);
        expect(await a.wait(req)).toBe('done');
        const srcPat = pattern(src.length, 17 + lanes);
        const expected = Uint8Array.from(gapsBefore);
        for (let i = 0; i < p.lens.length; i++) expected.set(srcPat.subarray(srcOffs[i]!, srcOffs[i]! + p.lens[i]!), dstOffs[i]!);
        if (op === 'WRITE') {
          // The notif comes after every frame on every lane was acknowledged: the bytes are there when it is.
          let got: Uint8Array[] = [];
          let atNotif: Buffer | null = null;
          await until(async () => {
            got = (await b.pollNotifs()).get(a.name) ?? [];
            if (got.length > 0) atNotif = Buffer.from(dst);
            return got.length > 0;
          }, 'the notif');
          expect(atNotif!.equals(Buffer.from(expected))).toBe(true);
          expect(Buffer.from(dst).equals(Buffer.from(expected))).toBe(true);
          expect(new TextDecoder().decode(got[0])).toBe(`done-${lanes}-${op}`);
        } else {
          expect(Buffer.from(dst).equals(Buffer.from(expected))).toBe(true);
        }
        const sent = a.laneStats(name).map((s, i) => s.framesSent - (before[i] ?? 0));
        expect(sent.length).toBe(lanes);
        // 120 descriptors of ~35 KiB in 64 KiB frames: about 70 frames, some on every lane.
        expect(sent.reduce((x, y) => x + y, 0)).toBeGreaterThan(40);
        for (const n of sent) expect(n).toBeGreaterThan(0);
      });
    }
  }
});

/** The sockets of `a`'s lanes to `name` (internal: the link of `embedded-conn.ts`), to kill one. */
const laneSockets = (a: EmbeddedAgent, name: string) => (a as unknown as { conns: Map<string, { lanes: Array<{ socket: net.Socket }> }> }).conns.get(name)!.lanes.map((l) => l.socket);

describe('lanes: a lane that dies', () => {
  for (const op of ['READ', 'WRITE'] as const) {
    it(`${op}: fails the transfer with frames on it (remote-disconnect), not the one on the other lane; a new lane replaces it`, async () => {
      const a = await agent({ lanes: 2, chunkBytes: 64 * 1024 });
      const b = await agent();
      const n = 4 << 20;
      const local = new Uint8Array(n);
      const remote = new Uint8Array(n);
      const rl = await a.registerMemory([{ bytes: local }]);
      const rr = await b.registerMemory([{ bytes: remote }]);
      const name = await a.loadRemoteMetadata(await b.getLocalMetadata());
      const small = { l: await a.prepDescList(null, 'DRAM', [{ addr: rl.regions[0]!.addr, length: 4096 }]), r: await a.prepDescList(name, 'DRAM', [{ addr: rr.regions[0]!.addr, length: 4096 }]) };
      const big = { l: await a.prepDescList(null, 'DRAM', [{ addr: rl.regions[0]!.addr + 4096, length: n - 4096 }]), r: await a.prepDescList(name, 'DRAM', [{ addr: rr.regions[0]!.addr + 4096, length: n - 4096 }]) };
      const t0 = await a.makeTransfer({ op, local: small.l, remote: small.r });
      const t1 = await a.makeTransfer({ op, local: big.l, remote: big.r });
      await a.post(t0);
      expect(await a.wait(t0)).toBe('done');
      await warm(a, name, 2);
      const [src, dst] = op === 'READ' ? [remote, local] : [local, remote];
      src.set(pattern(n, 5));
      dst.fill(0);
      // Both lanes idle: the one-frame transfer goes to the first, the 63 frames of the other are
      // spread over both; then the second lane's socket dies before any answer came.
      await a.post(t0);
      await a.post(t1);
      expect(a.laneStats(name)[1]!.framesSent).toBeGreaterThan(0);
      laneSockets(a, name)[1]!.destroy();
      expect(await a.wait(t1)).toBe('remote-disconnect');
      expect(await a.wait(t0)).toBe('done');
      expect(Buffer.from(dst.subarray(0, 4096)).equals(Buffer.from(pattern(n, 5).subarray(0, 4096)))).toBe(true);
      // The session lives on: the next transfer completes, and the lane is replaced.
      dst.fill(0);
      await a.post(t1);
      expect(await a.wait(t1)).toBe('done');
      expect(Buffer.from(dst.subarray(4096)).equals(Buffer.from(pattern(n, 5).subarray(4096)))).toBe(true);
      await warm(a, name, 2);
      await until(() => b.incomingLanes === 1, 'the replacement lane at the target');
      dst.fill(0);
      const sent1 = a.laneStats(name)[1]!.framesSent;
      await a.post(t1);
      expect(await a.wait(t1)).toBe('done');
      expect(a.laneStats(name)[1]!.framesSent).toBeGreaterThan(sent1);
      expect(Buffer.from(dst.subarray(4096)).equals(Buffer.from(pattern(n, 5).subarray(4096)))).toBe(true);
      expect(a.protocolErrors + b.protocolErrors).toBe(0);
    });
  }

  it('WRITE: when a lane dies, the failure is reported only once the frames on the other lanes were acknowledged (no byte lands at the target after it returned, as with one connection)', async () => {
    const a = await agent({ lanes: 2 });
    const b = await agent();
    const n = 64 << 20;
    const local = pattern(n, 6);
    const remote = new Uint8Array(n);
    const rl = await a.registerMemory([{ bytes: local }]);
    const rr = await b.registerMemory([{ bytes: remote }]);
    const name = await a.loadRemoteMetadata(await b.getLocalMetadata());
    const l = await a.prepDescList(null, 'DRAM', [{ addr: rl.regions[0]!.addr, length: n }]);
    const r = await a.prepDescList(name, 'DRAM', [{ addr: rr.regions[0]!.addr, length: n }]);
    const t = await a.makeTransfer({ op: 'WRITE', local: l, remote: r });
    await a.post(t);
    expect(await a.wait(t)).toBe('done');
    await warm(a, name, 2);
    remote.fill(0);
    // 16 frames of 4 MiB over both lanes; the target closes the second lane while the first
    // still has frames on the wire (without the wait, up to 16 MiB of them landed after the
    // transfer returned). Closed at the target: bytes the initiator's kernel still holds for
    // the closed lane never land (a socket closed at the initiator may still deliver them).
    await a.post(t);
    expect(a.laneStats(name)[0]!.framesSent).toBeGreaterThan(0);
    const lanesAtB = [...(b as unknown as { inConns: Set<{ socket: net.Socket; lanes: number; session: unknown }> }).inConns].filter((c) => c.session !== null);
    expect(lanesAtB.length).toBe(1);
    lanesAtB[0]!.socket.destroy();
    expect(await a.wait(t)).toBe('remote-disconnect');
    const atReturn = Buffer.from(remote);
    await sleep(300);
    expect(Buffer.from(remote).equals(atReturn)).toBe(true);
    // The session lives on and the next WRITE lands whole.
    await a.post(t);
    expect(await a.wait(t)).toBe('done');
    expect(Buffer.from(remote).equals(Buffer.from(local))).toBe(true);
    expect(a.protocolErrors + b.protocolErrors).toBe(0);
  });

  it('the first connection dying ends the session: every lane closes at both ends, the next transfer opens a new session', async () => {
    const a = await agent({ lanes: 3, chunkBytes: 64 * 1024 });
    const b = await agent();
    const n = 1 << 20;
    const rl = await a.registerMemory([{ bytes: new Uint8Array(n) }]);
    const src = pattern(n, 8);
    const rr = await b.registerMemory([{ bytes: src }]);
    const name = await a.loadRemoteMetadata(await b.getLocalMetadata());
    const t = await a.makeTransfer({ op: 'READ', local: await a.prepDescList(null, 'DRAM', [{ addr: rl.regions[0]!.addr, length: n }]), remote: await a.prepDescList(name, 'DRAM', [{ addr: rr.regions[0]!.addr, length: n }]) });
    await a.post(t);
    expect(await a.wait(t)).toBe('done');
    await warm(a, name, 3);
    await until(() => b.incomingLanes === 2, 'two lanes at the target');
    laneSockets(a, name)[0]!.destroy();
    await until(() => a.laneStats(name).length === 0 && b.incomingConnections === 0, 'every lane closed');
    await a.post(t);
    expect(await a.wait(t)).toBe('done');
    await warm(a, name, 3);
  });
});

describe('lanes: only authenticated lanes of an open session', () => {
  /** A target with a registered region, a raw first connection authenticated as `raw`, and its challenge (the session). */
  async function session() {
    const b = await agent();
    const src = pattern(4096, 3);
    const reg = await b.registerMemory([{ bytes: src }]);
    const first = await raw(b);
    const sn = await first.challenge();
    await first.hello(b);
    const errors: string[] = [];
    b.on('protocol-error', (e) => errors.push(e.message));
    const readOn = (p: RawPeer, id: number) => p.write(encodeFrame([F.READ, id, [reg.regions[0]!.addr, 4096]]));
    return { b, src, first, sn, errors, readOn };
  }
  /** Whether `p` was closed by the target after a FATAL, with no RDATA. */
  async function refused(p: RawPeer): Promise<void> {
    await until(() => p.closed, 'the target to close the lane');
    expect(p.frames.some((f) => f.h.t === F.FATAL)).toBe(true);
    expect(p.frames.some((f) => f.h.t === F.RDATA || f.h.t === F.OK)).toBe(false);
  }

  it('a lane with its proof into the open session is admitted and answers a READ (the control)', async () => {
    const s = await session();
    const lane = await raw(s.b);
    await lane.hello(s.b, { session: s.sn });
    expect(s.b.incomingLanes).toBe(1);
    await s.readOn(lane, 7);
    const r = await lane.until((f) => f.h.t === F.RDATA);
    expect(r.payload.equals(Buffer.from(s.src))).toBe(true);
    // Closing the session closes the lane.
    s.first.socket.destroy();
    await until(() => lane.closed, 'the lane to close with its session');
  });

  it('admits at most 7 extra lanes per session; the 8th is refused and the session and its lanes still answer', async () => {
    const s = await session();
    const lanes: RawPeer[] = [];
    for (let i = 0; i < 7; i++) {
      const lane = await raw(s.b);
      await lane.hello(s.b, { session: s.sn });
      lanes.push(lane);
    }
    expect(s.b.incomingLanes).toBe(7);
    const extra = await raw(s.b);
    await extra.sendHello(s.b, { session: s.sn });
    await s.readOn(extra, 9);
    await refused(extra);
    expect(s.errors.filter((m) => m.includes('more than 7 extra lanes')).length).toBe(1);
    expect(s.b.incomingLanes).toBe(7);
    await s.readOn(lanes[6]!, 10);
    const r = await lanes[6]!.until((f) => f.h.t === F.RDATA);
    expect(r.payload.equals(Buffer.from(s.src))).toBe(true);
  });

  it('refuses a lane with a wrong proof, for a session that is not open, of another initiator, sending READ before its HELLO, or with a malformed session', async () => {
    const s = await session();
    const wrong = await raw(s.b);
    await wrong.sendHello(s.b, { session: s.sn, secret: new Uint8Array(32).fill(1) });
    await s.readOn(wrong, 1);
    await refused(wrong);
    const noSession = await raw(s.b);
    await noSession.sendHello(s.b, { session: new Uint8Array(16).fill(9) });
    await s.readOn(noSession, 2);
    await refused(noSession);
    const otherName = await raw(s.b);
    await otherName.sendHello(s.b, { session: s.sn, name: 'not-raw' });
    await s.readOn(otherName, 3);
    await refused(otherName);
    const early = await raw(s.b);
    await early.challenge();
    await s.readOn(early, 4);
    await refused(early);
    const shortSession = await raw(s.b);
    await shortSession.sendHello(s.b, { session: s.sn.subarray(0, 5) });
    await s.readOn(shortSession, 6);
    await refused(shortSession);
    expect(s.errors.length).toBe(5);
    expect(s.errors.filter((m) => m.includes('session must be 16 bytes')).length).toBe(1);
    expect(s.errors.filter((m) => m.includes('wrong secret')).length).toBe(1);
    expect(s.errors.filter((m) => m.includes('no open session')).length).toBe(2);
    expect(s.b.incomingLanes).toBe(0);
    // A lane of a session that closed is refused too.
    s.first.socket.destroy();
    await until(() => s.b.incomingConnections === 0, 'the session to close');
    const late = await raw(s.b);
    await late.sendHello(s.b, { session: s.sn });
    await s.readOn(late, 5);
    await refused(late);
  });
});

describe('lanes option', () => {
  it('takes an integer 1..8 and refuses anything else with TransferError invalid', async () => {
    for (const lanes of [0, 9, -1, 1.5, Number.NaN, '2' as unknown as number, 2 ** 53]) {
      const e = await EmbeddedAgent.create({ name: uniq('bad'), lanes }).then(
        (a) => (open.push(a), null),
        (x: unknown) => x,
      );
      expect(e, `lanes ${String(lanes)}`).toBeInstanceOf(TransferError);
      expect((e as TransferError).kind).toBe('invalid');
      expect((e as TransferError).message).toContain('lanes must be an integer in 1..8');
    }
    for (const lanes of [1, 8]) expect((await agent({ lanes })).lanes).toBe(lanes);
    expect((await agent()).lanes).toBe(1);
  });

  it('stallTimeoutMs: an integer 0..2^31-1 (0: off), default 5000 with more than one lane and off with one; anything else is refused with TransferError invalid', async () => {
    for (const stallTimeoutMs of [-1, 1.5, Number.NaN, '5' as unknown as number, 2 ** 31]) {
      const e = await EmbeddedAgent.create({ name: uniq('bad'), lanes: 2, stallTimeoutMs }).then(
        (a) => (open.push(a), null),
        (x: unknown) => x,
      );
      expect(e, `stallTimeoutMs ${String(stallTimeoutMs)}`).toBeInstanceOf(TransferError);
      expect((e as TransferError).kind).toBe('invalid');
      expect((e as TransferError).message).toContain('stallTimeoutMs must be an integer in 0..2147483647');
    }
    expect((await agent()).stallTimeoutMs).toBe(0);
    expect((await agent({ lanes: 2 })).stallTimeoutMs).toBe(5000);
    expect((await agent({ lanes: 2, stallTimeoutMs: 0 })).stallTimeoutMs).toBe(0);
    expect((await agent({ lanes: 1, stallTimeoutMs: 700 })).stallTimeoutMs).toBe(700);
  });
});

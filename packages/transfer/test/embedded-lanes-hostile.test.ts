/**
 * Lanes (`lanes`, `embedded.ts` module note; `OutLink` of `embedded-conn.ts`) against a hostile
 * or broken target ({@link FakeTarget}, which speaks the wire by hand): a target that answers on
 * one lane for frames sent on another, a lane that stalls, a lane that closes while other lanes
 * still carry frames of the same transfer, late answers after a transfer failed; and a target
 * against hostile lanes ({@link RawPeer}): replayed lane HELLOs, a peer with the cluster secret
 * but not the agent secret, lanes for a session that is closing, floods of lanes; and peers of
 * other `lanes` values or without lanes.
 */
import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { EmbeddedAgent, makeNonce, makeProof } from '../src/index.js';
import { encodeFrame, F, HANDSHAKE_CONTEXT, WIRE_VERSION } from '../src/wire.js';
import { FakeTarget, rdata, wack, type FakeConn } from './fake-target.js';
import { laneBackoffMs } from '../src/embedded-conn.js';
import { pattern } from './patterns.js';
import { answerOf, answering, io, lanesRig, sleep, until } from './lanes-rig.js';
import { RawPeer } from './raw-peer.js';

const { uniq, cleanup, warmed } = lanesRig('h');

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

  it('READ read in place: a lane closed mid-answer of another lane lands no byte of the rest of that answer', async () => {
    // Default 4 MiB frames: a segment of 256 KiB or more is received straight into local memory.
    const s = await warmed(2, 8 << 20, { chunkBytes: 4 << 20 });
    s.local.fill(7);
    const req = await s.a.makeTransfer({ op: 'READ', local: s.l, remote: s.r });
    await s.a.post(req);
    await until(() => s.first.frames.length === 1 && s.extra[0]!.frames.length === 1, 'one frame on each lane');
    const h = io(s.first.frames[0]!);
    const reads = (s.a as unknown as { conns: Map<string, { lanes: Array<{ reads: { directReads: number } }> }> }).conns.get(s.name)!.lanes[0]!.reads;
    const before = reads.directReads;
    s.first.socket.write(encodeFrame([F.RDATA, h.id], h.bytes));
    s.first.socket.write(new Uint8Array(1 << 20).fill(1));
    await until(() => s.local.filter((b) => b === 1).length === 1 << 20, 'the first MiB');
    expect(reads.directReads).toBeGreaterThan(before); // received in place
    s.extra[0]!.socket.destroy();
    expect(await s.a.wait(req)).toBe('remote-disconnect');
    s.first.socket.write(new Uint8Array(h.bytes - (1 << 20)).fill(2));
    await sleep(100);
    expect(s.local.filter((b) => b === 1).length).toBe(1 << 20);
    expect(s.local.some((b) => b === 2)).toBe(false);
    expect(s.a.laneStats(s.name)[0]!.ready).toBe(true);
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

describe('a lane that stays connected but goes silent (stallTimeoutMs)', () => {
  it('READ: the silent lane is closed after the bound, its frames are asked again on the other lane, the transfer completes with every byte', async () => {
    // A transfer deadline far beyond the bound: only the stall check can end the wait on the silent lane.
    const s = await warmed(2, 1 << 20, { stallTimeoutMs: 200, transferTimeoutMs: 60_000 });
    const src = pattern(1 << 20, 11);
    s.local.fill(7);
    const stop = answering(s.t, src, () => s.t.conns.filter((c) => c !== s.extra[0]));
    cleanup.push(async () => stop());
    const req = await s.a.makeTransfer({ op: 'READ', local: s.l, remote: s.r });
    await s.a.post(req);
    await until(() => s.extra[0]!.frames.length > 0, 'frames on the lane that goes silent');
    const silent = s.extra[0]!.frames.length;
    await until(() => s.a.status(req) !== 'in-progress', 'the transfer to end', 10_000);
    expect(s.a.status(req)).toBe('done');
    expect(Buffer.from(s.local).equals(Buffer.from(src))).toBe(true);
    expect(s.extra[0]!.closed).toBe(true); // closed by the initiator; the fake never closed it
    expect(s.a.laneEvents.stalled).toBe(1);
    expect(s.a.laneEvents.rerouted).toBe(silent);
    expect(s.first.closed).toBe(false);
    // The silent lane's frames came again on the first connection (no new lane was ready yet) or on a new lane.
    const asked = s.t.conns.filter((c) => c !== s.extra[0]).reduce((n, c) => n + c.frames.length, 0);
    expect(asked).toBe(16);
  });

  it('READ: a second transfer posted while the lane is silent completes too; the session goes on with a new lane', async () => {
    const s = await warmed(2, 1 << 20, { stallTimeoutMs: 200, transferTimeoutMs: 60_000 });
    const src = pattern(1 << 20, 12);
    const stop = answering(s.t, src, () => s.t.conns.filter((c) => c !== s.extra[0]));
    cleanup.push(async () => stop());
    const r1 = await s.a.makeTransfer({ op: 'READ', local: s.l, remote: s.r });
    await s.a.post(r1);
    await until(() => s.extra[0]!.frames.length > 0, 'frames on the lane that goes silent');
    s.local.fill(0);
    const r2 = await s.a.makeTransfer({ op: 'READ', local: s.l, remote: s.r });
    await s.a.post(r2);
    await until(() => s.a.status(r1) !== 'in-progress' && s.a.status(r2) !== 'in-progress', 'both transfers to end', 10_000);
    expect([s.a.status(r1), s.a.status(r2)]).toEqual(['done', 'done']);
    expect(Buffer.from(s.local).equals(Buffer.from(src))).toBe(true);
    await until(() => s.a.laneStats(s.name).length === 2 && s.a.laneStats(s.name).every((x) => x.ready), 'a new second lane');
    s.local.fill(0);
    await s.a.post(r1);
    expect(await s.a.wait(r1)).toBe('done');
    expect(Buffer.from(s.local).equals(Buffer.from(src))).toBe(true);
    expect(s.a.laneEvents.stalled).toBe(1);
  });

  it('WRITE: the silent lane is closed after the bound; the transfer fails (remote-disconnect) only once the live lane acknowledged its frames; a READ beside it completes; the next WRITE lands every byte', async () => {
    // The first connection stays live (bytes of a READ answer every few ms) while holding its
    // WRITE frames unacknowledged; the lane gets both transfers' frames and never answers.
    const n = 1 << 20;
    const half = n / 2;
    const s = await warmed(2, n, { stallTimeoutMs: 300, transferTimeoutMs: 60_000 });
    const src = pattern(n, 13);
    s.local.set(pattern(n, 15).subarray(0, half));
    s.local.fill(7, half);
    const ll = s.l.descs[0]!.addr;
    const rr = s.r.descs[0]!.addr;
    const lw = await s.a.prepDescList(null, 'DRAM', [{ addr: ll, length: half }]);
    const rw = await s.a.prepDescList(s.name, 'DRAM', [{ addr: rr, length: half }]);
    const lr = await s.a.prepDescList(null, 'DRAM', [{ addr: ll + half, length: half }]);
    const rrd = await s.a.prepDescList(s.name, 'DRAM', [{ addr: rr + half, length: half }]);
    const w = await s.a.makeTransfer({ op: 'WRITE', local: lw, remote: rw });
    const r = await s.a.makeTransfer({ op: 'READ', local: lr, remote: rrd });
    let feeding = true;
    let ackNow = false;
    const feeder = (async () => {
      const done = new Set<unknown>();
      const c = s.first;
      while (feeding && !c.closed) {
        if (ackNow) for (const f of c.frames) if (f.h.t === F.WRITE && !done.has(f)) (done.add(f), wack(c, io(f).id));
        const f = c.frames.find((x) => x.h.t === F.READ && !done.has(x));
        if (!f) {
          await sleep(2);
          continue;
        }
        done.add(f);
        const body = answerOf(s.t, src, f);
        c.socket.write(encodeFrame([F.RDATA, io(f).id], body.length));
        for (let o = 0; o < body.length; o += 4096) {
          c.socket.write(body.subarray(o, o + 4096));
          await sleep(5);
        }
      }
    })();
    cleanup.push(async () => {
      feeding = false;
      await feeder;
    });
    await s.a.post(w);
    await s.a.post(r);
    await until(() => s.extra[0]!.frames.some((f) => f.h.t === F.WRITE) && s.first.frames.some((f) => f.h.t === F.WRITE), 'WRITE frames on both');
    await until(() => s.extra[0]!.closed, 'the silent lane to be closed');
    expect(s.first.closed).toBe(false);
    // The first connection's WRITE frames are still unacknowledged: the target may still copy them.
    expect(s.a.status(w)).toBe('in-progress');
    ackNow = true;
    expect(await s.a.wait(w)).toBe('remote-disconnect');
    expect(String(w.error)).toContain('stalled');
    expect(await s.a.wait(r)).toBe('done');
    expect(Buffer.from(s.local.subarray(half)).equals(Buffer.from(src.subarray(half)))).toBe(true);
    expect(s.a.laneEvents.stalled).toBe(1);
    expect(s.a.laneEvents.rerouted).toBeGreaterThan(0);
    feeding = false;
    await feeder;
    // The next WRITE: every frame's payload is the source's bytes at its address.
    const seen = s.t.conns.map((c) => c.frames.length);
    const stop = answering(s.t, new Uint8Array(0), () => s.t.conns.filter((c) => c !== s.extra[0]));
    cleanup.push(async () => stop());
    await s.a.post(w);
    expect(await s.a.wait(w)).toBe('done');
    const frames = s.t.conns.flatMap((c, i) => c.frames.slice(seen[i] ?? 0));
    expect(frames.reduce((k, f) => k + f.payload.length, 0)).toBe(half);
    for (const f of frames) expect(f.payload.equals(answerOf(s.t, s.local, f))).toBe(true);
  });

  it('a silent first connection ends the session (its lanes close, the transfer fails remote-disconnect); the next transfer opens a new one', async () => {
    const s = await warmed(2, 1 << 20, { stallTimeoutMs: 200, transferTimeoutMs: 60_000 });
    const src = pattern(1 << 20, 14);
    const stop = answering(s.t, src, () => s.t.conns.filter((c) => c !== s.first));
    cleanup.push(async () => stop());
    const req = await s.a.makeTransfer({ op: 'READ', local: s.l, remote: s.r });
    await s.a.post(req);
    await until(() => s.a.status(req) !== 'in-progress', 'the transfer to end', 10_000);
    expect(s.a.status(req)).toBe('remote-disconnect');
    expect(String(req.error)).toContain('stalled');
    await until(() => s.first.closed && s.extra[0]!.closed, 'both connections closed');
    await s.a.post(req);
    expect(await s.a.wait(req)).toBe('done');
    expect(Buffer.from(s.local).equals(Buffer.from(src))).toBe(true);
  });

  it('a lane with nothing outstanding is never closed, however long it is quiet', async () => {
    const s = await warmed(2, 1 << 20, { stallTimeoutMs: 50 });
    await sleep(400);
    expect(s.first.closed || s.extra[0]!.closed).toBe(false);
    expect(s.a.laneEvents.stalled).toBe(0);
  });
});

describe('a target against hostile lanes', () => {
  const cluster = randomBytes(32);
  /** A target with a cluster secret and a region, a raw first connection authenticated as `raw` (the session), and its protocol errors. */
  async function session() {
    const b = await EmbeddedAgent.create({ name: uniq('target'), clusterSecret: cluster });
    const src = pattern(4096, 4);
    const reg = await b.registerMemory([{ bytes: src }]);
    const peers: RawPeer[] = [];
    cleanup.push(async () => {
      for (const p of peers) p.socket.destroy();
      await b.close();
    });
    const raw = async () => {
      const p = await RawPeer.connect(b);
      peers.push(p);
      return p;
    };
    const first = await raw();
    const sn = await first.challenge();
    await first.hello(b, { cluster });
    const errors: string[] = [];
    b.on('protocol-error', (e) => errors.push(e.message));
    const readOn = (p: RawPeer, id: number) => p.write(encodeFrame([F.READ, id, [reg.regions[0]!.addr, 4096]]));
    const secret = (await import('msgpackr')).unpack(await b.getLocalMetadata())[5] as Uint8Array;
    return { b, src, first, sn, errors, readOn, raw, secret };
  }
  async function refused(p: RawPeer): Promise<void> {
    await until(() => p.closed, 'the target to close the lane');
    expect(p.frames.some((f) => f.h.t === F.FATAL)).toBe(true);
    expect(p.frames.some((f) => f.h.t === F.RDATA || f.h.t === F.OK)).toBe(false);
  }

  it('a lane with the cluster secret but a wrong agent secret is refused; the control with both is admitted', async () => {
    const s = await session();
    const wrong = await s.raw();
    await wrong.sendHello(s.b, { session: s.sn, cluster, secret: randomBytes(32) });
    await s.readOn(wrong, 1);
    await refused(wrong);
    expect(s.errors).toEqual([expect.stringContaining('presented a wrong secret')]);
    const noCluster = await s.raw();
    await noCluster.sendHello(s.b, { session: s.sn });
    await s.readOn(noCluster, 2);
    await refused(noCluster);
    expect(s.errors[1]).toContain('did not prove the cluster secret');
    const good = await s.raw();
    await good.hello(s.b, { session: s.sn, cluster });
    await s.readOn(good, 3);
    expect((await good.until((f) => f.h.t === F.RDATA)).payload.equals(Buffer.from(s.src))).toBe(true);
  });

  it('a lane HELLO replayed on another connection, into the same or another open session, is refused', async () => {
    const s = await session();
    // A lane HELLO recorded on one connection (its challenge `sn1`), admitted there.
    const lane = await s.raw();
    const sn1 = await lane.challenge();
    const cn = makeNonce();
    const hello = (sn: Uint8Array, session: Uint8Array) =>
      encodeFrame([F.HELLO, WIRE_VERSION, 'raw', cn, makeProof(s.secret, HANDSHAKE_CONTEXT.helloLane, sn, cn, 'raw', session), makeProof(cluster, HANDSHAKE_CONTEXT.helloCluster, sn, cn, 'raw', s.b.name), session]);
    const recorded = hello(sn1, s.sn);
    await lane.write(recorded);
    await lane.until((f) => f.h.t === F.OK);
    // Replayed as is on a new connection (same session), and on one into a second session of `raw`.
    const again = await s.raw();
    await again.challenge();
    await again.write(recorded);
    await s.readOn(again, 1);
    await refused(again);
    const second = await s.raw();
    const sn2 = await second.challenge();
    await second.hello(s.b, { cluster });
    const other = await s.raw();
    await other.challenge();
    await other.write(hello(sn1, sn2)); // the recorded nonces, the other session: no proof over this connection's challenge
    await s.readOn(other, 2);
    await refused(other);
    expect(s.errors.length).toBe(2);
    expect(s.errors.every((m) => m.includes('did not prove the cluster secret'))).toBe(true);
    expect(s.b.incomingLanes).toBe(1);
  });

  it('a lane for a session that is closing (its first connection broke the protocol) is refused', async () => {
    const s = await session();
    const lane = await s.raw();
    await lane.challenge();
    await s.first.write(encodeFrame([F.OK, 'x', new Uint8Array(32), null])); // not a frame a target takes: the session ends
    await s.first.until((f) => f.h.t === F.FATAL);
    await lane.sendHello(s.b, { session: s.sn, cluster });
    await s.readOn(lane, 1);
    await refused(lane);
    expect(s.errors.filter((m) => m.includes('no open session')).length).toBe(1);
  });

  it('a flood of 60 lane connects for one session: 7 admitted, the rest refused and closed, the session still answers', async () => {
    const s = await session();
    const lanes = await Promise.all(Array.from({ length: 60 }, () => s.raw()));
    await Promise.all(lanes.map((p) => p.sendHello(s.b, { session: s.sn, cluster })));
    await until(() => lanes.filter((p) => p.closed).length === 53, '53 lanes refused');
    expect(s.b.incomingLanes).toBe(7);
    expect(lanes.filter((p) => p.frames.some((f) => f.h.t === F.OK)).length).toBe(7);
    await until(() => s.b.incomingConnections === 8, 'the refused connections gone');
    await s.readOn(s.first, 9);
    expect((await s.first.until((f) => f.h.t === F.RDATA)).payload.equals(Buffer.from(s.src))).toBe(true);
  });
});

describe('lanes between peers of other lanes values, or without lanes', () => {
  it('an agent with lanes 4 and one with lanes 1 transfer both ways; the lanes 1 side opens no lane', async () => {
    const a = await EmbeddedAgent.create({ name: uniq('four'), lanes: 4, chunkBytes: 64 * 1024 });
    const b = await EmbeddedAgent.create({ name: uniq('one'), lanes: 1, chunkBytes: 64 * 1024 });
    cleanup.push(
      () => a.close(),
      () => b.close(),
    );
    const n = 1 << 20;
    const ma = pattern(n, 1);
    const mb = pattern(n, 2);
    const ra = await a.registerMemory([{ bytes: ma }]);
    const rb = await b.registerMemory([{ bytes: mb }]);
    const bn = await a.loadRemoteMetadata(await b.getLocalMetadata());
    const an = await b.loadRemoteMetadata(await a.getLocalMetadata());
    const half = n / 2;
    const run = async (x: EmbeddedAgent, peer: string, mine: number, theirs: number, op: 'READ' | 'WRITE', at: number) => {
      const l = await x.prepDescList(null, 'DRAM', [{ addr: mine + at, length: half }]);
      const r = await x.prepDescList(peer, 'DRAM', [{ addr: theirs + at, length: half }]);
      const t = await x.makeTransfer({ op, local: l, remote: r });
      for (let i = 0; i < 3; i++) {
        await x.post(t);
        expect(await x.wait(t)).toBe('done');
      }
    };
    // a READs b's first half into its own, b READs a's second half into its own.
    await run(a, bn, ra.regions[0]!.addr, rb.regions[0]!.addr, 'READ', 0);
    await run(b, an, rb.regions[0]!.addr, ra.regions[0]!.addr, 'READ', half);
    expect(Buffer.from(ma.subarray(0, half)).equals(Buffer.from(pattern(n, 2).subarray(0, half)))).toBe(true);
    expect(Buffer.from(mb.subarray(half)).equals(Buffer.from(pattern(n, 1).subarray(half)))).toBe(true);
    await until(() => a.laneStats(bn).filter((l) => l.ready).length === 4, "a's 4 lanes");
    expect(b.laneStats(an).length).toBe(1);
    expect(b.incomingLanes).toBe(3);
    expect(a.incomingLanes).toBe(0);
    expect(a.protocolErrors + b.protocolErrors).toBe(0);
  });

  /** A fake target that answers a lane HELLO with `refuse(c, attempt)` (true: refused, the socket closed by the function; false: admitted). */
  async function refusing(refuse: (c: FakeConn, attempt: number) => boolean, name = uniq('old')) {
    let attempts = 0;
    const t = await FakeTarget.listen(name, undefined, (c) => (c.hello!.session === null ? true : !refuse(c, ++attempts)));
    cleanup.push(() => t.close());
    return { t, attempts: () => attempts };
  }
  const preLanes = (c: FakeConn) => (c.socket.end(encodeFrame([F.FATAL, 'invalid', 'HELLO must be [0, 2, name, nonce, agentProof, clusterProof]'])), true);
  /** An initiator with `lanes` lanes and a READ of 256 KiB from `t` (4 frames of 64 KiB), answered on whichever connection gets them. */
  async function reader(t: FakeTarget, lanes: number) {
    const a = await EmbeddedAgent.create({ name: uniq('new'), lanes, chunkBytes: 64 * 1024 });
    cleanup.unshift(() => a.close());
    const n = 256 * 1024;
    const local = new Uint8Array(n);
    const rl = await a.registerMemory([{ bytes: local }]);
    const name = await a.loadRemoteMetadata(t.metadata());
    const l = await a.prepDescList(null, 'DRAM', [{ addr: rl.regions[0]!.addr, length: n }]);
    const r = await a.prepDescList(name, 'DRAM', [{ addr: t.region.addr, length: n }]);
    const req = await a.makeTransfer({ op: 'READ', local: l, remote: r });
    const src = pattern(t.region.length, 21);
    const run = async (at = t) => {
      const stop = answering(at, src, () => at.conns);
      try {
        await a.post(req);
        expect(await a.wait(req), String(req.error)).toBe('done');
      } finally {
        stop();
      }
      expect(Buffer.from(local).equals(Buffer.from(src.subarray(0, n)))).toBe(true);
    };
    return { a, name, run };
  }

  it('a target that refuses lane HELLOs (an agent from before lanes): one lane is asked for, once per target; transfers go over the first connection, later sessions open no lane', async () => {
    const { t, attempts } = await refusing(preLanes);
    const { a, name, run } = await reader(t, 4);
    for (let i = 0; i < 3; i++) {
      await run();
      await until(() => a.laneRefusal(name) !== null, 'the refusal remembered');
    }
    expect(a.laneRefusal(name)).toContain('HELLO must be');
    expect(attempts()).toBe(1);
    expect(t.conns.length).toBe(2);
    expect(a.laneStats(name).map((x) => x.ready)).toEqual([true, false]);
    expect(a.laneEvents.refusedPeers).toBe(1);
    // The session ends; the next one opens no lane (and the same metadata loaded again keeps it so).
    t.conns[0]!.socket.destroy();
    await until(() => a.laneStats(name).length === 0, 'the session to end');
    await a.loadRemoteMetadata(t.metadata());
    await run();
    await sleep(300);
    expect(attempts()).toBe(1);
    expect(t.conns.length).toBe(3);
    expect(a.laneStats(name).map((x) => x.ready)).toEqual([true]);
  });

  it('a pre-lanes refusal is forgotten when the target is replaced (new metadata: another port and secret) and that target takes lanes', async () => {
    const old = await refusing(preLanes);
    const { a, name, run } = await reader(old.t, 2);
    await run();
    await until(() => a.laneRefusal(name) !== null, 'the refusal remembered');
    const upgraded = await refusing(() => false, old.t.name);
    await a.loadRemoteMetadata(upgraded.t.metadata());
    expect(a.laneRefusal(name)).toBeNull();
    // The same initiator with the target that takes lanes gets its lanes.
    await run(upgraded.t);
    await until(() => a.laneStats(name).length === 2 && a.laneStats(name).every((x) => x.ready), 'two ready lanes at the new target');
    expect(upgraded.attempts()).toBe(1);
  });

  it('a lane closed in its handshake without a refusal is opened again after a growing delay (100, 200, 400 ms, ...); it is used once admitted', async () => {
    const started = Date.now();
    const times: number[] = [];
    const { t, attempts } = await refusing((c, n) => {
      times.push(Date.now());
      if (n >= 4) return false; // the fourth attempt is admitted
      c.socket.destroy();
      return true;
    });
    const { a, name, run } = await reader(t, 2);
    await run();
    await until(() => a.laneStats(name).length === 2 && a.laneStats(name).every((x) => x.ready), 'the lane admitted at last', 10_000);
    expect(attempts()).toBe(4);
    expect(a.laneEvents.reopened).toBe(3);
    expect(a.laneRefusal(name)).toBeNull();
    // Timers never fire early: the gaps are at least the backoff (a few ms of slack for the clock).
    const gaps = times.slice(1).map((x, i) => x - times[i]!);
    expect(gaps[0]).toBeGreaterThanOrEqual(95);
    expect(gaps[1]).toBeGreaterThanOrEqual(195);
    expect(gaps[2]).toBeGreaterThanOrEqual(395);
    expect(times[0]! - started).toBeGreaterThanOrEqual(0);
    const sent = a.laneStats(name)[1]!.framesSent;
    await run();
    expect(a.laneStats(name)[1]!.framesSent).toBeGreaterThan(sent);
  });

  it('a lane refused by a target that takes lanes (more than 7 extra lanes: it still counts one this side closed) is opened again, not remembered as a refusal', async () => {
    const { t, attempts } = await refusing((c, n) => {
      if (n > 1) return false;
      c.socket.end(encodeFrame([F.FATAL, 'invalid', `agent "x" opened more than 7 extra lanes for one session`]));
      return true;
    });
    const { a, name, run } = await reader(t, 2);
    await run();
    await until(() => a.laneStats(name).length === 2 && a.laneStats(name).every((x) => x.ready), 'the lane admitted on the second try');
    expect(attempts()).toBe(2);
    expect(a.laneRefusal(name)).toBeNull();
  });

  it('laneBackoffMs: 100 ms doubled per earlier failure, at most 30 s', () => {
    expect([0, 1, 2, 3, 8, 9, 40, -1].map(laneBackoffMs)).toEqual([100, 200, 400, 800, 25_600, 30_000, 30_000, 100]);
  });
});

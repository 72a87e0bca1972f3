/**
 * The embedded agent: the conformance suite, then what only it has: the wire protocol under
 * fuzzing, per-connection windows, metadata decoding, a second process.
 */
import { randomBytes } from 'node:crypto';
import * as net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { Packr } from 'msgpackr';
import { decodeEmbeddedMetadata, EmbeddedAgent, isTransferError, makeNonce, makeProof, ProtocolError, type TransferAgent } from '../src/index.js';
import { encodeFrame, F, HANDSHAKE_CONTEXT, MAX_PAYLOAD_BYTES, WIRE_VERSION } from '../src/wire.js';
import { collectNotifs, defineConformance } from './conformance.js';
import { pattern } from './patterns.js';
import { forkFixture } from './fixtures/fork-fixture.js';
import { RawPeer } from './raw-peer.js';

let seq = 0;
const uniq = (p: string) => `${p}-${process.pid}-${++seq}`;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const packr = new Packr({ useRecords: false, variableMapSize: true });

defineConformance({
  label: 'embedded',
  canStall: true,
  async pair({ stalled }) {
    const a = await EmbeddedAgent.create({ name: uniq('a') });
    const b = await EmbeddedAgent.create({ name: uniq('b'), stallIncoming: stalled });
    await a.loadRemoteMetadata(await b.getLocalMetadata());
    await b.loadRemoteMetadata(await a.getLocalMetadata());
    return { a, b };
  },
  tamperSecret(md) {
    const v = new Packr({ useRecords: false }).unpack(md) as unknown[];
    const s = Uint8Array.prototype.slice.call(v[5] as Uint8Array);
    s[0] = s[0]! ^ 1;
    v[5] = s;
    return packr.pack(v);
  },
  single: (name) => EmbeddedAgent.create({ name: uniq(name) }),
});

/** A raw TCP client speaking frames to an agent. */
describe('embedded agent', () => {
  const open: TransferAgent[] = [];
  const agent = async (o: Partial<Parameters<typeof EmbeddedAgent.create>[0]> = {}) => {
    const a = await EmbeddedAgent.create({ name: uniq('e'), ...o });
    open.push(a);
    return a;
  };
  afterEach(async () => {
    await Promise.all(open.splice(0).map((a) => a.close()));
  });

  /** A transfer that must still work (the agent survived whatever came before). */
  async function stillServes(target: EmbeddedAgent): Promise<void> {
    const c = await agent();
    const lt = pattern(100_000, 21);
    const lc = new Uint8Array(100_000);
    const rt = await target.registerMemory([{ bytes: lt }]);
    const rc = await c.registerMemory([{ bytes: lc }]);
    await c.loadRemoteMetadata(await target.getLocalMetadata());
    const req = await c.makeTransfer({
      op: 'READ',
      local: await c.prepDescList(null, 'DRAM', [{ addr: rc.regions[0]!.addr, length: 100_000 }]),
      remote: await c.prepDescList(target.name, 'DRAM', [{ addr: rt.regions[0]!.addr, length: 100_000 }]),
    });
    await c.post(req);
    expect(await c.wait(req)).toBe('done');
    expect(Buffer.compare(lc, lt)).toBe(0);
  }

  it('survives hundreds of malformed frames, closing each offending connection with a ProtocolError', async () => {
    const t = await agent();
    const mem = pattern(65536, 22);
    const before = mem.slice();
    const reg = await t.registerMemory([{ bytes: mem }]);
    const errors: ProtocolError[] = [];
    t.on('protocol-error', (e) => errors.push(e));
    const meta = new Packr({ useRecords: false }).unpack(await t.getLocalMetadata()) as unknown[];
    const secret = meta[5] as Uint8Array;
    const base = reg.regions[0]!.addr;
    let seed = 12345;
    const rnd = (n: number) => {
      seed = (seed * 1103515245 + 12345) >>> 0;
      return seed % n;
    };
    const randomHeader = (): unknown => {
      const pick = [
        () => [rnd(20)],
        () => [F.READ, rnd(10), [base + rnd(70000) - 2000, rnd(70000)]],
        () => [F.WRITE, rnd(10), [base + rnd(70000), rnd(70000)]],
        () => [F.READ, -1, []],
        () => [F.HELLO, WIRE_VERSION, 'x', randomBytes(16), secret, null],
        () => [F.OK, 'x', secret, null],
        () => [F.RDATA, 1],
        () => ['str', 1],
        () => [F.WRITE, 1, [base, 2 ** 60]],
        () => [F.READ, 1, Array(20000).fill(1)],
        () => ({ t: 1 }),
        () => [F.NOTIF, 1, 2],
        () => [F.ERR, 1, 'x'.repeat(100), 'y'],
      ];
      return pick[rnd(pick.length)]!();
    };
    let sessions = 0;
    for (let i = 0; i < 300; i++) {
      const p = await RawPeer.connect(t);
      sessions++;
      const authed = i % 2 === 0;
      if (authed) await p.hello(t, { name: 'fuzz' });
      const kind = rnd(4);
      if (kind === 0) {
        p.socket.write(randomBytes(1 + rnd(300))); // pure noise
      } else if (kind === 1) {
        const h = packr.pack(randomHeader());
        const pre = Buffer.alloc(8);
        pre.writeUInt32LE(h.length, 0);
        pre.writeUInt32LE(rnd(3) === 0 ? MAX_PAYLOAD_BYTES + 1 : rnd(64), 4);
        p.socket.write(Buffer.concat([pre, h, randomBytes(rnd(64))]));
      } else if (kind === 2) {
        const pre = Buffer.alloc(8);
        pre.writeUInt32LE(rnd(2) === 0 ? 0 : 0xffffffff, 0);
        p.socket.write(pre);
      } else {
        const body = randomBytes(1 + rnd(40));
        const pre = Buffer.alloc(8);
        pre.writeUInt32LE(body.length, 0);
        p.socket.write(Buffer.concat([pre, body]));
      }
      p.socket.end();
      if (i % 50 === 49) await sleep(5);
    }
    await sleep(300);
    expect(sessions).toBe(300);
    expect(errors.length).toBeGreaterThan(150);
    expect(errors.every((e) => e instanceof ProtocolError && e.kind === 'invalid')).toBe(true);
    expect(t.protocolErrors).toBe(errors.length);
    // Out-of-bounds WRITEs in the fuzz never landed: memory unchanged.
    expect(Buffer.compare(mem, before)).toBe(0);
    await stillServes(t);
  });

  it('answers out-of-bounds READ/WRITE frames from an authenticated peer with ERR and never touches memory', async () => {
    const t = await agent();
    const mem = pattern(4096, 23);
    const before = mem.slice();
    const reg = await t.registerMemory([{ bytes: mem }]);
    const base = reg.regions[0]!.addr;
    const p = await RawPeer.connect(t);
    await p.hello(t);
    p.socket.write(encodeFrame([F.READ, 7, [base + 4000, 200]]));
    p.socket.write(encodeFrame([F.WRITE, 8, [base, 16, base + 4090, 16]], 32));
    p.socket.write(Buffer.alloc(32, 0xee));
    p.socket.write(encodeFrame([F.READ, 9, [base + 10, 5]]));
    const e7 = await p.until((f) => f.h.t === F.ERR && f.h.id === 7);
    const e8 = await p.until((f) => f.h.t === F.ERR && f.h.id === 8);
    const ok = await p.until((f) => f.h.t === F.RDATA && f.h.id === 9);
    expect((e7.h as { kind: string }).kind).toBe('invalid');
    expect((e8.h as { message: string }).message).toMatch(/outside/);
    expect([...ok.payload]).toEqual([...mem.subarray(10, 15)]);
    expect(Buffer.compare(mem, before)).toBe(0);
    expect(p.closed).toBe(false);
    p.socket.destroy();
  });

  it('lands WRITE frames that arrive in small pieces through the shared read buffer, and writes no byte of one that exceeds its grant', async () => {
    const t = await agent();
    const MiB = 1 << 20;
    // The region is the middle of a larger buffer: a write past its grant would land in the guards.
    const whole = pattern(3 * MiB, 31);
    const before = whole.slice();
    const reg = await t.registerMemory([{ bytes: whole.subarray(MiB, 2 * MiB) }]);
    const base = reg.regions[0]!.addr;
    const p = await RawPeer.connect(t);
    await p.hello(t);
    // Every incoming connection reads into the agent's one reused buffer (not 64 KiB `data` chunks).
    const inConns = (t as unknown as { inConns: Set<{ userBuffer: boolean; reads: { directReads: number } }> }).inConns;
    expect([...inConns].map((c) => c.userBuffer)).toEqual([true]);
    /** Sends `bytes` in pieces of `piece` bytes, pausing now and then so that they arrive as separate reads. */
    const trickle = async (bytes: Buffer, piece: number) => {
      for (let i = 0, k = 0; i < bytes.length; i += piece, k++) {
        p.socket.write(bytes.subarray(i, i + piece));
        if (k % 64 === 0) await sleep(1);
      }
    };
    const frame = (id: number, segs: number[], payload: Uint8Array) => Buffer.concat([encodeFrame([F.WRITE, id, segs], payload.length), payload]);
    // 1. Longer than its grant (1 MiB + 4 KiB from the region's start), in 3001-byte pieces: refused.
    await trickle(frame(1, [base, MiB + 4096], pattern(MiB + 4096, 32)), 3001);
    // 2. First segment inside, second past the end: refused before any byte lands, also the first segment's.
    await trickle(frame(2, [base, 65536, base + MiB - 100, 200], pattern(65536 + 200, 33)), 7);
    const e1 = await p.until((f) => f.h.t === F.ERR && f.h.id === 1);
    const e2 = await p.until((f) => f.h.t === F.ERR && f.h.id === 2, 10_000);
    expect((e1.h as { message: string }).message).toMatch(/outside/);
    expect((e2.h as { message: string }).message).toMatch(/segment 1 .* outside/);
    expect(Buffer.compare(whole, before)).toBe(0);
    // 3. Inside its grant, larger than the read buffer, headers split across reads: lands exactly.
    const good = pattern(MiB, 34);
    await trickle(frame(3, [base + MiB / 2, MiB / 2, base, MiB / 2], good), 65_537);
    await p.until((f) => f.h.t === F.WACK && f.h.id === 3);
    expect(Buffer.compare(whole.subarray(0, MiB), before.subarray(0, MiB))).toBe(0);
    expect(Buffer.compare(whole.subarray(2 * MiB), before.subarray(2 * MiB))).toBe(0);
    expect(Buffer.compare(whole.subarray(1.5 * MiB, 2 * MiB), good.subarray(0, MiB / 2))).toBe(0);
    expect(Buffer.compare(whole.subarray(MiB, 1.5 * MiB), good.subarray(MiB / 2))).toBe(0);
    // Part of it was received straight into the region (SocketReads of embedded-conn.ts).
    expect([...inConns][0]!.reads.directReads).toBeGreaterThan(0);
    expect(p.closed).toBe(false);
    p.socket.destroy();
  });

  it('receives large READ answers and WRITEs in place, byte-exact', async () => {
    const a = await agent();
    const b = await agent();
    const n = 6 << 20;
    const srcB = pattern(n, 41);
    const srcA = pattern(n, 42);
    const memA = new Uint8Array(n);
    const memB = new Uint8Array(n);
    const ra = await a.registerMemory([{ bytes: memA }, { bytes: srcA }]);
    const rb = await b.registerMemory([{ bytes: memB }, { bytes: srcB }]);
    await a.loadRemoteMetadata(await b.getLocalMetadata());
    // Descriptors of 1.5 MiB, reversed on the remote side: segments that do not line up with reads.
    const seg = 1.5 * (1 << 20);
    const descs = (base: number, rev: boolean) => Array.from({ length: n / seg }, (_, i) => ({ addr: base + (rev ? n / seg - 1 - i : i) * seg, length: seg }));
    const read = await a.makeTransfer({ op: 'READ', local: await a.prepDescList(null, 'DRAM', descs(ra.regions[0]!.addr, false)), remote: await a.prepDescList(b.name, 'DRAM', descs(rb.regions[1]!.addr, true)) });
    const write = await a.makeTransfer({ op: 'WRITE', local: await a.prepDescList(null, 'DRAM', descs(ra.regions[1]!.addr, false)), remote: await a.prepDescList(b.name, 'DRAM', descs(rb.regions[0]!.addr, true)) });
    await a.post(read);
    expect(await a.wait(read)).toBe('done');
    await a.post(write);
    expect(await a.wait(write)).toBe('done');
    for (let i = 0; i < n / seg; i++) {
      const j = n / seg - 1 - i;
      expect(Buffer.compare(memA.subarray(i * seg, (i + 1) * seg), srcB.subarray(j * seg, (j + 1) * seg))).toBe(0);
      expect(Buffer.compare(memB.subarray(j * seg, (j + 1) * seg), srcA.subarray(i * seg, (i + 1) * seg))).toBe(0);
    }
    const out = [...(a as unknown as { conns: Map<string, { primary: { reads: { directReads: number } } }> }).conns.values()].map((l) => l.primary);
    const inc = [...(b as unknown as { inConns: Set<{ reads: { directReads: number } }> }).inConns];
    expect(out[0]!.reads.directReads).toBeGreaterThan(0);
    expect(inc[0]!.reads.directReads).toBeGreaterThan(0);
  });

  it('writes no byte of a WRITE in flight into a region deregistered meanwhile, also when the socket was reading into it in place', async () => {
    const t = await agent();
    const MiB = 1 << 20;
    const whole = pattern(2 * MiB, 51);
    const reg = await t.registerMemory([{ bytes: whole.subarray(0, MiB) }]);
    await t.registerMemory([{ bytes: whole.subarray(MiB) }]); // stays registered
    const base = reg.regions[0]!.addr;
    const p = await RawPeer.connect(t);
    await p.hello(t);
    const conn = [...(t as unknown as { inConns: Set<{ reads: object }> }).inConns][0]!;
    const armed = () => (conn.reads as unknown as { armed: Uint8Array | null }).armed;
    const payload = pattern(MiB, 52);
    p.socket.write(encodeFrame([F.WRITE, 5, [base, MiB]], MiB));
    p.socket.write(payload.subarray(0, 100_000));
    const t0 = Date.now();
    while (armed() === null && Date.now() - t0 < 3000) await sleep(2);
    expect(armed()).not.toBeNull(); // the socket's next read goes straight into the region
    await t.deregisterMemory(reg);
    const atDeregistration = whole.slice();
    p.socket.write(payload.subarray(100_000));
    const e = await p.until((f) => f.h.t === F.ERR && f.h.id === 5);
    expect((e.h as { message: string }).message).toMatch(/deregistered/);
    expect(Buffer.compare(whole, atDeregistration)).toBe(0);
    p.socket.destroy();
  });

  it('refuses frames before HELLO and a wrong secret, with a typed error', async () => {
    const t = await agent();
    const errors: ProtocolError[] = [];
    t.on('protocol-error', (e) => errors.push(e));
    const p1 = await RawPeer.connect(t);
    p1.socket.write(encodeFrame([F.READ, 1, [0x10000, 1]]));
    const f1 = await p1.until((f) => f.h.t === F.FATAL);
    expect((f1.h as { message: string }).message).toMatch(/expected HELLO/);
    const p2 = await RawPeer.connect(t);
    await p2.sendHello(t, { name: 'me', secret: new Uint8Array(32) });
    const f2 = await p2.until((f) => f.h.t === F.FATAL);
    expect((f2.h as { message: string }).message).toMatch(/wrong secret/);
    await sleep(150);
    expect(p1.closed && p2.closed).toBe(true);
    expect(errors.map((e) => e.kind)).toEqual(['invalid', 'invalid']);
    expect(errors[1]!.message).toMatch(/wrong secret/);
  });

  it('keeps at most maxInflightBytes outstanding per connection', async () => {
    // A fake target that accepts the hello and then swallows everything without answering.
    let received = 0;
    const server = net.createServer((s) => {
      let helloDone = false;
      const sn = makeNonce();
      s.write(encodeFrame([F.CHAL, WIRE_VERSION, sn]));
      s.on('data', (c: Buffer) => {
        if (!helloDone) {
          helloDone = true;
          const cn = (packr.unpack(c.subarray(8)) as unknown[])[3] as Uint8Array;
          s.write(encodeFrame([F.OK, 'sink', makeProof(new Uint8Array(32), HANDSHAKE_CONTEXT.ok, cn, sn, 'sink'), null]));
          return;
        }
        received += c.length;
      });
      s.on('error', () => {});
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
    const port = (server.address() as net.AddressInfo).port;
    try {
      const a = await agent({ maxInflightBytes: 256 * 1024, chunkBytes: 64 * 1024 });
      const md = packr.pack(['kvconnect-embedded', 1, 'sink', '127.0.0.1', port, new Uint8Array(32), [0x10000, 64 << 20]]);
      await a.loadRemoteMetadata(md);
      const src = pattern(8 << 20, 24);
      const ra = await a.registerMemory([{ bytes: src }]);
      const req = await a.makeTransfer({
        op: 'WRITE',
        local: await a.prepDescList(null, 'DRAM', [{ addr: ra.regions[0]!.addr, length: 8 << 20 }]),
        remote: await a.prepDescList('sink', 'DRAM', [{ addr: 0x10000, length: 8 << 20 }]),
      });
      await a.post(req, { timeoutMs: 1000 });
      await sleep(300);
      expect(received).toBeGreaterThan(200 * 1024);
      expect(received).toBeLessThan(256 * 1024 + 4096); // window plus frame headers
      expect(await a.wait(req)).toBe('timeout');
    } finally {
      server.close();
    }
  });

  it('moves large transfers through small windows and chunks (backpressure), with SharedArrayBuffer memory', async () => {
    const a = await agent({ maxInflightBytes: 128 * 1024, chunkBytes: 32 * 1024 });
    const b = await agent({ maxQueuedResponseBytes: 64 * 1024 });
    const n = 16 << 20;
    const sa = new SharedArrayBuffer(n);
    const la = new Uint8Array(sa);
    const lb = pattern(n, 25);
    const ra = await a.registerMemory([{ bytes: sa }]);
    const rb = await b.registerMemory([{ bytes: lb }]);
    await a.loadRemoteMetadata(await b.getLocalMetadata());
    const local = await a.prepDescList(null, 'DRAM', [{ addr: ra.regions[0]!.addr, length: n }]);
    const remote = await a.prepDescList(b.name, 'DRAM', [{ addr: rb.regions[0]!.addr, length: n }]);
    const r = await a.makeTransfer({ op: 'READ', local, remote });
    await a.post(r);
    expect(await a.wait(r)).toBe('done');
    expect(Buffer.compare(la, lb)).toBe(0);
    la.set(pattern(n, 26));
    const w = await a.makeTransfer({ op: 'WRITE', local, remote });
    await a.post(w);
    expect(await a.wait(w)).toBe('done');
    expect(Buffer.compare(la, lb)).toBe(0);
  });

  it('decodes metadata strictly', async () => {
    const a = await agent();
    const good = packr.pack(['kvconnect-embedded', 1, 'x', '127.0.0.1', 1234, new Uint8Array(32), [0x10000, 10]]);
    expect(decodeEmbeddedMetadata(good).name).toBe('x');
    const bad: unknown[] = [
      ['kvconnect-embedded', 2, 'x', '127.0.0.1', 1234, new Uint8Array(32), []],
      ['kvconnect-embedded', 1, '', '127.0.0.1', 1234, new Uint8Array(32), []],
      ['kvconnect-embedded', 1, 'x', '127.0.0.1', 70000, new Uint8Array(32), []],
      ['kvconnect-embedded', 1, 'x', '127.0.0.1', 1234, new Uint8Array(31), []],
      ['kvconnect-embedded', 1, 'x', '127.0.0.1', 1234, new Uint8Array(32), [0x20000, 10, 0x10000, 10]],
      ['kvconnect-embedded', 1, 'x', '127.0.0.1', 1234, new Uint8Array(32), [1, -1]],
      ['other', 1],
      { a: 1 },
    ];
    for (const b of bad) await expect(a.loadRemoteMetadata(packr.pack(b))).rejects.toSatisfy((e) => isTransferError(e, 'invalid'));
    await expect(a.loadRemoteMetadata(randomBytes(100))).rejects.toSatisfy((e) => isTransferError(e, 'invalid'));
    await expect(a.loadRemoteMetadata(new Uint8Array(0))).rejects.toSatisfy((e) => isTransferError(e, 'invalid'));
  });

  it('reports remote-disconnect for a peer that is not listening, and an unreachable one does not hang', async () => {
    const a = await agent({ connectTimeoutMs: 500 });
    const src = new Uint8Array(10);
    const ra = await a.registerMemory([{ bytes: src }]);
    const srv = net.createServer();
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', () => r()));
    const port = (srv.address() as net.AddressInfo).port;
    await new Promise<void>((r) => srv.close(() => r()));
    await a.loadRemoteMetadata(packr.pack(['kvconnect-embedded', 1, 'gone', '127.0.0.1', port, new Uint8Array(32), [0x10000, 10]]));
    const req = await a.makeTransfer({
      op: 'WRITE',
      local: await a.prepDescList(null, 'DRAM', [{ addr: ra.regions[0]!.addr, length: 10 }]),
      remote: await a.prepDescList('gone', 'DRAM', [{ addr: 0x10000, length: 10 }]),
    });
    await a.post(req);
    expect(await a.wait(req)).toBe('remote-disconnect');
    expect(req.error?.message).toMatch(/cannot reach gone/);
  });

  it('runs READ, WRITE and notifs against an agent in another Node process, and sees it die mid-transfer', async () => {
    // Node 20 cannot run TypeScript: bundle the fixture (and the agent's sources) with rolldown first.
    const { child, ask } = await forkFixture('peer-process');
    try {
      const ready = (await ask({ cmd: 'start', name: uniq('child') })) as { md: number[]; addr: number; size: number; hungMd: number[]; hungAddr: number };
      const a = await agent();
      const n = ready.size;
      const la = new Uint8Array(n);
      const ra = await a.registerMemory([{ bytes: la }]);
      const peer = await a.loadRemoteMetadata(Uint8Array.from(ready.md));
      await ask({ cmd: 'load', md: [...(await a.getLocalMetadata())] });
      const local = await a.prepDescList(null, 'DRAM', [{ addr: ra.regions[0]!.addr, length: n }]);
      const remote = await a.prepDescList(peer, 'DRAM', [{ addr: ready.addr, length: n }]);
      const r = await a.makeTransfer({ op: 'READ', local, remote });
      await a.post(r);
      expect(await a.wait(r)).toBe('done');
      expect(Buffer.compare(la, pattern(n, 99))).toBe(0);
      la.set(pattern(n, 100));
      const w = await a.makeTransfer({ op: 'WRITE', local, remote, notif: new TextEncoder().encode('written') });
      await a.post(w);
      expect(await a.wait(w)).toBe('done');
      const check = (await ask({ cmd: 'check', seed: 100, notif: 'written' })) as { same: boolean; notifSeenAfterData: boolean };
      expect(check.same).toBe(true);
      expect(check.notifSeenAfterData).toBe(true);
      await ask({ cmd: 'notify', msg: [5, 6] });
      const got = await collectNotifs(a, peer, 1);
      expect([...got[0]!]).toEqual([5, 6]);
      // Now the child hangs on requests and is killed mid-transfer.
      const hung = await a.loadRemoteMetadata(Uint8Array.from(ready.hungMd));
      const hungRemote = await a.prepDescList(hung, 'DRAM', [{ addr: ready.hungAddr, length: n }]);
      const r2 = await a.makeTransfer({ op: 'READ', local, remote: hungRemote });
      expect(await a.post(r2)).toBe('in-progress');
      await sleep(100);
      child.kill('SIGKILL');
      const st = await Promise.race([a.wait(r2), sleep(5000).then(() => 'hang')]);
      expect(st).toBe('remote-disconnect');
    } finally {
      child.kill('SIGKILL');
    }
  });
});

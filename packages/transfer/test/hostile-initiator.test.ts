/**
 * The initiator's receive path (RDATA read in place into local descriptors, embedded-conn.ts
 * SocketReads) against a fake target that knows the secret of the metadata it advertises and
 * answers READs badly: typed failures, no byte outside the local descriptors (guard bytes), none
 * after the transfer ended (timeout, local deregistration), no uncaught exception.
 */
import * as net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { Packr } from 'msgpackr';
import { EmbeddedAgent, makeNonce, makeProof, type TransferAgent } from '../src/index.js';
import { encodeFrame, F, FrameReader, HANDSHAKE_CONTEXT, WIRE_VERSION, type Header } from '../src/wire.js';

let seq = 0;
const uniq = (p: string) => `${p}-${process.pid}-${++seq}`;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const GUARD = 8192;
const MiB = 1 << 20;
const packr = new Packr({ useRecords: false, variableMapSize: true });

function guarded(n: number) {
  const whole = Buffer.alloc(n + 2 * GUARD, 0xaa);
  const inner = whole.subarray(GUARD, GUARD + n);
  inner.fill(0);
  return { inner, guardsIntact: () => whole.subarray(0, GUARD).every((x) => x === 0xaa) && whole.subarray(GUARD + n).every((x) => x === 0xaa) };
}

type OnReq = (s: net.Socket, h: Header & { id: number; segs: readonly number[]; bytes: number }) => void | Promise<void>;

/** A fake target: a real agent's metadata (name, secret, regions) with the port of this server. */
async function fakeTarget(onReq: OnReq): Promise<{ meta: Uint8Array; remoteAddr: number; name: string; server: net.Server; sockets: net.Socket[] }> {
  const real = await EmbeddedAgent.create({ name: uniq('fake') });
  const reg = await real.registerMemory([{ bytes: new Uint8Array(8 * MiB) }]);
  const v = new Packr({ useRecords: false }).unpack(await real.getLocalMetadata()) as unknown[];
  await real.close();
  const name = v[2] as string;
  const secret = v[5] as Uint8Array;
  const sockets: net.Socket[] = [];
  const server = net.createServer((s) => {
    sockets.push(s);
    s.on('error', () => {});
    const sn = makeNonce();
    let authed = false;
    const reader = new FrameReader({
      onHeader: (h) => {
        if (!authed && h.t === F.HELLO) {
          authed = true;
          s.write(encodeFrame([F.OK, name, makeProof(secret, HANDSHAKE_CONTEXT.ok, h.nonce, sn, name), null]));
        } else if (h.t === F.READ || h.t === F.WRITE) void onReq(s, h as never);
        return null;
      },
      onProtocolError: () => s.destroy(),
    });
    s.on('data', (c: Buffer) => reader.push(c));
    s.write(encodeFrame([F.CHAL, WIRE_VERSION, sn]));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  v[4] = (server.address() as net.AddressInfo).port;
  return { meta: packr.pack(v), remoteAddr: reg.regions[0]!.addr, name, server, sockets };
}

describe('hostile: initiator receive path', () => {
  const open: TransferAgent[] = [];
  const servers: net.Server[] = [];
  let uncaught: unknown[] = [];
  process.on('uncaughtException', (e) => uncaught.push(e));
  afterEach(async () => {
    await Promise.all(open.splice(0).map((a) => a.close()));
    for (const s of servers.splice(0)) s.close();
    expect(uncaught).toEqual([]);
    uncaught = [];
  });

  async function setup(onReq: OnReq, n = 2 * MiB) {
    const f = await fakeTarget(onReq);
    servers.push(f.server);
    const a = await EmbeddedAgent.create({ name: uniq('i') });
    open.push(a);
    await a.loadRemoteMetadata(f.meta);
    const g = guarded(n);
    const rl = await a.registerMemory([{ bytes: g.inner }]);
    const read = async (len = n, timeoutMs?: number) => {
      const req = await a.makeTransfer({
        op: 'READ',
        local: await a.prepDescList(null, 'DRAM', [{ addr: rl.regions[0]!.addr, length: len }]),
        remote: await a.prepDescList(f.name, 'DRAM', [{ addr: f.remoteAddr, length: len }]),
      });
      await a.post(req, timeoutMs ? { timeoutMs } : undefined);
      return { req, st: await a.wait(req) };
    };
    return { a, g, f, read, rl };
  }

  it('RDATA larger than asked: typed failure, local memory untouched', async () => {
    const { g, read } = await setup((s, h) => {
      s.write(encodeFrame([F.RDATA, h.id], h.bytes + 4096));
      s.write(Buffer.alloc(h.bytes + 4096, 0x77));
    });
    const { st } = await read();
    expect(st).toBe('invalid');
    expect(g.inner.every((x) => x === 0)).toBe(true);
    expect(g.guardsIntact()).toBe(true);
  });

  it('RDATA for an unknown transfer, and a WACK for a READ: typed failure', async () => {
    const { g, read } = await setup((s, h) => {
      s.write(encodeFrame([F.RDATA, h.id + 1000], h.bytes));
      s.write(Buffer.alloc(h.bytes, 0x77));
    });
    expect((await read()).st).toBe('invalid');
    expect(g.inner.every((x) => x === 0)).toBe(true);
    const t2 = await setup((s, h) => void s.write(encodeFrame([F.WACK, h.id])));
    expect((await t2.read()).st).toBe('invalid');
  });

  it('RDATA half sent, request times out, rest arrives late: no late byte written in place', async () => {
    let sock: net.Socket | null = null;
    const { g, read } = await setup((s, h) => {
      sock = s;
      s.write(encodeFrame([F.RDATA, h.id], h.bytes));
      s.write(Buffer.alloc(600 * 1024, 0x31));
    });
    const { st } = await read(2 * MiB, 300);
    expect(st).toBe('timeout');
    const snap = Buffer.from(g.inner);
    await new Promise<void>((r) => sock!.write(Buffer.alloc(2 * MiB - 600 * 1024, 0x32), () => r()));
    await sleep(100);
    expect(Buffer.compare(snap, g.inner)).toBe(0);
    expect(g.guardsIntact()).toBe(true);
  });

  it('RDATA of the right size, followed by garbage: connection failed, no crash, guards intact', async () => {
    const { g, read } = await setup((s, h) => {
      s.write(encodeFrame([F.RDATA, h.id], h.bytes));
      s.write(Buffer.alloc(h.bytes, 0x51));
      s.write(Buffer.alloc(100000, 0xff));
    });
    const { st } = await read();
    expect(st).toBe('done');
    await sleep(100);
    expect(g.inner.every((x) => x === 0x51)).toBe(true);
    expect(g.guardsIntact()).toBe(true);
  });

  it('RDATA header split at every offset across reads', async () => {
    let k = 0;
    const { g, read } = await setup(async (s, h) => {
      const hdr = encodeFrame([F.RDATA, h.id], h.bytes);
      const cut = k++ % (hdr.length + 1);
      s.write(hdr.subarray(0, cut));
      await sleep(3);
      s.write(hdr.subarray(cut));
      await sleep(3);
      s.write(Buffer.alloc(h.bytes, 0x60 + (k % 16)));
    }, 512 * 1024);
    for (let i = 0; i < 20; i++) {
      const { st } = await read(512 * 1024);
      expect(st).toBe('done');
      expect(g.inner.every((x) => x === 0x60 + (k % 16))).toBe(true);
    }
    expect(g.guardsIntact()).toBe(true);
  });
  it('local region deregistered while its RDATA is being read in place: the READ fails invalid, no later byte lands', async () => {
    let sock: net.Socket | null = null;
    const { a, g, read, rl } = await setup((s, h) => {
      sock = s;
      s.write(encodeFrame([F.RDATA, h.id], h.bytes));
      s.write(Buffer.alloc(600 * 1024, 0x31));
    });
    const p = read(2 * MiB);
    await sleep(150);
    await a.deregisterMemory(rl);
    const snap = Buffer.from(g.inner);
    await new Promise<void>((r) => sock!.write(Buffer.alloc(2 * MiB - 600 * 1024, 0x32), () => r()));
    const { st } = await p;
    await sleep(50);
    expect(st).toBe('invalid');
    expect(Buffer.compare(snap, g.inner)).toBe(0); // no byte after the deregistration
    expect(g.guardsIntact()).toBe(true);
  });
});

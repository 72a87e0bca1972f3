// A target of the embedded agent that speaks its wire by hand (packages/transfer/src/wire.ts,
// the target's side of embedded-conn.ts's handshake), for tests of how an initiator treats a
// target that answers what an honest one never would (on another lane, late, never).
import * as net from 'node:net';
import { randomBytes } from 'node:crypto';
import { makeNonce, makeProof } from '../src/index.js';
import { META_MAGIC, META_VERSION, packr } from '../src/embedded-metadata.js';
import { encodeFrame, F, FrameReader, HANDSHAKE_CONTEXT, WIRE_VERSION, type Header } from '../src/wire.js';

/** One accepted connection: its challenge, the HELLO it got and every later frame (header, payload). */
export interface FakeConn {
  readonly socket: net.Socket;
  readonly sn: Uint8Array;
  hello: Extract<Header, { t: typeof F.HELLO }> | null;
  readonly frames: Array<{ h: Header; payload: Buffer }>;
  closed: boolean;
}

/**
 * A listening fake target named `name` advertising one region `[addr, addr + length)`. It
 * answers every HELLO with a correct OK (unless `onHello` returns false), and leaves frames to the
 * test (`conns[i].frames`; answer with {@link rdata} / {@link wack}).
 */
export class FakeTarget {
  readonly secret = randomBytes(32);
  readonly conns: FakeConn[] = [];
  private constructor(
    readonly name: string,
    readonly server: net.Server,
    readonly port: number,
    readonly region: { addr: number; length: number },
  ) {}

  static async listen(name: string, region = { addr: 0x10000, length: 1 << 24 }, onHello: (c: FakeConn) => boolean = () => true): Promise<FakeTarget> {
    let t: FakeTarget | null = null;
    const server = net.createServer({ noDelay: true }, (s) => {
      const c: FakeConn = { socket: s, sn: makeNonce(), hello: null, frames: [], closed: false };
      t!.conns.push(c);
      let cur: Buffer[] = [];
      const reader = new FrameReader({
        onHeader: (h) => {
          if (c.hello === null && h.t === F.HELLO) {
            c.hello = h as FakeConn['hello'];
            if (onHello(c)) s.write(encodeFrame([F.OK, name, makeProof(t!.secret, HANDSHAKE_CONTEXT.ok, h.nonce, c.sn, name), null]));
            return null;
          }
          cur = [];
          return { write: (b) => cur.push(Buffer.from(b)), end: () => c.frames.push({ h, payload: Buffer.concat(cur) }) };
        },
        onProtocolError: () => s.destroy(),
      });
      s.on('data', (b: Buffer) => reader.push(b));
      s.on('close', () => (c.closed = true));
      s.on('error', () => {});
      s.write(encodeFrame([F.CHAL, WIRE_VERSION, c.sn]));
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
    t = new FakeTarget(name, server, (server.address() as net.AddressInfo).port, region);
    return t;
  }

  /** The metadata an initiator loads for this target (META_VERSION 2, 9 fields). */
  metadata(): Uint8Array {
    const b = packr.pack([META_MAGIC, META_VERSION, this.name, '127.0.0.1', this.port, this.secret, [this.region.addr, this.region.length], null, null]);
    return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
  }

  /** Authenticated connections: the first (session) ones and the lanes (HELLO with a session). */
  get ready(): FakeConn[] {
    return this.conns.filter((c) => c.hello !== null && !c.closed);
  }

  close(): Promise<void> {
    for (const c of this.conns) c.socket.destroy();
    return new Promise((r) => this.server.close(() => r()));
  }
}

/** Sends `[RDATA, id]` with `payload` on `c`. */
export function rdata(c: FakeConn, id: number, payload: Uint8Array): void {
  c.socket.write(encodeFrame([F.RDATA, id], payload.length));
  c.socket.write(payload);
}

/** Sends `[WACK, id]` on `c`. */
export function wack(c: FakeConn, id: number): void {
  c.socket.write(encodeFrame([F.WACK, id]));
}

// A peer of the embedded agent that speaks its wire by hand (packages/transfer/src/wire.ts,
// embedded-conn.ts's handshake), for tests that send what an honest agent never would.
import * as net from 'node:net';
import { Packr } from 'msgpackr';
import { type EmbeddedAgent, makeNonce, makeProof } from '../src/index.js';
import { encodeFrame, F, FrameReader, HANDSHAKE_CONTEXT, WIRE_VERSION, type Header } from '../src/wire.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** One TCP connection to an agent: every frame it receives (header and whole payload) kept in order. */
export class RawPeer {
  readonly frames: Array<{ h: Header; payload: Buffer }> = [];
  closed = false;
  private constructor(readonly socket: net.Socket) {
    let cur: Buffer[] = [];
    const reader = new FrameReader({
      onHeader: (h) => {
        cur = [];
        return {
          write: (c) => cur.push(Buffer.from(c)),
          end: () => this.frames.push({ h, payload: Buffer.concat(cur) }),
        };
      },
      onProtocolError: () => socket.destroy(),
    });
    socket.on('data', (c: Buffer) => reader.push(c));
    socket.on('close', () => (this.closed = true));
    socket.on('error', () => {});
  }
  /** Connects to `agent`'s listening address (Nagle off, so split frames go out as written). */
  static async connect(agent: EmbeddedAgent): Promise<RawPeer> {
    const s = net.connect(agent.address.port, agent.address.host);
    s.setNoDelay(true);
    await new Promise<void>((r, j) => s.once('connect', () => r()).once('error', j));
    return new RawPeer(s);
  }
  /** The target's challenge nonce (its first frame). */
  async challenge(): Promise<Uint8Array> {
    const c = await this.until((f) => f.h.t === F.CHAL);
    return (c.h as { nonce: Uint8Array }).nonce;
  }
  /**
   * Sends HELLO for `agent` (proofs made with `secret`, default the agent's own from its
   * metadata); with `session` (a first connection's challenge), the lane HELLO of `wire.ts`.
   */
  async sendHello(agent: EmbeddedAgent, o: { name?: string; secret?: Uint8Array; cluster?: Uint8Array; session?: Uint8Array } = {}): Promise<void> {
    const v = new Packr({ useRecords: false }).unpack(await agent.getLocalMetadata()) as unknown[];
    const sn = await this.challenge();
    const cn = makeNonce();
    const name = o.name ?? 'raw';
    const secret = o.secret ?? (v[5] as Uint8Array);
    const proof = o.session ? makeProof(secret, HANDSHAKE_CONTEXT.helloLane, sn, cn, name, o.session) : makeProof(secret, HANDSHAKE_CONTEXT.hello, sn, cn, name);
    const cluster = o.cluster ? makeProof(o.cluster, HANDSHAKE_CONTEXT.helloCluster, sn, cn, name, agent.name) : null;
    this.socket.write(encodeFrame(o.session ? [F.HELLO, WIRE_VERSION, name, cn, proof, cluster, o.session] : [F.HELLO, WIRE_VERSION, name, cn, proof, cluster]));
  }
  /** The whole handshake: HELLO, then the target's OK. */
  async hello(agent: EmbeddedAgent, o: { name?: string; cluster?: Uint8Array; session?: Uint8Array } = {}): Promise<void> {
    await this.sendHello(agent, o);
    await this.until((f) => f.h.t === F.OK);
  }
  /** The first received frame matching `pred`, waiting up to `ms`; throws when none came. */
  async until(pred: (f: { h: Header; payload: Buffer }) => boolean, ms = 5000): Promise<{ h: Header; payload: Buffer }> {
    const end = Date.now() + ms;
    for (;;) {
      const f = this.frames.find(pred);
      if (f) return f;
      if (Date.now() > end) throw new Error('frame did not arrive');
      await sleep(2);
    }
  }
  /** Writes raw bytes; resolves once the socket took them. */
  write(b: Uint8Array): Promise<void> {
    return new Promise((r) => this.socket.write(b, () => r()));
  }
}

/**
 * The side channel's TCP transport (node:net): length-prefixed frames (`u32 LE` + MessagePack,
 * see `protocol.ts`), a server that answers requests with an async handler, and a client with
 * request ids, deadlines and reconnection. A peer that sends an oversized or undecodable frame is
 * disconnected; the process goes on serving everyone else.
 * @module
 */
import * as net from 'node:net';
import { NixlDecodeError } from './codec.js';
import { LIMITS, decodeRequest, decodeResponse, encodeOk, encodeRefusal, encodeRequest, type SideErrorCode, type SideRequest } from './protocol.js';

/** A request the peer refused (`code`), or a transport failure (`code` `transport`/`timeout`/`protocol`). */
export class SideChannelError extends Error {
  override readonly name: string = 'SideChannelError';
  constructor(
    readonly code: SideErrorCode | 'transport' | 'timeout' | 'protocol',
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/** What a request handler returns: an ok body (MessagePack-ready), or a refusal. */
export type HandlerResult = { ok: unknown } | { refuse: SideErrorCode; message: string };

/** Splits a byte stream into frames; calls `onFrame` per frame, `onError` once for a bad prefix. */
class FrameSplitter {
  private buf: Buffer = Buffer.alloc(0);
  private dead = false;
  constructor(
    private readonly maxBytes: number,
    private readonly onFrame: (f: Buffer) => void,
    private readonly onError: (msg: string) => void,
  ) {}

  push(chunk: Buffer): void {
    if (this.dead) return;
    this.buf = this.buf.length === 0 ? chunk : Buffer.concat([this.buf, chunk]);
    while (!this.dead && this.buf.length >= 4) {
      const n = this.buf.readUInt32LE(0);
      if (n === 0 || n > this.maxBytes) {
        this.dead = true;
        this.onError(`frame of ${n} bytes (limit ${this.maxBytes})`);
        return;
      }
      if (this.buf.length < 4 + n) return;
      const f = this.buf.subarray(4, 4 + n);
      this.buf = this.buf.subarray(4 + n);
      this.onFrame(f);
    }
  }
}

function frame(body: Uint8Array): Buffer {
  const out = Buffer.allocUnsafe(4 + body.byteLength);
  out.writeUInt32LE(body.byteLength, 0);
  out.set(body, 4);
  return out;
}

/** Options of a {@link SideChannelServer}. */
export interface SideChannelServerOptions {
  /** Largest accepted frame (default {@link LIMITS}.frameBytes). */
  maxFrameBytes?: number;
  /** Called for every peer that broke the protocol (it is disconnected). */
  onProtocolError?: (peer: string, message: string) => void;
}

/** The server half: answers {@link SideRequest}s with `handler`. */
export class SideChannelServer {
  private server: net.Server | null = null;
  private readonly sockets = new Set<net.Socket>();
  /** Where it listens (after {@link listen}). */
  address: { host: string; port: number } | null = null;

  constructor(
    private readonly handler: (req: SideRequest, peer: string) => Promise<HandlerResult> | HandlerResult,
    private readonly o: SideChannelServerOptions = {},
  ) {}

  /** Listens on `host:port` (port 0: any free port). @returns the bound address. */
  async listen(host: string, port: number): Promise<{ host: string; port: number }> {
    const server = net.createServer({ noDelay: true }, (s) => this.accept(s));
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen({ host, port }, () => {
        server.off('error', reject);
        resolve();
      });
    });
    server.unref();
    this.server = server;
    const a = server.address() as net.AddressInfo;
    this.address = { host, port: a.port };
    return this.address;
  }

  private accept(s: net.Socket): void {
    this.sockets.add(s);
    const peer = `${s.remoteAddress}:${s.remotePort}`;
    s.on('close', () => this.sockets.delete(s));
    s.on('error', () => {});
    const splitter = new FrameSplitter(
      this.o.maxFrameBytes ?? LIMITS.frameBytes,
      (f) => void this.serve(s, peer, f),
      (msg) => this.protocolError(s, peer, msg),
    );
    s.on('data', (c) => splitter.push(c));
  }

  private protocolError(s: net.Socket, peer: string, msg: string): void {
    this.o.onProtocolError?.(peer, msg);
    s.destroy();
  }

  private async serve(s: net.Socket, peer: string, f: Buffer): Promise<void> {
    let seq: number;
    let req: SideRequest;
    try {
      ({ seq, req } = decodeRequest(f));
    } catch (e) {
      this.protocolError(s, peer, e instanceof NixlDecodeError ? e.reason : String(e));
      return;
    }
    let out: Uint8Array;
    try {
      const r = await this.handler(req, peer);
      out = 'ok' in r ? encodeOk(seq, r.ok) : encodeRefusal(seq, r.refuse, r.message);
    } catch (e) {
      out = encodeRefusal(seq, 'internal', e instanceof Error ? e.message : String(e));
    }
    if (!s.destroyed) s.write(frame(out));
  }

  /** Stops listening and closes every connection. */
  async close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    const srv = this.server;
    this.server = null;
    if (srv) await new Promise<void>((r) => srv.close(() => r()));
  }
}

/** Options of a {@link SideChannelClient}. */
export interface SideChannelClientOptions {
  /** Deadline of one request, including connecting (default 5000 ms). */
  timeoutMs?: number;
  maxFrameBytes?: number;
}

interface Waiter {
  resolve: (body: unknown) => void;
  reject: (e: SideChannelError) => void;
  timer: NodeJS.Timeout;
}

/** The client half: one connection to `host:port`, reopened on demand after it closes. */
export class SideChannelClient {
  private socket: net.Socket | null = null;
  private connecting: Promise<net.Socket> | null = null;
  private seq = 1;
  private readonly waiters = new Map<number, Waiter>();
  private closed = false;

  constructor(
    readonly host: string,
    readonly port: number,
    private readonly o: SideChannelClientOptions = {},
  ) {}

  private get timeoutMs(): number {
    return this.o.timeoutMs ?? 5000;
  }

  private connect(): Promise<net.Socket> {
    if (this.socket && !this.socket.destroyed) return Promise.resolve(this.socket);
    if (this.connecting) return this.connecting;
    this.connecting = new Promise<net.Socket>((resolve, reject) => {
      const s = net.createConnection({ host: this.host, port: this.port, noDelay: true });
      const timer = setTimeout(() => {
        s.destroy();
        reject(new SideChannelError('timeout', `connect to ${this.host}:${this.port} timed out`));
      }, this.timeoutMs);
      s.once('connect', () => {
        clearTimeout(timer);
        s.unref();
        this.socket = s;
        resolve(s);
      });
      s.once('error', (e) => {
        clearTimeout(timer);
        reject(new SideChannelError('transport', `side channel ${this.host}:${this.port}: ${e.message}`, { cause: e }));
      });
      const splitter = new FrameSplitter(
        this.o.maxFrameBytes ?? LIMITS.frameBytes,
        (f) => this.onFrame(s, f),
        (msg) => this.drop(s, new SideChannelError('protocol', `side channel ${this.host}:${this.port}: ${msg}`)),
      );
      s.on('data', (c) => splitter.push(c));
      s.on('close', () => this.drop(s, new SideChannelError('transport', `side channel ${this.host}:${this.port} closed`)));
    }).finally(() => {
      this.connecting = null;
    });
    return this.connecting;
  }

  private onFrame(s: net.Socket, f: Buffer): void {
    let r;
    try {
      r = decodeResponse(f);
    } catch (e) {
      this.drop(s, new SideChannelError('protocol', `side channel ${this.host}:${this.port}: ${e instanceof NixlDecodeError ? e.reason : String(e)}`));
      return;
    }
    const w = this.waiters.get(r.seq);
    if (!w) return;
    this.waiters.delete(r.seq);
    clearTimeout(w.timer);
    if (r.ok) w.resolve(r.body);
    else w.reject(new SideChannelError(r.code, r.message));
  }

  /** Fails every waiter (the connection is gone) and forgets the socket. */
  private drop(s: net.Socket, e: SideChannelError): void {
    s.destroy();
    if (this.socket === s) this.socket = null;
    for (const [k, w] of this.waiters) {
      clearTimeout(w.timer);
      w.reject(e);
      this.waiters.delete(k);
    }
  }

  /**
   * Sends `req` and resolves with the decoded ok body (`decode` is the body's strict decoder).
   * `timeoutMs`: how long to wait for the answer (default: the client's). A peer answers between
   * its engine steps, so requests that belong to a transfer (lease pin, push registration) pass
   * the transfer's deadline, not the handshake's.
   *
   * The deadline is checked after pending input was read: when this process was itself busy past
   * the deadline, the timer fires before the socket is polled, so the rejection waits one turn
   * (`setImmediate`, after the poll phase) and an answer that already arrived wins.
   * @throws SideChannelError: the peer's refusal code, or `transport` / `timeout` / `protocol`.
   */
  async request<T>(req: SideRequest, decode: (body: unknown) => T, timeoutMs: number = this.timeoutMs): Promise<T> {
    if (this.closed) throw new SideChannelError('transport', 'client closed');
    const s = await this.connect();
    const seq = this.seq;
    this.seq = this.seq >= 0xffffffff ? 1 : this.seq + 1;
    const body = await new Promise<unknown>((resolve, reject) => {
      const w: Waiter = {
        resolve,
        reject,
        timer: setTimeout(() => {
          setImmediate(() => {
            if (this.waiters.get(seq) !== w) return; // answered (or dropped) meanwhile
            this.waiters.delete(seq);
            reject(new SideChannelError('timeout', `side channel ${this.host}:${this.port}: no answer in ${timeoutMs} ms`));
          });
        }, timeoutMs),
      };
      this.waiters.set(seq, w);
      s.write(frame(encodeRequest(seq, req)));
    });
    try {
      return decode(body);
    } catch (e) {
      throw new SideChannelError('protocol', `side channel ${this.host}:${this.port}: ${e instanceof NixlDecodeError ? e.reason : String(e)}`, { cause: e });
    }
  }

  /** Closes the connection; pending requests fail with `transport`. */
  close(): void {
    this.closed = true;
    if (this.socket) this.drop(this.socket, new SideChannelError('transport', 'client closed'));
  }
}

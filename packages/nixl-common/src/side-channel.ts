/**
 * The side channel's TCP transport (node:net): length-prefixed frames (`u32 LE` + MessagePack,
 * see `protocol.ts`), a server that answers requests with an async handler, and a client with
 * request ids, deadlines and reconnection. A peer that sends an oversized or undecodable frame is
 * disconnected; the process goes on serving everyone else.
 *
 * With a cluster secret both halves authenticate every connection and seal every frame
 * (`protocol.ts`, module comment; `docs/security.md`). Resources a peer can make the process hold
 * are bounded ({@link SideChannelServerOptions}): the frame size a peer announces is checked
 * before anything is buffered, a frame must complete within a deadline, buffered bytes are capped
 * per connection (one frame) and in total, and so are pending requests, queued response bytes and
 * connections.
 * @module
 */
import * as net from 'node:net';
import { NONCE_BYTES, PROOF_BYTES, checkProof, makeNonce, makeProof, takeBytes } from '@kvconnect/transfer';
import { NixlDecodeError } from './codec.js';
import {
  LIMITS,
  NIXL_PROTOCOL_VERSION,
  SIDE_AUTH_CONTEXT,
  decodeAuthBody,
  decodeAuthRequest,
  decodeRequest,
  decodeResponse,
  encodeAuthBody,
  encodeAuthRequest,
  encodeOk,
  encodeRefusal,
  encodeRequest,
  isAuthRequest,
  openFrame,
  sealFrame,
  type SideErrorCode,
  type SideRequest,
  type SideResponse,
  type SideSession,
} from './protocol.js';

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

/** A budget shared by several holders: bytes of {@link FrameAssembler}s (a server's total cap), or waiters of clients. */
export interface ByteBudget {
  /** Units (bytes, waiters) held now. */
  used: number;
  /** Most units that may be held. */
  readonly max: number;
}

/**
 * Splits a byte stream of `u32 LE length` + body frames into frames. The announced length is
 * checked against `maxBytes` as soon as its 4 bytes arrived, before more is buffered; received
 * chunks are kept as they are and concatenated once per frame (no per-chunk re-copy); a frame
 * must complete within `partialTimeoutMs` of its first byte; every held byte counts against
 * `budget`. Any breach calls `onError` once and the assembler ignores all further input.
 */
export class FrameAssembler {
  private chunks: Buffer[] = [];
  private held = 0;
  private dead = false;
  private timer: NodeJS.Timeout | null = null;
  private frameNo = 0;

  constructor(
    private maxBytes: number,
    private readonly onFrame: (f: Buffer) => void,
    private readonly onError: (msg: string) => void,
    private readonly o: { budget?: ByteBudget; partialTimeoutMs?: number; makeRoom?: (bytes: number) => void } = {},
  ) {}

  /** Bytes received and not yet handed out as frames. */
  get buffered(): number {
    return this.held;
  }

  /** Changes the largest accepted frame (e.g. after authentication). */
  setMaxBytes(n: number): void {
    this.maxBytes = n;
  }

  push(chunk: Buffer): void {
    if (this.dead || chunk.length === 0) return;
    const b = this.o.budget;
    if (b && b.used + chunk.length > b.max) {
      this.o.makeRoom?.(chunk.length); // may evict this assembler itself
      if (this.dead) return;
      if (b.used + chunk.length > b.max) return this.fail(`more than ${b.max} bytes buffered across connections`);
    }
    this.chunks.push(chunk);
    this.held += chunk.length;
    if (b) b.used += chunk.length;
    let done = false;
    while (!this.dead && this.held >= 4) {
      const n = this.peekU32();
      if (n === 0 || n > this.maxBytes) return this.fail(`frame of ${n} bytes (limit ${this.maxBytes})`);
      if (this.held < 4 + n) break;
      const f = this.take(4 + n).subarray(4);
      done = true;
      this.onFrame(f);
    }
    if (this.dead) return;
    if (this.held === 0) this.clearTimer();
    else if (done || this.timer === null) this.armTimer();
  }

  /** Stops for good and returns the held bytes to the budget. */
  kill(): void {
    if (this.dead) return;
    this.dead = true;
    this.clearTimer();
    if (this.o.budget) this.o.budget.used -= this.held;
    this.held = 0;
    this.chunks = [];
  }

  private fail(msg: string): void {
    if (this.dead) return;
    this.kill();
    this.onError(msg);
  }

  private armTimer(): void {
    const ms = this.o.partialTimeoutMs;
    if (ms === undefined) return;
    this.clearTimer();
    const no = ++this.frameNo;
    this.timer = setTimeout(() => {
      // Bytes that arrived while this process was busy are read first (poll phase), then judged.
      setImmediate(() => {
        if (no === this.frameNo && this.held > 0) this.fail(`partial frame not completed within ${ms} ms`);
      });
    }, ms);
    this.timer.unref();
  }

  private clearTimer(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    this.frameNo++;
  }

  private peekU32(): number {
    const c = this.chunks[0]!;
    if (c.length >= 4) return c.readUInt32LE(0);
    const head = Buffer.alloc(4);
    let off = 0;
    for (const x of this.chunks) {
      off += x.copy(head, off, 0, Math.min(x.length, 4 - off));
      if (off === 4) break;
    }
    return head.readUInt32LE(0);
  }

  /** The first `n` held bytes as one buffer (a view when they lie in one chunk, else one copy). */
  private take(n: number): Buffer {
    const out = takeBytes(this.chunks, n);
    this.held -= n;
    if (this.o.budget) this.o.budget.used -= n;
    return out;
  }
}

function frame(body: Uint8Array): Buffer {
  const out = Buffer.allocUnsafe(4 + body.byteLength);
  out.writeUInt32LE(body.byteLength, 0);
  out.set(body, 4);
  return out;
}

/** `body` sealed for `session` in direction `ctx` (a no-op without a secret). */
function seal(secret: Uint8Array | null, session: SideSession | null, ctx: string, body: Uint8Array): Uint8Array {
  if (!secret || !session) return body;
  return sealFrame(body, makeProof(secret, ctx, session.clientNonce, session.serverNonce, body));
}

/** Options of a {@link SideChannelServer}. Every limit has a default; tests lower them. */
export interface SideChannelServerOptions {
  /** Largest accepted request frame once authenticated (default {@link LIMITS}.requestFrameBytes). */
  maxFrameBytes?: number;
  /** The cluster secret: every connection must authenticate and seal its frames (default none). */
  clusterSecret?: Uint8Array | null;
  /**
   * Most bytes buffered across all connections (default 256 MiB). When a chunk would exceed it,
   * the connections holding the most bytes are disconnected first (a flooder, not a newcomer with a
   * small request), until it fits.
   */
  maxBufferedBytes?: number;
  /** A frame must complete within this many ms of its first byte (default 15 000). */
  partialFrameTimeoutMs?: number;
  /** With a secret: a connection must send a valid sealed request within this many ms (default 10 000). */
  authTimeoutMs?: number;
  /**
   * Most requests of one connection being handled (default 64); beyond, its further requests
   * wait in order and its socket is not read until they are served.
   */
  maxPendingPerPeer?: number;
  /** Most requests being handled in total; beyond, requests are refused with `busy` (default 1024). */
  maxPendingTotal?: number;
  /** Most response bytes queued on one connection before its socket is not read (default 64 MiB). */
  maxQueuedResponseBytes?: number;
  /** Most open connections (default 1024); beyond, the one idle the longest is closed, or the new one when none is idle. */
  maxConnections?: number;
  /** Called for every peer that broke the protocol or failed authentication (it is disconnected). */
  onProtocolError?: (peer: string, message: string) => void;
}

/** Counters of a {@link SideChannelServer} (for tests and operators). */
export interface SideChannelServerStats {
  /** Open connections. */
  connections: number;
  /** Bytes of partial frames held across connections. */
  bufferedBytes: number;
  /** Requests being handled. */
  pending: number;
  /** Peers disconnected for breaking the protocol, failing authentication or exceeding a limit. */
  droppedPeers: number;
  /** Frames received (every connection, since listen), and their bytes with the 4-byte length prefixes. */
  framesIn: number;
  bytesIn: number;
}

interface ServerConn {
  readonly socket: net.Socket;
  readonly peer: string;
  readonly frames: FrameAssembler;
  session: SideSession | null;
  /** With a secret: a sealed request passed its proof. */
  proven: boolean;
  lastSeq: number;
  pending: number;
  /** Requests received while {@link SideChannelServerOptions.maxPendingPerPeer} were pending. */
  readonly queue: Array<{ seq: number; req: SideRequest }>;
  paused: boolean;
  drainWait: boolean;
  closing: boolean;
  /** When it last sent bytes (ms since epoch; for {@link SideChannelServer.evictIdle}). */
  lastActive: number;
  authTimer: NodeJS.Timeout | null;
}

/** The server half: answers {@link SideRequest}s with `handler`. */
export class SideChannelServer {
  private server: net.Server | null = null;
  private readonly conns = new Set<ServerConn>();
  private readonly budget: ByteBudget;
  private readonly secret: Uint8Array | null;
  private pending = 0;
  private dropped = 0;
  private framesIn = 0;
  private bytesIn = 0;
  /** Where it listens (after {@link listen}). */
  address: { host: string; port: number } | null = null;

  constructor(
    private readonly handler: (req: SideRequest, peer: string) => Promise<HandlerResult> | HandlerResult,
    private readonly o: SideChannelServerOptions = {},
  ) {
    this.secret = o.clusterSecret ?? null;
    this.budget = { used: 0, max: o.maxBufferedBytes ?? 256 * 1024 * 1024 };
  }

  /** Current counters. */
  stats(): SideChannelServerStats {
    return { connections: this.conns.size, bufferedBytes: this.budget.used, pending: this.pending, droppedPeers: this.dropped, framesIn: this.framesIn, bytesIn: this.bytesIn };
  }

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
    s.on('error', () => {});
    if (this.conns.size >= (this.o.maxConnections ?? 1024) && !this.evictIdle()) {
      this.dropped++;
      s.destroy();
      return;
    }
    const peer = `${s.remoteAddress}:${s.remotePort}`;
    const c: ServerConn = {
      socket: s,
      peer,
      session: null,
      proven: false,
      lastSeq: 0,
      pending: 0,
      queue: [],
      paused: false,
      drainWait: false,
      closing: false,
      lastActive: Date.now(),
      authTimer: null,
      frames: new FrameAssembler(
        this.secret ? LIMITS.authFrameBytes : (this.o.maxFrameBytes ?? LIMITS.requestFrameBytes),
        (f) => this.onFrame(c, f),
        (msg) => this.protocolError(c, msg),
        { budget: this.budget, partialTimeoutMs: this.o.partialFrameTimeoutMs ?? 15_000, makeRoom: (n) => this.makeRoom(n) },
      ),
    };
    this.conns.add(c);
    if (this.secret) {
      c.authTimer = setTimeout(() => this.refuseConnection(c, 'unauthenticated', 'no authenticated request in time'), this.o.authTimeoutMs ?? 10_000);
      c.authTimer.unref();
    }
    s.on('close', () => {
      this.conns.delete(c);
      c.frames.kill();
      if (c.authTimer) clearTimeout(c.authTimer);
    });
    s.on('data', (chunk: Buffer) => {
      c.lastActive = Date.now();
      c.frames.push(chunk);
    });
  }

  /**
   * At the connection cap: closes the connection idle the longest (nothing pending, queued or
   * buffered; a genuine client reconnects on its next request). @returns false when none is idle.
   */
  private evictIdle(): boolean {
    let idle: ServerConn | null = null;
    for (const c of this.conns) {
      if (c.closing || c.pending > 0 || c.queue.length > 0 || c.frames.buffered > 0) continue;
      if (!idle || c.lastActive < idle.lastActive) idle = c;
    }
    if (!idle) return false;
    this.protocolError(idle, `idle connection closed: the side channel holds ${this.conns.size} connections`);
    this.conns.delete(idle);
    return true;
  }

  /** Disconnects the connections holding the most buffered bytes until `bytes` more fit the budget. */
  private makeRoom(bytes: number): void {
    const by = [...this.conns].filter((c) => c.frames.buffered > 0).sort((x, y) => y.frames.buffered - x.frames.buffered);
    for (const c of by) {
      if (this.budget.used + bytes <= this.budget.max) return;
      this.protocolError(c, `evicted: ${c.frames.buffered} bytes of a partial frame held while the side channel's ${this.budget.max}-byte buffer budget is exhausted`);
    }
  }

  private protocolError(c: ServerConn, msg: string): void {
    if (c.closing) return;
    c.closing = true;
    this.dropped++;
    c.frames.kill();
    this.o.onProtocolError?.(c.peer, msg);
    c.socket.destroy();
  }

  /** Tells the peer why (seq 0 refusal, sealed once the session exists), then closes. */
  private refuseConnection(c: ServerConn, code: SideErrorCode, msg: string): void {
    if (c.closing) return;
    c.closing = true;
    this.dropped++;
    c.frames.kill();
    this.o.onProtocolError?.(c.peer, msg);
    if (!c.socket.destroyed) c.socket.end(frame(seal(this.secret, c.session, SIDE_AUTH_CONTEXT.response, encodeRefusal(0, code, msg))));
    setTimeout(() => c.socket.destroy(), 100).unref();
  }

  private onFrame(c: ServerConn, f: Buffer): void {
    this.framesIn++;
    this.bytesIn += 4 + f.byteLength;
    if (c.closing) return;
    const secret = this.secret;
    if (secret && !c.session) return this.answerAuth(c, secret, f);
    let body: Uint8Array = f;
    if (secret && c.session) {
      let mac: Uint8Array;
      try {
        ({ body, mac } = openFrame(f, PROOF_BYTES));
      } catch (e) {
        return this.refuseConnection(c, 'unauthenticated', e instanceof NixlDecodeError ? e.reason : String(e));
      }
      // The proof is checked before anything of the frame is decoded.
      if (!checkProof(mac, secret, SIDE_AUTH_CONTEXT.request, c.session.clientNonce, c.session.serverNonce, body)) {
        return this.refuseConnection(c, 'unauthenticated', 'request failed its proof of the cluster secret');
      }
    }
    let seq: number;
    let req: SideRequest;
    try {
      ({ seq, req } = decodeRequest(body));
    } catch (e) {
      if (!secret && isAuthRequest(body)) return this.refuseConnection(c, 'unauthenticated', 'this side channel has no cluster secret (set cluster_secret or KVCONNECT_CLUSTER_SECRET on both sides)');
      return this.protocolError(c, e instanceof NixlDecodeError ? e.reason : String(e));
    }
    if (secret) {
      if (seq <= c.lastSeq) return this.refuseConnection(c, 'unauthenticated', `request seq ${seq} replayed or out of order (last ${c.lastSeq})`);
      c.lastSeq = seq;
      if (!c.proven) {
        c.proven = true;
        c.frames.setMaxBytes(this.o.maxFrameBytes ?? LIMITS.requestFrameBytes);
        if (c.authTimer) clearTimeout(c.authTimer);
        c.authTimer = null;
      }
    }
    if (c.queue.length > 0 || c.pending >= (this.o.maxPendingPerPeer ?? 64)) c.queue.push({ seq, req });
    else void this.serve(c, seq, req);
  }

  /** The first frame of a connection to a server with a secret: `AUTH`, answered with the server's proof. */
  private answerAuth(c: ServerConn, secret: Uint8Array, f: Buffer): void {
    let clientNonce: Uint8Array;
    let version: number;
    try {
      ({ clientNonce, version } = decodeAuthRequest(f, NONCE_BYTES));
    } catch {
      return this.refuseConnection(c, 'unauthenticated', 'this side channel requires the cluster secret: the first frame must be AUTH');
    }
    if (version !== NIXL_PROTOCOL_VERSION) return this.refuseConnection(c, 'incompatible', `side channel speaks version ${NIXL_PROTOCOL_VERSION}, peer ${version}`);
    const serverNonce = makeNonce();
    const proof = makeProof(secret, SIDE_AUTH_CONTEXT.auth, clientNonce, serverNonce);
    c.socket.write(frame(encodeOk(0, encodeAuthBody(serverNonce, proof))));
    c.session = { clientNonce, serverNonce };
    // The frame limit stays at the pre-authentication one until a request proved the secret
    // (AUTH itself proves nothing: anyone can send one).
  }

  private async serve(c: ServerConn, seq: number, req: SideRequest): Promise<void> {
    let out: Uint8Array;
    if (this.pending >= (this.o.maxPendingTotal ?? 1024)) {
      out = encodeRefusal(seq, 'busy', `side channel has ${this.pending} requests pending`);
    } else {
      this.pending++;
      c.pending++;
      this.flow(c);
      try {
        const r = await this.handler(req, c.peer);
        out = 'ok' in r ? encodeOk(seq, r.ok) : encodeRefusal(seq, r.refuse, r.message);
      } catch (e) {
        out = encodeRefusal(seq, 'internal', e instanceof Error ? e.message : String(e));
      } finally {
        this.pending--;
        c.pending--;
      }
    }
    if (!c.socket.destroyed && !c.closing) c.socket.write(frame(seal(this.secret, c.session, SIDE_AUTH_CONTEXT.response, out)));
    const next = c.queue.length > 0 && c.pending < (this.o.maxPendingPerPeer ?? 64) ? c.queue.shift() : undefined;
    if (next && !c.closing) void this.serve(c, next.seq, next.req);
    this.flow(c);
  }

  /** Stops reading a peer with too many requests pending or too many response bytes queued. */
  private flow(c: ServerConn): void {
    const s = c.socket;
    const backlog = s.writableLength >= (this.o.maxQueuedResponseBytes ?? 64 * 1024 * 1024);
    const stop = backlog || c.pending + c.queue.length >= (this.o.maxPendingPerPeer ?? 64);
    if (stop && !c.paused) {
      c.paused = true;
      s.pause();
    } else if (!stop && c.paused) {
      c.paused = false;
      s.resume();
    }
    if (stop && backlog && !c.drainWait) {
      c.drainWait = true;
      s.once('drain', () => {
        c.drainWait = false;
        this.flow(c);
      });
    }
  }

  /** Stops listening and closes every connection. */
  async close(): Promise<void> {
    for (const c of this.conns) c.socket.destroy();
    const srv = this.server;
    this.server = null;
    if (srv) await new Promise<void>((r) => srv.close(() => r()));
  }
}

/** Options of a {@link SideChannelClient}. */
export interface SideChannelClientOptions {
  /** Deadline of one request, including connecting (default 5000 ms). */
  timeoutMs?: number;
  /** Largest accepted response frame (default {@link LIMITS}.frameBytes). */
  maxFrameBytes?: number;
  /** The cluster secret: the client authenticates the server and seals its requests (default none). */
  clusterSecret?: Uint8Array | null;
  /** Most requests waiting for an answer; beyond, a request fails at once with `busy` (default 4096). */
  maxWaiters?: number;
  /** A waiter budget shared with other clients (e.g. all of one engine's): its `max` caps their waiters in total. */
  waiterBudget?: ByteBudget;
  /** A response frame must complete within this many ms of its first byte (default 15 000). */
  partialFrameTimeoutMs?: number;
}

interface Waiter {
  resolve: (body: unknown) => void;
  reject: (e: SideChannelError) => void;
  timer: NodeJS.Timeout;
}

/** A connection attempt: the socket, and (with a secret) the `AUTH` exchange in progress. */
interface Attempt {
  readonly socket: net.Socket;
  readonly promise: Promise<net.Socket>;
  readonly clientNonce: Uint8Array | null;
  session: SideSession | null;
  deadline: number;
  timer: NodeJS.Timeout | null;
  /** Ends the attempt: connected (null) or failed; a no-op once ended. */
  settle: (e: SideChannelError | null) => void;
}

/** The client half: one connection to `host:port`, reopened on demand after it closes. */
export class SideChannelClient {
  private socket: net.Socket | null = null;
  private session: SideSession | null = null;
  private attempt: Attempt | null = null;
  private seq = 1;
  private readonly waiters = new Map<number, Waiter>();
  private closed = false;
  private readonly secret: Uint8Array | null;

  constructor(
    readonly host: string,
    readonly port: number,
    private readonly o: SideChannelClientOptions = {},
  ) {
    this.secret = o.clusterSecret ?? null;
  }

  private get timeoutMs(): number {
    return this.o.timeoutMs ?? 5000;
  }

  /** Requests waiting for an answer. */
  get pending(): number {
    return this.waiters.size;
  }

  /**
   * The open (and, with a secret, authenticated) socket. `timeoutMs`: how long this caller waits
   * for connecting and `AUTH`; a caller with a later deadline extends a shared attempt's.
   */
  private connect(timeoutMs: number): Promise<net.Socket> {
    if (this.socket && !this.socket.destroyed) return Promise.resolve(this.socket);
    if (this.attempt) {
      this.extend(this.attempt, Date.now() + timeoutMs);
      return this.attempt.promise;
    }
    const s = net.createConnection({ host: this.host, port: this.port, noDelay: true });
    let resolve!: (s: net.Socket) => void;
    let reject!: (e: SideChannelError) => void;
    const promise = new Promise<net.Socket>((res, rej) => {
      resolve = res;
      reject = rej;
    });
    let done = false;
    const a: Attempt = {
      socket: s,
      promise,
      clientNonce: this.secret ? makeNonce() : null,
      session: null,
      deadline: 0,
      timer: null,
      settle: (e) => {
        if (done) return;
        done = true;
        if (this.attempt === a) this.attempt = null;
        if (a.timer) clearTimeout(a.timer);
        if (e) {
          s.destroy();
          reject(e);
        } else {
          this.socket = s;
          this.session = a.session;
          resolve(s);
        }
      },
    };
    this.attempt = a;
    this.extend(a, Date.now() + timeoutMs);
    s.once('connect', () => {
      s.unref();
      if (a.clientNonce) s.write(frame(encodeAuthRequest(a.clientNonce)));
      else a.settle(null);
    });
    s.on('error', (e) => a.settle(new SideChannelError('transport', `side channel ${this.host}:${this.port}: ${e.message}`, { cause: e })));
    const frames = new FrameAssembler(
      this.secret ? LIMITS.authFrameBytes : (this.o.maxFrameBytes ?? LIMITS.frameBytes),
      (f) => this.onFrame(s, a, frames, f),
      (msg) => this.fail(s, a, new SideChannelError('protocol', `side channel ${this.host}:${this.port}: ${msg}`)),
      { partialTimeoutMs: this.o.partialFrameTimeoutMs ?? 15_000 },
    );
    s.on('data', (c: Buffer) => frames.push(c));
    s.on('close', () => {
      frames.kill();
      this.fail(s, a, new SideChannelError('transport', `side channel ${this.host}:${this.port} closed`));
    });
    return promise;
  }

  /** Moves an attempt's deadline to `at` when that is later. */
  private extend(a: Attempt, at: number): void {
    if (at <= a.deadline) return;
    a.deadline = at;
    if (a.timer) clearTimeout(a.timer);
    a.timer = setTimeout(() => this.fail(a.socket, a, new SideChannelError('timeout', `connect to ${this.host}:${this.port} timed out`)), Math.max(0, at - Date.now()));
  }

  /** Fails the attempt (when `s` is still connecting) or the open connection's waiters. */
  private fail(s: net.Socket, a: Attempt, e: SideChannelError): void {
    a.settle(e);
    this.drop(s, e);
  }

  private onFrame(s: net.Socket, a: Attempt, frames: FrameAssembler, f: Buffer): void {
    const bad = (msg: string) => this.fail(s, a, new SideChannelError('protocol', `side channel ${this.host}:${this.port}: ${msg}`));
    let r: SideResponse;
    try {
      let body: Uint8Array = f;
      if (this.secret && a.session) {
        const o = openFrame(f, PROOF_BYTES);
        if (!checkProof(o.mac, this.secret, SIDE_AUTH_CONTEXT.response, a.session.clientNonce, a.session.serverNonce, o.body)) return bad('response failed its proof of the cluster secret');
        body = o.body;
      }
      r = decodeResponse(body);
    } catch (e) {
      return bad(e instanceof NixlDecodeError ? e.reason : String(e));
    }
    if (r.seq === 0) {
      // About the connection: a refusal closes it; with a secret, the first ok is the AUTH answer.
      if (!r.ok) return this.fail(s, a, new SideChannelError(r.code, `side channel ${this.host}:${this.port}: ${r.message}`));
      if (!this.secret || a.session || !a.clientNonce) return bad('unexpected connection-level answer');
      let auth;
      try {
        auth = decodeAuthBody(r.body, NONCE_BYTES, PROOF_BYTES);
      } catch (e) {
        return bad(e instanceof NixlDecodeError ? e.reason : String(e));
      }
      if (!checkProof(auth.proof, this.secret, SIDE_AUTH_CONTEXT.auth, a.clientNonce, auth.serverNonce)) {
        return this.fail(s, a, new SideChannelError('unauthenticated', `side channel ${this.host}:${this.port} failed its proof of the cluster secret`));
      }
      a.session = { clientNonce: a.clientNonce, serverNonce: auth.serverNonce };
      frames.setMaxBytes(this.o.maxFrameBytes ?? LIMITS.frameBytes);
      a.settle(null);
      return;
    }
    if (this.secret && !a.session) return bad('answer before authentication');
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
    if (this.socket !== s) return;
    this.socket = null;
    this.session = null;
    for (const [k, w] of this.waiters) {
      clearTimeout(w.timer);
      w.reject(e);
      this.waiters.delete(k);
    }
  }

  /**
   * Sends `req` and resolves with the decoded ok body (`decode` is the body's strict decoder).
   * `timeoutMs`: how long to wait for the answer (default: the client's). A peer answers between
   * its engine steps, so requests that belong to a transfer (lease pin, push registration, the
   * first handshake) pass the transfer's deadline, not the handshake's.
   *
   * The deadline is checked after pending input was read: when this process was itself busy past
   * the deadline, the timer fires before the socket is polled, so the rejection waits one turn
   * (`setImmediate`, after the poll phase) and an answer that already arrived wins.
   * @throws SideChannelError: the peer's refusal code, or `transport` / `timeout` / `protocol`;
   *   `busy` at once when {@link SideChannelClientOptions.maxWaiters} requests are waiting.
   */
  async request<T>(req: SideRequest, decode: (body: unknown) => T, timeoutMs: number = this.timeoutMs): Promise<T> {
    if (this.closed) throw new SideChannelError('transport', 'client closed');
    if (this.waiters.size >= (this.o.maxWaiters ?? 4096)) throw new SideChannelError('busy', `side channel ${this.host}:${this.port}: ${this.waiters.size} requests already waiting`);
    const budget = this.o.waiterBudget;
    if (budget && budget.used >= budget.max) throw new SideChannelError('busy', `${budget.used} side-channel requests already waiting in total`);
    if (budget) budget.used++;
    try {
      return await this.send(req, decode, timeoutMs);
    } finally {
      if (budget) budget.used--;
    }
  }

  private async send<T>(req: SideRequest, decode: (body: unknown) => T, timeoutMs: number): Promise<T> {
    const s = await this.connect(timeoutMs);
    const session = this.session;
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
      s.write(frame(seal(this.secret, session, SIDE_AUTH_CONTEXT.request, encodeRequest(seq, req))));
      if (this.seq === 1) this.retire(s, timeoutMs);
    });
    try {
      return decode(body);
    } catch (e) {
      throw new SideChannelError('protocol', `side channel ${this.host}:${this.port}: ${e instanceof NixlDecodeError ? e.reason : String(e)}`, { cause: e });
    }
  }

  /**
   * Seqs grow strictly per connection (a server with a secret refuses a replay), so after a wrap
   * the next request opens a new connection; the old one closes once its answers had time to come.
   */
  private retire(s: net.Socket, timeoutMs: number): void {
    if (this.socket !== s) return;
    this.socket = null;
    this.session = null;
    setTimeout(() => s.destroy(), timeoutMs + 1000).unref();
  }

  /** Closes the connection; pending requests fail with `transport`. */
  close(): void {
    this.closed = true;
    if (this.attempt) this.fail(this.attempt.socket, this.attempt, new SideChannelError('transport', 'client closed'));
    if (this.socket) this.drop(this.socket, new SideChannelError('transport', 'client closed'));
  }
}

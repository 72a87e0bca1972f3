/**
 * The embedded transfer agent: a {@link TransferAgent} in plain Node, over TCP (node:net), for
 * one machine or across hosts. No native code; memory is whatever the engine registers
 * (ArrayBuffer, SharedArrayBuffer, Buffer / typed-array views).
 *
 * - Each agent listens on one TCP port. An initiator opens one connection per remote agent and
 *   proves it holds the remote's metadata with the remote's 32-byte secret (HELLO); no data
 *   frame is sent before the target accepted it.
 * - Every remote access is checked at the target against its live registered regions: a peer
 *   can never read or write outside registered memory. A malformed frame closes that connection
 *   with a {@link ProtocolError} (emitted as `protocol-error`); the process goes on.
 * - Transfers are cut into frames of at most `chunkBytes` payload (coalescing small
 *   descriptors); at most `maxInflightBytes` of frames are outstanding per connection, and
 *   socket backpressure (`drain`) is respected on both sides.
 * - A transfer's notif is sent after the last frame was acknowledged (WRITE: after the target
 *   copied the bytes into its memory; READ: after the initiator received every byte).
 * - A connection that closes fails its transfers with `remote-disconnect`; every transfer has
 *   a deadline (`timeout`).
 * - WRITE sends straight from the registered memory and READ answers straight from it (no
 *   staging copy): like RDMA, do not modify a region while a transfer that reads it is in flight.
 *
 * Same-host transfers also go over (loopback) TCP: this agent has no shared-memory path;
 * bench/transfer-README.md has the measurement and the reason. The same-host fast path today is
 * NixlAgent with UCX shared-memory transports (docs/backends.md N6).
 * @module
 */
import { EventEmitter } from 'node:events';
import { randomBytes, timingSafeEqual } from 'node:crypto';
import * as net from 'node:net';
import { Packr, Unpackr } from 'msgpackr';
import { ProtocolError, TransferError } from './errors.js';
import { inFlatRegions, RegionTable, toU8, type HostRegion } from './memory.js';
import type {
  AgentCapabilities,
  DescList,
  MakeTransferArgs,
  MemoryKind,
  MemoryRegion,
  PostOptions,
  RegisteredRegion,
  Registration,
  TransferAgent,
  TransferErrorKind,
  TransferRequest,
  XferDesc,
  XferOp,
  XferStatus,
} from './types.js';
import {
  encodeFrame,
  F,
  FrameReader,
  MAX_NAME_LENGTH,
  MAX_NOTIF_BYTES,
  MAX_PAYLOAD_BYTES,
  MAX_SEGMENTS,
  SECRET_BYTES,
  WIRE_VERSION,
  type Header,
  type PayloadSink,
} from './wire.js';

/** Options of {@link EmbeddedAgent.create}. */
export interface EmbeddedAgentOptions {
  /** Agent name (1..256 characters), unique among peers. */
  readonly name: string;
  /** Address to listen on (default `127.0.0.1`; use `0.0.0.0` or an interface address across hosts). */
  readonly host?: string;
  /** Port to listen on (default 0: any free port). */
  readonly port?: number;
  /** Host that peers should connect to, written into the metadata (default: `host`, or `127.0.0.1` for a wildcard `host`). */
  readonly advertiseHost?: string;
  /** Most bytes of outstanding frames per outgoing connection (default 64 MiB). */
  readonly maxInflightBytes?: number;
  /** Most payload bytes per frame (default 4 MiB, at most 16 MiB). */
  readonly chunkBytes?: number;
  /** Default transfer deadline in milliseconds (default 30 000). */
  readonly transferTimeoutMs?: number;
  /** Connect plus handshake deadline in milliseconds (default 5 000). */
  readonly connectTimeoutMs?: number;
  /**
   * Most response bytes queued on one incoming connection before it stops reading that peer's
   * requests until the socket drains (default 256 MiB). Queued responses are views of registered
   * memory, not copies; an initiator that respects its own window (`maxInflightBytes`, 64 MiB by
   * default) never reaches this limit, so it only throttles peers that ignore theirs.
   */
  readonly maxQueuedResponseBytes?: number;
  /** Most bytes of received, not yet polled notifs (default 64 MiB); a peer exceeding it is disconnected. */
  readonly maxQueuedNotifBytes?: number;
  /**
   * Testing only: accept incoming READ/WRITE frames but never answer them (a hung peer), so that
   * disconnect and timeout handling can be tested deterministically.
   */
  readonly stallIncoming?: boolean;
}

const META_MAGIC = 'kvconnect-embedded';
const META_VERSION = 1;
const MAX_META_BYTES = 64 * 1024 * 1024;
const packr = new Packr({ useRecords: false, variableMapSize: true });
const unpackr = new Unpackr({ useRecords: false, int64AsType: 'number' });

/** A peer as its metadata describes it. */
export interface PeerInfo {
  readonly name: string;
  readonly host: string;
  readonly port: number;
  readonly secret: Uint8Array;
  readonly regions: readonly number[]; // flat sorted [addr, len]
}

interface Pair {
  readonly local: XferDesc;
  readonly remote: XferDesc;
}

/** One frame of a transfer, queued or outstanding on a connection. */
interface OutFrame {
  id: number;
  readonly req: EmbeddedRequest;
  readonly gen: number;
  readonly t: typeof F.READ | typeof F.WRITE;
  readonly segs: number[]; // flat remote [addr, len]
  readonly locals: Uint8Array[]; // matching local views
  readonly bytes: number;
}

class EmbeddedRequest implements TransferRequest {
  error: Error | null = null;
  state: XferStatus | 'idle' = 'idle';
  released = false;
  gen = 0;
  pending = 0;
  timer: NodeJS.Timeout | null = null;
  waiters: Array<(s: XferStatus) => void> = [];
  constructor(
    readonly owner: EmbeddedAgent,
    readonly op: XferOp,
    readonly remoteAgent: string,
    readonly pairs: readonly Pair[],
    readonly bytes: number,
    public notif: Uint8Array | null,
  ) {}
  get count(): number {
    return this.pairs.length;
  }
}

function checkPositiveInt(name: string, v: number | undefined, dflt: number, max = Number.MAX_SAFE_INTEGER): number {
  if (v === undefined) return dflt;
  if (!Number.isSafeInteger(v) || v <= 0 || v > max) throw new TransferError('invalid', `${name} must be an integer in 1..${max}`);
  return v;
}

/** Outgoing connection to one remote agent. */
class OutConn {
  readonly socket: net.Socket;
  private readonly reader: FrameReader;
  private ready = false;
  private closed = false;
  private blocked = false;
  private queue: OutFrame[] = [];
  private qHead = 0;
  private readonly inflight = new Map<number, OutFrame>();
  private inflightBytes = 0;
  private nextId = 1;
  private failKind: TransferErrorKind = 'remote-disconnect';
  private failMessage = 'connection closed';
  private readonly connectTimer: NodeJS.Timeout;
  /** Notifs sent before the handshake finished. */
  private early: Array<{ msg: Uint8Array; resolve: () => void; reject: (e: Error) => void }> = [];

  constructor(
    private readonly agent: EmbeddedAgent,
    readonly peer: PeerInfo,
    private readonly maxInflight: number,
    connectTimeoutMs: number,
  ) {
    this.socket = net.connect({ host: peer.host, port: peer.port, noDelay: true });
    this.reader = new FrameReader({
      onHeader: (h, n) => this.onHeader(h, n),
      onProtocolError: (m) => this.fatal('invalid', `peer ${peer.name} broke the protocol: ${m}`),
    });
    this.connectTimer = setTimeout(() => this.fatal('timeout', `connect/handshake with ${peer.name} at ${peer.host}:${peer.port} timed out after ${connectTimeoutMs} ms`), connectTimeoutMs);
    this.connectTimer.unref();
    this.socket.on('connect', () => {
      this.socket.write(encodeFrame([F.HELLO, WIRE_VERSION, agent.name, peer.secret]));
    });
    this.socket.on('data', (c: Buffer) => this.reader.push(c));
    this.socket.on('drain', () => {
      this.blocked = false;
      this.pump();
    });
    this.socket.on('error', (e) => {
      if (!this.ready && this.failKind === 'remote-disconnect') this.failMessage = `cannot reach ${peer.name} at ${peer.host}:${peer.port}: ${e.message}`;
      else if (this.failKind === 'remote-disconnect') this.failMessage = `connection to ${peer.name} failed: ${e.message}`;
    });
    this.socket.on('close', () => this.onClose());
  }

  get isClosed(): boolean {
    return this.closed;
  }

  /** Queues frames and sends what the window allows. */
  enqueue(frames: OutFrame[]): void {
    if (this.closed) {
      for (const f of frames) this.agent.frameFailed(f, this.failKind, this.failMessage);
      return;
    }
    for (const f of frames) this.queue.push(f);
    this.pump();
  }

  /** Sends a notif once the handshake is done; resolves when it was handed to the socket. */
  sendNotif(msg: Uint8Array): Promise<void> {
    if (this.closed) return Promise.reject(new TransferError(this.failKind, this.failMessage));
    if (!this.ready) return new Promise((resolve, reject) => this.early.push({ msg, resolve, reject }));
    this.writeNotif(msg);
    return Promise.resolve();
  }

  private writeNotif(msg: Uint8Array): void {
    this.socket.write(encodeFrame([F.NOTIF], msg.byteLength));
    if (msg.byteLength > 0) this.socket.write(msg);
  }

  private pump(): void {
    if (!this.ready || this.closed) return;
    const s = this.socket;
    let corked = false;
    while (this.qHead < this.queue.length && !this.blocked) {
      const f = this.queue[this.qHead]!;
      if (f.req.gen !== f.gen || f.req.state !== 'in-progress') {
        this.qHead++; // canceled or timed out before it was sent
        continue;
      }
      if (this.inflightBytes > 0 && this.inflightBytes + f.bytes > this.maxInflight) break;
      this.qHead++;
      f.id = this.nextId;
      this.nextId = this.nextId === 0xffffffff ? 1 : this.nextId + 1;
      this.inflight.set(f.id, f);
      this.inflightBytes += f.bytes;
      if (!corked) {
        s.cork();
        corked = true;
      }
      let ok: boolean;
      if (f.t === F.READ) {
        ok = s.write(encodeFrame([F.READ, f.id, f.segs]));
      } else {
        ok = s.write(encodeFrame([F.WRITE, f.id, f.segs], f.bytes));
        for (const v of f.locals) ok = s.write(v);
      }
      if (!ok) this.blocked = true;
    }
    if (corked) s.uncork();
    if (this.qHead > 1024 && this.qHead * 2 > this.queue.length) {
      this.queue = this.queue.slice(this.qHead);
      this.qHead = 0;
    }
  }

  private onHeader(h: Header, payloadBytes: number): PayloadSink | null {
    if (!this.ready) {
      if (h.t === F.OK) {
        if (h.name !== this.peer.name) {
          this.fatal('invalid', `peer at ${this.peer.host}:${this.peer.port} is ${JSON.stringify(h.name)}, not ${JSON.stringify(this.peer.name)}`);
          return null;
        }
        this.ready = true;
        clearTimeout(this.connectTimer);
        for (const e of this.early.splice(0)) {
          this.writeNotif(e.msg);
          e.resolve();
        }
        this.pump();
        return null;
      }
      if (h.t === F.FATAL) {
        this.fatal(h.kind === 'invalid' ? 'invalid' : 'remote-disconnect', `${this.peer.name} refused the connection: ${h.message}`);
        return null;
      }
      this.fatal('invalid', `peer ${this.peer.name} sent frame type ${h.t} before OK`);
      return null;
    }
    switch (h.t) {
      case F.RDATA: {
        const f = this.inflight.get(h.id);
        if (!f || f.t !== F.READ || payloadBytes !== f.bytes) {
          this.fatal('invalid', `peer ${this.peer.name} sent RDATA for unknown frame ${h.id} or of the wrong size`);
          return null;
        }
        const live = f.req.gen === f.gen && f.req.state === 'in-progress';
        let seg = 0;
        let off = 0;
        return {
          write: (chunk: Buffer) => {
            if (!live) return;
            let c = 0;
            while (c < chunk.length) {
              const dst = f.locals[seg]!;
              const k = Math.min(dst.length - off, chunk.length - c);
              dst.set(k === chunk.length && c === 0 ? chunk : chunk.subarray(c, c + k), off);
              c += k;
              off += k;
              if (off === dst.length) {
                seg++;
                off = 0;
              }
            }
          },
          end: () => this.frameDone(h.id),
        };
      }
      case F.WACK: {
        const f = this.inflight.get(h.id);
        if (!f || f.t !== F.WRITE) {
          this.fatal('invalid', `peer ${this.peer.name} acknowledged unknown WRITE frame ${h.id}`);
          return null;
        }
        this.frameDone(h.id);
        return null;
      }
      case F.ERR: {
        const f = this.inflight.get(h.id);
        if (!f) {
          this.fatal('invalid', `peer ${this.peer.name} refused unknown frame ${h.id}`);
          return null;
        }
        this.inflight.delete(h.id);
        this.inflightBytes -= f.bytes;
        const kind: TransferErrorKind = h.kind === 'invalid' || h.kind === 'backend' || h.kind === 'not-found' ? h.kind : 'backend';
        this.agent.frameFailed(f, kind, `${this.peer.name} refused the transfer: ${h.message}`);
        this.pump();
        return null;
      }
      case F.FATAL:
        this.fatal(h.kind === 'invalid' ? 'invalid' : 'remote-disconnect', `${this.peer.name} closed the connection: ${h.message}`);
        return null;
      default:
        this.fatal('invalid', `peer ${this.peer.name} sent unexpected frame type ${h.t}`);
        return null;
    }
  }

  private frameDone(id: number): void {
    const f = this.inflight.get(id);
    if (!f) return;
    this.inflight.delete(id);
    this.inflightBytes -= f.bytes;
    this.agent.frameDone(f, this);
    this.pump();
  }

  /** Fails everything and closes. */
  fatal(kind: TransferErrorKind, message: string): void {
    if (this.closed) return;
    this.failKind = kind;
    this.failMessage = message;
    this.socket.destroy();
    this.onClose();
  }

  private onClose(): void {
    if (this.closed) return;
    this.closed = true;
    clearTimeout(this.connectTimer);
    this.reader.kill();
    this.agent.connClosed(this);
    const frames = [...this.inflight.values(), ...this.queue.slice(this.qHead)];
    this.inflight.clear();
    this.queue = [];
    this.qHead = 0;
    this.inflightBytes = 0;
    for (const f of frames) this.agent.frameFailed(f, this.failKind, this.failMessage);
    for (const e of this.early.splice(0)) e.reject(new TransferError(this.failKind, this.failMessage));
  }
}

/** Incoming connection from one initiator. */
class InConn {
  private readonly reader: FrameReader;
  private peerName: string | null = null;
  private closed = false;
  private readonly helloTimer: NodeJS.Timeout;
  readonly label: string;

  constructor(
    private readonly agent: EmbeddedAgent,
    readonly socket: net.Socket,
  ) {
    this.label = `${socket.remoteAddress}:${socket.remotePort}`;
    socket.setNoDelay(true);
    this.reader = new FrameReader({
      onHeader: (h, n) => this.onHeader(h, n),
      onProtocolError: (m) => this.protocolError(m),
    });
    this.helloTimer = setTimeout(() => this.protocolError('no HELLO in time'), agent.connectTimeoutMs);
    this.helloTimer.unref();
    socket.on('data', (c: Buffer) => this.reader.push(c));
    socket.on('error', () => {});
    socket.on('close', () => {
      this.closed = true;
      clearTimeout(this.helloTimer);
      this.reader.kill();
      agent.inClosed(this);
    });
  }

  private protocolError(message: string): void {
    if (this.closed) return;
    this.closed = true;
    const err = new ProtocolError(this.peerName ? `${this.peerName} (${this.label})` : this.label, message);
    try {
      this.socket.end(encodeFrame([F.FATAL, 'invalid', message.slice(0, 4000)]));
    } catch {
      /* socket already gone */
    }
    setTimeout(() => this.socket.destroy(), 100).unref();
    this.reader.kill();
    this.agent.reportProtocolError(err);
  }

  private refuse(id: number, message: string): void {
    this.socket.write(encodeFrame([F.ERR, id, 'invalid', message.slice(0, 4000)]));
  }

  /** Stops reading requests while too many response bytes are queued. */
  private backpressure(): void {
    if (this.socket.writableLength < this.agent.maxQueuedResponseBytes) return;
    this.reader.pause();
    this.socket.pause();
    this.socket.once('drain', () => {
      if (this.closed) return;
      this.socket.resume();
      this.reader.resume();
    });
  }

  /** Resolves every segment to a live region view, or returns the first bad one. */
  private resolve(segs: readonly number[]): { views: Uint8Array[]; regions: HostRegion[] } | string {
    const views: Uint8Array[] = [];
    const regions: HostRegion[] = [];
    for (let i = 0; i < segs.length; i += 2) {
      const addr = segs[i]!;
      const len = segs[i + 1]!;
      const r = this.agent.regions.find(addr, len);
      if (!r) return `segment ${i / 2} [0x${addr.toString(16)}, +${len}) is outside ${this.agent.name}'s registered memory`;
      views.push(r.view.subarray(addr - r.addr, addr - r.addr + len));
      regions.push(r);
    }
    return { views, regions };
  }

  private onHeader(h: Header, payloadBytes: number): PayloadSink | null {
    if (this.peerName === null) {
      if (h.t !== F.HELLO) {
        this.protocolError(`expected HELLO, got frame type ${h.t}`);
        return null;
      }
      const mine = this.agent.secretBytes;
      if (h.secret.length !== mine.length || !timingSafeEqual(h.secret, mine)) {
        this.protocolError(`agent ${JSON.stringify(h.name)} presented a wrong secret`);
        return null;
      }
      clearTimeout(this.helloTimer);
      this.peerName = h.name;
      this.socket.write(encodeFrame([F.OK, this.agent.name]));
      return null;
    }
    switch (h.t) {
      case F.READ: {
        if (this.agent.stall) return null;
        const r = this.resolve(h.segs);
        if (typeof r === 'string') {
          this.refuse(h.id, r);
          return null;
        }
        this.socket.cork();
        this.socket.write(encodeFrame([F.RDATA, h.id], h.bytes));
        for (const v of r.views) this.socket.write(v);
        this.socket.uncork();
        this.backpressure();
        return null;
      }
      case F.WRITE: {
        if (this.agent.stall) return null;
        const r = this.resolve(h.segs);
        if (typeof r === 'string') {
          this.refuse(h.id, r);
          return null; // the payload is dropped unread
        }
        let seg = 0;
        let off = 0;
        let lost = false;
        return {
          write: (chunk: Buffer) => {
            let c = 0;
            while (c < chunk.length) {
              const dst = r.views[seg]!;
              const k = Math.min(dst.length - off, chunk.length - c);
              if (r.regions[seg]!.alive) dst.set(k === chunk.length && c === 0 ? chunk : chunk.subarray(c, c + k), off);
              else lost = true; // deregistered meanwhile: never write into it
              c += k;
              off += k;
              if (off === dst.length) {
                seg++;
                off = 0;
              }
            }
          },
          end: () => {
            if (this.closed) return;
            if (lost) this.refuse(h.id, 'target memory was deregistered during the write');
            else this.socket.write(encodeFrame([F.WACK, h.id]));
          },
        };
      }
      case F.NOTIF: {
        const from = this.peerName;
        const buf = Buffer.allocUnsafe(payloadBytes);
        let off = 0;
        return {
          write: (chunk: Buffer) => {
            chunk.copy(buf, off);
            off += chunk.length;
          },
          end: () => {
            if (!this.agent.queueNotif(from, new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength))) {
              this.protocolError(`more than ${this.agent.maxQueuedNotifBytes} bytes of notifs queued`);
            }
          },
        };
      }
      default:
        this.protocolError(`unexpected frame type ${h.t}`);
        return null;
    }
  }
}

/** A {@link TransferAgent} over TCP in plain Node. Create with {@link EmbeddedAgent.create}. */
export class EmbeddedAgent extends EventEmitter<{ 'protocol-error': [ProtocolError] }> implements TransferAgent {
  readonly backend = 'embedded';
  readonly capabilities: AgentCapabilities = Object.freeze({ memoryKinds: Object.freeze(['DRAM'] as MemoryKind[]), read: true, write: true, notify: true });
  /** Live registered regions (internal; exposed for the wire handlers). */
  readonly regions = new RegionTable();
  /** Protocol errors seen since creation (also emitted as `protocol-error`). */
  protocolErrors = 0;

  private readonly secret = randomBytes(SECRET_BYTES);
  private readonly peers = new Map<string, PeerInfo>();
  private readonly conns = new Map<string, OutConn>();
  private readonly inConns = new Set<InConn>();
  private readonly registrations = new WeakMap<Registration, HostRegion[]>();
  private readonly lists = new WeakSet<DescList>();
  private readonly active = new Set<EmbeddedRequest>();
  private notifs = new Map<string, Uint8Array[]>();
  private notifBytes = 0;
  private closed = false;
  private readonly maxInflight: number;
  private readonly chunk: number;
  private readonly timeoutMs: number;
  /** Connect and handshake deadline, ms. */
  readonly connectTimeoutMs: number;
  /** See {@link EmbeddedAgentOptions.maxQueuedResponseBytes}. */
  readonly maxQueuedResponseBytes: number;
  /** See {@link EmbeddedAgentOptions.maxQueuedNotifBytes}. */
  readonly maxQueuedNotifBytes: number;
  /** See {@link EmbeddedAgentOptions.stallIncoming}. */
  readonly stall: boolean;

  private constructor(
    readonly name: string,
    private readonly server: net.Server,
    /** Host and port peers connect to. */
    readonly address: { readonly host: string; readonly port: number },
    o: EmbeddedAgentOptions,
  ) {
    super();
    this.maxInflight = checkPositiveInt('maxInflightBytes', o.maxInflightBytes, 64 * 1024 * 1024);
    this.chunk = checkPositiveInt('chunkBytes', o.chunkBytes, 4 * 1024 * 1024, MAX_PAYLOAD_BYTES);
    this.timeoutMs = checkPositiveInt('transferTimeoutMs', o.transferTimeoutMs, 30_000);
    this.connectTimeoutMs = checkPositiveInt('connectTimeoutMs', o.connectTimeoutMs, 5_000);
    this.maxQueuedResponseBytes = checkPositiveInt('maxQueuedResponseBytes', o.maxQueuedResponseBytes, 256 * 1024 * 1024);
    this.maxQueuedNotifBytes = checkPositiveInt('maxQueuedNotifBytes', o.maxQueuedNotifBytes, 64 * 1024 * 1024);
    this.stall = o.stallIncoming === true;
    server.on('connection', (s) => {
      if (this.closed) {
        s.destroy();
        return;
      }
      this.inConns.add(new InConn(this, s));
    });
    // Loopback transfers (to this agent itself) go through its own server.
    this.peers.set(name, { name, host: address.host, port: address.port, secret: this.secret, regions: [] });
  }

  /**
   * Creates an agent listening on `host:port`.
   * @throws TransferError `invalid` for a bad name or option; the listen error as cause when the port is taken.
   */
  static async create(options: EmbeddedAgentOptions): Promise<EmbeddedAgent> {
    const { name } = options;
    if (typeof name !== 'string' || name.length === 0 || name.length > MAX_NAME_LENGTH) throw new TransferError('invalid', `agent name must be 1..${MAX_NAME_LENGTH} characters`);
    const host = options.host ?? '127.0.0.1';
    const server = net.createServer({ noDelay: true });
    await new Promise<void>((resolve, reject) => {
      server.once('error', (e) => reject(new TransferError('backend', `cannot listen on ${host}:${options.port ?? 0}: ${e.message}`, { cause: e })));
      server.listen({ host, port: options.port ?? 0 }, () => resolve());
    });
    const port = (server.address() as net.AddressInfo).port;
    const wildcard = host === '0.0.0.0' || host === '::';
    const advertise = options.advertiseHost ?? (wildcard ? '127.0.0.1' : host);
    try {
      return new EmbeddedAgent(name, server, { host: advertise, port }, options);
    } catch (e) {
      server.close();
      throw e;
    }
  }

  /** The agent's secret (internal: the wire handlers compare HELLO secrets with it). */
  get secretBytes(): Uint8Array {
    return this.secret;
  }

  private checkOpen(): void {
    if (this.closed) throw new TransferError('canceled', `agent ${this.name} is closed`);
  }

  async registerMemory(regions: readonly MemoryRegion[]): Promise<Registration> {
    this.checkOpen();
    if (!Array.isArray(regions) || regions.length === 0) throw new TransferError('invalid', 'registerMemory needs at least one region');
    const views: Uint8Array[] = [];
    for (const [i, r] of regions.entries()) {
      if (!r || typeof r !== 'object' || !('bytes' in r)) throw new TransferError('invalid', `regions[${i}]: the embedded agent registers host memory given as bytes only (DRAM)`);
      if (r.kind !== undefined && r.kind !== 'DRAM') throw new TransferError('invalid', `regions[${i}]: kind ${String(r.kind)} is not supported`);
      const v = toU8(r.bytes);
      if (!v) throw new TransferError('invalid', `regions[${i}].bytes must be an ArrayBuffer, SharedArrayBuffer or ArrayBufferView`);
      if (v.byteLength === 0) throw new TransferError('invalid', `regions[${i}] is empty`);
      views.push(v);
    }
    const hosts = views.map((v) => this.regions.add(v));
    const reg: Registration = Object.freeze({
      regions: Object.freeze(hosts.map((h): RegisteredRegion => Object.freeze({ addr: h.addr, length: h.length, kind: 'DRAM', deviceId: 0 }))),
    });
    this.registrations.set(reg, hosts);
    return reg;
  }

  async deregisterMemory(registration: Registration): Promise<void> {
    const hosts = this.registrations.get(registration);
    if (!hosts) throw new TransferError('not-found', 'not a live registration of this agent');
    this.registrations.delete(registration);
    for (const h of hosts) this.regions.remove(h.addr);
  }

  async getLocalMetadata(): Promise<Uint8Array> {
    this.checkOpen();
    const b = packr.pack([META_MAGIC, META_VERSION, this.name, this.address.host, this.address.port, this.secret, this.regions.flat()]);
    return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
  }

  async loadRemoteMetadata(metadata: Uint8Array): Promise<string> {
    this.checkOpen();
    const peer = decodeMetadata(metadata);
    const old = this.peers.get(peer.name);
    if (peer.name === this.name && peer.port === this.address.port && old) return peer.name; // our own
    if (old && (old.host !== peer.host || old.port !== peer.port || !timingSafeEqual(old.secret, peer.secret))) {
      this.conns.get(peer.name)?.fatal('remote-disconnect', `metadata of ${peer.name} was replaced`);
    }
    this.peers.set(peer.name, peer);
    return peer.name;
  }

  async invalidateRemoteMetadata(agent: string): Promise<void> {
    if (agent === this.name) return;
    this.peers.delete(agent);
    this.conns.get(agent)?.fatal('not-found', `metadata of ${agent} was invalidated`);
  }

  async prepDescList(agent: string | null, kind: MemoryKind, descs: readonly XferDesc[]): Promise<DescList> {
    this.checkOpen();
    if (kind !== 'DRAM') throw new TransferError('invalid', `memory kind ${String(kind)} is not supported by the embedded agent`);
    if (!Array.isArray(descs)) throw new TransferError('invalid', 'descs must be an array');
    let check: (addr: number, len: number) => boolean;
    if (agent === null || agent === this.name) {
      check = (a, l) => this.regions.find(a, l) !== null;
    } else {
      const peer = this.peers.get(agent);
      if (!peer) throw new TransferError('not-found', `no metadata loaded for agent ${JSON.stringify(agent)}`);
      check = (a, l) => inFlatRegions(peer.regions, a, l);
    }
    const copy: XferDesc[] = [];
    for (const [i, d] of descs.entries()) {
      if (!d || !check(d.addr, d.length)) {
        throw new TransferError('invalid', `descs[${i}] (addr ${d?.addr}, length ${d?.length}) is not inside a registered region of ${agent ?? this.name}`);
      }
      copy.push(Object.freeze({ addr: d.addr, length: d.length, deviceId: 0 }));
    }
    const list: DescList = Object.freeze({ agent, kind, descs: Object.freeze(copy) });
    this.lists.add(list);
    return list;
  }

  async releaseDescList(list: DescList): Promise<void> {
    this.lists.delete(list);
  }

  async makeTransfer(args: MakeTransferArgs): Promise<TransferRequest> {
    this.checkOpen();
    const { op, local, remote } = args;
    if (op !== 'READ' && op !== 'WRITE') throw new TransferError('invalid', `op must be READ or WRITE, got ${String(op)}`);
    if (!this.lists.has(local) || !this.lists.has(remote)) throw new TransferError('invalid', 'descriptor lists must come from this agent\'s prepDescList (and not be released)');
    if (local.agent !== null) throw new TransferError('invalid', 'local must be a local descriptor list (agent null)');
    if (remote.agent === null) throw new TransferError('invalid', 'remote must be a remote descriptor list');
    const li = args.localIndices ?? local.descs.map((_, i) => i);
    const ri = args.remoteIndices ?? remote.descs.map((_, i) => i);
    if (li.length !== ri.length) throw new TransferError('invalid', `${li.length} local indices but ${ri.length} remote indices`);
    if (li.length === 0) throw new TransferError('invalid', 'a transfer needs at least one descriptor pair');
    const pairs: Pair[] = [];
    let bytes = 0;
    for (let i = 0; i < li.length; i++) {
      const l = local.descs[li[i]!];
      const r = remote.descs[ri[i]!];
      if (!l || !Number.isInteger(li[i])) throw new TransferError('invalid', `localIndices[${i}] = ${li[i]} is out of range`);
      if (!r || !Number.isInteger(ri[i])) throw new TransferError('invalid', `remoteIndices[${i}] = ${ri[i]} is out of range`);
      if (l.length !== r.length) throw new TransferError('invalid', `pair ${i}: local length ${l.length} != remote length ${r.length}`);
      pairs.push({ local: l, remote: r });
      bytes += l.length;
    }
    const notif = args.notif === undefined ? null : checkNotif(args.notif);
    return new EmbeddedRequest(this, op, remote.agent, pairs, bytes, notif);
  }

  private own(req: TransferRequest): EmbeddedRequest {
    if (!(req instanceof EmbeddedRequest) || req.owner !== this) throw new TransferError('invalid', 'not a request of this agent');
    return req;
  }

  async post(request: TransferRequest, options: PostOptions = {}): Promise<XferStatus> {
    this.checkOpen();
    const req = this.own(request);
    if (req.released) throw new TransferError('invalid', 'the request was released');
    if (req.state === 'in-progress') throw new TransferError('invalid', 'the request is already in progress (one post at a time)');
    if (options.notif !== undefined) req.notif = checkNotif(options.notif);
    const timeoutMs = checkPositiveInt('timeoutMs', options.timeoutMs, this.timeoutMs);
    req.gen++;
    req.error = null;
    req.state = 'in-progress';
    // Resolve local memory now: a region deregistered since makeTransfer fails the post.
    const peer = this.peers.get(req.remoteAgent);
    if (!peer) return this.finish(req, 'not-found', `no metadata loaded for agent ${JSON.stringify(req.remoteAgent)}`);
    const frames: OutFrame[] = [];
    let cur: OutFrame | null = null;
    const t = req.op === 'READ' ? F.READ : F.WRITE;
    for (const [i, p] of req.pairs.entries()) {
      const r = this.regions.find(p.local.addr, p.local.length);
      if (!r) return this.finish(req, 'invalid', `pair ${i}: local descriptor is no longer inside registered memory`);
      const view = r.view.subarray(p.local.addr - r.addr, p.local.addr - r.addr + p.local.length);
      let off = 0;
      while (off < p.local.length) {
        if (!cur || cur.bytes === this.chunk || cur.segs.length >= 2 * MAX_SEGMENTS) {
          cur = { id: 0, req, gen: req.gen, t, segs: [], locals: [], bytes: 0 };
          frames.push(cur);
        }
        const k = Math.min(p.local.length - off, this.chunk - cur.bytes);
        cur.segs.push(p.remote.addr + off, k);
        cur.locals.push(off === 0 && k === view.length ? view : view.subarray(off, off + k));
        (cur as { bytes: number }).bytes += k;
        off += k;
      }
    }
    req.pending = frames.length;
    this.active.add(req);
    req.timer = setTimeout(() => this.finish(req, 'timeout', `transfer did not finish within ${timeoutMs} ms`), timeoutMs);
    req.timer.unref();
    this.conn(peer).enqueue(frames);
    return req.state;
  }

  status(request: TransferRequest): XferStatus {
    const req = this.own(request);
    return req.state === 'idle' ? 'invalid' : req.state;
  }

  wait(request: TransferRequest): Promise<XferStatus> {
    const req = this.own(request);
    if (req.state !== 'in-progress') return Promise.resolve(req.state === 'idle' ? 'invalid' : req.state);
    return new Promise((resolve) => req.waiters.push(resolve));
  }

  async release(request: TransferRequest): Promise<void> {
    const req = this.own(request);
    if (req.state === 'in-progress') this.finish(req, 'canceled', 'released while in progress');
    req.released = true;
  }

  async sendNotif(agent: string, message: Uint8Array): Promise<void> {
    this.checkOpen();
    const msg = checkNotif(message);
    const peer = this.peers.get(agent);
    if (!peer) throw new TransferError('not-found', `no metadata loaded for agent ${JSON.stringify(agent)}`);
    return this.conn(peer).sendNotif(msg);
  }

  async pollNotifs(): Promise<Map<string, Uint8Array[]>> {
    const out = this.notifs;
    this.notifs = new Map();
    this.notifBytes = 0;
    return out;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const req of [...this.active]) this.finish(req, 'canceled', `agent ${this.name} closed`);
    for (const c of [...this.conns.values()]) c.fatal('canceled', `agent ${this.name} closed`);
    for (const c of this.inConns) c.socket.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  // ---- internal, called by the connections ----

  private conn(peer: PeerInfo): OutConn {
    let c = this.conns.get(peer.name);
    if (!c || c.isClosed) {
      c = new OutConn(this, peer, this.maxInflight, this.connectTimeoutMs);
      this.conns.set(peer.name, c);
    }
    return c;
  }

  /** @internal */
  connClosed(c: OutConn): void {
    if (this.conns.get(c.peer.name) === c) this.conns.delete(c.peer.name);
  }

  /** @internal */
  inClosed(c: InConn): void {
    this.inConns.delete(c);
  }

  /** @internal */
  frameDone(f: OutFrame, conn: OutConn): void {
    const req = f.req;
    if (req.gen !== f.gen || req.state !== 'in-progress') return;
    if (--req.pending > 0) return;
    // Every frame landed: now the notif (it travels behind the data on the same connection).
    if (req.notif) conn.sendNotif(req.notif).catch(() => {});
    this.finish(req, 'done', null);
  }

  /** @internal */
  frameFailed(f: OutFrame, kind: TransferErrorKind, message: string): void {
    if (f.req.gen !== f.gen || f.req.state !== 'in-progress') return;
    this.finish(f.req, kind, message);
  }

  private finish(req: EmbeddedRequest, state: XferStatus, message: string | null): XferStatus {
    if (req.state !== 'in-progress') return req.state === 'idle' ? 'invalid' : req.state;
    req.state = state;
    req.error = state === 'done' || state === 'in-progress' ? null : new TransferError(state, message ?? state);
    if (req.timer) clearTimeout(req.timer);
    req.timer = null;
    this.active.delete(req);
    const w = req.waiters;
    req.waiters = [];
    for (const fn of w) fn(state);
    return state;
  }

  /** @internal Queues a received notif; false when the queue limit is exceeded. */
  queueNotif(from: string, msg: Uint8Array): boolean {
    if (this.notifBytes + msg.byteLength > this.maxQueuedNotifBytes) return false;
    this.notifBytes += msg.byteLength;
    let l = this.notifs.get(from);
    if (!l) this.notifs.set(from, (l = []));
    l.push(msg);
    return true;
  }

  /** @internal */
  reportProtocolError(e: ProtocolError): void {
    this.protocolErrors++;
    this.emit('protocol-error', e);
  }
}

function checkNotif(n: Uint8Array): Uint8Array {
  if (!(n instanceof Uint8Array)) throw new TransferError('invalid', 'a notif must be a Uint8Array');
  if (n.byteLength > MAX_NOTIF_BYTES) throw new TransferError('invalid', `a notif is at most ${MAX_NOTIF_BYTES} bytes`);
  return n;
}

/**
 * Decodes an embedded agent's metadata blob strictly.
 * @throws TransferError `invalid` for anything malformed.
 */
export function decodeMetadata(md: Uint8Array): PeerInfo {
  if (!(md instanceof Uint8Array) || md.byteLength === 0 || md.byteLength > MAX_META_BYTES) throw new TransferError('invalid', 'metadata must be a non-empty Uint8Array of at most 64 MiB');
  let v: unknown;
  try {
    v = unpackr.unpack(md);
  } catch (e) {
    throw new TransferError('invalid', `undecodable metadata: ${e instanceof Error ? e.message : String(e)}`);
  }
  if (!Array.isArray(v) || v.length !== 7 || v[0] !== META_MAGIC) throw new TransferError('invalid', 'not an embedded agent\'s metadata');
  if (v[1] !== META_VERSION) throw new TransferError('invalid', `metadata version ${String(v[1])} is not ${META_VERSION}`);
  const [, , name, host, port, secret, regions] = v as unknown[];
  if (typeof name !== 'string' || name.length === 0 || name.length > MAX_NAME_LENGTH) throw new TransferError('invalid', 'metadata: bad agent name');
  if (typeof host !== 'string' || host.length === 0 || host.length > 255) throw new TransferError('invalid', 'metadata: bad host');
  if (typeof port !== 'number' || !Number.isInteger(port) || port < 1 || port > 65535) throw new TransferError('invalid', 'metadata: bad port');
  if (!(secret instanceof Uint8Array) || secret.length !== SECRET_BYTES) throw new TransferError('invalid', 'metadata: bad secret');
  if (!Array.isArray(regions) || regions.length % 2 !== 0) throw new TransferError('invalid', 'metadata: bad region list');
  let prevEnd = -1;
  for (let i = 0; i < regions.length; i += 2) {
    const a = regions[i];
    const l = regions[i + 1];
    if (typeof a !== 'number' || typeof l !== 'number' || !Number.isSafeInteger(a) || !Number.isSafeInteger(l) || a < 0 || l <= 0 || a <= prevEnd || !Number.isSafeInteger(a + l)) {
      throw new TransferError('invalid', `metadata: region ${i / 2} is malformed or out of order`);
    }
    prevEnd = a + l - 1;
  }
  return { name, host, port, secret: Uint8Array.prototype.slice.call(secret), regions: regions as number[] };
}

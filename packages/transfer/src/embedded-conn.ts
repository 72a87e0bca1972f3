/**
 * The embedded agent's TCP connections (see the module note of `embedded.ts`): {@link OutConn},
 * the initiator's connection to one remote agent (handshake, frame window, RDATA / WACK / ERR
 * handling), {@link OutLink}, the initiator's lanes to one remote agent (the first connection and
 * the extra lanes bound to its handshake, agent option `lanes`), and {@link InConn}, the target's side of one initiator's connection (handshake,
 * bounds checks of every segment against the live registered regions, READ answers, WRITE
 * landing, notif reception). Frames and the handshake are those of `wire.ts`.
 * @module
 */
import * as net from 'node:net';
import { timingSafeEqual } from 'node:crypto';
import { checkProof, makeNonce, makeProof } from './auth.js';
import { ProtocolError, TransferError } from './errors.js';
import type { StagingPool } from './device.js';
import type { HostRegion } from './memory.js';
import { isCurrent, RequestState } from './agent-base.js';
import type { TransferErrorKind, XferDesc, XferOp } from './types.js';
import {
  encodeFrame,
  F,
  FrameReader,
  HANDSHAKE_CONTEXT,
  MAX_HANDSHAKE_HEADER_BYTES,
  MAX_HEADER_BYTES,
  MAX_PAYLOAD_BYTES,
  WIRE_VERSION,
  type Header,
  type PayloadSink,
} from './wire.js';
import type { EmbeddedAgent } from './embedded.js';
import type { PeerInfo } from './embedded-metadata.js';

/** A device segment of a frame: `locals[i]` is its staging view, at byte `at` of the frame's payload. */
export interface DevSeg {
  readonly i: number;
  readonly at: number;
  readonly region: HostRegion;
  /** Offset in the region. */
  readonly off: number;
  readonly len: number;
}

export interface Pair {
  readonly local: XferDesc;
  readonly remote: XferDesc;
}

/** One frame of a transfer, queued or outstanding on a connection. */
export interface OutFrame {
  id: number;
  readonly req: EmbeddedRequest;
  readonly gen: number;
  readonly t: typeof F.READ | typeof F.WRITE;
  readonly segs: number[]; // flat remote [addr, len]
  readonly locals: Uint8Array[]; // matching local views
  readonly bytes: number;
  /** Device segments (their `locals` are staging views once {@link EmbeddedAgent.stageFrame} ran). */
  dev?: DevSeg[];
  /** Staging buffer of the device segments (at frame byte offsets), while the frame holds it. */
  stage?: { buf: Uint8Array; pool: StagingPool } | null;
  /** Handed to a socket and not yet answered, refused or failed with its connection (counted in `EmbeddedRequest.onWire`). */
  wire?: boolean;
}

/** A request of the embedded agent: its descriptor pairs, its notif and the frames of the current post not yet landed. */
export class EmbeddedRequest extends RequestState {
  /** Frames of the current post not yet done. */
  pending = 0;
  /** Frames of the current post on the wire: handed to a socket, not yet answered, refused or failed with their connection. */
  onWire = 0;
  /**
   * A WRITE one of whose lanes closed while frames of it were on the wire on other lanes: the
   * error it ends with once those are answered or failed (or at its deadline); its frames not yet
   * handed to a socket are never sent. Null otherwise. See `EmbeddedAgent.frameFailed`.
   */
  failing: { readonly kind: TransferErrorKind; readonly message: string } | null = null;
  constructor(
    owner: EmbeddedAgent,
    op: XferOp,
    remoteAgent: string,
    readonly pairs: readonly Pair[],
    bytes: number,
    public notif: Uint8Array | null,
  ) {
    super(owner, op, remoteAgent, bytes, pairs.length);
  }
}

/** Bytes of an agent's socket read buffer ({@link SocketReads}). */
export const READ_BUFFER_BYTES = 1 << 20;
/**
 * Smallest segment received straight into its memory ({@link SocketReads}): below it, one read of
 * the 1 MiB buffer plus a copy costs less than a read per segment (about even at 64 KiB in an A/B
 * run, in-place ahead from 256 KiB on).
 */
export const DIRECT_READ_MIN_BYTES = 256 * 1024;
/** Bytes of the read that takes the header after a large frame ({@link SocketReads}). */
const HEADER_READ_BYTES = 64 * 1024;

/**
 * How one connection of `agent` reads (the socket's `onread` option, {@link opts}): into the
 * agent's one reused buffer of {@link READ_BUFFER_BYTES} (`EmbeddedAgent.readBuffer`; fewer,
 * larger reads than Node's default 64 KiB chunks, no allocation per read), from which the reader
 * copies out what it keeps unparsed before the callback returns (one buffer serves every
 * connection: libuv allocates, reads and calls back for one socket within one synchronous step
 * of the event loop); or, while a payload is being received and its sink offers its
 * destination ({@link FrameReader.directTarget}: the rest of a segment of a READ answer's local
 * memory or of a WRITE's granted region, of {@link DIRECT_READ_MIN_BYTES} or more), straight into
 * that memory: no user copy. Node asks for the next read's buffer right after a read, so the
 * destination is armed until the next read: whoever ends that memory's use by the frame (a
 * transfer that completes, a deregistration, a protocol error) calls {@link disarm} first,
 * which points the socket back at the agent's buffer before anything else can run. Sockets whose
 * handle cannot be re-pointed (no `useUserBuffer`) never read in place.
 */
export class SocketReads {
  private armed: Uint8Array | null = null;
  private socket: net.Socket | null = null;
  /** In-place reads done (tests and metrics). */
  directReads = 0;
  /** `Date.now()` of the last read that brought bytes (0: none yet): the liveness clock of an outgoing lane (`OutConn`, agent option `stallTimeoutMs`). */
  lastReadAt = 0;

  constructor(
    private readonly agent: EmbeddedAgent,
    private readonly reader: () => FrameReader | undefined,
  ) {}

  /** The `onread` option of the connection's socket; {@link attach} the socket once made. */
  get opts(): net.OnReadOpts {
    return { buffer: () => this.next(), callback: (n: number) => this.onRead(n) };
  }

  attach(socket: net.Socket): void {
    this.socket = socket;
  }

  /** Points the socket's next read at the agent's buffer, if a destination is armed. */
  disarm(): void {
    if (this.armed === null) return;
    this.armed = null;
    handleOf(this.socket)?.useUserBuffer(this.agent.readBuffer);
  }

  private next(): Uint8Array {
    const r = this.reader();
    const t = r && handleOf(this.socket) ? r.directTarget() : null;
    this.armed = null;
    // After a large frame, the next one is likely large too: a short read for its header, so that
    // little of its payload comes through the buffer before its segments are read in place.
    if (t === null && r !== undefined && r.payloadBeforeNext >= DIRECT_READ_MIN_BYTES) return this.agent.readBuffer.subarray(0, HEADER_READ_BYTES);
    if (t === null || t.seg.length < DIRECT_READ_MIN_BYTES) return this.agent.readBuffer;
    // A large segment: the rest of it, however short (the read then ends at the segment's end, and
    // the next segment is read in place too).
    this.armed = t.seg.subarray(t.off);
    return this.armed;
  }

  private onRead(n: number): boolean {
    const r = this.reader()!;
    this.lastReadAt = Date.now();
    if (this.armed !== null) {
      this.armed = null;
      this.directReads++;
      r.pushDirect(n);
    } else {
      const b = this.agent.readBuffer;
      r.push(Buffer.from(b.buffer, b.byteOffset, n));
      r.copyRetained();
    }
    return true;
  }
}

/** A socket's libuv handle where it can re-point reads (`useUserBuffer` of Node's stream base), else null. */
function handleOf(s: net.Socket | null): { useUserBuffer(b: Uint8Array): void } | null {
  const h = (s as unknown as { _handle?: { useUserBuffer?: unknown } } | null)?._handle;
  return h && typeof h.useUserBuffer === 'function' ? (h as { useUserBuffer(b: Uint8Array): void }) : null;
}

/**
 * Moves an accepted socket (`net.Server` with `pauseOnConnect`, not yet reading) to a new
 * `net.Socket` on the same libuv handle that reads through `onread` (Node's `net.Server` has no
 * `onread` option; `net.Socket` takes `handle` and `onread` in its constructor, see
 * `lib/net.js` of Node). The server's connection count moves to the new socket, so that
 * `server.close()` still waits for it. Returns null when this Node's socket exposes no `_handle`
 * (the caller then reads through `data` events).
 */
export function adoptWithReads(s: net.Socket, onread: net.OnReadOpts): net.Socket | null {
  const inner = s as unknown as { _handle: unknown; _server: unknown; server: unknown };
  const handle = inner._handle;
  if (handle === null || typeof handle !== 'object' || typeof (handle as { useUserBuffer?: unknown }).useUserBuffer !== 'function') return null;
  const server = inner._server;
  inner._handle = null;
  inner._server = null;
  inner.server = null;
  s.destroy(); // without its handle: closes nothing, counts nothing
  const n = new net.Socket({ handle, onread, readable: true, writable: true } as net.SocketConstructorOpts);
  const adopted = n as unknown as { _server: unknown; server: unknown };
  adopted._server = server;
  adopted.server = server;
  return n;
}

/**
 * Outgoing connection to one remote agent: the first of its {@link OutLink} (its handshake is the
 * session) or, with `session`, an extra lane that joins that connection's session (the lane HELLO
 * of `wire.ts`, sent once the first connection's handshake is done).
 */
export class OutConn {
  readonly socket: net.Socket;
  private readonly reader: FrameReader;
  /** @internal How the socket reads (in place into a READ answer's local memory where it can). */
  readonly reads: SocketReads;
  private ready = false;
  private closed = false;
  private blocked = false;
  /** A frame's device-to-staging copies are running: sending waits for them (frame order). */
  private staging = false;
  private queue: OutFrame[] = [];
  private qHead = 0;
  private readonly inflight = new Map<number, OutFrame>();
  private inflightBytes = 0;
  /** Payload bytes of the frames queued and not yet sent. */
  private queuedBytes = 0;
  /** Frames handed to the socket (tests and metrics: how a transfer spread over the lanes). */
  framesSent = 0;
  /**
   * When the connection last went from no frame outstanding to one (`Date.now()`): with
   * `reads.lastReadAt`, the start of the quiet time the stall check measures ({@link checkStall}).
   */
  private busySince = 0;
  /** The stall check's timer, set while frames are outstanding and `stallTimeoutMs` is not 0. */
  private stallTimer: NodeJS.Timeout | null = null;
  /** The stall check's confirmation, queued after the next poll of the sockets ({@link checkStall}). */
  private stallConfirm: NodeJS.Immediate | null = null;
  /** The refusal of the target during this connection's handshake (the text of its FATAL), or null. */
  refusal: string | null = null;
  /** Frames answered (RDATA received whole, WACK): a lane that answered some was healthy for a while (`OutLink` backoff). */
  answered = 0;
  /** `Date.now()` of the last frame answered (RDATA whole, WACK, ERR; 0: none yet): the progress clock of {@link stallOnDeadline}. */
  private lastDoneAt = 0;
  /** Closed by the stall check ({@link stalled}). */
  stalledOut = false;
  /** The handshake was done once (a lane that dies after it is replaced, one refused is not). */
  private wasReady = false;
  private nextId = 1;
  private failKind: TransferErrorKind = 'remote-disconnect';
  private failMessage = 'connection closed';
  private readonly connectTimer: NodeJS.Timeout;
  /** Notifs sent before the handshake finished. */
  private early: Array<{ msg: Uint8Array; resolve: () => void; reject: (e: Error) => void }> = [];
  /** Callers of {@link whenReady} before the handshake finished. */
  private readyWaiters: Array<{ resolve: () => void; reject: (e: Error) => void }> = [];
  /** The handshake's nonces: the target's challenge and this side's (after HELLO). */
  private serverNonce: Uint8Array | null = null;
  private clientNonce: Uint8Array | null = null;

  constructor(
    private readonly agent: EmbeddedAgent,
    readonly peer: PeerInfo,
    private readonly maxInflight: number,
    connectTimeoutMs: number,
    /** For an extra lane: the link's first connection, whose session this one joins; null for the first. */
    readonly session: OutConn | null = null,
  ) {
    this.reads = new SocketReads(agent, () => this.reader as FrameReader | undefined);
    this.socket = net.connect({ host: peer.host, port: peer.port, noDelay: true, onread: this.reads.opts });
    this.reads.attach(this.socket);
    this.reader = new FrameReader(
      {
        onHeader: (h, n) => this.onHeader(h, n),
        onProtocolError: (m) => this.fatal('invalid', `peer ${peer.name} broke the protocol: ${m}`),
      },
      { maxHeaderBytes: MAX_HANDSHAKE_HEADER_BYTES, maxPayloadBytes: 0, frameTimeoutMs: agent.frameTimeoutMs },
    );
    this.connectTimer = setTimeout(() => this.fatal('timeout', `connect/handshake with ${peer.name} at ${peer.host}:${peer.port} timed out after ${connectTimeoutMs} ms`), connectTimeoutMs);
    this.connectTimer.unref();
    // The target speaks first (CHAL); HELLO answers it (onHeader).
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

  /** True once the handshake is done (the peer proved the secret of its metadata). */
  get isReady(): boolean {
    return this.ready && !this.closed;
  }

  /** True when the handshake was done once (even if the connection closed since). */
  get wasEverReady(): boolean {
    return this.wasReady;
  }

  /** Payload bytes queued or outstanding on this connection (how the link picks a lane). */
  get load(): number {
    return this.queuedBytes + this.inflightBytes;
  }

  /** The connection that carries notifs: the link's first (for an extra lane, its session's). */
  get notifConn(): OutConn {
    return this.session ?? this;
  }

  /** Queues frames and sends what the window allows. */
  enqueue(frames: OutFrame[]): void {
    if (this.closed) {
      for (const f of frames) this.agent.frameFailed(f, this.failKind, this.failMessage);
      return;
    }
    for (const f of frames) {
      this.queue.push(f);
      this.queuedBytes += f.bytes;
    }
    this.pump();
  }

  /** Resolves once the handshake is done (the peer proved its secret); rejects with the connection's error if it closes first. */
  whenReady(): Promise<void> {
    if (this.closed) return Promise.reject(new TransferError(this.failKind, this.failMessage));
    if (this.ready) return Promise.resolve();
    return new Promise((resolve, reject) => this.readyWaiters.push({ resolve, reject }));
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
    while (this.qHead < this.queue.length && !this.blocked && !this.staging) {
      const f = this.queue[this.qHead]!;
      if (!isCurrent(f.req, f.gen) || f.req.failing !== null) {
        this.qHead++; // canceled, timed out or failing (another lane closed) before it was sent
        this.queuedBytes -= f.bytes;
        continue;
      }
      if (this.inflightBytes > 0 && this.inflightBytes + f.bytes > this.maxInflight) break;
      if (f.dev && f.stage === undefined) {
        const staged = this.agent.stageFrame(f);
        if (staged) {
          this.staging = true;
          void staged.then(() => {
            this.staging = false;
            this.pump();
          });
          break;
        }
        if (!isCurrent(f.req, f.gen)) continue;
      }
      this.qHead++;
      this.queuedBytes -= f.bytes;
      this.framesSent++;
      if (this.inflight.size === 0) {
        this.busySince = Date.now();
        this.armStall();
      }
      f.id = this.nextId;
      this.nextId = this.nextId === 0xffffffff ? 1 : this.nextId + 1;
      this.inflight.set(f.id, f);
      this.inflightBytes += f.bytes;
      f.wire = true;
      f.req.onWire++;
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
      const cluster = this.agent.clusterSecretBytes;
      if (h.t === F.CHAL && this.clientNonce === null) {
        const sn: Uint8Array = Uint8Array.prototype.slice.call(h.nonce); // a view of the reused read buffer
        const cn = makeNonce();
        this.serverNonce = sn;
        this.clientNonce = cn;
        const me = this.agent.name;
        const clusterProof = cluster ? makeProof(cluster, HANDSHAKE_CONTEXT.helloCluster, sn, cn, me, this.peer.name) : null;
        const primary = this.session;
        if (primary === null) {
          const agentProof = makeProof(this.peer.secret, HANDSHAKE_CONTEXT.hello, sn, cn, me);
          this.socket.write(encodeFrame([F.HELLO, WIRE_VERSION, me, cn, agentProof, clusterProof]));
          return null;
        }
        // An extra lane: its HELLO names the session (the first connection's challenge), once the
        // target authenticated that connection.
        primary.whenReady().then(
          () => {
            if (this.closed) return;
            const session = primary.serverNonce!;
            const agentProof = makeProof(this.peer.secret, HANDSHAKE_CONTEXT.helloLane, sn, cn, me, session);
            this.socket.write(encodeFrame([F.HELLO, WIRE_VERSION, me, cn, agentProof, clusterProof, session]));
          },
          (e: unknown) => this.fatal(e instanceof TransferError ? e.kind : 'remote-disconnect', `the session of this lane closed: ${e instanceof Error ? e.message : String(e)}`),
        );
        return null;
      }
      if (h.t === F.OK && this.clientNonce !== null && this.serverNonce !== null) {
        if (h.name !== this.peer.name) {
          this.fatal('invalid', `peer at ${this.peer.host}:${this.peer.port} is ${JSON.stringify(h.name)}, not ${JSON.stringify(this.peer.name)}`);
          return null;
        }
        if (!checkProof(h.agentProof, this.peer.secret, HANDSHAKE_CONTEXT.ok, this.clientNonce, this.serverNonce, h.name)) {
          this.fatal('invalid', `peer ${this.peer.name} did not prove the agent secret of its metadata`);
          return null;
        }
        if (cluster && !checkProof(h.clusterProof, cluster, HANDSHAKE_CONTEXT.okCluster, this.clientNonce, this.serverNonce, h.name, this.agent.name)) {
          this.fatal('invalid', `peer ${this.peer.name} did not prove the cluster secret`);
          return null;
        }
        this.ready = true;
        this.wasReady = true;
        this.reader.setLimits(MAX_HEADER_BYTES, MAX_PAYLOAD_BYTES);
        clearTimeout(this.connectTimer);
        for (const e of this.early.splice(0)) {
          this.writeNotif(e.msg);
          e.resolve();
        }
        for (const w of this.readyWaiters.splice(0)) w.resolve();
        this.pump();
        return null;
      }
      if (h.t === F.FATAL) {
        this.refusal = h.message;
        this.fatal(h.kind === 'invalid' ? 'invalid' : 'remote-disconnect', `${this.peer.name} refused the connection: ${h.message}`);
        return null;
      }
      this.fatal('invalid', `peer ${this.peer.name} sent frame type ${h.t} out of the handshake`);
      return null;
    }
    switch (h.t) {
      case F.RDATA: {
        const f = this.inflight.get(h.id);
        if (!f || f.t !== F.READ || payloadBytes !== f.bytes) {
          this.fatal('invalid', `peer ${this.peer.name} sent RDATA for unknown frame ${h.id} or of the wrong size`);
          return null;
        }
        let seg = 0;
        let off = 0;
        return {
          // In place only while the transfer is current; the agent disarms when it completes.
          direct: () => (isCurrent(f.req, f.gen) ? { seg: f.locals[seg]!, off } : null),
          advance: (n: number) => {
            off += n;
            if (off === f.locals[seg]!.length) {
              seg++;
              off = 0;
            }
          },
          write: (chunk: Buffer) => {
            // Checked per chunk: once the transfer completed (timeout, cancel, release, a new
            // post), its memory is the caller's again and late bytes are dropped.
            if (!isCurrent(f.req, f.gen)) return;
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
        this.lastDoneAt = Date.now();
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
    this.answered++;
    this.lastDoneAt = Date.now();
    this.inflight.delete(id);
    this.inflightBytes -= f.bytes;
    this.agent.frameDone(f, this);
    this.pump();
  }

  /** Starts the stall check's timer unless it runs or the check is off (`stallTimeoutMs` 0). */
  private armStall(): void {
    const bound = this.agent.stallTimeoutMs;
    if (bound === 0 || this.stallTimer !== null || this.stallConfirm !== null) return;
    this.stallTimer = setTimeout(() => this.checkStall(false), bound);
    this.stallTimer.unref();
  }

  /**
   * The stall check (agent option `stallTimeoutMs`): while frames are outstanding, the time since
   * the later of the last byte received and the moment frames became outstanding; at the bound or
   * beyond, the connection stalled ({@link stalled}). A first verdict is confirmed once more after
   * the event loop's next poll of the sockets (`setImmediate` runs after it): a timer that fires
   * late because this process's event loop was busy must not mistake bytes that wait unread in
   * the kernel for silence.
   */
  private checkStall(confirming: boolean): void {
    this.stallTimer = null;
    if (this.closed || this.inflight.size === 0) return;
    const bound = this.agent.stallTimeoutMs;
    const quiet = Date.now() - Math.max(this.reads.lastReadAt, this.busySince);
    if (quiet < bound) {
      this.stallTimer = setTimeout(() => this.checkStall(false), bound - quiet);
      this.stallTimer.unref();
      return;
    }
    if (!confirming) {
      this.stallConfirm = setImmediate(() => {
        this.stallConfirm = null;
        this.checkStall(true);
      });
      return;
    }
    this.stalled(quiet);
  }

  /**
   * No byte came back for `stallTimeoutMs` while frames were outstanding: the connection closes
   * (`remote-disconnect`) and its frames, taken from it first, go to the agent
   * (`EmbeddedAgent.laneStalled`), which re-requests the READ ones on the link's other ready
   * lanes and fails the rest as a closed connection's.
   */
  private stalled(quiet: number, what = 'no byte received'): void {
    const frames = [...this.inflight.values(), ...this.queue.slice(this.qHead)];
    const n = this.inflight.size;
    this.inflight.clear();
    this.queue = [];
    this.qHead = 0;
    this.inflightBytes = 0;
    this.queuedBytes = 0;
    this.stalledOut = true;
    const message = `connection to ${this.peer.name} stalled: ${what} for ${quiet} ms with ${n} frame(s) outstanding (stallTimeoutMs ${this.agent.stallTimeoutMs})`;
    this.fatal('remote-disconnect', message);
    this.agent.laneStalled(this, frames, 'remote-disconnect', message);
  }

  /**
   * @internal The transfer `req` ended at its deadline (`timeout`) with frames outstanding here:
   * when this connection answered no frame for `stallTimeoutMs` (since frames became outstanding
   * or its last answer), it is closed as stalled ({@link stalled}: READ frames of other transfers
   * are asked again elsewhere) though bytes may still come. A target that drips a byte at a time
   * defeats the byte clock of {@link checkStall} and would hold every later frame of the lane
   * behind the one it drips (until `frameTimeoutMs`). `stallTimeoutMs` must exceed one frame's
   * time anyway (its option note). Returns true when it closed.
   */
  stallOnDeadline(req: EmbeddedRequest): boolean {
    const bound = this.agent.stallTimeoutMs;
    if (bound === 0 || this.closed) return false;
    let holds = false;
    for (const f of this.inflight.values()) {
      if (f.req === req) {
        holds = true;
        break;
      }
    }
    if (!holds) return false;
    const quiet = Date.now() - Math.max(this.lastDoneAt, this.busySince);
    if (quiet < bound) return false;
    this.stalled(quiet, 'no frame answered');
    return true;
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
    if (this.stallTimer !== null) clearTimeout(this.stallTimer);
    if (this.stallConfirm !== null) clearImmediate(this.stallConfirm);
    this.stallTimer = null;
    this.stallConfirm = null;
    this.reader.kill();
    this.agent.connClosed(this, this.failKind, this.failMessage);
    const frames = [...this.inflight.values(), ...this.queue.slice(this.qHead)];
    this.inflight.clear();
    this.queue = [];
    this.qHead = 0;
    this.inflightBytes = 0;
    this.queuedBytes = 0;
    for (const f of frames) this.agent.frameFailed(f, this.failKind, this.failMessage, true);
    for (const e of this.early.splice(0)) e.reject(new TransferError(this.failKind, this.failMessage));
    for (const w of this.readyWaiters.splice(0)) w.reject(new TransferError(this.failKind, this.failMessage));
  }
}

/**
 * Refusals of a lane HELLO by a target that takes lanes but not this one now (`InConn`: its session
 * is closing, or the target still counts a lane this side already closed): the lane is opened
 * again after a backoff. Any other refusal in a lane's handshake (a target from before lanes
 * answers a lane HELLO with `HELLO must be [...]`) means the target takes no lanes.
 */
export const TRANSIENT_LANE_REFUSALS: readonly string[] = ['opened a lane for no open session', 'extra lanes for one session'];

/** First delay before a lane that closed is opened again, ms ({@link laneBackoffMs}). */
export const LANE_RETRY_BASE_MS = 100;
/** Longest delay before a lane that closed is opened again, ms ({@link laneBackoffMs}). */
export const LANE_RETRY_MAX_MS = 30_000;

/**
 * Delay before a lane slot opens a new lane in place of one that closed, when `earlier` lanes
 * before that one failed in a row in the slot (closed without answering a frame, or stalled; a lane
 * that answered frames and then closed starts the count again): {@link LANE_RETRY_BASE_MS}
 * doubled per earlier failure, at most {@link LANE_RETRY_MAX_MS}.
 */
export function laneBackoffMs(earlier: number): number {
  return Math.min(LANE_RETRY_MAX_MS, LANE_RETRY_BASE_MS * 2 ** Math.min(Math.max(0, earlier), 20));
}

/**
 * The initiator's connections to one remote agent (agent option `lanes`, 1..{@link MAX_LANES}):
 * the first connection, whose handshake is the session, and up to `lanes - 1` extra lanes, each
 * authenticated by its own lane HELLO bound to that session (`wire.ts`). One extra lane opens with
 * the first connection; the others once one extra lane was ready (a target from before lanes
 * refuses one lane, not all). A transfer's frames go to the least loaded ready lanes (payload
 * bytes queued and outstanding; the first connection takes them while the others are not ready);
 * the transfer completes once every frame on every lane is done (`EmbeddedRequest.pending`). A
 * lane that closes (the target closed it, it stalled, its handshake failed) fails the frames it
 * holds (so the transfers using it) with its error and nothing else, except READ frames of a
 * stalled one (`EmbeddedAgent.laneStalled`), and a new lane takes its place after
 * {@link laneBackoffMs}. A lane the target refused for good (not one of
 * {@link TRANSIENT_LANE_REFUSALS}) is not opened again, and the agent opens no lane to that
 * target until its metadata changes (`EmbeddedAgent.laneRefusal`). When the first connection
 * closes, the session ends: every lane closes with its error.
 */
export class OutLink {
  /** The lanes opened so far; `lanes[0]` is the first connection (the session). */
  readonly lanes: OutConn[];
  /** Per lane slot: lanes in a row that closed there without answering a frame, and the timer that opens the next. */
  private readonly retry: Array<{ failures: number; timer: NodeJS.Timeout | null }> = [];
  private closed = false;

  constructor(
    private readonly agent: EmbeddedAgent,
    readonly peer: PeerInfo,
    private readonly count: number,
    private readonly maxInflight: number,
    private readonly connectTimeoutMs: number,
  ) {
    const primary = new OutConn(agent, peer, maxInflight, connectTimeoutMs);
    this.lanes = [primary];
    if (count > 1) this.open(1);
  }

  /** The first connection: handshake of the session, notifs, same-host checks. */
  get primary(): OutConn {
    return this.lanes[0]!;
  }

  get isClosed(): boolean {
    return this.primary.isClosed;
  }

  /** Opens the extra lane of slot `i` (a new one, or in place of one that closed); once it is ready, the slots not yet opened. */
  private open(i: number): void {
    const lane = new OutConn(this.agent, this.peer, this.maxInflight, this.connectTimeoutMs, this.primary);
    this.lanes[i] = lane;
    this.retry[i] ??= { failures: 0, timer: null };
    lane.whenReady().then(
      () => {
        if (this.closed || this.agent.laneRefusal(this.peer.name) !== null) return;
        for (let k = this.lanes.length; k < this.count; k++) this.open(k);
      },
      () => {},
    );
  }

  /**
   * @internal An extra lane closed (`EmbeddedAgent.connClosed`): refused for good, the target
   * takes no lanes (the agent remembers it); else a new lane in its slot after the backoff.
   */
  laneClosed(c: OutConn): void {
    const i = this.lanes.indexOf(c);
    if (i <= 0 || this.closed || this.primary.isClosed) return;
    if (!c.wasEverReady && c.refusal !== null && !TRANSIENT_LANE_REFUSALS.some((m) => c.refusal!.includes(m))) {
      this.agent.refuseLanes(this.peer.name, c.refusal);
      return;
    }
    const r = this.retry[i]!;
    r.failures = c.answered > 0 && !c.stalledOut ? 0 : r.failures + 1;
    if (r.timer !== null) return;
    r.timer = setTimeout(() => {
      r.timer = null;
      if (this.closed || this.primary.isClosed || this.agent.laneRefusal(this.peer.name) !== null || !this.lanes[i]!.isClosed) return;
      this.agent.laneEvents.reopened++;
      this.open(i);
    }, laneBackoffMs(r.failures - 1));
    r.timer.unref();
  }

  /** Spreads `frames` over the lanes (see the class note) and queues them. */
  enqueue(frames: OutFrame[]): void {
    const lanes = this.lanes;
    if (lanes.length === 1 || frames.length === 0) {
      this.primary.enqueue(frames);
      return;
    }
    const use = lanes.filter((l, i) => i === 0 || l.isReady);
    if (use.length === 1) {
      this.primary.enqueue(frames);
      return;
    }
    const loads = use.map((l) => l.load);
    const groups: OutFrame[][] = use.map(() => []);
    for (const f of frames) {
      let k = 0;
      for (let j = 1; j < loads.length; j++) if (loads[j]! < loads[k]!) k = j;
      groups[k]!.push(f);
      loads[k]! += f.bytes;
    }
    for (let j = 0; j < use.length; j++) if (groups[j]!.length > 0) use[j]!.enqueue(groups[j]!);
  }

  /** `req` ended at its deadline: each lane holding its frames that answered none for the stall bound closes as stalled ({@link OutConn.stallOnDeadline}); the extra lanes first. */
  stallOnDeadline(req: EmbeddedRequest): void {
    for (const l of [...this.lanes.slice(1), this.primary]) l.stallOnDeadline(req);
  }

  /** Points every lane's next read back at the agent's buffer ({@link SocketReads.disarm}). */
  disarm(): void {
    for (const l of this.lanes) l.reads.disarm();
  }

  /** Closes every lane with this error (their frames fail with it); no lane is opened again. */
  fatal(kind: TransferErrorKind, message: string): void {
    this.closed = true;
    for (const r of this.retry) if (r?.timer) clearTimeout(r.timer);
    for (const l of this.lanes) l.fatal(kind, message);
  }
}

/** Most lanes per peer (agent option `lanes`). */
export const MAX_LANES = 8;

/** Incoming connection from one initiator. */
export class InConn {
  private readonly reader: FrameReader;
  readonly socket: net.Socket;
  /** True when this connection reads through the agent's read buffer ({@link adoptWithReads}), false: `data` events. */
  readonly userBuffer: boolean;
  /** @internal How the socket reads (in place into a WRITE's granted region where it can). */
  readonly reads: SocketReads;
  private peerName: string | null = null;
  private closed = false;
  /** For an extra lane: the connection whose session it joined; null for a first connection. */
  private session: InConn | null = null;
  /** For a first connection: the extra lanes that joined its session (closed with it). */
  private readonly laneConns = new Set<InConn>();
  private readonly helloTimer: NodeJS.Timeout;
  /** This side's challenge (CHAL), sent on accept. */
  private readonly serverNonce = makeNonce();
  /** Bytes of a notif being received (counted in the agent's buffered bytes). */
  private partial = 0;
  /** Reading is paused until the socket drains ({@link backpressure}). */
  private drainWait = false;
  readonly label: string;

  /** `accepted`: a socket of the agent's server (`pauseOnConnect`), not yet reading. */
  constructor(
    private readonly agent: EmbeddedAgent,
    accepted: net.Socket,
  ) {
    this.reads = new SocketReads(agent, () => this.reader as FrameReader | undefined);
    const adopted = adoptWithReads(accepted, this.reads.opts);
    const socket = adopted ?? accepted;
    if (adopted) this.reads.attach(adopted);
    this.socket = socket;
    this.userBuffer = adopted !== null;
    this.label = `${socket.remoteAddress}:${socket.remotePort}`;
    socket.setNoDelay(true);
    this.reader = new FrameReader(
      {
        onHeader: (h, n) => this.onHeader(h, n),
        onProtocolError: (m) => this.protocolError(m),
      },
      { maxHeaderBytes: MAX_HANDSHAKE_HEADER_BYTES, maxPayloadBytes: 0, frameTimeoutMs: agent.frameTimeoutMs },
    );
    this.helloTimer = setTimeout(() => this.protocolError('no HELLO in time'), agent.connectTimeoutMs);
    this.helloTimer.unref();
    socket.write(encodeFrame([F.CHAL, WIRE_VERSION, this.serverNonce]));
    if (!adopted) {
      socket.on('data', (c: Buffer) => this.reader.push(c));
      socket.resume();
    }
    socket.on('error', () => {});
    socket.on('close', () => {
      this.closed = true;
      clearTimeout(this.helloTimer);
      this.reader.kill();
      this.setPartial(0);
      this.session?.laneConns.delete(this);
      for (const l of this.laneConns) l.socket.destroy(); // the session ended: its lanes with it
      this.laneConns.clear();
      agent.inClosed(this);
    });
  }

  /** True when this is an open first connection that authenticated `name` with challenge `nonce` (a session extra lanes may join). */
  isSession(name: string, nonce: Uint8Array): boolean {
    return !this.closed && this.session === null && this.peerName === name && nonce.length === this.serverNonce.length && timingSafeEqual(nonce, this.serverNonce);
  }

  /** Extra lanes that joined this connection's session (tests and metrics). */
  get lanes(): number {
    return this.laneConns.size;
  }

  /** Bytes this connection holds: unparsed input and a notif being received. */
  get buffered(): number {
    return this.reader.buffered + this.partial;
  }

  private setPartial(n: number): void {
    this.agent.partialNotifBytes += n - this.partial;
    this.partial = n;
  }

  private protocolError(message: string): void {
    if (this.closed) return;
    this.closed = true;
    this.reads.disarm(); // the socket stays open a moment for the FATAL: no byte in place any more
    const err = new ProtocolError(this.peerName ? `${this.peerName} (${this.label})` : this.label, message);
    try {
      this.socket.end(encodeFrame([F.FATAL, 'invalid', message.slice(0, 4000)]));
    } catch {
      /* socket already gone */
    }
    setTimeout(() => this.socket.destroy(), 100).unref();
    this.reader.kill();
    this.setPartial(0);
    this.agent.reportProtocolError(err);
  }

  private refuse(id: number, message: string): void {
    this.socket.write(encodeFrame([F.ERR, id, 'invalid', message.slice(0, 4000)]));
    this.backpressure(); // a peer that does not read its refusals must not grow this process
  }

  /** Stops reading requests while too many response bytes are queued (once until the drain). */
  private backpressure(): void {
    if (this.drainWait || this.socket.writableLength < this.agent.maxQueuedResponseBytes) return;
    this.drainWait = true;
    this.reader.pause();
    this.socket.pause();
    this.socket.once('drain', () => {
      this.drainWait = false;
      if (this.closed) return;
      this.socket.resume();
      this.reader.resume();
    });
  }

  /** Resolves every segment to a live region view, or returns the first bad one. */
  private resolve(segs: readonly number[]): { views: Uint8Array[]; regions: HostRegion[]; dev: DevSeg[] } | string {
    const views: Uint8Array[] = [];
    const regions: HostRegion[] = [];
    const dev: DevSeg[] = [];
    let at = 0;
    for (let i = 0; i < segs.length; i += 2) {
      const addr = segs[i]!;
      const len = segs[i + 1]!;
      const r = this.agent.regions.find(addr, len);
      if (!r) return `segment ${i / 2} [0x${addr.toString(16)}, +${len}) is outside ${this.agent.name}'s registered memory`;
      if (r.device) dev.push({ i: i / 2, at, region: r, off: addr - r.addr, len }); // its view: staging (stageTarget)
      views.push(r.view.subarray(addr - r.addr, addr - r.addr + len));
      regions.push(r);
      at += len;
    }
    return { views, regions, dev };
  }

  /** A READ of device segments: device to staging, then the answer; the staging goes back once written. */
  private answerDeviceRead(id: number, bytes: number, views: Uint8Array[], dev: DevSeg[]): void {
    const st = this.agent.stageTarget(views, dev, bytes);
    this.agent.deviceCopies(st.buf, dev, 'd2h').then(
      () => {
        if (this.closed) return;
        this.socket.cork();
        this.socket.write(encodeFrame([F.RDATA, id], bytes));
        for (let i = 0; i < views.length; i++) {
          if (i === views.length - 1) this.socket.write(views[i]!, () => st.pool.give(st.buf));
          else this.socket.write(views[i]!);
        }
        this.socket.uncork();
        this.backpressure();
      },
      (e: unknown) => {
        if (!this.closed) this.refuse(id, `device copy failed: ${e instanceof Error ? e.message : String(e)}`);
      },
    );
  }

  private onHeader(h: Header, payloadBytes: number): PayloadSink | null {
    if (this.peerName === null) {
      if (h.t !== F.HELLO) {
        this.protocolError(`expected HELLO, got frame type ${h.t}`);
        return null;
      }
      // The cluster secret first: a peer outside the cluster learns nothing of the agent secret.
      const cluster = this.agent.clusterSecretBytes;
      const sn = this.serverNonce;
      const me = this.agent.name;
      if (cluster && !checkProof(h.clusterProof, cluster, HANDSHAKE_CONTEXT.helloCluster, sn, h.nonce, h.name, me)) {
        this.protocolError(`agent ${JSON.stringify(h.name)} did not prove the cluster secret`);
        return null;
      }
      if (!cluster && h.clusterProof !== null) {
        this.protocolError(`agent ${JSON.stringify(h.name)} uses a cluster secret, ${me} has none`);
        return null;
      }
      const mine = this.agent.secretBytes;
      const proved = h.session === null ? checkProof(h.agentProof, mine, HANDSHAKE_CONTEXT.hello, sn, h.nonce, h.name) : checkProof(h.agentProof, mine, HANDSHAKE_CONTEXT.helloLane, sn, h.nonce, h.name, h.session);
      if (!proved) {
        this.protocolError(`agent ${JSON.stringify(h.name)} presented a wrong secret`);
        return null;
      }
      if (h.session !== null) {
        // An extra lane: only into an open session of the same initiator.
        const session = this.agent.findSession(h.name, h.session);
        if (session === null) {
          this.protocolError(`agent ${JSON.stringify(h.name)} opened a lane for no open session`);
          return null;
        }
        if (session.laneConns.size >= MAX_LANES - 1) {
          // An initiator opens at most MAX_LANES - 1 extra lanes (its option is capped there), so
          // one more is a peer that tries to hold the target's sockets: refused, the session kept.
          this.protocolError(`agent ${JSON.stringify(h.name)} opened more than ${MAX_LANES - 1} extra lanes for one session`);
          return null;
        }
        this.session = session;
        session.laneConns.add(this);
      }
      clearTimeout(this.helloTimer);
      this.peerName = h.name;
      this.reader.setLimits(MAX_HEADER_BYTES, MAX_PAYLOAD_BYTES);
      const agentProof = makeProof(mine, HANDSHAKE_CONTEXT.ok, h.nonce, sn, me);
      const clusterProof = cluster ? makeProof(cluster, HANDSHAKE_CONTEXT.okCluster, h.nonce, sn, me, h.name) : null;
      this.socket.write(encodeFrame([F.OK, me, agentProof, clusterProof]));
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
        if (r.dev.length > 0) {
          this.answerDeviceRead(h.id, h.bytes, r.views, r.dev);
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
        const staged = r.dev.length > 0 ? this.agent.stageTarget(r.views, r.dev, h.bytes) : null;
        let seg = 0;
        let off = 0;
        let lost = false;
        return {
          // In place only into a live region (deregistration disarms first) or the frame's staging.
          direct: () => (!lost && r.regions[seg]!.alive && !this.closed ? { seg: r.views[seg]!, off } : null),
          advance: (n: number) => {
            off += n;
            if (off === r.views[seg]!.length) {
              seg++;
              off = 0;
            }
          },
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
            else if (staged) {
              // Device segments: staging to device, then the acknowledgement.
              this.agent.deviceCopies(staged.buf, r.dev, 'h2d').then(
                () => {
                  staged.pool.give(staged.buf);
                  if (!this.closed) this.socket.write(encodeFrame([F.WACK, h.id]));
                },
                (e: unknown) => {
                  if (!this.closed) this.refuse(h.id, `device copy failed: ${e instanceof Error ? e.message : String(e)}`);
                },
              );
            } else {
              this.socket.write(encodeFrame([F.WACK, h.id]));
              this.backpressure();
            }
          },
        };
      }
      case F.NOTIF: {
        const from = this.peerName;
        // Memory grows with the bytes that arrived, not with the size announced; one concat at the end.
        const parts: Buffer[] = [];
        let got = 0;
        return {
          write: (chunk: Buffer) => {
            if (this.closed) return;
            if (this.agent.partialNotifBytes + chunk.length > this.agent.maxBufferedBytes) {
              this.protocolError(`more than ${this.agent.maxBufferedBytes} bytes of partial notifs buffered`);
              return;
            }
            parts.push(Buffer.from(chunk));
            got += chunk.length;
            this.setPartial(got);
          },
          end: () => {
            this.setPartial(0);
            if (this.closed) return;
            const buf = parts.length === 1 ? parts[0]! : Buffer.concat(parts, got);
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


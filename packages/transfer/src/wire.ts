/**
 * The embedded agent's wire format: length-prefixed frames over one TCP connection per
 * (initiator, target) pair.
 *
 * A frame is an 8-byte prefix, a MessagePack header (msgpackr), then raw payload bytes:
 *
 *     u32 headerBytes (little-endian), u32 payloadBytes (little-endian), header, payload
 *
 * `headerBytes` is 1..{@link MAX_HEADER_BYTES}, `payloadBytes` 0..{@link MAX_PAYLOAD_BYTES}. The
 * header is a MessagePack array whose first element is the frame type ({@link F}):
 *
 * Handshake (version 2, `docs/security.md`): neither secret crosses the wire. Proofs are
 * `makeProof` of `auth.ts` (HMAC-SHA256) with the contexts of {@link HANDSHAKE_CONTEXT}.
 * - target to initiator, on accept: `[CHAL, 2, serverNonce]` (`NONCE_BYTES`).
 * - initiator: `[HELLO, 2, name, clientNonce, agentProof, clusterProof | nil]` with
 *   `agentProof = proof(targetAgentSecret, hello, serverNonce, clientNonce, name)` (the target's
 *   secret from its metadata) and, when the initiator has a cluster secret,
 *   `clusterProof = proof(clusterSecret, helloCluster, serverNonce, clientNonce, name, targetName)`.
 *   The target checks the cluster proof first (required when it has a cluster secret, refused when
 *   it has none), then the agent proof.
 * - an extra lane (the agent option `lanes`, `embedded.ts`): a further connection of the same
 *   initiator, opened once the first connection's handshake is done, sends on its own CHAL
 *   `[HELLO, 2, name, clientNonce, agentProof, clusterProof | nil, session]` where `session` is
 *   the server nonce of that first connection's CHAL ({@link NONCE_BYTES}) and
 *   `agentProof = proof(targetAgentSecret, helloLane, serverNonce, clientNonce, name, session)`;
 *   the target accepts it only while a connection it authenticated for `name` with that server
 *   nonce is open (the session), and closes the lane with the session. The cluster proof and OK
 *   are as above.
 * - target: `[OK, targetName, agentProof, clusterProof | nil]` with the same secrets over
 *   `clientNonce, serverNonce, targetName[, initiatorName]` (contexts ok / okCluster): the
 *   initiator knows it reached the agent whose metadata it loaded (and a cluster member).
 * Until the handshake is done, headers are at most {@link MAX_HANDSHAKE_HEADER_BYTES} and
 * frames carry no payload.
 *
 * initiator to target, after the handshake
 * - `[READ, id, segs]`: `segs` is a flat array `[addr0, len0, addr1, len1, ...]` of target
 *   memory; answered by one `RDATA` (payload: the bytes, in order) or `ERR`.
 * - `[WRITE, id, segs]` + payload (the bytes for the segments, in order); answered by `WACK` once
 *   the bytes are in the target's memory, or by `ERR`.
 * - `[NOTIF]` + payload (the notif bytes, at most {@link MAX_NOTIF_BYTES}).
 *
 * target to initiator
 * - `[OK, name, agentProof, clusterProof | nil]`: the hello was accepted. `[RDATA, id]` + payload. `[WACK, id]`.
 * - `[ERR, id, kind, message]`: frame `id` was refused (kind: a TransferErrorKind).
 * - `[FATAL, kind, message]`: the connection is about to close.
 *
 * Ids are the initiator's, unsigned 32-bit. Every field is checked by {@link decodeHeader};
 * anything else is a protocol error that closes the connection.
 * @module
 */
import { Packr, Unpackr } from 'msgpackr';
import { NONCE_BYTES, PROOF_BYTES } from './auth.js';

/** Frame types (the first element of every header). */
export const F = {
  HELLO: 0,
  READ: 1,
  WRITE: 2,
  NOTIF: 3,
  OK: 10,
  RDATA: 11,
  WACK: 12,
  ERR: 13,
  FATAL: 14,
  CHAL: 15,
} as const;

/** Protocol version carried by CHAL and HELLO (1: the agent secret in HELLO; 2: challenge and proofs). */
export const WIRE_VERSION = 2;
/** Proof contexts of the handshake (`makeProof` in `auth.ts`). */
export const HANDSHAKE_CONTEXT = Object.freeze({
  hello: 'embedded/hello',
  helloLane: 'embedded/hello-lane',
  helloCluster: 'embedded/hello-cluster',
  ok: 'embedded/ok',
  okCluster: 'embedded/ok-cluster',
} as const);
/** Largest header before the handshake is done (CHAL, HELLO, OK, FATAL), bytes. */
export const MAX_HANDSHAKE_HEADER_BYTES = 16 * 1024;
/** Largest accepted header, bytes. */
export const MAX_HEADER_BYTES = 256 * 1024;
/** Largest accepted payload of one frame, bytes (16 MiB). */
export const MAX_PAYLOAD_BYTES = 16 * 1024 * 1024;
/** Most segments in one READ or WRITE frame. */
export const MAX_SEGMENTS = 8192;
/** Largest notif, bytes (1 MiB). */
export const MAX_NOTIF_BYTES = 1024 * 1024;
/** Longest agent name, UTF-16 code units. */
export const MAX_NAME_LENGTH = 256;
/** Secret length, bytes. */
export const SECRET_BYTES = 32;

/** Prefix length, bytes. */
export const PREFIX_BYTES = 8;

const packr = new Packr({ useRecords: false, variableMapSize: true });
const unpackr = new Unpackr({ useRecords: false, int64AsType: 'number' });

/** A decoded, checked header. `segs` are flat `[addr, len, ...]` pairs. */
export type Header =
  | { readonly t: typeof F.CHAL; readonly nonce: Uint8Array }
  | { readonly t: typeof F.HELLO; readonly name: string; readonly nonce: Uint8Array; readonly agentProof: Uint8Array; readonly clusterProof: Uint8Array | null; readonly session: Uint8Array | null }
  | { readonly t: typeof F.READ | typeof F.WRITE; readonly id: number; readonly segs: readonly number[]; readonly bytes: number }
  | { readonly t: typeof F.NOTIF }
  | { readonly t: typeof F.OK; readonly name: string; readonly agentProof: Uint8Array; readonly clusterProof: Uint8Array | null }
  | { readonly t: typeof F.RDATA | typeof F.WACK; readonly id: number }
  | { readonly t: typeof F.ERR; readonly id: number; readonly kind: string; readonly message: string }
  | { readonly t: typeof F.FATAL; readonly kind: string; readonly message: string };

/** Encodes the prefix and header of a frame with `payloadBytes` payload bytes to follow. */
export function encodeFrame(header: readonly unknown[], payloadBytes = 0): Buffer {
  const h = packr.pack(header);
  const out = Buffer.allocUnsafe(PREFIX_BYTES + h.length);
  out.writeUInt32LE(h.length, 0);
  out.writeUInt32LE(payloadBytes, 4);
  h.copy(out, PREFIX_BYTES);
  return out;
}

function isU32(x: unknown): x is number {
  return typeof x === 'number' && Number.isInteger(x) && x >= 0 && x <= 0xffffffff;
}
function isSafeNat(x: unknown): x is number {
  return typeof x === 'number' && Number.isSafeInteger(x) && x >= 0;
}
function isText(x: unknown, max: number): x is string {
  return typeof x === 'string' && x.length <= max;
}
function isBytes(x: unknown, n: number): x is Uint8Array {
  return x instanceof Uint8Array && x.length === n;
}

/**
 * Decodes and checks a header, given its payload length.
 * @returns the header, or a string saying what is wrong.
 */
export function decodeHeader(bytes: Uint8Array, payloadBytes: number): Header | string {
  let v: unknown;
  try {
    v = unpackr.unpack(bytes);
  } catch (e) {
    return `undecodable header (${e instanceof Error ? e.message : String(e)})`;
  }
  if (!Array.isArray(v) || v.length === 0 || !isU32(v[0])) return 'header is not an array starting with a frame type';
  const t = v[0];
  const noPayload = (h: Header): Header | string => (payloadBytes === 0 ? h : `frame type ${t} carries no payload`);
  switch (t) {
    case F.CHAL:
      if (v.length !== 3 || v[1] !== WIRE_VERSION) return `CHAL must be [15, ${WIRE_VERSION}, nonce]`;
      if (!isBytes(v[2], NONCE_BYTES)) return `CHAL: nonce must be ${NONCE_BYTES} bytes`;
      return noPayload({ t, nonce: v[2] });
    case F.HELLO: {
      if ((v.length !== 6 && v.length !== 7) || v[1] !== WIRE_VERSION) return `HELLO must be [0, ${WIRE_VERSION}, name, nonce, agentProof, clusterProof(, session)]`;
      if (!isText(v[2], MAX_NAME_LENGTH) || v[2].length === 0) return 'HELLO: bad agent name';
      if (!isBytes(v[3], NONCE_BYTES)) return `HELLO: nonce must be ${NONCE_BYTES} bytes`;
      if (!isBytes(v[4], PROOF_BYTES)) return `HELLO: agent proof must be ${PROOF_BYTES} bytes`;
      if (v[5] !== null && !isBytes(v[5], PROOF_BYTES)) return `HELLO: cluster proof must be nil or ${PROOF_BYTES} bytes`;
      if (v.length === 7 && !isBytes(v[6], NONCE_BYTES)) return `HELLO: session must be ${NONCE_BYTES} bytes`;
      return noPayload({ t, name: v[2], nonce: v[3], agentProof: v[4], clusterProof: v[5], session: v.length === 7 ? (v[6] as Uint8Array) : null });
    }
    case F.READ:
    case F.WRITE: {
      if (v.length !== 3 || !isU32(v[1]) || !Array.isArray(v[2])) return `frame type ${t} must be [${t}, id, segs]`;
      const segs = v[2] as unknown[];
      if (segs.length === 0 || segs.length % 2 !== 0 || segs.length > 2 * MAX_SEGMENTS) return `frame type ${t}: segs must hold 1..${MAX_SEGMENTS} (addr, len) pairs`;
      let bytes = 0;
      for (let i = 0; i < segs.length; i += 2) {
        if (!isSafeNat(segs[i]) || !isSafeNat(segs[i + 1]) || (segs[i + 1] as number) === 0) return `frame type ${t}: segment ${i / 2} is not a (safe address, positive length) pair`;
        bytes += segs[i + 1] as number;
        if (bytes > MAX_PAYLOAD_BYTES) return `frame type ${t}: more than ${MAX_PAYLOAD_BYTES} bytes`;
      }
      if (t === F.READ && payloadBytes !== 0) return 'READ carries no payload';
      if (t === F.WRITE && payloadBytes !== bytes) return `WRITE: payload of ${payloadBytes} bytes for segments of ${bytes}`;
      return { t, id: v[1], segs: segs as number[], bytes };
    }
    case F.NOTIF:
      if (v.length !== 1) return 'NOTIF must be [3]';
      if (payloadBytes > MAX_NOTIF_BYTES) return `NOTIF larger than ${MAX_NOTIF_BYTES} bytes`;
      return { t };
    case F.OK:
      if (v.length !== 4 || !isText(v[1], MAX_NAME_LENGTH) || !isBytes(v[2], PROOF_BYTES) || (v[3] !== null && !isBytes(v[3], PROOF_BYTES))) return 'OK must be [10, name, agentProof, clusterProof]';
      return noPayload({ t, name: v[1], agentProof: v[2], clusterProof: v[3] });
    case F.RDATA:
      if (v.length !== 2 || !isU32(v[1])) return 'RDATA must be [11, id]';
      return { t, id: v[1] };
    case F.WACK:
      if (v.length !== 2 || !isU32(v[1])) return 'WACK must be [12, id]';
      return noPayload({ t, id: v[1] });
    case F.ERR:
      if (v.length !== 4 || !isU32(v[1]) || !isText(v[2], 64) || !isText(v[3], 4096)) return 'ERR must be [13, id, kind, message]';
      return noPayload({ t, id: v[1], kind: v[2], message: v[3] });
    case F.FATAL:
      if (v.length !== 3 || !isText(v[1], 64) || !isText(v[2], 4096)) return 'FATAL must be [14, kind, message]';
      return noPayload({ t, kind: v[1], message: v[2] });
    default:
      return `unknown frame type ${t}`;
  }
}

/** Receives a frame's payload in pieces (views valid only during the call), then `end`. */
export interface PayloadSink {
  write(chunk: Buffer): void;
  end(): void;
  /**
   * Optional, for {@link FrameReader.directTarget}: the memory where the payload's next bytes go,
   * as the current segment's view and the offset in it of the next byte, or null when they must
   * come through {@link write} (e.g. the memory is no longer the frame's).
   */
  direct?(): DirectTarget | null;
  /** With {@link direct}: the next `n` payload bytes were received straight into its view. */
  advance?(n: number): void;
}

/** Where a payload's next bytes go: byte `off` of `seg` and on (the rest of the current segment). */
export interface DirectTarget {
  readonly seg: Uint8Array;
  readonly off: number;
}

/** What the reader calls: a header (return a sink for its payload, or null to drop the payload), or a protocol error. */
export interface FrameHandler {
  onHeader(header: Header, payloadBytes: number): PayloadSink | null;
  onProtocolError(message: string): void;
}

/** Limits of a {@link FrameReader}. */
export interface FrameReaderLimits {
  /** Largest header (default {@link MAX_HEADER_BYTES}). */
  readonly maxHeaderBytes?: number;
  /** Largest payload (default {@link MAX_PAYLOAD_BYTES}). */
  readonly maxPayloadBytes?: number;
  /** A frame must complete within this many ms of its prefix (default: no deadline). */
  readonly frameTimeoutMs?: number;
}

/**
 * Incremental frame parser over socket chunks. Payload bytes are handed to the sink without
 * being buffered (one copy: socket buffer to the sink's destination). `pause()` stops parsing
 * at the next frame boundary (backpressure); `resume()` continues. After a protocol error it
 * ignores all further input. The prefix's sizes are checked against the limits before anything
 * of the frame is buffered, and a frame that does not complete within `frameTimeoutMs` of its
 * prefix is a protocol error (a peer that announces a frame and trickles it).
 */
export class FrameReader {
  private chunks: Buffer[] = [];
  private avail = 0;
  private state: 'prefix' | 'header' | 'payload' = 'prefix';
  private headerBytes = 0;
  private payloadBytes = 0;
  private payloadLeft = 0;
  private sink: PayloadSink | null = null;
  private paused = false;
  private dead = false;
  private running = false;
  private maxHeader: number;
  private maxPayload: number;
  private readonly frameTimeoutMs: number | undefined;
  private timer: NodeJS.Timeout | null = null;
  private frameNo = 0;
  private lastPayload = 0;
  /** Bytes the last {@link directTarget} offered (0: none). */
  private offered = 0;

  constructor(
    private readonly handler: FrameHandler,
    limits: FrameReaderLimits = {},
  ) {
    this.maxHeader = limits.maxHeaderBytes ?? MAX_HEADER_BYTES;
    this.maxPayload = limits.maxPayloadBytes ?? MAX_PAYLOAD_BYTES;
    this.frameTimeoutMs = limits.frameTimeoutMs;
  }

  /** Changes the header and payload limits (e.g. once the handshake is done); applies from the next frame. */
  setLimits(maxHeaderBytes: number, maxPayloadBytes: number): void {
    this.maxHeader = maxHeaderBytes;
    this.maxPayload = maxPayloadBytes;
  }

  /** Adds received bytes and parses what it can. */
  push(chunk: Buffer): void {
    if (this.dead) return;
    this.chunks.push(chunk);
    this.avail += chunk.length;
    this.run();
  }

  /**
   * Copies the received bytes not yet parsed out of the buffers they arrived in, for a caller that
   * reads into one reused buffer (`net.connect`'s `onread`): call it after every {@link push}.
   */
  copyRetained(): void {
    for (let i = 0; i < this.chunks.length; i++) this.chunks[i] = Buffer.from(this.chunks[i]!);
  }

  /**
   * Where the socket may receive the next payload bytes in place (no user copy), or null: while a
   * payload is being received, nothing is buffered and the sink offers its memory
   * ({@link PayloadSink.direct}; the rest of its current segment, which the payload's remaining
   * bytes cover). After a read into `seg.subarray(off)`, call {@link pushDirect} with the bytes
   * received (at most that view's length).
   */
  directTarget(): DirectTarget | null {
    if (this.dead || this.state !== 'payload' || this.avail !== 0 || this.payloadLeft === 0 || !this.sink?.direct) return null;
    const t = this.sink.direct();
    if (t === null || t.off >= t.seg.length || t.seg.length - t.off > this.payloadLeft) return null;
    this.offered = t.seg.length - t.off;
    return t;
  }

  /** Payload bytes of the last completed frame when between frames (the next prefix is due), else 0. */
  get payloadBeforeNext(): number {
    return this.state === 'prefix' ? this.lastPayload : 0;
  }

  /** `n` payload bytes arrived in the view of the last {@link directTarget}; parses on. */
  pushDirect(n: number): void {
    if (this.dead) return;
    const offered = this.offered;
    this.offered = 0;
    if (this.state !== 'payload' || n > offered) return this.fail(`${n} bytes read in place where ${offered} were offered`);
    this.payloadLeft -= n;
    this.sink!.advance!(n);
    this.run();
  }

  pause(): void {
    this.paused = true;
  }

  resume(): void {
    if (!this.paused) return;
    this.paused = false;
    this.run();
  }

  /** Stops parsing for good. */
  kill(): void {
    this.dead = true;
    this.chunks = [];
    this.avail = 0;
    this.stopTimer();
  }

  private startTimer(): void {
    const ms = this.frameTimeoutMs;
    if (ms === undefined) return;
    const no = ++this.frameNo;
    this.timer = setTimeout(() => {
      // Bytes that arrived while this process was busy are parsed first (poll phase), then judged.
      setImmediate(() => {
        if (no === this.frameNo && !this.dead && this.state !== 'prefix') this.fail(`frame not completed within ${ms} ms`);
      });
    }, ms);
    this.timer.unref();
  }

  private stopTimer(): void {
    this.frameNo++;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  /** Bytes received but not yet parsed. */
  get buffered(): number {
    return this.avail;
  }

  private take(n: number): Buffer {
    const out = takeBytes(this.chunks, n);
    this.avail -= n;
    return out;
  }

  private fail(message: string): void {
    this.kill();
    this.handler.onProtocolError(message);
  }

  private run(): void {
    if (this.running) return; // re-entered from a handler: the outer loop continues
    this.running = true;
    try {
      for (;;) {
        if (this.dead) return;
        if (this.state === 'prefix') {
          if (this.paused || this.avail < PREFIX_BYTES) return;
          const p = this.take(PREFIX_BYTES);
          this.headerBytes = p.readUInt32LE(0);
          this.payloadBytes = p.readUInt32LE(4);
          if (this.headerBytes === 0 || this.headerBytes > this.maxHeader) return this.fail(`header of ${this.headerBytes} bytes (1..${this.maxHeader})`);
          if (this.payloadBytes > this.maxPayload) return this.fail(`payload of ${this.payloadBytes} bytes (at most ${this.maxPayload})`);
          this.state = 'header';
          this.startTimer();
        }
        if (this.state === 'header') {
          if (this.avail < this.headerBytes) return;
          const h = decodeHeader(this.take(this.headerBytes), this.payloadBytes);
          if (typeof h === 'string') return this.fail(h);
          this.sink = this.handler.onHeader(h, this.payloadBytes);
          if (this.dead) return;
          this.payloadLeft = this.payloadBytes;
          this.state = 'payload';
        }
        // payload
        while (this.payloadLeft > 0 && this.avail > 0) {
          const c = this.chunks[0]!;
          const k = Math.min(c.length, this.payloadLeft);
          const piece = k === c.length ? c : c.subarray(0, k);
          if (k === c.length) this.chunks.shift();
          else this.chunks[0] = c.subarray(k);
          this.avail -= k;
          this.payloadLeft -= k;
          this.sink?.write(piece);
          if (this.dead) return;
        }
        if (this.payloadLeft > 0) return;
        const s = this.sink;
        this.sink = null;
        this.lastPayload = this.payloadBytes;
        this.state = 'prefix';
        this.stopTimer();
        s?.end();
      }
    } finally {
      this.running = false;
    }
  }
}

/**
 * Removes the first `n` bytes from a queue of received chunks and returns them as one buffer: a
 * view when they lie in the first chunk, else one copy. The queue must hold at least `n` bytes.
 * Shared by the frame readers of the embedded agent and the NIXL side channel, so that received
 * bytes are copied at most once.
 */
export function takeBytes(chunks: Buffer[], n: number): Buffer {
  const first = chunks[0]!;
  if (first.length >= n) {
    if (first.length === n) chunks.shift();
    else chunks[0] = first.subarray(n);
    return first.subarray(0, n);
  }
  const out = Buffer.allocUnsafe(n);
  let off = 0;
  while (off < n) {
    const c = chunks[0]!;
    const k = Math.min(c.length, n - off);
    c.copy(out, off, 0, k);
    off += k;
    if (k === c.length) chunks.shift();
    else chunks[0] = c.subarray(k);
  }
  return out;
}

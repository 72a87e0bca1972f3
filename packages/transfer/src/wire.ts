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
 * initiator to target
 * - `[HELLO, 1, name, secret]`: first frame; `secret` (bin, 32 bytes) must equal the target's.
 * - `[READ, id, segs]`: `segs` is a flat array `[addr0, len0, addr1, len1, ...]` of target
 *   memory; answered by one `RDATA` (payload: the bytes, in order) or `ERR`.
 * - `[WRITE, id, segs]` + payload (the bytes for the segments, in order); answered by `WACK` once
 *   the bytes are in the target's memory, or by `ERR`.
 * - `[NOTIF]` + payload (the notif bytes, at most {@link MAX_NOTIF_BYTES}).
 *
 * target to initiator
 * - `[OK, name]`: the hello was accepted. `[RDATA, id]` + payload. `[WACK, id]`.
 * - `[ERR, id, kind, message]`: frame `id` was refused (kind: a TransferErrorKind).
 * - `[FATAL, kind, message]`: the connection is about to close.
 *
 * Ids are the initiator's, unsigned 32-bit. Every field is checked by {@link decodeHeader};
 * anything else is a protocol error that closes the connection.
 * @module
 */
import { Packr, Unpackr } from 'msgpackr';

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
} as const;

/** Protocol version carried by HELLO. */
export const WIRE_VERSION = 1;
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
  | { readonly t: typeof F.HELLO; readonly name: string; readonly secret: Uint8Array }
  | { readonly t: typeof F.READ | typeof F.WRITE; readonly id: number; readonly segs: readonly number[]; readonly bytes: number }
  | { readonly t: typeof F.NOTIF }
  | { readonly t: typeof F.OK; readonly name: string }
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
    case F.HELLO: {
      if (v.length !== 4 || v[1] !== WIRE_VERSION) return `HELLO must be [0, ${WIRE_VERSION}, name, secret]`;
      if (!isText(v[2], MAX_NAME_LENGTH) || v[2].length === 0) return 'HELLO: bad agent name';
      if (!(v[3] instanceof Uint8Array) || v[3].length !== SECRET_BYTES) return `HELLO: secret must be ${SECRET_BYTES} bytes`;
      return noPayload({ t, name: v[2], secret: v[3] });
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
      if (v.length !== 2 || !isText(v[1], MAX_NAME_LENGTH)) return 'OK must be [10, name]';
      return noPayload({ t, name: v[1] });
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
}

/** What the reader calls: a header (return a sink for its payload, or null to drop the payload), or a protocol error. */
export interface FrameHandler {
  onHeader(header: Header, payloadBytes: number): PayloadSink | null;
  onProtocolError(message: string): void;
}

/**
 * Incremental frame parser over socket chunks. Payload bytes are handed to the sink without
 * being buffered (one copy: socket buffer to the sink's destination). `pause()` stops parsing
 * at the next frame boundary (backpressure); `resume()` continues. After a protocol error it
 * ignores all further input.
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

  constructor(private readonly handler: FrameHandler) {}

  /** Adds received bytes and parses what it can. */
  push(chunk: Buffer): void {
    if (this.dead) return;
    this.chunks.push(chunk);
    this.avail += chunk.length;
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
  }

  /** Bytes received but not yet parsed. */
  get buffered(): number {
    return this.avail;
  }

  private take(n: number): Buffer {
    const first = this.chunks[0]!;
    let out: Buffer;
    if (first.length === n) {
      this.chunks.shift();
      out = first;
    } else if (first.length > n) {
      out = first.subarray(0, n);
      this.chunks[0] = first.subarray(n);
    } else {
      out = Buffer.allocUnsafe(n);
      let off = 0;
      while (off < n) {
        const c = this.chunks[0]!;
        const k = Math.min(c.length, n - off);
        c.copy(out, off, 0, k);
        off += k;
        if (k === c.length) this.chunks.shift();
        else this.chunks[0] = c.subarray(k);
      }
    }
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
          if (this.headerBytes === 0 || this.headerBytes > MAX_HEADER_BYTES) return this.fail(`header of ${this.headerBytes} bytes (1..${MAX_HEADER_BYTES})`);
          if (this.payloadBytes > MAX_PAYLOAD_BYTES) return this.fail(`payload of ${this.payloadBytes} bytes (at most ${MAX_PAYLOAD_BYTES})`);
          this.state = 'header';
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
        this.state = 'prefix';
        s?.end();
      }
    } finally {
      this.running = false;
    }
  }
}

/**
 * What crosses between the engine process and its worker processes, and how: the plain-data rule
 * of the connector contract (`PlainData` in packages/core/src/connector.ts), checked by
 * {@link assertPlainData}, and one serializer for every message, msgpackr with its structured
 * clone extension (`Packr({ structuredClone: true, mapsAsObjects: false })`: `Map`, `Set`, typed
 * arrays, `bigint` and plain objects survive, as records), framed on a byte stream by a length and a message id
 * ({@link frame}, {@link FrameDecoder}).
 *
 * The in-process executor sends every value that crosses between a connector's halves through
 * the same round trip ({@link roundTrip}), so that a unit test with workers in the engine's process
 * fails the same way worker processes would on data that is not plain.
 *
 * Known loss: msgpack has no negative zero for a plain number (`-0` arrives as `0`); typed arrays
 * keep it. Nothing in the contract depends on it.
 * @module
 */
import { Packr, Unpackr } from 'msgpackr';

/** Raised for a value that is not plain data ({@link assertPlainData}); `path` names where it is. */
export class NotPlainDataError extends TypeError {
  constructor(
    readonly path: string,
    what: string,
  ) {
    super(`${path}: not plain data (${what}); only null, booleans, numbers, bigints, strings, typed arrays, arrays, plain objects, Map and Set cross between processes`);
    this.name = 'NotPlainDataError';
  }
}

/** Raised when a frame is malformed or larger than {@link MAX_FRAME_BYTES}. */
export class FrameError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'FrameError';
  }
}

/** The largest frame a {@link FrameDecoder} accepts (1 GiB). */
export const MAX_FRAME_BYTES = 1 << 30;

function describe(v: unknown): string {
  if (typeof v === 'function') return `a function${v.name ? ` ${v.name}` : ''}`;
  if (typeof v === 'symbol') return 'a symbol';
  const c = (v as object).constructor;
  return `an instance of ${typeof c === 'function' && c.name ? c.name : 'a class'}`;
}

/** A Map key as a path names it: JSON where it has one, else `String(k)` (a bigint inside a key, a cycle, undefined). */
function keyText(k: unknown): string {
  try {
    return JSON.stringify(typeof k === 'bigint' ? String(k) : k) ?? String(k);
  } catch {
    return String(k);
  }
}

/**
 * Checks that `value` is plain data (connector.ts `PlainData`): `undefined`, `null`, booleans,
 * numbers, bigints, strings, `ArrayBuffer` views (typed arrays, `Buffer`), arrays, objects whose
 * prototype is `Object.prototype` or null, `Map` and `Set`, nested. Cycles are rejected too.
 * @param path names the value in the error (e.g. `kvConnectorMetadata`).
 * @throws NotPlainDataError naming the first offending path (`meta.loads[0].agent: an instance of Agent`).
 */
export function assertPlainData(value: unknown, path: string): void {
  const seen = new Set<object>();
  const walk = (v: unknown, p: string): void => {
    if (v === null || v === undefined) return;
    const t = typeof v;
    if (t === 'boolean' || t === 'number' || t === 'bigint' || t === 'string') return;
    if (t !== 'object') throw new NotPlainDataError(p, describe(v));
    if (ArrayBuffer.isView(v)) return;
    const o = v as object;
    if (seen.has(o)) throw new NotPlainDataError(p, 'a cycle');
    seen.add(o);
    if (Array.isArray(o)) o.forEach((x, i) => walk(x, `${p}[${i}]`));
    else if (o instanceof Map) for (const [k, x] of o) {
      walk(k, `${p}.<key>`);
      walk(x, `${p}.get(${keyText(k)})`);
    }
    else if (o instanceof Set) for (const x of o) walk(x, `${p}.<element>`);
    else {
      const proto = Object.getPrototypeOf(o) as unknown;
      if (proto !== Object.prototype && proto !== null) throw new NotPlainDataError(p, describe(o));
      for (const [k, x] of Object.entries(o)) walk(x, `${p}.${k}`);
    }
    seen.delete(o);
  };
  walk(value, path);
}

const OPTIONS = { structuredClone: true, mapsAsObjects: false, moreTypes: true } as const;
const packr = new Packr(OPTIONS);
const unpackr = new Unpackr(OPTIONS);

/** A key of a fixed shape (a field name), not data used as a key (request ids, block numbers). */
const FIELD_NAME = /^[A-Za-z_$][A-Za-z0-9_$]*$/;
/** Most shapes {@link roundTrip} keeps between messages (msgpackr allows 8160). */
export const ROUND_TRIP_SHARED_SHAPES = 256;
/**
 * {@link roundTrip}'s codec: the same options, plus record shapes shared between messages. Its
 * bytes never leave the process, so a shape is written once and later messages refer to it,
 * instead of every message defining every shape it holds again (msgpackr's default without
 * shared structures). Decoding a fresh definition was most of a round trip's cost: on the 2-core
 * VM, a worker output carrying a checksum report took 95 us per round trip with per-message
 * definitions and 21 us with shared ones (bench/e2e-README.md). Only shapes whose keys are all
 * field names are shared (objects keyed by request id or block number stay per message), at most
 * {@link ROUND_TRIP_SHARED_SHAPES}; further shapes are defined per message, as before.
 */
const inProcess = new Packr({ ...OPTIONS, structures: [], maxSharedStructures: ROUND_TRIP_SHARED_SHAPES, shouldShareStructure: (keys: string[]) => keys.every((k) => FIELD_NAME.test(k)) });

/** Encodes one message (msgpackr, structured clone). The caller checks plainness where it matters. */
export function encodeMessage(value: unknown): Uint8Array {
  return packr.pack(value);
}

/** Decodes one message made by {@link encodeMessage}. */
export function decodeMessage(bytes: Uint8Array): unknown {
  return unpackr.unpack(bytes);
}

/**
 * Checks `value` ({@link assertPlainData}) and returns its copy through the IPC serializer: what the
 * other process would receive (the same msgpackr options as {@link encodeMessage}; record shapes
 * are shared between round trips, which changes the bytes, not the value).
 * @throws NotPlainDataError
 */
export function roundTrip<T>(value: T, path: string): T {
  assertPlainData(value, path);
  return inProcess.unpack(inProcess.pack(value)) as T;
}

/**
 * One frame: a 4-byte little-endian length `n`, a 4-byte little-endian message id, then `n - 4`
 * bytes of body (an {@link encodeMessage} result). The id lets one encoded body go to several
 * workers and pairs a reply with its request.
 */
export function frame(id: number, body: Uint8Array): Buffer {
  const b = Buffer.allocUnsafe(8 + body.length);
  b.writeUInt32LE(body.length + 4, 0);
  b.writeUInt32LE(id >>> 0, 4);
  b.set(body, 8);
  return b;
}

/** A decoded {@link frame}. */
export interface Frame {
  id: number;
  body: Buffer;
}

/** Splits a byte stream into {@link frame}s (chunks may cut frames anywhere). */
export class FrameDecoder {
  private buf: Buffer = Buffer.alloc(0);

  /**
   * Adds `chunk` and returns the frames it completed, in order.
   * @throws FrameError for a length under 4 or over {@link MAX_FRAME_BYTES}.
   */
  push(chunk: Buffer): Frame[] {
    this.buf = this.buf.length === 0 ? chunk : Buffer.concat([this.buf, chunk]);
    const out: Frame[] = [];
    while (this.buf.length >= 4) {
      const n = this.buf.readUInt32LE(0);
      if (n < 4 || n > MAX_FRAME_BYTES) throw new FrameError(`frame length ${n} is outside [4, ${MAX_FRAME_BYTES}]`);
      if (this.buf.length < 4 + n) break;
      out.push({ id: this.buf.readUInt32LE(4), body: this.buf.subarray(8, 4 + n) });
      this.buf = this.buf.subarray(4 + n);
    }
    return out;
  }
}

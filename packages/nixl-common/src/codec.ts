/**
 * Strict MessagePack helpers shared by every decoder of this package (side-channel messages,
 * handshake info, push registrations, notifs). Every decoder checks types, ranges and sizes and
 * throws {@link NixlDecodeError} (never anything else) for bytes a peer got wrong.
 * @module
 */
import { Packr, Unpackr } from 'msgpackr';

/** The MessagePack encoder (arrays and plain values only; no records). */
export const packr = new Packr({ useRecords: false, variableMapSize: true });
/** The MessagePack decoder; 64-bit integers decode to numbers (unsafe ones are then rejected). */
export const unpackr = new Unpackr({ useRecords: false, int64AsType: 'number' });

/** Bytes or a message from a peer that does not decode. `reason` says what is wrong and where. */
export class NixlDecodeError extends Error {
  override readonly name: string = 'NixlDecodeError';
  constructor(readonly reason: string) {
    super(reason);
  }
}

/** Throws a {@link NixlDecodeError}. */
export function fail(reason: string): never {
  throw new NixlDecodeError(reason);
}

/** Unpacks `bytes` (at most `maxBytes`), rejecting trailing bytes and undecodable input. */
export function unpackStrict(bytes: Uint8Array, maxBytes: number, what: string): unknown {
  if (!(bytes instanceof Uint8Array)) fail(`${what}: not bytes`);
  if (bytes.byteLength > maxBytes) fail(`${what}: ${bytes.byteLength} bytes, more than ${maxBytes}`);
  if (bytes.byteLength === 0) fail(`${what}: empty`);
  try {
    return unpackr.unpack(bytes);
  } catch (e) {
    return fail(`${what}: undecodable MessagePack (${e instanceof Error ? e.message : String(e)})`);
  }
}

/** A safe non-negative integer `<= max`. */
export function nat(x: unknown, what: string, max = Number.MAX_SAFE_INTEGER): number {
  if (typeof x !== 'number' || !Number.isSafeInteger(x) || x < 0 || x > max) fail(`${what}: expected an integer in 0..${max}`);
  return x;
}

/** A safe integer `>= 1` and `<= max`. */
export function pos(x: unknown, what: string, max = Number.MAX_SAFE_INTEGER): number {
  const v = nat(x, what, max);
  if (v < 1) fail(`${what}: expected an integer >= 1`);
  return v;
}

/** A string of `min..max` UTF-16 code units. */
export function str(x: unknown, what: string, max: number, min = 1): string {
  if (typeof x !== 'string' || x.length < min || x.length > max) fail(`${what}: expected a string of ${min}..${max} characters`);
  return x;
}

/** A bin of at most `max` bytes, copied (decoded bins may view the frame). */
export function bin(x: unknown, what: string, max: number): Uint8Array {
  if (!(x instanceof Uint8Array) || x.byteLength > max) fail(`${what}: expected bytes (at most ${max})`);
  return new Uint8Array(x);
}

/** An array of `min..max` elements. */
export function arr(x: unknown, what: string, max: number, min = 0): unknown[] {
  if (!Array.isArray(x) || x.length < min || x.length > max) fail(`${what}: expected an array of ${min}..${max} elements`);
  return x;
}

/** A boolean. */
export function bool(x: unknown, what: string): boolean {
  if (typeof x !== 'boolean') fail(`${what}: expected a boolean`);
  return x;
}

/** One of `values`. */
export function oneOf<T extends string>(x: unknown, what: string, values: readonly T[]): T {
  if (typeof x !== 'string' || !(values as readonly string[]).includes(x)) fail(`${what}: expected one of ${values.join(', ')}`);
  return x as T;
}

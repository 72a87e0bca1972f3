/**
 * Strict MessagePack helpers shared by every decoder of this package (side-channel messages,
 * handshake info, push registrations, notifs). Every decoder checks types, ranges and sizes and
 * throws {@link NixlDecodeError} (never anything else) for bytes a peer got wrong. The field
 * helpers are `@kvconnect/transfer`'s `strictDecoders` (`strict-decode.ts`), shared with the
 * Mooncake side channel.
 * @module
 */
import { strictDecoders } from '@kvconnect/transfer';
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

const fields = strictDecoders((path, detail) => fail(`${path}: ${detail}`));

/**
 * The field helpers: `@kvconnect/transfer`'s {@link strictDecoders} (the one set the Mooncake side
 * channel uses too), throwing {@link NixlDecodeError} `"<what>: <detail>"`.
 * - `nat(x, what, max?)`: a safe integer in `0..max`; `pos`: in `1..max`;
 * - `str(x, what, max, min = 1)`: a string of `min..max` code units;
 * - `bin(x, what, max)`: a bin of at most `max` bytes, copied (decoded bins may view the frame);
 * - `arr(x, what, max, min = 0)`: an array of `min..max` elements;
 * - `bool(x, what)`; `oneOf(x, what, values)`: one of the strings `values`.
 */
export const { nat, pos, str, bin, arr, bool, oneOf } = fields;

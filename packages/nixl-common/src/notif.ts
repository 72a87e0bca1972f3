/**
 * Notif codec (SPEC 7). A notif is bytes delivered to the remote agent after the data of the
 * transfer it rides on has landed.
 *
 * - Push completion notif (producer -> consumer, on the WRITE that delivers the KV):
 *   - with checksums: ASCII `KV_CHECKSUM:` then MessagePack
 *     `[remoteRequestId (str), producerTpSize (uint), payload (bin)]`;
 *   - without: the plain UTF-8 form `remoteRequestId:producerTpSize`.
 * - Pull read-done notif (consumer -> producer, on the consumer rank's last READ): the plain
 *   form `remoteRequestId:consumerWorldSize` (the producer frees once every consumer rank read).
 *
 * One strict decoder for both forms: {@link decodeNotif}; anything else throws
 * {@link NixlDecodeError}.
 * @module
 */
import { arr, fail, nat, packr, pos, str, unpackStrict } from './codec.js';
import { LIMITS } from './protocol.js';

/** Prefix of the checksum-carrying notif form. */
export const KV_CHECKSUM_NOTIF_PREFIX = 'KV_CHECKSUM:';
const PREFIX = new TextEncoder().encode(KV_CHECKSUM_NOTIF_PREFIX);
/** Largest accepted notif: a SPEC 6 payload (16 MiB) plus the envelope. */
export const MAX_NOTIF_BYTES = 16 * 1024 * 1024 + 64 * 1024;
const utf8 = new TextDecoder('utf-8', { fatal: true });

/** A decoded notif. `payload` is null for the plain form. */
export interface Notif {
  readonly remoteRequestId: string;
  /** Push: the producer's TP size; pull read-done: the consumer's world size (TP x PP). */
  readonly size: number;
  readonly payload: Uint8Array | null;
}

/** Encodes a notif: the checksum form when `payload` is given, else the plain form. */
export function encodeNotif(remoteRequestId: string, size: number, payload?: Uint8Array | null): Uint8Array {
  if (!payload) return new TextEncoder().encode(`${remoteRequestId}:${size}`);
  const body = packr.pack([remoteRequestId, size, payload]);
  const out = new Uint8Array(PREFIX.length + body.length);
  out.set(PREFIX, 0);
  out.set(body, PREFIX.length);
  return out;
}

function hasPrefix(b: Uint8Array): boolean {
  if (b.length < PREFIX.length) return false;
  for (let i = 0; i < PREFIX.length; i++) if (b[i] !== PREFIX[i]) return false;
  return true;
}

/**
 * Decodes either notif form.
 * @throws NixlDecodeError for anything else: too large, bad UTF-8, no `:size` suffix, a size that
 *   is not a positive decimal, an empty id, an undecodable or wrongly shaped MessagePack body,
 *   trailing bytes.
 */
export function decodeNotif(bytes: Uint8Array): Notif {
  if (!(bytes instanceof Uint8Array)) fail('notif: not bytes');
  if (bytes.byteLength > MAX_NOTIF_BYTES) fail(`notif: ${bytes.byteLength} bytes, more than ${MAX_NOTIF_BYTES}`);
  if (hasPrefix(bytes)) {
    const a = arr(unpackStrict(bytes.subarray(PREFIX.length), MAX_NOTIF_BYTES, 'notif'), 'notif', 3, 3);
    const payload = a[2];
    if (!(payload instanceof Uint8Array)) fail('notif: payload must be bin');
    return { remoteRequestId: str(a[0], 'notif.remoteRequestId', LIMITS.idLength), size: pos(a[1], 'notif.size', LIMITS.ranks * LIMITS.ranks), payload: new Uint8Array(payload) };
  }
  if (bytes.byteLength > LIMITS.idLength * 3 + 32) fail('notif: plain form too long');
  let text: string;
  try {
    text = utf8.decode(bytes);
  } catch {
    return fail('notif: not UTF-8');
  }
  const k = text.lastIndexOf(':');
  if (k <= 0) fail('notif: expected remoteRequestId:size');
  const digits = text.slice(k + 1);
  if (!/^[1-9][0-9]{0,8}$/.test(digits)) fail('notif: size must be a positive decimal');
  const id = str(text.slice(0, k), 'notif.remoteRequestId', LIMITS.idLength);
  return { remoteRequestId: id, size: nat(Number(digits), 'notif.size'), payload: null };
}

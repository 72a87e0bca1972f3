/**
 * The lease capability of a producer's request: an unguessable secret that rides in
 * `kv_transfer_params.lease_capability` from the producer side (NIXL: the producer's returned
 * params; Mooncake: drawn by the P/D proxy with the `transfer_id`, `packages/engine/src/proxy.ts`)
 * through the trusted proxy to the consumer only, and that every side-channel message about the
 * request must carry (NIXL protocol 19, Mooncake protocol 6). The rule that checks it is
 * `@kvconnect/nixl-common` `consumer-binding.ts`; `docs/localize.md` ("Binding and budget") and
 * `docs/security.md` describe it. SPEC.md is silent on `kv_transfer_params` fields besides
 * `kv_checksums` (SPEC 7); this field is kvconnect's.
 *
 * Never log a capability or put it in a metric, `/health` or an error text.
 * @module
 */
import { randomBytes, timingSafeEqual } from 'node:crypto';

/** The `kv_transfer_params` field that carries a request's lease capability. */
export const LEASE_CAPABILITY_PARAM = 'lease_capability';
/** Characters of a lease capability: 64 lowercase hex digits (32 random bytes, 256 bits). */
export const LEASE_CAPABILITY_CHARS = 64;

/** `chars` (even) lowercase hex digits of `crypto.randomBytes`: lease capabilities, consumer keys. */
export function randomHexToken(chars: number): string {
  return randomBytes(chars / 2).toString('hex');
}

/** Whether `x` is a string of exactly `chars` lowercase hex digits. */
export function isHexToken(x: unknown, chars: number): x is string {
  return typeof x === 'string' && x.length === chars && /^[0-9a-f]*$/.test(x);
}

/** A fresh lease capability: {@link LEASE_CAPABILITY_CHARS} hex digits of `crypto.randomBytes`. */
export function newLeaseCapability(): string {
  return randomHexToken(LEASE_CAPABILITY_CHARS);
}

/** Whether `x` is a well-formed lease capability (what the decoders and the params checks accept). */
export function isLeaseCapability(x: unknown): x is string {
  return isHexToken(x, LEASE_CAPABILITY_CHARS);
}

/**
 * Whether `given` is the capability `expected`, compared in constant time
 * (`crypto.timingSafeEqual`); a value of another length, null or undefined is not.
 */
export function sameCapability(expected: string, given: string | null | undefined): boolean {
  if (typeof given !== 'string' || given.length !== expected.length) return false;
  // UTF-16 code units, not latin1: latin1 keeps only each unit's low byte, so a string that is
  // not `expected` (e.g. U+0161 for 'a') would compare equal.
  return timingSafeEqual(Buffer.from(expected, 'utf16le'), Buffer.from(given, 'utf16le'));
}

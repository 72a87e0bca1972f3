/**
 * Loads the shared conformance vectors from ../shared/vectors (never copied into the repo).
 * Throws (failing the test) when the file is missing.
 */
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

export const VECTORS_PATH = fileURLToPath(new URL('../../../../shared/vectors/checksum-v1.json', import.meta.url));
/** Payload version 2 and identity vectors (SPEC 6.1, 8.0). */
export const IDENTITY_VECTORS_PATH = fileURLToPath(new URL('../../../../shared/vectors/identity-v2.json', import.meta.url));

// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Json = any;

let cache: Json | null = null;

/** The parsed vectors file. */
export function loadVectors(): Json {
  cache ??= JSON.parse(readFileSync(VECTORS_PATH, 'utf8'));
  return cache;
}

/** The parsed identity-v2.json (read on every call; it is small). */
export function loadIdentityVectors(): Json {
  return JSON.parse(readFileSync(IDENTITY_VECTORS_PATH, 'utf8'));
}

/** Base64 to a fresh, 8-aligned Uint8Array. */
export function b64(s: string): Uint8Array {
  const b = Buffer.from(s, 'base64');
  const out = new Uint8Array(b.length);
  out.set(b);
  return out;
}

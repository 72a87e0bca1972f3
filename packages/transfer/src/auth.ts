/**
 * The cluster secret and the proofs built from it: the one authentication model every kvconnect
 * peer exchange uses (NIXL side channel, Mooncake bootstrap and side channel, embedded agent).
 * `docs/security.md` describes the model; this module is its only implementation.
 *
 * - The **cluster secret** is a byte string every engine of one deployment knows. It comes from a
 *   config key (`cluster_secret` in `kv_connector_extra_config`) or the environment variable
 *   {@link CLUSTER_SECRET_ENV}. It never crosses the wire: peers prove knowledge of it with
 *   HMAC-SHA256 over a context string, fresh nonces and the message they authenticate.
 * - A **proof** is `HMAC-SHA256(secret, "kvconnect-auth-v1" 0x00 context 0x00 len(p1) p1 len(p2) p2 ...)`
 *   with each length a uint32 big-endian, so no two part lists encode the same bytes.
 * - Safe default: a listener binds to loopback unless a host is configured, and a non-loopback bind
 *   without a cluster secret is refused ({@link checkBindHost}).
 * @module
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { isIP } from 'node:net';
import { TransferError } from './errors.js';

/** Environment variable that holds the cluster secret (UTF-8 text, at least 16 bytes). */
export const CLUSTER_SECRET_ENV = 'KVCONNECT_CLUSTER_SECRET';

/** Fewest bytes a cluster secret may have. */
export const MIN_CLUSTER_SECRET_BYTES = 16;

/** Bytes of a nonce ({@link makeNonce}). */
export const NONCE_BYTES = 16;

/** Bytes of a proof (HMAC-SHA256). */
export const PROOF_BYTES = 32;

const DOMAIN = Buffer.from('kvconnect-auth-v1\0', 'latin1');

/** A cluster secret that is missing where required, too short, or of the wrong type. */
export class ClusterSecretError extends TransferError {
  override readonly name: string = 'ClusterSecretError';
  constructor(message: string) {
    super('invalid', message);
  }
}

/**
 * The cluster secret from a config value (string or bytes) or else {@link CLUSTER_SECRET_ENV}.
 * @returns the secret's bytes, or null when neither is set (an empty string counts as unset).
 * @throws ClusterSecretError when the value is not a string/Uint8Array or is shorter than
 *   {@link MIN_CLUSTER_SECRET_BYTES}.
 */
export function resolveClusterSecret(configValue?: unknown, env: NodeJS.ProcessEnv = process.env): Buffer | null {
  let raw: unknown = configValue;
  let from = 'cluster_secret';
  if (raw === undefined || raw === null || raw === '') {
    raw = env[CLUSTER_SECRET_ENV];
    from = CLUSTER_SECRET_ENV;
  }
  if (raw === undefined || raw === null || raw === '') return null;
  let bytes: Buffer;
  if (typeof raw === 'string') bytes = Buffer.from(raw, 'utf8');
  else if (raw instanceof Uint8Array) bytes = Buffer.from(raw);
  else throw new ClusterSecretError(`${from} must be a string, got ${typeof raw}`);
  if (bytes.length < MIN_CLUSTER_SECRET_BYTES) throw new ClusterSecretError(`${from} must hold at least ${MIN_CLUSTER_SECRET_BYTES} bytes, got ${bytes.length}`);
  return bytes;
}

/** A fresh random secret for a deployment (hex text of 32 random bytes), e.g. for the demo. */
export function generateClusterSecret(): string {
  return randomBytes(32).toString('hex');
}

/** {@link NONCE_BYTES} random bytes. */
export function makeNonce(): Buffer {
  return randomBytes(NONCE_BYTES);
}

/**
 * The proof of knowledge of `secret` over `context` and `parts` (see the module comment for the
 * exact bytes). Strings are encoded as UTF-8.
 * @returns {@link PROOF_BYTES} bytes.
 */
export function makeProof(secret: Uint8Array, context: string, ...parts: readonly (Uint8Array | string)[]): Buffer {
  const h = createHmac('sha256', secret);
  h.update(DOMAIN);
  h.update(Buffer.from(context, 'utf8'));
  h.update(Buffer.from([0]));
  const len = Buffer.alloc(4);
  for (const p of parts) {
    const b = typeof p === 'string' ? Buffer.from(p, 'utf8') : p;
    len.writeUInt32BE(b.length, 0);
    h.update(len);
    h.update(b);
  }
  return h.digest();
}

/**
 * Whether `proof` is the proof of `secret` over `context` and `parts`, compared in constant time.
 * A proof of the wrong length, or not bytes at all, is false (never a throw).
 */
export function checkProof(proof: unknown, secret: Uint8Array, context: string, ...parts: readonly (Uint8Array | string)[]): boolean {
  if (!(proof instanceof Uint8Array) || proof.length !== PROOF_BYTES) return false;
  return timingSafeEqual(proof, makeProof(secret, context, ...parts));
}

/** True for `localhost`, `127.0.0.0/8`, `::1` (and `::ffff:127.x.y.z`). */
export function isLoopbackHost(host: string): boolean {
  const h = host.startsWith('[') && host.endsWith(']') ? host.slice(1, -1) : host;
  if (h === 'localhost') return true;
  const v = isIP(h);
  if (v === 4) return h.startsWith('127.');
  if (v === 6) return h === '::1' || /^::ffff:127\./i.test(h) || /^0{0,4}(:0{0,4}){6}:0{0,3}1$/.test(h);
  return false;
}

/** The host a listener binds to when none is configured. */
export const DEFAULT_BIND_HOST = '127.0.0.1';

/**
 * The safe-default bind rule: `host` (default {@link DEFAULT_BIND_HOST}) is returned when it is
 * loopback, or when a cluster secret is set.
 * @param what names the listener in the error (e.g. `"NIXL side channel"`).
 * @throws ClusterSecretError for a non-loopback host (including `0.0.0.0` / `::`) without a secret.
 */
export function checkBindHost(host: string | undefined, secret: Uint8Array | null, what: string): string {
  const h = host ?? DEFAULT_BIND_HOST;
  if (!isLoopbackHost(h) && secret === null) {
    throw new ClusterSecretError(`${what}: refusing to listen on non-loopback host ${h} without a cluster secret (set cluster_secret or ${CLUSTER_SECRET_ENV})`);
  }
  return h;
}

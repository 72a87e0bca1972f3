import { createHmac } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { checkBindHost, checkProof, ClusterSecretError, CLUSTER_SECRET_ENV, generateClusterSecret, isLoopbackHost, makeNonce, makeProof, resolveClusterSecret } from '../src/auth.js';

const secret = Buffer.from('0123456789abcdef0123456789abcdef');

describe('cluster secret', () => {
  it('comes from the config value first, else the environment, else null', () => {
    expect(resolveClusterSecret('a-config-secret-16b', { [CLUSTER_SECRET_ENV]: 'an-env-secret-of-16b' })?.toString()).toBe('a-config-secret-16b');
    expect(resolveClusterSecret(undefined, { [CLUSTER_SECRET_ENV]: 'an-env-secret-of-16b' })?.toString()).toBe('an-env-secret-of-16b');
    expect(resolveClusterSecret('', {})).toBeNull();
    expect(resolveClusterSecret(undefined, {})).toBeNull();
  });
  it('refuses short or non-string secrets with a typed error', () => {
    expect(() => resolveClusterSecret('short', {})).toThrow(ClusterSecretError);
    expect(() => resolveClusterSecret(undefined, { [CLUSTER_SECRET_ENV]: 'short' })).toThrow(/KVCONNECT_CLUSTER_SECRET/);
    expect(() => resolveClusterSecret(42, {})).toThrow(ClusterSecretError);
  });
  it('generates 64 hex characters', () => {
    expect(generateClusterSecret()).toMatch(/^[0-9a-f]{64}$/);
  });
});

describe('proofs', () => {
  it('are HMAC-SHA256 over the domain, the context and length-prefixed parts', () => {
    // Expected bytes built by hand from the definition in the module comment.
    const nonce = Buffer.from('00112233445566778899aabbccddeeff', 'hex');
    const h = createHmac('sha256', secret);
    h.update(Buffer.from('kvconnect-auth-v1\0nixl/info\0', 'latin1'));
    h.update(Buffer.from([0, 0, 0, 16]));
    h.update(nonce);
    h.update(Buffer.from([0, 0, 0, 3]));
    h.update(Buffer.from('abc'));
    expect(makeProof(secret, 'nixl/info', nonce, 'abc').toString('hex')).toBe(h.digest('hex'));
  });
  it('check in constant time and refuse anything else', () => {
    const n = makeNonce();
    const p = makeProof(secret, 'ctx', n);
    expect(checkProof(p, secret, 'ctx', n)).toBe(true);
    expect(checkProof(p, secret, 'other', n)).toBe(false);
    expect(checkProof(p, Buffer.from('another-secret-0123456789'), 'ctx', n)).toBe(false);
    expect(checkProof(p.subarray(0, 31), secret, 'ctx', n)).toBe(false);
    expect(checkProof('not bytes', secret, 'ctx', n)).toBe(false);
    // Length prefixes: moving a byte between parts changes the proof.
    expect(makeProof(secret, 'c', 'ab', 'c').equals(makeProof(secret, 'c', 'a', 'bc'))).toBe(false);
  });
});

describe('bind rule', () => {
  it('knows loopback hosts', () => {
    for (const h of ['localhost', '127.0.0.1', '127.1.2.3', '::1', '[::1]', '::ffff:127.0.0.1']) expect(isLoopbackHost(h)).toBe(true);
    for (const h of ['0.0.0.0', '::', '10.0.0.1', '192.168.1.2', 'example.com', '128.0.0.1']) expect(isLoopbackHost(h)).toBe(false);
  });
  it('defaults to loopback and refuses a non-loopback bind without a secret', () => {
    expect(checkBindHost(undefined, null, 'x')).toBe('127.0.0.1');
    expect(checkBindHost('127.0.0.1', null, 'x')).toBe('127.0.0.1');
    expect(() => checkBindHost('0.0.0.0', null, 'NIXL side channel')).toThrow(/NIXL side channel: refusing to listen on non-loopback host 0.0.0.0/);
    expect(checkBindHost('0.0.0.0', secret, 'x')).toBe('0.0.0.0');
  });
});

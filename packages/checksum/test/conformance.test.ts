/**
 * Conformance: every checksum case of ../shared/vectors (read from that path) on every available
 * backend, as producer (replica 0) and consumer (every replica); fingerprints; identity-v2.json
 * (token digest, payload version 2, SPEC 8.0 verification); and a check that the runner itself
 * reports a wrong expectation.
 */
import { describe, expect, it } from 'vitest';
import { tsBackend } from '../src/backend-ts.js';
import { loadNativeBackend, nativeUnavailableReason } from '../src/backend-native.js';
import { runVectors } from '../src/conformance.js';
import type { ChecksumBackend } from '../src/backend.js';
import { IDENTITY_VECTORS_PATH, loadIdentityVectors, loadVectors, VECTORS_PATH } from './vectors.js';

const native = loadNativeBackend();
const backends: ChecksumBackend[] = native ? [tsBackend, native] : [tsBackend];

describe(`conformance vectors (${VECTORS_PATH})`, () => {
  const vectors = loadVectors();
  const results = runVectors(vectors, backends);

  it('covers every section of the file', () => {
    const sections = new Set(results.map((r) => r.section));
    for (const s of ['attention', 'state', 'stateLocal', 'fingerprint', 'payload', 'payloadAccepts', 'payloadRejects', 'verification']) expect(sections).toContain(s);
    const perBackend = (vectors.attention.length + vectors.state.length + vectors.stateLocal.length) * 2;
    expect(results.filter((r) => r.backend === 'ts')).toHaveLength(perBackend);
  });

  it.skipIf(!native)(`every vector case also runs on the native backend${native ? '' : ` (skipped: native backend not loaded: ${nativeUnavailableReason()})`}`, () => {
    expect(results.filter((r) => r.backend === 'native')).toHaveLength(results.filter((r) => r.backend === 'ts').length);
  });

  for (const r of results) {
    it(`${r.section}: ${r.title}${r.backend ? ` [${r.backend}]` : ''}`, () => {
      expect(r.detail ?? 'ok').toBe('ok');
      expect(r.ok).toBe(true);
    });
  }

  it('reports a case whose expected value is wrong', () => {
    const bad = structuredClone(vectors);
    const v = bad.attention[0];
    v.ranks[0].partials['1:0'][0] = (BigInt(v.ranks[0].partials['1:0'][0]) ^ 1n).toString();
    bad.fingerprint[0].fp = '1';
    bad.verification[0].expected.verdict = 'mismatch';
    const r = runVectors({ attention: [v], fingerprint: [bad.fingerprint[0]], verification: [bad.verification[0]] }, [tsBackend]);
    expect(r.filter((x) => !x.ok).map((x) => x.section).sort()).toEqual(['attention', 'attention', 'fingerprint', 'verification']);
  });
});

describe(`identity vectors (${IDENTITY_VECTORS_PATH})`, () => {
  const vectors = loadIdentityVectors();
  const results = runVectors(vectors, backends);

  it('covers every section of the file', () => {
    expect(new Set(results.map((r) => r.section))).toEqual(new Set(['tokenDigest', 'payloadV2', 'payloadV2Rejects', 'verificationV2']));
    const n = vectors.tokenDigest.length + vectors.payloadV2.length + vectors.payloadV2Rejects.length + vectors.verificationV2.length;
    expect(results).toHaveLength(n);
    expect(vectors.verificationV2.some((c: { expected: { wrongRequest: boolean } }) => c.expected.wrongRequest)).toBe(true);
  });

  for (const r of results) {
    it(`${r.section}: ${r.title}`, () => {
      expect(r.detail ?? 'ok').toBe('ok');
      expect(r.ok).toBe(true);
    });
  }

  it('reports a case whose expected value is wrong', () => {
    const bad = structuredClone(vectors);
    bad.tokenDigest[1].digest = (BigInt(bad.tokenDigest[1].digest) ^ 1n).toString();
    const wrongRequest = bad.verificationV2.find((c: { expected: { wrongRequest: boolean } }) => c.expected.wrongRequest);
    wrongRequest.expected.wrongRequest = false;
    const v1 = bad.verificationV2.find((c: { payload: { version?: number } }) => c.payload?.version === 1);
    v1.payload.version = 2; // a v1 payload claimed as v2 (no digest): must not pass as it did
    bad.payloadV2[0].hex = bad.payloadV2[0].hex.replace(/^9202/, '9201');
    const r = runVectors({ tokenDigest: [bad.tokenDigest[1]], verificationV2: [wrongRequest, v1], payloadV2: [bad.payloadV2[0]] }, [tsBackend]);
    expect(r.filter((x) => !x.ok).map((x) => x.section).sort()).toEqual(['payloadV2', 'tokenDigest', 'verificationV2', 'verificationV2']);
  });
});

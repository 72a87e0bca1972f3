/** The kvconnect-checksum CLI: verify-vectors and decode-payload, through `main`. */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { main } from '../src/cli.js';
import { IDENTITY_VECTORS_PATH, loadIdentityVectors, loadVectors, VECTORS_PATH } from './vectors.js';

async function run(args: string[]) {
  const out: string[] = [];
  const err: string[] = [];
  const code = await main(args, (s) => out.push(s), (s) => err.push(s));
  return { code, out, err };
}

describe('kvconnect-checksum', () => {
  it('verify-vectors passes the shared vectors, one line per case and a closing count', async () => {
    const r = await run(['verify-vectors', VECTORS_PATH]);
    const last = r.out[r.out.length - 1];
    expect(last).toMatch(/^\d+ passed, 0 failed$/);
    expect(Number(last.split(' ')[0])).toBe(r.out.length - 1);
    expect(r.code).toBe(0);
  });

  it('verify-vectors passes identity-v2.json (SPEC 6.1, 8.0) with a closing " 0 failed"', async () => {
    const r = await run(['verify-vectors', IDENTITY_VECTORS_PATH]);
    const last = r.out[r.out.length - 1];
    expect(last).toMatch(/^\d+ passed, 0 failed$/);
    expect(r.out.filter((l) => l.startsWith('ok   verificationV2:')).length).toBe(loadIdentityVectors().verificationV2.length);
    expect(r.code).toBe(0);
  });

  it('decode-payload prints a version-2 payload with its version and token digest', async () => {
    const p = loadIdentityVectors().payloadV2[0];
    for (const data of [p.hex, p.base64]) {
      const r = await run(['decode-payload', data]);
      expect(r.code).toBe(0);
      const j = JSON.parse(r.out.join('\n'));
      expect([j.version, j.numTokens, j.producerTpSize, j.tokenDigest]).toEqual([2, p.numTokens, p.producerTpSize, p.tokenDigest]);
    }
    const v1 = JSON.parse((await run(['decode-payload', loadVectors().payload[1].hex])).out.join('\n'));
    expect(v1.version).toBe(1);
    expect('tokenDigest' in v1).toBe(false);
  });

  it('verify-vectors exits non-zero and names the case when a vector is wrong', async () => {
    const v = structuredClone(loadVectors());
    v.fingerprint[1].fp = '42';
    const dir = mkdtempSync(join(tmpdir(), 'kvc-cli-'));
    const file = join(dir, 'bad.json');
    writeFileSync(file, JSON.stringify(v));
    const r = await run(['verify-vectors', file]);
    expect(r.code).toBe(1);
    expect(r.out.filter((l) => l.startsWith('FAIL'))).toEqual([expect.stringContaining(v.fingerprint[1].identityText)]);
    expect(r.out[r.out.length - 1]).toMatch(/ 1 failed$/);
  });

  it('decode-payload prints hex and base64 payloads as JSON with uint64 strings', async () => {
    const p = loadVectors().payload[1];
    for (const data of [p.hex, p.base64]) {
      const r = await run(['decode-payload', data]);
      expect(r.code).toBe(0);
      const j = JSON.parse(r.out.join('\n'));
      expect(j.numTokens).toBe(p.numTokens);
      expect(j.groups.map((g: { fingerprint: string; values: string[] }) => [g.fingerprint, g.values])).toEqual(p.groups.map((g: { fingerprint: string; values: string[] }) => [g.fingerprint, g.values]));
    }
  });

  it('decode-payload reports a rejected payload as PayloadError with exit 1', async () => {
    for (const data of ['920193ff0190', 'not base64!', '92']) {
      const r = await run(['decode-payload', data]);
      expect(r.code).toBe(1);
      expect(r.err.join('\n')).toMatch(/^PayloadError: /);
    }
  });

  it('unknown commands exit 2', async () => {
    expect((await run(['bogus'])).code).toBe(2);
  });
});

describe('kvconnect-checksum input checks', () => {
  it('decode-payload applies the carrier’s strict base64 (non-zero padding bits are refused)', async () => {
    const r = await run(['decode-payload', 'kgGTzIABkB==']);
    expect(r.code).toBe(1);
    expect(r.err.join('\n')).toMatch(/PayloadError: .*base64/);
  });

  it('verify-vectors explains a file that is not a vectors file', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvc-cli-'));
    for (const [name, text, msg] of [
      ['null.json', 'null', /JSON object/],
      ['empty.json', '{}', /no vector sections/],
      ['bad.json', '{', /JSON/],
    ] as const) {
      writeFileSync(join(dir, name), text);
      const r = await run(['verify-vectors', join(dir, name)]);
      expect(r.code).toBe(1);
      expect(r.err.join('\n')).toMatch(msg);
    }
  });
});

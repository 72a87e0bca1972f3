/**
 * `kvconnect-checksum`: the checksum package's command line.
 * - `verify-vectors FILE`: runs a vectors file through every available backend; one line per
 *   case, a last line `N passed, N failed`; exit 1 on any failure.
 * - `decode-payload DATA`: decodes a payload (version 1 or 2) given as hex or base64 (SPEC 6, 6.1)
 *   and prints it as JSON (`version`, `tokenDigest` for version 2; uint64 as decimal strings); a
 *   bad payload prints `PayloadError: reason` and exits 1.
 * @module
 */
import { readFileSync } from 'node:fs';
import { Command, CommanderError } from 'commander';
import type { ChecksumBackend } from './backend.js';
import { tsBackend } from './backend-ts.js';
import { loadNativeBackend, nativeUnavailableReason } from './backend-native.js';
import { runVectors } from './conformance.js';
import { decodePayload, decodePayloadBase64, PayloadError } from './payload.js';
import type { ChecksumPayload } from './types.js';

/** The backends this process can run: ts always, native when the addon loads. */
export function availableBackends(): { backends: ChecksumBackend[]; notes: string[] } {
  const native = loadNativeBackend();
  return native ? { backends: [tsBackend, native], notes: [] } : { backends: [tsBackend], notes: [`native backend not available: ${nativeUnavailableReason()}`] };
}

/**
 * Decodes payload text: hex (even length, [0-9a-fA-F]) or the NIXL pull carrier's strict
 * standard base64 (SPEC 7), so the CLI accepts exactly what a consumer accepts.
 * @throws PayloadError for text that is neither, or a payload the decoder rejects.
 */
export function decodePayloadText(data: string): ChecksumPayload {
  const s = data.trim();
  if (/^([0-9a-fA-F]{2})+$/.test(s)) return decodePayload(new Uint8Array(Buffer.from(s, 'hex')));
  return decodePayloadBase64(s);
}

/** JSON text of a decoded payload with uint64 as decimal strings (`tokenDigest` for version 2 only). */
function payloadJson(p: ChecksumPayload): string {
  return JSON.stringify(
    {
      version: p.version,
      numTokens: p.numTokens,
      producerTpSize: p.producerTpSize,
      ...(p.tokenDigest !== undefined ? { tokenDigest: p.tokenDigest.toString() } : {}),
      groups: p.groups.map((g) => ({ ...g, fingerprint: g.fingerprint.toString(), values: Array.from(g.values, String) })),
    },
    null,
    2,
  );
}

/** Sections a vectors file may hold (../shared/vectors/README.md). */
const VECTOR_SECTIONS = [
  'attention',
  'state',
  'stateLocal',
  'fingerprint',
  'payload',
  'payloadAccepts',
  'payloadRejects',
  'verification',
  // identity-v2.json (SPEC 6.1, 8.0)
  'tokenDigest',
  'payloadV2',
  'payloadV2Rejects',
  'verificationV2',
];

/** Reads a vectors file. @throws Error naming the problem (unreadable, not JSON, no known section). */
function readVectors(file: string): unknown {
  const v = JSON.parse(readFileSync(file, 'utf8'));
  if (v === null || typeof v !== 'object' || Array.isArray(v)) throw new Error(`${file}: a vectors file is a JSON object`);
  const present = VECTOR_SECTIONS.filter((k) => Array.isArray((v as Record<string, unknown>)[k]));
  if (present.length === 0) throw new Error(`${file}: no vector sections (expected any of ${VECTOR_SECTIONS.join(', ')})`);
  return v;
}

/**
 * Runs the CLI with `argv` (without node and script). Writes to stdout/stderr.
 * @returns the exit code.
 */
export async function main(argv: string[], out: (s: string) => void = (s) => process.stdout.write(s + '\n'), err: (s: string) => void = (s) => process.stderr.write(s + '\n')): Promise<number> {
  let code = 0;
  const program = new Command('kvconnect-checksum')
    .description('kvconnect KV checksums (SPEC v1, payload versions 1 and 2): conformance vectors and payload inspection')
    .exitOverride()
    .configureOutput({ writeOut: (s) => out(s.trimEnd()), writeErr: (s) => err(s.trimEnd()) });
  program
    .command('verify-vectors')
    .description('run a conformance vectors file through every available backend')
    .argument('<file>', 'vectors JSON (format of shared/vectors/README.md)')
    .action((file: string) => {
      const vectors = readVectors(file);
      const { backends, notes } = availableBackends();
      for (const n of notes) err(n);
      const results = runVectors(vectors, backends);
      let passed = 0;
      for (const r of results) {
        if (r.ok) passed++;
        out(`${r.ok ? 'ok  ' : 'FAIL'} ${r.section}${r.backend ? ` [${r.backend}]` : ''}: ${r.title}${r.ok ? '' : ` -- ${r.detail}`}`);
      }
      const failed = results.length - passed;
      out(`${passed} passed, ${failed} failed`);
      code = failed > 0 || results.length === 0 ? 1 : 0;
    });
  program
    .command('decode-payload')
    .description('decode a checksum payload (version 1 or 2) given as hex or base64 and print it as JSON')
    .argument('<data>', 'the payload bytes, hex or standard base64')
    .action((data: string) => {
      try {
        out(payloadJson(decodePayloadText(data)));
      } catch (e) {
        if (!(e instanceof PayloadError)) throw e;
        err(`PayloadError: ${e.message}`);
        code = 1;
      }
    });
  try {
    await program.parseAsync(argv, { from: 'user' });
  } catch (e) {
    if (e instanceof CommanderError) return e.exitCode === 0 ? 0 : 2;
    err(`error: ${(e as Error).message}`);
    return 1;
  }
  return code;
}

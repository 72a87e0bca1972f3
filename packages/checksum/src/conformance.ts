/**
 * Runs a conformance vectors file (format: `../shared/vectors/README.md`) through the checksum
 * definition on given backends, the fingerprint, the payload codec (versions 1 and 2), the token
 * digest (SPEC 6.1) and the verifier (SPEC 8, 8.0). Used by the `kvconnect-checksum verify-vectors`
 * CLI and by the tests; it reads `checksum-v1.json` and `identity-v2.json` alike (each file has
 * some of the sections).
 * @module
 */
import type { ChecksumBackend } from './backend.js';
import { BlockChecksummer } from './compute.js';
import { decodePayload, encodePayload, PayloadError, payloadVersionOf, tokenDigest } from './payload.js';
import { fingerprintOf, type RankContext } from './plan.js';
import { parseReplicaKey, type ChecksumPayload, type ConsumerLoad, type GroupKind, type WorkerRecord } from './types.js';
import { verifyLoad } from './verify.js';
import type { Dtype } from './types.js';
import type { CacheView, StateTensor } from './views.js';
import { logicalAttentionCache } from './views.js';

/** The result of one vector case on one backend (or on no backend, for codec and verifier cases). */
export interface CaseResult {
  section: string;
  title: string;
  backend: string | null;
  ok: boolean;
  detail?: string;
}

// The vectors are untyped JSON; fields are read as the README describes them.
// eslint-disable-next-line @typescript-eslint/no-explicit-any
type J = any;

function bytesOf(b64: string): Uint8Array {
  const b = Buffer.from(b64, 'base64');
  const out = new Uint8Array(b.length); // own, 8-aligned buffer
  out.set(b);
  return out;
}

function hexBytes(hex: string): Uint8Array {
  return new Uint8Array(Buffer.from(hex, 'hex'));
}

function diffValues(got: BigUint64Array, want: string[]): string | null {
  if (got.length !== want.length) return `${got.length} values, expected ${want.length}`;
  for (let i = 0; i < want.length; i++) if (got[i] !== BigInt(want[i])) return `value ${i}: ${got[i]} != ${want[i]}`;
  return null;
}

/** Checks one rank's record against the vector's partials (every key, nothing more). */
function checkPartials(got: Map<string, BigUint64Array>, want: Record<string, string[] | string>, role: RankContext['role']): string | null {
  const keys = Object.keys(want).filter((k) => role === 'consumer' || parseReplicaKey(k).replica === 0);
  if (got.size !== keys.length) return `keys ${[...got.keys()].join(',')} != ${keys.join(',')}`;
  for (const k of keys) {
    const g = got.get(k);
    if (!g) return `missing key ${k}`;
    const w = want[k];
    const d = diffValues(g, Array.isArray(w) ? w : [w]);
    if (d) return `${k}: ${d}`;
  }
  return null;
}

function attentionCase(v: J, backend: ChecksumBackend, role: RankContext['role']): string | null {
  const B = v.blockSize;
  const whole = new BigUint64Array(v.nBlocks);
  for (const rank of v.ranks) {
    const regions: Uint8Array[] = [];
    const caches: CacheView[] = rank.caches.map((rc: J) => {
      const meta = v.caches.find((c: J) => c.name === rc.name);
      regions.push(bytesOf(rc.data));
      return logicalAttentionCache({
        name: rc.name,
        dtype: meta.dtype,
        numBlocks: v.nBlocks,
        blockSize: B,
        localHeads: rc.localHeads,
        cellBytes: meta.cellBytes,
        at: { region: regions.length - 1 },
        replication: meta.replicas,
      });
    });
    const ck = new BlockChecksummer([{ groupId: 0, caches }], { tpRank: rank.tpRank, tpSize: v.tpSize, role }, regions, backend);
    const plan = ck.plans[0];
    if (plan.skipReason) return `rank ${rank.tpRank}: skipped (${plan.skipReason}: ${plan.skipDetail})`;
    for (const pc of plan.caches) {
      const meta = v.caches.find((c: J) => c.name === pc.name);
      if (meta.headOffset !== pc.headOffset) return `${pc.name}: head offset ${pc.headOffset} != ${meta.headOffset}`;
    }
    const [rec] = ck.compute([{ group: 0, blockIds: Array.from({ length: v.nBlocks }, (_, i) => i), start: v.startPosition, numTokens: v.numTokens }]);
    const d = checkPartials(rec.partials, rank.partials, role);
    if (d) return `rank ${rank.tpRank}: ${d}`;
    if (role === 'producer') for (const p of rec.partials.values()) p.forEach((x, i) => (whole[i] = BigInt.asUintN(64, whole[i] + x)));
  }
  return role === 'producer' ? diffValues(whole, v.wholeModelValues) : null;
}

function stateCase(v: J, backend: ChecksumBackend, role: RankContext['role'], local: boolean): string | null {
  let whole = 0n;
  for (const rank of v.ranks) {
    const regions: Uint8Array[] = [];
    const states: StateTensor[] = rank.states.map((s: J) => {
      const data = bytesOf(s.data);
      regions.push(data);
      return {
        dtype: s.dtype as Dtype,
        shape: s.shape,
        region: regions.length - 1,
        offset: 0,
        blockStride: data.length,
        split: local ? undefined : { axis: s.axis, segments: s.segments },
      };
    });
    const cache: CacheView = { kind: 'state', name: `model.layers.${v.layer}.mixer`, numBlocks: 1, states };
    const ck = new BlockChecksummer([{ groupId: 0, caches: [cache] }], { tpRank: rank.tpRank, tpSize: v.tpSize, role }, regions, backend);
    const want: GroupKind = local ? 'state-local' : 'state';
    if (ck.plans[0].kind !== want) return `planned as ${ck.plans[0].kind}, expected ${want}`;
    if (ck.plans[0].skipReason) return `rank ${rank.tpRank}: skipped (${ck.plans[0].skipReason})`;
    const [rec] = ck.compute([{ group: 0, blockIds: [0], start: 0, numTokens: 0 }]);
    const d = checkPartials(rec.partials, rank.partials, role);
    if (d) return `rank ${rank.tpRank}: ${d}`;
    if (role === 'producer') for (const p of rec.partials.values()) whole = BigInt.asUintN(64, whole + p[0]);
  }
  if (!local && role === 'producer' && whole !== BigInt(v.wholeModelValue)) return `replica-0 sum ${whole} != whole-model value ${v.wholeModelValue}`;
  return null;
}

/**
 * Vector payload fields -> a ChecksumPayload. `version` and `tokenDigest` (decimal string) are
 * taken when present (`identity-v2.json`); `checksum-v1.json` payloads have neither (version 1).
 */
export function payloadFromJson(p: J): ChecksumPayload {
  return {
    ...(p.version !== undefined ? { version: p.version } : {}),
    ...(p.tokenDigest !== undefined ? { tokenDigest: BigInt(p.tokenDigest) } : {}),
    numTokens: p.numTokens,
    producerTpSize: p.producerTpSize,
    groups: p.groups.map((g: J) => ({
      groupId: g.groupId,
      fingerprint: BigInt(g.fingerprint),
      blockSize: g.blockSize,
      start: g.start,
      values: BigUint64Array.from(g.values.map((x: string) => BigInt(x))),
    })),
  };
}

function payloadEquals(a: ChecksumPayload, b: ChecksumPayload): string | null {
  if (payloadVersionOf(a) !== payloadVersionOf(b)) return `version ${payloadVersionOf(a)} != ${payloadVersionOf(b)}`;
  if (a.tokenDigest !== b.tokenDigest) return `tokenDigest ${a.tokenDigest} != ${b.tokenDigest}`;
  if (a.numTokens !== b.numTokens || a.producerTpSize !== b.producerTpSize) return 'header differs';
  if (a.groups.length !== b.groups.length) return `${a.groups.length} groups != ${b.groups.length}`;
  for (let i = 0; i < a.groups.length; i++) {
    const x = a.groups[i];
    const y = b.groups[i];
    if (x.groupId !== y.groupId || x.fingerprint !== y.fingerprint || x.blockSize !== y.blockSize || x.start !== y.start) return `group ${i} fields differ`;
    if (x.values.length !== y.values.length || x.values.some((v, k) => v !== y.values[k])) return `group ${i} values differ`;
  }
  return null;
}

/** Vector consumer JSON -> a ConsumerLoad (`tokenIds`, the consumer's prompt, when present). */
export function consumerLoadFromJson(c: J): ConsumerLoad {
  return {
    numTokens: c.numTokens,
    ...(c.tokenIds !== undefined ? { tokenIds: c.tokenIds } : {}),
    tpSize: c.tpSize,
    ppSize: c.ppSize,
    groups: c.groups.map((g: J) => ({ ...g, fingerprint: BigInt(g.fingerprint) })),
    workers: c.workers.map(
      (w: J): WorkerRecord => ({
        ppRank: w.ppRank,
        tpRank: w.tpRank,
        groups: new Map(
          Object.entries(w.groups).map(([id, g]: [string, J]) => [
            Number(id),
            {
              start: g.start,
              nBlocks: g.nBlocks,
              skipped: g.skipped,
              partials: new Map(Object.entries(g.partials ?? {}).map(([k, vals]) => [k, BigUint64Array.from((vals as string[]).map((x) => BigInt(x)))])),
            },
          ]),
        ),
      }),
    ),
  };
}

function attempt(f: () => string | null): { ok: boolean; detail?: string } {
  try {
    const d = f();
    return d === null ? { ok: true } : { ok: false, detail: d };
  } catch (e) {
    return { ok: false, detail: `threw ${(e as Error).stack ?? String(e)}` };
  }
}

/**
 * Runs every case of a vectors file. Checksum cases (attention, state, stateLocal) run once per
 * backend and role; the others once.
 */
export function runVectors(vectors: J, backends: readonly ChecksumBackend[]): CaseResult[] {
  const results: CaseResult[] = [];
  const add = (section: string, title: string, backend: string | null, f: () => string | null) => results.push({ section, title, backend, ...attempt(f) });
  for (const b of backends) {
    for (const role of ['producer', 'consumer'] as const) {
      for (const v of vectors.attention ?? []) add('attention', `${v.title} (${role})`, b.name, () => attentionCase(v, b, role));
      for (const v of vectors.state ?? []) add('state', `${v.title} (${role})`, b.name, () => stateCase(v, b, role, false));
      for (const v of vectors.stateLocal ?? []) add('stateLocal', `${v.title} (${role})`, b.name, () => stateCase(v, b, role, true));
    }
  }
  let fpSum = 0n;
  for (const f of vectors.fingerprint ?? []) {
    add('fingerprint', f.identityText, null, () => {
      if (JSON.stringify(f.identity) !== f.identityText) return 'identity text differs from JSON.stringify(identity)';
      const fp = fingerprintOf(f.identity);
      fpSum = BigInt.asUintN(64, fpSum + fp);
      return fp === BigInt(f.fp) ? null : `${fp} != ${f.fp}`;
    });
  }
  if (vectors.fingerprintSumAll !== undefined) add('fingerprint', 'sum of all', null, () => (fpSum === BigInt(vectors.fingerprintSumAll) ? null : `${fpSum} != ${vectors.fingerprintSumAll}`));
  for (const t of vectors.tokenDigest ?? []) {
    add('tokenDigest', `${t.numTokens} of ${t.tokenIds.length} tokens`, null, () => {
      const d = tokenDigest(t.tokenIds, t.numTokens);
      return d === BigInt(t.digest) ? null : `${d} != ${t.digest}`;
    });
  }
  const encodeCase = (p: J) => (): string | null => {
    const want = payloadFromJson(p);
    if (p.tokenIds !== undefined && tokenDigest(p.tokenIds, p.numTokens) !== want.tokenDigest) return 'tokenDigest is not the digest of tokenIds';
    const hex = Buffer.from(encodePayload(want)).toString('hex');
    if (hex !== p.hex) return `encoded ${hex}`;
    if (Buffer.from(hexBytes(p.hex)).toString('base64') !== p.base64) return 'base64 differs';
    return payloadEquals(decodePayload(hexBytes(p.hex)), want);
  };
  for (const p of vectors.payload ?? []) add('payload', `encode ${p.hex.slice(0, 24)}…`, null, encodeCase(p));
  for (const p of vectors.payloadV2 ?? []) add('payloadV2', `encode ${p.hex.slice(0, 24)}…`, null, encodeCase(p));
  for (const p of vectors.payloadAccepts ?? []) add('payloadAccepts', p.why, null, () => payloadEquals(decodePayload(hexBytes(p.hex)), payloadFromJson(p)));
  const rejectCase = (p: J) => (): string | null => {
    try {
      decodePayload(hexBytes(p.hex));
      return 'accepted';
    } catch (e) {
      return e instanceof PayloadError ? null : `threw ${(e as Error).name}, not PayloadError`;
    }
  };
  for (const p of vectors.payloadRejects ?? []) add('payloadRejects', p.why, null, rejectCase(p));
  for (const p of vectors.payloadV2Rejects ?? []) add('payloadV2Rejects', p.why, null, rejectCase(p));
  // `verificationV2` (identity-v2.json) also fixes `wrongRequest`, and `payload.version` says
  // whether identity was checked (SPEC 8.0).
  const verificationCase = (c: J, v2: boolean) => (): string | null => {
    const payload = c.payload === null ? null : c.payload === 'malformed' ? 'malformed' : payloadFromJson(c.payload);
    const got = verifyLoad(payload, consumerLoadFromJson(c.consumer));
    const want = c.expected;
    const pick = (v: J) => JSON.stringify({ verdict: v.verdict, mismatches: v.mismatches, unverified: v.unverified, ...(v2 ? { wrongRequest: v.wrongRequest } : {}) });
    const g = pick(got);
    const w = pick(want);
    if (g !== w) return `got ${g}, expected ${w}`;
    const identity = c.payload === null || c.payload === 'malformed' ? 'none' : c.payload.version === 2 ? 'checked' : 'unchecked';
    return got.identity === identity ? null : `identity ${got.identity}, expected ${identity}`;
  };
  for (const c of vectors.verification ?? []) add('verification', c.title, null, verificationCase(c, false));
  for (const c of vectors.verificationV2 ?? []) add('verificationV2', c.title, null, verificationCase(c, true));
  return results;
}

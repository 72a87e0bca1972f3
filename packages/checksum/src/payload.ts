/**
 * Checksum payload codec, versions 1 (SPEC 6) and 2 (SPEC 6.1), the request token digest of
 * version 2, and the base64 form for the NIXL pull carrier (SPEC 7).
 *
 * Wire shapes (MessagePack arrays, not maps):
 *
 * ```
 * [1, [numTokens, producerTpSize, [[groupId, fingerprint, blockSize, start, values], ...]]]
 * [2, [numTokens, producerTpSize, tokenDigest, [[groupId, fingerprint, blockSize, start, values], ...]]]
 * ```
 *
 * MessagePack integers and length headers are big-endian; `values` is a bin of `8 * n` bytes
 * holding the block values as little-endian uint64; `tokenDigest` is a uint64 ({@link tokenDigest}).
 * Producers send version 2; decoders accept both.
 *
 * The decoder reads untrusted bytes from a peer (or from a client, through
 * `kv_transfer_params`). It is written by hand for this one fixed shape: it never recurses,
 * checks the size limit before parsing and every declared length against the bytes left
 * before allocating, and reports every defect as a {@link PayloadError}.
 *
 * Why not a MessagePack library (ARCHITECTURE asks for one where it does the job): this payload is
 * the wire contract kvconnect exists for. Generic decoders recurse on nesting, allocate what a
 * header declares, accept maps, floats and trailing bytes, and do not produce the minimal forms
 * the conformance vectors fix byte for byte; checking their output afterwards would still leave
 * the allocation and recursion hazards. Side-channel messages elsewhere use msgpackr.
 * @module
 */

import { createHash, hash } from 'node:crypto';
import type { ChecksumPayload, PayloadGroup, PayloadVersion, SubBlockValues } from './types.js';
import { SAMPLE_THRESHOLD_ALL } from './sampling.js';

/** Payload version producers write (SPEC 6.1): 2, which binds the checksums to the request's tokens. */
export const PAYLOAD_VERSION = 2;

/** Payload versions of the SPEC the decoder accepts (SPEC 6.1: "Decoders accept versions 1 and 2"). */
export const PAYLOAD_VERSIONS: readonly PayloadVersion[] = Object.freeze([1, 2] as const);

/**
 * The extension payload's version (docs/checksum-extensions.md): version 2 plus a sample threshold
 * and sub-block values, sent only when sampling or sub-block values are in use. Numbered apart
 * from the SPEC's versions (a SPEC decoder rejects it as an unknown version, as SPEC vectors ask
 * of version 3). The decoder accepts it besides {@link PAYLOAD_VERSIONS}.
 */
export const PAYLOAD_VERSION_EXTENSIONS = 16 as const;

/** Largest accepted payload, in bytes of raw MessagePack (SPEC 6): 16 MiB. */
export const MAX_PAYLOAD_BYTES = 16 * 1024 * 1024;

/** Most groups one payload may hold (SPEC 6). */
export const MAX_PAYLOAD_GROUPS = 4096;

/**
 * Why a payload was rejected; a stable, machine-friendly code for metrics and logs.
 *
 * - `version`: a version other than those of {@link PAYLOAD_VERSIONS};
 * - `arity`: an array with the wrong number of elements (a version-1 body has 3, a version-2
 *   body 4: SPEC 6.1);
 * - `type`: another MessagePack type (float, nil, bool, str, map, ext, ...) where an integer,
 *   array or bin is expected, or an input that is not bytes;
 * - `negative`: a negative integer;
 * - `integer-too-large`: an integer other than a fingerprint or the token digest above
 *   `Number.MAX_SAFE_INTEGER`;
 * - `tp-size-zero`, `block-size-zero`: `producerTpSize` or a `blockSize` is 0;
 * - `duplicate-group`: a repeated `groupId`;
 * - `values-length`: a `values` bin whose length is not a multiple of 8;
 * - `too-many-groups`: more than {@link MAX_PAYLOAD_GROUPS} groups;
 * - `too-large`: more than {@link MAX_PAYLOAD_BYTES} bytes (or a base64 text longer than
 *   such a payload's);
 * - `truncated`: the bytes end inside the payload;
 * - `trailing-bytes`: bytes after the payload;
 * - `base64`: the base64 carrier text is not canonical standard base64 with padding;
 * - `sample-threshold`: an extension payload's `sampleThreshold` outside `[1, 2^32]`;
 * - `sub-block-group`: an extension payload's sub-block entry whose `groupId` is not among the payload's
 *   groups, or repeats another entry's.
 */
export type PayloadErrorReason =
  | 'version'
  | 'arity'
  | 'type'
  | 'negative'
  | 'integer-too-large'
  | 'tp-size-zero'
  | 'block-size-zero'
  | 'duplicate-group'
  | 'values-length'
  | 'too-many-groups'
  | 'too-large'
  | 'truncated'
  | 'trailing-bytes'
  | 'base64'
  | 'sample-threshold'
  | 'sub-block-group';

/**
 * The one error type of payload decoding (SPEC 6): a rejected payload makes the load
 * unverified (`malformed-payload`, SPEC 8), never a crash.
 */
export class PayloadError extends Error {
  /** Machine-friendly code of the defect; the message says where it is, for humans. */
  readonly reason: PayloadErrorReason;

  /**
   * @param reason - the defect's code.
   * @param message - a human description (field and byte offset where known).
   */
  constructor(reason: PayloadErrorReason, message: string) {
    super(`invalid KV checksum payload (${reason}): ${message}`);
    this.name = 'PayloadError';
    this.reason = reason;
  }
}

const TWO_POW_32 = 2 ** 32;
const TWO_POW_32_N = 1n << 32n;
const UINT64_MAX = (1n << 64n) - 1n;
/** Length of standard base64 (with padding) of a {@link MAX_PAYLOAD_BYTES} payload. */
const MAX_BASE64_CHARS = 4 * Math.ceil(MAX_PAYLOAD_BYTES / 3);
/** Block values travel LE; on an LE host a BigUint64Array's bytes are already wire bytes. */
const HOST_IS_LE = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

// ---------------------------------------------------------------------------------------------
// Token digest (SPEC 6.1)
// ---------------------------------------------------------------------------------------------

/**
 * The request token digest of a version-2 payload (SPEC 6.1): SHA-256 over the first `numTokens`
 * token ids, each written as a little-endian uint32, and the digest's first 8 bytes read as a
 * little-endian uint64. `numTokens` 0 digests no bytes. Vectors: `identity-v2.json`, `tokenDigest[]`.
 *
 * Cost: a `Uint32Array` of ids (on a little-endian host) is hashed as it is. Otherwise one pass
 * over the ids, written as uint32 words into a buffer of at most {@link DIGEST_PIECE_TOKENS} ids
 * that is hashed piece by piece (a prompt of that many ids or fewer
 * in one call of the one-shot `crypto.hash`). A buffer as large as the whole prompt (512 KiB at
 * 128K tokens) would be fresh memory on every call: page faults and zeroing cost more than the
 * hash. The consumer runs this once per load on its scheduler thread (SPEC 8.0), the producer
 * once per payload.
 *
 * @param tokenIds - the request's token ids (prompt order); only the first `numTokens` are read.
 * @param numTokens - how many ids to digest; default all of them.
 * @returns the digest, a bigint in [0, 2^64).
 * @throws RangeError if `numTokens` is not a safe integer in `[0, tokenIds.length]`, or a digested
 *   id is not an integer in [0, 2^32).
 */
export function tokenDigest(tokenIds: ArrayLike<number>, numTokens: number = tokenIds.length): bigint {
  if (!Number.isSafeInteger(numTokens) || numTokens < 0 || numTokens > tokenIds.length) {
    throw new RangeError(`numTokens must be an integer in [0, ${tokenIds.length}], got ${numTokens}`);
  }
  if (HOST_IS_LE && tokenIds instanceof Uint32Array) {
    // Already the digested bytes: every element is a uint32, in LE order on this host.
    const b = new Uint8Array(tokenIds.buffer, tokenIds.byteOffset, 4 * numTokens);
    return hash('sha256', b, 'buffer').readBigUInt64LE(0);
  }
  const words = new Uint32Array(Math.min(numTokens, DIGEST_PIECE_TOKENS));
  const bytes = new Uint8Array(words.buffer);
  if (numTokens <= DIGEST_PIECE_TOKENS) {
    writeWords(tokenIds, 0, words, numTokens);
    return hash('sha256', bytes, 'buffer').readBigUInt64LE(0);
  }
  const h = createHash('sha256');
  for (let from = 0; from < numTokens; from += DIGEST_PIECE_TOKENS) {
    const n = Math.min(DIGEST_PIECE_TOKENS, numTokens - from);
    writeWords(tokenIds, from, words, n);
    h.update(bytes.subarray(0, 4 * n));
  }
  return h.digest().readBigUInt64LE(0);
}

/** Token ids per piece hashed by {@link tokenDigest} (16 KiB of words). */
const DIGEST_PIECE_TOKENS = 4096;

/**
 * Writes ids `from .. from + n - 1` into `words[0 .. n-1]` as uint32, LE (SPEC 6.1). Its own
 * function so that its loop is the function's end (V8 compiles a long loop on the stack, and code
 * after it in the same function would be deoptimized on every call).
 *
 * The loop has no exit but a non-number: it folds the range check of every id into one flag and
 * throws after the loop ({@link badTokenAt} finds the id), which V8 compiles to about half the
 * time of a loop that can throw at every id (`bench/checksum.mjs`, token digest row). An id is a
 * uint32 exactly when `t >>> 0 === t` (-0 included, written as 0); a non-number is never stored or
 * converted (no `valueOf` runs).
 * @throws RangeError for an id that is not an integer in [0, 2^32).
 */
function writeWords(tokenIds: ArrayLike<number>, from: number, words: Uint32Array, n: number): void {
  let bad = false;
  for (let i = 0; i < n; i++) {
    const t = tokenIds[from + i];
    if (typeof t !== 'number') {
      bad = true;
      break;
    }
    bad = bad || t >>> 0 !== t;
    words[i] = t;
  }
  if (bad) badTokenAt(tokenIds, from, n);
  if (!HOST_IS_LE) swapUint32Bytes(new Uint8Array(words.buffer, 0, 4 * n));
}

/**
 * Throws for the first of ids `from .. from + n - 1` that is not a uint32 (the slow path of
 * {@link writeWords}, taken only when one is).
 * @throws RangeError naming the id and its index.
 */
function badTokenAt(tokenIds: ArrayLike<number>, from: number, n: number): never {
  for (let i = from; i < from + n; i++) {
    const t = tokenIds[i];
    if (typeof t !== 'number' || t >>> 0 !== t) {
      // An object is named by its type: String() would run its conversion.
      const shown = (typeof t === 'object' && t !== null) || typeof t === 'function' ? `of type ${typeof t}` : String(t);
      throw new RangeError(`token id ${shown} at ${i} is not a uint32`);
    }
  }
  throw new Error('unreachable: writeWords found a bad token id that badTokenAt did not');
}

/** Reverses the bytes of each 4-byte word in place (host order <-> LE on a big-endian host). */
function swapUint32Bytes(b: Uint8Array): void {
  for (let i = 0; i < b.length; i += 4) b.subarray(i, i + 4).reverse();
}

// ---------------------------------------------------------------------------------------------
// Encoder
// ---------------------------------------------------------------------------------------------

/**
 * The wire version a payload object stands for: `p.version`, else 2 when it has a `tokenDigest`,
 * else 1 (SPEC 6.1). Not validated (see `encodePayload`).
 */
export function payloadVersionOf(p: Pick<ChecksumPayload, 'version' | 'tokenDigest' | 'sampleThreshold' | 'subBlocks'>): number {
  if (p.version !== undefined) return p.version;
  if (p.sampleThreshold !== undefined || p.subBlocks !== undefined) return PAYLOAD_VERSION_EXTENSIONS;
  return p.tokenDigest !== undefined ? 2 : 1;
}

/**
 * The version a payload is encoded as ({@link payloadVersionOf}).
 * @throws TypeError for a version other than 1 and 2, a version 2 without a `tokenDigest` or a
 *   version 1 with one (the digest would be dropped silently).
 */
function versionOf(p: ChecksumPayload): PayloadVersion {
  const version = payloadVersionOf(p);
  if (version !== 1 && version !== 2 && version !== PAYLOAD_VERSION_EXTENSIONS) throw new TypeError(`payload version ${String(version)} is not 1, 2 or ${PAYLOAD_VERSION_EXTENSIONS}`);
  if (version >= 2 && typeof p.tokenDigest !== 'bigint') throw new TypeError(`a version-${version} payload needs a bigint tokenDigest`);
  if (version === 1 && p.tokenDigest !== undefined) throw new TypeError('a version-1 payload has no tokenDigest (SPEC 6)');
  if (version !== PAYLOAD_VERSION_EXTENSIONS && (p.sampleThreshold !== undefined || p.subBlocks !== undefined)) {
    throw new TypeError('sampleThreshold and subBlocks need payload version 16 (docs/checksum-extensions.md)');
  }
  return version;
}

/**
 * Encodes a payload with minimal MessagePack forms (SPEC 6, 6.1): the shortest integer family
 * (positive fixint, uint 8/16/32/64), fixarray or array 16, and bin 8/16/32 holding the
 * `values` as LE uint64. The result is a fresh `Uint8Array` (not a Node `Buffer`).
 *
 * Cost: one pass over the groups to validate and size, one to write; each group's values are
 * copied as one block of bytes.
 *
 * @param p - the payload; `groups` in the order they are to travel. Version 2 (SPEC 6.1) when
 *   `p.version` is 2, or is absent and `p.tokenDigest` is set; else version 1.
 * @returns the payload bytes, at most {@link MAX_PAYLOAD_BYTES}.
 * @throws TypeError if a field has the wrong JS type (a `number` field that is not a number,
 *   a `fingerprint` that is not a bigint, `values` that are not a `BigUint64Array`), or the
 *   version and `tokenDigest` disagree (see `p`).
 * @throws RangeError if a number is negative or not a safe integer, `producerTpSize` or a
 *   `blockSize` is 0, a `fingerprint` or the `tokenDigest` is outside [0, 2^64), two groups share a `groupId`,
 *   there are more than {@link MAX_PAYLOAD_GROUPS} groups, or the encoding would exceed
 *   {@link MAX_PAYLOAD_BYTES}.
 */
export function encodePayload(p: ChecksumPayload): Uint8Array {
  const version = versionOf(p);
  checkCount('numTokens', p.numTokens, 0);
  checkCount('producerTpSize', p.producerTpSize, 1);
  if (version >= 2) checkUint64('tokenDigest', p.tokenDigest!);
  if (!Array.isArray(p.groups)) throw new TypeError('groups must be an array');
  if (p.groups.length > MAX_PAYLOAD_GROUPS) {
    throw new RangeError(`${p.groups.length} groups: at most ${MAX_PAYLOAD_GROUPS} allowed`);
  }

  // [version, [numTokens, producerTpSize, (tokenDigest,) [groups...]]]: two one-byte fixarray headers.
  let size = 2 + uintSize(version) + uintSize(p.numTokens) + uintSize(p.producerTpSize);
  if (version >= 2) size += fingerprintSize(p.tokenDigest!);
  size += arrayHeaderSize(p.groups.length);
  const seen = new Set<number>();
  for (const [i, g] of p.groups.entries()) {
    checkCount(`groups[${i}].groupId`, g.groupId, 0);
    checkCount(`groups[${i}].blockSize`, g.blockSize, 1);
    checkCount(`groups[${i}].start`, g.start, 0);
    checkUint64(`groups[${i}].fingerprint`, g.fingerprint);
    if (!(g.values instanceof BigUint64Array)) throw new TypeError(`groups[${i}].values must be a BigUint64Array`);
    if (seen.has(g.groupId)) throw new RangeError(`groupId ${g.groupId} appears twice`);
    seen.add(g.groupId);
    size += 1 + uintSize(g.groupId) + fingerprintSize(g.fingerprint) + uintSize(g.blockSize) + uintSize(g.start);
    size += binHeaderSize(g.values.byteLength) + g.values.byteLength;
  }
  const threshold = p.sampleThreshold ?? SAMPLE_THRESHOLD_ALL;
  const subs: readonly SubBlockValues[] = p.subBlocks ?? [];
  if (version === PAYLOAD_VERSION_EXTENSIONS) {
    checkCount('sampleThreshold', threshold, 1);
    if (threshold > SAMPLE_THRESHOLD_ALL) throw new RangeError(`sampleThreshold ${threshold} exceeds 2^32`);
    if (!Array.isArray(subs)) throw new TypeError('subBlocks must be an array');
    if (subs.length > MAX_PAYLOAD_GROUPS) throw new RangeError(`${subs.length} sub-block entries: at most ${MAX_PAYLOAD_GROUPS} allowed`);
    size += uintSize(threshold) + arrayHeaderSize(subs.length);
    const subSeen = new Set<number>();
    for (const [i, g] of subs.entries()) {
      checkCount(`subBlocks[${i}].groupId`, g.groupId, 0);
      checkCount(`subBlocks[${i}].blockSize`, g.blockSize, 1);
      checkCount(`subBlocks[${i}].start`, g.start, 0);
      if (!(g.values instanceof BigUint64Array)) throw new TypeError(`subBlocks[${i}].values must be a BigUint64Array`);
      if (!seen.has(g.groupId) || subSeen.has(g.groupId)) throw new RangeError(`subBlocks[${i}].groupId ${g.groupId} is not a payload group, or repeats`);
      subSeen.add(g.groupId);
      size += 1 + uintSize(g.groupId) + uintSize(g.blockSize) + uintSize(g.start) + binHeaderSize(g.values.byteLength) + g.values.byteLength;
    }
  }
  if (size > MAX_PAYLOAD_BYTES) {
    throw new RangeError(`payload of ${size} bytes exceeds the ${MAX_PAYLOAD_BYTES}-byte limit`);
  }

  const w = new Writer(size);
  w.arrayHeader(2);
  w.uint(version);
  w.arrayHeader(version === PAYLOAD_VERSION_EXTENSIONS ? 6 : version === 2 ? 4 : 3);
  w.uint(p.numTokens);
  w.uint(p.producerTpSize);
  if (version >= 2) w.fingerprint(p.tokenDigest!);
  w.arrayHeader(p.groups.length);
  for (const g of p.groups) {
    w.arrayHeader(5);
    w.uint(g.groupId);
    w.fingerprint(g.fingerprint);
    w.uint(g.blockSize);
    w.uint(g.start);
    w.values(g.values);
  }
  if (version === PAYLOAD_VERSION_EXTENSIONS) {
    w.uint(threshold);
    w.arrayHeader(subs.length);
    for (const g of subs) {
      w.arrayHeader(4);
      w.uint(g.groupId);
      w.uint(g.blockSize);
      w.uint(g.start);
      w.values(g.values);
    }
  }
  return w.bytes;
}

/**
 * {@link encodePayload}, then standard base64 with padding: the `kv_transfer_params.kv_checksums`
 * value of the NIXL pull carrier (SPEC 7).
 * @throws TypeError, RangeError as {@link encodePayload}.
 */
export function encodePayloadBase64(p: ChecksumPayload): string {
  const bytes = encodePayload(p);
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('base64');
}

/** Throws unless `v` is a safe integer >= `min`. */
function checkCount(field: string, v: number, min: number): void {
  if (typeof v !== 'number') throw new TypeError(`${field} must be a number, got ${typeof v}`);
  if (!Number.isSafeInteger(v) || v < min) {
    throw new RangeError(`${field} must be a safe integer >= ${min}, got ${v}`);
  }
}

/** Throws unless `v` is a bigint in [0, 2^64). */
function checkUint64(field: string, v: bigint): void {
  if (typeof v !== 'bigint') throw new TypeError(`${field} must be a bigint`);
  if (v < 0n || v > UINT64_MAX) throw new RangeError(`${field} ${v} is not a uint64`);
}

/** Bytes of the minimal MessagePack form of a non-negative safe integer. */
function uintSize(n: number): number {
  if (n < 0x80) return 1;
  if (n < 0x100) return 2;
  if (n < 0x10000) return 3;
  if (n < TWO_POW_32) return 5;
  return 9;
}

function fingerprintSize(fp: bigint): number {
  return fp < TWO_POW_32_N ? uintSize(Number(fp)) : 9;
}

function arrayHeaderSize(n: number): number {
  return n < 16 ? 1 : 3; // array 16 covers every count up to MAX_PAYLOAD_GROUPS
}

function binHeaderSize(n: number): number {
  if (n < 0x100) return 2;
  if (n < 0x10000) return 3;
  return 5;
}

/** Writes minimal MessagePack forms into a buffer sized in advance. */
class Writer {
  readonly bytes: Uint8Array;
  private readonly view: DataView;
  private pos = 0;

  constructor(size: number) {
    this.bytes = new Uint8Array(size);
    this.view = new DataView(this.bytes.buffer);
  }

  /** A non-negative safe integer. */
  uint(n: number): void {
    const { view } = this;
    if (n < 0x80) {
      view.setUint8(this.pos++, n);
    } else if (n < 0x100) {
      view.setUint8(this.pos, 0xcc);
      view.setUint8(this.pos + 1, n);
      this.pos += 2;
    } else if (n < 0x10000) {
      view.setUint8(this.pos, 0xcd);
      view.setUint16(this.pos + 1, n);
      this.pos += 3;
    } else if (n < TWO_POW_32) {
      view.setUint8(this.pos, 0xce);
      view.setUint32(this.pos + 1, n);
      this.pos += 5;
    } else {
      view.setUint8(this.pos, 0xcf);
      view.setUint32(this.pos + 1, Math.floor(n / TWO_POW_32));
      view.setUint32(this.pos + 5, n >>> 0);
      this.pos += 9;
    }
  }

  /** A uint64 (a fingerprint or the token digest). */
  fingerprint(fp: bigint): void {
    if (fp < TWO_POW_32_N) {
      this.uint(Number(fp));
      return;
    }
    this.view.setUint8(this.pos, 0xcf);
    this.view.setBigUint64(this.pos + 1, fp);
    this.pos += 9;
  }

  /** fixarray or array 16 header. */
  arrayHeader(n: number): void {
    if (n < 16) {
      this.view.setUint8(this.pos++, 0x90 | n);
    } else {
      this.view.setUint8(this.pos, 0xdc);
      this.view.setUint16(this.pos + 1, n);
      this.pos += 3;
    }
  }

  /** bin 8/16/32 of the values' LE bytes. */
  values(values: BigUint64Array): void {
    const n = values.byteLength;
    const { view } = this;
    if (n < 0x100) {
      view.setUint8(this.pos, 0xc4);
      view.setUint8(this.pos + 1, n);
      this.pos += 2;
    } else if (n < 0x10000) {
      view.setUint8(this.pos, 0xc5);
      view.setUint16(this.pos + 1, n);
      this.pos += 3;
    } else {
      view.setUint8(this.pos, 0xc6);
      view.setUint32(this.pos + 1, n);
      this.pos += 5;
    }
    const out = this.bytes.subarray(this.pos, this.pos + n);
    out.set(new Uint8Array(values.buffer, values.byteOffset, n));
    if (!HOST_IS_LE) swapUint64Bytes(out);
    this.pos += n;
  }
}

/** Reverses the bytes of each 8-byte word in place (host order <-> LE on a big-endian host). */
function swapUint64Bytes(b: Uint8Array): void {
  for (let i = 0; i < b.length; i += 8) b.subarray(i, i + 8).reverse();
}

// ---------------------------------------------------------------------------------------------
// Decoder
// ---------------------------------------------------------------------------------------------

/**
 * Decodes and validates a payload from untrusted bytes, version 1 (SPEC 6) or 2 (SPEC 6.1).
 *
 * Accepts every MessagePack integer family (positive fixint, uint 8-64, int 8-64 holding a
 * value >= 0), every array family (fixarray, array 16/32) and every bin family (bin 8/16/32);
 * integers are big-endian as MessagePack defines them, `values` bytes are LE uint64.
 * `numTokens`, `producerTpSize`, `groupId`, `blockSize` and `start` must be at most
 * `Number.MAX_SAFE_INTEGER`; `fingerprint` and `tokenDigest` are full uint64. A version-2 body
 * must have 4 elements and a version-1 body 3 (`arity`); the result's `version` says which, and
 * `tokenDigest` is set for version 2 only.
 *
 * The size limit is checked before parsing; declared lengths are checked against the bytes
 * left before anything is allocated, so memory stays proportional to the input. Each group's
 * `values` is a fresh `BigUint64Array` owning its memory (the input may be unaligned, or a
 * pooled `Buffer`); the input is not kept.
 *
 * @param bytes - the raw payload (a `Uint8Array` or Node `Buffer`).
 * @returns the payload, groups in wire order.
 * @throws PayloadError for anything else, and nothing else: see {@link PayloadErrorReason}.
 *   An input that is not a `Uint8Array` is rejected with reason `type`.
 */
export function decodePayload(bytes: Uint8Array): ChecksumPayload {
  if (!(bytes instanceof Uint8Array)) {
    throw new PayloadError('type', `expected bytes (Uint8Array), got ${describeValue(bytes)}`);
  }
  if (bytes.length > MAX_PAYLOAD_BYTES) {
    throw new PayloadError('too-large', `${bytes.length} bytes exceeds the ${MAX_PAYLOAD_BYTES}-byte limit`);
  }
  const r = new Reader(bytes);

  r.fixedArray('payload', 2);
  const version = r.int('version');
  if (version !== 1 && version !== 2 && version !== PAYLOAD_VERSION_EXTENSIONS) {
    throw new PayloadError('version', `version ${version} is not supported (expected ${[...PAYLOAD_VERSIONS, PAYLOAD_VERSION_EXTENSIONS].join(', ')})`);
  }
  r.fixedArray(`version-${version} body`, version === PAYLOAD_VERSION_EXTENSIONS ? 6 : version === 2 ? 4 : 3);
  const numTokens = r.count('numTokens');
  const producerTpSize = r.count('producerTpSize');
  if (producerTpSize === 0) throw new PayloadError('tp-size-zero', 'producerTpSize is 0');
  const digest = version >= 2 ? r.uint64('tokenDigest') : undefined;

  const nGroups = r.arrayHeader('groups');
  if (nGroups > MAX_PAYLOAD_GROUPS) {
    throw new PayloadError('too-many-groups', `${nGroups} groups: at most ${MAX_PAYLOAD_GROUPS} allowed`);
  }
  const groups: PayloadGroup[] = [];
  const seen = new Set<number>();
  for (let i = 0; i < nGroups; i++) {
    r.fixedArray(`groups[${i}]`, 5);
    const groupId = r.count(`groups[${i}].groupId`);
    if (seen.has(groupId)) throw new PayloadError('duplicate-group', `groupId ${groupId} appears twice`);
    seen.add(groupId);
    const fingerprint = r.uint64(`groups[${i}].fingerprint`);
    const blockSize = r.count(`groups[${i}].blockSize`);
    if (blockSize === 0) throw new PayloadError('block-size-zero', `groups[${i}].blockSize is 0`);
    const start = r.count(`groups[${i}].start`);
    const values = r.values(`groups[${i}].values`);
    groups.push({ groupId, fingerprint, blockSize, start, values });
  }
  if (version !== PAYLOAD_VERSION_EXTENSIONS) {
    r.end();
    return version === 2 ? { version, numTokens, producerTpSize, tokenDigest: digest, groups } : { version, numTokens, producerTpSize, groups };
  }
  const sampleThreshold = r.count('sampleThreshold');
  if (sampleThreshold === 0 || sampleThreshold > SAMPLE_THRESHOLD_ALL) {
    throw new PayloadError('sample-threshold', `sampleThreshold ${sampleThreshold} is outside [1, 2^32]`);
  }
  const nSubs = r.arrayHeader('subBlocks');
  if (nSubs > MAX_PAYLOAD_GROUPS) throw new PayloadError('too-many-groups', `${nSubs} sub-block entries: at most ${MAX_PAYLOAD_GROUPS} allowed`);
  const subBlocks: SubBlockValues[] = [];
  const subSeen = new Set<number>();
  for (let i = 0; i < nSubs; i++) {
    r.fixedArray(`subBlocks[${i}]`, 4);
    const groupId = r.count(`subBlocks[${i}].groupId`);
    if (!seen.has(groupId) || subSeen.has(groupId)) throw new PayloadError('sub-block-group', `subBlocks[${i}].groupId ${groupId} is not a payload group, or repeats`);
    subSeen.add(groupId);
    const blockSize = r.count(`subBlocks[${i}].blockSize`);
    if (blockSize === 0) throw new PayloadError('block-size-zero', `subBlocks[${i}].blockSize is 0`);
    const start = r.count(`subBlocks[${i}].start`);
    subBlocks.push({ groupId, blockSize, start, values: r.values(`subBlocks[${i}].values`) });
  }
  r.end();
  return { version, numTokens, producerTpSize, tokenDigest: digest, groups, sampleThreshold, subBlocks };
}

/**
 * Decodes the NIXL pull carrier's `kv_checksums` text (SPEC 7): canonical standard base64 with
 * padding (no whitespace, no URL-safe alphabet, zero unused bits), then {@link decodePayload}.
 * Its length is checked against the limit before decoding.
 *
 * @param s - the text, as found in `kv_transfer_params` (untrusted; a non-string is rejected).
 * @throws PayloadError (reason `base64` for bad text, `too-large` for an over-long one, else as
 *   {@link decodePayload}), and nothing else.
 */
export function decodePayloadBase64(s: string): ChecksumPayload {
  if (typeof s !== 'string') throw new PayloadError('base64', `expected a base64 string, got ${describeValue(s)}`);
  if (s.length > MAX_BASE64_CHARS) {
    throw new PayloadError('too-large', `${s.length} base64 characters exceeds the ${MAX_PAYLOAD_BYTES}-byte limit`);
  }
  const bytes = Buffer.from(s, 'base64');
  // Node's decoder skips bad characters and tolerates missing padding; only text that is the
  // exact encoding of what it decoded is canonical standard base64.
  if (bytes.toString('base64') !== s) {
    throw new PayloadError('base64', 'not canonical standard base64 with padding');
  }
  return decodePayload(bytes);
}

function describeValue(v: unknown): string {
  return v === null ? 'null' : typeof v;
}

/** Names a MessagePack type byte for error messages. */
function describeTag(tag: number): string {
  if (tag <= 0x7f || (tag >= 0xcc && tag <= 0xd3) || tag >= 0xe0) return 'integer';
  if (tag <= 0x8f || tag === 0xde || tag === 0xdf) return 'map';
  if (tag <= 0x9f || tag === 0xdc || tag === 0xdd) return 'array';
  if (tag <= 0xbf || (tag >= 0xd9 && tag <= 0xdb)) return 'str';
  if (tag === 0xc0) return 'nil';
  if (tag === 0xc2 || tag === 0xc3) return 'bool';
  if (tag >= 0xc4 && tag <= 0xc6) return 'bin';
  if (tag === 0xca || tag === 0xcb) return 'float';
  if (tag === 0xc1) return 'the never-used byte';
  return 'ext';
}

/**
 * A cursor over the payload bytes. Every read checks the bytes left first and throws
 * {@link PayloadError}; `field` names what is being read, for the message.
 */
class Reader {
  private readonly view: DataView;
  private pos = 0;

  constructor(private readonly bytes: Uint8Array) {
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  }

  /** Ensures `n` more bytes exist. */
  private need(field: string, n: number): void {
    if (this.bytes.length - this.pos < n) {
      const end = this.bytes.length;
      throw new PayloadError('truncated', `${field}: payload ends at byte ${end}, ${n} more bytes needed`);
    }
  }

  private wrongType(field: string, expected: string, tag: number): PayloadError {
    const hex = tag.toString(16).padStart(2, '0');
    const found = `${describeTag(tag)} (0x${hex})`;
    return new PayloadError('type', `${field} at byte ${this.pos - 1}: expected ${expected}, found ${found}`);
  }

  private negative(field: string): PayloadError {
    return new PayloadError('negative', `${field} is negative`);
  }

  /** Reads the type byte. */
  private tag(field: string): number {
    this.need(field, 1);
    return this.bytes[this.pos++];
  }

  /**
   * Any integer family holding a value >= 0; the value as a double (exact up to 2^53, and
   * above `Number.MAX_SAFE_INTEGER` whenever the integer is).
   */
  int(field: string): number {
    const tag = this.tag(field);
    if (tag <= 0x7f) return tag;
    if (tag >= 0xe0) throw this.negative(field); // negative fixint: -32..-1
    const { view } = this;
    let value: number;
    switch (tag) {
      case 0xcc:
        this.need(field, 1);
        value = view.getUint8(this.pos);
        this.pos += 1;
        return value;
      case 0xcd:
        this.need(field, 2);
        value = view.getUint16(this.pos);
        this.pos += 2;
        return value;
      case 0xce:
        this.need(field, 4);
        value = view.getUint32(this.pos);
        this.pos += 4;
        return value;
      case 0xcf:
        this.need(field, 8);
        value = view.getUint32(this.pos) * TWO_POW_32 + view.getUint32(this.pos + 4);
        this.pos += 8;
        return value;
      case 0xd0:
        this.need(field, 1);
        value = view.getInt8(this.pos);
        this.pos += 1;
        break;
      case 0xd1:
        this.need(field, 2);
        value = view.getInt16(this.pos);
        this.pos += 2;
        break;
      case 0xd2:
        this.need(field, 4);
        value = view.getInt32(this.pos);
        this.pos += 4;
        break;
      case 0xd3:
        this.need(field, 8);
        value = view.getInt32(this.pos) * TWO_POW_32 + view.getUint32(this.pos + 4);
        this.pos += 8;
        break;
      default:
        throw this.wrongType(field, 'an integer', tag);
    }
    if (value < 0) throw this.negative(field);
    return value;
  }

  /** An integer in [0, `Number.MAX_SAFE_INTEGER`]. */
  count(field: string): number {
    const value = this.int(field);
    if (value > Number.MAX_SAFE_INTEGER) {
      throw new PayloadError('integer-too-large', `${field} exceeds Number.MAX_SAFE_INTEGER`);
    }
    return value;
  }

  /** An integer in [0, 2^64), exactly. */
  uint64(field: string): bigint {
    this.need(field, 1);
    const tag = this.bytes[this.pos];
    if (tag !== 0xcf && tag !== 0xd3) return BigInt(this.int(field));
    this.need(field, 9);
    const value = this.view.getBigUint64(this.pos + 1);
    if (tag === 0xd3 && value >= 1n << 63n) throw this.negative(field);
    this.pos += 9;
    return value;
  }

  /** Any array header; returns the declared element count (not yet checked against the bytes). */
  arrayHeader(field: string): number {
    const tag = this.tag(field);
    if (tag >= 0x90 && tag <= 0x9f) return tag & 0x0f;
    if (tag === 0xdc) {
      this.need(field, 2);
      const n = this.view.getUint16(this.pos);
      this.pos += 2;
      return n;
    }
    if (tag === 0xdd) {
      this.need(field, 4);
      const n = this.view.getUint32(this.pos);
      this.pos += 4;
      return n;
    }
    throw this.wrongType(field, 'an array', tag);
  }

  /** An array header declaring exactly `n` elements. */
  fixedArray(field: string, n: number): void {
    const count = this.arrayHeader(field);
    if (count !== n) throw new PayloadError('arity', `${field} has ${count} elements, expected ${n}`);
  }

  /** Any bin family holding `8 * k` bytes, copied into a fresh BigUint64Array of k LE values. */
  values(field: string): BigUint64Array {
    const tag = this.tag(field);
    let headerBytes: number;
    if (tag === 0xc4) headerBytes = 1;
    else if (tag === 0xc5) headerBytes = 2;
    else if (tag === 0xc6) headerBytes = 4;
    else throw this.wrongType(field, 'a bin', tag);
    this.need(field, headerBytes);
    const n =
      headerBytes === 1
        ? this.view.getUint8(this.pos)
        : headerBytes === 2
          ? this.view.getUint16(this.pos)
          : this.view.getUint32(this.pos);
    this.pos += headerBytes;
    this.need(field, n);
    if (n % 8 !== 0) throw new PayloadError('values-length', `${field} holds ${n} bytes, not a multiple of 8`);
    const values = new BigUint64Array(n / 8);
    const out = new Uint8Array(values.buffer);
    out.set(this.bytes.subarray(this.pos, this.pos + n));
    if (!HOST_IS_LE) swapUint64Bytes(out);
    this.pos += n;
    return values;
  }

  /** Ensures every byte was read. */
  end(): void {
    const left = this.bytes.length - this.pos;
    if (left !== 0) {
      throw new PayloadError('trailing-bytes', `${left} bytes after the payload's end at byte ${this.pos}`);
    }
  }
}

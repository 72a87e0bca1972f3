/**
 * The MooncakeConnector side channel (ZeroMQ DEALER on each consumer worker, ROUTER on each
 * producer worker): MessagePack (msgpackr) messages and their strict decoders.
 *
 * Two messages, both MessagePack maps with string keys (vLLM's `MooncakeXferMetadata` and
 * `MooncakeXferResponse`, extended for kvconnect's layouts):
 *
 * - {@link TransferMetadata}, consumer -> producer: the consumer worker's transfer agent metadata,
 *   its engine id, TP/PP size and rank, its registered regions (addresses and lengths: the "cache
 *   base addresses"), the layout of its caches (per cache: strides, block sizes, parts), and the
 *   requests to write: consumer request id -> `[transfer_id, block ids per group, first token,
 *   numTokens]`.
 * - {@link TransferResponse}, producer -> consumer: `status` (0 finish, 1 continue, 2 error),
 *   `ok_reqs`, `err_reqs`, `err_msg`, and `kv_checksums` (SPEC 7: consumer request id -> the
 *   encoded checksum payload, a bin; left out when empty).
 *
 * Decoding is strict: the message size is checked before parsing, every field is type and range
 * checked with limits ({@link LIMITS}), and every defect is a {@link MooncakeProtocolError}; the
 * decoders never throw anything else. Unknown fields are ignored, so newer and older peers keep
 * working (an older producer sends no `kv_checksums`: the consumer's loads are then unverified).
 * @module
 */
import { isDtype, type Dtype } from '@kvconnect/checksum';
import { Packr, Unpackr } from 'msgpackr';

/** Transfer response status (vLLM `MooncakeXferResponseStatus`). */
export const XferStatusCode = Object.freeze({ FINISH: 0, CONTINUE: 1, ERROR: 2 } as const);
/** A transfer response status value. */
export type XferStatusCode = (typeof XferStatusCode)[keyof typeof XferStatusCode];

/** Limits the decoders enforce (a message outside them is rejected). */
export const LIMITS = Object.freeze({
  /** Largest side-channel message, bytes (also the sockets' ZMQ_MAXMSGSIZE by default). */
  messageBytes: 64 * 1024 * 1024,
  /** Longest id (request, transfer, engine), characters. */
  idLength: 1024,
  /** Most requests in one metadata message, and request ids in one response list. */
  requests: 65_536,
  /** Most KV cache groups of a request. */
  groups: 64,
  /** Most block ids of one group of one request. */
  blocksPerGroup: 1 << 22,
  /** Most registered regions a consumer worker advertises. */
  regions: 65_536,
  /** Most caches (layers) in a layout. */
  caches: 65_536,
  /** Most parts of an attention cell, and states of a state cache. */
  parts: 16,
  /** Most dimensions of a state tensor. */
  dims: 8,
  /** Largest TP or PP size. */
  worldSize: 4096,
  /** Longest error message, characters. */
  errorMessage: 16_384,
  /** Largest transfer agent metadata blob, bytes. */
  agentMetadataBytes: 16 * 1024 * 1024,
  /** Largest checksum payload carried in `kv_checksums`, bytes (SPEC 6's limit). */
  payloadBytes: 16 * 1024 * 1024,
});

/** Why a side-channel message was rejected. */
export class MooncakeProtocolError extends Error {
  constructor(
    /** The field path (`requests["r1"][1][0]`) or `(message)`. */
    readonly path: string,
    message: string,
  ) {
    super(`mooncake side channel: ${path}: ${message}`);
    this.name = 'MooncakeProtocolError';
  }
}

/** How a cache's heads are held across TP ranks (the checksum package's `Replication`). */
export type WireReplication = number | 'all' | { totalKvHeads: number };

/** One part (K, V, or the whole cell) of an attention cache, as `@kvconnect/checksum`'s `AttentionPart`. */
export interface WirePart {
  region: number;
  offset: number;
  bytes: number;
  blockStride: number;
  headStride: number;
  tokenStride: number;
  kernelBlockTokens?: number;
  kernelBlockStride?: number;
}

/** One state tensor, as `@kvconnect/checksum`'s `StateTensor` (strides always given). */
export interface WireState {
  dtype: Dtype;
  shape: number[];
  region: number;
  offset: number;
  blockStride: number;
  strides: number[];
  split?: { axis: number; segments: Array<[number, number]> };
}

/** One cache of the consumer worker's layout. */
export type WireCache =
  | { kind: 'attention'; name: string; group: number; dtype: Dtype; blockSize: number; localHeads: number; replication?: WireReplication; parts: WirePart[] }
  | { kind: 'state'; name: string; group: number; states: WireState[] };

/** A request the consumer asks the producer to write. */
export interface WireLoad {
  /** The proxy's shared transfer id. */
  transferId: string;
  /** Consumer block ids per KV cache group (engine group order). */
  blocks: number[][];
  /** First token to write (the consumer's local prefix hit). */
  firstToken: number;
  /** Tokens of the load (first token + external tokens). */
  numTokens: number;
}

/** Consumer -> producer: what to write where. */
export interface TransferMetadata {
  /** The consumer worker's transfer agent metadata blob. */
  agentMetadata: Uint8Array;
  /** The transfer backend the consumer uses (`embedded`, `mooncake`). */
  backend: string;
  engineId: string;
  tpSize: number;
  tpRank: number;
  ppSize: number;
  ppRank: number;
  /** Registered regions, in the worker's region order: `[addr, length]`. */
  regions: Array<[number, number]>;
  caches: WireCache[];
  /** Consumer request id -> load. */
  requests: Map<string, WireLoad>;
}

/** Producer -> consumer: which requests were written. */
export interface TransferResponse {
  status: XferStatusCode;
  okReqs: string[];
  errReqs: string[];
  errMsg?: string;
  /** SPEC 7 `kv_checksums`: consumer request id -> encoded checksum payload. */
  kvChecksums: Map<string, Uint8Array>;
}

const packr = new Packr({ useRecords: false, variableMapSize: true });
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: false, int64AsType: 'number' });

function pack(x: unknown): Uint8Array {
  const b = packr.pack(x);
  return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
}

const repl = (r: WireReplication | undefined): unknown => (r === undefined ? undefined : typeof r === 'object' ? new Map([['total_kv_heads', r.totalKvHeads]]) : r);

/** Encodes a {@link TransferMetadata}. */
export function encodeTransferMetadata(m: TransferMetadata): Uint8Array {
  const caches = m.caches.map((c) => {
    const o = new Map<string, unknown>([
      ['kind', c.kind],
      ['name', c.name],
      ['group', c.group],
    ]);
    if (c.kind === 'attention') {
      o.set('dtype', c.dtype);
      o.set('block_size', c.blockSize);
      o.set('local_heads', c.localHeads);
      if (c.replication !== undefined) o.set('replication', repl(c.replication));
      o.set('parts', c.parts.map((p) => [p.region, p.offset, p.bytes, p.blockStride, p.headStride, p.tokenStride, p.kernelBlockTokens ?? 0, p.kernelBlockStride ?? 0]));
    } else {
      o.set(
        'states',
        c.states.map((s) => [s.dtype, s.shape, s.region, s.offset, s.blockStride, s.strides, s.split ? [s.split.axis, s.split.segments] : null]),
      );
    }
    return o;
  });
  const requests = new Map<string, unknown>();
  for (const [id, r] of m.requests) requests.set(id, [r.transferId, r.blocks, r.firstToken, r.numTokens]);
  return pack(
    new Map<string, unknown>([
      ['agent_metadata', m.agentMetadata],
      ['backend', m.backend],
      ['engine_id', m.engineId],
      ['tp_size', m.tpSize],
      ['tp_rank', m.tpRank],
      ['pp_size', m.ppSize],
      ['pp_rank', m.ppRank],
      ['regions', m.regions],
      ['caches', caches],
      ['requests', requests],
    ]),
  );
}

/** Encodes a {@link TransferResponse}; `kv_checksums` is left out when empty (SPEC 7). */
export function encodeTransferResponse(r: TransferResponse): Uint8Array {
  const o = new Map<string, unknown>([
    ['status', r.status],
    ['ok_reqs', r.okReqs],
    ['err_reqs', r.errReqs],
  ]);
  if (r.errMsg !== undefined) o.set('err_msg', r.errMsg);
  if (r.kvChecksums.size > 0) o.set('kv_checksums', r.kvChecksums);
  return pack(o);
}

// ---------------------------------------------------------------------------------------------
// Strict decoding

const fail = (path: string, msg: string): never => {
  throw new MooncakeProtocolError(path, msg);
};

function describe(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  if (v instanceof Uint8Array) return 'bin';
  if (v instanceof Map) return 'map';
  return typeof v;
}

function parse(bytes: Uint8Array, maxBytes: number): Map<unknown, unknown> {
  if (!(bytes instanceof Uint8Array)) fail('(message)', `expected bytes, got ${describe(bytes)}`);
  if (bytes.byteLength > maxBytes) fail('(message)', `${bytes.byteLength} bytes exceed the limit of ${maxBytes}`);
  let v: unknown;
  try {
    v = unpackr.unpack(bytes);
  } catch (e) {
    fail('(message)', `not MessagePack: ${e instanceof Error ? e.message : String(e)}`);
  }
  if (!(v instanceof Map)) fail('(message)', `expected a map, got ${describe(v)}`);
  return v as Map<unknown, unknown>;
}

function field(m: Map<unknown, unknown>, key: string, required: boolean): unknown {
  const v = m.get(key);
  if (v === undefined && required) fail(key, 'required');
  return v;
}

function uint(v: unknown, path: string, max = Number.MAX_SAFE_INTEGER): number {
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0) fail(path, `expected a non-negative integer, got ${describe(v)}${typeof v === 'number' ? ` ${v}` : ''}`);
  if ((v as number) > max) fail(path, `${v as number} exceeds ${max}`);
  return v as number;
}

/** A block id: a non-negative id, or a negative one for a null block (e.g. out of a sliding window). */
function blockId(v: unknown, path: string): number {
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < -0x8000_0000 || v > 0xffff_ffff) fail(path, `expected a block id, got ${describe(v)}${typeof v === 'number' ? ` ${v}` : ''}`);
  return v as number;
}

function str(v: unknown, path: string, maxLen: number = LIMITS.idLength, allowEmpty = false): string {
  if (typeof v !== 'string') fail(path, `expected a string, got ${describe(v)}`);
  const s = v as string;
  if (!allowEmpty && s.length === 0) fail(path, 'must not be empty');
  if (s.length > maxLen) fail(path, `longer than ${maxLen} characters`);
  return s;
}

function arr(v: unknown, path: string, max: number): unknown[] {
  if (!Array.isArray(v)) fail(path, `expected an array, got ${describe(v)}`);
  if ((v as unknown[]).length > max) fail(path, `more than ${max} entries`);
  return v as unknown[];
}

function bin(v: unknown, path: string, max: number): Uint8Array {
  if (!(v instanceof Uint8Array)) fail(path, `expected a bin, got ${describe(v)}`);
  const b = v as Uint8Array;
  if (b.byteLength > max) fail(path, `${b.byteLength} bytes exceed the limit of ${max}`);
  return new Uint8Array(b); // a copy: the decoder's views share the message buffer
}

function strMap(v: unknown, path: string, max: number): Map<string, unknown> {
  if (!(v instanceof Map)) fail(path, `expected a map, got ${describe(v)}`);
  const m = v as Map<unknown, unknown>;
  if (m.size > max) fail(path, `more than ${max} entries`);
  for (const k of m.keys()) str(k, `${path} key`);
  return m as Map<string, unknown>;
}

function dtype(v: unknown, path: string): Dtype {
  const s = str(v, path, 32);
  if (!isDtype(s)) fail(path, `unknown dtype ${JSON.stringify(s)}`);
  return s as Dtype;
}

function decodeReplication(v: unknown, path: string): WireReplication | undefined {
  if (v === undefined) return undefined;
  if (v === 'all') return 'all';
  if (typeof v === 'number') return Math.max(1, uint(v, path, LIMITS.worldSize));
  if (v instanceof Map) return { totalKvHeads: Math.max(1, uint(v.get('total_kv_heads'), `${path}.total_kv_heads`, 1 << 20)) };
  return fail(path, `expected a number, "all" or a map, got ${describe(v)}`);
}

function decodeCache(v: unknown, path: string, numRegions: number): WireCache {
  if (!(v instanceof Map)) fail(path, `expected a map, got ${describe(v)}`);
  const m = v as Map<unknown, unknown>;
  const kind = field(m, 'kind', true);
  const name = str(field(m, 'name', true), `${path}.name`);
  const group = uint(field(m, 'group', true), `${path}.group`, LIMITS.groups - 1);
  const region = (x: unknown, p: string) => {
    const r = uint(x, p);
    if (r >= numRegions) fail(p, `region ${r} not among the ${numRegions} advertised`);
    return r;
  };
  if (kind === 'attention') {
    const parts = arr(field(m, 'parts', true), `${path}.parts`, LIMITS.parts).map((p, i) => {
      const pp = `${path}.parts[${i}]`;
      const a = arr(p, pp, 8);
      if (a.length !== 8) fail(pp, `expected 8 entries, got ${a.length}`);
      const kbt = uint(a[6], `${pp}[6]`);
      const kbs = uint(a[7], `${pp}[7]`);
      const part: WirePart = {
        region: region(a[0], `${pp}[0]`),
        offset: uint(a[1], `${pp}[1]`),
        bytes: uint(a[2], `${pp}[2]`, 1 << 30),
        blockStride: uint(a[3], `${pp}[3]`),
        headStride: uint(a[4], `${pp}[4]`),
        tokenStride: uint(a[5], `${pp}[5]`),
      };
      if (part.bytes === 0) fail(`${pp}[2]`, 'a part must have bytes');
      if (kbt > 0) {
        part.kernelBlockTokens = kbt;
        part.kernelBlockStride = kbs;
      }
      return part;
    });
    if (parts.length === 0) fail(`${path}.parts`, 'an attention cache needs parts');
    return {
      kind: 'attention',
      name,
      group,
      dtype: dtype(field(m, 'dtype', true), `${path}.dtype`),
      blockSize: Math.max(1, uint(field(m, 'block_size', true), `${path}.block_size`, 1 << 20)),
      localHeads: uint(field(m, 'local_heads', true), `${path}.local_heads`, 1 << 20),
      replication: decodeReplication(m.get('replication'), `${path}.replication`),
      parts,
    };
  }
  if (kind === 'state') {
    const states = arr(field(m, 'states', true), `${path}.states`, LIMITS.parts).map((s, i) => {
      const sp = `${path}.states[${i}]`;
      const a = arr(s, sp, 7);
      if (a.length !== 7) fail(sp, `expected 7 entries, got ${a.length}`);
      const shape = arr(a[1], `${sp}.shape`, LIMITS.dims).map((d, k) => uint(d, `${sp}.shape[${k}]`, 1 << 24));
      const strides = arr(a[5], `${sp}.strides`, LIMITS.dims).map((d, k) => uint(d, `${sp}.strides[${k}]`));
      if (strides.length !== shape.length) fail(`${sp}.strides`, `${strides.length} strides for ${shape.length} dimensions`);
      const st: WireState = { dtype: dtype(a[0], `${sp}.dtype`), shape, region: region(a[2], `${sp}.region`), offset: uint(a[3], `${sp}.offset`), blockStride: uint(a[4], `${sp}.blockStride`), strides };
      if (a[6] !== null && a[6] !== undefined) {
        const sa = arr(a[6], `${sp}.split`, 2);
        if (sa.length !== 2) fail(`${sp}.split`, 'expected [axis, segments]');
        const axis = uint(sa[0], `${sp}.split.axis`, shape.length - 1);
        const segments = arr(sa[1], `${sp}.split.segments`, 64).map((x, k) => {
          const g = arr(x, `${sp}.split.segments[${k}]`, 2);
          if (g.length !== 2) fail(`${sp}.split.segments[${k}]`, 'expected [localSize, replicas]');
          return [uint(g[0], `${sp}.split.segments[${k}][0]`, 1 << 24), Math.max(1, uint(g[1], `${sp}.split.segments[${k}][1]`, LIMITS.worldSize))] as [number, number];
        });
        if (segments.reduce((x, g) => x + g[0], 0) !== shape[axis]) fail(`${sp}.split.segments`, `segments do not partition dimension ${axis} (${shape[axis]})`);
        st.split = { axis, segments };
      }
      return st;
    });
    return { kind: 'state', name, group, states };
  }
  return fail(`${path}.kind`, `expected "attention" or "state", got ${JSON.stringify(kind)}`);
}

/**
 * Decodes a consumer's {@link TransferMetadata} (untrusted bytes).
 * @throws MooncakeProtocolError for any defect (never anything else).
 */
export function decodeTransferMetadata(bytes: Uint8Array, maxBytes: number = LIMITS.messageBytes): TransferMetadata {
  try {
    const m = parse(bytes, maxBytes);
    const tpSize = uint(field(m, 'tp_size', true), 'tp_size', LIMITS.worldSize);
    const ppSize = uint(field(m, 'pp_size', true), 'pp_size', LIMITS.worldSize);
    if (tpSize < 1) fail('tp_size', 'must be at least 1');
    if (ppSize < 1) fail('pp_size', 'must be at least 1');
    const tpRank = uint(field(m, 'tp_rank', true), 'tp_rank', tpSize - 1);
    const ppRank = uint(field(m, 'pp_rank', true), 'pp_rank', ppSize - 1);
    const regions = arr(field(m, 'regions', true), 'regions', LIMITS.regions).map((r, i) => {
      const a = arr(r, `regions[${i}]`, 2);
      if (a.length !== 2) fail(`regions[${i}]`, 'expected [addr, length]');
      return [uint(a[0], `regions[${i}][0]`), uint(a[1], `regions[${i}][1]`)] as [number, number];
    });
    const caches = arr(field(m, 'caches', true), 'caches', LIMITS.caches).map((c, i) => decodeCache(c, `caches[${i}]`, regions.length));
    const reqMap = strMap(field(m, 'requests', true), 'requests', LIMITS.requests);
    const requests = new Map<string, WireLoad>();
    for (const [id, v] of reqMap) {
      const p = `requests[${JSON.stringify(id)}]`;
      const a = arr(v, p, 4);
      if (a.length !== 4) fail(p, 'expected [transfer_id, blocks, first_token, num_tokens]');
      const blocks = arr(a[1], `${p}[1]`, LIMITS.groups).map((g, gi) => arr(g, `${p}[1][${gi}]`, LIMITS.blocksPerGroup).map((b, bi) => blockId(b, `${p}[1][${gi}][${bi}]`)));
      const firstToken = uint(a[2], `${p}[2]`);
      const numTokens = uint(a[3], `${p}[3]`);
      if (numTokens <= firstToken) fail(p, `num_tokens ${numTokens} must exceed first_token ${firstToken}`);
      requests.set(id, { transferId: str(a[0], `${p}[0]`), blocks, firstToken, numTokens });
    }
    return {
      agentMetadata: bin(field(m, 'agent_metadata', true), 'agent_metadata', LIMITS.agentMetadataBytes),
      backend: str(field(m, 'backend', true), 'backend', 64),
      engineId: str(field(m, 'engine_id', true), 'engine_id'),
      tpSize,
      tpRank,
      ppSize,
      ppRank,
      regions,
      caches,
      requests,
    };
  } catch (e) {
    if (e instanceof MooncakeProtocolError) throw e;
    throw new MooncakeProtocolError('(message)', e instanceof Error ? e.message : String(e));
  }
}

/**
 * Decodes a producer's {@link TransferResponse} (untrusted bytes). Unknown fields are ignored;
 * an absent `kv_checksums` is an empty map.
 * @throws MooncakeProtocolError for any defect (never anything else).
 */
export function decodeTransferResponse(bytes: Uint8Array, maxBytes: number = LIMITS.messageBytes): TransferResponse {
  try {
    const m = parse(bytes, maxBytes);
    const status = uint(field(m, 'status', true), 'status', 2) as XferStatusCode;
    const ids = (k: string) => {
      const v = m.get(k);
      return v === undefined ? [] : arr(v, k, LIMITS.requests).map((x, i) => str(x, `${k}[${i}]`));
    };
    const okReqs = ids('ok_reqs');
    const errReqs = ids('err_reqs');
    const em = m.get('err_msg');
    const errMsg = em === undefined || em === null ? undefined : str(em, 'err_msg', LIMITS.errorMessage, true);
    const kvChecksums = new Map<string, Uint8Array>();
    const kc = m.get('kv_checksums');
    if (kc !== undefined) {
      for (const [id, p] of strMap(kc, 'kv_checksums', LIMITS.requests)) kvChecksums.set(id, bin(p, `kv_checksums[${JSON.stringify(id)}]`, LIMITS.payloadBytes));
    }
    return { status, okReqs, errReqs, errMsg, kvChecksums };
  } catch (e) {
    if (e instanceof MooncakeProtocolError) throw e;
    throw new MooncakeProtocolError('(message)', e instanceof Error ? e.message : String(e));
  }
}

/**
 * The MooncakeConnector side channel (ZeroMQ DEALER on each consumer worker, ROUTER on each
 * producer worker): MessagePack (msgpackr) messages and their strict decoders.
 *
 * Two messages, both MessagePack maps with string keys (vLLM's `MooncakeXferMetadata` and
 * `MooncakeXferResponse`, extended for kvconnect's layouts):
 *
 * - {@link TransferMetadata}, consumer -> producer: the consumer worker's transfer agent metadata,
 *   its engine id, TP/PP size and rank, its registered regions (addresses and lengths: the "cache
 *   base addresses") and the memory they are in (`memory`: `[kind, device]`, `DRAM` host memory or
 *   `VRAM` device memory of CUDA device `device`; one kind and device per worker), the layout of its caches (per cache: strides, block sizes, parts), and the
 *   requests to write: consumer request id -> `[transfer_id, block ids per group, first token,
 *   numTokens, lease capability or nil]`.
 * - {@link TransferResponse}, producer -> consumer: `status` (0 finish, 1 continue, 2 error),
 *   `ok_reqs`, `err_reqs`, `err_msg`, and `kv_checksums` (SPEC 7: consumer request id -> the
 *   encoded checksum payload, a bin; left out when empty).
 *
 * Decoding is strict: the message size is checked before parsing, every field is type and range
 * checked with limits ({@link LIMITS}), and every defect is a {@link MooncakeProtocolError}; the
 * decoders never throw anything else. Unknown fields of the two messages are ignored (an older
 * producer sends no `kv_checksums`: the consumer's loads are then unverified).
 *
 * Since protocol version 2 both messages travel inside an {@link SideEnvelope} that carries
 * {@link MOONCAKE_PROTOCOL_VERSION} and {@link MOONCAKE_COMPAT_HASH}; a peer with another
 * version or hash is refused with a {@link MooncakeIncompatibleError} before anything else is
 * read. The handshake and its proofs are in `channel.ts`; `docs/security.md (Mooncake)` describes
 * the model.
 *
 * Version history (bump {@link MOONCAKE_PROTOCOL_VERSION} and add a line to
 * `packages/mooncake/PROTOCOL-CHANGELOG.md` for every change of the bytes on the wire):
 * - 1: bare `TransferMetadata` / `TransferResponse` maps (vLLM's layout), no version field.
 * - 2: the envelope (`v`, `compat`, `kind`), a HELLO / WELCOME handshake per connection, and
 *   HMAC proofs over every message when a cluster secret is set.
 * - 3: `TransferMetadata.memory` (`[kind, device]`): the consumer's KV may be device memory, which
 *   the producer writes as such (issue 10: device KV).
 * - 4: the `loc` envelope (consumer -> producer, sealed as `md`) carrying a {@link LocalizeRequest}
 *   and answered by a `resp` whose body is a {@link LocalizeReply}: fine sums of a mismatched
 *   load's blocks (issue 13 section 1, `docs/localize.md`). A load that verifies sends no `loc`.
 * - 5: `consumer_key` in {@link TransferMetadata} and {@link LocalizeRequest} (the consumer
 *   engine's key, `@kvconnect/nixl-common` `consumer-binding.ts`): a producer worker binds a
 *   transfer to the key of the first `md` it serves and refuses a `loc` with another key
 *   (`refuse` `forbidden`), or one over the consumer's budget (`refuse` `busy`).
 * - 6: the lease capability (`kv_transfer_params.lease_capability`, 64 hex digits, drawn by the
 *   proxy with the `transfer_id`; `consumer-binding.ts`) as a fifth element of each request of
 *   {@link TransferMetadata} (nil when none) and `lease_capability` in {@link LocalizeRequest};
 *   `err_code` (`forbidden`) in {@link TransferResponse}. A producer worker serves an `md` request
 *   or a `loc` of a transfer that has a capability only with it, and an `md` request of a
 *   transfer bound to another consumer key not at all (`err_code` `forbidden`); the `loc` budget
 *   is charged per transfer.
 *
 * The field helpers (`uint`, `str`, `arr`, `bin`, `strMap`) are `@kvconnect/transfer`'s
 * `strictDecoders` (`packages/transfer/src/strict-decode.ts`), the set nixl-common's codec uses too.
 * @module
 */
import { createHash } from 'node:crypto';
import { isDtype, type Dtype } from '@kvconnect/checksum';
import type { LocalizeAnswer, LocalizeQuery } from '@kvconnect/core';
import { CONSUMER_KEY_CHARS, LEASE_CAPABILITY_CHARS, decodeLocalizeBody, encodeLocalizeBody, isConsumerKey, isLeaseCapability } from '@kvconnect/nixl-common';
import { describeValue, strictDecoders } from '@kvconnect/transfer';
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
  /** The transfer's lease capability (version 6, `kv_transfer_params.lease_capability`); null or absent: none. */
  leaseCapability?: string | null;
}

/** The memory a worker's KV regions are in (one kind and device per worker). */
export interface WireMemory {
  kind: 'DRAM' | 'VRAM';
  /** CUDA device ordinal for VRAM, 0 for DRAM. */
  deviceId: number;
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
  /**
   * The memory every region is in (wire `memory: [kind, device]`): `DRAM` (host memory, device 0)
   * or `VRAM` (device memory of CUDA device `deviceId`). Default `{ kind: 'DRAM', deviceId: 0 }`.
   */
  memory?: WireMemory;
  caches: WireCache[];
  /** Consumer request id -> load. */
  requests: Map<string, WireLoad>;
  /** The consumer engine's key (version 5, wire `consumer_key`: 32 hex digits; absent: none), see `consumer-binding.ts`. */
  consumerKey?: string | null;
}

/** Producer -> consumer: which requests were written. */
export interface TransferResponse {
  status: XferStatusCode;
  okReqs: string[];
  errReqs: string[];
  errMsg?: string;
  /** Why `errReqs` failed, when typed (version 6): `forbidden`, no or another lease capability, or another consumer's transfer. */
  errCode?: 'forbidden';
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
  for (const [id, r] of m.requests) requests.set(id, [r.transferId, r.blocks, r.firstToken, r.numTokens, r.leaseCapability ?? null]);
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
      ['memory', [m.memory?.kind ?? 'DRAM', m.memory?.deviceId ?? 0]],
      ['caches', caches],
      ['requests', requests],
      ...(m.consumerKey ? [['consumer_key', m.consumerKey] as [string, unknown]] : []),
    ]),
  );
}

/** The optional `consumer_key` field of a map (version 5): 32 lowercase hex digits, or absent / nil (then no `consumerKey`). */
function consumerKeyField(m: Map<unknown, unknown>): { consumerKey?: string } {
  const k = m.get('consumer_key');
  if (k === undefined || k === null) return {};
  if (!isConsumerKey(k)) fail('consumer_key', `expected ${CONSUMER_KEY_CHARS} lowercase hex digits, got ${describe(k)}`);
  return { consumerKey: k as string };
}

/** Encodes a {@link TransferResponse}; `kv_checksums` is left out when empty (SPEC 7). */
export function encodeTransferResponse(r: TransferResponse): Uint8Array {
  const o = new Map<string, unknown>([
    ['status', r.status],
    ['ok_reqs', r.okReqs],
    ['err_reqs', r.errReqs],
  ]);
  if (r.errMsg !== undefined) o.set('err_msg', r.errMsg);
  if (r.errCode !== undefined) o.set('err_code', r.errCode);
  if (r.kvChecksums.size > 0) o.set('kv_checksums', r.kvChecksums);
  return pack(o);
}

// ---------------------------------------------------------------------------------------------
// Strict decoding

const fail = (path: string, msg: string): never => {
  throw new MooncakeProtocolError(path, msg);
};

const describe = describeValue;
/** The shared strict field decoders (`@kvconnect/transfer`'s `strictDecoders`, also nixl-common's), throwing {@link MooncakeProtocolError}. */
const fields = strictDecoders(fail);
const uint = fields.nat;
const arr = (v: unknown, path: string, max: number): unknown[] => fields.arr(v, path, max);
const bin = fields.bin;
/** A string of at most `maxLen` code units (default an id's), not empty unless `allowEmpty`. */
const str = (v: unknown, path: string, maxLen: number = LIMITS.idLength, allowEmpty = false): string => fields.str(v, path, maxLen, allowEmpty ? 0 : 1);
/** A map with id keys. */
const strMap = (v: unknown, path: string, max: number): Map<string, unknown> => fields.strMap(v, path, max, LIMITS.idLength);

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

/** A block id: a non-negative id, or a negative one for a null block (e.g. out of a sliding window). */
function blockId(v: unknown, path: string): number {
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < -0x8000_0000 || v > 0xffff_ffff) fail(path, `expected a block id, got ${describe(v)}${typeof v === 'number' ? ` ${v}` : ''}`);
  return v as number;
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

/** A request's block ids per group (the same checks as `arr` / `blockId`, with paths built only on failure). */
function decodeBlocks(v: unknown, p: () => string): number[][] {
  const groups = Array.isArray(v) && v.length <= LIMITS.groups ? (v as unknown[]) : arr(v, `${p()}[1]`, LIMITS.groups);
  for (let gi = 0; gi < groups.length; gi++) {
    const g = groups[gi];
    if (!Array.isArray(g) || g.length > LIMITS.blocksPerGroup) arr(g, `${p()}[1][${gi}]`, LIMITS.blocksPerGroup);
    for (let bi = 0; bi < (g as unknown[]).length; bi++) {
      const b = (g as unknown[])[bi];
      if (typeof b !== 'number' || !Number.isSafeInteger(b) || b < -0x8000_0000 || b > 0xffff_ffff) blockId(b, `${p()}[1][${gi}][${bi}]`);
    }
  }
  return groups as number[][];
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
    const mem = arr(field(m, 'memory', true), 'memory', 2);
    if (mem.length !== 2) fail('memory', 'expected [kind, device]');
    if (mem[0] !== 'DRAM' && mem[0] !== 'VRAM') fail('memory[0]', `expected "DRAM" or "VRAM", got ${typeof mem[0] === 'string' ? JSON.stringify(mem[0]) : describe(mem[0])}`);
    const memory: WireMemory = { kind: mem[0] as 'DRAM' | 'VRAM', deviceId: uint(mem[1], 'memory[1]', 0xffff) };
    if (memory.kind === 'DRAM' && memory.deviceId !== 0) fail('memory[1]', 'DRAM is device 0');
    const caches = arr(field(m, 'caches', true), 'caches', LIMITS.caches).map((c, i) => decodeCache(c, `caches[${i}]`, regions.length));
    const reqMap = strMap(field(m, 'requests', true), 'requests', LIMITS.requests);
    const requests = new Map<string, WireLoad>();
    for (const [id, v] of reqMap) {
      // Paths are built only on failure: this loop runs up to LIMITS.requests times per message.
      const p = () => `requests[${JSON.stringify(id)}]`;
      if (!Array.isArray(v) || v.length !== 5) fail(p(), Array.isArray(v) ? 'expected [transfer_id, blocks, first_token, num_tokens, lease_capability]' : `expected an array, got ${describe(v)}`);
      const a = v as unknown[];
      const blocks = decodeBlocks(a[1], p);
      const firstToken = typeof a[2] === 'number' && Number.isSafeInteger(a[2]) && a[2] >= 0 ? a[2] : uint(a[2], `${p()}[2]`);
      const numTokens = typeof a[3] === 'number' && Number.isSafeInteger(a[3]) && a[3] >= 0 ? a[3] : uint(a[3], `${p()}[3]`);
      if (numTokens <= firstToken) fail(p(), `num_tokens ${numTokens} must exceed first_token ${firstToken}`);
      const transferId = typeof a[0] === 'string' && a[0].length > 0 && a[0].length <= LIMITS.idLength ? a[0] : str(a[0], `${p()}[0]`);
      // The capability is never echoed in the error (it would reach logs).
      if (a[4] !== null && !isLeaseCapability(a[4])) fail(`${p()}[4]`, `expected nil or ${LEASE_CAPABILITY_CHARS} lowercase hex digits`);
      requests.set(id, a[4] === null ? { transferId, blocks, firstToken, numTokens } : { transferId, blocks, firstToken, numTokens, leaseCapability: a[4] as string });
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
      memory,
      caches,
      requests,
      ...consumerKeyField(m),
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
    const ec = m.get('err_code');
    if (ec !== undefined && ec !== null && ec !== 'forbidden') fail('err_code', `expected "forbidden", got ${describe(ec)}`);
    const kvChecksums = new Map<string, Uint8Array>();
    const kc = m.get('kv_checksums');
    if (kc !== undefined) {
      for (const [id, p] of strMap(kc, 'kv_checksums', LIMITS.requests)) kvChecksums.set(id, bin(p, `kv_checksums[${JSON.stringify(id)}]`, LIMITS.payloadBytes));
    }
    return { status, okReqs, errReqs, errMsg, ...(ec === 'forbidden' ? { errCode: 'forbidden' as const } : {}), kvChecksums };
  } catch (e) {
    if (e instanceof MooncakeProtocolError) throw e;
    throw new MooncakeProtocolError('(message)', e instanceof Error ? e.message : String(e));
  }
}

// ---------------------------------------------------------------------------------------------
// The envelope (protocol version 2)

/** Side-channel protocol version (see the version history in the module comment). */
export const MOONCAKE_PROTOCOL_VERSION = 6;

/** The envelope's message kinds: the handshake, the messages (`loc`: a {@link LocalizeRequest}, since version 4), and a refusal. */
export type EnvelopeKind = 'hello' | 'welcome' | 'md' | 'resp' | 'refuse' | 'loc';
const KINDS: readonly EnvelopeKind[] = ['hello', 'welcome', 'md', 'resp', 'refuse', 'loc'];

/** Why a peer refused a message (the `code` of a `refuse` envelope). */
export type RefuseCode = 'incompatible' | 'unauthenticated' | 'no-session' | 'bad-message' | 'forbidden' | 'busy';
const REFUSE_CODES: readonly RefuseCode[] = ['incompatible', 'unauthenticated', 'no-session', 'bad-message', 'forbidden', 'busy'];

/**
 * The compatibility hash: the first 16 hex digits of SHA-256 over the protocol version and the
 * field lists of every message. Two builds that put other fields on the wire get other hashes
 * even when someone forgot to bump the version.
 */
export const MOONCAKE_COMPAT_HASH: string = createHash('sha256')
  .update(
    JSON.stringify({
      protocol: 'kvconnect-mooncake-side-channel',
      version: MOONCAKE_PROTOCOL_VERSION,
      envelope: ['v', 'compat', 'kind', 'cn', 'sn', 'ts', 'seq', 'body', 'proof', 'code', 'message'],
      kinds: KINDS,
      metadata: ['agent_metadata', 'backend', 'engine_id', 'tp_size', 'tp_rank', 'pp_size', 'pp_rank', 'regions', 'memory', 'caches', 'requests', 'consumer_key'],
      response: ['status', 'ok_reqs', 'err_reqs', 'err_msg', 'err_code', 'kv_checksums'],
      request: ['transfer_id', 'blocks', 'first_token', 'num_tokens', 'lease_capability'],
      localize: ['transfer_id', 'range_tokens', 'groups', 'consumer_key', 'lease_capability'],
      localize_reply: ['answer'],
    }),
  )
  .digest('hex')
  .slice(0, 16);

/**
 * One side-channel message (a MessagePack map with string keys):
 * - `hello` (consumer -> producer, first on a connection): `cn` (16 random bytes), `ts` (ms since
 *   the epoch), `proof` when a cluster secret is set;
 * - `welcome` (producer -> consumer): `cn` echoed, `sn` (16 random bytes), `proof`;
 * - `md` / `resp`: `seq` (1, 2, ... per direction and connection), `body` (the encoded
 *   {@link TransferMetadata} / {@link TransferResponse}), `proof`;
 * - `loc` (consumer -> producer, version 4): as `md` (its `seq` counts with the `md`s), `body` an
 *   encoded {@link LocalizeRequest}; answered by a `resp` whose body is a {@link LocalizeReply};
 * - `refuse`: `code` ({@link RefuseCode}), `message`.
 * Every envelope carries `v` ({@link MOONCAKE_PROTOCOL_VERSION}) and `compat`
 * ({@link MOONCAKE_COMPAT_HASH}).
 */
export interface SideEnvelope {
  kind: EnvelopeKind;
  /** The sender's protocol version (set by {@link encodeEnvelope} unless given). */
  version?: number;
  /** The sender's compatibility hash (set by {@link encodeEnvelope} unless given). */
  compat?: string;
  cn?: Uint8Array;
  sn?: Uint8Array;
  ts?: number;
  seq?: number;
  body?: Uint8Array;
  proof?: Uint8Array;
  code?: RefuseCode;
  message?: string;
}

/** A peer speaks another protocol version or has another compatibility hash. */
export class MooncakeIncompatibleError extends MooncakeProtocolError {
  constructor(
    /** The peer's version (1 for a message without an envelope). */
    readonly peerVersion: number,
    /** The peer's compatibility hash (empty when it sent none). */
    readonly peerCompat: string,
  ) {
    super('(envelope)', `the peer speaks side-channel protocol version ${peerVersion} (compatibility hash ${peerCompat || 'none'}); this side speaks version ${MOONCAKE_PROTOCOL_VERSION} (${MOONCAKE_COMPAT_HASH})`);
    this.name = 'MooncakeIncompatibleError';
  }
}

/** Encodes an envelope with this side's version and compatibility hash (unless the envelope names others: tests). */
export function encodeEnvelope(e: SideEnvelope): Uint8Array {
  const o = new Map<string, unknown>([
    ['v', e.version ?? MOONCAKE_PROTOCOL_VERSION],
    ['compat', e.compat ?? MOONCAKE_COMPAT_HASH],
    ['kind', e.kind],
  ]);
  for (const k of ['cn', 'sn', 'ts', 'seq', 'body', 'proof', 'code', 'message'] as const) if (e[k] !== undefined) o.set(k, e[k]);
  return pack(o);
}

/** Bytes of a nonce (`cn`, `sn`). */
const NONCE_LEN = 16;
/** Bytes of a proof. */
const PROOF_LEN = 32;

/**
 * Decodes an envelope (untrusted bytes). The version and the compatibility hash are checked
 * first; `body` is a view into `bytes` (not a copy).
 * @throws MooncakeIncompatibleError for another version or hash (a map without `v` is version 1);
 *   MooncakeProtocolError for any other defect (never anything else).
 */
export function decodeEnvelope(bytes: Uint8Array, maxBytes: number = LIMITS.messageBytes): SideEnvelope {
  try {
    const m = parse(bytes, maxBytes);
    const v = m.get('v');
    const compat = m.get('compat');
    if (v === undefined) throw new MooncakeIncompatibleError(1, '');
    const version = uint(v, 'v', 0xffff);
    const peerCompat = str(compat, 'compat', 64);
    if (version !== MOONCAKE_PROTOCOL_VERSION || peerCompat !== MOONCAKE_COMPAT_HASH) throw new MooncakeIncompatibleError(version, peerCompat);
    const kind = str(field(m, 'kind', true), 'kind', 16) as EnvelopeKind;
    if (!KINDS.includes(kind)) fail('kind', `unknown kind ${JSON.stringify(kind)}`);
    const e: SideEnvelope = { kind, version, compat: peerCompat };
    const fixed = (k: 'cn' | 'sn' | 'proof', len: number) => {
      const x = m.get(k);
      if (x === undefined) return;
      if (!(x instanceof Uint8Array) || x.byteLength !== len) fail(k, `expected a bin of ${len} bytes, got ${describe(x)}`);
      e[k] = new Uint8Array(x as Uint8Array);
    };
    fixed('cn', NONCE_LEN);
    fixed('sn', NONCE_LEN);
    fixed('proof', PROOF_LEN);
    if (m.get('ts') !== undefined) e.ts = uint(m.get('ts'), 'ts');
    if (m.get('seq') !== undefined) e.seq = uint(m.get('seq'), 'seq');
    const body = m.get('body');
    if (body !== undefined) {
      if (!(body instanceof Uint8Array)) fail('body', `expected a bin, got ${describe(body)}`);
      e.body = body as Uint8Array;
    }
    const code = m.get('code');
    if (code !== undefined) {
      const c = str(code, 'code', 32) as RefuseCode;
      e.code = REFUSE_CODES.includes(c) ? c : 'bad-message';
    }
    if (m.get('message') !== undefined) e.message = str(m.get('message'), 'message', LIMITS.errorMessage, true);
    const need = (k: keyof SideEnvelope) => {
      if (e[k] === undefined) fail(String(k), `required in a ${kind} message`);
    };
    const required: Record<EnvelopeKind, Array<keyof SideEnvelope>> = { hello: ['cn', 'ts'], welcome: ['cn', 'sn'], md: ['seq', 'body'], resp: ['seq', 'body'], refuse: ['code'], loc: ['seq', 'body'] };
    for (const k of required[kind]) need(k);
    return e;
  } catch (err) {
    if (err instanceof MooncakeProtocolError) throw err;
    throw new MooncakeProtocolError('(message)', err instanceof Error ? err.message : String(err));
  }
}

// ---------------------------------------------------------------------------------------------
// LOCALIZE (protocol version 4; docs/localize.md)

/** Limits of a {@link LocalizeRequest}: those of NIXL's `LOCALIZE` (`docs/localize.md`). */
export const LOCALIZE_LIMITS = Object.freeze({ groups: 64, ranges: 1024, rangeTokens: 1 << 20, tokens: 0xffff_ffff });

/**
 * A consumer's drill-down question to one producer worker (`loc` body): the fine sums of the
 * blocks of transfer `transferId` over `query` (`@kvconnect/core` `LocalizeQuery`: the range
 * width in tokens and, per group, the request positions `[tokenStart, tokenEnd)`).
 * Wire: a MessagePack map `{transfer_id: str, range_tokens: uint 1..2^20, groups: [[groupId < 64,
 * tokenStart, tokenEnd], ...]}` (at most 64 distinct groups, at most 1024 ranges of
 * `range_tokens` per group, version 5: `consumer_key`, 32 hex digits, absent or nil when none;
 * version 6: `lease_capability`, 64 hex digits, absent or nil when none).
 */
export interface LocalizeRequest {
  transferId: string;
  query: LocalizeQuery;
  /** The asking consumer engine's key (`consumer-binding.ts`); null or absent: none. */
  consumerKey?: string | null;
  /** The transfer's lease capability (version 6, `consumer-binding.ts`); null or absent: none. */
  leaseCapability?: string | null;
}

/** Encodes a {@link LocalizeRequest}. */
export function encodeLocalizeRequest(r: LocalizeRequest): Uint8Array {
  return pack(
    new Map<string, unknown>([
      ['transfer_id', r.transferId],
      ['range_tokens', r.query.rangeTokens],
      ['groups', r.query.groups.map((g) => [g.groupId, g.tokenStart, g.tokenEnd])],
      ...(r.consumerKey ? [['consumer_key', r.consumerKey] as [string, unknown]] : []),
      ...(r.leaseCapability ? [['lease_capability', r.leaseCapability] as [string, unknown]] : []),
    ]),
  );
}

/**
 * Decodes a {@link LocalizeRequest} (untrusted bytes), strictly.
 * @throws MooncakeProtocolError naming the first bad field (never anything else).
 */
export function decodeLocalizeRequest(bytes: Uint8Array, maxBytes: number = LIMITS.messageBytes): LocalizeRequest {
  try {
    const m = parse(bytes, maxBytes);
    const transferId = str(field(m, 'transfer_id', true), 'transfer_id');
    const rangeTokens = uint(field(m, 'range_tokens', true), 'range_tokens', LOCALIZE_LIMITS.rangeTokens);
    if (rangeTokens < 1) fail('range_tokens', 'must be at least 1');
    const seen = new Set<number>();
    const groups = arr(field(m, 'groups', true), 'groups', LOCALIZE_LIMITS.groups).map((g, i) => {
      const t = arr(g, `groups[${i}]`, 3);
      if (t.length !== 3) fail(`groups[${i}]`, 'expected [groupId, tokenStart, tokenEnd]');
      const groupId = uint(t[0], `groups[${i}][0]`, LOCALIZE_LIMITS.groups - 1);
      if (seen.has(groupId)) fail(`groups[${i}]`, `group ${groupId} repeated`);
      seen.add(groupId);
      const tokenStart = uint(t[1], `groups[${i}][1]`, LOCALIZE_LIMITS.tokens);
      const tokenEnd = uint(t[2], `groups[${i}][2]`, LOCALIZE_LIMITS.tokens);
      if (tokenEnd < tokenStart) fail(`groups[${i}]`, 'tokenEnd before tokenStart');
      if (Math.ceil((tokenEnd - tokenStart) / rangeTokens) > LOCALIZE_LIMITS.ranges) fail(`groups[${i}]`, `more than ${LOCALIZE_LIMITS.ranges} token ranges`);
      return { groupId, tokenStart, tokenEnd };
    });
    const cap = m.get('lease_capability');
    if (cap !== undefined && cap !== null && !isLeaseCapability(cap)) fail('lease_capability', `expected ${LEASE_CAPABILITY_CHARS} lowercase hex digits`);
    return { transferId, query: { rangeTokens, groups }, ...consumerKeyField(m), ...(typeof cap === 'string' ? { leaseCapability: cap } : {}) };
  } catch (err) {
    if (err instanceof MooncakeProtocolError) throw err;
    throw new MooncakeProtocolError('(message)', err instanceof Error ? err.message : String(err));
  }
}

/**
 * A producer worker's answer to a {@link LocalizeRequest} (`resp` body): a MessagePack map
 * `{answer}` whose value is NIXL's `LOCALIZE` ok body (`@kvconnect/nixl-common`
 * `encodeLocalizeBody`: `[0, [[groupId, keys, values, error or nil]...]]` held, with the fine sums
 * in `@kvconnect/checksum` `encodeFineSums` form; or `[1, detail]` gone).
 */
export type LocalizeReply = LocalizeAnswer;

/** Encodes a {@link LocalizeReply}. */
export function encodeLocalizeReply(a: LocalizeReply): Uint8Array {
  return pack(new Map<string, unknown>([['answer', encodeLocalizeBody(a)]]));
}

/**
 * Decodes a {@link LocalizeReply} (untrusted bytes), strictly.
 * @throws MooncakeProtocolError naming the first bad field (never anything else).
 */
export function decodeLocalizeReply(bytes: Uint8Array, maxBytes: number = LIMITS.messageBytes): LocalizeReply {
  try {
    return decodeLocalizeBody(field(parse(bytes, maxBytes), 'answer', true));
  } catch (err) {
    if (err instanceof MooncakeProtocolError) throw err;
    return fail('answer', err instanceof Error ? err.message : String(err));
  }
}

/**
 * The side-channel protocol of the NIXL connectors (handshake and control messages) and its
 * strict codec.
 *
 * Transport: one TCP connection per (client engine, server engine), frames of
 * `u32 length (LE)` + a MessagePack array, at most {@link LIMITS}.frameBytes. Requests are
 * `[seq, type, ...args]`, responses `[seq, 0, body]` (ok) or `[seq, 1, code, message]` (refused).
 *
 * | type | request | ok body |
 * | --- | --- | --- |
 * | `INFO` (1) | `[seq, 1, version, mode, compatHash]` | {@link EngineInfo} |
 * | `LEASE` (2) | `[seq, 2, [requestId...], pinMs, consumerKey, [capability...]]`: heartbeat (pinMs 0: extend by the lease) or pin before a READ | `[[requestId, expiryMs or 0 = gone]...]` |
 * | `RELEASE` (3) | `[seq, 3, [requestId...], consumerKey, [capability...]]`: the consumer will not read these | `[]` |
 * | `PUSH_REG` (4) | `[seq, 4, PushRegistration, consumerKey, capability]`: push mode, a consumer rank registers its blocks | `[]` |
 * | `AUTH` (5) | `[0, 5, version, clientNonce]`: first frame with a cluster secret (below) | `[serverNonce, serverProof]`, seq 0 |
 * | `LOCALIZE` (6) | `[seq, 6, requestId, rangeTokens, [[groupId, tokenStart, tokenEnd]...], consumerKey, capability]`: fine sums of a mismatched load (`docs/localize.md`) | `[0, [[groupId, keys, values, error or nil]...]]` (held) or `[1, detail]` (gone) |
 *
 * An {@link EngineInfo} is what a peer needs to move KV: engine id, TP and PP sizes, block size
 * per group, and per worker rank its agent's metadata blob, registered regions and the block
 * layout of its caches (from the worker's @kvconnect/checksum views), plus a compatibility hash
 * over protocol version {@link NIXL_PROTOCOL_VERSION}, the transfer mode and the model's caches,
 * so that pull and push peers (or different models) refuse each other.
 *
 * **Authentication** (protocol 16, `docs/security.md`): with a cluster secret configured (see
 * `resolveClusterSecret` in @kvconnect/transfer `auth.ts`), a client's first frame is
 * `AUTH` `[0, 5, version, clientNonce]`, answered (seq 0) by `[serverNonce, serverProof]` with
 * `serverProof = makeProof(secret, "nixl-side/auth", clientNonce, serverNonce)`: the client knows
 * it talks to a holder of the secret before it sends anything else. From then on every frame in
 * both directions is *sealed*: its MessagePack body is followed by 32 bytes
 * `makeProof(secret, "nixl-side/request" | "nixl-side/response", clientNonce, serverNonce, body)`
 * ({@link sealFrame}, {@link openFrame}). The server checks the seal before it decodes anything,
 * and request seqs must grow strictly on a connection (a replayed request is refused, and a
 * frame from another connection carries another nonce pair). Without a secret there is no
 * `AUTH` and no seal, and the side channel must listen on loopback (`checkBindHost`).
 * A response with seq 0 is about the connection (an `AUTH` answer, or a refusal that closes it).
 *
 * Version history of {@link NIXL_PROTOCOL_VERSION}:
 * - 15: vLLM `NIXL_CONNECTOR_VERSION` after the KV checksum series (INFO, LEASE, RELEASE, PUSH_REG).
 * - 16: cluster-secret authentication (`AUTH`, sealed frames, refusal codes `unauthenticated`
 *   and `busy`); smaller limits before authentication ({@link LIMITS}.authFrameBytes) and for
 *   requests ({@link LIMITS}.requestFrameBytes).
 *   Unchanged on the wire when the side channel moved to the producer's scheduler half (served
 *   from the workers' handshake metadata, producer.ts) and consumer workers got their own
 *   side-channel clients (peers.ts); `PUSH_REG` may now also be refused `busy` (too many
 *   registrations queued for the next engine step).
 * - 17: `LOCALIZE` (issue #13: fine sums of a mismatched load's blocks while the producer holds
 *   them; `docs/localize.md`). Nothing else changed on the wire; a load that verifies sends no
 *   `LOCALIZE`. A 17 peer and a 16 peer refuse each other at `INFO` (version and compatibility hash).
 * - 18: `consumerKey` (32 hex digits, or nil; `consumer-binding.ts`) last in `LEASE`, `RELEASE`,
 *   `PUSH_REG` and `LOCALIZE`: the producer binds a request to the first consumer key it sees and
 *   refuses `RELEASE` / `LOCALIZE` of it with another key (refusal code `forbidden`); `LOCALIZE`
 *   may be refused `busy` for the asking consumer's budget (`docs/localize.md`, "Binding and budget").
 * - 19: the lease capability (`consumer-binding.ts`: 64 hex digits the producer returns in
 *   `kv_transfer_params.lease_capability`, or nil) last in `LEASE` and `RELEASE` (an array with one
 *   entry per request id) and in `PUSH_REG` and `LOCALIZE`: a request is acted on only with its
 *   capability (else `forbidden`, nothing changed), not by whoever names its id first; the
 *   `LOCALIZE` budget is charged per request. A 19 peer and an 18 peer refuse each other at `INFO`.
 * @module
 */
import { createHash } from 'node:crypto';
import { DTYPE_BYTES, LocalizeError, contiguousStrides, decodeFineSums, encodeFineSums, replicaCount, type AttentionCacheView, type Dtype, type StateCacheView } from '@kvconnect/checksum';
import type { KVCacheGroupConfig, LocalizeAnswer, LocalizeQuery, WorkerKVCaches } from '@kvconnect/core';
import type { RegisteredRegion } from '@kvconnect/transfer';
import { arr, bin, fail, nat, oneOf, packr, pos, str, unpackStrict } from './codec.js';
import { CONSUMER_KEY_CHARS, LEASE_CAPABILITY_CHARS, isConsumerKey, isLeaseCapability } from './consumer-binding.js';

/** Connector protocol version (15: vLLM `NIXL_CONNECTOR_VERSION` after the KV checksum series; 16: authentication; 17: `LOCALIZE`; 18: consumer keys; 19: lease capabilities; history in the module comment). */
export const NIXL_PROTOCOL_VERSION = 19;

/** Who initiates transfers: the consumer READs (`pull`, NixlConnector) or the producer WRITEs (`push`, NixlPushConnector). */
export type TransferMode = 'pull' | 'push';
/** The two modes. */
export const TRANSFER_MODES: readonly TransferMode[] = ['pull', 'push'];

/** Size limits of every decoder of the side channel. */
export const LIMITS = Object.freeze({
  /** Largest frame (a response, e.g. INFO of many ranks), bytes. */
  frameBytes: 64 * 1024 * 1024,
  /** Largest request frame a server accepts, bytes (a PUSH_REG is one rank's layout and block table). */
  requestFrameBytes: 16 * 1024 * 1024,
  /** Largest frame before the connection is authenticated (`AUTH` and its answer or refusal), bytes. */
  authFrameBytes: 8 * 1024,
  /** Longest engine id, agent name or request id. */
  idLength: 1024,
  /** Largest agent metadata blob, bytes. */
  metadataBytes: 8 * 1024 * 1024,
  /** Most worker ranks of an engine. */
  ranks: 4096,
  /** Most registered regions of one rank. */
  regions: 65536,
  /** Most caches of one rank. */
  caches: 4096,
  /** Most KV cache groups. */
  groups: 64,
  /** Most parts of an attention cell. */
  parts: 8,
  /** Most states of a state cache. */
  states: 8,
  /** Most dimensions of a state. */
  dims: 8,
  /** Most TP split segments of a state. */
  segments: 64,
  /** Most block ids of one group in one message. */
  blocks: 1 << 20,
  /** Most request ids in one LEASE / RELEASE. */
  requestIds: 65536,
  /** Longest error message. */
  message: 4096,
  /** Most token ranges of one group in one `LOCALIZE` (`ceil((tokenEnd - tokenStart) / rangeTokens)`). */
  localizeRanges: 1024,
});

/** Message types of the side channel. */
export const MSG = Object.freeze({ INFO: 1, LEASE: 2, RELEASE: 3, PUSH_REG: 4, AUTH: 5, LOCALIZE: 6 } as const);

/**
 * Error codes of refused requests. `unauthenticated`: no or a wrong proof of the cluster secret,
 * a replayed frame, or a secret on one side only (the connection closes); `busy`: the server has
 * too many requests pending, or the asking consumer's `LOCALIZE` budget is spent (retry later);
 * `forbidden` (18): the request was served to another consumer (another consumer key; since 19:
 * no or another lease capability, `consumer-binding.ts`).
 */
export type SideErrorCode = 'incompatible' | 'not-ready' | 'unknown-request' | 'lease-expired' | 'bad-request' | 'internal' | 'unauthenticated' | 'busy' | 'forbidden';
const ERROR_CODES: readonly SideErrorCode[] = ['incompatible', 'not-ready', 'unknown-request', 'lease-expired', 'bad-request', 'internal', 'unauthenticated', 'busy', 'forbidden'];

/** A registered memory region of a rank, as peers address it. */
export interface RegionInfo {
  readonly addr: number;
  readonly length: number;
  readonly kind: 'DRAM' | 'VRAM';
  readonly deviceId: number;
}

/** One part of an attention cell (see @kvconnect/checksum `AttentionPart`); optional fields resolved. */
export interface PartLayout {
  readonly region: number;
  readonly offset: number;
  readonly bytes: number;
  readonly blockStride: number;
  readonly headStride: number;
  readonly tokenStride: number;
  readonly kernelBlockTokens: number;
  readonly kernelBlockStride: number;
}

/** A token-based cache of a rank (attention, MLA latent, indexer). */
export interface AttentionLayout {
  readonly kind: 'attention';
  /** Index of the cache's KV cache group (into the engine's group list). */
  readonly group: number;
  readonly name: string;
  readonly dtype: Dtype;
  readonly numBlocks: number;
  readonly blockSize: number;
  readonly localHeads: number;
  /** Replicas R at this rank's TP size (SPEC 1), resolved. */
  readonly replicas: number;
  readonly parts: readonly PartLayout[];
}

/** One state tensor; strides resolved; `split` null for a state without a TP split declaration. */
export interface StateTensorLayout {
  readonly dtype: Dtype;
  readonly shape: readonly number[];
  readonly region: number;
  readonly offset: number;
  readonly blockStride: number;
  readonly strides: readonly number[];
  readonly split: { readonly axis: number; readonly segments: ReadonlyArray<readonly [number, number]> } | null;
}

/** A state cache of a rank (Mamba, GDN). */
export interface StateLayoutInfo {
  readonly kind: 'state';
  readonly group: number;
  readonly name: string;
  readonly numBlocks: number;
  readonly states: readonly StateTensorLayout[];
}

/** Any cache layout. */
export type CacheLayout = AttentionLayout | StateLayoutInfo;

/** What a peer needs of one worker rank. */
export interface RankInfo {
  readonly tpRank: number;
  readonly tpSize: number;
  readonly ppRank: number;
  readonly ppSize: number;
  /** The rank's transfer agent name and metadata blob (`TransferAgent.getLocalMetadata`). */
  readonly agentName: string;
  readonly agentMetadata: Uint8Array;
  readonly regions: readonly RegionInfo[];
  readonly caches: readonly CacheLayout[];
}

/** Group kinds (as `KVCacheGroupConfig.kind`). */
export type GroupKind = KVCacheGroupConfig['kind'];
const GROUP_KINDS: readonly GroupKind[] = ['full-attention', 'sliding-window', 'state'];

/** The handshake answer: an engine and all of its worker ranks. */
export interface EngineInfo {
  readonly version: number;
  readonly mode: TransferMode;
  readonly compatHash: string;
  readonly engineId: string;
  readonly tpSize: number;
  readonly ppSize: number;
  /** Block size per KV cache group, tokens. */
  readonly blockSizes: readonly number[];
  readonly groupKinds: readonly GroupKind[];
  /** Every rank, `tpSize * ppSize` of them. */
  readonly ranks: readonly RankInfo[];
}

/** Push mode: a consumer rank's blocks for one request (`PUSH_REG`). */
export interface PushRegistration {
  /** The consumer's request id (the producer's completion notif names it). */
  readonly consumerRequestId: string;
  /** The producer's request id (`remote_request_id` of the params). */
  readonly producerRequestId: string;
  readonly consumerEngineId: string;
  /** The consumer rank (agent, regions, layout; its TP/PP sizes give the consumer's world). */
  readonly rank: RankInfo;
  /** First loaded token (the consumer's local prefix hit) and the load's numTokens. */
  readonly firstToken: number;
  readonly numTokens: number;
  /** The consumer's block ids per group (whole block table of the request). */
  readonly blockIds: readonly (readonly number[])[];
}

/**
 * A side-channel request. `consumerKey` (18): the asking consumer engine's key
 * (`consumer-binding.ts` `newConsumerKey`), nil on the wire when absent. `capabilities` /
 * `capability` (19): the lease capability of each named request (`kv_transfer_params.lease_capability`;
 * `capabilities[i]` is `requestIds[i]`'s), nil on the wire when absent.
 */
export type SideRequest =
  | { readonly type: 'info'; readonly version: number; readonly mode: TransferMode; readonly compatHash: string }
  | { readonly type: 'lease'; readonly requestIds: readonly string[]; readonly pinMs: number; readonly consumerKey?: string | null; readonly capabilities?: readonly (string | null)[] }
  | { readonly type: 'release'; readonly requestIds: readonly string[]; readonly consumerKey?: string | null; readonly capabilities?: readonly (string | null)[] }
  | { readonly type: 'push-reg'; readonly reg: PushRegistration; readonly consumerKey?: string | null; readonly capability?: string | null }
  | { readonly type: 'localize'; readonly requestId: string; readonly query: LocalizeQuery; readonly consumerKey?: string | null; readonly capability?: string | null };

/** A decoded response: ok with an (undecoded) body, or refused. */
export type SideResponse = { readonly seq: number; readonly ok: true; readonly body: unknown } | { readonly seq: number; readonly ok: false; readonly code: SideErrorCode; readonly message: string };

// ---------------------------------------------------------------------------------------------
// Layouts from views
// ---------------------------------------------------------------------------------------------

/** The layouts of a worker's caches (serializable, optional fields resolved). @throws ReplicaCountError (`@kvconnect/checksum`) for a cache whose R cannot be told (SPEC 1). */
export function cacheLayouts(caches: WorkerKVCaches): CacheLayout[] {
  const out: CacheLayout[] = [];
  caches.groups.forEach((g, gi) => {
    for (const v of g.caches) out.push(v.kind === 'attention' ? attentionLayout(v, gi, caches.rank.tpSize) : stateLayout(v, gi));
  });
  return out;
}

function attentionLayout(v: AttentionCacheView, group: number, tpSize: number): AttentionLayout {
  return {
    kind: 'attention',
    group,
    name: v.name,
    dtype: v.dtype,
    numBlocks: v.numBlocks,
    blockSize: v.blockSize,
    localHeads: v.localHeads,
    replicas: replicaCount(v, tpSize),
    parts: v.parts.map((p) => ({
      region: p.region,
      offset: p.offset,
      bytes: p.bytes,
      blockStride: p.blockStride,
      headStride: p.headStride,
      tokenStride: p.tokenStride,
      kernelBlockTokens: p.kernelBlockTokens ?? v.blockSize,
      kernelBlockStride: p.kernelBlockStride ?? 0,
    })),
  };
}

function stateLayout(v: StateCacheView, group: number): StateLayoutInfo {
  return {
    kind: 'state',
    group,
    name: v.name,
    numBlocks: v.numBlocks,
    states: v.states.map((s) => ({
      dtype: s.dtype,
      shape: [...s.shape],
      region: s.region,
      offset: s.offset,
      blockStride: s.blockStride,
      strides: s.strides ? [...s.strides] : contiguousStrides(s.shape, DTYPE_BYTES[s.dtype]),
      split: s.split ? { axis: s.split.axis, segments: s.split.segments.map(([l, r]) => [l, r] as const) } : null,
    })),
  };
}

/** A rank's info from its caches, its agent and its registration (regions in the caches' region order). */
export function buildRankInfo(caches: WorkerKVCaches, agentName: string, agentMetadata: Uint8Array, regions: readonly RegisteredRegion[]): RankInfo {
  return {
    tpRank: caches.rank.tpRank,
    tpSize: caches.rank.tpSize,
    ppRank: caches.ppRank,
    ppSize: caches.ppSize,
    agentName,
    agentMetadata,
    regions: regions.map((r) => ({ addr: r.addr, length: r.length, kind: r.kind, deviceId: r.deviceId })),
    caches: cacheLayouts(caches),
  };
}

/**
 * The compatibility hash of an engine: SHA-256 (hex) of the protocol version, the transfer mode,
 * the agent backend, the group kinds and every cache's name, kind and dtype(s). Block sizes,
 * TP/PP sizes and physical layouts are left out (the mapping handles them).
 */
export function compatHash(o: { mode: TransferMode; backend: string; groupKinds: readonly GroupKind[]; ranks: readonly Pick<RankInfo, 'caches'>[]; salt?: string }): string {
  const caches = new Map<string, unknown>();
  for (const r of o.ranks) {
    for (const c of r.caches) caches.set(c.name, c.kind === 'attention' ? [c.name, 'attention', c.dtype] : [c.name, 'state', c.states.map((s) => s.dtype)]);
  }
  const identity = [NIXL_PROTOCOL_VERSION, o.mode, o.backend, o.groupKinds, [...caches.keys()].sort().map((k) => caches.get(k)), o.salt ?? ''];
  return createHash('sha256').update(JSON.stringify(identity)).digest('hex');
}

// ---------------------------------------------------------------------------------------------
// Encoders (positional arrays)
// ---------------------------------------------------------------------------------------------

function encodeCache(c: CacheLayout): unknown[] {
  if (c.kind === 'attention') {
    return [0, c.group, c.name, c.dtype, c.numBlocks, c.blockSize, c.localHeads, c.replicas, c.parts.map((p) => [p.region, p.offset, p.bytes, p.blockStride, p.headStride, p.tokenStride, p.kernelBlockTokens, p.kernelBlockStride])];
  }
  return [
    1,
    c.group,
    c.name,
    c.numBlocks,
    c.states.map((s) => [s.dtype, [...s.shape], s.region, s.offset, s.blockStride, [...s.strides], s.split ? [s.split.axis, s.split.segments.map(([l, r]) => [l, r])] : null]),
  ];
}

/** A rank as a MessagePack-ready array. */
export function encodeRankInfo(r: RankInfo): unknown[] {
  return [r.tpRank, r.tpSize, r.ppRank, r.ppSize, r.agentName, r.agentMetadata, r.regions.map((g) => [g.addr, g.length, g.kind, g.deviceId]), r.caches.map(encodeCache)];
}

/** An engine as a MessagePack-ready array. */
export function encodeEngineInfo(e: EngineInfo): unknown[] {
  return [e.version, e.mode, e.compatHash, e.engineId, e.tpSize, e.ppSize, [...e.blockSizes], [...e.groupKinds], e.ranks.map(encodeRankInfo)];
}

/** A push registration as a MessagePack-ready array. */
export function encodePushRegistration(r: PushRegistration): unknown[] {
  return [r.consumerRequestId, r.producerRequestId, r.consumerEngineId, encodeRankInfo(r.rank), r.firstToken, r.numTokens, r.blockIds.map((b) => [...b])];
}

/** The wire's capability list of a `LEASE` / `RELEASE` (19): one entry per request id, nil where none. */
function capsOf(ids: readonly string[], caps: readonly (string | null)[] | undefined): (string | null)[] {
  return ids.map((_, i) => caps?.[i] ?? null);
}

/** Encodes a request with sequence number `seq` (without the length prefix). */
export function encodeRequest(seq: number, req: SideRequest): Uint8Array {
  switch (req.type) {
    case 'info':
      return packr.pack([seq, MSG.INFO, req.version, req.mode, req.compatHash]);
    case 'lease':
      return packr.pack([seq, MSG.LEASE, [...req.requestIds], req.pinMs, req.consumerKey ?? null, capsOf(req.requestIds, req.capabilities)]);
    case 'release':
      return packr.pack([seq, MSG.RELEASE, [...req.requestIds], req.consumerKey ?? null, capsOf(req.requestIds, req.capabilities)]);
    case 'push-reg':
      return packr.pack([seq, MSG.PUSH_REG, encodePushRegistration(req.reg), req.consumerKey ?? null, req.capability ?? null]);
    case 'localize':
      return packr.pack([seq, MSG.LOCALIZE, req.requestId, req.query.rangeTokens, req.query.groups.map((g) => [g.groupId, g.tokenStart, g.tokenEnd]), req.consumerKey ?? null, req.capability ?? null]);
  }
}

/** Encodes an ok response (`body` MessagePack-ready). */
export function encodeOk(seq: number, body: unknown): Uint8Array {
  return packr.pack([seq, 0, body]);
}

/** Encodes a refusal. */
export function encodeRefusal(seq: number, code: SideErrorCode, message: string): Uint8Array {
  return packr.pack([seq, 1, code, message.slice(0, LIMITS.message)]);
}

// ---------------------------------------------------------------------------------------------
// Strict decoders
// ---------------------------------------------------------------------------------------------

const DTYPES = Object.keys(DTYPE_BYTES) as Dtype[];

function decodePart(x: unknown, w: string): PartLayout {
  const a = arr(x, w, 8, 8);
  const p: PartLayout = {
    region: nat(a[0], `${w}.region`, LIMITS.regions),
    offset: nat(a[1], `${w}.offset`),
    bytes: pos(a[2], `${w}.bytes`),
    blockStride: nat(a[3], `${w}.blockStride`),
    headStride: nat(a[4], `${w}.headStride`),
    tokenStride: nat(a[5], `${w}.tokenStride`),
    kernelBlockTokens: pos(a[6], `${w}.kernelBlockTokens`),
    kernelBlockStride: nat(a[7], `${w}.kernelBlockStride`),
  };
  return p;
}

function decodeCache(x: unknown, w: string, tpSize: number, numGroups: number): CacheLayout {
  const a = arr(x, w, 9, 1);
  const kind = nat(a[0], `${w}.kind`, 1);
  if (kind === 0) {
    if (a.length !== 9) fail(`${w}: an attention cache has 9 fields`);
    const blockSize = pos(a[5], `${w}.blockSize`, 1 << 20);
    const replicas = pos(a[7], `${w}.replicas`, tpSize);
    if (tpSize % replicas !== 0) fail(`${w}.replicas: ${replicas} does not divide TP ${tpSize}`);
    const parts = arr(a[8], `${w}.parts`, LIMITS.parts, 1).map((p, i) => decodePart(p, `${w}.parts[${i}]`));
    for (const [i, p] of parts.entries()) if (blockSize % p.kernelBlockTokens !== 0) fail(`${w}.parts[${i}]: kernelBlockTokens does not divide blockSize`);
    return {
      kind: 'attention',
      group: nat(a[1], `${w}.group`, numGroups - 1),
      name: str(a[2], `${w}.name`, LIMITS.idLength),
      dtype: oneOf(a[3], `${w}.dtype`, DTYPES),
      numBlocks: pos(a[4], `${w}.numBlocks`),
      blockSize,
      localHeads: pos(a[6], `${w}.localHeads`, 65536),
      replicas,
      parts,
    };
  }
  if (a.length !== 5) fail(`${w}: a state cache has 5 fields`);
  const states = arr(a[4], `${w}.states`, LIMITS.states, 1).map((s, i): StateTensorLayout => {
    const sw = `${w}.states[${i}]`;
    const t = arr(s, sw, 7, 7);
    const shape = arr(t[1], `${sw}.shape`, LIMITS.dims, 1).map((d, k) => pos(d, `${sw}.shape[${k}]`, 1 << 24));
    const strides = arr(t[5], `${sw}.strides`, LIMITS.dims, 1).map((d, k) => nat(d, `${sw}.strides[${k}]`));
    if (strides.length !== shape.length) fail(`${sw}: strides and shape differ in length`);
    let split: StateTensorLayout['split'] = null;
    if (t[6] !== null) {
      const sp = arr(t[6], `${sw}.split`, 2, 2);
      const axis = nat(sp[0], `${sw}.split.axis`, shape.length - 1);
      const segments = arr(sp[1], `${sw}.split.segments`, LIMITS.segments, 1).map((g, k) => {
        const gg = arr(g, `${sw}.split.segments[${k}]`, 2, 2);
        const r = pos(gg[1], `${sw}.split.segments[${k}].replicas`, tpSize);
        if (tpSize % r !== 0) fail(`${sw}.split.segments[${k}]: replicas ${r} do not divide TP ${tpSize}`);
        return [pos(gg[0], `${sw}.split.segments[${k}].size`), r] as const;
      });
      if (segments.reduce((s2, g) => s2 + g[0], 0) !== shape[axis]) fail(`${sw}.split: segments do not partition axis ${axis}`);
      split = { axis, segments };
    }
    return {
      dtype: oneOf(t[0], `${sw}.dtype`, DTYPES),
      shape,
      region: nat(t[2], `${sw}.region`, LIMITS.regions),
      offset: nat(t[3], `${sw}.offset`),
      blockStride: nat(t[4], `${sw}.blockStride`),
      strides,
      split,
    };
  });
  return { kind: 'state', group: nat(a[1], `${w}.group`, numGroups - 1), name: str(a[2], `${w}.name`, LIMITS.idLength), numBlocks: pos(a[3], `${w}.numBlocks`), states };
}

/**
 * Decodes a rank (from its MessagePack value).
 * @param numGroups - the engine's group count (cache group indices are checked against it).
 * @throws NixlDecodeError
 */
export function decodeRankInfo(x: unknown, numGroups: number, w = 'rank'): RankInfo {
  const a = arr(x, w, 8, 8);
  const tpSize = pos(a[1], `${w}.tpSize`, LIMITS.ranks);
  const ppSize = pos(a[3], `${w}.ppSize`, LIMITS.ranks);
  const regions = arr(a[6], `${w}.regions`, LIMITS.regions).map((r, i) => {
    const g = arr(r, `${w}.regions[${i}]`, 4, 4);
    return { addr: nat(g[0], `${w}.regions[${i}].addr`), length: pos(g[1], `${w}.regions[${i}].length`), kind: oneOf(g[2], `${w}.regions[${i}].kind`, ['DRAM', 'VRAM'] as const), deviceId: nat(g[3], `${w}.regions[${i}].deviceId`, 65535) };
  });
  const caches = arr(a[7], `${w}.caches`, LIMITS.caches).map((c, i) => decodeCache(c, `${w}.caches[${i}]`, tpSize, numGroups));
  for (const [i, c] of caches.entries()) {
    const regs = c.kind === 'attention' ? c.parts.map((p) => p.region) : c.states.map((s) => s.region);
    if (regs.some((r) => r >= regions.length)) fail(`${w}.caches[${i}]: names a region the rank did not register`);
  }
  return {
    tpRank: nat(a[0], `${w}.tpRank`, tpSize - 1),
    tpSize,
    ppRank: nat(a[2], `${w}.ppRank`, ppSize - 1),
    ppSize,
    agentName: str(a[4], `${w}.agentName`, LIMITS.idLength),
    agentMetadata: bin(a[5], `${w}.agentMetadata`, LIMITS.metadataBytes),
    regions,
    caches,
  };
}

/**
 * Decodes an {@link EngineInfo} (the INFO body): every rank present once, sizes consistent.
 * @throws NixlDecodeError
 */
export function decodeEngineInfo(x: unknown): EngineInfo {
  const a = arr(x, 'info', 9, 9);
  const tpSize = pos(a[4], 'info.tpSize', LIMITS.ranks);
  const ppSize = pos(a[5], 'info.ppSize', LIMITS.ranks);
  const blockSizes = arr(a[6], 'info.blockSizes', LIMITS.groups).map((b, i) => pos(b, `info.blockSizes[${i}]`, 1 << 20));
  const groupKinds = arr(a[7], 'info.groupKinds', LIMITS.groups).map((k, i) => oneOf(k, `info.groupKinds[${i}]`, GROUP_KINDS));
  if (groupKinds.length !== blockSizes.length) fail('info: groupKinds and blockSizes differ in length');
  const rawRanks = arr(a[8], 'info.ranks', LIMITS.ranks, 1);
  if (rawRanks.length !== tpSize * ppSize) fail(`info.ranks: ${rawRanks.length} ranks for TP ${tpSize} x PP ${ppSize}`);
  const seen = new Set<string>();
  const ranks = rawRanks.map((r, i) => {
    const rank = decodeRankInfo(r, blockSizes.length, `info.ranks[${i}]`);
    if (rank.tpSize !== tpSize || rank.ppSize !== ppSize) fail(`info.ranks[${i}]: TP/PP sizes differ from the engine's`);
    const k = `${rank.ppRank}:${rank.tpRank}`;
    if (seen.has(k)) fail(`info.ranks[${i}]: rank ${k} repeated`);
    seen.add(k);
    return rank;
  });
  return {
    version: nat(a[0], 'info.version', 0xffff),
    mode: oneOf(a[1], 'info.mode', TRANSFER_MODES),
    compatHash: str(a[2], 'info.compatHash', 128),
    engineId: str(a[3], 'info.engineId', LIMITS.idLength),
    tpSize,
    ppSize,
    blockSizes,
    groupKinds,
    ranks,
  };
}

function decodeIds(x: unknown, w: string): string[] {
  return arr(x, w, LIMITS.requestIds).map((s, i) => str(s, `${w}[${i}]`, LIMITS.idLength));
}

/**
 * Decodes a push registration (its MessagePack value).
 * @throws NixlDecodeError
 */
export function decodePushRegistration(x: unknown): PushRegistration {
  const a = arr(x, 'reg', 7, 7);
  const blockIds = arr(a[6], 'reg.blockIds', LIMITS.groups).map((g, i) =>
    arr(g, `reg.blockIds[${i}]`, LIMITS.blocks).map((b, k) => {
      if (typeof b !== 'number' || !Number.isSafeInteger(b) || b < -1) fail(`reg.blockIds[${i}][${k}]: expected a block id (or -1)`);
      return b;
    }),
  );
  const rank = decodeRankInfo(a[3], blockIds.length, 'reg.rank');
  const firstToken = nat(a[4], 'reg.firstToken');
  const numTokens = nat(a[5], 'reg.numTokens');
  if (firstToken > numTokens) fail('reg: firstToken past numTokens');
  return {
    consumerRequestId: str(a[0], 'reg.consumerRequestId', LIMITS.idLength),
    producerRequestId: str(a[1], 'reg.producerRequestId', LIMITS.idLength),
    consumerEngineId: str(a[2], 'reg.consumerEngineId', LIMITS.idLength),
    rank,
    firstToken,
    numTokens,
    blockIds,
  };
}

/**
 * Decodes a request frame body (without the length prefix).
 * @throws NixlDecodeError
 */
export function decodeRequest(bytes: Uint8Array): { seq: number; req: SideRequest } {
  const a = arr(unpackStrict(bytes, LIMITS.frameBytes, 'request'), 'request', 7, 2);
  // A consumer key (18): nil (then no `consumerKey`) or 32 lowercase hex digits.
  const key = (x: unknown, what: string): { consumerKey?: string } => {
    if (x === null) return {};
    if (!isConsumerKey(x)) fail(`${what}: expected nil or ${CONSUMER_KEY_CHARS} lowercase hex digits`);
    return { consumerKey: x };
  };
  // A lease capability (19): nil or 64 lowercase hex digits; the value is never echoed in the error.
  const capErr = (what: string) => fail(`${what}: expected nil or ${LEASE_CAPABILITY_CHARS} lowercase hex digits`);
  const cap = (x: unknown, what: string): { capability?: string } => {
    if (x === null) return {};
    if (!isLeaseCapability(x)) capErr(what);
    return { capability: x as string };
  };
  const caps = (x: unknown, n: number, what: string): { capabilities?: (string | null)[] } => {
    const l = arr(x, what, LIMITS.requestIds);
    if (l.length !== n) fail(`${what}: expected one entry per request id`);
    for (const c of l) if (c !== null && !isLeaseCapability(c)) capErr(what);
    return l.every((c) => c === null) ? {} : { capabilities: l as (string | null)[] };
  };
  const seq = nat(a[0], 'request.seq', 0xffffffff);
  const type = nat(a[1], 'request.type', 255);
  switch (type) {
    case MSG.INFO:
      if (a.length !== 5) fail('INFO: expected [seq, 1, version, mode, compatHash]');
      return { seq, req: { type: 'info', version: nat(a[2], 'INFO.version', 0xffff), mode: oneOf(a[3], 'INFO.mode', TRANSFER_MODES), compatHash: str(a[4], 'INFO.compatHash', 128) } };
    case MSG.LEASE: {
      if (a.length !== 6) fail('LEASE: expected [seq, 2, requestIds, pinMs, consumerKey, capabilities]');
      const ids = decodeIds(a[2], 'LEASE.requestIds');
      return { seq, req: { type: 'lease', requestIds: ids, pinMs: nat(a[3], 'LEASE.pinMs', 24 * 3600 * 1000), ...key(a[4], 'LEASE.consumerKey'), ...caps(a[5], ids.length, 'LEASE.capabilities') } };
    }
    case MSG.RELEASE: {
      if (a.length !== 5) fail('RELEASE: expected [seq, 3, requestIds, consumerKey, capabilities]');
      const ids = decodeIds(a[2], 'RELEASE.requestIds');
      return { seq, req: { type: 'release', requestIds: ids, ...key(a[3], 'RELEASE.consumerKey'), ...caps(a[4], ids.length, 'RELEASE.capabilities') } };
    }
    case MSG.PUSH_REG:
      if (a.length !== 5) fail('PUSH_REG: expected [seq, 4, registration, consumerKey, capability]');
      return { seq, req: { type: 'push-reg', reg: decodePushRegistration(a[2]), ...key(a[3], 'PUSH_REG.consumerKey'), ...cap(a[4], 'PUSH_REG.capability') } };
    case MSG.LOCALIZE: {
      if (a.length !== 7) fail('LOCALIZE: expected [seq, 6, requestId, rangeTokens, groups, consumerKey, capability]');
      const seen = new Set<number>();
      const groups = arr(a[4], 'LOCALIZE.groups', LIMITS.groups).map((g, i) => {
        const t = arr(g, `LOCALIZE.groups[${i}]`, 3, 3);
        const groupId = nat(t[0], `LOCALIZE.groups[${i}].groupId`, LIMITS.groups - 1);
        if (seen.has(groupId)) fail(`LOCALIZE.groups[${i}]: group ${groupId} repeated`);
        seen.add(groupId);
        const tokenStart = nat(t[1], `LOCALIZE.groups[${i}].tokenStart`, 0xffffffff);
        const tokenEnd = nat(t[2], `LOCALIZE.groups[${i}].tokenEnd`, 0xffffffff);
        if (tokenEnd < tokenStart) fail(`LOCALIZE.groups[${i}]: tokenEnd before tokenStart`);
        return { groupId, tokenStart, tokenEnd };
      });
      const rangeTokens = pos(a[3], 'LOCALIZE.rangeTokens', 1 << 20);
      for (const [i, g] of groups.entries()) {
        if (Math.ceil((g.tokenEnd - g.tokenStart) / rangeTokens) > LIMITS.localizeRanges) fail(`LOCALIZE.groups[${i}]: more than ${LIMITS.localizeRanges} token ranges`);
      }
      return { seq, req: { type: 'localize', requestId: str(a[2], 'LOCALIZE.requestId', LIMITS.idLength), query: { rangeTokens, groups }, ...key(a[5], 'LOCALIZE.consumerKey'), ...cap(a[6], 'LOCALIZE.capability') } };
    }
    default:
      return fail(`request: unknown type ${type}`);
  }
}

/**
 * Decodes a response frame body; the ok body stays undecoded (the requester knows its type).
 * @throws NixlDecodeError
 */
export function decodeResponse(bytes: Uint8Array): SideResponse {
  const a = arr(unpackStrict(bytes, LIMITS.frameBytes, 'response'), 'response', 4, 3);
  const seq = nat(a[0], 'response.seq', 0xffffffff);
  const status = nat(a[1], 'response.status', 1);
  if (status === 0) {
    if (a.length !== 3) fail('response: ok is [seq, 0, body]');
    return { seq, ok: true, body: a[2] };
  }
  if (a.length !== 4) fail('response: a refusal is [seq, 1, code, message]');
  return { seq, ok: false, code: oneOf(a[2], 'response.code', ERROR_CODES), message: str(a[3], 'response.message', LIMITS.message, 0) };
}

/**
 * Decodes a LEASE ok body: `[[requestId, expiryMs]...]`, expiry 0 = gone.
 * @throws NixlDecodeError
 */
export function decodeLeaseBody(x: unknown): Map<string, number> {
  const out = new Map<string, number>();
  for (const [i, e] of arr(x, 'lease', LIMITS.requestIds).entries()) {
    const p = arr(e, `lease[${i}]`, 2, 2);
    out.set(str(p[0], `lease[${i}].requestId`, LIMITS.idLength), nat(p[1], `lease[${i}].expiry`));
  }
  return out;
}

/** Encodes a LEASE ok body. */
export function encodeLeaseBody(m: ReadonlyMap<string, number>): unknown[] {
  return [...m].map(([id, t]) => [id, t]);
}

/**
 * Encodes a `LOCALIZE` ok body: `[0, [[groupId, keys, values, error or nil]...]]` (held; `keys` and
 * `values` as @kvconnect/checksum `encodeFineSums`) or `[1, detail]` (gone). See `docs/localize.md`.
 */
export function encodeLocalizeBody(a: LocalizeAnswer): unknown[] {
  if (a.status === 'gone') return [1, a.detail.slice(0, LIMITS.message)];
  return [
    0,
    a.groups.map((g) => {
      const w = encodeFineSums(g.sums);
      return [g.groupId, w.keys, w.values, g.error === undefined ? null : g.error.slice(0, LIMITS.message)];
    }),
  ];
}

/**
 * Decodes a `LOCALIZE` ok body ({@link encodeLocalizeBody}), strictly.
 * @throws NixlDecodeError
 */
export function decodeLocalizeBody(x: unknown): LocalizeAnswer {
  const a = arr(x, 'LOCALIZE answer', 2, 2);
  const status = nat(a[0], 'LOCALIZE.status', 1);
  if (status === 1) return { status: 'gone', detail: str(a[1], 'LOCALIZE.detail', LIMITS.message, 0) };
  const seen = new Set<number>();
  const groups = arr(a[1], 'LOCALIZE.groups', LIMITS.groups).map((g, i) => {
    const t = arr(g, `LOCALIZE.groups[${i}]`, 4, 4);
    const groupId = nat(t[0], `LOCALIZE.groups[${i}].groupId`, LIMITS.groups - 1);
    if (seen.has(groupId)) fail(`LOCALIZE.groups[${i}]: group ${groupId} repeated`);
    seen.add(groupId);
    let sums;
    try {
      sums = decodeFineSums(t[1], t[2]);
    } catch (e) {
      return fail(`LOCALIZE.groups[${i}]: ${e instanceof LocalizeError ? e.message : String(e)}`);
    }
    const error = t[3] === null ? undefined : str(t[3], `LOCALIZE.groups[${i}].error`, LIMITS.message, 0);
    return error === undefined ? { groupId, sums } : { groupId, sums, error };
  });
  return { status: 'held', groups };
}

/** Decodes an empty ok body (`[]`). @throws NixlDecodeError */
export function decodeEmptyBody(x: unknown): void {
  arr(x, 'body', 0, 0);
}

// ---------------------------------------------------------------------------------------------
// Authentication (protocol 16; see the module comment and docs/security.md)
// ---------------------------------------------------------------------------------------------

/** Proof contexts of the side channel (`makeProof` in @kvconnect/transfer `auth.ts`). */
export const SIDE_AUTH_CONTEXT = Object.freeze({ auth: 'nixl-side/auth', request: 'nixl-side/request', response: 'nixl-side/response' } as const);

/** The nonces of one authenticated connection (client's, server's; NONCE_BYTES each). */
export interface SideSession {
  readonly clientNonce: Uint8Array;
  readonly serverNonce: Uint8Array;
}

/** Encodes the `AUTH` request `[0, 5, version, clientNonce]`. */
export function encodeAuthRequest(clientNonce: Uint8Array): Uint8Array {
  return packr.pack([0, MSG.AUTH, NIXL_PROTOCOL_VERSION, clientNonce]);
}

/**
 * Whether a frame is an `AUTH` request (cheap check of its first bytes, without a full decode).
 * Used by a server without a secret to refuse it with a clear code.
 */
export function isAuthRequest(bytes: Uint8Array): boolean {
  try {
    const a = unpackStrict(bytes, LIMITS.authFrameBytes, 'AUTH');
    return Array.isArray(a) && a[0] === 0 && a[1] === MSG.AUTH;
  } catch {
    return false;
  }
}

/**
 * Decodes an `AUTH` request: version (must be {@link NIXL_PROTOCOL_VERSION}) and a nonce of
 * `nonceBytes` bytes.
 * @throws NixlDecodeError
 */
export function decodeAuthRequest(bytes: Uint8Array, nonceBytes: number): { version: number; clientNonce: Uint8Array } {
  const a = arr(unpackStrict(bytes, LIMITS.authFrameBytes, 'AUTH'), 'AUTH', 4, 4);
  if (a[0] !== 0 || a[1] !== MSG.AUTH) fail('AUTH: expected [0, 5, version, clientNonce]');
  const version = nat(a[2], 'AUTH.version', 0xffff);
  const clientNonce = bin(a[3], 'AUTH.clientNonce', nonceBytes);
  if (clientNonce.length !== nonceBytes) fail(`AUTH.clientNonce: expected ${nonceBytes} bytes`);
  return { version, clientNonce };
}

/** The `AUTH` ok body `[serverNonce, serverProof]` (sent with seq 0). */
export function encodeAuthBody(serverNonce: Uint8Array, proof: Uint8Array): unknown[] {
  return [serverNonce, proof];
}

/**
 * Decodes the `AUTH` ok body.
 * @throws NixlDecodeError
 */
export function decodeAuthBody(x: unknown, nonceBytes: number, proofBytes: number): { serverNonce: Uint8Array; proof: Uint8Array } {
  const a = arr(x, 'AUTH answer', 2, 2);
  const serverNonce = bin(a[0], 'AUTH.serverNonce', nonceBytes);
  const proof = bin(a[1], 'AUTH.proof', proofBytes);
  if (serverNonce.length !== nonceBytes || proof.length !== proofBytes) fail('AUTH answer: nonce or proof of the wrong length');
  return { serverNonce, proof };
}

/** A sealed frame body: `body || mac` (`mac`: the proof over the body, 32 bytes). */
export function sealFrame(body: Uint8Array, mac: Uint8Array): Uint8Array {
  const out = new Uint8Array(body.byteLength + mac.byteLength);
  out.set(body, 0);
  out.set(mac, body.byteLength);
  return out;
}

/**
 * Splits a sealed frame body into the MessagePack body and its mac (`macBytes` long).
 * @throws NixlDecodeError for a frame too short to hold a mac and a body.
 */
export function openFrame(frame: Uint8Array, macBytes: number): { body: Uint8Array; mac: Uint8Array } {
  if (frame.byteLength <= macBytes) fail(`sealed frame of ${frame.byteLength} bytes holds no body`);
  return { body: frame.subarray(0, frame.byteLength - macBytes), mac: frame.subarray(frame.byteLength - macBytes) };
}

/**
 * Public types of @kvconnect/checksum. Every uint64 is a `bigint` in [0, 2^64); every other
 * integer is a JS `number` (a safe integer). SPEC references are to `../shared/SPEC.md` v1.
 * @module
 */

/** Element types a covered cache may have (SPEC 5). Any other dtype skips the group. */
export type Dtype = 'float32' | 'float16' | 'bfloat16' | 'float8_e4m3fn' | 'float8_e5m2' | 'int8' | 'uint8';

/** Bytes per element of each {@link Dtype}. */
export const DTYPE_BYTES: Readonly<Record<Dtype, number>> = Object.freeze({
  float32: 4,
  float16: 2,
  bfloat16: 2,
  float8_e4m3fn: 1,
  float8_e5m2: 1,
  int8: 1,
  uint8: 1,
});

/** True if `s` names a {@link Dtype}. */
export function isDtype(s: unknown): s is Dtype {
  return typeof s === 'string' && Object.prototype.hasOwnProperty.call(DTYPE_BYTES, s);
}

/** Kind of a KV cache group as the verifier sees it (SPEC 8). */
export type GroupKind = 'attention' | 'state' | 'state-local';

/**
 * Replica key `(R, replica)` of a partial sum (SPEC 2): `R` consecutive TP ranks hold the same
 * heads (or state rows); `replica = tpRank mod R`. Written `"R:replica"` in records and vectors.
 */
export interface ReplicaKey {
  readonly replicas: number;
  readonly replica: number;
}

/** `"R:r"` form of a replica key, as used in vectors and worker records. */
export function replicaKeyString(k: ReplicaKey): string {
  return `${k.replicas}:${k.replica}`;
}

/** Parses `"R:r"`; throws `RangeError` unless `0 <= r < R`, both safe integers. */
export function parseReplicaKey(s: string): ReplicaKey {
  const m = /^(\d+):(\d+)$/.exec(s);
  if (!m) throw new RangeError(`bad replica key ${JSON.stringify(s)}: expected "R:r"`);
  const replicas = Number(m[1]);
  const replica = Number(m[2]);
  if (!(replicas >= 1 && replica < replicas && Number.isSafeInteger(replicas))) {
    throw new RangeError(`bad replica key ${JSON.stringify(s)}: need 0 <= r < R`);
  }
  return { replicas, replica };
}

// ---------------------------------------------------------------------------------------------
// Payload (SPEC 6)
// ---------------------------------------------------------------------------------------------

/** One group of a payload (SPEC 6): the producer's block values of one KV cache group. */
export interface PayloadGroup {
  /** KV cache group index. */
  groupId: number;
  /** Group fingerprint (SPEC 5), uint64. */
  fingerprint: bigint;
  /** The producer's block size of this group, in tokens (>= 1). */
  blockSize: number;
  /** Block position of `values[0]`. */
  start: number;
  /** Block values, uint64 each; `values[i]` is block position `start + i`. */
  values: BigUint64Array;
}

/** Payload versions a decoder accepts (SPEC 6, 6.1; 16: the extension payload, docs/checksum-extensions.md). */
export type PayloadVersion = 1 | 2 | 16;

/**
 * Version 16 (extension payload) only (docs/checksum-extensions.md section 1): a group's block values recomputed at a
 * smaller block size `blockSize` (the consumer's), so a consumer prefix hit that ends inside a
 * producer block can be verified. `values[i]` is the value of block position `start + i` at that size.
 */
export interface SubBlockValues {
  groupId: number;
  /** Tokens per sub-block (>= 1); divides the group's producer block size. */
  blockSize: number;
  start: number;
  values: BigUint64Array;
}

/** A decoded checksum payload, version 1 (SPEC 6) or 2 (SPEC 6.1). */
export interface ChecksumPayload {
  /**
   * Wire version. Decoders always set it. Encoders: absent means 2 when `tokenDigest` is set,
   * else 1 (producers set `tokenDigest`, so they send version 2).
   */
  version?: PayloadVersion;
  /** Tokens whose KV the producer's checksummed blocks hold. */
  numTokens: number;
  /** The producer's TP size (>= 1). */
  producerTpSize: number;
  /**
   * Version 2 only (SPEC 6.1): uint64, the first 8 bytes read LE of SHA-256 over the request's
   * first `numTokens` token ids as LE uint32 (`tokenDigest()` in payload.ts). Absent in version 1.
   */
  tokenDigest?: bigint;
  /** At most 4096 groups, distinct group ids. */
  groups: PayloadGroup[];
  /**
   * Version 16 (extension payload) only: the producer's sample threshold (`sampling.ts`, in `[1, 2^32]`; 2^32 = every
   * block summed). Absent: every block summed.
   */
  sampleThreshold?: number;
  /** Version 16 (extension payload) only: sub-block values of some groups (at most one entry per group of `groups`). */
  subBlocks?: SubBlockValues[];
}

// ---------------------------------------------------------------------------------------------
// Worker records and verification (SPEC 8)
// ---------------------------------------------------------------------------------------------

/** What one consumer (or producer) worker summed for one group. */
export interface WorkerGroupRecord {
  /** First block position summed. */
  start: number;
  /** Number of consecutive block positions summed. */
  nBlocks: number;
  /** True when this worker could not cover the group (its reason is in `skipReason`). */
  skipped: boolean;
  /** Why the worker skipped the group (a {@link SkipReason} code), when it did. */
  skipReason?: string;
  /** Partial block values per replica key `"R:r"`; each array has `nBlocks` values. */
  partials: Map<string, BigUint64Array>;
}

/** One worker's record: its place in the TP x PP grid and its per-group sums. */
export interface WorkerRecord {
  ppRank: number;
  tpRank: number;
  groups: Map<number, WorkerGroupRecord>;
}

/** A group the consumer scheduled for a load (SPEC 8 input). */
export interface ConsumerGroup {
  groupId: number;
  kind: GroupKind;
  /** The consumer's block size in tokens (state groups: any value, unused). */
  blockSize: number;
  /** First loaded block position. */
  start: number;
  /** Number of loaded blocks. */
  nBlocks: number;
  /** The consumer's group fingerprint (summed over its PP stages). */
  fingerprint: bigint;
  /** True when the consumer could not cover the group. */
  skipped: boolean;
}

/** The consumer's side of a load, as its scheduler sees it (SPEC 8 input). */
export interface ConsumerLoad {
  numTokens: number;
  /**
   * The consumer's prompt token ids (SPEC 8.0), checked against a version-2 payload's
   * `tokenDigest`. Absent counts as an empty prompt (fail-safe: a version-2 payload with
   * `numTokens > 0` is then a wrong request).
   */
  tokenIds?: ArrayLike<number>;
  tpSize: number;
  ppSize: number;
  groups: ConsumerGroup[];
  workers: WorkerRecord[];
  /**
   * Sampled checking: the consumer's threshold and which blocks are summed (a `BlockSampler` of
   * sampling.ts). Absent: every block (and a sampled payload is `sample-rate`).
   */
  sample?: {
    threshold: number;
    blockSampled(groupId: number, blockSize: number, position: number, threshold?: number): boolean;
  };
}

/** Reason codes of unverified loads (SPEC 8). They are part of the contract (metrics, logs). */
export type UnverifiedReason =
  | 'no-payload'
  | 'malformed-payload'
  | 'workers-missing'
  | 'covered-one-side'
  | 'fingerprint'
  | 'rows-differ'
  | 'replica-missing'
  | 'uncovered-tokens'
  | 'block-size'
  | 'unaligned-prefix'
  | 'sample-rate'
  | 'nothing-to-verify';

/** The outcome of verifying one load (SPEC 8). */
export interface Verdict {
  verdict: 'verified' | 'mismatch' | 'unverified';
  /** Groups that mismatched, with sorted consumer block positions, in check order. */
  mismatches: Array<{ groupId: number; positions: number[] }>;
  /** Unverified reasons, in check order; `groupId` null for load-level reasons. */
  unverified: Array<{ groupId: number | null; reason: UnverifiedReason }>;
  /** State-local groups left out because TP sizes differ (SPEC 8 step 2): logged once. */
  leftOut: number[];
  /**
   * SPEC 8.0: the payload is version 2 and its `tokenDigest` does not match the consumer's
   * prompt (or the prompt is shorter than its `numTokens`): the KV belongs to another request.
   * Then `verdict` is `mismatch` at every loaded block of every non-skipped group.
   */
  wrongRequest: boolean;
  /**
   * SPEC 8.0: `checked` when a version-2 payload's digest was compared with the consumer's
   * prompt (whatever the result); `unchecked` for a version-1 payload (checked as before, but
   * nothing tied the KV to the request's tokens: say so in logs and metrics); `none` when no
   * payload decoded (`no-payload`, `malformed-payload`).
   */
  identity: 'checked' | 'unchecked' | 'none';
  /**
   * Sampled checking (docs/checksum-extensions.md section 2): present when the consumer sampled
   * (rate < 1). `rate` = the consumer's threshold / 2^32; `checked` / `skipped` = loaded consumer
   * blocks with valid tokens that were compared / left out by the sample.
   */
  sampled?: { rate: number; checked: number; skipped: number };
  /**
   * Groups whose prefix hit ends inside a producer block and that were verified with the
   * payload's sub-block values (docs/checksum-extensions.md section 1) instead of `unaligned-prefix`.
   */
  subBlockGroups?: number[];
}

/**
 * KV memory in a GPU's memory (CUDA device memory), as a worker registers it. Plain data: it crosses
 * processes (the engine's worker processes, the connector contract). `address` is the device pointer
 * in the process that allocated it; a peer process on the same host opens `ipcHandle` instead.
 */
export interface DeviceMemoryRegion {
  readonly kind: 'device';
  /** CUDA device ordinal (`cudaSetDevice` index) the memory lives on. */
  readonly device: number;
  /** Device address (CUDA `void*`) in the owning process, as a bigint. */
  readonly address: bigint;
  /** Bytes of the region. */
  readonly bytes: number;
  /** The CUDA IPC handle of the allocation (`cudaIpcMemHandle_t`, 64 bytes), when exported. */
  readonly ipcHandle?: Uint8Array;
}

/** A worker's KV memory region: host memory (bytes in this process) or device memory. */
export type KVMemoryRegion = Uint8Array | DeviceMemoryRegion;

/** True when `r` is device memory ({@link DeviceMemoryRegion}). */
export function isDeviceRegion(r: KVMemoryRegion): r is DeviceMemoryRegion {
  return !(r instanceof Uint8Array) && typeof r === 'object' && r !== null && (r as DeviceMemoryRegion).kind === 'device';
}

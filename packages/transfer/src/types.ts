/**
 * The `TransferAgent` interface: one NIXL-shaped transport API that every kvconnect connector is
 * written against once, implemented by the embedded agent (TCP, {@link EmbeddedAgent}) and by the
 * NIXL agent (`libnixl_capi.so` through the native addon, {@link NixlAgent}).
 *
 * The model is NIXL's (ai-dynamo/nixl `nixlAgent`):
 * 1. each side registers the memory peers may access ({@link TransferAgent.registerMemory});
 * 2. each side exports its metadata ({@link TransferAgent.getLocalMetadata}: an opaque binary
 *    blob carrying the agent's name, how to reach it, its registered regions and a secret) and
 *    the peer loads it ({@link TransferAgent.loadRemoteMetadata}) over the connector's own side
 *    channel;
 * 3. the initiator prepares a local and a remote descriptor list once
 *    ({@link TransferAgent.prepDescList}) and builds transfer requests from index lists into
 *    them ({@link TransferAgent.makeTransfer}): READ pulls remote bytes into local memory, WRITE
 *    pushes local bytes into remote memory;
 * 4. it posts the request ({@link TransferAgent.post}), watches its {@link XferStatus}, and
 *    releases it; an optional notif is delivered to the remote agent only after the data it
 *    follows has landed.
 *
 * Addresses. Every registered region gets an address (`addr`): for the NIXL agent the real
 * virtual address (host or device pointer), for the embedded agent a synthetic one, unique within
 * the agent. A transfer descriptor names `length` bytes at `addr` (any address inside a
 * registered region; a descriptor must lie entirely inside one region). Addresses and lengths are
 * plain JS numbers in bytes and must be safe integers (below 2^53; x86-64 and aarch64 user-space
 * and CUDA addresses are below 2^48).
 * @module
 */
import { isDeviceRegion, type KVMemoryRegion } from '@kvconnect/checksum';
import { TransferError } from './errors.js';

/** Where registered memory lives: host memory or GPU memory (NIXL `DRAM_SEG` / `VRAM_SEG`). */
export type MemoryKind = 'DRAM' | 'VRAM';

/** Host memory the engine owns: any ArrayBuffer, SharedArrayBuffer or view of one (Buffer, Uint8Array, ...). */
export type HostBytes = ArrayBuffer | SharedArrayBuffer | ArrayBufferView;

/**
 * One region to register. Either host memory given as JS bytes (`bytes`; kind DRAM), or a raw
 * address range (`addr`, `length`, `kind`, `deviceId`) that the engine allocated outside the JS
 * heap, for example CUDA memory (only agents whose capabilities list that kind accept it; the
 * embedded agent accepts `bytes` and VRAM of its device memory, see `device.ts`).
 * {@link toMemoryRegion} maps a worker's KV memory region to one.
 */
export type MemoryRegion =
  | { readonly bytes: HostBytes; readonly kind?: 'DRAM' }
  | {
      readonly addr: number;
      readonly length: number;
      readonly kind: MemoryKind;
      readonly deviceId?: number;
      /**
       * VRAM: the CUDA IPC handle (`cudaIpcMemHandle_t`, 64 bytes) of the allocation that starts
       * at `addr`, so that agents of other processes on the host can map it (embedded agent).
       */
      readonly ipcHandle?: Uint8Array;
    };

/** A registered region as peers address it. */
export interface RegisteredRegion {
  /** Address of the region's first byte (see the module note on addresses). */
  readonly addr: number;
  /** Bytes in the region. */
  readonly length: number;
  readonly kind: MemoryKind;
  /** CUDA device ordinal for VRAM, 0 for DRAM. */
  readonly deviceId: number;
}

/** The result of one {@link TransferAgent.registerMemory} call; pass it back to deregister. */
export interface Registration {
  /** The regions, in the order given. */
  readonly regions: readonly RegisteredRegion[];
}

/** One transfer descriptor: `length` bytes starting at `addr`, inside one registered region. */
export interface XferDesc {
  readonly addr: number;
  readonly length: number;
  /** CUDA device ordinal for VRAM descriptors (default 0). */
  readonly deviceId?: number;
}

/** A prepared descriptor list (NIXL `prepXferDlist`). Build requests from indices into it. */
export interface DescList {
  /** The agent whose memory the descriptors name: null for the local agent. */
  readonly agent: string | null;
  readonly kind: MemoryKind;
  readonly descs: readonly XferDesc[];
}

/** READ: remote bytes into local memory. WRITE: local bytes into remote memory. */
export type XferOp = 'READ' | 'WRITE';

/**
 * Why a transfer or call failed:
 * - `remote-disconnect`: the peer went away (connection closed, process died) before the
 *   transfer completed; the state of the bytes at the target is unknown.
 * - `canceled`: the request was released while in progress.
 * - `not-found`: the remote agent's metadata is not loaded (or was invalidated).
 * - `invalid`: the request names memory outside the registered regions (locally or at the
 *   target), mismatched lengths or indices, a refused secret, or malformed input.
 * - `timeout`: the transfer's deadline passed, or a connect / handshake timed out.
 * - `backend`: the underlying engine reported a failure it does not classify (the NIXL C API
 *   collapses most errors into one code).
 */
export type TransferErrorKind = 'remote-disconnect' | 'canceled' | 'not-found' | 'invalid' | 'timeout' | 'backend';

/** A transfer's status: in flight, finished with the bytes in place, or failed (the error kind). */
export type XferStatus = 'in-progress' | 'done' | TransferErrorKind;

/** A transfer request handle (NIXL `nixlXferReqH`). Repost it after it finished, release it when done. */
export interface TransferRequest {
  readonly op: XferOp;
  /** The remote agent's name. */
  readonly remoteAgent: string;
  /** Bytes moved by one post (sum of the paired descriptors' lengths). */
  readonly bytes: number;
  /** Descriptor pairs in the request. */
  readonly count: number;
  /** The error of the last failed post (null unless the status is an error kind). */
  readonly error: Error | null;
}

/** Arguments of {@link TransferAgent.makeTransfer}. */
export interface MakeTransferArgs {
  readonly op: XferOp;
  /** A local list (agent null). */
  readonly local: DescList;
  /** Indices into `local.descs`; default: all, in order. */
  readonly localIndices?: readonly number[];
  /** A remote list (agent: the peer's name). */
  readonly remote: DescList;
  /** Indices into `remote.descs`; default: all, in order. Pairs with `localIndices` one to one. */
  readonly remoteIndices?: readonly number[];
  /** Bytes delivered to the remote agent once the data has landed (see {@link TransferAgent.post}). */
  readonly notif?: Uint8Array;
}

/** Options of {@link TransferAgent.post}. */
export interface PostOptions {
  /** Replaces the request's notif for this post. */
  readonly notif?: Uint8Array;
  /** Deadline in milliseconds from the post; the status becomes `timeout` when it passes (default: the agent's). */
  readonly timeoutMs?: number;
}

/** What an agent can do. */
export interface AgentCapabilities {
  /** Memory kinds {@link TransferAgent.registerMemory} accepts. */
  readonly memoryKinds: readonly MemoryKind[];
  readonly read: boolean;
  readonly write: boolean;
  /** Transfer-bound and standalone notifs. */
  readonly notify: boolean;
}

/**
 * A transfer agent. All methods that talk to a backend or peer return promises and never block
 * the event loop; `status` reads local state only. Methods reject with a
 * {@link TransferError} (its `kind` says why) and never throw synchronously for a bad peer.
 */
export interface TransferAgent {
  /** The agent's name, unique among the agents that load each other's metadata. */
  readonly name: string;
  /** `'embedded'`, `'nixl'`, ... */
  readonly backend: string;
  readonly capabilities: AgentCapabilities;

  /**
   * Registers memory peers may READ and WRITE. The agent keeps a reference to each `bytes`
   * region until it is deregistered; do not detach (transfer) those ArrayBuffers meanwhile.
   * Metadata exported afterwards lists the new regions.
   * @throws TransferError `invalid` for an empty region, an unsupported kind, or a bad address.
   */
  registerMemory(regions: readonly MemoryRegion[]): Promise<Registration>;
  /** Deregisters; later accesses to those regions (local or from peers) are refused. */
  deregisterMemory(registration: Registration): Promise<void>;

  /** This agent's metadata blob (binary; give it to peers over a trusted side channel: it carries the agent's secret). */
  getLocalMetadata(): Promise<Uint8Array>;
  /**
   * Loads a peer's metadata (replacing any earlier version of the same agent's).
   * @returns the remote agent's name.
   * @throws TransferError `invalid` for a malformed blob.
   */
  loadRemoteMetadata(metadata: Uint8Array): Promise<string>;
  /** Forgets a peer's metadata and closes connections to it. */
  invalidateRemoteMetadata(agent: string): Promise<void>;

  /**
   * Prepares a descriptor list of this agent's (`agent` null) or a loaded peer's memory.
   * @throws TransferError `not-found` for a peer whose metadata is not loaded; `invalid` for a
   *   descriptor outside the (advertised) registered regions.
   */
  prepDescList(agent: string | null, kind: MemoryKind, descs: readonly XferDesc[]): Promise<DescList>;
  /** Releases a prepared list (requests made from it stay valid in the embedded agent). */
  releaseDescList(list: DescList): Promise<void>;

  /**
   * Builds a request: descriptor `localIndices[i]` of `local` pairs with `remoteIndices[i]` of
   * `remote`; paired descriptors must have equal lengths.
   * @throws TransferError `invalid` for mismatched counts, lengths or indices out of range.
   */
  makeTransfer(args: MakeTransferArgs): Promise<TransferRequest>;
  /**
   * Starts the transfer. Resolves with the status right after posting (`in-progress`, or
   * `done` if it finished inline, or an error kind). The notif, if any, is delivered to the
   * remote agent only after the data landed: for WRITE after the bytes are in the target's
   * memory, for READ after the initiator received every byte.
   * @throws TransferError `invalid` when the request is already in progress or was released.
   */
  post(req: TransferRequest, options?: PostOptions): Promise<XferStatus>;
  /** The request's current status (local state; never blocks). */
  status(req: TransferRequest): XferStatus;
  /** Resolves with the request's status once it is no longer `in-progress`. */
  wait(req: TransferRequest): Promise<XferStatus>;
  /** Releases the request; cancels it first if in progress (its status becomes `canceled`). */
  release(req: TransferRequest): Promise<void>;

  /** Sends a standalone notif to a loaded peer (no ordering with respect to other peers). */
  sendNotif(agent: string, message: Uint8Array): Promise<void>;
  /** Takes every notif received since the last poll, by sender agent name, in arrival order. */
  pollNotifs(): Promise<Map<string, Uint8Array[]>>;

  /** Closes the agent: fails in-flight transfers with `canceled`, closes connections, frees the backend. Idempotent. */
  close(): Promise<void>;
}

/**
 * The {@link MemoryRegion} of a worker's KV memory region (`WorkerKVCaches.regions`): host bytes as
 * DRAM, a `DeviceMemoryRegion` as VRAM with its device, address and IPC handle.
 * @throws TransferError `invalid` for a device address that is not a safe integer.
 */
export function toMemoryRegion(r: KVMemoryRegion): MemoryRegion {
  if (!isDeviceRegion(r)) return { bytes: r };
  const addr = Number(r.address);
  if (!Number.isSafeInteger(addr) || BigInt(addr) !== r.address) throw new TransferError('invalid', `device address 0x${r.address.toString(16)} is not below 2^53`);
  return r.ipcHandle ? { addr, length: r.bytes, kind: 'VRAM', deviceId: r.device, ipcHandle: r.ipcHandle } : { addr, length: r.bytes, kind: 'VRAM', deviceId: r.device };
}

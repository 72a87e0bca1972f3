/**
 * The front half every {@link TransferAgent} shares (embedded, NIXL, Mooncake): argument
 * validation of `registerMemory`, `prepDescList`, `makeTransfer` and `post`, and the bookkeeping
 * of a transfer request (state, post generation, deadline timer, waiters). Each check is written
 * here once, so that the agents cannot drift apart: a descriptor, an index or a region that one
 * agent refuses, every agent refuses, with a {@link TransferError} `invalid`
 * (packages/transfer/test/conformance.ts, "validates arguments the same way").
 *
 * What stays per agent: which memory it can register (the embedded agent: host bytes and its own
 * device memory; NIXL and Mooncake: also raw addresses), whether a descriptor lies inside
 * registered memory (each agent knows its own regions and the ones its peers advertise), and how a
 * request is moved.
 * @module
 */
import { IPC_HANDLE_BYTES } from './device.js';
import { TransferError } from './errors.js';
import { toU8 } from './memory.js';
import type { DescList, MakeTransferArgs, MemoryKind, MemoryRegion, PostOptions, TransferErrorKind, TransferRequest, XferDesc, XferOp, XferStatus } from './types.js';

/** Largest CUDA device ordinal a region or descriptor may name. */
export const MAX_DEVICE_ID = 65535;

/**
 * An integer option: `dflt` when undefined.
 * @throws TransferError `invalid` unless it is a safe integer in 1..max.
 */
export function checkPositiveInt(name: string, v: number | undefined, dflt: number, max = Number.MAX_SAFE_INTEGER): number {
  if (v === undefined) return dflt;
  if (!Number.isSafeInteger(v) || v <= 0 || v > max) throw new TransferError('invalid', `${name} must be an integer in 1..${max}`);
  return v;
}

/** @throws TransferError `canceled` when the agent is closed. */
export function checkOpen(closed: boolean, name: string): void {
  if (closed) throw new TransferError('canceled', `agent ${name} is closed`);
}

/** @throws TransferError `invalid` unless `kind` is DRAM or VRAM. */
export function checkKind(kind: unknown): MemoryKind {
  if (kind !== 'DRAM' && kind !== 'VRAM') throw new TransferError('invalid', `unknown memory kind ${String(kind)}`);
  return kind;
}

/**
 * A notif payload.
 * @param maxBytes the agent's limit (the embedded agent's wire carries at most `MAX_NOTIF_BYTES`).
 * @throws TransferError `invalid` for a non-Uint8Array or one over `maxBytes`.
 */
export function checkNotif(n: unknown, maxBytes = Number.MAX_SAFE_INTEGER): Uint8Array {
  if (!(n instanceof Uint8Array)) throw new TransferError('invalid', 'a notif must be a Uint8Array');
  if (n.byteLength > maxBytes) throw new TransferError('invalid', `a notif is at most ${maxBytes} bytes`);
  return n;
}

function checkDeviceId(v: unknown, what: string): number {
  const dev = v ?? 0;
  if (typeof dev !== 'number' || !Number.isInteger(dev) || dev < 0 || dev > MAX_DEVICE_ID) throw new TransferError('invalid', `${what}.deviceId must be an integer in 0..${MAX_DEVICE_ID}`);
  return dev;
}

/** A region to register after the shared checks: host bytes, or a raw address range. */
export type CheckedRegion =
  | { readonly bytes: Uint8Array }
  | { readonly addr: number; readonly length: number; readonly kind: MemoryKind; readonly deviceId: number; readonly ipcHandle: Uint8Array | null };

/**
 * The shared checks of `registerMemory`: a non-empty array; each region either non-empty host
 * bytes (kind absent or DRAM) or a raw range of a known kind with a positive safe `addr`, a
 * positive safe `length` whose end `addr + length` is a safe integer, a device id in
 * 0..{@link MAX_DEVICE_ID} and, if given, a {@link IPC_HANDLE_BYTES}-byte IPC handle (copied).
 * @throws TransferError `invalid` naming the first bad region.
 */
export function checkRegions(regions: readonly MemoryRegion[]): CheckedRegion[] {
  if (!Array.isArray(regions) || regions.length === 0) throw new TransferError('invalid', 'registerMemory needs at least one region');
  return regions.map((r: MemoryRegion, i): CheckedRegion => {
    if (r && typeof r === 'object' && 'bytes' in r) {
      if (r.kind !== undefined && r.kind !== 'DRAM') throw new TransferError('invalid', `regions[${i}]: bytes are DRAM`);
      const v = toU8(r.bytes);
      if (!v) throw new TransferError('invalid', `regions[${i}].bytes must be an ArrayBuffer, SharedArrayBuffer or ArrayBufferView`);
      if (v.byteLength === 0) throw new TransferError('invalid', `regions[${i}] is empty`);
      return { bytes: v };
    }
    if (r && typeof r === 'object' && 'addr' in r) {
      if (r.kind !== 'DRAM' && r.kind !== 'VRAM') throw new TransferError('invalid', `regions[${i}].kind must be DRAM or VRAM`);
      const { addr, length } = r;
      if (!Number.isSafeInteger(addr) || addr <= 0 || !Number.isSafeInteger(length) || length <= 0 || !Number.isSafeInteger(addr + length)) {
        throw new TransferError('invalid', `regions[${i}] needs a positive safe addr and length whose end is below 2^53`);
      }
      const deviceId = checkDeviceId(r.deviceId, `regions[${i}]`);
      const h = r.ipcHandle;
      if (h !== undefined && (!(h instanceof Uint8Array) || h.byteLength !== IPC_HANDLE_BYTES)) throw new TransferError('invalid', `regions[${i}].ipcHandle must be ${IPC_HANDLE_BYTES} bytes`);
      return { addr, length, kind: r.kind, deviceId, ipcHandle: h ? Uint8Array.prototype.slice.call(h) : null };
    }
    throw new TransferError('invalid', `regions[${i}] must have bytes or addr`);
  });
}

/**
 * The shared checks of `prepDescList`'s descriptors: a non-empty array of `{addr, length,
 * deviceId?}` with a safe non-negative `addr`, a positive safe `length`, a safe end and a device
 * id in 0..{@link MAX_DEVICE_ID}. Whether each lies inside registered memory is the agent's check.
 * @returns frozen copies with `deviceId` filled in (default 0).
 * @throws TransferError `invalid` naming the first bad descriptor.
 */
export function checkDescs(descs: readonly XferDesc[], what = 'descs'): XferDesc[] {
  if (!Array.isArray(descs) || descs.length === 0) throw new TransferError('invalid', `${what} must be a non-empty array`);
  return descs.map((d: XferDesc, i) => {
    if (!d || typeof d !== 'object' || !Number.isSafeInteger(d.addr) || d.addr < 0 || !Number.isSafeInteger(d.length) || d.length <= 0 || !Number.isSafeInteger(d.addr + d.length)) {
      throw new TransferError('invalid', `${what}[${i}] needs a safe non-negative addr and a positive length (addr ${d?.addr}, length ${d?.length})`);
    }
    return Object.freeze({ addr: d.addr, length: d.length, deviceId: checkDeviceId(d.deviceId, `${what}[${i}]`) });
  });
}

/** A `makeTransfer` call after the shared checks. */
export interface CheckedTransfer<L extends DescList> {
  readonly op: XferOp;
  readonly local: L;
  readonly remote: L & { readonly agent: string };
  /** Indices into `local.descs` and `remote.descs`, integers in range, pairing one to one. */
  readonly localIndices: readonly number[];
  readonly remoteIndices: readonly number[];
  /** `[local, remote]` descriptor of each pair (equal lengths). */
  readonly pairs: ReadonlyArray<readonly [XferDesc, XferDesc]>;
  /** Sum of the pairs' lengths. */
  readonly bytes: number;
  readonly notif: Uint8Array | null;
}

function checkIndices(v: unknown, n: number, what: string): number[] {
  if (!Array.isArray(v)) throw new TransferError('invalid', `${what} must be an array of indices`);
  for (const [i, x] of (v as unknown[]).entries()) {
    if (typeof x !== 'number' || !Number.isInteger(x) || x < 0 || x >= n) throw new TransferError('invalid', `${what}[${i}] = ${String(x)} is out of range (an integer in 0..${n - 1})`);
  }
  return v as number[];
}

/**
 * The shared checks of `makeTransfer`: a known op; lists for which `isLive` holds (prepared by
 * this agent and not released), local first (agent null) and remote second; index lists (default:
 * every descriptor in order) of equal non-zero length whose entries are integers in range (never
 * truncated or wrapped); paired descriptors of equal length; a notif of at most `maxNotifBytes`.
 * @throws TransferError `invalid` naming the first problem.
 */
export function checkTransfer<L extends DescList>(args: MakeTransferArgs, isLive: (l: DescList) => l is L, maxNotifBytes?: number): CheckedTransfer<L> {
  const { op, local, remote } = args;
  if (op !== 'READ' && op !== 'WRITE') throw new TransferError('invalid', `op must be READ or WRITE, got ${String(op)}`);
  if (!isLive(local) || !isLive(remote)) throw new TransferError('invalid', "descriptor lists must come from this agent's prepDescList (and not be released)");
  if (local.agent !== null) throw new TransferError('invalid', 'local must be a local descriptor list (agent null)');
  if (remote.agent === null) throw new TransferError('invalid', 'remote must be a remote descriptor list');
  const li = checkIndices(args.localIndices ?? local.descs.map((_, i) => i), local.descs.length, 'localIndices');
  const ri = checkIndices(args.remoteIndices ?? remote.descs.map((_, i) => i), remote.descs.length, 'remoteIndices');
  if (li.length !== ri.length || li.length === 0) throw new TransferError('invalid', `${li.length} local indices but ${ri.length} remote indices (need equal, at least one)`);
  const pairs: Array<readonly [XferDesc, XferDesc]> = [];
  let bytes = 0;
  for (let i = 0; i < li.length; i++) {
    const l = local.descs[li[i]!]!;
    const r = remote.descs[ri[i]!]!;
    if (l.length !== r.length) throw new TransferError('invalid', `pair ${i}: local length ${l.length} != remote length ${r.length}`);
    pairs.push([l, r]);
    bytes += l.length;
  }
  const notif = args.notif === undefined ? null : checkNotif(args.notif, maxNotifBytes);
  return { op, local, remote: remote as L & { readonly agent: string }, localIndices: li, remoteIndices: ri, pairs, bytes, notif };
}

/**
 * A transfer request's bookkeeping, the base of every agent's request class: the status of its
 * last post (`idle` before the first), the post generation (`gen`: events of an older post are
 * ignored), the deadline timer and the waiters of {@link waitRequest}.
 */
export class RequestState implements TransferRequest {
  error: Error | null = null;
  state: XferStatus | 'idle' = 'idle';
  released = false;
  gen = 0;
  timer: NodeJS.Timeout | null = null;
  waiters: Array<(s: XferStatus) => void> = [];
  constructor(
    /** The agent that made it (requests of another agent are refused). */
    readonly owner: object,
    readonly op: XferOp,
    readonly remoteAgent: string,
    readonly bytes: number,
    readonly count: number,
  ) {}
}

/**
 * `req` as a request of `owner` (an instance of `cls`).
 * @throws TransferError `invalid` for a request of another agent or type.
 */
export function ownRequest<R extends RequestState>(owner: object, req: TransferRequest, cls: abstract new (...args: never[]) => R): R {
  if (!(req instanceof cls) || req.owner !== owner) throw new TransferError('invalid', 'not a request of this agent');
  return req;
}

/** The status of a request as `TransferAgent.status` reports it (`invalid` before its first post). */
export function requestStatus(req: RequestState): XferStatus {
  return req.state === 'idle' ? 'invalid' : req.state;
}

/** `TransferAgent.wait`: the status now when not in progress, else when it ends. */
export function waitRequest(req: RequestState): Promise<XferStatus> {
  if (req.state !== 'in-progress') return Promise.resolve(requestStatus(req));
  return new Promise((resolve) => req.waiters.push(resolve));
}

/**
 * The checks every `post` starts with: not released, not in progress, a positive integer
 * deadline, a notif (when given) that is a Uint8Array of at most `maxNotifBytes`.
 * @returns the deadline of this post, milliseconds.
 * @throws TransferError `invalid`.
 */
export function checkPost(req: RequestState, options: PostOptions, defaultTimeoutMs: number, maxNotifBytes?: number): number {
  if (req.released) throw new TransferError('invalid', 'the request was released');
  if (req.state === 'in-progress') throw new TransferError('invalid', 'the request is already in progress (one post at a time)');
  const timeoutMs = checkPositiveInt('timeoutMs', options.timeoutMs, defaultTimeoutMs);
  if (options.notif !== undefined) checkNotif(options.notif, maxNotifBytes);
  return timeoutMs;
}

/**
 * Marks a post started: a new generation, no error, `in-progress`.
 * @returns the post's generation.
 */
export function startPost(req: RequestState): number {
  req.error = null;
  req.state = 'in-progress';
  return ++req.gen;
}

/** True while the post of generation `gen` is the request's current one and in progress. */
export function isCurrent(req: RequestState, gen: number): boolean {
  return req.gen === gen && req.state === 'in-progress';
}

/**
 * Ends an in-progress request in `state`: sets its error (a {@link TransferError} of that kind
 * with `message`, or none for `done`), stops its timer and wakes its waiters.
 * @returns false (and changes nothing) when the request was not in progress.
 */
export function endRequest(req: RequestState, state: XferStatus, message: string | null): boolean {
  if (req.state !== 'in-progress') return false;
  req.state = state;
  req.error = state === 'done' || state === 'in-progress' ? null : new TransferError(state as TransferErrorKind, message ?? state);
  if (req.timer) clearTimeout(req.timer);
  req.timer = null;
  const w = req.waiters;
  req.waiters = [];
  for (const fn of w) fn(state);
  return true;
}

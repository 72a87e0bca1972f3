/**
 * The embedded agent's metadata blob (what {@link EmbeddedAgent.getLocalMetadata} exports and
 * peers load), a msgpack array, decoded strictly ({@link decodeMetadata}); a malformed blob is a
 * {@link TransferError} `invalid`. By {@link META_VERSION}:
 * - 1: `[magic, 1, name, host, port, secret, regions]` or `[..., regions, device]` (7 or 8 fields);
 * - 2 (the same-host data plane, `shared-memory.ts`): `[magic, 2, name, host, port, secret, regions,
 *   device | nil, shm | nil]`, always 9 fields (`shm`: {@link PeerShm}, see `decodeShmField`).
 * A blob whose field count is not its version's (a version 1 blob with the shared mapping, a
 * version 2 blob without it) is refused naming its version. This agent writes version 2 and reads both.
 * @module
 */
import { Packr, Unpackr } from 'msgpackr';
import { IPC_HANDLE_BYTES } from './device.js';
import { TransferError } from './errors.js';
import { inFlatRegions } from './memory.js';
import { MAX_NAME_LENGTH, SECRET_BYTES } from './wire.js';
import type { EmbeddedAgent } from './embedded.js';

export const META_MAGIC = 'kvconnect-embedded';
/** The version this agent writes (history in the module comment). */
export const META_VERSION = 2;
/** Field counts of a blob by version: what {@link decodeMetadata} accepts. */
const META_FIELDS: Readonly<Record<number, readonly number[]>> = { 1: [7, 8], 2: [9] };
const MAX_META_BYTES = 64 * 1024 * 1024;
export const packr = new Packr({ useRecords: false, variableMapSize: true });
const unpackr = new Unpackr({ useRecords: false, int64AsType: 'number' });

/** A peer as its metadata describes it. */
export interface PeerInfo {
  readonly name: string;
  readonly host: string;
  readonly port: number;
  readonly secret: Uint8Array;
  readonly regions: readonly number[]; // flat sorted [addr, len]
  /** The peer's host id for device IPC (null: it registered no device memory). */
  readonly hostId: string | null;
  /** The peer's device regions (also in `regions`), sorted by address. */
  readonly devices: readonly PeerDeviceRegion[];
  /** The peer's host regions in shared mappings (also in `regions`), or null: none. */
  readonly shm: PeerShm | null;
}

/** The same-host data plane part of a peer's metadata (see `shared-memory.ts`). */
export interface PeerShm {
  /** The peer's `sameHostKey()`: its memory can be mapped only where this equals ours. */
  readonly hostKey: string;
  /** The peer's process id (its mappings are opened as `/proc/<pid>/fd/<fd>`). */
  readonly pid: number;
  /** Its regions in shared mappings, sorted by address. */
  readonly regions: readonly PeerShmRegion[];
}

/** A registered host region of a peer that lies in one of its shared mappings. */
export interface PeerShmRegion {
  readonly addr: number;
  readonly length: number;
  /** The memfd's name (`kvc-` and 32 hex digits) and its descriptor in the peer's process. */
  readonly name: string;
  readonly fd: number;
  /** Bytes of the whole mapping (header page included). */
  readonly size: number;
  /** Offset of the region's first byte from the mapping's start (at least the header page). */
  readonly offset: number;
  /** The grant word the mapping's header holds while the peer grants this registration. */
  readonly grant: number;
}

/** Bytes of a shared mapping's header page (native/src/addon_shm.cc). */
export const SHM_HEADER_BYTES = 4096;
const SHM_NAME = /^kvc-[0-9a-f]{32}$/;

/** A device region of a peer as its metadata advertises it. */
export interface PeerDeviceRegion {
  readonly addr: number;
  readonly length: number;
  readonly deviceId: number;
  /** IPC handle of the allocation starting at the region's first byte (null: no IPC). */
  readonly ipcHandle: Uint8Array | null;
}


/** The region of `devices` (sorted, disjoint) holding all of `[addr, addr + length)`, or null. */
export function findPeerDevice<R extends { readonly addr: number; readonly length: number }>(devices: readonly R[], addr: number, length: number): R | null {
  let lo = 0;
  let hi = devices.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    const d = devices[mid]!;
    if (addr < d.addr) hi = mid - 1;
    else if (addr >= d.addr + d.length) lo = mid + 1;
    else return addr + length <= d.addr + d.length ? d : null;
  }
  return null;
}


/**
 * Decodes an embedded agent's metadata blob strictly.
 * @throws TransferError `invalid` for anything malformed.
 */
export function decodeMetadata(md: Uint8Array): PeerInfo {
  if (!(md instanceof Uint8Array) || md.byteLength === 0 || md.byteLength > MAX_META_BYTES) throw new TransferError('invalid', 'metadata must be a non-empty Uint8Array of at most 64 MiB');
  let v: unknown;
  try {
    v = unpackr.unpack(md);
  } catch (e) {
    throw new TransferError('invalid', `undecodable metadata: ${e instanceof Error ? e.message : String(e)}`);
  }
  if (!Array.isArray(v) || v.length < 2 || v[0] !== META_MAGIC) throw new TransferError('invalid', 'not an embedded agent\'s metadata');
  const counts = typeof v[1] === 'number' ? META_FIELDS[v[1]] : undefined;
  if (!counts) throw new TransferError('invalid', `metadata version ${String(v[1])} is not one of ${Object.keys(META_FIELDS).join(', ')}`);
  if (!counts.includes(v.length)) throw new TransferError('invalid', `metadata version ${String(v[1])} has ${counts.join(' or ')} fields, this blob ${v.length}`);
  const [, , name, host, port, secret, regions] = v as unknown[];
  if (typeof name !== 'string' || name.length === 0 || name.length > MAX_NAME_LENGTH) throw new TransferError('invalid', 'metadata: bad agent name');
  if (typeof host !== 'string' || host.length === 0 || host.length > 255) throw new TransferError('invalid', 'metadata: bad host');
  if (typeof port !== 'number' || !Number.isInteger(port) || port < 1 || port > 65535) throw new TransferError('invalid', 'metadata: bad port');
  if (!(secret instanceof Uint8Array) || secret.length !== SECRET_BYTES) throw new TransferError('invalid', 'metadata: bad secret');
  if (!Array.isArray(regions) || regions.length % 2 !== 0) throw new TransferError('invalid', 'metadata: bad region list');
  let prevEnd = -1;
  for (let i = 0; i < regions.length; i += 2) {
    const a = regions[i];
    const l = regions[i + 1];
    if (typeof a !== 'number' || typeof l !== 'number' || !Number.isSafeInteger(a) || !Number.isSafeInteger(l) || a < 0 || l <= 0 || a <= prevEnd || !Number.isSafeInteger(a + l)) {
      throw new TransferError('invalid', `metadata: region ${i / 2} is malformed or out of order`);
    }
    prevEnd = a + l - 1;
  }
  const { hostId, devices } = decodeDeviceField(v[7], regions as number[]);
  const shm = decodeShmField(v[8], regions as number[]);
  return { name, host, port, secret: Uint8Array.prototype.slice.call(secret), regions: regions as number[], hostId, devices, shm };
}

/** The metadata's optional device field (see `deviceMetadata`), checked against the region list. */
function decodeDeviceField(f: unknown, regions: readonly number[]): { hostId: string | null; devices: PeerDeviceRegion[] } {
  if (f === undefined || f === null) return { hostId: null, devices: [] };
  if (!Array.isArray(f) || f.length !== 2 || typeof f[0] !== 'string' || f[0].length === 0 || f[0].length > 1024 || !Array.isArray(f[1])) throw new TransferError('invalid', 'metadata: bad device field');
  const devices: PeerDeviceRegion[] = [];
  let prevEnd = -1;
  for (const [i, d] of (f[1] as unknown[]).entries()) {
    if (!Array.isArray(d) || d.length !== 4) throw new TransferError('invalid', `metadata: device region ${i} is malformed`);
    const [addr, length, deviceId, handle] = d as unknown[];
    if (typeof addr !== 'number' || typeof length !== 'number' || !Number.isSafeInteger(addr) || !Number.isSafeInteger(length) || length <= 0 || addr <= prevEnd || !inFlatRegions(regions, addr, length)) {
      throw new TransferError('invalid', `metadata: device region ${i} is out of order or not a registered region`);
    }
    if (typeof deviceId !== 'number' || !Number.isInteger(deviceId) || deviceId < 0 || deviceId > 65535) throw new TransferError('invalid', `metadata: device region ${i} has a bad device id`);
    if (handle !== null && !(handle instanceof Uint8Array && handle.byteLength === IPC_HANDLE_BYTES)) throw new TransferError('invalid', `metadata: device region ${i} has a bad IPC handle`);
    prevEnd = addr + length - 1;
    devices.push({ addr, length, deviceId, ipcHandle: handle === null ? null : Uint8Array.prototype.slice.call(handle) });
  }
  return { hostId: f[0], devices };
}

/**
 * The metadata's optional shared-memory field `[hostKey, pid, [[addr, length, name, fd, size,
 * offset, grant], ...]]`, checked against the region list: every region registered, sorted, inside
 * its mapping after the header page (`offset + length <= size`), with a kvconnect memfd name and
 * a non-zero grant word. These bounds are what the initiator trusts when it maps the peer's memory
 * (the addon checks the memfd's name and exact size when it maps it).
 */
function decodeShmField(f: unknown, regions: readonly number[]): PeerShm | null {
  if (f === undefined || f === null) return null;
  const bad = (why: string) => new TransferError('invalid', `metadata: shared-memory field: ${why}`);
  if (!Array.isArray(f) || f.length !== 3 || typeof f[0] !== 'string' || f[0].length === 0 || f[0].length > 1024 || !Array.isArray(f[2])) throw bad('malformed');
  const pid = f[1] as unknown;
  if (typeof pid !== 'number' || !Number.isInteger(pid) || pid <= 0 || pid > 0x7fffffff) throw bad('bad pid');
  const out: PeerShmRegion[] = [];
  let prevEnd = -1;
  for (const [i, d] of (f[2] as unknown[]).entries()) {
    if (!Array.isArray(d) || d.length !== 7) throw bad(`region ${i} is malformed`);
    const [addr, length, name, fd, size, offset, grant] = d as unknown[];
    const int = (x: unknown): x is number => typeof x === 'number' && Number.isSafeInteger(x);
    if (!int(addr) || !int(length) || length <= 0 || addr <= prevEnd || !inFlatRegions(regions, addr, length)) throw bad(`region ${i} is out of order or not a registered region`);
    if (typeof name !== 'string' || !SHM_NAME.test(name)) throw bad(`region ${i} has a bad mapping name`);
    if (!int(fd) || fd < 0 || fd > 0x7fffffff) throw bad(`region ${i} has a bad descriptor`);
    if (!int(size) || !int(offset) || offset < SHM_HEADER_BYTES || size <= SHM_HEADER_BYTES || offset + length > size) throw bad(`region ${i} is not inside its mapping`);
    if (!int(grant) || grant <= 0 || grant > 0xffffffff) throw bad(`region ${i} has a bad grant word`);
    prevEnd = addr + length - 1;
    out.push({ addr, length, name, fd, size, offset, grant });
  }
  return { hostKey: f[0], pid, regions: out };
}

/**
 * The embedded agent's metadata blob (what {@link EmbeddedAgent.getLocalMetadata} exports and
 * peers load): msgpack `[magic, version, name, host, port, secret, regions, device?]`, decoded
 * strictly ({@link decodeMetadata}); a malformed blob is a {@link TransferError} `invalid`.
 * @module
 */
import { Packr, Unpackr } from 'msgpackr';
import { IPC_HANDLE_BYTES } from './device.js';
import { TransferError } from './errors.js';
import { inFlatRegions } from './memory.js';
import { MAX_NAME_LENGTH, SECRET_BYTES } from './wire.js';
import type { EmbeddedAgent } from './embedded.js';

export const META_MAGIC = 'kvconnect-embedded';
export const META_VERSION = 1;
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
}

/** A device region of a peer as its metadata advertises it. */
export interface PeerDeviceRegion {
  readonly addr: number;
  readonly length: number;
  readonly deviceId: number;
  /** IPC handle of the allocation starting at the region's first byte (null: no IPC). */
  readonly ipcHandle: Uint8Array | null;
}


/** The device region of `devices` (sorted) holding all of `[addr, addr + length)`, or null. */
export function findPeerDevice(devices: readonly PeerDeviceRegion[], addr: number, length: number): PeerDeviceRegion | null {
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
  if (!Array.isArray(v) || (v.length !== 7 && v.length !== 8) || v[0] !== META_MAGIC) throw new TransferError('invalid', 'not an embedded agent\'s metadata');
  if (v[1] !== META_VERSION) throw new TransferError('invalid', `metadata version ${String(v[1])} is not ${META_VERSION}`);
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
  return { name, host, port, secret: Uint8Array.prototype.slice.call(secret), regions: regions as number[], hostId, devices };
}

/** The metadata's optional device field (see `deviceMetadata`), checked against the region list. */
function decodeDeviceField(f: unknown, regions: readonly number[]): { hostId: string | null; devices: PeerDeviceRegion[] } {
  if (f === undefined) return { hostId: null, devices: [] };
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

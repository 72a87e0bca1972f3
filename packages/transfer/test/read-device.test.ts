/**
 * `readDeviceBytes`: a range of a device region copied to a new host buffer (what localizing a
 * mismatch in device KV reads, docs/localize.md), over the process's emulated device memory.
 */
import { describe, expect, it } from 'vitest';
import { DeviceMemoryError, emulatedDeviceMemory, readDeviceBytes } from '../src/index.js';

describe('readDeviceBytes', () => {
  it('copies exactly the asked range of a device region; a range outside it is a DeviceMemoryError', () => {
    const dm = emulatedDeviceMemory();
    const r = dm.alloc(0, 256);
    try {
      const src = Uint8Array.from({ length: 256 }, (_, i) => (i * 7 + 3) & 0xff);
      dm.copy(0, 'h2d', r.address, src, 256);
      expect(readDeviceBytes(r, 100, 20)).toEqual(src.slice(100, 120));
      expect(readDeviceBytes(r, 0, 256)).toEqual(src);
      expect(readDeviceBytes(r, 256, 0)).toEqual(new Uint8Array(0));
      for (const [off, n] of [[250, 7], [-1, 2], [0.5, 1], [0, 257]]) expect(() => readDeviceBytes(r, off, n)).toThrow(DeviceMemoryError);
      // The region's own bounds, not the allocation's: a region of the first 100 bytes.
      expect(() => readDeviceBytes({ ...r, bytes: 100 }, 90, 20)).toThrow(/outside a device region of 100 bytes/);
    } finally {
      dm.free(r);
    }
  });
});

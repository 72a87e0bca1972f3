/**
 * A peer's advertised shared mappings are bound to the process that answered the authenticated
 * handshake (embedded.ts "Same-host host memory", `processHoldsPeerSocket` in shared-memory.ts):
 * an agent B that re-advertises the mapping of another process A (whose metadata it saw: memfd
 * name, descriptor, size, offset and grant word) under its own name does not make an initiator
 * copy A's memory: the initiator refuses the mapping and moves the transfer over TCP to B. Skipped
 * (with the reason) where the addon has no shm bindings.
 */
import * as net from 'node:net';
import { Packr, Unpackr } from 'msgpackr';
import { afterEach, describe, expect, it } from 'vitest';
import { EmbeddedAgent, SharedHostArena, type TransferAgent } from '../src/index.js';
import { processHoldsPeerSocket } from '../src/shared-memory.js';
import { pattern } from './patterns.js';
import { forkFixture } from './fixtures/fork-fixture.js';

const probe = new SharedHostArena();
const skip = probe.shared ? null : `no shared mappings here: ${probe.reason}`;
const note = skip ? ` (skipped: ${skip})` : '';
const packr = new Packr({ useRecords: false, variableMapSize: true });
const unpackr = new Unpackr({ useRecords: false, int64AsType: 'number' });
let seq = 0;
const uniq = (p: string) => `${p}-${process.pid}-${++seq}`;
const open: TransferAgent[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((a) => a.close().catch(() => {})));
});

describe('processHoldsPeerSocket', () => {
  it('is true for the process holding the far end of a connection, false for another process or an unconnected socket', async () => {
    const srv = net.createServer();
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
    const port = (srv.address() as net.AddressInfo).port;
    const c = net.connect(port, '127.0.0.1');
    await new Promise<void>((r) => c.once('connect', r));
    try {
      expect(processHoldsPeerSocket(process.pid, c)).toBe(process.platform === 'linux');
      expect(processHoldsPeerSocket(1, c)).toBe(false);
      expect(processHoldsPeerSocket(process.pid, {})).toBe(false);
    } finally {
      c.destroy();
      srv.close();
    }
  });
});

describe('re-advertised shared mappings', () => {
  it.skipIf(!!skip)(`an agent advertising another process's mapping as its own: the initiator copies nothing of it, the transfers go over TCP to that agent${note}`, async () => {
    const { child, ask } = await forkFixture('shm-peer-process', 'shm-peer-process-binding');
    try {
      // A: the child, its memory (pattern 77) in a shared mapping.
      const info = await ask({ cmd: 'start', name: uniq('victim') });
      expect(info.shared).toBe(true);
      const size = info.size as number;
      const victim = unpackr.unpack(Uint8Array.from(info.md as number[])) as unknown[];
      const [hostKey, pid, [shmRegion]] = victim[8] as [string, number, unknown[][]];
      // B: an agent of this process with heap memory (pattern 50) that advertises A's mapping for its region.
      const b = await EmbeddedAgent.create({ name: uniq('relabeller') });
      const c = await EmbeddedAgent.create({ name: uniq('initiator') });
      open.push(b, c);
      const mb = pattern(size, 50);
      const rb = await b.registerMemory([{ bytes: mb }]);
      const mdB = unpackr.unpack(await b.getLocalMetadata()) as unknown[];
      const [, , name, fd, mapSize, offset, grant] = shmRegion!;
      mdB[8] = [hostKey, pid, [[rb.regions[0]!.addr, size, name, fd, mapSize, offset, grant]]];
      const mc = new Uint8Array(size);
      const rc = await c.registerMemory([{ bytes: mc }]);
      const peer = await c.loadRemoteMetadata(new Uint8Array(packr.pack(mdB)));
      await b.loadRemoteMetadata(await c.getLocalMetadata());
      const local = await c.prepDescList(null, 'DRAM', [{ addr: rc.regions[0]!.addr, length: size }]);
      const remote = await c.prepDescList(peer, 'DRAM', [{ addr: rb.regions[0]!.addr, length: size }]);
      const r = await c.makeTransfer({ op: 'READ', local, remote });
      await c.post(r);
      expect(await c.wait(r)).toBe('done');
      // B's bytes (over TCP), not A's.
      expect(Buffer.compare(mc, pattern(size, 50))).toBe(0);
      mc.set(pattern(size, 51));
      const w = await c.makeTransfer({ op: 'WRITE', local, remote });
      await c.post(w);
      expect(await c.wait(w)).toBe('done');
      expect(Buffer.compare(mb, pattern(size, 51))).toBe(0);
      expect(c.shmStats.transfers).toBe(0);
      expect(await ask({ cmd: 'check', seed: 77 })).toEqual({ same: true });
    } finally {
      child.kill();
    }
  });
});

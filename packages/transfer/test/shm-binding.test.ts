/**
 * A peer's advertised shared mappings are bound to the process that answered the authenticated
 * handshake (embedded.ts "Same-host host memory", `processHoldsPeerSocket` in shared-memory.ts):
 * an agent B that re-advertises the mapping of another process A (whose metadata it saw: memfd
 * name, descriptor, size, offset and grant word) under its own name does not make an initiator
 * copy A's memory: the initiator refuses the mapping and moves the transfer over TCP to B. Skipped
 * (with the reason) where the addon has no shm bindings.
 */
import { spawn } from 'node:child_process';
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

describe('processHoldsPeerSocket: addresses bind, not ports alone', () => {
  const linux = process.platform === 'linux';
  it.skipIf(!linux)('a process holding a socket with the same port pair between other loopback addresses is not the far end (skipped off Linux)', async () => {
    // The "victim" V: another process listening on 127.0.0.1:X.
    const v = spawn(process.execPath, ['-e', "const s=require('net').createServer(c=>c.on('error',()=>{}));s.listen(0,'127.0.0.1',()=>console.log(s.address().port))"], { stdio: ['ignore', 'pipe', 'inherit'] });
    try {
      const x = await new Promise<number>((resolve) => v.stdout!.once('data', (d: Buffer) => resolve(Number(String(d).trim()))));
      // The agent M (this process) on 127.0.0.2:X; the initiator's socket c reaches M from 127.0.0.1:E.
      const m = net.createServer((s) => s.on('error', () => {}));
      await new Promise<void>((r) => m.listen(x, '127.0.0.2', r));
      const c = net.connect({ host: '127.0.0.2', port: x });
      await new Promise<void>((r) => c.once('connect', r));
      // M makes V hold a socket local :X, remote :E (from 127.0.0.3:E).
      const d = net.connect({ host: '127.0.0.1', port: x, localAddress: '127.0.0.3', localPort: c.localPort });
      await new Promise<void>((r, j) => d.once('connect', r).once('error', j));
      await new Promise((r) => setTimeout(r, 50)); // V accepted
      try {
        expect(processHoldsPeerSocket(v.pid!, c)).toBe(false);
        expect(processHoldsPeerSocket(process.pid, c)).toBe(true);
      } finally {
        c.destroy();
        d.destroy();
        m.close();
      }
    } finally {
      v.kill();
    }
  });

  it.skipIf(!linux)('IPv4 clients of a dual-stack (::) listener and IPv6 loopback still bind (skipped off Linux)', async () => {
    for (const [listen, host] of [['::', '127.0.0.1'], ['::1', '::1']] as const) {
      const srv = net.createServer((s) => s.on('error', () => {}));
      const ok = await new Promise<boolean>((r) => srv.once('error', () => r(false)).listen(0, listen, () => r(true)));
      if (!ok) continue; // no IPv6 here: nothing to check for this pair
      const c = net.connect((srv.address() as net.AddressInfo).port, host);
      await new Promise<void>((r) => c.once('connect', r));
      try {
        expect(processHoldsPeerSocket(process.pid, c)).toBe(true);
      } finally {
        c.destroy();
        srv.close();
      }
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

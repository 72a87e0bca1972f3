/**
 * The TransferAgent conformance suite: the same behaviour checks for every agent
 * implementation (embedded, NIXL over the fake library, real NIXL when present).
 */
import { afterEach, describe, expect, it } from 'vitest';
import { isTransferError, TransferError, type TransferAgent, type XferStatus } from '../src/index.js';
import { pattern } from './patterns.js';

/** How to make agents for the suite. */
export interface AgentFactory {
  readonly label: string;
  /**
   * Two agents that have loaded each other's metadata. With `stalled`, transfers that `a`
   * initiates towards `b` never finish on their own (b hangs, or a's backend holds them).
   */
  pair(opts: { stalled: boolean }): Promise<{ a: TransferAgent; b: TransferAgent }>;
  /** Whether `pair({ stalled: true })` is possible. */
  readonly canStall: boolean;
  /**
   * Whether the target refuses a transfer into memory it deregistered after the initiator loaded
   * its metadata. Real NIXL over UCX (TCP or shared memory) does not: the initiator keeps the
   * remote key, the transfer reports success and the bytes land (seen with NIXL 1.4.0 and UCX
   * 1.13.1). Connectors must therefore never let a peer write into blocks that were released
   * until the peer's metadata for them is invalidated. Default true.
   */
  readonly refusesAfterDeregistration?: boolean;
  /** Rewrites metadata so that it carries a wrong secret (agents with secrets only). */
  readonly tamperSecret?: (md: Uint8Array) => Uint8Array;
  /** Makes a third agent (for the wrong-secret test). */
  readonly single?: (name: string) => Promise<TransferAgent>;
}

export { pattern };

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Polls `agent` until `count` notifs from `from` arrived (or the deadline). */
export async function collectNotifs(agent: TransferAgent, from: string, count: number, deadlineMs = 5000, onPoll?: (got: Uint8Array[]) => void): Promise<Uint8Array[]> {
  const got: Uint8Array[] = [];
  const end = Date.now() + deadlineMs;
  while (got.length < count && Date.now() < end) {
    const m = await agent.pollNotifs();
    const l = m.get(from);
    if (l && l.length) {
      got.push(...l);
      onPoll?.(got);
    }
    if (got.length < count) await sleep(1);
  }
  return got;
}

/** Resolves with the status, or 'hang' when it is still in progress after `ms`. */
async function within(p: Promise<XferStatus>, ms: number): Promise<XferStatus | 'hang'> {
  return Promise.race([p, sleep(ms).then(() => 'hang' as const)]);
}

export function defineConformance(f: AgentFactory): void {
  describe(`TransferAgent conformance: ${f.label}`, () => {
    const open: TransferAgent[] = [];
    const pair = async (stalled = false) => {
      const p = await f.pair({ stalled });
      open.push(p.a, p.b);
      return p;
    };
    afterEach(async () => {
      await Promise.all(open.splice(0).map((x) => x.close().catch(() => {})));
    });

    it('registers memory, exchanges metadata, declares capabilities', async () => {
      const { a, b } = await pair();
      const reg = await b.registerMemory([{ bytes: new Uint8Array(4096) }, { bytes: new ArrayBuffer(100) }, { bytes: new SharedArrayBuffer(64) }]);
      expect(reg.regions.map((r) => r.length)).toEqual([4096, 100, 64]);
      for (const r of reg.regions) expect(Number.isSafeInteger(r.addr) && r.kind === 'DRAM').toBe(true);
      const name = await a.loadRemoteMetadata(await b.getLocalMetadata());
      expect(name).toBe(b.name);
      expect(a.capabilities.memoryKinds).toContain('DRAM');
      expect(a.capabilities.read && a.capabilities.write && a.capabilities.notify).toBe(true);
      await expect(a.registerMemory([{ bytes: new Uint8Array(0) }])).rejects.toSatisfy((e) => isTransferError(e, 'invalid'));
      await b.deregisterMemory(reg);
    });

    for (const op of ['READ', 'WRITE'] as const) {
      it(`${op}s many descriptors (index lists, odd sizes) and the bytes match`, async () => {
        const { a, b } = await pair();
        const N = 200;
        const sizes = Array.from({ length: N }, (_, i) => 1 + ((i * 7919) % 9000));
        const total = sizes.reduce((x, y) => x + y, 0);
        const la = new Uint8Array(total + 1000);
        const lb = new Uint8Array(total + 3000);
        const src = op === 'READ' ? lb : la;
        src.set(pattern(src.length, 7));
        const before = (op === 'READ' ? la : lb).slice();
        const ra = await a.registerMemory([{ bytes: la }]);
        const rb = await b.registerMemory([{ bytes: lb }]);
        await a.loadRemoteMetadata(await b.getLocalMetadata());
        const offA: number[] = [];
        const offB: number[] = [];
        let oa = 500;
        let ob = 2000;
        for (const s of sizes) {
          offA.push(oa);
          offB.push(ob);
          oa += s;
          ob += s;
        }
        const local = await a.prepDescList(null, 'DRAM', sizes.map((s, i) => ({ addr: ra.regions[0]!.addr + offA[i]!, length: s })));
        // remote list in reverse order: indices map pair i to remote N-1-i
        const remote = await a.prepDescList(b.name, 'DRAM', sizes.map((_, k) => ({ addr: rb.regions[0]!.addr + offB[N - 1 - k]!, length: sizes[N - 1 - k]! })));
        const idx = sizes.map((_, i) => i);
        const req = await a.makeTransfer({ op, local, localIndices: idx, remote, remoteIndices: idx.map((i) => N - 1 - i) });
        expect(req.bytes).toBe(total);
        const s0 = await a.post(req);
        expect(['in-progress', 'done']).toContain(s0);
        expect(await a.wait(req)).toBe('done');
        expect(a.status(req)).toBe('done');
        const dst = op === 'READ' ? la : lb;
        const exp = before.slice();
        for (let i = 0; i < N; i++) {
          if (op === 'READ') exp.set(lb.subarray(offB[i]!, offB[i]! + sizes[i]!), offA[i]!);
          else exp.set(la.subarray(offA[i]!, offA[i]! + sizes[i]!), offB[i]!);
        }
        expect(Buffer.compare(dst, exp)).toBe(0);
        // repost the same request after changing the source
        src.set(pattern(src.length, 8));
        for (let i = 0; i < N; i++) {
          if (op === 'READ') exp.set(lb.subarray(offB[i]!, offB[i]! + sizes[i]!), offA[i]!);
          else exp.set(la.subarray(offA[i]!, offA[i]! + sizes[i]!), offB[i]!);
        }
        await a.post(req);
        expect(await a.wait(req)).toBe('done');
        expect(Buffer.compare(dst, exp)).toBe(0);
        await a.release(req);
      });
    }

    it('delivers a WRITE notif only after the bytes are in the target memory', async () => {
      const { a, b } = await pair();
      const n = 6 * 1024 * 1024;
      const la = pattern(n, 3);
      const lb = new Uint8Array(n);
      const ra = await a.registerMemory([{ bytes: la }]);
      const rb = await b.registerMemory([{ bytes: lb }]);
      await a.loadRemoteMetadata(await b.getLocalMetadata());
      await b.loadRemoteMetadata(await a.getLocalMetadata());
      const descs = 48;
      const step = n / descs;
      const local = await a.prepDescList(null, 'DRAM', Array.from({ length: descs }, (_, i) => ({ addr: ra.regions[0]!.addr + i * step, length: step })));
      const remote = await a.prepDescList(b.name, 'DRAM', Array.from({ length: descs }, (_, i) => ({ addr: rb.regions[0]!.addr + i * step, length: step })));
      const req = await a.makeTransfer({ op: 'WRITE', local, remote, notif: new TextEncoder().encode('req-1 done') });
      let landedWhenSeen: boolean | null = null;
      const posted = a.post(req);
      const got = await collectNotifs(b, a.name, 1, 10_000, () => {
        if (landedWhenSeen === null) landedWhenSeen = Buffer.compare(lb, la) === 0;
      });
      await posted;
      expect(new TextDecoder().decode(got[0])).toBe('req-1 done');
      expect(landedWhenSeen).toBe(true);
      expect(await a.wait(req)).toBe('done');
    });

    it('delivers a READ notif to the target after the reader got the bytes', async () => {
      const { a, b } = await pair();
      const n = 3 * 1024 * 1024;
      const la = new Uint8Array(n);
      const lb = pattern(n, 4);
      const ra = await a.registerMemory([{ bytes: la }]);
      const rb = await b.registerMemory([{ bytes: lb }]);
      await a.loadRemoteMetadata(await b.getLocalMetadata());
      await b.loadRemoteMetadata(await a.getLocalMetadata());
      const local = await a.prepDescList(null, 'DRAM', [{ addr: ra.regions[0]!.addr, length: n }]);
      const remote = await a.prepDescList(b.name, 'DRAM', [{ addr: rb.regions[0]!.addr, length: n }]);
      const req = await a.makeTransfer({ op: 'READ', local, remote, notif: new Uint8Array([0, 255, 0, 7]) });
      await a.post(req);
      let readerHadBytes: boolean | null = null;
      const got = await collectNotifs(b, a.name, 1, 10_000, () => {
        if (readerHadBytes === null) readerHadBytes = Buffer.compare(la, lb) === 0;
      });
      expect([...got[0]!]).toEqual([0, 255, 0, 7]);
      expect(readerHadBytes).toBe(true);
      expect(await a.wait(req)).toBe('done');
    });

    it('carries standalone notifs by sender, binary-safe, each once', async () => {
      const { a, b } = await pair();
      await a.loadRemoteMetadata(await b.getLocalMetadata());
      const msgs = [new Uint8Array([1, 0, 2]), new Uint8Array(0), pattern(70_000, 9)];
      for (const m of msgs) await a.sendNotif(b.name, m);
      const got = await collectNotifs(b, a.name, 3);
      expect(got.length).toBe(3);
      got.forEach((g, i) => expect(Buffer.compare(g, msgs[i]!)).toBe(0));
      await sleep(20);
      expect((await b.pollNotifs()).size).toBe(0); // taken once
      await expect(a.sendNotif('nobody', new Uint8Array(1))).rejects.toSatisfy((e) => isTransferError(e, 'not-found'));
    });

    it('refuses descriptors outside registered memory and leaves the target unchanged', async () => {
      const { a, b } = await pair();
      const la = pattern(8192, 5);
      const lb = pattern(4096, 6);
      const before = lb.slice();
      const ra = await a.registerMemory([{ bytes: la }]);
      const rb = await b.registerMemory([{ bytes: lb }]);
      await a.loadRemoteMetadata(await b.getLocalMetadata());
      const base = rb.regions[0]!.addr;
      for (const d of [
        { addr: base + 4000, length: 200 }, // runs past the end
        { addr: base - 16, length: 32 }, // starts before
        { addr: base + 4096, length: 1 }, // just past
        { addr: base, length: 0 },
      ]) {
        await expect(a.prepDescList(b.name, 'DRAM', [d])).rejects.toSatisfy((e) => isTransferError(e, 'invalid'));
      }
      await expect(a.prepDescList(null, 'DRAM', [{ addr: ra.regions[0]!.addr + 8000, length: 400 }])).rejects.toSatisfy((e) => isTransferError(e, 'invalid'));
      await expect(a.prepDescList('nobody', 'DRAM', [{ addr: base, length: 1 }])).rejects.toSatisfy((e) => isTransferError(e, 'not-found'));
      const local = await a.prepDescList(null, 'DRAM', [{ addr: ra.regions[0]!.addr, length: 4096 }]);
      const remote = await a.prepDescList(b.name, 'DRAM', [{ addr: base, length: 4096 }]);
      if (f.refusesAfterDeregistration !== false) {
        // The target deregisters after its metadata was loaded: the transfer must not touch it.
        const req = await a.makeTransfer({ op: 'WRITE', local, remote });
        await b.deregisterMemory(rb);
        await a.post(req);
        const st = await a.wait(req);
        expect(st).not.toBe('done');
        expect(a.status(req)).toBe(st);
        expect(req.error).toBeInstanceOf(Error);
        expect(Buffer.compare(lb, before)).toBe(0);
      }
      // Mismatched lengths and indices.
      const r2 = await a.prepDescList(null, 'DRAM', [{ addr: ra.regions[0]!.addr, length: 10 }]);
      await expect(a.makeTransfer({ op: 'READ', local: r2, remote })).rejects.toSatisfy((e) => isTransferError(e, 'invalid'));
      await expect(a.makeTransfer({ op: 'READ', local, remote, localIndices: [0], remoteIndices: [1] })).rejects.toSatisfy((e) => isTransferError(e, 'invalid'));
      await expect(a.makeTransfer({ op: 'READ', local, remote, localIndices: [0, 0], remoteIndices: [0] })).rejects.toSatisfy((e) => isTransferError(e, 'invalid'));
    });

    it('validates arguments the same way as every other agent (the shared front half, agent-base.ts)', async () => {
      const { a, b } = await pair();
      const invalid = (e: unknown) => isTransferError(e, 'invalid');
      // A raw region whose end is past 2^53 (addr + length not a safe integer).
      await expect(a.registerMemory([{ addr: 2 ** 53 - 4096, length: 8192, kind: 'DRAM' }])).rejects.toSatisfy(invalid);
      await expect(a.registerMemory([{ addr: 4096, length: 4096, kind: 'DRAM', deviceId: 1.5 }])).rejects.toSatisfy(invalid);
      const la = pattern(8192, 21);
      const lb = pattern(8192, 22);
      const ra = await a.registerMemory([{ bytes: la }]);
      const rb = await b.registerMemory([{ bytes: lb }]);
      await a.loadRemoteMetadata(await b.getLocalMetadata());
      const la0 = ra.regions[0]!.addr;
      const lb0 = rb.regions[0]!.addr;
      // An empty descriptor list, a fractional device id.
      await expect(a.prepDescList(null, 'DRAM', [])).rejects.toSatisfy(invalid);
      await expect(a.prepDescList(b.name, 'DRAM', [])).rejects.toSatisfy(invalid);
      await expect(a.prepDescList(null, 'DRAM', [{ addr: la0, length: 16, deviceId: 1.5 }])).rejects.toSatisfy(invalid);
      const local = await a.prepDescList(null, 'DRAM', [{ addr: la0, length: 4096 }, { addr: la0 + 4096, length: 4096 }]);
      const remote = await a.prepDescList(b.name, 'DRAM', [{ addr: lb0, length: 4096 }, { addr: lb0 + 4096, length: 4096 }]);
      // Indices that are not integers in range: never truncated or wrapped to a valid one.
      for (const bad of [0.5, 1.5, -1, 2, 2 ** 32, Number.NaN]) {
        await expect(a.makeTransfer({ op: 'READ', local, remote, localIndices: [bad], remoteIndices: [0] })).rejects.toSatisfy(invalid);
        await expect(a.makeTransfer({ op: 'READ', local, remote, localIndices: [0], remoteIndices: [bad] })).rejects.toSatisfy(invalid);
      }
      await expect(a.makeTransfer({ op: 'READ', local, remote, localIndices: [], remoteIndices: [] })).rejects.toSatisfy(invalid);
      await expect(a.makeTransfer({ op: 'READ', local, remote, notif: 'x' as unknown as Uint8Array })).rejects.toSatisfy(invalid);
      // Lists swapped, released lists, an unknown op.
      await expect(a.makeTransfer({ op: 'READ', local: remote, remote: local })).rejects.toSatisfy(invalid);
      await expect(a.makeTransfer({ op: 'COPY' as 'READ', local, remote })).rejects.toSatisfy(invalid);
      const req = await a.makeTransfer({ op: 'READ', local, remote, localIndices: [1], remoteIndices: [0] });
      expect([req.op, req.remoteAgent, req.bytes, req.count]).toEqual(['READ', b.name, 4096, 1]);
      expect(a.status(req)).toBe('invalid'); // never posted
      await expect(a.post(req, { timeoutMs: 1.5 })).rejects.toSatisfy(invalid);
      await expect(a.post(req, { notif: 'x' as unknown as Uint8Array })).rejects.toSatisfy(invalid);
      expect(await a.wait(req)).toBe('invalid'); // not posted: resolves at once
      await a.post(req);
      expect(await a.wait(req)).toBe('done');
      expect(Buffer.compare(la.subarray(4096), lb.subarray(0, 4096))).toBe(0);
      await a.release(req);
      await a.release(req); // idempotent
      await expect(a.post(req)).rejects.toSatisfy(invalid);
      await a.releaseDescList(local);
      await expect(a.makeTransfer({ op: 'READ', local, remote })).rejects.toSatisfy(invalid);
      // A request of another agent.
      await expect(b.post(req)).rejects.toSatisfy(invalid);
      expect(() => b.status(req)).toThrow(TransferError);
    });

    it('completes 1,000 concurrent transfers', async () => {
      const { a, b } = await pair();
      const N = 1000;
      const sz = 4096;
      const la = new Uint8Array(N * sz);
      const lb = pattern(N * sz, 11);
      const wa = pattern(N * sz, 12);
      const wb = new Uint8Array(N * sz);
      const ra = await a.registerMemory([{ bytes: la }, { bytes: wa }]);
      const rb = await b.registerMemory([{ bytes: lb }, { bytes: wb }]);
      await a.loadRemoteMetadata(await b.getLocalMetadata());
      const descs = (base: number) => Array.from({ length: N }, (_, i) => ({ addr: base + i * sz, length: sz }));
      const [lr, lw, rr, rw] = await Promise.all([
        a.prepDescList(null, 'DRAM', descs(ra.regions[0]!.addr)),
        a.prepDescList(null, 'DRAM', descs(ra.regions[1]!.addr)),
        a.prepDescList(b.name, 'DRAM', descs(rb.regions[0]!.addr)),
        a.prepDescList(b.name, 'DRAM', descs(rb.regions[1]!.addr)),
      ]);
      const reqs = await Promise.all(
        Array.from({ length: N }, (_, i) =>
          i % 2 === 0
            ? a.makeTransfer({ op: 'READ', local: lr, localIndices: [i], remote: rr, remoteIndices: [i] })
            : a.makeTransfer({ op: 'WRITE', local: lw, localIndices: [i], remote: rw, remoteIndices: [i] }),
        ),
      );
      await Promise.all(reqs.map((r) => a.post(r)));
      const st = await Promise.all(reqs.map((r) => a.wait(r)));
      expect(st.every((s) => s === 'done')).toBe(true);
      for (let i = 0; i < N; i++) {
        const o = i * sz;
        if (i % 2 === 0) expect(Buffer.compare(la.subarray(o, o + sz), lb.subarray(o, o + sz))).toBe(0);
        else expect(Buffer.compare(wb.subarray(o, o + sz), wa.subarray(o, o + sz))).toBe(0);
      }
      await Promise.all(reqs.map((r) => a.release(r)));
    });

    const stalledSetup = async () => {
      const { a, b } = await pair(true);
      const la = new Uint8Array(1 << 20);
      const lb = pattern(1 << 20, 13);
      const ra = await a.registerMemory([{ bytes: la }]);
      const rb = await b.registerMemory([{ bytes: lb }]);
      await a.loadRemoteMetadata(await b.getLocalMetadata());
      const local = await a.prepDescList(null, 'DRAM', [{ addr: ra.regions[0]!.addr, length: 1 << 20 }]);
      const remote = await a.prepDescList(b.name, 'DRAM', [{ addr: rb.regions[0]!.addr, length: 1 << 20 }]);
      const req = await a.makeTransfer({ op: 'READ', local, remote });
      return { a, b, req, la };
    };

    it.runIf(f.canStall)(`reports remote-disconnect (not a hang) when the peer goes away mid-transfer${f.canStall ? '' : ' (skipped: this agent cannot stall a transfer)'}`, async () => {
      const { a, b, req } = await stalledSetup();
      expect(await a.post(req)).toBe('in-progress');
      await sleep(50);
      expect(a.status(req)).toBe('in-progress');
      await b.close();
      expect(await within(a.wait(req), 5000)).toBe('remote-disconnect');
      expect(req.error).toSatisfy((e) => isTransferError(e, 'remote-disconnect'));
    });

    it.runIf(f.canStall)(`times out a transfer that does not finish by its deadline${f.canStall ? '' : ' (skipped: this agent cannot stall a transfer)'}`, async () => {
      const { a, req, la } = await stalledSetup();
      const t0 = Date.now();
      await a.post(req, { timeoutMs: 200 });
      expect(await within(a.wait(req), 5000)).toBe('timeout');
      expect(Date.now() - t0).toBeGreaterThanOrEqual(190);
      expect(la.every((x) => x === 0)).toBe(true);
    });

    it.runIf(f.canStall)(`cancels an in-progress transfer on release${f.canStall ? '' : ' (skipped: this agent cannot stall a transfer)'}`, async () => {
      const { a, req } = await stalledSetup();
      await a.post(req);
      await a.release(req);
      expect(a.status(req)).toBe('canceled');
      await expect(a.post(req)).rejects.toSatisfy((e) => isTransferError(e, 'invalid'));
    });

    it.runIf(f.tamperSecret !== undefined && f.single !== undefined)(`refuses a peer that presents a wrong secret${f.tamperSecret !== undefined && f.single !== undefined ? '' : ' (skipped: this agent has no secret to tamper with)'}`, async () => {
      const { b } = await pair();
      const c = await f.single!('intruder');
      open.push(c);
      const lb = pattern(4096, 14);
      const before = lb.slice();
      const lc = pattern(4096, 15);
      const rb = await b.registerMemory([{ bytes: lb }]);
      const rc = await c.registerMemory([{ bytes: lc }]);
      const name = await c.loadRemoteMetadata(f.tamperSecret!(await b.getLocalMetadata()));
      const local = await c.prepDescList(null, 'DRAM', [{ addr: rc.regions[0]!.addr, length: 4096 }]);
      const remote = await c.prepDescList(name, 'DRAM', [{ addr: rb.regions[0]!.addr, length: 4096 }]);
      const w = await c.makeTransfer({ op: 'WRITE', local, remote });
      await c.post(w);
      expect(await within(c.wait(w), 5000)).toBe('invalid');
      expect(Buffer.compare(lb, before)).toBe(0);
      const r = await c.makeTransfer({ op: 'READ', local, remote });
      await c.post(r);
      expect(await within(c.wait(r), 5000)).toBe('invalid');
      expect(Buffer.compare(lc, pattern(4096, 15))).toBe(0);
    });
  });
}

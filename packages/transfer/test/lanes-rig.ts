/**
 * The rig of the lanes tests against a {@link FakeTarget} (embedded-lanes-hostile*.test.ts): an
 * initiator whose lanes are all ready, and a target that answers honestly from a memory image.
 * Not a test file (vitest collects `*.test.ts`).
 */
import { afterEach, expect } from 'vitest';
import { EmbeddedAgent, type EmbeddedAgentOptions } from '../src/index.js';
import { F, type Header } from '../src/wire.js';
import { FakeTarget, rdata, wack, type FakeConn } from './fake-target.js';

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Polls `cond` every 2 ms. @throws Error naming `what` after `ms` ms. */
export async function until(cond: () => boolean, what: string, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(2);
  }
}

export type Io = Extract<Header, { t: typeof F.READ | typeof F.WRITE }>;
/** A READ or WRITE frame's header. */
export const io = (f: { h: Header }) => f.h as Io;

/**
 * Per test file: unique agent names (`tag` keeps files apart), a cleanup list run after each test,
 * and `warmed`: an initiator with `lanes` lanes and 64 KiB frames, `n` bytes of local memory,
 * descriptor lists of all of it at both ends, and a fake target; a first READ (answered with
 * zeros) opens the lanes and it waits until every one is ready at both ends. Frames seen so far
 * are cleared.
 */
export function lanesRig(tag: string) {
  let seq = 0;
  const uniq = (p: string) => `${p}-${process.pid}-${tag}-${++seq}`;
  const cleanup: Array<() => Promise<void>> = [];
  afterEach(async () => {
    for (const c of cleanup.splice(0)) await c();
  });
  async function warmed(lanes: number, n: number, o: Partial<EmbeddedAgentOptions> = {}) {
    const t = await FakeTarget.listen(uniq('fake'));
    const a = await EmbeddedAgent.create({ name: uniq('init'), lanes, chunkBytes: 64 * 1024, ...o });
    cleanup.push(
      () => a.close(),
      () => t.close(),
    );
    const local = new Uint8Array(n);
    const rl = await a.registerMemory([{ bytes: local }]);
    const name = await a.loadRemoteMetadata(t.metadata());
    const l = await a.prepDescList(null, 'DRAM', [{ addr: rl.regions[0]!.addr, length: n }]);
    const r = await a.prepDescList(name, 'DRAM', [{ addr: t.region.addr, length: n }]);
    const w = await a.makeTransfer({ op: 'READ', local: l, remote: r });
    await a.post(w);
    const answered = new Set<unknown>();
    const answer = setInterval(() => {
      for (const c of t.conns) for (const f of c.frames) if (!answered.has(f) && f.h.t === F.READ) (answered.add(f), rdata(c, io(f).id, new Uint8Array(io(f).bytes)));
    }, 2);
    try {
      expect(await a.wait(w)).toBe('done');
      await until(() => t.ready.length === lanes && a.laneStats(name).length === lanes && a.laneStats(name).every((s) => s.ready), `${lanes} ready lanes`);
    } finally {
      clearInterval(answer);
    }
    for (const c of t.conns) c.frames.length = 0;
    const [first, ...extra] = t.ready;
    return { t, a, local, l, r, name, first: first!, extra: extra as FakeConn[] };
  }
  return { uniq, cleanup, warmed };
}

/** The payload an honest target answers `f` with from its memory `src` (at the fake's region). */
export const answerOf = (t: FakeTarget, src: Uint8Array, f: { h: Header }) => {
  const segs = io(f).segs;
  const parts: Uint8Array[] = [];
  for (let i = 0; i < segs.length; i += 2) parts.push(src.subarray(segs[i]! - t.region.addr, segs[i]! - t.region.addr + segs[i + 1]!));
  return Buffer.concat(parts);
};

/**
 * Answers, every 2 ms until stopped, each frame that arrives from now on on the connections
 * `on()` returns: READ from `src`, WRITE acknowledged.
 */
export function answering(t: FakeTarget, src: Uint8Array, on: () => FakeConn[]): () => void {
  const done = new Set<unknown>(t.conns.flatMap((c) => c.frames));
  const timer = setInterval(() => {
    for (const c of on()) {
      if (c.closed) continue;
      for (const f of c.frames) {
        if (done.has(f)) continue;
        done.add(f);
        if (f.h.t === F.READ) rdata(c, io(f).id, answerOf(t, src, f));
        else wack(c, io(f).id);
      }
    }
  }, 2);
  return () => clearInterval(timer);
}

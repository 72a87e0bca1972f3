/**
 * The consumer worker against scripted producers (real ZeroMQ ROUTERs registered at a real
 * bootstrap server): the metadata it sends, the first checksum payload kept and reported with the
 * finished load, a failed load reported only after every producer answered, error responses
 * without request ids, malformed responses and the deadline.
 */
import { afterEach, describe, expect, it } from 'vitest';
import * as zmq from 'zeromq';
import { BootstrapServer } from '../src/bootstrap.js';
import { parseMooncakeOptions } from '../src/config.js';
import { ProducerSessions } from '../src/channel.js';
import { XferStatusCode, decodeEnvelope, decodeTransferMetadata, encodeEnvelope, encodeTransferResponse, type TransferMetadata, type TransferResponse } from '../src/protocol.js';
import type { MooncakeLoadSpec } from '../src/scheduler.js';
import { MooncakeWorker } from '../src/worker.js';
import { caches } from './fixtures.js';

const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});


/** A scripted producer worker (side-channel protocol 2, no cluster secret): records metadata, answers when told. */
class FakeProducer {
  readonly got: Array<{ identity: Buffer; md: TransferMetadata }> = [];
  readonly sessions = new ProducerSessions(null, { maxSessions: 16, idleMs: 60_000 });
  private constructor(
    readonly sock: zmq.Router,
    readonly addr: string,
  ) {}
  static async start(): Promise<FakeProducer> {
    const sock = new zmq.Router({ linger: 0 });
    await sock.bind('tcp://127.0.0.1:*');
    const p = new FakeProducer(sock, sock.lastEndpoint!);
    void (async () => {
      try {
        for await (const [identity, msg] of sock) {
          const e = decodeEnvelope(msg);
          if (e.kind === 'hello') await sock.send([identity, encodeEnvelope(p.sessions.hello(identity.toString('hex'), e))]);
          else {
            const o = p.sessions.open(identity.toString('hex'), e);
            if ('body' in o) p.got.push({ identity, md: decodeTransferMetadata(o.body) });
          }
        }
      } catch {
        /* closed */
      }
    })();
    cleanup.push(() => sock.close());
    return p;
  }
  /** Sends a response (bytes: a raw body) in the session of the first consumer. */
  async answer(r: Partial<TransferResponse> | Uint8Array): Promise<void> {
    const bytes = r instanceof Uint8Array ? r : encodeTransferResponse({ status: XferStatusCode.FINISH, okReqs: [], errReqs: [], kvChecksums: new Map(), ...r });
    const id = this.got[0].identity;
    await this.sock.send([id, encodeEnvelope(this.sessions.seal(id.toString('hex'), bytes)!)]);
  }
}

async function rig(n: number, extra: Record<string, unknown> = {}) {
  const boot = await BootstrapServer.start({ port: 0 });
  cleanup.push(() => boot.close());
  const producers = await Promise.all(Array.from({ length: n }, () => FakeProducer.start()));
  producers.forEach((p, tp) => boot.register({ engineId: 'prod', tpRank: tp, ppRank: 0, tpSize: n, ppSize: 1, addr: p.addr }));
  const w = new MooncakeWorker('kv_consumer', { engineId: 'cons', tpRank: 0, tpSize: 1, ppRank: 0, ppSize: 1 }, parseMooncakeOptions({ transfer_timeout_ms: 5000, ...extra }));
  cleanup.push(() => w.shutdown());
  await w.registerKvCaches(caches());
  const load: MooncakeLoadSpec = { requestId: 'r1', transferId: 'x1', remoteEngineId: 'prod', bootstrapAddr: boot.address, blocks: [[3, 5, 6, 7]], firstToken: 4, numTokens: 14, consumerKey: 'c'.repeat(32) };
  w.bindConnectorMetadata({ sends: [], loads: [load], aborts: [] });
  w.startLoadKv({} as never);
  w.clearConnectorMetadata();
  await until(() => producers.every((p) => p.got.length === 1));
  return { w, producers, boot };
}

async function until(cond: () => boolean, ms = 3000): Promise<void> {
  const t0 = Date.now();
  while (!cond()) {
    if (Date.now() - t0 > ms) throw new Error('timed out');
    await new Promise((r) => setTimeout(r, 2));
  }
}

/** Polls getTransferResults until the load is reported. */
async function results(w: MooncakeWorker) {
  let res = w.getTransferResults();
  await until(() => {
    if (res.finishedRecving.size > 0) return true;
    res = w.getTransferResults();
    return res.finishedRecving.size > 0;
  });
  return res;
}

describe('consumer worker', () => {
  it('sends its metadata to every producer worker found through the bootstrap server', async () => {
    const { producers } = await rig(2);
    for (const p of producers) {
      const md = p.got[0].md;
      expect(md).toMatchObject({ engineId: 'cons', tpSize: 1, tpRank: 0, ppSize: 1, ppRank: 0, backend: 'embedded' });
      expect([...md.requests]).toEqual([['r1', { transferId: 'x1', blocks: [[3, 5, 6, 7]], firstToken: 4, numTokens: 14 }]]);
      expect(md.regions).toHaveLength(1);
      expect(md.caches.map((c) => c.name)).toEqual(['model.layers.0.self_attn.attn']);
      expect(md.agentMetadata.byteLength).toBeGreaterThan(0);
    }
  });

  it('finishes when every producer worker answered ok, keeping the first checksum payload', async () => {
    const { w, producers } = await rig(2);
    await producers[1].answer({ okReqs: ['r1'], kvChecksums: new Map([['r1', new Uint8Array([1, 1])]]) });
    await new Promise((r) => setTimeout(r, 50));
    expect(w.getTransferResults().finishedRecving.size).toBe(0); // one producer still writing
    await producers[0].answer({ okReqs: ['r1'], kvChecksums: new Map([['r1', new Uint8Array([2, 2])]]) });
    const res = await results(w);
    expect([...res.finishedRecving]).toEqual(['r1']);
    expect(res.invalidBlockIds.size).toBe(0);
    expect([...res.kvChecksums.get('r1')!]).toEqual([1, 1]);
    expect(w.stats.loadsFinished).toBe(1);
    expect(w.getTransferResults().finishedRecving.size).toBe(0); // reported once
  });

  it('a response without kv_checksums (an older producer) finishes the load with no payload', async () => {
    const { w, producers } = await rig(1);
    await producers[0].answer({ okReqs: ['r1'] });
    const res = await results(w);
    expect(res.kvChecksums.size).toBe(0);
    expect(res.invalidBlockIds.size).toBe(0);
  });

  it('an error from one producer: reported after the other answered, with the loaded blocks invalid', async () => {
    const { w, producers } = await rig(2);
    await producers[0].answer({ status: XferStatusCode.ERROR, errReqs: ['r1'], errMsg: 'boom' });
    await new Promise((r) => setTimeout(r, 50));
    expect(w.getTransferResults().finishedRecving.size).toBe(0);
    await producers[1].answer({ okReqs: ['r1'], kvChecksums: new Map([['r1', new Uint8Array([1])]]) });
    const res = await results(w);
    // Tokens [4, 14) with block size 4: positions 1..3.
    expect([...res.invalidBlockIds].sort()).toEqual([5, 6, 7]);
    expect(res.kvChecksums.size).toBe(0);
    expect(w.lastError).toMatch(/boom/);
    expect(res.loadErrors?.get('r1')).toEqual({ reason: 'producer-error', message: expect.stringMatching(/boom/) });
  });

  it('an ERROR response naming no request fails every load waiting on that producer', async () => {
    const { w, producers } = await rig(1);
    await producers[0].answer({ status: XferStatusCode.ERROR, errMsg: 'cannot decode your metadata' });
    const res = await results(w);
    expect(res.invalidBlockIds.size).toBe(3);
    expect(w.lastError).toMatch(/cannot decode your metadata/);
  });

  it('a malformed response fails the load without an exception', async () => {
    const { w, producers } = await rig(1);
    await producers[0].answer(new Uint8Array([0xa3, 0x61, 0x62]));
    const res = await results(w);
    expect(res.invalidBlockIds.size).toBe(3);
    expect(w.stats.responsesMalformed).toBe(1);
    expect(w.lastError).toMatch(/malformed transfer response/);
    expect(res.loadErrors?.get('r1')?.reason).toBe('malformed-response');
  });

  it('answers for unknown requests are ignored', async () => {
    const { w, producers } = await rig(1);
    await producers[0].answer({ status: XferStatusCode.CONTINUE, okReqs: ['other'], errReqs: ['nope'], kvChecksums: new Map([['other', new Uint8Array([1])]]) });
    await new Promise((r) => setTimeout(r, 30));
    expect(w.getTransferResults().finishedRecving.size).toBe(0);
    await producers[0].answer({ okReqs: ['r1'] });
    expect([...(await results(w)).finishedRecving]).toEqual(['r1']);
  });

  it('no answer by the deadline: the load is reported failed', async () => {
    const { w } = await rig(1, { transfer_timeout_ms: 100 });
    const res = await results(w);
    expect(res.invalidBlockIds.size).toBe(3);
    expect(w.lastError).toMatch(/timed out after 100 ms/);
    expect(res.loadErrors?.get('r1')).toEqual({ reason: 'timeout', message: expect.stringMatching(/timed out after 100 ms/) });
  });

  it('a producer that never registers: the bootstrap query fails the load at its deadline', async () => {
    const boot = await BootstrapServer.start({ port: 0 });
    cleanup.push(() => boot.close());
    const w = new MooncakeWorker('kv_consumer', { engineId: 'cons', tpRank: 0, tpSize: 1, ppRank: 0, ppSize: 1 }, parseMooncakeOptions({ bootstrap_timeout_ms: 100 }));
    cleanup.push(() => w.shutdown());
    await w.registerKvCaches(caches());
    w.bindConnectorMetadata({ sends: [], loads: [{ requestId: 'r1', transferId: 'x', remoteEngineId: 'ghost', bootstrapAddr: boot.address, blocks: [[1]], firstToken: 0, numTokens: 2 }], aborts: [] });
    w.startLoadKv({} as never);
    const res = await results(w);
    expect([...res.invalidBlockIds]).toEqual([1]);
    expect(w.lastError).toMatch(/ghost not available/);
    expect(res.loadErrors?.get('r1')?.reason).toBe('unreachable');
  });
});

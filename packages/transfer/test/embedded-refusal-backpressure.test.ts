/**
 * The target's responses to a peer that does not read them (embedded-conn.ts `InConn`
 * backpressure, `maxQueuedResponseBytes` of embedded.ts): refusals (ERR) and WRITE
 * acknowledgements count like READ answers, so a peer that sends many refused frames and never
 * reads cannot grow the target's queued bytes past the limit; once it reads, every frame is
 * answered (nothing lost).
 */
import * as net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { Packr } from 'msgpackr';
import { EmbeddedAgent, makeNonce, makeProof, type TransferAgent } from '../src/index.js';
import { encodeFrame, F, FrameReader, HANDSHAKE_CONTEXT, WIRE_VERSION } from '../src/wire.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const open: TransferAgent[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((a) => a.close()));
});

describe('embedded agent: responses to a peer that does not read', () => {
  it('refused READs and acknowledged WRITEs stop being read past maxQueuedResponseBytes; all answered once the peer reads', async () => {
    const limit = 1 << 20;
    const t = await EmbeddedAgent.create({ name: `bp-${process.pid}`, maxQueuedResponseBytes: limit });
    open.push(t);
    const mem = new Uint8Array(4096);
    const base = (await t.registerMemory([{ bytes: mem }])).regions[0]!.addr;
    const v = new Packr({ useRecords: false }).unpack(await t.getLocalMetadata()) as unknown[];
    const s = net.connect(t.address.port, t.address.host);
    s.on('error', () => {});
    const counts = { err: 0, wack: 0, other: 0 };
    let nonce: Uint8Array | null = null;
    const reader = new FrameReader({
      onHeader: (h) => {
        if (h.t === F.CHAL) nonce = Uint8Array.prototype.slice.call(h.nonce);
        else if (h.t === F.ERR) counts.err++;
        else if (h.t === F.WACK) counts.wack++;
        else if (h.t !== F.OK) counts.other++;
        return null;
      },
      onProtocolError: () => s.destroy(),
    });
    s.on('data', (c: Buffer) => reader.push(c));
    while (nonce === null) await sleep(5);
    s.pause(); // from here on the peer reads nothing
    const cn = makeNonce();
    s.write(encodeFrame([F.HELLO, WIRE_VERSION, 'raw', cn, makeProof(v[5] as Uint8Array, HANDSHAKE_CONTEXT.hello, nonce!, cn, 'raw'), null]));
    await sleep(50);
    const refused = encodeFrame([F.READ, 1, [1, 1]]); // outside the registered memory: ERR
    const write = Buffer.concat([encodeFrame([F.WRITE, 2, [base, 1]], 1), Buffer.from([7])]); // WACK
    const batch = Buffer.concat([...Array.from({ length: 5000 }, () => refused), ...Array.from({ length: 5000 }, () => write)]);
    const batches = 30;
    for (let i = 0; i < batches; i++) {
      s.write(batch);
      await sleep(10);
    }
    await sleep(200);
    const inConn = [...(t as unknown as { inConns: Set<{ socket: net.Socket }> }).inConns][0]!;
    const queued = inConn.socket.writableLength;
    console.log(`queued response bytes with the peer not reading: ${queued} (limit ${limit})`);
    expect(queued).toBeLessThan(limit + 4096); // at most one frame past the limit
    s.resume();
    const end = Date.now() + 20_000;
    while (counts.err + counts.wack < batches * 10_000 && Date.now() < end) await sleep(20);
    expect(counts).toEqual({ err: batches * 5000, wack: batches * 5000, other: 0 });
    s.destroy();
  }, 30_000);
});

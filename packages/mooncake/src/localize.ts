/**
 * Mooncake's part of localizing a KV checksum mismatch (issue 13 section 1, `docs/localize.md`):
 * the consumer scheduler half's question to the producer's workers.
 *
 * A Mooncake producer worker holds its request's blocks (for `localize_hold_ms` after every
 * consumer worker was served) and answers a `loc` envelope ({@link LocalizeRequest}, side-channel
 * protocol 4) on its ROUTER with the fine sums of its own rank (`@kvconnect/nixl-common`
 * `localizeOrderOnRank`). The consumer's scheduler half ({@link localizeAtProducer}) finds the
 * producer's workers through the bootstrap server, asks each over a short-lived DEALER of its own
 * (hello / welcome / `loc` / `resp`, sealed as every side-channel message: `channel.ts`) and merges
 * their answers (`mergeLocalizeResults`). Nothing of this runs on a load that verified.
 * @module
 */
import { randomBytes } from 'node:crypto';
import { LocalizeBusyError, type LocalizeAnswer, type LocalizeQuery } from '@kvconnect/core';
import { mergeLocalizeResults } from '@kvconnect/nixl-common';
import * as zmq from 'zeromq';
import { queryEngine } from './bootstrap.js';
import { ConsumerSession, SideChannelAuthError } from './channel.js';
import { decodeEnvelope, decodeLocalizeReply, encodeEnvelope, encodeLocalizeRequest, type SideEnvelope } from './protocol.js';

/** Where and how {@link localizeAtProducer} asks. */
export interface LocalizeTarget {
  /** The producer's bootstrap server (`host:port`) and engine id. */
  bootstrapAddr: string;
  engineId: string;
  /** The transfer whose blocks to sum (`kv_transfer_params.transfer_id`). */
  transferId: string;
  /** The asking consumer engine's key (`@kvconnect/nixl-common` `consumer-binding.ts`; the one its loads' `md` carried). */
  consumerKey: string | null;
  /** The transfer's lease capability (`kv_transfer_params.lease_capability`), or null. */
  leaseCapability: string | null;
  secret: Buffer | null;
  maxMessageBytes: number;
  /** Deadline of the bootstrap query, ms (bounded by the drill-down's own). */
  bootstrapTimeoutMs: number;
}

/**
 * Asks one producer worker (its ROUTER at `addr`) for the fine sums of `transferId` over `query`,
 * as the consumer of key `o.consumerKey`.
 * @throws LocalizeBusyError when the producer refuses for its budget (`busy`);
 *   SideChannelAuthError when it refuses otherwise (its `code`: `forbidden`, no or another lease
 *   capability, or the transfer was served to another consumer key) or fails the handshake;
 *   MooncakeProtocolError for a malformed answer; Error on the deadline (`timeoutMs`).
 */
export async function askProducerWorker(addr: string, transferId: string, query: LocalizeQuery, o: { secret: Buffer | null; maxMessageBytes: number; timeoutMs: number; consumerKey?: string | null; leaseCapability?: string | null }): Promise<LocalizeAnswer> {
  const sock = new zmq.Dealer({ linger: 0, maxMessageSize: o.maxMessageBytes, routingId: randomBytes(16).toString('hex'), receiveTimeout: Math.max(1, o.timeoutMs), sendTimeout: Math.max(1, o.timeoutMs) });
  const end = Date.now() + o.timeoutMs;
  try {
    sock.connect(addr);
    const session = new ConsumerSession(o.secret);
    const next = async (): Promise<SideEnvelope> => {
      if (Date.now() >= end) throw new Error(`producer worker ${addr}: no answer within ${o.timeoutMs} ms`);
      let frames: Buffer[];
      try {
        frames = await sock.receive();
      } catch (e) {
        throw new Error(`producer worker ${addr}: no answer within ${o.timeoutMs} ms (${e instanceof Error ? e.message : String(e)})`);
      }
      if (frames.length !== 1) throw new SideChannelAuthError('bad-message', `producer worker ${addr}: expected one frame, got ${frames.length}`);
      const e = decodeEnvelope(frames[0], o.maxMessageBytes);
      if (e.kind === 'refuse' && e.code === 'busy') throw new LocalizeBusyError(`producer worker ${addr}: ${e.message ?? 'busy'}`);
      if (e.kind === 'refuse') throw new SideChannelAuthError(e.code ?? 'bad-message', `producer worker ${addr} refused (${e.code}): ${e.message ?? ''}`);
      return e;
    };
    await sock.send(encodeEnvelope(session.hello()));
    const w = await next();
    if (w.kind !== 'welcome') throw new SideChannelAuthError('bad-message', `producer worker ${addr}: expected welcome, got ${w.kind}`);
    session.welcome(w);
    await sock.send(encodeEnvelope(session.seal(encodeLocalizeRequest({ transferId, query, consumerKey: o.consumerKey ?? null, leaseCapability: o.leaseCapability ?? null }), 'loc')));
    const r = await next();
    if (r.kind !== 'resp') throw new SideChannelAuthError('bad-message', `producer worker ${addr}: expected resp, got ${r.kind}`);
    return decodeLocalizeReply(session.open(r), o.maxMessageBytes);
  } finally {
    sock.close();
  }
}

/**
 * The producer's answer to a drill-down (`KVConnectorScheduler.localizeKvChecksums`): asks every
 * producer worker the bootstrap server lists and merges their answers. `gone` when any worker no
 * longer holds the blocks (its detail); else `held` with the workers' fine sums merged per group.
 * @throws Error when the bootstrap server or a worker cannot be reached or refuses, or an answer is malformed.
 */
export async function localizeAtProducer(t: LocalizeTarget, query: LocalizeQuery, timeoutMs: number): Promise<LocalizeAnswer> {
  const end = Date.now() + timeoutMs;
  const workers = await queryEngine(t.bootstrapAddr, t.engineId, { deadlineMs: Math.max(1, Math.min(timeoutMs, t.bootstrapTimeoutMs)), secret: t.secret });
  const addrs = [...new Set(workers.workers.flat().filter((a): a is string => a !== undefined))];
  if (addrs.length === 0) throw new Error(`producer ${t.engineId} has no registered workers`);
  const answers = await Promise.all(addrs.map((a) => askProducerWorker(a, t.transferId, query, { secret: t.secret, maxMessageBytes: t.maxMessageBytes, timeoutMs: Math.max(1, end - Date.now()), consumerKey: t.consumerKey, leaseCapability: t.leaseCapability })));
  const gone = answers.find((a) => a.status === 'gone');
  if (gone) return gone;
  return mergeLocalizeResults(
    query,
    answers.map((a) => (a.status === 'held' ? a.groups : [])),
  );
}

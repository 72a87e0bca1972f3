/**
 * NixlConnector's worker half on the handshake hooks: its handshake metadata is its own rank
 * (plain data, for the scheduler half), it reports in `finishedSending` exactly the requests the
 * scheduler's step metadata names for its worker key (once), and a producer's read-done notif
 * goes to the scheduler half in the worker metadata (the lease table lives there).
 */
import { afterEach, describe, expect, it } from 'vitest';
import type { KVTransferConfig, WorkerContext } from '@kvconnect/core';
import { encodeNotif } from '@kvconnect/nixl-common';
import { makeRank } from '../../nixl-common/test/fixtures.js';
import { NIXL_CONNECTOR, NixlPullWorker } from '../src/index.js';

const cfg: KVTransferConfig = { kv_connector: NIXL_CONNECTOR, kv_role: 'kv_producer', enable_kv_checksum: false, kv_checksum_fail_closed: false, kv_load_failure_policy: 'recompute', kv_connector_extra_config: {} };

/** Exposes the notif hook the agent poller calls. */
class Probe extends NixlPullWorker {
  notif(sender: string, bytes: Uint8Array): void {
    this.onNotif(sender, bytes);
  }
}

const open: Probe[] = [];
afterEach(async () => {
  for (const w of open.splice(0)) await w.shutdown();
});

describe('NixlPullWorker', () => {
  it('hands its rank to the scheduler half, reports finishedSending as the step metadata says, and passes read-done notifs on', async () => {
    const r = makeRank({ kind: 'gqa', layers: 2, kvHeads: 2, headDim: 8 }, 1, 2, { numBlocks: 4, blockSize: 16 });
    const ctx: WorkerContext = { engineId: 'pull-worker-0', tpRank: 1, tpSize: 2, ppRank: 0, ppSize: 1 };
    const w = new Probe(cfg, ctx);
    open.push(w);
    expect(w.getHandshakeMetadata()).toBeNull();
    await w.registerKvCaches(r.caches);
    const h = w.getHandshakeMetadata()!;
    expect(h.backend).toBe('embedded');
    expect(h.rank).toMatchObject({ tpRank: 1, tpSize: 2, ppRank: 0, agentName: w.agent!.name });
    expect(h.rank.caches).toEqual(r.info.caches);
    // Only the requests named for this worker (0:1), once.
    w.bindConnectorMetadata({ loads: [], pushes: [], finished: { '0:0': ['a'], '0:1': ['b', 'c'] }, leasesHeld: 1 });
    const res = w.getTransferResults();
    expect([...res.finishedSending].sort()).toEqual(['b', 'c']);
    expect(res.workerMeta).toBeUndefined();
    w.clearConnectorMetadata();
    w.bindConnectorMetadata({ loads: [], pushes: [] });
    expect(w.getTransferResults().finishedSending.size).toBe(0);
    // A read-done notif: reported to the scheduler half, not counted here.
    w.notif('consumer-agent', encodeNotif('p9', 2));
    expect(w.getTransferResults().workerMeta).toEqual({ readDone: [['p9', 'consumer-agent', 2]], pushDone: [] });
    expect(w.getTransferResults().workerMeta).toBeUndefined();
  });
});

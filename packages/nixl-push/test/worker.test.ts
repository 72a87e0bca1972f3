/**
 * NixlPushConnector's producer worker on the handshake hooks: a consumer rank's registration
 * arrives in the step metadata with the producer's handshake info, the worker WRITEs its part,
 * and a request the scheduler says ended is reported in `finishedSending` only once its WRITEs
 * are no longer in flight (the engine frees the blocks then); the finished part goes to the
 * scheduler half in the worker metadata (`pushDone`).
 */
import { afterEach, describe, expect, it } from 'vitest';
import type { KVTransferConfig, WorkerContext } from '@kvconnect/core';
import { createAgent, engineInfoOf, type PushRegistration } from '@kvconnect/nixl-common';
import type { TransferAgent } from '@kvconnect/transfer';
import { makeRank } from '../../nixl-common/test/fixtures.js';
import { NIXL_PUSH_CONNECTOR, NixlPushWorker } from '../src/index.js';

const open: NixlPushWorker[] = [];
afterEach(async () => {
  for (const w of open.splice(0)) await w.shutdown();
});

describe('NixlPushWorker (producer)', () => {
  it('WRITEs for a registration from the step metadata; finishedSending waits for the WRITE in flight', async () => {
    let writes = 0;
    let finishWrite!: () => void;
    const gate = new Promise<void>((r) => (finishWrite = r));
    // The real embedded agent, with the WRITE to the (absent) consumer held until the gate opens.
    const agentFactory = async (o: Parameters<typeof createAgent>[0]): Promise<TransferAgent> => {
      const a = await createAgent(o);
      const over: Partial<TransferAgent> = {
        loadRemoteMetadata: async () => 'consumer-agent',
        prepDescList: async () => ({}) as never,
        makeTransfer: async () => ({ bytes: 0, count: 0 }) as never,
        post: async () => {
          writes++;
          return 'in-progress';
        },
        wait: async () => {
          await gate;
          return 'done';
        },
        release: async () => {},
        releaseDescList: async () => {},
      };
      return new Proxy(a, { get: (t, k) => (k in over ? over[k as keyof TransferAgent] : Reflect.get(t, k, t)) }) as TransferAgent;
    };
    const cfg: KVTransferConfig = { kv_connector: NIXL_PUSH_CONNECTOR, kv_role: 'kv_producer', enable_kv_checksum: false, kv_checksum_fail_closed: false, kv_load_failure_policy: 'recompute', kv_connector_extra_config: { agent_factory: agentFactory } };
    const model = { kind: 'gqa' as const, layers: 2, kvHeads: 2, headDim: 8 };
    const mine = makeRank(model, 0, 1, { numBlocks: 4, blockSize: 16 });
    const consumer = makeRank(model, 0, 1, { numBlocks: 4, blockSize: 16 });
    const ctx: WorkerContext = { engineId: 'push-worker-0', tpRank: 0, tpSize: 1, ppRank: 0, ppSize: 1 };
    const w = new NixlPushWorker(cfg, ctx);
    open.push(w);
    await w.registerKvCaches(mine.caches);
    const producer = engineInfoOf({ engineId: ctx.engineId, mode: 'push', tpSize: 1, ppSize: 1, groups: mine.caches.groupConfigs, workers: [w.getHandshakeMetadata()!] })!;
    const reg: PushRegistration = { consumerRequestId: 'd1', producerRequestId: 'p1', consumerEngineId: 'consumer', rank: { ...consumer.info, agentName: 'consumer-agent' }, firstToken: 0, numTokens: 16, blockIds: [[1]] };
    w.bindConnectorMetadata({ loads: [], pushes: [{ requestId: 'p1', blocks: [[0]], numTokens: 16, checksums: null }], pushRegs: [reg], producer, finished: {}, leasesHeld: 1 });
    const t0 = Date.now();
    while (writes === 0 && Date.now() - t0 < 2000) await new Promise((r) => setTimeout(r, 2));
    expect(writes).toBe(1);
    expect(w.getTransferResults().finishedSending.size).toBe(0);
    w.clearConnectorMetadata();
    // The lease ended (say the consumer released it) while the WRITE is in flight: not reported yet.
    w.bindConnectorMetadata({ loads: [], pushes: [], finished: { '0:0': ['p1'] }, leasesHeld: 0 });
    const r1 = w.getTransferResults();
    expect(r1.finishedSending.size).toBe(0);
    expect(r1.workerMeta).toBeUndefined();
    finishWrite();
    await new Promise((r) => setTimeout(r, 20));
    const r2 = w.getTransferResults();
    expect([...r2.finishedSending]).toEqual(['p1']);
    expect(r2.workerMeta).toEqual({ readDone: [], pushDone: ['p1'] });
    expect(w.getTransferResults().finishedSending.size).toBe(0);
  });
});

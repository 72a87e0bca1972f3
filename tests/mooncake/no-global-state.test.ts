/**
 * MooncakeConnector keeps no process-global state (issue 10, part 1): engines of one process meet
 * only through what the contract and the config carry. Two producer engines with the same engine
 * id, started together in one process, each keep their own bootstrap server with their own
 * workers (a module-level registry by engine id would send one engine's workers to the other's
 * server); a consumer that is not told a producer's bootstrap address (no `remote_bootstrap_addr`
 * in its params or config) does not find it by engine id and prefills locally, saying why.
 */
import { describe, expect, it } from 'vitest';
import { KV_TRANSFER_PARAMS_ERROR } from '@kvconnect/core';
import { Engine } from '@kvconnect/engine';
import { MOONCAKE_CONNECTOR, type MooncakeWorker } from '@kvconnect/mooncake';
import { bootstrapAddressOfEngine } from './utils.js';

const extra = { bootstrap_port: 0, abort_timeout_ms: 5_000, transfer_timeout_ms: 5_000, bootstrap_timeout_ms: 2_000 };

const producer = (engineId: string, tpSize = 2) =>
  new Engine({ model: 'dense-gqa', tpSize, numBlocks: 64, engineId, kvTransferConfig: { kv_connector: MOONCAKE_CONNECTOR, kv_role: 'kv_producer', kv_connector_extra_config: extra } });

/** The side-channel addresses a bootstrap server lists for `engineId`. */
async function listed(addr: string, engineId: string): Promise<string[]> {
  const r = (await (await fetch(`http://${addr}/query?engine_id=${encodeURIComponent(engineId)}`)).json()) as { workers: Record<string, Record<string, string>> };
  return Object.values(r.workers).flatMap((pp) => Object.values(pp)).sort();
}

describe('MooncakeConnector: no process-global state', () => {
  it('two producer engines with one engine id in one process: each bootstrap server lists only its own workers', async () => {
    const id = `same-id-${process.pid}`;
    const a = producer(id, 2);
    const b = producer(id, 1); // constructed before a's workers registered; another TP size

    try {
      await Promise.all([a.ready, b.ready]);
      const [aa, ba] = [(await bootstrapAddressOfEngine(a))!, (await bootstrapAddressOfEngine(b))!];
      expect(aa).not.toBe(ba);
      const own = (e: Engine) => e.workers.flat().map((w) => (w.connector as MooncakeWorker).sideChannelAddr!).sort();
      expect(own(a)).toHaveLength(2);
      expect(own(b)).toHaveLength(1);
      expect(await listed(aa, id)).toEqual(own(a));
      expect(await listed(ba, id)).toEqual(own(b));
    } finally {
      await b.shutdown();
      await a.shutdown();
    }
  });

  it('a consumer not configured with the producer\'s bootstrap address does not find a producer of this process by engine id', async () => {
    const p = producer(`lonely-p-${process.pid}`);
    await p.ready;
    const c = new Engine({
      model: 'dense-gqa',
      numBlocks: 64,
      engineId: `lonely-d-${process.pid}`,
      kvTransferConfig: { kv_connector: MOONCAKE_CONNECTOR, kv_role: 'kv_consumer', kv_connector_extra_config: extra },
    });
    try {
      await c.ready;
      const r = await c.generate('who is my producer?', { maxTokens: 2, ignoreEos: true }, { do_remote_prefill: true, transfer_id: 't-lonely', remote_engine_id: p.engineId });
      expect(r.error).toBeUndefined();
      expect(r.kvTransferParams?.[KV_TRANSFER_PARAMS_ERROR]).toMatch(new RegExp(`no bootstrap address for producer ${p.engineId}`));
      expect(c.stats.loadsUsed).toBe(0);
    } finally {
      await c.shutdown();
      await p.shutdown();
    }
  });
});

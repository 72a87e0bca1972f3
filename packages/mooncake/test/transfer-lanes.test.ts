/**
 * `kv_connector_extra_config.transfer_lanes` of `MooncakeConnector` (`parseMooncakeOptions`): an
 * integer 1..8, default 1, handed to the embedded agent as its `lanes` option; a bad value, or a
 * value other than 1 with the `mooncake` backend, is a config error. `transfer_stall_timeout_ms`
 * (0..2^31-1, unset: the agent's default) is handed on as the agent's `stallTimeoutMs`.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { KVTransferConfigError } from '@kvconnect/core';
import { EmbeddedAgent } from '@kvconnect/transfer';
import { parseMooncakeOptions } from '../src/config.js';
import { createAgent } from '../src/agent.js';
import { MooncakeWorker } from '../src/worker.js';
import { caches } from './fixtures.js';

const problems = (extra: Record<string, unknown>) => {
  try {
    parseMooncakeOptions(extra, {});
  } catch (e) {
    expect(e).toBeInstanceOf(KVTransferConfigError);
    return (e as KVTransferConfigError).problems;
  }
  throw new Error('no error');
};

const cleanup: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const c of cleanup.splice(0)) await c();
});

describe('transfer_lanes (MooncakeConnector)', () => {
  it('default 1; 1..8 taken as given', () => {
    expect(parseMooncakeOptions({}, {}).transferLanes).toBe(1);
    for (const n of [1, 4, 8]) expect(parseMooncakeOptions({ transfer_lanes: n }, {}).transferLanes).toBe(n);
  });

  it('huge, non-finite and non-number values are a typed config problem too, and lose no other problem of the same config', () => {
    for (const v of [1e9, 2 ** 53, -(2 ** 31), Number.MAX_VALUE, Infinity, -Infinity, NaN, true, [4], { n: 4 }, '', 8.000001, 1e-9]) {
      const p = problems({ transfer_lanes: v });
      expect(p.map((x) => x.path), `transfer_lanes ${String(v)}`).toEqual(['kv_connector_extra_config.transfer_lanes']);
      expect(p[0]!.message).toBe('expected an integer in 1..8');
    }
    const p = problems({ transfer_lanes: 0, bogus_key: 1 });
    expect(p.map((x) => x.path).sort()).toEqual(['kv_connector_extra_config.bogus_key', 'kv_connector_extra_config.transfer_lanes']);
  });

  it('anything else is a config problem at kv_connector_extra_config.transfer_lanes', () => {
    for (const v of [0, 9, -1, 2.5, '4', null]) {
      const p = problems({ transfer_lanes: v });
      expect(p.map((x) => x.path), `transfer_lanes ${JSON.stringify(v)}`).toEqual(['kv_connector_extra_config.transfer_lanes']);
      expect(p[0]!.message).toBe('expected an integer in 1..8');
    }
    const p = problems({ backend: 'mooncake', transfer_lanes: 2 });
    expect(p.map((x) => x.path)).toEqual(['kv_connector_extra_config.transfer_lanes']);
    expect(p[0]!.message).toContain("applies to backend 'embedded' only");
  });

  for (const lanes of [undefined, 4] as const) {
    it(`the worker's embedded agent gets it as its lanes option (transfer_lanes ${String(lanes)})`, async () => {
      const w = new MooncakeWorker('kv_consumer', { engineId: `lanes-${String(lanes)}`, tpRank: 0, tpSize: 1, ppRank: 0, ppSize: 1 }, parseMooncakeOptions(lanes === undefined ? {} : { transfer_lanes: lanes }, {}));
      cleanup.push(() => w.shutdown());
      await w.registerKvCaches(caches());
      expect(w.transferAgent).toBeInstanceOf(EmbeddedAgent);
      expect((w.transferAgent as EmbeddedAgent).lanes).toBe(lanes ?? 1);
    });
  }

  it('createAgent passes lanes to the embedded agent', async () => {
    const a = await createAgent('embedded', 'lanes-create', '127.0.0.1', null, 3);
    cleanup.push(() => a.close());
    expect((a as EmbeddedAgent).lanes).toBe(3);
  });
});

describe('transfer_stall_timeout_ms (MooncakeConnector)', () => {
  it('unset by default; 0..2^31-1 taken as given; anything else, or with the mooncake backend, a config problem', () => {
    expect(parseMooncakeOptions({}, {}).transferStallTimeoutMs).toBeUndefined();
    for (const n of [0, 250, 2 ** 31 - 1]) expect(parseMooncakeOptions({ transfer_stall_timeout_ms: n }, {}).transferStallTimeoutMs).toBe(n);
    for (const v of [-1, 2.5, '500', null, 2 ** 31, Infinity, NaN]) {
      expect(problems({ transfer_stall_timeout_ms: v }).map((x) => x.path), `transfer_stall_timeout_ms ${String(v)}`).toEqual(['kv_connector_extra_config.transfer_stall_timeout_ms']);
    }
    const p = problems({ backend: 'mooncake', transfer_stall_timeout_ms: 500 });
    expect(p.map((x) => x.path)).toEqual(['kv_connector_extra_config.transfer_stall_timeout_ms']);
    expect(p[0]!.message).toContain("applies to backend 'embedded' only");
  });

  // Expected: the agent's documented default (5000 ms with lanes > 1, packages/transfer/README.md
  // "Striping") when unset, else the value given.
  for (const [extra, want] of [
    [{ transfer_lanes: 4 }, 5000],
    [{ transfer_lanes: 4, transfer_stall_timeout_ms: 750 }, 750],
  ] as const) {
    it(`the worker's embedded agent gets it as stallTimeoutMs (${JSON.stringify(extra)})`, async () => {
      const w = new MooncakeWorker('kv_consumer', { engineId: `stall-${JSON.stringify(extra)}`, tpRank: 0, tpSize: 1, ppRank: 0, ppSize: 1 }, parseMooncakeOptions(extra, {}));
      cleanup.push(() => w.shutdown());
      await w.registerKvCaches(caches());
      expect((w.transferAgent as EmbeddedAgent).stallTimeoutMs).toBe(want);
    });
  }
});

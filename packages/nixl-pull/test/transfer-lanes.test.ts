/**
 * `kv_connector_extra_config.transfer_lanes` of the NIXL connectors (`parseNixlConfig` of
 * `@kvconnect/nixl-common`): an integer 1..8, default 1, handed to the embedded agent as its
 * `lanes` option; a bad value, or a value other than 1 with the `nixl` backend, is a config error.
 * `transfer_stall_timeout_ms` (0..2^31-1, unset: the agent's default) is handed on as `stallTimeoutMs`.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { KVTransferConfigError, type KVTransferConfig, type WorkerContext } from '@kvconnect/core';
import { parseNixlConfig } from '@kvconnect/nixl-common';
import { EmbeddedAgent } from '@kvconnect/transfer';
import { makeRank } from '../../nixl-common/test/fixtures.js';
import { NIXL_CONNECTOR, NixlPullWorker } from '../src/index.js';

const cfg = (extra: Record<string, unknown>): KVTransferConfig => ({ kv_connector: NIXL_CONNECTOR, kv_role: 'kv_producer', enable_kv_checksum: false, kv_checksum_fail_closed: false, kv_load_failure_policy: 'recompute', kv_connector_extra_config: extra });
const problems = (extra: Record<string, unknown>) => {
  try {
    parseNixlConfig(cfg(extra));
  } catch (e) {
    expect(e).toBeInstanceOf(KVTransferConfigError);
    return (e as KVTransferConfigError).problems;
  }
  throw new Error('no error');
};

const open: NixlPullWorker[] = [];
afterEach(async () => {
  for (const w of open.splice(0)) await w.shutdown();
});

describe('transfer_lanes (NIXL connectors)', () => {
  it('default 1; 1..8 taken as given', () => {
    expect(parseNixlConfig(cfg({})).transferLanes).toBe(1);
    for (const n of [1, 4, 8]) expect(parseNixlConfig(cfg({ transfer_lanes: n })).transferLanes).toBe(n);
    expect(parseNixlConfig(cfg({ backend: 'nixl', transfer_lanes: 1 })).transferLanes).toBe(1);
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
    const p = problems({ backend: 'nixl', transfer_lanes: 4 });
    expect(p.map((x) => x.path)).toEqual(['kv_connector_extra_config.transfer_lanes']);
    expect(p[0]!.message).toContain("applies to backend 'embedded' only");
  });

  for (const lanes of [undefined, 4] as const) {
    it(`the worker's embedded agent gets it as its lanes option (transfer_lanes ${String(lanes)})`, async () => {
      const r = makeRank({ kind: 'gqa', layers: 2, kvHeads: 2, headDim: 8 }, 0, 1, { numBlocks: 4, blockSize: 16 });
      const ctx: WorkerContext = { engineId: `lanes-worker-${String(lanes)}`, tpRank: 0, tpSize: 1, ppRank: 0, ppSize: 1 };
      const w = new NixlPullWorker(cfg(lanes === undefined ? {} : { transfer_lanes: lanes }), ctx);
      open.push(w);
      await w.registerKvCaches(r.caches);
      expect(w.agent).toBeInstanceOf(EmbeddedAgent);
      expect((w.agent as EmbeddedAgent).lanes).toBe(lanes ?? 1);
    });
  }
});

describe('transfer_stall_timeout_ms (NIXL connectors)', () => {
  it('unset by default (the agent decides); 0..2^31-1 taken as given; anything else, or with the nixl backend, a config problem', () => {
    expect(parseNixlConfig(cfg({})).transferStallTimeoutMs).toBeUndefined();
    for (const n of [0, 250, 2 ** 31 - 1]) expect(parseNixlConfig(cfg({ transfer_stall_timeout_ms: n })).transferStallTimeoutMs).toBe(n);
    for (const v of [-1, 2.5, '500', null, 2 ** 31, Infinity, NaN]) {
      expect(problems({ transfer_stall_timeout_ms: v }).map((x) => x.path), `transfer_stall_timeout_ms ${String(v)}`).toEqual(['kv_connector_extra_config.transfer_stall_timeout_ms']);
    }
    const p = problems({ backend: 'nixl', transfer_stall_timeout_ms: 500 });
    expect(p.map((x) => x.path)).toEqual(['kv_connector_extra_config.transfer_stall_timeout_ms']);
    expect(p[0]!.message).toContain("applies to backend 'embedded' only");
  });

  // Expected values: the agent's documented default (5000 ms with lanes > 1, off with one lane,
  // packages/transfer/README.md "Striping") when the key is unset, else the value given.
  for (const [extra, want] of [
    [{ transfer_lanes: 4 }, 5000],
    [{ transfer_lanes: 1 }, 0],
    [{ transfer_lanes: 4, transfer_stall_timeout_ms: 750 }, 750],
    [{ transfer_lanes: 4, transfer_stall_timeout_ms: 0 }, 0],
  ] as const) {
    it(`the worker's embedded agent gets it as stallTimeoutMs (${JSON.stringify(extra)})`, async () => {
      const r = makeRank({ kind: 'gqa', layers: 2, kvHeads: 2, headDim: 8 }, 0, 1, { numBlocks: 4, blockSize: 16 });
      const ctx: WorkerContext = { engineId: `stall-worker-${JSON.stringify(extra)}`, tpRank: 0, tpSize: 1, ppRank: 0, ppSize: 1 };
      const w = new NixlPullWorker(cfg(extra), ctx);
      open.push(w);
      await w.registerKvCaches(r.caches);
      expect((w.agent as EmbeddedAgent).stallTimeoutMs).toBe(want);
    });
  }
});

/**
 * The fault injector: each fault kind is caught by the KV checksums the way the field cases
 * expect, and the connector loads by module path and validates its config.
 */
import { describe, expect, it } from 'vitest';
import { KVConnectorRegistry, KVTransferConfigError, parseKVTransferConfig } from '@kvconnect/core';
import { FAULT_CONNECTOR_MODULE, FAULT_INJECTING_CONNECTOR, IN_PROCESS_CONNECTOR, parseFaultConfig, parseScenario, runScenario, type RequestOutcome } from '../src/index.js';

async function one(fault: Record<string, unknown> | null, extra: Record<string, unknown> = {}): Promise<RequestOutcome> {
  const s = parseScenario({ name: 't', model: 'GQA-S', requests: [{ promptTokens: 40 }], faults: fault ? [{ requests: [0], ...fault }] : [], expect: {}, ...extra });
  const r = await runScenario(s);
  return r.runs[0].requests[0];
}

const positions = (o: RequestOutcome) => (o.verdict?.mismatches ?? []).map((m) => [m.groupId, m.positions]);

describe('fault kinds are detected by the checksums', () => {
  it('no fault: verified, output equals the single instance', async () => {
    const o = await one(null);
    expect(o.kind).toBe('verified');
    expect(o.equalsReference).toBe(true);
  });

  it('bit flip at a chosen location: mismatch at that block position only', async () => {
    const o = await one({ kind: 'bit-flip', layer: 1, head: 2, token: 20, piece: 1, bit: 9 });
    expect(positions(o)).toEqual([[0, [1]]]);
    expect(o.injected).toEqual(new Map([[0, [1]]]));
    expect(o.action).toBe('recompute');
    expect(o.equalsReference).toBe(true);
  });

  it('random bit flip: mismatch exactly where it landed', async () => {
    const o = await one({ kind: 'bit-flip', seed: 3 });
    expect(o.kind).toBe('mismatch');
    expect(positions(o)).toEqual([...o.injected]);
  });

  it('misplaced block (block i gets block i+1): mismatch at that position', async () => {
    const o = await one({ kind: 'misplaced-block', position: 1 });
    expect(positions(o)).toEqual([[0, [1]]]);
  });

  it('stale producer blocks: mismatch on every position', async () => {
    const o = await one({ kind: 'stale' });
    expect(positions(o)).toEqual([[0, [0, 1, 2]]]);
    expect(o.equalsReference).toBe(true);
  });

  it('wrong layout on one side: mismatch', async () => {
    const o = await one({ kind: 'wrong-layout' }, { consumer: { layout: 'HND' } });
    expect(positions(o)).toEqual([[0, [0, 1, 2]]]);
  });

  it('Mamba B/C sliced as if sharded: mismatch only in the state group', async () => {
    const s = parseScenario({
      name: 'm',
      model: { preset: 'HYB-S', overrides: { mamba: { nGroups: 1 } } },
      consumer: { tp: 2 },
      requests: [{ promptTokens: 40 }, { promptTokens: 40, promptSeed: 9 }],
      faults: [{ kind: 'mamba-bc-sharded', requests: [0] }],
      expect: {},
    });
    const r = (await runScenario(s)).runs[0].requests;
    expect(positions(r[0])).toEqual([[1, [0]]]);
    expect(r[1].kind).toBe('verified');
  });

  it('truncated payload: unverified malformed-payload', async () => {
    const o = await one({ kind: 'payload', mode: 'truncate' });
    expect(o.kind).toBe('unverified');
    expect(o.verdict!.unverified).toEqual([{ groupId: null, reason: 'malformed-payload' }]);
    expect(o.equalsReference).toBe(true);
  });

  it('missing payload: unverified no-payload', async () => {
    const o = await one({ kind: 'payload', mode: 'drop' });
    expect(o.verdict!.unverified).toEqual([{ groupId: null, reason: 'no-payload' }]);
  });

  it('payloads on the connector carrier (concurrent mode): truncated and dropped', async () => {
    const t = await one({ kind: 'payload', mode: 'truncate' }, { mode: 'concurrent' });
    expect(t.verdict!.unverified[0].reason).toBe('malformed-payload');
    const d = await one({ kind: 'notif', target: 'kv-checksums', mode: 'drop' }, { mode: 'concurrent' });
    expect(d.verdict!.unverified[0].reason).toBe('no-payload');
  });

  it('duplicated notifs are harmless; a delayed finishedRecving only delays', async () => {
    expect((await one({ kind: 'notif', target: 'finished-recving', mode: 'duplicate' })).kind).toBe('verified');
    expect((await one({ kind: 'notif', target: 'kv-checksums', mode: 'duplicate' }, { mode: 'concurrent' })).kind).toBe('verified');
    const d = await one({ kind: 'notif', target: 'finished-recving', mode: 'delay', steps: 3, tpRanks: [1] }, { consumer: { tp: 2 } });
    expect(d.kind).toBe('verified');
    expect(d.equalsReference).toBe(true);
  });

  it('a dropped finishedRecving never completes the load (the harness times out)', async () => {
    const o = await one({ kind: 'notif', target: 'finished-recving', mode: 'drop' }, { timeoutMs: 300 });
    expect(o.finishReason).toBe('timeout');
    expect(o.tokenIds).toEqual([]);
  });

  it('transport error: invalid blocks go to the failure policy', async () => {
    const o = await one({ kind: 'transport-error', tokens: [16, 39] }, { consumer: { policy: 'fail' } });
    expect(o.invalidBlocks).toBe(true);
    // Named truthfully: a failed transfer with its cause, not a checksum verdict.
    expect(o.kind).toBe('transfer-failed');
    expect(o.verdict).toBeNull();
    expect(o.loadError?.reason).toBe('transport-error');
    expect(o.action).toBe('fail');
    expect(o.finishReason).toBe('error');
    expect(o.tokenIds).toEqual([]);
  });

  it('rate selects a seeded share of the loads, the same every run', async () => {
    const s = parseScenario({ name: 'r', model: 'GQA-S', generate: { count: 20, promptTokens: [17, 40], maxTokens: 2 }, concurrency: 4, faults: [{ kind: 'bit-flip', rate: 0.3, seed: 5 }], runs: [{}, {}], expect: { mismatchesAtInjections: true } });
    const r = await runScenario(s);
    const hit = r.runs.map((run) => run.requests.filter((q) => q.faultKinds.length > 0).map((q) => q.index));
    expect(hit[0].length).toBeGreaterThan(1);
    expect(hit[0].length).toBeLessThan(15);
    expect(hit[1]).toEqual(hit[0]);
    expect(r.expectations.every((x) => x.ok)).toBe(true);
  });
});

describe('FaultInjectingConnector config and loading', () => {
  it('loads by module path into a fresh registry and wraps the inner connector', async () => {
    const registry = new KVConnectorRegistry();
    const cfg = parseKVTransferConfig({
      kv_connector: FAULT_INJECTING_CONNECTOR,
      kv_connector_module_path: FAULT_CONNECTOR_MODULE,
      kv_role: 'kv_consumer',
      kv_connector_extra_config: { inner: { kv_connector: IN_PROCESS_CONNECTOR }, faults: [] },
    });
    await registry.prepare(cfg);
    expect(registry.has(FAULT_INJECTING_CONNECTOR)).toBe(true);
    expect(registry.has(IN_PROCESS_CONNECTOR)).toBe(true);
    const s = registry.createScheduler(cfg, { engineId: 'e', tpSize: 1, ppSize: 1, groupConfigs: [] });
    expect(s.kvChecksumCarrier({ requestId: 'x', promptTokenIds: [1], numComputedTokens: 0, numTokens: 1, kvTransferParams: { do_remote_prefill: true } })).toBe('kv_transfer_params');
  });

  it('rejects a bad extra config with paths', () => {
    const bad = parseKVTransferConfig({ kv_connector: FAULT_INJECTING_CONNECTOR, kv_role: 'kv_consumer', kv_connector_extra_config: { faults: [{ kind: 'bit-flip', bit: 99 }], x: 1 } });
    try {
      parseFaultConfig(bad);
      expect.unreachable();
    } catch (e) {
      expect(e).toBeInstanceOf(KVTransferConfigError);
      const paths = (e as KVTransferConfigError).problems.map((p) => p.path);
      expect(paths).toEqual(expect.arrayContaining(['kv_connector_extra_config.x', 'kv_connector_extra_config.inner', 'kv_connector_extra_config.faults[0].bit']));
    }
  });
});

/**
 * NixlConnector's scheduler half: registration on import, carrier, the producer's params and
 * lease, and the consumer's handling of params (malformed params prefill locally; a full local
 * hit releases the producer's blocks).
 */
import { afterEach, describe, expect, it } from 'vitest';
import { KVConnectorRegistry, defaultRegistry, type ConnectorRequest, type KVTransferConfig } from '@kvconnect/core';
import { NIXL_CONNECTOR, NixlPullScheduler, nixlConnectorFactory, register } from '../src/index.js';

const cfg = (role: KVTransferConfig['kv_role']): KVTransferConfig => ({ kv_connector: NIXL_CONNECTOR, kv_role: role, enable_kv_checksum: true, kv_checksum_fail_closed: true, kv_load_failure_policy: 'recompute', kv_connector_extra_config: { lease_ms: 60_000 } });
const groups = [{ groupId: 0, kind: 'full-attention' as const, blockSize: 16, layerNames: ['model.layers.0.attn'] }];
const req = (id: string, params?: Record<string, unknown>, prompt = 40): ConnectorRequest => ({ requestId: id, promptTokenIds: Array(prompt).fill(7), numComputedTokens: prompt, numTokens: prompt + 1, kvTransferParams: params });
let n = 0;
const open: NixlPullScheduler[] = [];
afterEach(async () => {
  for (const s of open.splice(0)) await s.shutdown();
});
function sched(role: KVTransferConfig['kv_role']): NixlPullScheduler {
  const s = new NixlPullScheduler(cfg(role), { engineId: `pull-unit-${n++}`, tpSize: 2, ppSize: 1, groupConfigs: groups });
  open.push(s);
  return s;
}

describe('NixlConnector', () => {
  it('registers as NixlConnector in the default registry on import; register() is idempotent', () => {
    expect(defaultRegistry.get(NIXL_CONNECTOR)).toBe(nixlConnectorFactory);
    const r = new KVConnectorRegistry();
    register(r);
    register(r);
    expect(r.names()).toContain(NIXL_CONNECTOR);
  });

  it('carries checksums in kv_transfer_params for P/D requests only', () => {
    const s = sched('kv_both');
    expect(s.kvChecksumCarrier(req('a', { do_remote_decode: true }))).toBe('kv_transfer_params');
    expect(s.kvChecksumCarrier(req('a', { do_remote_prefill: true }))).toBe('kv_transfer_params');
    expect(s.kvChecksumCarrier(req('a'))).toBeNull();
  });

  it('producer: a normal finish returns the params and holds the blocks under a lease; abort returns none', async () => {
    const s = sched('kv_producer');
    const addr = await s.channel!.listen();
    const t0 = Date.now();
    const r = s.requestFinished(req('p1', { do_remote_decode: true }), [[4, 5, 6]], 'length');
    expect(r.delayFree).toBe(true);
    expect(r.kvTransferParams).toMatchObject({ remote_engine_id: s.ctx.engineId, remote_request_id: 'p1', remote_block_ids: [[4, 5, 6]], remote_host: addr.host, remote_port: addr.port, remote_tp_size: 2 });
    expect(r.kvTransferParams!.lease_expiry as number).toBeGreaterThanOrEqual(t0 + 60_000);
    expect(s.channel!.leases.isHeld('p1')).toBe(true);
    expect(s.requestFinished(req('p2', { do_remote_decode: true }), [[1]], 'abort')).toEqual({ delayFree: false });
    expect(s.requestFinished(req('p3'), [[1]], 'stop')).toEqual({ delayFree: false });
    expect(s.channel!.leases.isHeld('p2')).toBe(false);
  });

  it('consumer: loads only past the local hit; malformed params prefill locally', async () => {
    const producer = sched('kv_producer');
    const addr = await producer.channel!.listen();
    const p = producer.requestFinished(req('p1', { do_remote_decode: true }), [[4, 5, 6]], 'length').kvTransferParams!;
    const s = sched('kv_consumer');
    const r = req('d1', { ...p, do_remote_prefill: true });
    expect(s.getNumNewMatchedTokens(r, 16)).toEqual({ count: 24, loadAsync: true });
    s.updateStateAfterAlloc(r, [[9, 10, 11]], 24);
    const meta = s.buildConnectorMeta();
    expect(meta.loads).toEqual([expect.objectContaining({ requestId: 'd1', remoteRequestId: 'p1', localBlocks: [[9, 10, 11]], remoteBlockIds: [[4, 5, 6]], firstToken: 16, numTokens: 40, remotePort: addr.port })]);
    expect(s.buildConnectorMeta().loads).toEqual([]);
    for (const bad of [{ ...p, remote_port: 'x' }, { ...p, remote_block_ids: [[1.5]] }, { ...p, remote_engine_id: undefined }]) {
      expect(s.getNumNewMatchedTokens(req('d2', { ...bad, do_remote_prefill: true }), 0)).toEqual({ count: 0, loadAsync: false });
    }
    // Every token local: nothing to load, the producer releases its blocks.
    expect(s.getNumNewMatchedTokens(req('d3', { ...p, do_remote_prefill: true }), 40)).toEqual({ count: 0, loadAsync: false });
    const t0 = Date.now();
    while (producer.channel!.leases.stateOf('p1') === 'held' && Date.now() - t0 < 2000) await new Promise((x) => setTimeout(x, 5));
    expect(producer.channel!.leases.stateOf('p1')).toBe('released');
  });
});

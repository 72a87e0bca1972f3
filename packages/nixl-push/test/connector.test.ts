/**
 * NixlPushConnector's scheduler half: registration on import, carrier `connector`, and the
 * checksums of a finished request riding to the workers with its blocks in the next step's
 * metadata (dropped for a request with nothing to push).
 */
import { afterEach, describe, expect, it } from 'vitest';
import { defaultRegistry, type ConnectorRequest, type KVTransferConfig } from '@kvconnect/core';
import { NIXL_PUSH_CONNECTOR, NixlPushScheduler, nixlPushConnectorFactory } from '../src/index.js';

const cfg: KVTransferConfig = { kv_connector: NIXL_PUSH_CONNECTOR, kv_role: 'kv_producer', enable_kv_checksum: true, kv_checksum_fail_closed: false, kv_load_failure_policy: 'recompute', kv_connector_extra_config: {} };
const req = (id: string, params?: Record<string, unknown>): ConnectorRequest => ({ requestId: id, promptTokenIds: [1, 2, 3], numComputedTokens: 3, numTokens: 4, kvTransferParams: params });
const open: NixlPushScheduler[] = [];
afterEach(async () => {
  for (const s of open.splice(0)) await s.shutdown();
});

describe('NixlPushConnector', () => {
  it('registers as NixlPushConnector in the default registry on import', () => {
    expect(defaultRegistry.get(NIXL_PUSH_CONNECTOR)).toBe(nixlPushConnectorFactory);
  });

  it('carrier connector; checksums ship with the finished blocks; none for an aborted request', async () => {
    const s = new NixlPushScheduler(cfg, { engineId: 'push-unit-0', tpSize: 1, ppSize: 1, groupConfigs: [{ groupId: 0, kind: 'full-attention', blockSize: 16, layerNames: ['a.0.b'] }] });
    open.push(s);
    await s.channel!.listen();
    expect(s.kvChecksumCarrier(req('x', { do_remote_decode: true }))).toBe('connector');
    expect(s.kvChecksumCarrier(req('x'))).toBeNull();
    const a = req('a', { do_remote_decode: true });
    expect(s.requestFinished(a, [[2]], 'stop').delayFree).toBe(true);
    s.sendKvChecksums(a, new Uint8Array([9, 9]));
    const b = req('b', { do_remote_decode: true });
    expect(s.requestFinished(b, [[3]], 'abort').delayFree).toBe(false);
    s.sendKvChecksums(b, new Uint8Array([1]));
    const meta = s.buildConnectorMeta();
    expect(meta.pushes).toEqual([{ requestId: 'a', blocks: [[2]], numTokens: 3, checksums: new Uint8Array([9, 9]) }]);
    expect(s.buildConnectorMeta().pushes).toEqual([]);
    expect(s.pendingCounts()).toEqual({ asked: 0, loading: 0, pushes: 0 });
  });
});

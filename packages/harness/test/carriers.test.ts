/**
 * Every connector factory declares its KV checksum carriers (`kvChecksumCarriers`), and its
 * scheduler half answers `kvChecksumCarrier` only with a declared carrier (or null) for producer,
 * consumer and plain requests; the fault injector declares its inner connector's carriers.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { KVConnectorRegistry, parseKVTransferConfig, type ConnectorRequest, type KVConnectorFactory, type KVConnectorScheduler } from '@kvconnect/core';
import { createInProcessConnectorFactory, InProcessBus } from '@kvconnect/engine/testing';
import { mooncakeConnectorFactory } from '@kvconnect/mooncake';
import { nixlConnectorFactory } from '@kvconnect/nixl-pull';
import { nixlPushConnectorFactory } from '@kvconnect/nixl-push';
import { FAULT_INJECTING_CONNECTOR, registerFaultInjectingConnector } from '../src/index.js';

const ctx = { engineId: 'E', tpSize: 1, ppSize: 1, groupConfigs: [{ groupId: 0, kind: 'full-attention' as const, blockSize: 16, layerNames: ['model.layers.0.attn'] }] };
const requests: ConnectorRequest[] = [
  { requestId: 'p', promptTokenIds: [1], numComputedTokens: 0, numTokens: 1, kvTransferParams: { do_remote_decode: true, transfer_id: 't' } },
  { requestId: 'p2', promptTokenIds: [1], numComputedTokens: 0, numTokens: 1, kvTransferParams: { do_remote_decode: true } },
  { requestId: 'd', promptTokenIds: [1], numComputedTokens: 0, numTokens: 1, kvTransferParams: { do_remote_prefill: true, remote_engine_id: 'P', remote_request_id: 'x', transfer_id: 't' } },
  { requestId: 'n', promptTokenIds: [1], numComputedTokens: 0, numTokens: 1 },
];

const open: KVConnectorScheduler[] = [];
afterEach(async () => {
  for (const s of open.splice(0)) await s.shutdown?.();
});

describe('declared KV checksum carriers of the connectors', () => {
  const factories: Array<[KVConnectorFactory, string[]]> = [
    [nixlConnectorFactory, ['kv_transfer_params']],
    [nixlPushConnectorFactory, ['connector']],
    [mooncakeConnectorFactory, ['connector']],
    [createInProcessConnectorFactory({ bus: new InProcessBus() }), ['connector', 'kv_transfer_params']],
  ];
  for (const [f, expected] of factories) {
    for (const role of ['kv_producer', 'kv_consumer'] as const) {
      it(`${f.name} (${role}) declares ${expected.join(', ')} and its scheduler uses only those`, () => {
        const cfg = parseKVTransferConfig({ kv_connector: f.name, kv_role: role, enable_kv_checksum: true });
        const declared = f.kvChecksumCarriers?.(cfg);
        expect(declared && [...declared].sort()).toEqual([...expected].sort());
        const s = f.createScheduler(cfg, ctx);
        open.push(s);
        for (const r of requests) {
          const c = s.kvChecksumCarrier(r);
          if (c !== null) expect(declared).toContain(c);
        }
      });
    }
  }

  it('the fault injector declares what its inner connector declares', () => {
    const r = new KVConnectorRegistry();
    r.register(nixlPushConnectorFactory);
    registerFaultInjectingConnector(r);
    const cfg = parseKVTransferConfig({ kv_connector: FAULT_INJECTING_CONNECTOR, kv_role: 'kv_consumer', enable_kv_checksum: true, kv_connector_extra_config: { inner: { kv_connector: nixlPushConnectorFactory.name }, faults: [] } });
    expect(r.get(FAULT_INJECTING_CONNECTOR).kvChecksumCarriers?.(cfg)).toEqual(['connector']);
  });
});

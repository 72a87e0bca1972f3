/**
 * Declared KV checksum carriers (SPEC 7): a factory's `kvChecksumCarriers(config)` decides whether
 * the checksum scheduler can run (the connector is not probed); only without a declaration does the
 * scheduler probe `kvChecksumCarrier`. MultiConnector declares the union of its children, or
 * nothing when a child declares nothing.
 */
import { describe, expect, it } from 'vitest';
import type { KVChecksumCarrier, KVChecksumCarrierKind, KVConnectorFactory } from '../src/connector.js';
import { parseKVTransferConfig } from '../src/config.js';
import { KVConnectorRegistry } from '../src/registry.js';
import { KVChecksumCarrierError, KVChecksumScheduler } from '../src/checksum-scheduler.js';
import { KVChecksumObservability } from '../src/observability.js';
import { FakeConnector, groupConfigs } from './fake-pd.js';

/** A FakeConnector that counts `kvChecksumCarrier` calls (the probe). */
class Counting extends FakeConnector {
  probes = 0;
  override kvChecksumCarrier(): KVChecksumCarrier {
    this.probes++;
    return this.carrier;
  }
}

const config = (failClosed: boolean) => parseKVTransferConfig({ kv_connector: 'X', kv_role: 'kv_consumer', enable_kv_checksum: true, kv_checksum_fail_closed: failClosed });
const make = (connector: FakeConnector, carriers: readonly KVChecksumCarrierKind[] | undefined, failClosed = true) =>
  new KVChecksumScheduler({ config: config(failClosed), connector, tpSize: 1, ppSize: 1, groupConfigs: groupConfigs(16), observability: new KVChecksumObservability({ level: 'silent' }), carriers });

describe('declared KV checksum carriers', () => {
  it('a declaration decides; the connector is not probed', () => {
    const probeSaysNone = new Counting(null);
    expect(make(probeSaysNone, ['connector']).enabled).toBe(true);
    expect(probeSaysNone.probes).toBe(0);
    const probeSaysSome = new Counting('connector');
    expect(() => make(probeSaysSome, [])).toThrow(KVChecksumCarrierError);
    expect(make(probeSaysSome, [], false).enabled).toBe(false);
    expect(probeSaysSome.probes).toBe(0);
  });

  it('without a declaration (a third-party factory) the probe requests decide', () => {
    const some = new Counting('kv_transfer_params');
    expect(make(some, undefined).enabled).toBe(true);
    expect(some.probes).toBeGreaterThan(0);
    expect(() => make(new Counting(null), undefined)).toThrow(KVChecksumCarrierError);
  });

  it('MultiConnector declares the union of its children, or nothing when a child declares nothing', () => {
    const r = new KVConnectorRegistry();
    const f = (name: string, carriers?: readonly KVChecksumCarrierKind[]): KVConnectorFactory => ({
      name,
      createScheduler: () => new FakeConnector(null),
      createWorker: () => {
        throw new Error('unused');
      },
      ...(carriers ? { kvChecksumCarriers: () => carriers } : {}),
    });
    r.register(f('P', ['kv_transfer_params']));
    r.register(f('C', ['connector']));
    r.register(f('N', []));
    r.register(f('U'));
    const multi = (...names: string[]) =>
      r.get('MultiConnector').kvChecksumCarriers?.(parseKVTransferConfig({ kv_connector: 'MultiConnector', kv_role: 'kv_both', kv_connector_extra_config: { connectors: names.map((kv_connector) => ({ kv_connector })) } }));
    expect(new Set(multi('P', 'C', 'N'))).toEqual(new Set(['kv_transfer_params', 'connector']));
    expect(multi('N', 'N')).toEqual([]);
    expect(multi('P', 'U')).toBeUndefined();
  });
});

/**
 * The factory and registry: importing the package registers `MooncakeConnector`; the extra
 * config is validated; `backend: 'mooncake'` without a Mooncake agent fails with a clear error.
 */
import { describe, expect, it } from 'vitest';
import { KVTransferConfigError, defaultRegistry, parseKVTransferConfig } from '@kvconnect/core';
import { ClusterSecretError } from '@kvconnect/transfer';
import { MOONCAKE_CONNECTOR, MooncakeUnavailableError, createAgent, mooncakeConnectorFactory, mooncakeUnavailableReason, parseMooncakeOptions } from '../src/index.js';

const cfg = (extra: Record<string, unknown>) => parseKVTransferConfig({ kv_connector: MOONCAKE_CONNECTOR, kv_role: 'kv_consumer', kv_connector_extra_config: extra });
const ctx = { engineId: 'e', tpSize: 1, ppSize: 1, groupConfigs: [] };

describe('MooncakeConnector registration and config', () => {
  it('importing the package registers MooncakeConnector in the default registry', () => {
    expect(defaultRegistry.has(MOONCAKE_CONNECTOR)).toBe(true);
    expect(defaultRegistry.get(MOONCAKE_CONNECTOR)).toBe(mooncakeConnectorFactory);
  });

  it('defaults', () => {
    expect(parseMooncakeOptions({}, {})).toEqual({
      backend: 'embedded',
      bootstrapHost: '127.0.0.1',
      bootstrapPort: 8998,
      bootstrapAddr: undefined,
      remoteBootstrapAddr: undefined,
      host: '127.0.0.1',
      transferLanes: 1,
      abortTimeoutMs: 480_000,
      transferTimeoutMs: 540_000,
      bootstrapTimeoutMs: 30_000,
      maxMessageBytes: 64 * 1024 * 1024,
      clusterSecret: null,
      maxWaiters: 65_536,
      maxWaitersPerPeer: 16_384,
      maxPendingBytes: 256 * 1024 * 1024,
      maxPendingBytesPerPeer: 64 * 1024 * 1024,
      maxSessions: 4096,
      sessionIdleMs: 600_000,
      localizeHoldMs: 0,
      localizeMaxInflightPerPeer: 4,
      localizeRangesPerSecondPerPeer: 65_536,
    });
  });

  it('a non-loopback bootstrap_host without a cluster secret: createScheduler refuses (ClusterSecretError)', () => {
    const prod = parseKVTransferConfig({ kv_connector: MOONCAKE_CONNECTOR, kv_role: 'kv_producer', kv_connector_extra_config: { bootstrap_host: '0.0.0.0', bootstrap_port: 0 } });
    const saved = process.env.KVCONNECT_CLUSTER_SECRET;
    delete process.env.KVCONNECT_CLUSTER_SECRET;
    try {
      expect(() => mooncakeConnectorFactory.createScheduler(prod, ctx)).toThrow(ClusterSecretError);
    } finally {
      if (saved !== undefined) process.env.KVCONNECT_CLUSTER_SECRET = saved;
    }
  });

  it('the cluster secret: the config key, else KVCONNECT_CLUSTER_SECRET; a short one is a config problem', () => {
    expect(parseMooncakeOptions({ cluster_secret: 'config-secret-0123' }, { KVCONNECT_CLUSTER_SECRET: 'env-secret-0123456' }).clusterSecret?.toString()).toBe('config-secret-0123');
    expect(parseMooncakeOptions({}, { KVCONNECT_CLUSTER_SECRET: 'env-secret-0123456' }).clusterSecret?.toString()).toBe('env-secret-0123456');
    try {
      parseMooncakeOptions({ cluster_secret: 'short' }, {});
      expect.unreachable();
    } catch (e) {
      expect(e).toBeInstanceOf(KVTransferConfigError);
      expect((e as KVTransferConfigError).problems.map((p) => p.path)).toEqual(['kv_connector_extra_config.cluster_secret']);
    }
  });

  it('rejects unknown keys and bad values, listing every problem', () => {
    try {
      parseMooncakeOptions({ backend: 'rdma', bootstrap_port: 70000, abort_timeout_ms: -1, typo: 1 });
      expect.unreachable();
    } catch (e) {
      expect(e).toBeInstanceOf(KVTransferConfigError);
      expect((e as KVTransferConfigError).problems.map((p) => p.path).sort()).toEqual([
        'kv_connector_extra_config.abort_timeout_ms',
        'kv_connector_extra_config.backend',
        'kv_connector_extra_config.bootstrap_port',
        'kv_connector_extra_config.typo',
      ]);
    }
    expect(() => mooncakeConnectorFactory.createScheduler(cfg({ typo: 1 }), ctx)).toThrow(KVTransferConfigError);
  });

  it('states each problem as the other configs do (one schema library: zod through @kvconnect/core)', () => {
    try {
      parseMooncakeOptions({ backend: 'rdma', bootstrap_port: 70000, bootstrap_host: '', localize_hold_ms: 1.5, typo: 1 }, {});
      expect.unreachable();
    } catch (e) {
      const got = Object.fromEntries((e as KVTransferConfigError).problems.map((p) => [p.path.replace('kv_connector_extra_config.', ''), p.message]));
      expect(got.backend).toBe('expected "embedded" or "mooncake", got "rdma"');
      expect(got.bootstrap_port).toBe('expected an integer in 0..65535');
      expect(got.bootstrap_host).toBe('expected a non-empty string');
      expect(got.localize_hold_ms).toBe('expected an integer in 0..3600000');
      expect(got.typo).toMatch(/^unknown key \(known: backend, bootstrap_host, bootstrap_port, /);
    }
  });

  const hasAgent = mooncakeUnavailableReason() === null;
  it.skipIf(hasAgent)(`backend 'mooncake' without a Mooncake agent: a clear error from both halves and from createAgent${hasAgent ? ' (skipped: this build has the Mooncake agent)' : ''}`, async () => {
    expect(() => mooncakeConnectorFactory.createScheduler(cfg({ backend: 'mooncake' }), ctx)).toThrow(/^Mooncake Transfer Engine not available: /);
    expect(() => mooncakeConnectorFactory.createWorker(cfg({ backend: 'mooncake' }), { engineId: 'e', tpRank: 0, tpSize: 1, ppRank: 0, ppSize: 1 })).toThrow(MooncakeUnavailableError);
    await expect(createAgent('mooncake', 'a', '127.0.0.1')).rejects.toThrow(/^Mooncake Transfer Engine not available: transfer engine mooncake: libtransfer_engine.so cannot be loaded.*; install the Mooncake Transfer Engine .*set MOONCAKE_PREFIX/);
  });

  it('the embedded backend makes an embedded agent', async () => {
    const a = await createAgent('embedded', 'emb-test', '127.0.0.1');
    expect(a.backend).toBe('embedded');
    await a.close();
  });
});

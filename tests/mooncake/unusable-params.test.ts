/**
 * A Mooncake consumer given `kv_transfer_params` it cannot use says so (issue 12, part 2): the
 * params it returns carry `kv_transfer_params_error`, and the engine's registry counts it
 * (`kvconnect_kv_transfer_params_unusable_total{connector="MooncakeConnector"}`); the request
 * prefills locally. Usable params (the proxy's concurrent mode) say nothing.
 */
import { describe, expect, it } from 'vitest';
import { KV_TRANSFER_PARAMS_ERROR, UNUSABLE_PARAMS_METRIC } from '@kvconnect/core';
import { metricValue } from '../support.js';
import { makeMooncakePD } from './utils.js';

describe('Mooncake consumer: unusable kv_transfer_params', () => {
  it('NIXL-shaped params (no transfer_id) and a producer params without do_remote_prefill are said and counted; a normal P/D request is not', async () => {
    const pd = await makeMooncakePD({ model: 'dense-gqa' });
    try {
      const reg = pd.consumer.observability!.registry;
      const count = () => metricValue(reg, UNUSABLE_PARAMS_METRIC, { connector: 'MooncakeConnector' });
      const ok = await pd.proxy.generate('a normal Mooncake P/D request', { maxTokens: 3, ignoreEos: true });
      expect(ok.error).toBeUndefined();
      expect(ok.kvTransferParams?.[KV_TRANSFER_PARAMS_ERROR]).toBeUndefined();
      expect(await count()).toBe(0);

      const nixl = { do_remote_prefill: true, do_remote_decode: false, remote_engine_id: pd.producer.engineId, remote_request_id: 'r', remote_block_ids: [[0]], remote_host: '127.0.0.1', remote_port: 1, tp_size: 1 };
      const a = await pd.consumer.generate('nixl shaped params', { maxTokens: 2, ignoreEos: true }, nixl);
      expect(a.kvTransferParams?.[KV_TRANSFER_PARAMS_ERROR]).toMatch(/transfer_id missing/);
      expect(await count()).toBe(1);

      const noPrefillFlag = { transfer_id: 't-1', remote_engine_id: pd.producer.engineId };
      const b = await pd.consumer.generate('no do_remote_prefill', { maxTokens: 2, ignoreEos: true }, noPrefillFlag);
      expect(b.kvTransferParams?.[KV_TRANSFER_PARAMS_ERROR]).toMatch(/lack do_remote_prefill: true/);
      expect(await count()).toBe(2);
      expect(a.finishReason).toBe('length');
      expect(pd.consumer.stats.loadsUsed).toBe(1); // only the normal request loaded
    } finally {
      await pd.shutdown();
    }
  });
});

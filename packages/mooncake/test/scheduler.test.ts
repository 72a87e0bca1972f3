/**
 * The scheduler half: the producer ships a finished request's blocks with its checksum payload
 * in the next metadata, drops the payload of a request with nothing to send, ships aborts, keeps
 * blocks (delayFree) and returns no params; the consumer loads every token past the local hit
 * asynchronously from the bootstrap address the params or the config give (never from another
 * engine of the process: no module-level registry); the
 * checksum carrier is `connector` for both directions.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { parseKVTransferConfig, type ConnectorRequest } from '@kvconnect/core';
import { parseMooncakeOptions } from '../src/config.js';
import { MooncakeScheduler, type MooncakeConnectorMetadata } from '../src/scheduler.js';

const made: MooncakeScheduler[] = [];
afterEach(async () => {
  for (const s of made.splice(0)) await s.shutdown();
});

let n = 0;
function sched(role: 'kv_producer' | 'kv_consumer', extra: Record<string, unknown> = {}, engineId = `e${n++}`): MooncakeScheduler {
  const config = parseKVTransferConfig({ kv_connector: 'MooncakeConnector', kv_role: role, kv_connector_extra_config: { bootstrap_port: 0, ...extra } });
  const s = new MooncakeScheduler(config, { engineId, tpSize: 1, ppSize: 1, groupConfigs: [] }, parseMooncakeOptions(config.kv_connector_extra_config));
  made.push(s);
  return s;
}

const req = (id: string, params: Record<string, unknown> | undefined, prompt = 10, computed = 10): ConnectorRequest => ({
  requestId: id,
  promptTokenIds: Array.from({ length: prompt }, (_, i) => i),
  numComputedTokens: computed,
  numTokens: prompt + 1,
  kvTransferParams: params,
});

describe('producer', () => {
  it('ships the blocks and the checksum payload of a finished request in the next metadata; keeps the blocks', () => {
    const s = sched('kv_producer');
    const r = req('p1', { do_remote_decode: true, transfer_id: 'x1' });
    const fin = s.requestFinished(r, [[4, 5], [9]], 'length');
    expect(fin).toEqual({ delayFree: true });
    const payload = new Uint8Array([1, 2, 3]);
    s.sendKvChecksums(r, payload);
    payload[0] = 99; // the connector keeps its own copy
    const m = s.buildConnectorMeta() as MooncakeConnectorMetadata;
    expect(m.sends).toEqual([{ requestId: 'p1', transferId: 'x1', blocks: [[4, 5], [9]], numTokens: 10, kvChecksums: new Uint8Array([1, 2, 3]) }]);
    expect(m.loads).toEqual([]);
    expect(s.buildConnectorMeta()).toBeNull();
  });

  it('an aborted request ships an abort, keeps no blocks, and its payload is dropped', () => {
    const s = sched('kv_producer');
    const r = req('p2', { do_remote_decode: true, transfer_id: 'x2' });
    expect(s.requestFinished(r, [[4]], 'abort')).toEqual({ delayFree: false });
    s.sendKvChecksums(r, new Uint8Array([1]));
    expect(s.buildConnectorMeta()).toEqual({ sends: [], loads: [], aborts: ['x2'] });
  });

  it('a request without do_remote_decode or transfer id is not the connector\'s', () => {
    const s = sched('kv_producer');
    expect(s.requestFinished(req('a', undefined), [[1]], 'stop')).toEqual({ delayFree: false });
    expect(s.requestFinished(req('b', { do_remote_decode: true }), [[1]], 'stop')).toEqual({ delayFree: false });
    expect(s.buildConnectorMeta()).toBeNull();
  });

  it('carrier: connector for producer requests with a transfer id and for loads; none otherwise', () => {
    const s = sched('kv_producer');
    expect(s.kvChecksumCarrier(req('a', { do_remote_decode: true, transfer_id: 't' }))).toBe('connector');
    expect(s.kvChecksumCarrier(req('a', { do_remote_prefill: true }))).toBe('connector');
    expect(s.kvChecksumCarrier(req('a', { do_remote_decode: true }))).toBeNull();
    expect(s.kvChecksumCarrier(req('a', undefined))).toBeNull();
  });

  it('starts the bootstrap server; the half tells its address; shutdown closes it', async () => {
    const s = sched('kv_producer', {}, 'boot-engine');
    const srv = await s.bootstrapServer()!;
    expect(await s.bootstrapAddress()).toBe(srv.address);
    expect(srv.address).toMatch(/^127\.0\.0\.1:\d+$/);
    expect((await fetch(`http://${srv.address}/query`)).status).toBe(200);
    await s.shutdown();
    await expect(fetch(`http://${srv.address}/query`)).rejects.toThrow();
  });

  it('with bootstrap_addr it starts no server', async () => {
    expect(sched('kv_producer', { bootstrap_addr: '127.0.0.1:1' }).bootstrapServer()).toBeNull();
    expect(sched('kv_consumer').bootstrapServer()).toBeNull();
    expect(await sched('kv_consumer').bootstrapAddress()).toBeNull();
  });

  it('two producers with the same engine id in one process keep their own servers and workers', async () => {
    const a = sched('kv_producer', {}, 'same-id');
    const b = sched('kv_producer', {}, 'same-id');
    const [sa, sb] = [await a.bootstrapServer()!, await b.bootstrapServer()!];
    expect(sa.address).not.toBe(sb.address);
    const reg = (owner: string, addr: string) => ({ engine_id: 'same-id', tp_rank: 0, pp_rank: 0, tp_size: 1, pp_size: 1, addr, owner });
    await a.setXferHandshakeMetadata(new Map([['0:0', reg('owner-a', 'tcp://127.0.0.1:1001')]]));
    await b.setXferHandshakeMetadata(new Map([['0:0', reg('owner-b', 'tcp://127.0.0.1:1002')]]));
    const q = async (addr: string) => JSON.stringify(await (await fetch(`http://${addr}/query?engine_id=same-id`)).json());
    expect(await q(sa.address)).toContain('tcp://127.0.0.1:1001');
    expect(await q(sa.address)).not.toContain('tcp://127.0.0.1:1002');
    expect(await q(sb.address)).toContain('tcp://127.0.0.1:1002');
    expect(await q(sb.address)).not.toContain('tcp://127.0.0.1:1001');
  });
});

describe('consumer', () => {
  const params = { do_remote_prefill: true, transfer_id: 'x9', remote_engine_id: 'prod' };

  it('loads every prompt token past the local hit, asynchronously, and ships the load', () => {
    const s = sched('kv_consumer', { remote_bootstrap_addr: 'cfg:1' });
    const r = req('d1', params, 20, 0);
    expect(s.getNumNewMatchedTokens(r, 8)).toEqual({ count: 12, loadAsync: true });
    s.updateStateAfterAlloc(r, [[1, 2], [3]], 12);
    expect((s.buildConnectorMeta() as MooncakeConnectorMetadata).loads).toEqual([
      { requestId: 'd1', transferId: 'x9', remoteEngineId: 'prod', bootstrapAddr: 'cfg:1', blocks: [[1, 2], [3]], firstToken: 8, numTokens: 20, consumerKey: s.consumerKey },
    ]);
    expect(s.consumerKey).toMatch(/^[0-9a-f]{32}$/);
  });

  it('the params\' remote_bootstrap_addr wins over the config', () => {
    const s = sched('kv_consumer', { remote_bootstrap_addr: 'cfg:1' });
    const r = req('d2', { ...params, remote_bootstrap_addr: 'param:2' }, 20, 0);
    s.getNumNewMatchedTokens(r, 0);
    s.updateStateAfterAlloc(r, [[1]], 20);
    expect((s.buildConnectorMeta() as MooncakeConnectorMetadata).loads[0].bootstrapAddr).toBe('param:2');
  });

  it('a producer engine of this process is not found by its engine id (no process-global registry); only by configuration', async () => {
    const p = sched('kv_producer', {}, 'local-prod');
    const addr = (await p.bootstrapAddress())!;
    const c = sched('kv_consumer');
    const r = req('d3', { ...params, remote_engine_id: 'local-prod' }, 20, 0);
    expect(c.getNumNewMatchedTokens(r, 0)).toEqual({ count: 0, loadAsync: false });
    expect(c.noBootstrap).toBe(1);
    expect(c.requestFinished(r, [], 'length').kvTransferParams?.kv_transfer_params_error).toMatch(/no bootstrap address for producer local-prod/);
    const configured = sched('kv_consumer', { remote_bootstrap_addr: addr });
    const r2 = req('d3b', { ...params, remote_engine_id: 'local-prod' }, 20, 0);
    expect(configured.getNumNewMatchedTokens(r2, 0).count).toBe(20);
    configured.updateStateAfterAlloc(r2, [[1]], 20);
    expect((configured.buildConnectorMeta() as MooncakeConnectorMetadata).loads[0].bootstrapAddr).toBe(addr);
  });

  it('no bootstrap address anywhere, no transfer id, or nothing left to load: no load', () => {
    const s = sched('kv_consumer');
    expect(s.getNumNewMatchedTokens(req('d4', params, 20, 0), 0)).toEqual({ count: 0, loadAsync: false });
    expect(s.noBootstrap).toBe(1);
    const t = sched('kv_consumer', { remote_bootstrap_addr: 'cfg:1' });
    expect(t.getNumNewMatchedTokens(req('d5', { do_remote_prefill: true, remote_engine_id: 'p' }, 20, 0), 0).count).toBe(0);
    expect(t.getNumNewMatchedTokens(req('d6', params, 20, 0), 20).count).toBe(0);
    expect(t.getNumNewMatchedTokens(req('d7', undefined, 20, 0), 0).count).toBe(0);
  });

  it('a request finished before its load was shipped drops the load', () => {
    const s = sched('kv_consumer', { remote_bootstrap_addr: 'cfg:1' });
    const r = req('d8', params, 20, 0);
    s.getNumNewMatchedTokens(r, 0);
    s.updateStateAfterAlloc(r, [[1]], 20);
    expect(s.requestFinished(r, [[1]], 'abort')).toEqual({ delayFree: false });
    expect(s.buildConnectorMeta()).toBeNull();
  });
});

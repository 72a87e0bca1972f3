/**
 * Which engine and role wrote a log line: the CLI's logger binds them, connector halves log with
 * the engine's logger (ctx.logger, with their half and PP stage / TP rank), and vLLM's
 * kv_transfer_config keys without a meaning here are named at debug level.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { KVChecksumObservability, type KVConnectorFactory } from '@kvconnect/core';
import { IN_PROCESS_CONNECTOR, inProcessRegistry } from '@kvconnect/engine/testing';
import { Engine } from '../src/engine.js';
import { engineOptionsOf, parseEngineArgs } from '../src/server/main.js';

const cleanups: Array<() => Promise<unknown>> = [];
afterEach(async () => {
  while (cleanups.length) await cleanups.pop()!();
});

function capture(): { lines: Array<Record<string, unknown>>; destination: { write(l: string): void } } {
  const lines: Array<Record<string, unknown>> = [];
  return { lines, destination: { write: (l: string) => void lines.push(JSON.parse(l) as Record<string, unknown>) } };
}

describe('log lines name their engine and role', () => {
  it('kvconnect-engine binds engine (flag, else kv_transfer_config.engine_id) and role on every line', () => {
    const cfg = (args: string[]) => {
      const p = parseEngineArgs(['--preset', 'dense-gqa', ...args]);
      if (p.help) throw new Error('help');
      const { engine, role } = engineOptionsOf(p.config).observability!.logger.bindings();
      return { engine, role };
    };
    expect(cfg(['--kv-transfer-config', '{"kv_connector":"X","kv_role":"kv_consumer","engine_id":"decode-7"}'])).toEqual({ engine: 'decode-7', role: 'kv_consumer' });
    expect(cfg(['--engine-id', 'p0', '--kv-transfer-config', '{"kv_connector":"X","kv_role":"kv_producer","engine_id":"other"}'])).toEqual({ engine: 'p0', role: 'kv_producer' });
    expect(cfg(['--engine-id', 'solo'])).toEqual({ engine: 'solo', role: 'none' });
  });

  it('connector halves get the engine logger; ignored vLLM keys are logged at debug; engine_id names the engine', async () => {
    const { registry } = inProcessRegistry();
    const inner = registry.get(IN_PROCESS_CONNECTOR);
    const logging: KVConnectorFactory = {
      name: 'LoggingConnector',
      createScheduler: (c, ctx) => {
        ctx.logger?.info('scheduler half up');
        return inner.createScheduler(c, ctx);
      },
      createWorker: (c, ctx) => {
        ctx.logger?.info('worker half up');
        return inner.createWorker(c, ctx);
      },
      kvChecksumCarriers: (c) => inner.kvChecksumCarriers?.(c),
    };
    registry.register(logging);
    const { lines, destination } = capture();
    const e = new Engine({
      preset: 'dense-gqa',
      tpSize: 2,
      registry,
      kvTransferConfig: { kv_connector: 'LoggingConnector', kv_role: 'kv_producer', engine_id: 'prefill-3', kv_buffer_device: 'cuda', kv_port: 14579 },
      observability: new KVChecksumObservability({ level: 'debug', destination, bindings: { engine: 'prefill-3', role: 'kv_producer' } }),
    });
    cleanups.push(() => e.shutdown());
    await e.ready;
    expect(e.engineId).toBe('prefill-3');
    const pick = (msg: string) => lines.filter((l) => l.msg === msg).map(({ engine, role, half, pp, tp, key }) => ({ engine, role, half, pp, tp, key }));
    expect(pick('scheduler half up')).toEqual([{ engine: 'prefill-3', role: 'kv_producer', half: 'scheduler', pp: undefined, tp: undefined, key: undefined }]);
    expect(pick('worker half up')).toEqual([0, 1].map((tp) => ({ engine: 'prefill-3', role: 'kv_producer', half: 'worker', pp: 0, tp, key: undefined })));
    expect(lines.filter((l) => typeof l.msg === 'string' && (l.msg as string).endsWith('has no meaning in kvconnect: ignored')).map((l) => [l.key, l.level])).toEqual([
      ['kv_buffer_device', 20],
      ['kv_port', 20],
    ]);
  });
});

import { describe, expect, it } from 'vitest';
import { IGNORED_VLLM_KEYS, KVTransferConfigError, ignoredTransferConfigKeys, parseKVTransferConfig } from '../src/config.js';

function problems(raw: unknown): Array<{ path: string; message: string }> {
  try {
    parseKVTransferConfig(raw);
  } catch (e) {
    expect(e).toBeInstanceOf(KVTransferConfigError);
    return [...(e as KVTransferConfigError).problems];
  }
  throw new Error('expected a KVTransferConfigError');
}

describe('parseKVTransferConfig', () => {
  it('fills defaults', () => {
    expect(parseKVTransferConfig({ kv_connector: 'NixlConnector', kv_role: 'kv_both' })).toEqual({
      kv_connector: 'NixlConnector',
      kv_role: 'kv_both',
      enable_kv_checksum: false,
      kv_checksum_fail_closed: false,
      kv_load_failure_policy: 'recompute',
      kv_connector_extra_config: {},
    });
  });

  it('keeps every valid field', () => {
    const raw = {
      kv_connector: 'X',
      kv_role: 'kv_consumer',
      enable_kv_checksum: true,
      kv_checksum_fail_closed: true,
      kv_load_failure_policy: 'fail',
      kv_connector_extra_config: { a: 1 },
      kv_connector_module_path: './x.js',
    };
    const c = parseKVTransferConfig(raw);
    expect(c).toEqual(raw);
    expect(c.kv_connector_extra_config).not.toBe(raw.kv_connector_extra_config);
  });

  it('lists every problem with its field path', () => {
    const ps = problems({
      kv_role: 'decoder',
      enable_kv_checksum: 'yes',
      kv_checksum_fail_closed: 1,
      kv_load_failure_policy: 'retry',
      kv_connector_extra_config: [],
      kv_connector_module_path: 7,
      kv_bufer_size: 1e9,
    });
    expect(ps.map((p) => p.path).sort()).toEqual(
      [
        'kv_bufer_size',
        'kv_connector',
        'kv_role',
        'enable_kv_checksum',
        'kv_checksum_fail_closed',
        'kv_load_failure_policy',
        'kv_connector_extra_config',
        'kv_connector_module_path',
      ].sort(),
    );
    expect(ps.find((p) => p.path === 'kv_bufer_size')?.message).toMatch(/^unknown key \(known: kv_connector, kv_role, .*kv_buffer_size/);
    expect(ps.find((p) => p.path === 'kv_connector')?.message).toBe('required');
    expect(ps.find((p) => p.path === 'kv_role')?.message).toMatch(/kv_producer, kv_consumer, kv_both/);
    expect(ps.find((p) => p.path === 'enable_kv_checksum')?.message).toMatch(/boolean, got string/);
    expect(ps.find((p) => p.path === 'kv_connector_extra_config')?.message).toMatch(/object, got array/);
  });

  it('rejects wrong types of the required fields and non-objects', () => {
    expect(problems({ kv_connector: 3, kv_role: null }).map((p) => p.path)).toEqual(['kv_connector', 'kv_role']);
    expect(problems({ kv_connector: '', kv_role: 'kv_producer' })).toEqual([{ path: 'kv_connector', message: 'must not be empty' }]);
    expect(problems(null)).toEqual([{ path: '', message: 'expected an object, got null' }]);
    expect(problems('{"kv_connector":"x"}')[0].message).toMatch(/got string/);
    expect(problems({ kv_connector: 'x', kv_role: 'kv_both', kv_connector_extra_config: null })[0].path).toBe('kv_connector_extra_config');
  });

  it('the error message names every problem', () => {
    expect(() => parseKVTransferConfig({ kv_role: 'x' })).toThrow(/kv_connector: required; kv_role: expected one of/);
  });

  it("accepts vLLM's kv_transfer_config keys: engine_id kept, the others typed and listed as ignored", () => {
    const vllm = {
      kv_connector: 'NixlConnector',
      kv_role: 'kv_both',
      engine_id: 'prefill-0',
      kv_buffer_device: 'cuda',
      kv_buffer_size: 1e9,
      kv_rank: null,
      kv_parallel_size: 1,
      kv_ip: '127.0.0.1',
      kv_port: 14579,
      enable_permute_local_kv: false,
    };
    const c = parseKVTransferConfig(vllm);
    expect(c.engine_id).toBe('prefill-0');
    expect(c.kv_port).toBe(14579);
    expect(ignoredTransferConfigKeys(c)).toEqual([...IGNORED_VLLM_KEYS]);
    expect(ignoredTransferConfigKeys(parseKVTransferConfig({ kv_connector: 'x', kv_role: 'kv_both', engine_id: 'e' }))).toEqual([]);
    expect(problems({ ...vllm, kv_port: 70000, kv_rank: -1, kv_buffer_size: 'big', engine_id: '' })).toEqual([
      { path: 'engine_id', message: 'must not be empty' },
      { path: 'kv_buffer_size', message: 'expected a number, got string' },
      { path: 'kv_rank', message: 'expected a non-negative integer' },
      { path: 'kv_port', message: 'expected an integer in 0..65535' },
    ]);
  });

  it('prefixes nested paths', () => {
    try {
      parseKVTransferConfig({ kv_connector: 'x', kv_role: 'kv_both', kv_connector_extra_config: 1 }, 'kv_connector_extra_config.connectors[1]');
      throw new Error('no error');
    } catch (e) {
      expect((e as KVTransferConfigError).problems).toEqual([{ path: 'kv_connector_extra_config.connectors[1].kv_connector_extra_config', message: 'expected an object, got number' }]);
    }
  });
});

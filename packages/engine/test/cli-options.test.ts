/**
 * The engine and proxy CLIs parse from one option table per program (`ENGINE_OPTIONS`,
 * `PROXY_OPTIONS` in src/server/main.ts): each kind of option, given on the command line and in
 * `--config-json`, with a good value and with bad ones, and the exact message a bad one gives.
 */
import { describe, expect, it } from 'vitest';
import { ENGINE_USAGE, PROXY_USAGE, UsageError, parseEngineArgs, parseProxyArgs } from '../src/server/main.js';

const P = ['--preset', 'dense-gqa'];

/** The config of a good engine command line (after `--preset dense-gqa`), without the preset. */
function engine(args: string[]): Record<string, unknown> {
  const p = parseEngineArgs([...P, ...args]);
  if (p.help) throw new Error('help');
  const { preset, ...rest } = p.config as Record<string, unknown>;
  expect(preset).toBe('dense-gqa');
  return rest;
}

/** The message of the UsageError a bad engine command line gives. */
function engineError(args: string[]): string {
  try {
    parseEngineArgs(args);
  } catch (e) {
    expect(e).toBeInstanceOf(UsageError);
    return (e as Error).message;
  }
  throw new Error(`no error for ${args.join(' ')}`);
}

describe('engine CLI: each kind of option, good and bad', () => {
  it('positive integers (--tensor-parallel-size, its alias --tp-size, --max-body-bytes, ...)', () => {
    expect(engine(['--tensor-parallel-size', '2'])).toEqual({ tpSize: 2 });
    expect(engine(['--tp-size', '3'])).toEqual({ tpSize: 3 });
    expect(engine(['--num-gpu-blocks-override', '64'])).toEqual({ numBlocks: 64 });
    expect(engine(['--max-body-bytes', '1024', '--max-tokens', '8', '--max-model-len', '99'])).toEqual({ maxBodyBytes: 1024, maxTokens: 8, maxModelLen: 99 });
    expect(engineError([...P, '--tensor-parallel-size', '0'])).toBe('engine config: tpSize: expected a positive integer, got 0');
    expect(engineError([...P, '--max-body-bytes', '0'])).toBe('engine config: maxBodyBytes: expected a positive integer, got 0');
    expect(engineError([...P, '--block-size', '99999999999999999999'])).toBe('engine config: blockSize: expected a positive integer, got 100000000000000000000');
    expect(engineError([...P, '--tensor-parallel-size', 'x'])).toBe("option '--tensor-parallel-size <n>' argument 'x' is invalid. expected a non-negative integer");
    expect(engineError([...P, '--tp-size', '-1'])).toBe("option '--tp-size <n>' argument '-1' is invalid. expected a non-negative integer");
    expect(engineError([...P, '--num-blocks', '1.5'])).toBe("option '--num-blocks <n>' argument '1.5' is invalid. expected a non-negative integer");
    expect(engineError(['--config-json', '{"preset":"mla","ppSize":"2"}'])).toBe('--config-json: ppSize: expected a positive integer, got "2"');
  });

  it('non-negative integers and the port', () => {
    expect(engine(['--long-prefill-token-threshold', '0', '--request-timeout-ms', '0', '--port', '0'])).toEqual({ longPrefillTokenThreshold: 0, requestTimeoutMs: 0, port: 0 });
    expect(engine(['--port', '65535'])).toEqual({ port: 65535 });
    expect(engineError([...P, '--port', '65536'])).toBe('engine config: port: expected an integer in [0, 65535], got 65536');
    expect(engineError([...P, '--port', 'x'])).toBe("option '--port <n>' argument 'x' is invalid. expected a non-negative integer");
    expect(engineError([...P, '--request-timeout-ms', '-1'])).toBe("option '--request-timeout-ms <n>' argument '-1' is invalid. expected a non-negative integer");
    expect(engineError(['--config-json', '{"preset":"mla","longPrefillTokenThreshold":-1}'])).toBe('--config-json: longPrefillTokenThreshold: expected a non-negative integer, got -1');
    expect(engineError(['--config-json', '{"preset":"mla","port":1.5}'])).toBe('--config-json: port: expected an integer in [0, 65535], got 1.5');
  });

  it('choices (--preset, --kv-dtype, --device, --workers, --log-level, ...)', () => {
    expect(engine(['--kv-dtype', 'float16', '--ssm-dtype', 'bfloat16', '--checksum-backend', 'ts', '--device', 'cuda-emulated', '--workers', 'processes', '--log-level', 'info'])).toEqual({
      kvDtype: 'float16',
      ssmDtype: 'bfloat16',
      checksumBackend: 'ts',
      device: 'cuda-emulated',
      executor: 'processes',
      logLevel: 'info',
    });
    expect(engineError(['--preset', 'nope'])).toBe('engine config: preset: expected one of dense-gqa, mla, hybrid-mamba2, sliding-window, got "nope"');
    expect(engineError([...P, '--kv-dtype', 'int8'])).toBe('engine config: kvDtype: expected one of bfloat16, float16, float32, got "int8"');
    expect(engineError([...P, '--checksum-backend', 'gpu'])).toBe('engine config: checksumBackend: expected one of auto, ts, native, cuda, cuda-emulated, got "gpu"');
    expect(engineError([...P, '--workers', 'threads'])).toBe('engine config: executor: expected one of inprocess, processes, got "threads"');
    expect(engineError([...P, '--log-level', 'loud'])).toBe('engine config: logLevel: expected one of fatal, error, warn, info, debug, trace, silent, got "loud"');
    expect(engineError(['--config-json', '{"preset":"mla","device":3}'])).toBe('--config-json: device: expected one of cpu, cuda, cuda-emulated, got 3');
  });

  it('non-empty strings and the model', () => {
    expect(engine(['--engine-id', 'e1', '--host', '0.0.0.0'])).toEqual({ engineId: 'e1', host: '0.0.0.0' });
    expect(parseEngineArgs(['--model', 'mla'])).toEqual({ help: false, exitWithParent: false, config: { model: 'mla' } });
    expect(engineError([...P, '--engine-id', ''])).toBe('engine config: engineId: expected a non-empty string, got string');
    expect(engineError(['--config-json', '{"preset":"mla","host":7}'])).toBe('--config-json: host: expected a non-empty string, got number');
    expect(engineError(['--config-json', '{"model":3}'])).toBe('--config-json: model: expected a preset name or a model config object, got number');
    expect(engineError([...P, '--engine-id'])).toBe("option '--engine-id <id>' argument missing");
  });

  it('strings: variadic (--served-model-name) and repeatable, accumulating (--import)', () => {
    expect(engine(['--served-model-name', 'a', 'b', '--served-model-name', 'c'])).toEqual({ servedModelName: ['a', 'b', 'c'] });
    expect(engine(['--import', 'a', '--import', 'b', '--config-json', '{"imports":["c"]}'])).toEqual({ imports: ['c', 'a', 'b'] });
    expect(engineError([...P, '--served-model-name', ''])).toBe('engine config: servedModelName: expected an array of non-empty strings');
    expect(engineError([...P, '--import', ''])).toBe('engine config: imports: expected an array of non-empty strings');
    expect(engineError(['--config-json', '{"preset":"mla","imports":"a"}'])).toBe('--config-json: imports: expected an array of non-empty strings');
  });

  it('JSON objects (--kv-transfer-config) and the flag that adds to one (--kv-connector-module-path)', () => {
    const kvt = { kv_connector: 'X', kv_role: 'kv_producer' };
    expect(engine(['--kv-transfer-config', JSON.stringify(kvt)])).toEqual({ kvTransferConfig: kvt });
    expect(engine(['--kv-transfer-config', JSON.stringify(kvt), '--kv-connector-module-path', './m.js'])).toEqual({ kvTransferConfig: { ...kvt, kv_connector_module_path: './m.js' } });
    expect(engineError([...P, '--kv-transfer-config', '{bad'])).toBe("--kv-transfer-config: not valid JSON: Expected property name or '}' in JSON at position 1");
    expect(engineError([...P, '--kv-transfer-config', '[1]'])).toBe('engine config: kvTransferConfig: expected an object, got array');
    expect(engineError([...P, '--kv-connector-module-path', './m.js'])).toBe('--kv-connector-module-path needs a kv_transfer_config (--kv-transfer-config or the config)');
  });

  it('an object set by two flags (--cache-layout, --kv-layout) over the config', () => {
    expect(engine(['--cache-layout', 'HND'])).toEqual({ cacheLayout: { layout: 'HND', kvLayout: 'kv-first' } });
    expect(engine(['--cache-layout', 'HND', '--kv-layout', 'block-kv'])).toEqual({ cacheLayout: { layout: 'HND', kvLayout: 'block-kv' } });
    expect(engine(['--kv-layout', 'block-kv', '--config-json', '{"cacheLayout":{"layout":"HND","kvLayout":"separate"}}'])).toEqual({ cacheLayout: { layout: 'HND', kvLayout: 'block-kv' } });
    expect(engineError([...P, '--cache-layout', 'XYZ'])).toBe('engine config: cacheLayout.layout: expected NHD or HND, got "XYZ"');
    expect(engineError([...P, '--kv-layout', 'nope'])).toBe('engine config: cacheLayout.kvLayout: expected kv-first, block-kv or separate, got "nope"');
    expect(engineError(['--config-json', '{"preset":"mla","cacheLayout":{"layout":"HND"}}'])).toBe('--config-json: cacheLayout.kvLayout: expected kv-first, block-kv or separate, got nothing');
  });

  it('booleans: --enable-prefix-caching, --no-enable-prefix-caching and its older spelling', () => {
    expect(engine([])).toEqual({});
    expect(engine(['--enable-prefix-caching'])).toEqual({ enablePrefixCaching: true });
    expect(engine(['--no-enable-prefix-caching'])).toEqual({ enablePrefixCaching: false });
    expect(engine(['--disable-prefix-caching'])).toEqual({ enablePrefixCaching: false });
    expect(engine(['--enable-prefix-caching', '--no-enable-prefix-caching'])).toEqual({ enablePrefixCaching: false });
    expect(engineError([...P, '--enable-prefix-caching', 'x'])).toBe("too many arguments. Expected 0 arguments but got 1.");
    expect(engineError(['--config-json', '{"preset":"mla","enablePrefixCaching":"yes"}'])).toBe('--config-json: enablePrefixCaching: expected a boolean, got string');
  });

  it("vLLM's --distributed-executor-backend maps to executor; --workers wins", () => {
    expect(engine(['--distributed-executor-backend', 'mp'])).toEqual({ executor: 'processes' });
    expect(engine(['--distributed-executor-backend', 'uni'])).toEqual({ executor: 'inprocess' });
    expect(engine(['--distributed-executor-backend', 'mp', '--workers', 'inprocess'])).toEqual({ executor: 'inprocess' });
    expect(engineError([...P, '--distributed-executor-backend', 'ray'])).toBe('--distributed-executor-backend: expected mp or uni, got "ray"');
  });

  it('config keys: unknown ones name the known ones; several problems in one message', () => {
    expect(engineError(['--config-json', '{"preset":"mla","tpsize":2}'])).toBe(
      '--config-json: tpsize: unknown key (known: model, preset, tpSize, ppSize, blockSize, numBlocks, cacheLayout, kvDtype, ssmDtype, maxNumBatchedTokens, maxNumSeqs, longPrefillTokenThreshold, kvTransferConfig, enablePrefixCaching, engineId, checksumBackend, device, imports, executor, host, port, maxBodyBytes, requestTimeoutMs, maxTokens, maxModelLen, servedModelName, logLevel)',
    );
    expect(engineError(['--config-json', '{"preset":"mla","tpSize":0,"port":70000}'])).toBe('--config-json: tpSize: expected a positive integer, got 0; port: expected an integer in [0, 65535], got 70000');
    expect(engineError(['--config-json', '[1]'])).toBe('--config-json: expected a JSON object, got array');
    expect(engineError([...P, '--bogus'])).toBe("unknown option '--bogus'");
  });

  it('the help lists every flag once, in table order, and the older spellings', () => {
    const flags = [...ENGINE_USAGE.matchAll(/^ {2}((?:-\w, )?--?[\w-]+)/gm)].map((m) => m[1]);
    expect(flags).toEqual([
      '--config', '--config-json', '--exit-with-parent', '-h, --help',
      '--model', '--preset', '--tensor-parallel-size', '--pipeline-parallel-size', '--block-size', '--num-blocks', '--cache-layout', '--kv-layout',
      '--kv-dtype', '--ssm-dtype', '--max-num-batched-tokens', '--max-num-seqs', '--long-prefill-token-threshold', '--kv-transfer-config',
      '--kv-connector-module-path', '--enable-prefix-caching', '--no-enable-prefix-caching', '--engine-id', '--checksum-backend', '--device',
      '--import', '--workers', '--distributed-executor-backend', '--host', '--port', '--max-body-bytes', '--request-timeout-ms', '--max-tokens',
      '--max-model-len', '--served-model-name', '--log-level',
    ]); // prettier-ignore
    expect(ENGINE_USAGE).toMatch(/--kv-dtype <dtype> +bfloat16 \| float16 \| float32 \(default bfloat16\)\n/);
    expect(ENGINE_USAGE).toMatch(/--preset <name> +model preset: dense-gqa \| mla \| hybrid-mamba2 \| sliding-window\n/);
    expect(ENGINE_USAGE).toContain('Older spellings that still work: --tp-size = --tensor-parallel-size; --pp-size = --pipeline-parallel-size; --num-gpu-blocks-override = --num-blocks; --disable-prefix-caching = --no-enable-prefix-caching\n');
  });
});

describe('proxy CLI: each kind of option, good and bad', () => {
  const U = ['--prefill', 'http://x:1', '--decode', 'http://x:2'];
  const proxyError = (args: string[]) => {
    try {
      parseProxyArgs(args);
    } catch (e) {
      expect(e).toBeInstanceOf(UsageError);
      return (e as Error).message;
    }
    throw new Error(`no error for ${args.join(' ')}`);
  };

  it('good values of every kind', () => {
    expect(parseProxyArgs([...U, '--prefill', 'http://y:3', '--mode', 'concurrent', '--host', 'h', '--port', '1', '--timeout-ms', '5', '--connect-timeout-ms', '0', '--log-level', 'warn'])).toEqual({
      help: false,
      exitWithParent: false,
      config: { prefill: ['http://x:1', 'http://y:3'], decode: ['http://x:2'], mode: 'concurrent', host: 'h', port: 1, timeoutMs: 5, connectTimeoutMs: 0, logLevel: 'warn' },
    });
  });

  it('bad values: exact messages', () => {
    expect(proxyError([...U, '--timeout-ms', '0'])).toBe('proxy config: timeoutMs: expected a positive integer, got 0');
    expect(proxyError([...U, '--port', 'x'])).toBe("option '--port <n>' argument 'x' is invalid. expected a non-negative integer");
    expect(proxyError([...U, '--mode', 'both'])).toBe('proxy config: mode: expected one of sequential, concurrent, got "both"');
    expect(proxyError([...U, '--host', ''])).toBe('proxy config: host: expected a non-empty string, got string');
    expect(proxyError([...U, '--prefill', ''])).toBe('proxy config: prefill: expected an array of non-empty strings');
    expect(proxyError([...U, '--decode', 'ftp://x'])).toBe('--decode: not an http URL: "ftp://x"');
    expect(proxyError(['--prefill', 'http://x:1'])).toBe('proxy config: at least one --decode URL is needed');
    expect(proxyError(['--config-json', '{"zz":1}'])).toBe('--config-json: zz: unknown key (known: prefill, decode, mode, host, port, timeoutMs, connectTimeoutMs, maxBodyBytes, maxTokens, logLevel)');
  });

  it('the help lists every flag in table order', () => {
    const flags = [...PROXY_USAGE.matchAll(/^ {2}((?:-\w, )?--?[\w-]+)/gm)].map((m) => m[1]);
    expect(flags).toEqual(['--config', '--config-json', '--exit-with-parent', '-h, --help', '--prefill', '--decode', '--mode', '--host', '--port', '--timeout-ms', '--connect-timeout-ms', '--max-body-bytes', '--max-tokens', '--log-level']);
  });
});

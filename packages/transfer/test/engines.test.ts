/**
 * The transfer engines by name (`engines.ts`): the one-line reason a library engine cannot be
 * used (what to install, which variable points at it), and the NIXL agent's backend parameters
 * for same-host UCX transports (`nixlBackendParams`), also over real NIXL with `UCX_TLS=sm,self`
 * where NIXL_PREFIX names an install.
 */
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NixlAgent, TRANSFER_ENGINES, isTransferEngine, nixlBackendParams, transferEngineUnavailable } from '../src/index.js';
import { defineConformance } from './conformance.js';

const FAKE_NIXL = fileURLToPath(new URL('../../../native/build/test/libfake_nixl_capi.so', import.meta.url));
const FAKE_MOONCAKE = fileURLToPath(new URL('../../../native/build/test/libfake_transfer_engine.so', import.meta.url));
const native = createRequire(import.meta.url)('@kvconnect/native') as { addon: { transfer?: unknown; mooncake?: unknown } | null };

describe('transfer engine names', () => {
  it('embedded, nixl, mooncake', () => {
    expect(TRANSFER_ENGINES).toEqual(['embedded', 'nixl', 'mooncake']);
    expect(isTransferEngine('nixl')).toBe(true);
    expect(isTransferEngine('ucx')).toBe(false);
    expect(isTransferEngine(undefined)).toBe(false);
  });
});

describe('transferEngineUnavailable', () => {
  it('embedded is always available', () => {
    expect(transferEngineUnavailable('embedded', { env: {} })).toBeNull();
  });

  for (const [engine, prefixEnv, libraryEnv, lib, install] of [
    ['nixl', 'NIXL_PREFIX', 'NIXL_LIBRARY', 'libnixl_capi.so', 'install NIXL'],
    ['mooncake', 'MOONCAKE_PREFIX', 'MOONCAKE_LIBRARY', 'libtransfer_engine.so', 'install the Mooncake Transfer Engine'],
  ] as const) {
    it(`${engine}: a missing library is one line naming what to install, ${prefixEnv} and every path tried`, () => {
      const why = transferEngineUnavailable(engine, { env: { [prefixEnv]: '/nonexistent/kvc-prefix' } });
      expect(why).not.toBeNull();
      expect(why).not.toContain('\n');
      expect(why).toMatch(new RegExp(`^transfer engine ${engine}: ${lib.replace(/\./g, '\\.')} cannot be loaded \\(${prefixEnv}=/nonexistent/kvc-prefix is set, but the library does not load there\\); ${install} .* and set ${prefixEnv} to its install prefix \\(or ${libraryEnv} to the library file\\); `));
      expect(why).toContain(`/nonexistent/kvc-prefix/lib/${lib}`);
    });

    it(`${engine}: without ${prefixEnv} the line still says to set it`, () => {
      const why = transferEngineUnavailable(engine, { library: `/nonexistent/${lib}`, env: {} });
      expect(why).toMatch(new RegExp(`cannot be loaded; ${install} .*set ${prefixEnv} to its install prefix`));
      expect(why).toContain(`/nonexistent/${lib}`);
    });
  }

  const fakes = [
    ['nixl', FAKE_NIXL, native.addon?.transfer],
    ['mooncake', FAKE_MOONCAKE, native.addon?.mooncake],
  ] as const;
  for (const [engine, fake, bindings] of fakes) {
    const missing = !bindings ? 'the native addon has no bindings for it' : !existsSync(fake) ? `${fake} is not built` : null;
    it.skipIf(missing !== null)(`${engine}: null when the library loads (the fake library)${missing ? ` (skipped: ${missing})` : ''}`, () => {
      expect(transferEngineUnavailable(engine, { library: fake })).toBeNull();
    });
  }
});

describe('nixlBackendParams: ucx_error_handling_mode for same-host UCX transports', () => {
  it('UCX_TLS of same-host transports only: mode none', () => {
    for (const tls of ['sm,self', 'shm', 'posix,sysv,cma,self', ' sm , self ', 'cuda_ipc,cuda_copy,sm']) expect(nixlBackendParams('UCX', {}, { UCX_TLS: tls }), tls).toEqual({ ucx_error_handling_mode: 'none' });
  });
  it('a network transport, an exclusion list, no UCX_TLS, another backend: parameters as given', () => {
    for (const tls of ['tcp', 'sm,tcp', 'rc,sm,self', '^tcp', '']) expect(nixlBackendParams('UCX', { a: '1' }, { UCX_TLS: tls }), tls).toEqual({ a: '1' });
    expect(nixlBackendParams('UCX', {}, {})).toEqual({});
    expect(nixlBackendParams('POSIX', {}, { UCX_TLS: 'sm,self' })).toEqual({});
  });
  it('a mode the user set is kept', () => {
    expect(nixlBackendParams('UCX', { ucx_error_handling_mode: 'peer' }, { UCX_TLS: 'sm,self' })).toEqual({ ucx_error_handling_mode: 'peer' });
  });
});

// Real NIXL over UCX shared memory, no backend parameters given: the agent sets the mode itself.
const realPrefix = process.env.NIXL_PREFIX;
if (realPrefix) {
  describe('real NIXL over UCX shared memory (UCX_TLS=sm,self), no backend parameters', () => {
    const saved = process.env.UCX_TLS;
    beforeAll(() => {
      process.env.UCX_TLS = 'sm,self';
    });
    afterAll(() => {
      if (saved === undefined) delete process.env.UCX_TLS;
      else process.env.UCX_TLS = saved;
    });
    let seq = 0;
    defineConformance({
      label: `nixl (real, NIXL_PREFIX=${realPrefix}, UCX_TLS=sm,self)`,
      canStall: false,
      refusesAfterDeregistration: false,
      pair: async () => {
        const a = await NixlAgent.create({ name: `shm-a-${process.pid}-${++seq}` });
        const b = await NixlAgent.create({ name: `shm-b-${process.pid}-${seq}` });
        await a.loadRemoteMetadata(await b.getLocalMetadata());
        await b.loadRemoteMetadata(await a.getLocalMetadata());
        return { a, b };
      },
    });
  });
} else {
  describe('real NIXL over UCX shared memory', () => {
    it.skip('runs when NIXL_PREFIX points at a NIXL install (skipped: NIXL_PREFIX is not set)', () => {});
  });
}

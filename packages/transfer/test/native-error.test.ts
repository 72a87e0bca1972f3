/**
 * One error shape for native failures (native/index.cjs, native/index.d.ts `NativeError`): the
 * NIXL core, the Mooncake engine core and the shared-memory bindings fail with a NativeError that
 * carries the backend, a numeric `status` and the message; the agents wrap it as the `cause` of
 * their TransferError. Runs over the fake libraries built with the addon.
 */
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { addon, NativeError } from '@kvconnect/native';
import { afterEach, describe, expect, it } from 'vitest';
import { isTransferError, MooncakeAgent, NIXL_STATUS, NixlAgent, type TransferAgent } from '../src/index.js';

const FAKE_NIXL = fileURLToPath(new URL('../../../native/build/test/libfake_nixl_capi.so', import.meta.url));
const FAKE_MC = fileURLToPath(new URL('../../../native/build/test/libfake_transfer_engine.so', import.meta.url));
const nixlMissing = !addon?.transfer ? 'the addon has no transfer bindings' : !existsSync(FAKE_NIXL) ? `${FAKE_NIXL} is not built` : null;
const mcMissing = !addon?.mooncake ? 'the addon has no mooncake bindings' : !existsSync(FAKE_MC) ? `${FAKE_MC} is not built` : null;
const shmMissing = !addon?.shm ? 'the addon has no shm bindings (not Linux, or not built)' : null;

const open: TransferAgent[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((a) => a.close().catch(() => {})));
});

describe('NativeError', () => {
  it.skipIf(!!nixlMissing)(`NIXL: a refused call rejects with a NativeError nixl, numeric status, as the TransferError's cause${nixlMissing ? ` (skipped: ${nixlMissing})` : ''}`, async () => {
    const a = await NixlAgent.create({ name: `ne-nixl-${process.pid}`, library: FAKE_NIXL });
    open.push(a);
    const err = await a.loadRemoteMetadata(new Uint8Array([1, 2, 3])).catch((e: unknown) => e);
    expect(isTransferError(err, 'invalid')).toBe(true);
    const cause = (err as Error).cause;
    expect(cause).toBeInstanceOf(NativeError);
    const ne = cause as NativeError;
    expect(ne.name).toBe('NativeError');
    expect(ne.backend).toBe('nixl');
    expect(typeof ne.status).toBe('number');
    expect(Object.values(NIXL_STATUS)).toContain(ne.status);
    expect(ne.status).toBeLessThan(0);
    expect(ne.message.length).toBeGreaterThan(0);
  });

  it.skipIf(!!mcMissing)(`Mooncake: a refused call rejects with a NativeError mooncake, numeric status, and no numeric code${mcMissing ? ` (skipped: ${mcMissing})` : ''}`, async () => {
    const a = await MooncakeAgent.create({ name: `ne-mc-${process.pid}`, library: FAKE_MC });
    open.push(a);
    const bytes = new Uint8Array(4096);
    await a.registerMemory([{ bytes }]);
    // The fake engine (like the real one) refuses a buffer registered twice.
    const err = await a.registerMemory([{ bytes }]).catch((e: unknown) => e);
    expect(isTransferError(err, 'invalid')).toBe(true);
    const ne = (err as Error).cause as NativeError;
    expect(ne).toBeInstanceOf(NativeError);
    expect(ne.backend).toBe('mooncake');
    expect(typeof ne.status).toBe('number');
    expect(ne.status).toBe(-1);
    // Node's `code` is a string (ERR_...); the addon no longer puts a number there.
    expect((ne as { code?: unknown }).code).toBeUndefined();
    expect(((ne.cause as { code?: unknown }) ?? {}).code).toBeUndefined();
  });

  it.skipIf(!!shmMissing)(`shm: a failing system call throws a NativeError shm with errno as status${shmMissing ? ` (skipped: ${shmMissing})` : ''}`, () => {
    const e = (() => {
      try {
        addon!.shm!.map('/nonexistent/kvconnect', 8192, `kvc-${'0'.repeat(32)}`);
      } catch (x) {
        return x;
      }
      return null;
    })();
    expect(e).toBeInstanceOf(NativeError);
    expect((e as NativeError).backend).toBe('shm');
    expect((e as NativeError).status).toBe(2); // ENOENT
    // Argument errors stay RangeError / TypeError.
    expect(() => addon!.shm!.map('/dev/null', 8192, 'not-a-kvc-name')).toThrow(RangeError);
  });
});

'use strict';
/**
 * The one loader of the kvconnect native addon (build/Release/kvconnect_native.node), typed by
 * index.d.ts: every package imports `addon` / `loadError` from here (no other `require` of the
 * .node file). `addon` is null when the addon was not built, failed to load, or was built for
 * another C ABI version than this package expects (a stale build); `loadError` says why.
 *
 * Native failures have one shape, {@link NativeError}: the NIXL agent core, the Mooncake engine
 * core and the shared-memory bindings reject (or throw) with a NativeError carrying the backend
 * (`nixl`, `mooncake`, `shm`), the native status code as a number (`nixl_capi_status_t`, the
 * Transfer Engine's return code, errno; -1 when the failure has none) and the message. Argument
 * errors stay TypeError / RangeError.
 */
const EXPECTED_ABI_VERSION = 1;

/** A failed native call: `backend`, numeric `status`, message; `cause` is the addon's own error. */
class NativeError extends Error {
  constructor(backend, status, message, options) {
    super(message, options);
    this.name = 'NativeError';
    this.backend = backend;
    this.status = status;
  }
}

/** `e` as a NativeError of `backend` (TypeError / RangeError and NativeErrors pass unchanged). */
function toNativeError(backend, e) {
  if (e instanceof NativeError || e instanceof TypeError || e instanceof RangeError) return e;
  const status = e !== null && typeof e === 'object' && typeof e.status === 'number' ? e.status : -1;
  const message = e instanceof Error ? e.message : String(e);
  return new NativeError(backend, status, message, { cause: e });
}

/** Calls `fn`; a throw or a rejection becomes a NativeError of `backend`. */
function guard(backend, fn) {
  let r;
  try {
    r = fn();
  } catch (e) {
    throw toNativeError(backend, e);
  }
  if (r !== null && typeof r === 'object' && typeof r.then === 'function') return r.then(undefined, (e) => Promise.reject(toNativeError(backend, e)));
  return r;
}

/** A subclass of the addon class `Base` whose methods fail with NativeErrors of `backend`. */
function guardClass(Base, backend) {
  class Guarded extends Base {}
  for (const name of Object.getOwnPropertyNames(Base.prototype)) {
    if (name === 'constructor' || typeof Base.prototype[name] !== 'function') continue;
    const f = Base.prototype[name];
    Object.defineProperty(Guarded.prototype, name, {
      value: function (...args) {
        return guard(backend, () => f.apply(this, args));
      },
      writable: true,
      configurable: true,
    });
  }
  Object.defineProperty(Guarded, 'name', { value: Base.name });
  return Guarded;
}

let addon = null;
let loadError = null;
try {
  const a = require('./build/Release/kvconnect_native.node');
  if (a.abiVersion !== EXPECTED_ABI_VERSION) {
    loadError = new Error(`kvconnect_native.node has ABI version ${a.abiVersion}, expected ${EXPECTED_ABI_VERSION} (rebuild: npm run build -w @kvconnect/native)`);
  } else {
    if (a.transfer && a.transfer.NixlAgentCore) a.transfer.NixlAgentCore = guardClass(a.transfer.NixlAgentCore, 'nixl');
    if (a.mooncake && a.mooncake.MooncakeEngineCore) a.mooncake.MooncakeEngineCore = guardClass(a.mooncake.MooncakeEngineCore, 'mooncake');
    if (a.shm) {
      for (const k of ['alloc', 'lookup', 'setGrant', 'map']) {
        const f = a.shm[k];
        a.shm[k] = (...args) => guard('shm', () => f(...args));
      }
    }
    addon = a;
  }
} catch (e) {
  loadError = e instanceof Error ? e : new Error(String(e));
}

/**
 * The addon's `key` bindings (`transfer`, `mooncake`, `cuda`, `device`, `shm`), or why there are none.
 * @param what how a missing `key` is named in the reason.
 */
function bindings(key, what = key) {
  if (!addon) return { bindings: null, reason: `the native addon is not built or failed to load (${loadError ? loadError.message : 'no reason given'})` };
  if (!addon[key]) return { bindings: null, reason: `the native addon has no ${what} bindings (rebuild it: cd native && node scripts/install.cjs)` };
  return { bindings: addon[key], reason: '' };
}

module.exports = { addon, loadError, EXPECTED_ABI_VERSION, NativeError, bindings };

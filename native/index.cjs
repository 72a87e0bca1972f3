'use strict';
/**
 * Loads the kvconnect native addon (build/Release/kvconnect_native.node) if it was built.
 * `addon` is null otherwise, with `loadError` saying why: not built, failed to load, or built for
 * another C ABI version than this package expects (a stale build).
 */
const EXPECTED_ABI_VERSION = 1;
let addon = null;
let loadError = null;
try {
  const a = require('./build/Release/kvconnect_native.node');
  if (a.abiVersion !== EXPECTED_ABI_VERSION) {
    loadError = new Error(`kvconnect_native.node has ABI version ${a.abiVersion}, expected ${EXPECTED_ABI_VERSION} (rebuild: npm run build -w @kvconnect/native)`);
  } else {
    addon = a;
  }
} catch (e) {
  loadError = e instanceof Error ? e : new Error(String(e));
}
module.exports = { addon, loadError, EXPECTED_ABI_VERSION };

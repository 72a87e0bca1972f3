'use strict';
// Loads the addon if it was built; `addon` is null otherwise, with `loadError` saying why.
let addon = null;
let loadError = null;
try {
  addon = require('./build/Release/kvconnect_native.node');
} catch (e) {
  loadError = e;
}
module.exports = { addon, loadError };

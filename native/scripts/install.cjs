#!/usr/bin/env node
// Builds the addon with cmake-js during `npm ci`. The addon is optional at run time: when the
// build fails (no compiler, no cmake), @kvconnect/checksum falls back to its TypeScript backend.
// Set KVCONNECT_REQUIRE_NATIVE=1 (CI does) to make a failed build fail the install.
'use strict';
const { spawnSync } = require('node:child_process');
const path = require('node:path');
const bin = require.resolve('cmake-js/bin/cmake-js');
const args = [bin, 'compile', '--log-level', 'warn'];
if (process.env.KVCONNECT_WITH_CUDA === '1') args.push('--CDKVC_WITH_CUDA=ON', '--CDKVC_CUDART_STATIC=ON');
const r = spawnSync(process.execPath, args, { cwd: path.join(__dirname, '..'), stdio: 'inherit' });
if (r.status !== 0) {
  const msg = `@kvconnect/native: addon build failed (exit ${r.status}); the TypeScript checksum backend will be used`;
  if (process.env.KVCONNECT_REQUIRE_NATIVE === '1') { console.error(msg); process.exit(1); }
  console.warn(msg);
}

#!/usr/bin/env node
// Typechecks every package's tests (packages/*/tsconfig.test.json) and the cross-package tests
// (tests/tsconfig.json): `tsc --build` covers only src, and vitest does not typecheck.
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';

const tsc = join('node_modules', 'typescript', 'bin', 'tsc');
const projects = [
  ...readdirSync('packages').map((p) => `packages/${p}/tsconfig.test.json`).filter((f) => existsSync(f)),
  'tests/tsconfig.json',
];
let failed = 0;
for (const p of projects) {
  try {
    execFileSync(process.execPath, [tsc, '-p', p], { stdio: 'inherit' });
  } catch {
    failed++;
    console.error(`typecheck failed: ${p}`);
  }
}
process.exitCode = failed ? 1 : 0;

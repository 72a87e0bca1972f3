#!/usr/bin/env node
// Packs workspace packages into tarballs, as `npm publish` would ship them:
//   node scripts/pack-packages.mjs DEST [@kvconnect/name ...]
// (default: every workspace package). Build first (npm run build): the tarballs hold dist/.
// Prints one line per tarball; the tarball names are kvconnect-<name>-<version>.tgz.
// `npm run pack:all` (root package.json) builds, then packs every package into packs/ (gitignored);
// the READMEs install from there (`npm install /path/to/kvconnect/packs/*.tgz`), and
// tests/packaging/custom-connector.test.ts installs the same tarballs in a project outside the repo.
import { spawnSync } from 'node:child_process';
import { mkdirSync, readFileSync, readdirSync, existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('..', import.meta.url));

/** Names of the workspace packages (native/ and packages/*). */
export function workspaceNames() {
  const dirs = ['native', ...readdirSync(join(ROOT, 'packages')).map((d) => `packages/${d}`)];
  return dirs.filter((d) => existsSync(join(ROOT, d, 'package.json'))).map((d) => JSON.parse(readFileSync(join(ROOT, d, 'package.json'), 'utf8')).name);
}

/**
 * Runs `npm pack` for `names` into `dest` (one npm process). With `dryRun`, nothing is written.
 * @returns npm's JSON: per package { name, filename, files: [{ path }], ... }.
 */
export function packPackages(dest, names = workspaceNames(), { dryRun = false } = {}) {
  mkdirSync(dest, { recursive: true });
  const args = ['pack', '--json', '--pack-destination', resolve(dest), ...(dryRun ? ['--dry-run'] : []), ...names.flatMap((n) => ['-w', n])];
  const r = spawnSync('npm', args, { cwd: ROOT, encoding: 'utf8', maxBuffer: 64 << 20 });
  if (r.status !== 0) throw new Error(`npm ${args.join(' ')} failed (exit ${r.status}):\n${r.stderr.slice(-4000)}`);
  return JSON.parse(r.stdout);
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const [dest, ...names] = process.argv.slice(2);
  if (!dest) {
    console.error('usage: node scripts/pack-packages.mjs DEST [@kvconnect/name ...]');
    process.exit(2);
  }
  for (const p of packPackages(dest, names.length ? names : undefined)) console.log(`${join(resolve(dest), p.filename)}  (${p.entryCount} files, ${p.size} bytes)`);
}

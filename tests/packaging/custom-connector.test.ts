/**
 * The packages as users install them: every publishable package packs with what its manifest
 * points at (exports, types, bins, README), and `examples/custom-connector` (an npm project of its
 * own, outside the workspaces) installs the packed tarballs of @kvconnect/native, checksum, core
 * and engine in a folder outside the monorepo, registers its own connector by name and runs P/D
 * with KV checksums (`node index.js` prints `verified: ...`). The same install (every package's
 * tarball, as the READMEs say: `npm install /path/to/kvconnect/packs/*.tgz`) then runs the README's
 * `.mjs` snippet and typechecks a consumer importing every package entry under
 * `moduleResolution: node16` and `bundler` (node10 is not supported: TypeScript 7 removed it).
 *
 * Needs npm and the registry or a warm npm cache (`--prefer-offline`) for the third-party
 * dependencies. @kvconnect/native builds its addon in its install script (cmake-js, ~10-20 s);
 * where that fails the example still runs on the TypeScript checksum backend (unless
 * KVCONNECT_REQUIRE_NATIVE=1, as in CI, which makes the install fail).
 */
import { spawnSync } from 'node:child_process';
import { cpSync, existsSync, lstatSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { packPackages } from '../../scripts/pack-packages.mjs';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const EXAMPLE = join(ROOT, 'examples/custom-connector');
/** Every package published from the monorepo (the harness is checked once it is finished). */
const PUBLISHED = ['native', 'checksum', 'core', 'engine', 'transfer', 'nixl-common', 'nixl-pull', 'nixl-push', 'mooncake', 'harness'].map((n) => `@kvconnect/${n}`);
const EXAMPLE_DEPS = ['@kvconnect/native', '@kvconnect/checksum', '@kvconnect/core', '@kvconnect/engine', '@kvconnect/transfer'];


let tmp = '';

/** Env of a child npm outside the monorepo: without the npm_* variables of `npm test`. */
function cleanEnv(): NodeJS.ProcessEnv {
  const keep = new Set(['npm_config_cache', 'npm_config_userconfig', 'npm_config_globalconfig', 'npm_config_registry', 'npm_config_cafile', 'npm_config_proxy', 'npm_config_https_proxy', 'npm_config_noproxy', 'npm_config_strict_ssl']);
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if ((!k.toLowerCase().startsWith('npm_') || keep.has(k.toLowerCase())) && k !== 'INIT_CWD') env[k] = v;
  return env;
}

/** Every file path an `exports` / `types` / `main` / `bin` field names (conditions included). */
/** The first ```js block of a README that imports `pkg`. */
function readmeSnippet(md: string, pkg: string): string {
  const block = [...md.matchAll(/^```js\n([\s\S]*?)^```$/gm)].map((m) => m[1]).find((b) => b.includes(`from '${pkg}'`));
  if (!block) throw new Error(`README has no \`\`\`js block importing ${pkg}`);
  return block;
}

function manifestTargets(pkg: Record<string, unknown>): string[] {
  const out: string[] = [];
  const walk = (x: unknown): void => {
    if (typeof x === 'string') out.push(x);
    else if (x && typeof x === 'object') Object.values(x).forEach(walk);
  };
  walk(pkg.exports);
  walk(pkg.bin);
  for (const k of ['main', 'types']) if (typeof pkg[k] === 'string') out.push(pkg[k] as string);
  return [...new Set(out.map((p) => p.replace(/^\.\//, '')))];
}

beforeAll(() => {
  // The tarballs hold dist/: bring it up to date (incremental; turbo built it already under npm test).
  const tsc = join(dirname(createRequire(import.meta.url).resolve('typescript/package.json')), 'bin/tsc');
  const projects = ['engine', 'nixl-pull', 'nixl-push', 'mooncake'].map((p) => join(ROOT, 'packages', p, 'tsconfig.json'));
  const r = spawnSync(process.execPath, [tsc, '--build', ...projects], { encoding: 'utf8', timeout: 120_000 });
  if (r.status !== 0) throw new Error(`tsc --build failed:\n${`${r.stdout}${r.stderr}`.slice(-4000)}`);
  // Outside the monorepo: no workspace, no root package.json above it.
  tmp = mkdtempSync(join(realpathSync(tmpdir()), 'kvconnect-pack-'));
}, 180_000);

// Removing the install (every package, the addon's build folder) takes a while on a loaded machine.
afterAll(() => {
  if (tmp && !process.env.KVCONNECT_KEEP_PACK_TMP) rmSync(tmp, { recursive: true, force: true });
}, 120_000);

describe('npm packages', () => {
  it('every package packs with the files its manifest names, a README and a license', () => {
    const packed = packPackages(join(tmp, 'dry'), PUBLISHED, { dryRun: true });
    expect(packed.map((p) => p.name).sort()).toEqual([...PUBLISHED].sort());
    for (const p of packed) {
      const dir = p.name === '@kvconnect/native' ? 'native' : `packages/${p.name.slice('@kvconnect/'.length)}`;
      const pkg = JSON.parse(readFileSync(join(ROOT, dir, 'package.json'), 'utf8')) as Record<string, unknown>;
      const files = new Set(p.files.map((f) => f.path));
      const missing = manifestTargets(pkg).filter((t) => !files.has(t));
      expect({ name: p.name, missing }).toEqual({ name: p.name, missing: [] });
      expect(files.has('README.md'), `${p.name} ships README.md`).toBe(true);
      // Not on the registry: the README installs from the tarballs of `npm run pack:all`.
      const readme = readFileSync(join(ROOT, dir, 'README.md'), 'utf8');
      expect(readme, `${p.name} README`).not.toMatch(/npm (install|i) +@kvconnect\//);
      expect(readme, `${p.name} README`).toContain('npm install /path/to/kvconnect/packs/*.tgz');
      expect([...files].some((f) => f.endsWith('.tsbuildinfo')), `${p.name} ships no .tsbuildinfo`).toBe(false);
      expect(pkg).toMatchObject({ version: '0.1.0', license: 'Apache-2.0', engines: { node: '>=20.19' } });
      expect(typeof pkg.description).toBe('string');
      // Workspace dependencies at their exact version.
      for (const [dep, v] of Object.entries((pkg.dependencies ?? {}) as Record<string, string>)) if (dep.startsWith('@kvconnect/')) expect(v, `${p.name} -> ${dep}`).toBe('0.1.0');
    }
  });

  it('the root allowScripts covers every install script of the workspace install (npm ci warns of none)', () => {
    // Workspace packages (@kvconnect/native's addon build) are the project's own and always run;
    // third-party install scripts need an entry (`npm ci` warns of those without one).
    const r = spawnSync('npm', ['install-scripts', 'ls'], { cwd: ROOT, env: cleanEnv(), encoding: 'utf8', timeout: 60_000 });
    expect(r.status, `${r.stdout}${r.stderr}`).toBe(0);
    expect(r.stdout).toMatch(/^No packages with unreviewed install scripts\./m);
  });

  it('examples/custom-connector installs the packed tarballs outside the monorepo and verifies P/D through its own connector', () => {
    const t0 = Date.now();
    const packs = join(tmp, 'packs');
    const packed = packPackages(packs, PUBLISHED);
    const tarball = new Map(packed.map((p) => [p.name, `file:${join(packs, p.filename)}`]));
    const app = join(tmp, 'app');
    for (const f of ['package.json', 'index.js', 'loopback-connector.js', 'README.md']) cpSync(join(EXAMPLE, f), join(app, f));
    const pkg = JSON.parse(readFileSync(join(app, 'package.json'), 'utf8')) as { dependencies: Record<string, string>; allowScripts?: Record<string, boolean> };
    expect(Object.keys(pkg.dependencies).sort()).toEqual([...EXAMPLE_DEPS].sort());
    // Every package, as the READMEs install them (npm install packs/*.tgz).
    for (const name of PUBLISHED) pkg.dependencies[name] = tarball.get(name)!;
    // npm 11 matches a tarball's allowScripts key only by its absolute `file:` path (what
    // `npm install-scripts approve @kvconnect/native` writes); a relative `file:packs/...` is not matched.
    // The third-party entries as in the root package.json (zeromq and msgpackr-extract ship prebuilt binaries).
    const rootPolicy = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { allowScripts: Record<string, boolean> }).allowScripts;
    pkg.allowScripts = { ...rootPolicy, [tarball.get('@kvconnect/native')!]: true };
    writeFileSync(join(app, 'package.json'), `${JSON.stringify(pkg, null, 2)}\n`);
    const tPack = Date.now() - t0;

    // Every package plus the addon build: 2-3 min on a loaded 2-core machine.
    const install = spawnSync('npm', ['install', '--no-audit', '--no-fund', '--prefer-offline'], { cwd: app, env: cleanEnv(), encoding: 'utf8', timeout: 360_000 });
    expect(install.status, `npm install failed${install.error ? ` (${install.error.message})` : ''}:\n${install.stdout}\n${install.stderr}`.slice(-6000)).toBe(0);
    const tInstall = Date.now() - t0 - tPack;
    const uncovered = `${install.stdout}${install.stderr}`.split('\n').filter((l) => l.includes('install-scripts'));
    expect(uncovered, 'npm warns of install scripts allowScripts does not cover').toEqual([]);
    // Real copies from the tarballs, not links into the monorepo, each with what its exports name.
    for (const name of EXAMPLE_DEPS) {
      const dir = join(app, 'node_modules', name);
      expect(lstatSync(dir).isSymbolicLink(), `${name} is a link`).toBe(false);
      const manifest = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as Record<string, unknown>;
      for (const target of manifestTargets(manifest)) expect(existsSync(join(dir, target)), `${name}: ${target}`).toBe(true);
    }
    expect(existsSync(join(app, 'node_modules/@kvconnect/engine/node_modules/@kvconnect/core')), 'one copy of @kvconnect/core').toBe(false);

    const run = spawnSync(process.execPath, ['index.js'], { cwd: app, env: cleanEnv(), encoding: 'utf8', timeout: 60_000 });
    const out = `${run.stdout}\n${run.stderr}`;
    expect(run.status, out).toBe(0);
    expect(run.stdout).toMatch(/^verified: 3\/3 P\/D loads through LoopbackConnector verified by KV checksums, 1\/1 corrupted load caught and recomputed/m);
    if (process.env.KVCONNECT_REQUIRE_NATIVE === '1') expect(run.stdout).toMatch(/^checksum backend: native/m);
    console.log(`custom-connector example: pack ${tPack} ms, npm install ${tInstall} ms, run ${Date.now() - t0 - tPack - tInstall} ms`);

    // The README's checksum snippet, as the .mjs file it says to save (Node 20 runs no TypeScript).
    const snippet = readmeSnippet(readFileSync(join(ROOT, 'README.md'), 'utf8'), '@kvconnect/checksum');
    writeFileSync(join(app, 'readme-snippet.mjs'), snippet);
    const sn = spawnSync(process.execPath, ['readme-snippet.mjs'], { cwd: app, env: cleanEnv(), encoding: 'utf8', timeout: 60_000 });
    expect(sn.status, `README snippet:\n${sn.stdout}\n${sn.stderr}`).toBe(0);
    expect(sn.stdout).toMatch(/^block values of TP rank 0: 3 blocks/m);

    // A TypeScript consumer importing every entry of every package, under each supported resolution.
    const entries = PUBLISHED.flatMap((name) => {
      const manifest = JSON.parse(readFileSync(join(app, 'node_modules', name, 'package.json'), 'utf8')) as { exports: Record<string, unknown> };
      return Object.keys(manifest.exports).filter((k) => k !== './package.json').map((k) => (k === '.' ? name : `${name}/${k.slice(2)}`));
    });
    expect(entries).toContain('@kvconnect/engine/testing');
    const tsc = join(dirname(createRequire(import.meta.url).resolve('typescript/package.json')), 'bin/tsc');
    for (const [resolution, module] of [['node16', 'node16'], ['bundler', 'esnext']] as const) {
      const dir = join(app, `types-${resolution}`);
      mkdirSync(dir);
      writeFileSync(join(dir, 'package.json'), '{ "type": "module" }\n');
      writeFileSync(join(dir, 'tsconfig.json'), JSON.stringify({ compilerOptions: { module, moduleResolution: resolution, target: 'es2022', strict: true, noEmit: true, skipLibCheck: true, types: [] }, files: ['index.ts'] }));
      // `import *` of an entry TypeScript cannot resolve, or resolves to JS without types, is an error (TS2307 / TS7016).
      writeFileSync(join(dir, 'index.ts'), `${entries.map((e, i) => `import * as m${i} from '${e}';`).join('\n')}\nexport const all: object[] = [${entries.map((_, i) => `m${i}`).join(', ')}];\n`);
      const r = spawnSync(process.execPath, [tsc, '-p', dir], { cwd: dir, env: cleanEnv(), encoding: 'utf8', timeout: 120_000 });
      expect(r.status, `tsc moduleResolution ${resolution}:\n${r.stdout}${r.stderr}`).toBe(0);
    }
  }, 540_000);
});

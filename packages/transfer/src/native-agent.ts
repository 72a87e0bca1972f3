/**
 * What the agents over the native addon's run-time-loaded libraries (NIXL, Mooncake) share: the
 * library search order, loading the addon's bindings, and loading the library through them.
 * @module
 */
import { createRequire } from 'node:module';

/**
 * The library paths to try, in order: `$<envLibrary>`; under `$<envPrefix>` (`lib/`,
 * `lib/<arch>-linux-gnu/`, `lib64/`); the bare name (library path); without `$<envPrefix>`, under
 * `defaultPrefix` when there is one.
 */
export function libraryCandidates(
  env: NodeJS.ProcessEnv,
  spec: { readonly lib: string; readonly envLibrary: string; readonly envPrefix: string; readonly defaultPrefix?: string },
): string[] {
  const out: string[] = [];
  const triplet = process.arch === 'arm64' ? 'aarch64-linux-gnu' : 'x86_64-linux-gnu';
  const underPrefix = (p: string) => [`${p}/lib/${spec.lib}`, `${p}/lib/${triplet}/${spec.lib}`, `${p}/lib64/${spec.lib}`];
  const library = env[spec.envLibrary];
  const prefix = env[spec.envPrefix];
  if (library) out.push(library);
  if (prefix) out.push(...underPrefix(prefix.replace(/\/+$/, '')));
  out.push(spec.lib);
  if (!prefix && spec.defaultPrefix) out.push(...underPrefix(spec.defaultPrefix));
  return out;
}

/** The addon's bindings of one library, or why there are none. */
export interface NativeBindings<T> {
  readonly b: T | null;
  readonly reason: string;
}

const bindingsCache = new Map<string, NativeBindings<unknown>>();

/**
 * The addon's `key` bindings (`require('@kvconnect/native').addon[key]`), loaded once per process.
 * @param what how a missing `key` is named in the reason (`transfer`, `Mooncake`).
 */
export function nativeBindings<T>(key: string, what: string): NativeBindings<T> {
  const cached = bindingsCache.get(key);
  if (cached) return cached as NativeBindings<T>;
  let r: NativeBindings<T>;
  try {
    const mod = createRequire(import.meta.url)('@kvconnect/native') as { addon: Record<string, unknown> | null; loadError: Error | null };
    if (!mod.addon) r = { b: null, reason: `the native addon is not built or failed to load (${mod.loadError?.message ?? 'no reason given'})` };
    else if (!mod.addon[key]) r = { b: null, reason: `the native addon has no ${what} bindings (rebuild it: cd native && node scripts/install.cjs)` };
    else r = { b: mod.addon[key] as T, reason: '' };
  } catch (e) {
    r = { b: null, reason: `cannot load @kvconnect/native: ${e instanceof Error ? e.message : String(e)}` };
  }
  bindingsCache.set(key, r);
  return r;
}

/**
 * Loads a library through the addon's `load(candidates)` binding.
 * @returns the path that loaded.
 * @throws Error `<label> not available: ...` with the reason, or listing every path tried and why it failed.
 */
export function loadNativeLibrary<T>(
  bindings: NativeBindings<T>,
  label: string,
  candidates: string[],
  load: (b: T, candidates: string[]) => { ok: boolean; path: string | null; tried: string[] },
): string {
  const { b, reason } = bindings;
  if (!b) throw new Error(`${label} not available: ${reason}`);
  const r = load(b, candidates);
  if (!r.ok || !r.path) throw new Error(`${label} not available: tried ${r.tried.join('; ')}`);
  return r.path;
}

/** Groups the addon's flat `takeNotifs()` result ([name, Buffer, name, Buffer, ...]) by sender, decoding each payload. */
export function groupNotifs(flat: Array<string | Buffer>, decode: (b: Buffer) => Uint8Array): Map<string, Uint8Array[]> {
  const out = new Map<string, Uint8Array[]>();
  for (let i = 0; i + 1 < flat.length; i += 2) {
    const who = flat[i] as string;
    let l = out.get(who);
    if (!l) out.set(who, (l = []));
    l.push(decode(flat[i + 1] as Buffer));
  }
  return out;
}

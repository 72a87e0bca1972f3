/**
 * What the agents over the native addon's run-time-loaded libraries (NIXL, Mooncake) share: the
 * library search order, the addon's bindings (from its one loader, native/index.cjs), and loading
 * the library through them.
 * @module
 */
import { bindings, type KvconnectNativeAddon } from '@kvconnect/native';

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

/** The addon's `key` bindings through the addon's one loader (`bindings` of @kvconnect/native). */
export function nativeBindings<K extends 'transfer' | 'mooncake'>(key: K, what: string): NativeBindings<NonNullable<KvconnectNativeAddon[K]>> {
  const r = bindings(key, what);
  return { b: r.bindings, reason: r.reason };
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

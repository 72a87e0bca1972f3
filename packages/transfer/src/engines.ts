/**
 * The transfer engines a connector can move KV with, by name (`--transfer` of `kvconnect demo`,
 * `transfer` of a scenario, `kv_connector_extra_config.backend` of the connectors): `embedded`
 * (the {@link EmbeddedAgent}, plain Node over TCP, always there), `nixl` (NIXL's
 * `libnixl_capi.so`, {@link NixlAgent}) and `mooncake` (the Mooncake Transfer Engine's
 * `libtransfer_engine.so`, {@link MooncakeAgent}); and the one-line reason why a library engine
 * cannot be used here, naming what to install and the variable that points at it.
 * @module
 */
import { loadMooncakeLibrary } from './mooncake.js';
import { loadNixlLibrary } from './nixl.js';

/** The transfer engines by name. */
export const TRANSFER_ENGINES = ['embedded', 'nixl', 'mooncake'] as const;
/** A transfer engine name. */
export type TransferEngine = (typeof TRANSFER_ENGINES)[number];

/** Whether `x` names a transfer engine. */
export function isTransferEngine(x: unknown): x is TransferEngine {
  return typeof x === 'string' && (TRANSFER_ENGINES as readonly string[]).includes(x);
}

/** What a library engine needs: the library file, the project to install and the variables that point at it. */
export const TRANSFER_ENGINE_LIBRARIES: Readonly<Record<Exclude<TransferEngine, 'embedded'>, { readonly library: string; readonly install: string; readonly prefixEnv: string; readonly libraryEnv: string }>> = Object.freeze({
  nixl: { library: 'libnixl_capi.so', install: 'NIXL (https://github.com/ai-dynamo/nixl, with its UCX plugin)', prefixEnv: 'NIXL_PREFIX', libraryEnv: 'NIXL_LIBRARY' },
  mooncake: { library: 'libtransfer_engine.so', install: 'the Mooncake Transfer Engine (https://github.com/kvcache-ai/Mooncake, mooncake-transfer-engine)', prefixEnv: 'MOONCAKE_PREFIX', libraryEnv: 'MOONCAKE_LIBRARY' },
});

/**
 * Why `engine` cannot be used in this process, as one line, or null when its library loads
 * (`embedded`: always null). The line names the library, what to install and the variable that
 * points at the install (`NIXL_PREFIX` / `MOONCAKE_PREFIX`, or the library file itself in
 * `NIXL_LIBRARY` / `MOONCAKE_LIBRARY`), then the loader's reason (every path tried, from
 * {@link loadNixlLibrary} / {@link loadMooncakeLibrary}). Loading the library is the check: it
 * stays loaded (once per path per process), as an agent would load it.
 * @param options.library an explicit library path (the connectors' `nixl_library`), instead of the search.
 */
export function transferEngineUnavailable(engine: TransferEngine, options: { library?: string; env?: NodeJS.ProcessEnv } = {}): string | null {
  if (engine === 'embedded') return null;
  const spec = TRANSFER_ENGINE_LIBRARIES[engine];
  try {
    if (engine === 'nixl') loadNixlLibrary(options);
    else loadMooncakeLibrary(options);
    return null;
  } catch (e) {
    const why = (e instanceof Error ? e.message : String(e)).replace(/\s*\n\s*/g, ' ').replace(/^(NIXL|Mooncake Transfer Engine) not available: /, '');
    const env = options.env ?? process.env;
    const set = env[spec.prefixEnv] ? ` (${spec.prefixEnv}=${env[spec.prefixEnv]} is set, but the library does not load there)` : '';
    return `transfer engine ${engine}: ${spec.library} cannot be loaded${set}; install ${spec.install} and set ${spec.prefixEnv} to its install prefix (or ${spec.libraryEnv} to the library file); ${why}`;
  }
}

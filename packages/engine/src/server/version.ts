/**
 * The version the servers report on `GET /version`: `@kvconnect/engine`'s package.json version
 * (read at load; `src/server` and `dist/server` are both two levels below it).
 * @module
 */
import { createRequire } from 'node:module';

/** `@kvconnect/engine`'s version (semver string). */
export const KVCONNECT_VERSION: string = (createRequire(import.meta.url)('../../package.json') as { version: string }).version;

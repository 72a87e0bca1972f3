/** Types of pack-packages.mjs. */
export interface PackedPackage {
  name: string;
  version: string;
  filename: string;
  size: number;
  entryCount: number;
  files: Array<{ path: string; size: number }>;
}
/** Names of the workspace packages (native/ and packages/*). */
export function workspaceNames(): string[];
/** Runs `npm pack` for `names` into `dest` (one npm process); with `dryRun`, nothing is written. */
export function packPackages(dest: string, names?: readonly string[], options?: { dryRun?: boolean }): PackedPackage[];

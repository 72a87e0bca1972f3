/**
 * Producer side of sub-block values (docs/checksum-extensions.md section 1): when the checksum
 * scheduler names a `subBlockSize` S for a group of a send entry (the consumer's block size, from
 * the request's `kv_transfer_params`, when it divides the producer's), the worker also sums that
 * group's blocks as sub-blocks of S tokens and reports them in `ReportGroup.sub`.
 *
 * One {@link BlockChecksummer} per (group, S) over the shifted views of `subBlockGroupSpecs`
 * (@kvconnect/checksum sub-blocks.ts), built on first use and kept. Host memory only: on device
 * regions nothing is added (the consumer then reports `unaligned-prefix`, as without the extension).
 * @module
 */
import {
  BlockChecksummer,
  subBlockGroupSpecs,
  sumSubBlocks,
  type BlockChecksummerBackend,
  type WorkerGroupRecord,
} from '@kvconnect/checksum';
import type { WorkerKVCaches } from './connector.js';
import type { ReportEntry, StepEntry } from './checksum-report.js';

/** Sub-block sums of one worker's producer side. */
export class SubBlockSums {
  private readonly summers = new Map<string, BlockChecksummer | null>();
  private readonly groupIndex = new Map<number, number>();

  /**
   * @param caches - the worker's caches (as registered).
   * @param backend - a host backend (`auto`, `ts`, `native` or an object); device backends are not used.
   */
  constructor(
    private readonly caches: WorkerKVCaches,
    private readonly backend: BlockChecksummerBackend,
  ) {
    caches.groups.forEach((g, i) => this.groupIndex.set(g.groupId, i));
  }

  private summer(groupIdx: number, S: number): BlockChecksummer | null {
    const key = `${groupIdx}:${S}`;
    if (!this.summers.has(key)) {
      const specs = subBlockGroupSpecs(this.caches.groups[groupIdx], S);
      let s: BlockChecksummer | null = null;
      if (specs !== null) {
        try {
          s = new BlockChecksummer(specs, { tpRank: this.caches.rank.tpRank, tpSize: this.caches.rank.tpSize, role: 'producer' }, this.caches.regions, this.backend);
        } catch {
          s = null; // device regions, or a backend that cannot sum them
        }
      }
      this.summers.set(key, s);
    }
    return this.summers.get(key)!;
  }

  /**
   * Adds `sub` to every group of `out` (the report entries of `entries`, same order) whose step
   * entry names a `subBlockSize`. A worker holding no cache of the group (another PP stage) reports
   * empty partials; a group whose caches cannot be split gets no `sub`.
   */
  attach(entries: readonly StepEntry[], out: ReportEntry[]): void {
    entries.forEach((e, i) => {
      e.groups.forEach((g, j) => {
        const S = g.subBlockSize;
        if (S === undefined) return;
        const rep = out[i]?.groups[j];
        const idx = this.groupIndex.get(g.groupId);
        if (!rep || rep.skipped || idx === undefined) return;
        const spec = this.caches.groups[idx];
        const bp = this.caches.groupConfigs[idx]?.blockSize ?? 0;
        if (!(S > 0 && bp > S && bp % S === 0)) return;
        const k = bp / S;
        if (spec.caches.length === 0) {
          rep.sub = { blockSize: S, start: g.start * k, nBlocks: g.blockIds.length * k, skipped: false, partials: new Map() };
          return;
        }
        const summer = this.summer(idx, S);
        if (summer === null) return;
        const mask = g.sample ? Uint8Array.from(g.blockIds, (_, b) => (g.sample!.includes(b) ? 1 : 0)) : undefined;
        const run = { blockIds: g.blockIds, start: g.start, numTokens: e.numTokens, ...(mask ? { mask } : {}) };
        const rec: WorkerGroupRecord = sumSubBlocks(summer, run, k);
        if (!rec.skipped) rep.sub = { blockSize: S, ...rec };
      });
    });
  }
}

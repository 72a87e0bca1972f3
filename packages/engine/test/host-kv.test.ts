/**
 * Host KV memory of a worker (WorkerOptions.hostKv): from shared mappings by default where the
 * addon has them (so that the embedded agent moves it to a peer on this host by direct copies),
 * heap memory with `heap`. Skipped (with the reason) where there are no shared mappings.
 */
import { describe, expect, it } from 'vitest';
import { lookupShared, SharedHostArena } from '@kvconnect/transfer';
import { buildGroupConfigs } from '../src/engine.js';
import { resolveModel } from '../src/model/config.js';
import { Worker, type WorkerOptions } from '../src/worker.js';

const probe = new SharedHostArena();
const skip = probe.shared ? null : `no shared mappings here: ${probe.reason}`;

function worker(extra: Partial<WorkerOptions>): Worker {
  const m = resolveModel('dense-gqa');
  return new Worker({ model: m, tpRank: 0, tpSize: 1, ppRank: 0, ppSize: 1, numBlocks: 16, blockSize: 16, cacheLayout: { layout: 'NHD', kvLayout: 'kv-first' }, kvDtype: 'bfloat16', groupConfigs: buildGroupConfigs(m, 16), ...extra });
}

describe('worker host KV memory', () => {
  it.skipIf(!!skip)(`comes from shared mappings by default, zeroed${skip ? ` (skipped: ${skip})` : ''}`, () => {
    const w = worker({});
    expect(w.regions.length).toBeGreaterThan(0);
    for (const r of w.regions) {
      expect(lookupShared(r)).not.toBeNull();
      expect(r.every((b) => b === 0)).toBe(true);
    }
  });

  it('is heap memory with hostKv: heap', () => {
    const w = worker({ hostKv: 'heap' });
    for (const r of w.regions) expect(lookupShared(r)).toBeNull();
  });
});

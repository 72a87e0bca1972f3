/**
 * Shared by `corrupt-region` and `transport-error`: the byte runs and blocks a region selector
 * picks out of a load (attention cells by group / layers / heads / tokens / part; state rows by
 * states and conv segments).
 * @module
 */
import { loadBlockIds, type WorkerKVCaches } from '@kvconnect/core';
import type { FaultSpec } from '../../faults.js';
import { forEachAttentionCell, forEachStateRow } from '../../locate.js';
import type { LoadMeta, Tagged } from '../bytes.js';

/** A fault with region fields. */
export type RegionSpec = Extract<FaultSpec, { kind: 'corrupt-region' | 'transport-error' }>;

/** The byte runs of the load that `f` selects on this worker. */
export function regionRuns(c: WorkerKVCaches, f: RegionSpec, l: LoadMeta): Tagged[] {
  const out: Tagged[] = [];
  const stateOnly = f.states !== undefined || f.segments !== undefined;
  const isState = (gid: number | undefined) => gid !== undefined && c.groupConfigs.find((g) => g.groupId === gid)?.kind === 'state';
  if (!stateOnly && !isState(f.group)) {
    forEachAttentionCell(c, l.blocks, l.firstToken, l.numTokens, { group: f.group, layers: f.layers, heads: f.heads, tokens: f.tokens, part: f.part }, (x) =>
      out.push({ region: x.region, addr: x.addr, len: x.len, groupId: x.groupId, token: x.token }),
    );
  }
  if (stateOnly || f.group === undefined || isState(f.group)) {
    const states = f.states?.map((s) => (s === 'conv' ? 0 : 1));
    const segments = f.segments?.map((s) => ({ x: 0, B: 1, C: 2 })[s]);
    forEachStateRow(c, l.blocks, { group: f.group, layers: f.layers, states, segments: segments && !states?.includes(1) ? segments : undefined }, (r) => {
      if (segments && r.state === 0 && !segments.includes(r.segment)) return;
      for (const e of r.elems) out.push({ ...e, groupId: r.groupId, token: -1 });
    });
  }
  return out;
}

/** The block ids of the load that `f` selects (every group of `f.group`; state groups: the running-state block). */
export function regionBlocks(c: WorkerKVCaches, f: RegionSpec, l: LoadMeta): Set<number> {
  const groups = c.groupConfigs.map((g) => (f.group === undefined || f.group === g.groupId ? g : null));
  return new Set(loadBlockIds(groups, l.blocks, Math.max(l.firstToken, f.tokens?.[0] ?? 0), Math.min(l.numTokens, (f.tokens?.[1] ?? Infinity) + 1)));
}

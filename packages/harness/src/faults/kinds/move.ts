/**
 * Shared by `misplaced-block` and `misplaced-tokens`: tokens of a load get the cells of other
 * positions of the same request (all read before any is written).
 * @module
 */
import { partAddress } from '@kvconnect/engine';
import { forEachAttentionCell } from '../../locate.js';
import { writeRuns, type LoadMeta, type Tagged } from '../bytes.js';
import type { FaultCaches } from '../kv-bytes.js';
import type { ChangedGroup } from '../records.js';

/** Tokens `range` (clipped to the load) of group `groupId` get the cells of token `t + sourceOffset` (zeros where there is none). */
export function moveTokens(c: FaultCaches, l: LoadMeta, groupId: number, range: readonly [number, number], sourceOffset: number): ChangedGroup[] {
  const writes: Array<[Tagged, Uint8Array]> = [];
  forEachAttentionCell(c, l.blocks, l.firstToken, l.numTokens, { group: groupId, tokens: range }, (x) => {
    const src = x.token + sourceOffset;
    const B = x.view.blockSize;
    const block = l.blocks[x.groupIndex]?.[Math.floor(src / B)];
    let bytes: Uint8Array;
    if (src < 0 || block === undefined || block < 0) bytes = new Uint8Array(x.len);
    else {
      const a = partAddress(x.view.parts[x.part], B, block, x.localHead, src % B);
      bytes = c.bytes.read(x.region, a, x.len);
    }
    writes.push([{ region: x.region, addr: x.addr, len: x.len, groupId: x.groupId, token: x.token }, bytes]);
  });
  return writeRuns(c, writes);
}

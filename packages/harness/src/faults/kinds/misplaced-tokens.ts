/**
 * `misplaced-tokens`: tokens `[a, b]` of a load hold the cells of tokens `[a + sourceOffset,
 * b + sourceOffset]` (consumer, after the load; field: an off-by-n in the token-to-slot mapping).
 * @module
 */
import type { FaultSpec } from '../../faults.js';
import { groupIndex } from '../bytes.js';
import type { Fault } from '../fault.js';
import { moveTokens } from './move.js';

/** The spec of misplaced tokens. */
export type MisplacedTokensSpec = Extract<FaultSpec, { kind: 'misplaced-tokens' }>;

/** A `misplaced-tokens` fault. */
export function misplacedTokensFault(spec: MisplacedTokensSpec, index: number): Fault<MisplacedTokensSpec> {
  return {
    spec,
    index,
    needsSnapshot: false,
    consumerLoad({ caches, load }) {
      const gi = groupIndex(caches, spec.group, 'attention');
      if (gi < 0) return null;
      const [a, b] = spec.tokens;
      const o = spec.sourceOffset;
      return { changed: moveTokens(caches, load, caches.groupConfigs[gi].groupId, spec.tokens, o), detail: `tokens ${a}-${b} <- tokens ${a + o}-${b + o}` };
    },
  };
}

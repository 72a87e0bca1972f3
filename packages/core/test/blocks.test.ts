/**
 * `loadBlockIds`: the blocks a load of tokens [firstToken, numTokens) touches (attention: the
 * blocks holding those tokens, never a prefix hit's whole blocks; state: the running-state block),
 * each once, null blocks left out; groups given as null are left out. Expected ids are written out.
 */
import { describe, expect, it } from 'vitest';
import { loadBlockIds } from '../src/index.js';

const full = { kind: 'full-attention', blockSize: 4 } as const;
const swa = { kind: 'sliding-window', blockSize: 2 } as const;
const state = { kind: 'state', blockSize: 16 } as const;

describe('loadBlockIds', () => {
  it('attention: the blocks of the loaded tokens; a prefix hit of whole blocks is not named', () => {
    // tokens [4, 10) at B=4: positions 1, 2 (tokens 4-7, 8-9).
    expect(loadBlockIds([full], [[10, 11, 12, 13]], 4, 10)).toEqual([11, 12]);
    // tokens [5, 10): position 1 holds token 5, so it is named too.
    expect(loadBlockIds([full], [[10, 11, 12, 13]], 5, 10)).toEqual([11, 12]);
    expect(loadBlockIds([full], [[10, 11, 12, 13]], 0, 16)).toEqual([10, 11, 12, 13]);
  });

  it('clips to the table, leaves out null blocks, names each id once', () => {
    expect(loadBlockIds([full], [[10, 11]], 0, 16)).toEqual([10, 11]);
    expect(loadBlockIds([swa], [[-1, -1, 7, 8]], 0, 8)).toEqual([7, 8]);
    expect(loadBlockIds([full, full], [[3, 4], [4, 5]], 0, 8)).toEqual([3, 4, 5]);
  });

  it('state: the running-state block (the last id), whatever the token range', () => {
    expect(loadBlockIds([full, state], [[1, 2, 3], [9, 42]], 4, 12)).toEqual([2, 3, 42]);
    expect(loadBlockIds([state], [[-1]], 0, 4)).toEqual([]);
    expect(loadBlockIds([state], [[]], 0, 4)).toEqual([]);
  });

  it('a null group is left out; an empty token range names no attention block', () => {
    expect(loadBlockIds([null, full], [[1, 2], [3, 4]], 0, 8)).toEqual([3, 4]);
    expect(loadBlockIds([full, state], [[1, 2], [5]], 6, 5)).toEqual([5]);
  });
});

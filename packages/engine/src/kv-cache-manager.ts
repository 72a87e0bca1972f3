/**
 * The KV cache manager: a block pool shared by every KV cache group, block tables per request and
 * group, and prefix caching by block hash (chained SHA-256 of full blocks of token ids, per group;
 * free cached blocks are reused in LRU order and lose their hash when reallocated).
 *
 * Token-based groups (full attention, sliding window) hold `ceil(tokens / blockSize)` blocks per
 * request (this engine keeps out-of-window blocks of sliding-window groups); state groups hold one
 * running-state block per request. Prefix caching covers token-based groups only; a model with a
 * state group never gets a prefix hit (its running state is not cached per prefix).
 * @module
 */
import { createHash } from 'node:crypto';
import type { KVCacheGroupConfig } from './contracts.js';

/** Hash of a full block: SHA-256 over the parent's hash and the block's token ids (hex). */
export function blockHash(parent: string | null, tokens: readonly number[]): string {
  const h = createHash('sha256');
  h.update(parent ?? 'root');
  h.update(Uint32Array.from(tokens));
  return h.digest('hex');
}

/** Chained hashes of the full blocks of `tokens` (block `i` covers `[i*B, (i+1)*B)`). */
export function blockHashes(tokens: readonly number[], blockSize: number, from: readonly string[] = []): string[] {
  const out = from.slice();
  for (let i = out.length; (i + 1) * blockSize <= tokens.length; i++) out.push(blockHash(i === 0 ? null : out[i - 1], tokens.slice(i * blockSize, (i + 1) * blockSize)));
  return out;
}

/**
 * A pool of `numBlocks` block ids with reference counts, an LRU free queue and a hash -> block map.
 * Freed blocks go to the tail of the queue; new blocks come from the head (evicting their hash).
 */
export class BlockPool {
  readonly numBlocks: number;
  private readonly ref: Int32Array;
  private readonly prev: Int32Array;
  private readonly next: Int32Array;
  private readonly hashOf: (string | null)[];
  private readonly cached = new Map<string, number>();
  private nFree: number;
  /** Evictions of cached blocks (prefix cache entries dropped for reuse). */
  evictions = 0;

  constructor(numBlocks: number) {
    if (!(Number.isSafeInteger(numBlocks) && numBlocks >= 1)) throw new RangeError(`numBlocks ${numBlocks}`);
    this.numBlocks = numBlocks;
    this.ref = new Int32Array(numBlocks);
    // Doubly linked free list with sentinel `numBlocks`.
    this.prev = new Int32Array(numBlocks + 1);
    this.next = new Int32Array(numBlocks + 1);
    this.hashOf = new Array(numBlocks).fill(null);
    const S = numBlocks;
    this.next[S] = S;
    this.prev[S] = S;
    for (let i = 0; i < numBlocks; i++) this.pushTail(i);
    this.nFree = numBlocks;
  }

  private pushTail(i: number): void {
    const S = this.numBlocks;
    const last = this.prev[S];
    this.next[last] = i;
    this.prev[i] = last;
    this.next[i] = S;
    this.prev[S] = i;
  }

  private unlink(i: number): void {
    this.next[this.prev[i]] = this.next[i];
    this.prev[this.next[i]] = this.prev[i];
    this.next[i] = -1;
    this.prev[i] = -1;
  }

  /** Blocks with no reference (including cached ones that may be evicted). */
  get numFree(): number {
    return this.nFree;
  }

  /** Reference count of block `id`. */
  refCount(id: number): number {
    return this.ref[id];
  }

  /** The hash a block is cached under, or null. */
  hashOfBlock(id: number): string | null {
    return this.hashOf[id];
  }

  /** Takes `n` blocks from the head of the free queue (LRU), evicting their cache entries. */
  allocate(n: number): number[] {
    if (n > this.nFree) throw new RangeError(`need ${n} blocks, ${this.nFree} free`);
    const out: number[] = [];
    const S = this.numBlocks;
    for (let k = 0; k < n; k++) {
      const i = this.next[S];
      this.unlink(i);
      this.nFree--;
      const h = this.hashOf[i];
      if (h !== null) {
        this.cached.delete(h);
        this.hashOf[i] = null;
        this.evictions++;
      }
      this.ref[i] = 1;
      out.push(i);
    }
    return out;
  }

  /** Adds a reference to each block (prefix hits); a free cached block leaves the free queue. */
  touch(ids: readonly number[]): void {
    for (const i of ids) {
      if (this.ref[i] === 0) {
        this.unlink(i);
        this.nFree--;
      }
      this.ref[i]++;
    }
  }

  /** Drops a reference from each block, in order; blocks reaching 0 go to the queue's tail. */
  free(ids: readonly number[]): void {
    for (const i of ids) {
      if (this.ref[i] <= 0) throw new Error(`block ${i} freed twice`);
      if (--this.ref[i] === 0) {
        this.pushTail(i);
        this.nFree++;
      }
    }
  }

  /** Caches block `id` under `key` unless the key is cached already. @returns whether it was cached. */
  cache(id: number, key: string): boolean {
    if (this.cached.has(key) || this.hashOf[id] !== null) return false;
    this.cached.set(key, id);
    this.hashOf[id] = key;
    return true;
  }

  /** The block cached under `key`. */
  lookup(key: string): number | undefined {
    return this.cached.get(key);
  }

  /** Cached blocks now. */
  get numCached(): number {
    return this.cached.size;
  }
}

/** What {@link KVCacheManager.getComputedBlocks} found. */
export interface PrefixHit {
  /** Tokens covered by the hit (a multiple of the block size, < the request's tokens). */
  numTokens: number;
  /** The hit blocks per group (state groups: none). */
  blocks: number[][];
}

/** The request fields the manager needs. */
export interface CacheRequest {
  readonly requestId: string;
  readonly allTokenIds: readonly number[];
}

/** Block tables of requests over a {@link BlockPool}, with prefix caching. */
export class KVCacheManager {
  readonly pool: BlockPool;
  private readonly tables = new Map<string, number[][]>();
  private readonly hashes = new Map<string, string[]>();
  private readonly cachedUpTo = new Map<string, number>();
  /** Requests whose blocks must not be cached ({@link neverCache}). */
  private readonly uncacheable = new Set<string>();
  /** Prefix cache queries and hit tokens (metrics). */
  readonly stats = { queries: 0, queriedTokens: 0, hitTokens: 0 };

  constructor(
    readonly groups: readonly KVCacheGroupConfig[],
    readonly blockSize: number,
    numBlocks: number,
    readonly enablePrefixCaching: boolean,
  ) {
    this.pool = new BlockPool(numBlocks);
  }

  private get hasState(): boolean {
    return this.groups.some((g) => g.kind === 'state');
  }

  private hashesOf(req: CacheRequest): string[] {
    const h = blockHashes(req.allTokenIds, this.blockSize, this.hashes.get(req.requestId) ?? []);
    this.hashes.set(req.requestId, h);
    return h;
  }

  /**
   * The longest prefix of full blocks cached in every token-based group, capped so that at least
   * one token is left to compute (vLLM: hit <= numTokens - 1). Does not take references.
   */
  getComputedBlocks(req: CacheRequest): PrefixHit {
    const empty: PrefixHit = { numTokens: 0, blocks: this.groups.map(() => []) };
    if (!this.enablePrefixCaching || this.hasState) return empty;
    const hs = this.hashesOf(req);
    const maxBlocks = Math.floor((req.allTokenIds.length - 1) / this.blockSize);
    let n = Math.min(maxBlocks, hs.length);
    const per: number[][] = this.groups.map(() => []);
    for (let g = 0; g < this.groups.length; g++) {
      let k = 0;
      while (k < n) {
        const b = this.pool.lookup(`${g}:${hs[k]}`);
        if (b === undefined) break;
        per[g].push(b);
        k++;
      }
      n = Math.min(n, k);
    }
    for (const p of per) p.length = n;
    this.stats.queries++;
    this.stats.queriedTokens += req.allTokenIds.length;
    this.stats.hitTokens += n * this.blockSize;
    return { numTokens: n * this.blockSize, blocks: per };
  }

  /** Blocks a request would need (beyond what it holds and the hit) to hold `totalTokens` tokens. */
  private needed(reqId: string, totalTokens: number, hit: PrefixHit | null): number[] {
    const have = this.tables.get(reqId);
    return this.groups.map((g, i) => {
      const held = (have?.[i].length ?? 0) + (hit?.blocks[i].length ?? 0);
      const want = g.kind === 'state' ? 1 : Math.ceil(totalTokens / this.blockSize);
      return Math.max(0, want - held);
    });
  }

  /**
   * Allocates blocks so the request holds `totalTokens` tokens in every group, first taking the
   * hit's blocks (references added) when given. All or nothing.
   * @returns the request's block table per group, or null when the pool has too few free blocks.
   */
  allocateSlots(req: CacheRequest, totalTokens: number, hit: PrefixHit | null = null): number[][] | null {
    const need = this.needed(req.requestId, totalTokens, hit);
    let touchFree = 0;
    if (hit) for (const bs of hit.blocks) for (const b of bs) if (this.pool.refCount(b) === 0) touchFree++;
    const total = need.reduce((a, b) => a + b, 0);
    if (total + touchFree > this.pool.numFree) return null;
    let table = this.tables.get(req.requestId);
    if (!table) {
      table = this.groups.map(() => []);
      this.tables.set(req.requestId, table);
    }
    if (hit) {
      for (let g = 0; g < this.groups.length; g++) {
        this.pool.touch(hit.blocks[g]);
        table[g].push(...hit.blocks[g]);
      }
      this.cachedUpTo.set(req.requestId, hit.numTokens);
    }
    for (let g = 0; g < this.groups.length; g++) if (need[g] > 0) table[g].push(...this.pool.allocate(need[g]));
    return table;
  }

  /** The request's block table (empty groups when it has none). */
  blocksOf(reqId: string): number[][] {
    return this.tables.get(reqId) ?? this.groups.map(() => []);
  }

  /** True when the request holds blocks. */
  has(reqId: string): boolean {
    return this.tables.has(reqId);
  }

  /**
   * Caches the request's full blocks of its first `numTokens` tokens (token-based groups) under
   * their chained hashes. Call only for tokens whose KV is in the blocks (computed or verified).
   */
  cacheBlocks(req: CacheRequest, numTokens: number): void {
    if (!this.enablePrefixCaching || this.hasState || this.uncacheable.has(req.requestId)) return;
    const table = this.tables.get(req.requestId);
    if (!table) return;
    const from = Math.floor((this.cachedUpTo.get(req.requestId) ?? 0) / this.blockSize);
    const to = Math.floor(Math.min(numTokens, req.allTokenIds.length) / this.blockSize);
    if (to <= from) return;
    const hs = this.hashesOf(req);
    for (let g = 0; g < this.groups.length; g++) {
      if (this.groups[g].kind === 'state') continue;
      for (let i = from; i < to && i < table[g].length; i++) this.pool.cache(table[g][i], `${g}:${hs[i]}`);
    }
    this.cachedUpTo.set(req.requestId, to * this.blockSize);
  }

  /**
   * From now until the request's blocks are freed, {@link cacheBlocks} caches none of them: they
   * hold KV that was not verified (a fail-open load that mismatched or could not be verified), and
   * every later block of the request is computed from it. Blocks cached before (a local prefix hit)
   * stay cached.
   */
  neverCache(reqId: string): void {
    if (this.tables.has(reqId)) this.uncacheable.add(reqId);
  }

  /** Frees the request's blocks (in reverse order, so its tail blocks are evicted first). */
  free(reqId: string): void {
    const table = this.tables.get(reqId);
    this.tables.delete(reqId);
    this.uncacheable.delete(reqId);
    this.hashes.delete(reqId);
    this.cachedUpTo.delete(reqId);
    if (!table) return;
    for (const bs of table) this.pool.free(bs.slice().reverse());
  }

  /** Fraction of blocks in use, 0..1. */
  get usage(): number {
    return 1 - this.pool.numFree / this.pool.numBlocks;
  }
}

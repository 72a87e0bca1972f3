/**
 * The scheduler (vLLM v1 shape): continuous batching under a token budget per step, chunked
 * prefill, preemption by recompute when blocks run out, prefix caching, and the KV connector and
 * KV checksum scheduler hooks at the points `connector.ts` and `checksum-hooks.ts` fix:
 *
 * - `schedule()`: running requests first (decode or the rest of a chunked prefill), then waiting
 *   ones. A new waiting request gets its local prefix hit, then
 *   `connector.getNumNewMatchedTokens(request, hit)`; after allocating,
 *   `connector.updateStateAfterAlloc(request, blocks, external)` and, for an external load,
 *   `checksum.onLoadScheduled(request, blocks, hit, external)`. An async load parks the request in
 *   `WAITING_FOR_REMOTE_KVS`. A request whose load every worker reported in `finishedRecving` is
 *   decided by `checksum.onLoadFinished` (use / fail / recompute). In the step that schedules a
 *   request's last prompt tokens: `checksum.onPromptComplete(request, blocks, tokens)`. Then the
 *   step's `connector.buildConnectorMeta` and `checksum.buildStepMeta`.
 * - `updateFromOutput()`: `checksum.updateFromOutputs`, `connector.updateConnectorOutput`, then
 *   tokens, finishes (`connector.requestFinished`, then `checksum.onRequestFinished` for the
 *   returned params; `delayFree` keeps blocks until every worker reported `finishedSending`),
 *   receive completions and invalid blocks.
 * @module
 */
import type {
  BlockIdsPerGroup,
  FinishReason,
  KVCacheGroupConfig,
  KVChecksumSchedulerHooks,
  KVConnectorOutput,
  KVConnectorScheduler,
  KVTransferParams,
  LoadDecision,
  SchedulerOutput,
} from './contracts.js';
import type { LoadOutcomeEvent } from '@kvconnect/core';
import { KVCacheManager, type PrefixHit } from './kv-cache-manager.js';
import type { Request } from './request.js';

/** Options of a {@link Scheduler}. */
export interface SchedulerOptions {
  groupConfigs: readonly KVCacheGroupConfig[];
  blockSize: number;
  numBlocks: number;
  /** Token budget of one step (prefill chunks and decodes together). */
  maxNumBatchedTokens: number;
  /** Most running requests (default 256). */
  maxNumSeqs?: number;
  /**
   * Most prompt tokens one request gets in a step (vLLM's `long_prefill_token_threshold`,
   * `vllm/v1/core/sched/scheduler.py`): while other requests are unfinished, a longer prefill is
   * chunked at this size, so the rest of the budget serves them in the same step (a request alone
   * keeps the whole budget, unlike vLLM). 0 (default here) = no cap; the engine
   * (`EngineOptions.longPrefillTokenThreshold`) sets its own default.
   */
  longPrefillTokenThreshold?: number;
  enablePrefixCaching: boolean;
  /** TP x PP workers that report each step (transfer completions need all of them). */
  worldSize: number;
  eosTokenId: number;
  connector?: KVConnectorScheduler | null;
  checksum?: KVChecksumSchedulerHooks | null;
  /** `kv_load_failure_policy` for loads with invalid blocks (default `recompute`). */
  loadFailurePolicy?: 'fail' | 'recompute';
  /** Called when a request finishes (after its connector/checksum hooks). */
  onFinished?: (request: Request) => void;
  /** Warnings (load failures, aborted loads). */
  warn?: (msg: string, fields?: Record<string, unknown>) => void;
  /** Called once per finished KV load with what was decided (the engine emits it as `load-outcome`). */
  onLoadOutcome?: (e: LoadOutcomeEvent) => void;
}

/** One request's share of a step. */
export interface ScheduledSegment {
  request: Request;
  /** Position of the first scheduled token. */
  start: number;
  /** Scheduled tokens. */
  numTokens: number;
  /** Token ids at `start ..`. */
  tokenIds: number[];
  blocks: BlockIdsPerGroup;
  /** The request's `cacheFilled` when scheduled. */
  cacheFilled: number;
  /** The step samples a token for the request (its last known token is scheduled). */
  needLogits: boolean;
}

/** What `schedule()` returns: the {@link SchedulerOutput} workers see plus the engine's plan. */
export interface StepPlan extends SchedulerOutput {
  segments: ScheduledSegment[];
  /** Requests preempted in this step. */
  preempted: string[];
}

/** Counters of the scheduler. */
export interface SchedulerStats {
  steps: number;
  preemptions: number;
  scheduledTokens: number;
  loadsUsed: number;
  loadsRecomputed: number;
  loadsFailed: number;
}

/** The engine's scheduler. */
export class Scheduler {
  readonly kv: KVCacheManager;
  readonly requests = new Map<string, Request>();
  waiting: Request[] = [];
  running: Request[] = [];
  readonly stats: SchedulerStats = { steps: 0, preemptions: 0, scheduledTokens: 0, loadsUsed: 0, loadsRecomputed: 0, loadsFailed: 0 };
  /** Requests whose blocks wait for `finishedSending` from every worker (producer delayFree). */
  readonly delayedFree = new Map<string, Set<string>>();
  /** Requests finished (stop/length) whose producer KV checksums are still in flight on a device: their finish waits. */
  readonly finishHeld = new Map<string, Request>();
  private finishedIds = new Set<string>();
  private stepId = 0;
  private readonly o: SchedulerOptions;
  private readonly maxNumSeqs: number;
  /** Per-request token cap of a step (Infinity: none). */
  private readonly chunkCap: number;

  constructor(o: SchedulerOptions) {
    this.o = o;
    this.maxNumSeqs = o.maxNumSeqs ?? 256;
    if (!(o.maxNumBatchedTokens >= 1)) throw new RangeError(`maxNumBatchedTokens ${o.maxNumBatchedTokens}`);
    const cap = o.longPrefillTokenThreshold ?? 0;
    if (!Number.isSafeInteger(cap) || cap < 0) throw new RangeError(`longPrefillTokenThreshold must be an integer >= 0, got ${cap}`);
    this.chunkCap = cap > 0 ? cap : Infinity;
    this.kv = new KVCacheManager(o.groupConfigs, o.blockSize, o.numBlocks, o.enablePrefixCaching);
  }

  private get connector(): KVConnectorScheduler | null {
    return this.o.connector ?? null;
  }

  private get checksum(): KVChecksumSchedulerHooks | null {
    const c = this.o.checksum ?? null;
    return c && c.enabled ? c : null;
  }

  /** Queues a request. */
  addRequest(r: Request): void {
    if (this.requests.has(r.requestId)) throw new Error(`duplicate request id ${r.requestId}`);
    this.requests.set(r.requestId, r);
    this.waiting.push(r);
  }

  /** Unfinished requests (waiting, loading or running). */
  get numUnfinished(): number {
    return this.waiting.length + this.running.length;
  }

  /** Whether a step would do anything: unfinished requests or blocks awaiting `finishedSending`. */
  hasWork(): boolean {
    return this.numUnfinished > 0 || this.delayedFree.size > 0 || this.finishedIds.size > 0 || this.finishHeld.size > 0;
  }

  /** Only transfers are pending (nothing to compute): the engine can poll instead of spinning. */
  onlyWaitingForTransfers(): boolean {
    return this.running.length === 0 && this.waiting.every((r) => r.status === 'WAITING_FOR_REMOTE_KVS' && !this.loadComplete(r));
  }

  private loadComplete(r: Request): boolean {
    // Device checksums: the load also waits for its workers' sums (its verdict), up to their deadline.
    return r.load !== null && r.load.recvWorkers.size >= this.o.worldSize && !(this.checksum?.sumsInFlight?.(r) ?? false);
  }

  /** Builds the next step. */
  schedule(): StepPlan {
    this.stepId++;
    this.stats.steps++;
    const segments: ScheduledSegment[] = [];
    const preempted: string[] = [];
    let budget = this.o.maxNumBatchedTokens;
    const cap = this.numUnfinished > 1 ? this.chunkCap : Infinity;

    // Loads every worker finished: decide them (verification) before scheduling.
    for (const r of this.waiting.slice()) if (r.status === 'WAITING_FOR_REMOTE_KVS' && this.loadComplete(r)) this.finishLoad(r);

    // Running requests first.
    for (let i = 0; i < this.running.length && budget > 0; ) {
      const r = this.running[i];
      const n = Math.min(r.numTokens - r.numComputedTokens, budget, cap);
      if (n <= 0) {
        i++;
        continue;
      }
      let blocks: BlockIdsPerGroup | null = null;
      for (;;) {
        blocks = this.kv.allocateSlots(r, r.numComputedTokens + n);
        if (blocks) break;
        const victim = this.running.pop()!;
        this.preempt(victim);
        preempted.push(victim.requestId);
        if (victim === r) break;
      }
      if (!blocks) break;
      segments.push(this.segment(r, n, blocks));
      budget -= n;
      i++;
    }

    // Waiting requests, when nothing was preempted.
    if (preempted.length === 0) {
      const skipped: Request[] = [];
      while (this.waiting.length > 0 && budget > 0 && this.running.length < this.maxNumSeqs) {
        const r = this.waiting[0];
        if (r.status === 'WAITING_FOR_REMOTE_KVS') {
          skipped.push(this.waiting.shift()!);
          continue;
        }
        let hit: PrefixHit | null = null;
        let external = 0;
        let loadAsync = false;
        const fresh = r.numComputedTokens === 0 && !this.kv.has(r.requestId);
        if (fresh) {
          hit = this.kv.getComputedBlocks(r);
          if (this.connector && !r.connectorAsked) {
            const m = this.connector.getNumNewMatchedTokens(r, hit.numTokens);
            if (m.count === null) {
              skipped.push(this.waiting.shift()!);
              continue;
            }
            external = Math.max(0, Math.min(m.count, r.numTokens - hit.numTokens));
            loadAsync = m.loadAsync && external > 0;
          }
        }
        const local = hit?.numTokens ?? r.numComputedTokens;
        const computed = local + external;
        let n = loadAsync ? 0 : Math.min(r.numTokens - computed, budget, cap);
        // A synchronous load of every token: the last token is recomputed for its logits.
        if (!loadAsync && n <= 0) n = Math.min(1, budget);
        const blocks = this.kv.allocateSlots(r, Math.max(computed, Math.min(r.numTokens, computed + n)), hit);
        if (!blocks) break;
        this.waiting.shift();
        if (fresh && this.connector && !r.connectorAsked) {
          r.connectorAsked = true;
          this.connector.updateStateAfterAlloc(r, blocks, external);
          if (external > 0) this.checksum?.onLoadScheduled(r, blocks, local, external);
        }
        if (loadAsync) {
          r.status = 'WAITING_FOR_REMOTE_KVS';
          r.numComputedTokens = local;
          r.cacheFilled = local;
          r.load = { numLocalTokens: local, numExternalTokens: external, recvWorkers: new Set(), loadError: null };
          skipped.push(r);
          continue;
        }
        if (fresh) r.cacheFilled = computed;
        r.numComputedTokens = Math.min(computed, r.numTokens - n);
        r.status = 'RUNNING';
        this.running.push(r);
        segments.push(this.segment(r, n, blocks));
        budget -= n;
      }
      this.waiting = [...skipped, ...this.waiting];
    }

    // Prompt completion (producer send entries).
    const ck = this.checksum;
    if (ck) {
      for (const s of segments) {
        const P = s.request.promptTokenIds.length;
        if (s.start < P && s.start + s.numTokens >= P) ck.onPromptComplete(s.request, s.blocks, s.start + s.numTokens);
      }
    }

    const numScheduledTokens = new Map<string, number>();
    for (const s of segments) numScheduledTokens.set(s.request.requestId, s.numTokens);
    this.stats.scheduledTokens += segments.reduce((a, s) => a + s.numTokens, 0);
    const finishedRequestIds: ReadonlySet<string> = this.finishedIds;
    this.finishedIds = new Set();
    const base = { stepId: this.stepId, numScheduledTokens, finishedRequestIds };
    const kvConnectorMetadata = this.connector ? this.connector.buildConnectorMeta(base) : null;
    const kvChecksumMetadata = ck ? ck.buildStepMeta() : null;
    return { ...base, kvConnectorMetadata, kvChecksumMetadata, segments, preempted };
  }

  private segment(r: Request, n: number, blocks: BlockIdsPerGroup): ScheduledSegment {
    const start = r.numComputedTokens;
    const all = r.allTokenIds;
    return {
      request: r,
      start,
      numTokens: n,
      tokenIds: all.slice(start, start + n),
      blocks: blocks.map((b) => b.slice()),
      cacheFilled: r.cacheFilled,
      needLogits: start + n >= r.numTokens,
    };
  }

  private preempt(r: Request): void {
    this.kv.free(r.requestId);
    r.status = 'PREEMPTED';
    r.numComputedTokens = 0;
    r.cacheFilled = 0;
    r.numPreemptions++;
    this.stats.preemptions++;
    this.waiting.unshift(r);
  }

  /**
   * Applies the decision on a load every worker finished. A load whose transfer failed is not
   * verified: the checksum scheduler reports it (`transfer-failed`, with its cause) and
   * `kv_load_failure_policy` applies, checksums on or off. KV used without a `verified` verdict
   * (fail-open) never enters the prefix cache.
   */
  private finishLoad(r: Request): void {
    const load = r.load!;
    r.load = null;
    const ck = this.checksum;
    const loadError = load.loadError ?? undefined;
    let decision: LoadDecision = ck ? ck.onLoadFinished(r, loadError) : { action: 'use', verdict: null };
    const checked = decision.verdict;
    if (loadError) {
      const policy = this.o.loadFailurePolicy ?? 'recompute';
      this.o.warn?.(`KV load failed in transit (${loadError.reason})`, { requestId: r.requestId, policy, reason: loadError.reason, detail: loadError.message });
      decision = { action: policy, verdict: null, loadError };
    }
    this.o.onLoadOutcome?.({ requestId: r.requestId, verdict: checked, action: decision.action, reason: loadError ? 'invalid-blocks' : checked ? 'checksum' : 'unchecked' });
    r.status = 'WAITING';
    if (r.abortPending) {
      this.finish(r, 'abort');
      return;
    }
    if (decision.action === 'fail') {
      this.stats.loadsFailed++;
      const why = decision.verdict === null ? `the KV load failed in transit (${decision.loadError.reason}: ${decision.loadError.message})` : `KV checksum ${decision.verdict.verdict}`;
      this.finish(r, 'error', `KV load rejected: ${why}`);
      return;
    }
    if (decision.action === 'recompute') {
      this.stats.loadsRecomputed++;
      r.numComputedTokens = load.numLocalTokens;
      r.cacheFilled = load.numLocalTokens;
      return;
    }
    this.stats.loadsUsed++;
    const total = load.numLocalTokens + load.numExternalTokens;
    r.cacheFilled = total;
    // vLLM: with every token loaded, the last one is recomputed to get its logits.
    r.numComputedTokens = Math.min(total, r.numTokens - 1);
    // Fail-open KV that did not verify (mismatch, unverified) stays out of the prefix cache, and so
    // does every later block of the request (computed from it). No verdict = checksums off: trusted.
    if (decision.verdict !== null && decision.verdict.verdict !== 'verified') this.kv.neverCache(r.requestId);
    this.kv.cacheBlocks(r, total);
  }

  /**
   * Takes a step's results: `sampled` tokens (requests whose segment had `needLogits`) and every
   * worker's connector output.
   * @returns the requests that finished in this update.
   */
  updateFromOutput(plan: StepPlan, sampled: ReadonlyMap<string, number>, outputs: readonly KVConnectorOutput[]): Request[] {
    this.checksum?.updateFromOutputs(outputs);
    this.connector?.updateConnectorOutput(outputs);
    const finished: Request[] = [];
    for (const r of [...this.finishHeld.values()]) {
      if (this.checksum?.sumsInFlight?.(r)) continue;
      this.finishHeld.delete(r.requestId);
      this.finishHooks(r, r.finishReason!);
      finished.push(r);
    }
    for (const s of plan.segments) {
      const r = s.request;
      if (r.isFinished || r.status !== 'RUNNING') continue;
      r.numComputedTokens = s.start + s.numTokens;
      r.cacheFilled = Math.max(r.cacheFilled, r.numComputedTokens);
      this.kv.cacheBlocks(r, r.numComputedTokens);
      if (!s.needLogits) continue;
      const tok = sampled.get(r.requestId);
      if (tok === undefined) continue;
      r.outputTokenIds.push(tok);
      const stop = (!r.sampling.ignoreEos && tok === this.o.eosTokenId) || r.sampling.stopTokenIds.includes(tok);
      if (stop) this.finish(r, 'stop');
      else if (r.outputTokenIds.length >= r.sampling.maxTokens) this.finish(r, 'length');
      if (r.isFinished && !this.finishHeld.has(r.requestId)) finished.push(r);
    }
    for (const out of outputs) {
      const key = `${out.ppRank}:${out.tpRank}`;
      for (const id of out.finishedRecving) {
        const r = this.requests.get(id);
        if (r?.load) r.load.recvWorkers.add(key);
      }
      for (const id of out.finishedSending) {
        const s = this.delayedFree.get(id);
        if (!s) continue;
        s.add(key);
        if (s.size >= this.o.worldSize) {
          this.delayedFree.delete(id);
          this.kv.free(id);
          this.requests.delete(id);
        }
      }
      if (out.invalidBlockIds.size > 0 || (out.loadErrors?.size ?? 0) > 0) {
        for (const r of this.waiting) {
          if (!r.load || r.load.loadError) continue;
          const cause = out.loadErrors?.get(r.requestId);
          const blocks = this.kv.blocksOf(r.requestId);
          if (cause) r.load.loadError = cause;
          else if (blocks.some((g) => g.some((b) => out.invalidBlockIds.has(b)))) {
            r.load.loadError = { reason: 'invalid-blocks', message: `worker ${key} reported invalid blocks (no cause given)` };
          }
        }
      }
    }
    return finished;
  }

  /**
   * Finishes `r`: `connector.requestFinished`, then `checksum.onRequestFinished` (the params to
   * return), then frees its blocks unless the connector keeps them (`delayFree`). A normal finish
   * whose producer checksums are still in flight (`checksum.sumsInFlight`) waits in
   * {@link finishHeld} until they arrive or their deadline passes.
   */
  finish(r: Request, reason: FinishReason, error?: string): void {
    if (r.isFinished) return;
    r.status = 'FINISHED';
    r.finishReason = reason;
    r.error = error;
    this.running = this.running.filter((x) => x !== r);
    this.waiting = this.waiting.filter((x) => x !== r);
    if ((reason === 'stop' || reason === 'length') && this.checksum?.sumsInFlight?.(r)) {
      this.finishHeld.set(r.requestId, r); // finished by updateFromOutput once the sums are in
      return;
    }
    this.finishHooks(r, reason);
  }

  /** The hooks of a finish: connector, checksum params, blocks, `onFinished`. */
  private finishHooks(r: Request, reason: FinishReason): void {
    const blocks = this.kv.blocksOf(r.requestId);
    let delayFree = false;
    let params: KVTransferParams | undefined;
    if (this.connector) {
      const res = this.connector.requestFinished(r, blocks, reason);
      delayFree = res.delayFree;
      params = res.kvTransferParams;
      const ck = this.o.checksum;
      if (ck?.enabled) params = ck.onRequestFinished(r, res, reason);
    }
    r.outputKvTransferParams = params;
    this.finishedIds.add(r.requestId);
    if (delayFree && this.kv.has(r.requestId)) {
      this.delayedFree.set(r.requestId, new Set());
    } else {
      this.kv.free(r.requestId);
      this.requests.delete(r.requestId);
    }
    this.o.onFinished?.(r);
  }

  /**
   * Aborts a request. A request whose remote load is in flight keeps its blocks until the load
   * finishes (workers may still write them), then finishes as `abort`.
   * @returns false when the request is unknown or finished.
   */
  abort(requestId: string): boolean {
    const r = this.requests.get(requestId);
    if (!r || r.isFinished) return false;
    if (r.status === 'WAITING_FOR_REMOTE_KVS') {
      r.abortPending = true;
      return true;
    }
    this.finish(r, 'abort');
    return true;
  }
}

/**
 * Requests and sampling parameters.
 * @module
 */
import type { ConnectorRequest, FinishReason, KVTransferParams, LoadError } from './contracts.js';
import { SeededRng } from './rng.js';

/** Sampling parameters of a request (vLLM `SamplingParams`, the subset this engine implements). */
export interface SamplingParams {
  /** Most tokens to generate (default 16). */
  maxTokens?: number;
  /** 0 (default) = greedy (argmax, lowest id on ties); > 0 = sample from softmax(logits / T). */
  temperature?: number;
  /** Seed of the request's own PRNG (temperature sampling); default 0. */
  seed?: number;
  /** Keep generating past EOS (default false). */
  ignoreEos?: boolean;
  /** Extra token ids that stop generation (the token is kept in the output). */
  stopTokenIds?: readonly number[];
}

/** Where a request is (vLLM `RequestStatus`). */
export type RequestStatus = 'WAITING' | 'WAITING_FOR_REMOTE_KVS' | 'RUNNING' | 'PREEMPTED' | 'FINISHED';

/** A request inside the engine. It is the {@link ConnectorRequest} connectors see. */
export class Request implements ConnectorRequest {
  readonly requestId: string;
  readonly promptTokenIds: readonly number[];
  readonly outputTokenIds: number[] = [];
  readonly sampling: Required<Pick<SamplingParams, 'maxTokens' | 'temperature' | 'seed' | 'ignoreEos'>> & { stopTokenIds: readonly number[] };
  kvTransferParams?: KVTransferParams;
  status: RequestStatus = 'WAITING';
  /** Tokens whose KV is computed or loaded (vLLM `num_computed_tokens`). */
  numComputedTokens = 0;
  /** Tokens whose cache entries hold their KV (>= numComputedTokens after a load: the last token is recomputed, not rewritten). */
  cacheFilled = 0;
  numPreemptions = 0;
  finishReason: FinishReason | null = null;
  error: string | undefined;
  /** Returned `kv_transfer_params` (producer side). */
  outputKvTransferParams: KVTransferParams | undefined;
  /** Remote load bookkeeping (consumer side); `loadError`: a worker reported the transfer failed (first cause kept). */
  load: { numLocalTokens: number; numExternalTokens: number; recvWorkers: Set<string>; loadError: LoadError | null } | null = null;
  /** Set once the connector was asked for external tokens (a request asks once). */
  connectorAsked = false;
  /** The request is aborted but waits for its load to finish before its blocks are freed. */
  abortPending = false;
  readonly arrivalStep: number;
  private readonly rng: SeededRng;

  constructor(requestId: string, promptTokenIds: readonly number[], sampling: SamplingParams, kvTransferParams: KVTransferParams | undefined, arrivalStep: number) {
    if (promptTokenIds.length === 0) throw new RangeError('empty prompt');
    this.requestId = requestId;
    this.promptTokenIds = promptTokenIds.slice();
    this.sampling = {
      maxTokens: sampling.maxTokens ?? 16,
      temperature: sampling.temperature ?? 0,
      seed: sampling.seed ?? 0,
      ignoreEos: sampling.ignoreEos ?? false,
      stopTokenIds: sampling.stopTokenIds ?? [],
    };
    if (!(Number.isSafeInteger(this.sampling.maxTokens) && this.sampling.maxTokens >= 1)) throw new RangeError(`maxTokens ${this.sampling.maxTokens}`);
    this.kvTransferParams = kvTransferParams;
    this.arrivalStep = arrivalStep;
    this.rng = new SeededRng(this.sampling.seed);
  }

  /** Prompt plus generated tokens. */
  get numTokens(): number {
    return this.promptTokenIds.length + this.outputTokenIds.length;
  }

  /** Prompt then output token ids. */
  get allTokenIds(): number[] {
    return [...this.promptTokenIds, ...this.outputTokenIds];
  }

  get isFinished(): boolean {
    return this.status === 'FINISHED';
  }

  /** Samples the next token from `logits` with this request's parameters and PRNG. */
  sample(logits: Float32Array): number {
    const T = this.sampling.temperature;
    if (!(T > 0)) return argmax(logits);
    let mx = -Infinity;
    for (const x of logits) if (x > mx) mx = x;
    const p = new Float64Array(logits.length);
    let sum = 0;
    for (let i = 0; i < logits.length; i++) {
      p[i] = Math.exp((logits[i] - mx) / T);
      sum += p[i];
    }
    const u = this.rng.next() * sum;
    let c = 0;
    for (let i = 0; i < p.length; i++) {
      c += p[i];
      if (u < c) return i;
    }
    return argmax(logits);
  }
}

/** Index of the largest value (lowest index on ties). */
export function argmax(x: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i] > x[best]) best = i;
  return best;
}

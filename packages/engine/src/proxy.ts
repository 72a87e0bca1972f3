/**
 * The P/D proxy (vLLM's toy disaggregation proxy, in process). Two modes:
 * - `sequential` (NIXL style): the prompt goes to the producer with
 *   `kv_transfer_params: { do_remote_decode: true }` and `maxTokens: 1`; the params the producer
 *   returns go to the consumer with `do_remote_prefill: true`, and the consumer's output is the answer;
 * - `concurrent` (Mooncake style): the proxy sends to both at once with a shared `transfer_id`
 *   (producer: `do_remote_decode`, consumer: `do_remote_prefill` and `remote_engine_id`); the
 *   connector pairs the two sides.
 * @module
 */
import { randomUUID } from 'node:crypto';
import type { KVTransferParams } from './contracts.js';
import type { GenerateResult } from './engine.js';
import type { SamplingParams } from './request.js';

/** What the proxy needs of an engine. */
export interface PDEndpoint {
  readonly engineId: string;
  generate(prompt: string | readonly number[], sampling?: SamplingParams, kvTransferParams?: KVTransferParams, requestId?: string): Promise<GenerateResult>;
}

/** Options of a {@link PDProxy}. */
export interface PDProxyOptions {
  /** The producer (prefill instance). */
  prefill: PDEndpoint;
  /** The consumer (decode instance). */
  decode: PDEndpoint;
  /** Default `sequential`. */
  mode?: 'sequential' | 'concurrent';
}

/** The consumer's result plus the producer's. */
export interface PDResult extends GenerateResult {
  /** The producer's result (its one token is not part of the answer). */
  prefill: GenerateResult;
}

/** Sends each request through a producer and a consumer. */
export class PDProxy {
  readonly mode: 'sequential' | 'concurrent';
  private n = 0;

  constructor(private readonly o: PDProxyOptions) {
    this.mode = o.mode ?? 'sequential';
  }

  /**
   * Generates for `prompt` through P then D. A producer error ends the request with that error
   * (the consumer is not asked).
   */
  async generate(prompt: string | readonly number[], sampling: SamplingParams = {}): Promise<PDResult> {
    const id = `pd-${this.n++}-${randomUUID().slice(0, 8)}`;
    if (this.mode === 'concurrent') {
      const transferId = randomUUID();
      const [p, d] = await Promise.all([
        this.o.prefill.generate(prompt, { ...sampling, maxTokens: 1 }, { do_remote_decode: true, transfer_id: transferId }, `${id}-p`),
        this.o.decode.generate(prompt, sampling, { do_remote_prefill: true, transfer_id: transferId, remote_engine_id: this.o.prefill.engineId }, `${id}-d`),
      ]);
      return { ...d, prefill: p };
    }
    const p = await this.o.prefill.generate(prompt, { ...sampling, maxTokens: 1 }, { do_remote_decode: true }, `${id}-p`);
    if (p.finishReason === 'error' || p.finishReason === 'abort') return { ...p, tokenIds: [], text: '', prefill: p };
    const params: KVTransferParams = { ...(p.kvTransferParams ?? {}), do_remote_prefill: true, do_remote_decode: false };
    const d = await this.o.decode.generate(prompt, sampling, params, `${id}-d`);
    return { ...d, prefill: p };
  }
}

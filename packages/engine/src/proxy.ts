/**
 * The P/D proxy (vLLM's toy disaggregation proxy, in process). Two modes:
 * - `sequential` (NIXL style): the prompt goes to the producer with
 *   `kv_transfer_params: { do_remote_decode: true }` and `maxTokens: 1`; the params the producer
 *   returns go to the consumer with `do_remote_prefill: true`, and the consumer's output is the answer;
 * - `concurrent` (Mooncake style): the proxy sends to both at once with a shared `transfer_id`
 *   (producer: `do_remote_decode`, consumer: `do_remote_prefill` and `remote_engine_id`) and a
 *   fresh `lease_capability` (the transfer's unguessable capability, which the producer's side
 *   channel asks of the consumer; `@kvconnect/core` lease-capability.ts); the connector
 *   pairs the two sides. In `sequential` mode the producer's params (NIXL's carry its own
 *   `lease_capability`) are forwarded untouched.
 *
 * In both modes, when the producer's block size of a KV cache group is a larger multiple of the
 * consumer's and both endpoints name their groups (`groupConfigs`), the producer's request also
 * carries `kv_checksum_block_sizes` (docs/checksum-extensions.md section 1), so a consumer prefix
 * hit that ends inside a producer block is verified with sub-block values.
 * @module
 */
import { randomUUID } from 'node:crypto';
import { KV_CHECKSUM_BLOCK_SIZES_PARAM, LEASE_CAPABILITY_PARAM, kvChecksumBlockSizes, newLeaseCapability, type BlockSizeGroup } from '@kvconnect/core';
import type { KVTransferParams } from './contracts.js';
import type { GenerateResult } from './engine.js';
import type { SamplingParams } from './request.js';

/** What the proxy needs of an engine. */
export interface PDEndpoint {
  readonly engineId: string;
  /** `call.signal` aborts the request (an `EngineClient` closes its connection, which aborts it on the server). */
  generate(prompt: string | readonly number[], sampling?: SamplingParams, kvTransferParams?: KVTransferParams, requestId?: string, call?: PDCallOptions): Promise<GenerateResult>;
  /** Aborts request `requestId` (an in-process `Engine`, whose `generate` takes no signal). */
  abort?(requestId: string): unknown;
  /**
   * The engine's KV cache groups (an in-process `Engine`; an `EngineClient` learns them from
   * `/health`'s `kv_cache_groups`). Absent: unknown, no `kv_checksum_block_sizes` is added.
   */
  readonly groupConfigs?: readonly BlockSizeGroup[];
}

/** Per-request options of {@link PDProxy.generate} and {@link PDEndpoint.generate}. */
export interface PDCallOptions {
  /**
   * Aborting it aborts the request on both sides (the client went away): each side gets the
   * signal and, when it has one, its `abort(requestId)`; a sequential request aborted after its
   * prefill is not sent to the consumer.
   */
  signal?: AbortSignal;
  /**
   * The consumer's output as it comes (endpoints that stream: `EngineClient`; an in-process
   * `Engine` does not call it). Only the consumer's call gets it.
   */
  onDelta?: (delta: { text: string; tokenIds: number[] }) => void;
  /**
   * The request's id, carried by the client (e.g. the harness's `r<index>.…`, by which faults pick
   * their requests): the producer's request is `<requestId>-p`, the consumer's `<requestId>-d`.
   * Default `pd-<n>-<8 random hex>` (n counts this proxy's requests). The client keeps it unique
   * among requests in flight (an engine answers 409 to an id in use).
   */
  requestId?: string;
}

/** Options of a {@link PDProxy}. */
export interface PDProxyOptions {
  /** The producer (prefill instance). */
  prefill: PDEndpoint;
  /** The consumer (decode instance). */
  decode: PDEndpoint;
  /** Default `sequential`. */
  mode?: 'sequential' | 'concurrent';
  /**
   * Adds `kv_checksum_block_sizes` to the producer's `kv_transfer_params` when the two endpoints'
   * block sizes call for it (see the module doc); default true.
   */
  kvChecksumBlockSizes?: boolean;
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
  private blockSizes: Record<string, number> | undefined | null = null;

  constructor(private readonly o: PDProxyOptions) {
    this.mode = o.mode ?? 'sequential';
  }

  /** The producer's `kv_transfer_params` additions (`kv_checksum_block_sizes` or nothing), computed once. */
  private producerExtras(): KVTransferParams {
    if (this.blockSizes === null) {
      const p = this.o.prefill.groupConfigs;
      const d = this.o.decode.groupConfigs;
      this.blockSizes = this.o.kvChecksumBlockSizes !== false && p && d ? kvChecksumBlockSizes(p, d) : undefined;
    }
    return this.blockSizes ? { [KV_CHECKSUM_BLOCK_SIZES_PARAM]: this.blockSizes } : {};
  }

  /**
   * Generates for `prompt` through P then D. A producer error ends the request with that error
   * (the consumer is not asked). `call.signal`: see {@link PDCallOptions}.
   */
  async generate(prompt: string | readonly number[], sampling: SamplingParams = {}, call: PDCallOptions = {}): Promise<PDResult> {
    const id = call.requestId ?? `pd-${this.n++}-${randomUUID().slice(0, 8)}`;
    const signal = call.signal;
    const side = (ep: PDEndpoint, p: string | readonly number[], s: SamplingParams, params: KVTransferParams, requestId: string, onDelta?: PDCallOptions['onDelta']): Promise<GenerateResult> => {
      const opts: PDCallOptions | undefined = signal || onDelta ? { signal, onDelta } : undefined;
      if (!signal) return opts ? ep.generate(p, s, params, requestId, opts) : ep.generate(p, s, params, requestId);
      const onAbort = () => void ep.abort?.(requestId);
      signal.addEventListener('abort', onAbort, { once: true });
      return ep.generate(p, s, params, requestId, opts).finally(() => signal.removeEventListener('abort', onAbort));
    };
    const aborted = (r: GenerateResult): PDResult => ({ ...r, tokenIds: [], text: '', finishReason: 'abort', prefill: r });
    if (signal?.aborted) return aborted({ requestId: `${id}-p`, tokenIds: [], text: '', finishReason: 'abort', numPreemptions: 0 });
    if (this.mode === 'concurrent') {
      const transferId = randomUUID();
      // The transfer's lease capability goes to these two engines only (the producer returns no
      // params before the consumer starts): `@kvconnect/core` lease-capability.ts.
      const capability = newLeaseCapability();
      const [p, d] = await Promise.all([
        side(this.o.prefill, prompt, { ...sampling, maxTokens: 1 }, { do_remote_decode: true, transfer_id: transferId, [LEASE_CAPABILITY_PARAM]: capability, ...this.producerExtras() }, `${id}-p`),
        side(this.o.decode, prompt, sampling, { do_remote_prefill: true, transfer_id: transferId, remote_engine_id: this.o.prefill.engineId, [LEASE_CAPABILITY_PARAM]: capability }, `${id}-d`, call.onDelta),
      ]);
      return { ...d, prefill: p };
    }
    const p = await side(this.o.prefill, prompt, { ...sampling, maxTokens: 1 }, { do_remote_decode: true, ...this.producerExtras() }, `${id}-p`);
    if (p.finishReason === 'error' || p.finishReason === 'abort') return { ...p, tokenIds: [], text: '', prefill: p };
    // The client went away during the prefill: the consumer is not asked (the producer's blocks
    // wait for their lease to expire, as for any consumer that never reads).
    if (signal?.aborted) return aborted(p);
    const params: KVTransferParams = { ...(p.kvTransferParams ?? {}), do_remote_prefill: true, do_remote_decode: false };
    const d = await side(this.o.decode, prompt, sampling, params, `${id}-d`, call.onDelta);
    return { ...d, prefill: p };
  }
}

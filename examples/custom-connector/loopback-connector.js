/**
 * LoopbackConnector: a minimal custom KV connector written against the @kvconnect/core connector
 * API. It moves a request's KV blocks between two engines of ONE process (producer -> consumer)
 * by copying bytes between their registered cache memory.
 *
 * It supports attention caches of identically configured engines (same model, TP/PP sizes, block
 * size, layout and dtype); a real connector (see @kvconnect/nixl-pull) maps between different
 * ones and moves bytes over a transfer agent. KV checksums need nothing from it but a carrier:
 * `kvChecksumCarrier()` returns 'kv_transfer_params', so the producer's checksum payload travels
 * in the request's kv_transfer_params and the consumer verifies every load before decoding.
 *
 * Register it by name:   registry.register(loopbackConnectorFactory)
 * or by module path:      kv_transfer_config.kv_connector_module_path = '<path of this file>'
 *                         (the registry calls the exported register(registry)).
 */
import { partAddress } from '@kvconnect/engine';

/** The registered name (kv_transfer_config.kv_connector). */
export const LOOPBACK_CONNECTOR = 'LoopbackConnector';

/** Where the halves of every LoopbackConnector in this process meet. */
export const loopbackBus = {
  /** engineId -> Map("pp:tp" -> WorkerKVCaches) of the producer workers. */
  engines: new Map(),
  /** `${engineId}/${pp}:${tp}/${requestId}`: producer worker blocks a consumer worker read. */
  read: new Set(),
  /** Flip one bit in the next N copied pieces (to see the checksums catch it). */
  corruptNext: 0,
};

class LoopbackScheduler {
  constructor(config, ctx) {
    this.config = config;
    this.ctx = ctx;
    this.pending = [];
    this.asked = new Map();
  }

  getNumNewMatchedTokens(request, numComputedTokens) {
    const p = request.kvTransferParams;
    if (this.config.kv_role === 'kv_producer' || p?.do_remote_prefill !== true || !Array.isArray(p.remote_block_ids)) return { count: 0, loadAsync: false };
    this.asked.set(request.requestId, numComputedTokens);
    return { count: Math.max(0, request.promptTokenIds.length - numComputedTokens), loadAsync: true };
  }

  updateStateAfterAlloc(request, blocks, numExternalTokens) {
    const first = this.asked.get(request.requestId);
    this.asked.delete(request.requestId);
    if (numExternalTokens <= 0 || first === undefined) return;
    const p = request.kvTransferParams;
    this.pending.push({
      requestId: request.requestId,
      remoteEngineId: p.remote_engine_id,
      remoteRequestId: p.remote_request_id,
      localBlocks: blocks.map((g) => g.slice()),
      remoteBlocks: p.remote_block_ids,
      firstToken: first,
      numTokens: first + numExternalTokens,
    });
  }

  buildConnectorMeta() {
    const meta = { loads: this.pending };
    this.pending = [];
    return meta;
  }

  updateConnectorOutput() {}

  requestFinished(request, blocks, reason) {
    const p = request.kvTransferParams;
    if (this.config.kv_role === 'kv_consumer' || p?.do_remote_decode !== true || (reason !== 'stop' && reason !== 'length')) return { delayFree: false };
    // Keep the blocks until the consumer read them (a real connector also sets a lease).
    return {
      delayFree: true,
      kvTransferParams: { remote_engine_id: this.ctx.engineId, remote_request_id: request.requestId, remote_block_ids: blocks.map((g) => g.slice()) },
    };
  }

  kvChecksumCarrier() {
    return 'kv_transfer_params';
  }
}

class LoopbackWorker {
  constructor(config, ctx) {
    this.ctx = ctx;
    this.key = `${ctx.ppRank}:${ctx.tpRank}`;
    this.caches = null;
    this.meta = null;
    this.recved = new Set();
    this.invalid = new Set();
  }

  registerKvCaches(caches) {
    this.caches = caches;
    if (!loopbackBus.engines.has(this.ctx.engineId)) loopbackBus.engines.set(this.ctx.engineId, new Map());
    loopbackBus.engines.get(this.ctx.engineId).set(this.key, caches);
  }

  bindConnectorMetadata(meta) {
    this.meta = meta ?? null;
  }

  startLoadKv() {
    // Never block the engine step: copy on the event loop, report in a later getTransferResults.
    for (const load of this.meta?.loads ?? []) {
      setImmediate(() => {
        try {
          this.copy(load);
        } catch (e) {
          console.error(`LoopbackConnector: load of ${load.requestId} failed: ${e.message}`);
          for (const g of load.localBlocks) for (const b of g) this.invalid.add(b);
        }
        this.recved.add(load.requestId);
        loopbackBus.read.add(`${load.remoteEngineId}/${this.key}/${load.remoteRequestId}`);
      });
    }
  }

  getTransferResults() {
    const res = { finishedSending: new Set(), finishedRecving: new Set(this.recved), invalidBlockIds: new Set(this.invalid), kvChecksums: new Map() };
    this.recved.clear();
    this.invalid.clear();
    const prefix = `${this.ctx.engineId}/${this.key}/`;
    for (const id of loopbackBus.read) {
      if (id.startsWith(prefix)) {
        res.finishedSending.add(id.slice(prefix.length));
        loopbackBus.read.delete(id);
      }
    }
    return res;
  }

  clearConnectorMetadata() {
    this.meta = null;
  }

  /** Copies every loaded token of every attention cache from the producer worker of the same rank. */
  copy(load) {
    const src = loopbackBus.engines.get(load.remoteEngineId)?.get(this.key);
    if (!src) throw new Error(`producer ${load.remoteEngineId} worker ${this.key} is not in this process`);
    this.caches.groups.forEach((group, gi) => {
      group.caches.forEach((view, ci) => {
        const pv = src.groups[gi]?.caches[ci];
        if (view.kind !== 'attention' || pv?.kind !== 'attention' || pv.name !== view.name || pv.blockSize !== view.blockSize) {
          throw new Error(`cache ${view.name}: LoopbackConnector needs identical attention caches on both sides`);
        }
        const bs = view.blockSize;
        for (let tok = load.firstToken; tok < load.numTokens; tok++) {
          const bd = load.localBlocks[gi][Math.floor(tok / bs)];
          const bp = load.remoteBlocks[gi][Math.floor(tok / bs)];
          for (let h = 0; h < view.localHeads; h++) {
            view.parts.forEach((part, q) => {
              const pp = pv.parts[q];
              const from = partAddress(pp, bs, bp, h, tok % bs);
              const bytes = src.regions[pp.region].slice(from, from + pp.bytes);
              if (loopbackBus.corruptNext > 0) {
                loopbackBus.corruptNext--;
                bytes[1] ^= 0x40; // one exponent bit of a bf16 value
              }
              this.caches.regions[part.region].set(bytes, partAddress(part, bs, bd, h, tok % bs));
            });
          }
        }
      });
    });
  }
}

/** The connector's factory: what the registry stores under LOOPBACK_CONNECTOR. */
export const loopbackConnectorFactory = {
  name: LOOPBACK_CONNECTOR,
  createScheduler: (config, ctx) => new LoopbackScheduler(config, ctx),
  createWorker: (config, ctx) => new LoopbackWorker(config, ctx),
};

/** Called by KVConnectorRegistry.loadModule when this file is named by kv_connector_module_path. */
export function register(registry) {
  if (!registry.has(LOOPBACK_CONNECTOR)) registry.register(loopbackConnectorFactory);
}

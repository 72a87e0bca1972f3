/**
 * Test utilities for MooncakeConnector end to end: a producer and a consumer engine in one
 * process with real ZeroMQ sockets, a real bootstrap server and embedded agents on 127.0.0.1 (or
 * Mooncake Transfer Engine agents: `transfer`),
 * a fault-injecting agent wrapper, and a single-instance reference.
 */
import { KVChecksumObservability, KVConnectorRegistry } from '@kvconnect/core';
import { Engine, PDProxy, type EngineOptions } from '@kvconnect/engine';
import type { DescList, MakeTransferArgs, MemoryRegion, PostOptions, Registration, TransferAgent, TransferEngine, TransferRequest, XferDesc, XferStatus } from '@kvconnect/transfer';
import { MOONCAKE_CONNECTOR, MooncakeWorker, createMooncakeConnectorFactory, type MooncakeScheduler, type MooncakeConnectorHooks } from '@kvconnect/mooncake';

let seq = 0;

/** Options of one side. */
export type SideOptions = Partial<Omit<EngineOptions, 'kvTransferConfig' | 'engineId' | 'registry'>>;

/** Options of {@link makeMooncakePD}. */
export interface MooncakePDOptions {
  model: EngineOptions['model'];
  producer?: SideOptions;
  consumer?: SideOptions;
  /** Checksums on both sides (default true). */
  checksums?: boolean;
  /** Checksums on the producer (default: `checksums`). */
  producerChecksums?: boolean;
  failClosed?: boolean;
  policy?: 'fail' | 'recompute';
  /** Hooks of the connector (fault injection); a private registry is used. */
  hooks?: MooncakeConnectorHooks;
  /** Extra config of both sides. */
  extra?: Record<string, unknown>;
  /** Extra config of the consumer only. */
  consumerExtra?: Record<string, unknown>;
  /** The transfer engine of both sides (`backend`; default `embedded`; `mooncake`: the library found through MOONCAKE_PREFIX). */
  transfer?: TransferEngine;
}

/** A P/D pair over MooncakeConnector. */
export interface MooncakePD {
  producer: Engine;
  consumer: Engine;
  proxy: PDProxy;
  obs: KVChecksumObservability;
  producerWorkers(): MooncakeWorker[];
  consumerWorkers(): MooncakeWorker[];
  shutdown(): Promise<void>;
}

/** A producer and a consumer over `MooncakeConnector` (producer ready before the consumer starts). */
export async function makeMooncakePD(o: MooncakePDOptions): Promise<MooncakePD> {
  const id = `${process.pid}-${seq++}`;
  const registry = new KVConnectorRegistry();
  registry.register(createMooncakeConnectorFactory(o.hooks ?? {}));
  const checks = o.checksums ?? true;
  const obs = new KVChecksumObservability({ level: 'silent' });
  const base = { model: o.model, numBlocks: 256, maxNumBatchedTokens: 256, registry } as const;
  const transfer = o.transfer !== undefined && o.transfer !== 'embedded' ? { backend: o.transfer } : {};
  const extra = { bootstrap_port: 0, abort_timeout_ms: 10_000, transfer_timeout_ms: 15_000, bootstrap_timeout_ms: 5_000, ...transfer, ...o.extra };
  const producer = new Engine({
    ...base,
    ...o.producer,
    engineId: `mc-producer-${id}`,
    kvTransferConfig: { kv_connector: MOONCAKE_CONNECTOR, kv_role: 'kv_producer', enable_kv_checksum: o.producerChecksums ?? checks, kv_connector_extra_config: extra },
    observability: new KVChecksumObservability({ level: 'silent' }),
  });
  await producer.ready;
  const remote_bootstrap_addr = await bootstrapAddressOfEngine(producer);
  const consumer = new Engine({
    ...base,
    ...o.consumer,
    engineId: `mc-consumer-${id}`,
    kvTransferConfig: {
      kv_connector: MOONCAKE_CONNECTOR,
      kv_role: 'kv_consumer',
      enable_kv_checksum: checks,
      kv_checksum_fail_closed: o.failClosed ?? false,
      kv_load_failure_policy: o.policy ?? 'recompute',
      kv_connector_extra_config: { ...extra, ...(remote_bootstrap_addr ? { remote_bootstrap_addr } : {}), ...o.consumerExtra },
    },
    observability: obs,
  });
  await consumer.ready;
  const proxy = new PDProxy({ prefill: producer, decode: consumer, mode: 'concurrent' });
  const workersOf = (e: Engine) => e.workers.flat().map((w) => w.connector as MooncakeWorker);
  return {
    producer,
    consumer,
    proxy,
    obs,
    producerWorkers: () => workersOf(producer),
    consumerWorkers: () => workersOf(consumer),
    async shutdown() {
      await consumer.shutdown();
      await producer.shutdown();
    },
  };
}

/**
 * `host:port` of a producer engine's Mooncake bootstrap server (its connector's scheduler half
 * started it; with `bootstrap_port: 0` the port is only known this way), or null when it started
 * none. What the consumer is configured with: there is no lookup by engine id.
 */
export async function bootstrapAddressOfEngine(producer: Engine): Promise<string | null> {
  const s = producer.kvConnectorScheduler as Partial<MooncakeScheduler> | null;
  if (typeof s?.bootstrapAddress !== 'function') throw new TypeError(`engine ${producer.engineId} has no MooncakeConnector scheduler half`);
  return s.bootstrapAddress();
}

/** A single instance of `model`. */
export function single(model: EngineOptions['model'], o: SideOptions = {}): Engine {
  return new Engine({ model, numBlocks: 256, maxNumBatchedTokens: 256, ...o, engineId: `mc-single-${seq++}` });
}

export { checksumCounter as counter, until } from '../support.js';

/**
 * A TransferAgent that delegates to another and, while armed, corrupts the bytes of the next
 * WRITEs in transit: it flips `mask` in byte `byte` of the first local descriptor before posting
 * and restores the source once the transfer is done (what lands at the target differs from what
 * the producer holds and checksummed).
 */
export class FlippingAgent implements TransferAgent {
  /** WRITEs left to corrupt. */
  armed = 0;
  /** WRITEs corrupted. */
  flipped = 0;
  byte = 1;
  mask = 0x40;
  private readonly views = new Map<number, Uint8Array>();
  private readonly reqs = new WeakMap<TransferRequest, XferDesc>();

  constructor(readonly inner: TransferAgent) {}
  get name() {
    return this.inner.name;
  }
  get backend() {
    return this.inner.backend;
  }
  get capabilities() {
    return this.inner.capabilities;
  }
  async registerMemory(regions: readonly MemoryRegion[]): Promise<Registration> {
    const reg = await this.inner.registerMemory(regions);
    reg.regions.forEach((r, i) => {
      const m = regions[i] as { bytes: Uint8Array };
      this.views.set(r.addr, m.bytes);
    });
    return reg;
  }
  deregisterMemory(r: Registration) {
    return this.inner.deregisterMemory(r);
  }
  getLocalMetadata() {
    return this.inner.getLocalMetadata();
  }
  loadRemoteMetadata(m: Uint8Array) {
    return this.inner.loadRemoteMetadata(m);
  }
  invalidateRemoteMetadata(a: string) {
    return this.inner.invalidateRemoteMetadata(a);
  }
  prepDescList(agent: string | null, kind: 'DRAM' | 'VRAM', descs: readonly XferDesc[]) {
    return this.inner.prepDescList(agent, kind, descs);
  }
  releaseDescList(l: DescList) {
    return this.inner.releaseDescList(l);
  }
  async makeTransfer(args: MakeTransferArgs): Promise<TransferRequest> {
    const req = await this.inner.makeTransfer(args);
    const first = args.local.descs[(args.localIndices ?? [0])[0]];
    if (first) this.reqs.set(req, first);
    return req;
  }
  private locate(addr: number): [Uint8Array, number] | null {
    for (const [base, v] of this.views) if (addr >= base && addr < base + v.byteLength) return [v, addr - base];
    return null;
  }
  async post(req: TransferRequest, options?: PostOptions): Promise<XferStatus> {
    const d = this.reqs.get(req);
    const at = req.op === 'WRITE' && this.armed > 0 && d ? this.locate(d.addr + this.byte) : null;
    if (!at) return this.inner.post(req, options);
    this.armed--;
    this.flipped++;
    const [v, off] = at;
    v[off] ^= this.mask;
    try {
      let s = await this.inner.post(req, options);
      if (s === 'in-progress') s = await this.inner.wait(req);
      return s;
    } finally {
      v[off] ^= this.mask;
    }
  }
  status(req: TransferRequest) {
    return this.inner.status(req);
  }
  wait(req: TransferRequest) {
    return this.inner.wait(req);
  }
  release(req: TransferRequest) {
    return this.inner.release(req);
  }
  sendNotif(a: string, m: Uint8Array) {
    return this.inner.sendNotif(a, m);
  }
  pollNotifs() {
    return this.inner.pollNotifs();
  }
  close() {
    return this.inner.close();
  }
}

/** Prompts of varied lengths (real text). */
export function prompts(n: number, seed = 1): string[] {
  const words = ['kv', 'cache', 'prefill', 'decode', 'block', 'tensor', 'parallel', 'checksum', 'layer', 'token', 'the', 'a', 'of', 'engine', 'mamba', 'mooncake', 'router', 'dealer'];
  const out: string[] = [];
  let s = seed;
  for (let i = 0; i < n; i++) {
    const len = 4 + ((i * 7 + seed) % 9);
    const ws: string[] = [];
    for (let k = 0; k < len; k++) {
      s = (s * 1103515245 + 12345) >>> 0;
      ws.push(words[s % words.length]);
    }
    out.push(`${i}: ${ws.join(' ')}.`);
  }
  return out;
}

/**
 * Test utilities of the NIXL end-to-end tests: a producer and a consumer engine in one process
 * over NixlConnector / NixlPushConnector with real EmbeddedAgents (or real NIXL agents: `transfer`) (127.0.0.1 TCP), a single
 * instance to compare with, and a wrapping agent that corrupts bytes in transit.
 */
import '@kvconnect/nixl-pull';
import '@kvconnect/nixl-push';
import { KVChecksumObservability } from '@kvconnect/core';
import { Engine, PDProxy, type EngineOptions } from '@kvconnect/engine';
import { createAgent, type AgentFactory } from '@kvconnect/nixl-common';
import type { DescList, MakeTransferArgs, MemoryRegion, PostOptions, Registration, TransferAgent, TransferEngine, TransferRequest, XferStatus } from '@kvconnect/transfer';
import { Registry } from 'prom-client';

let seq = 0;

/** Options of one side. */
export type SideOptions = Partial<Omit<EngineOptions, 'kvTransferConfig' | 'engineId'>>;

/** Options of {@link makeNixlPD}. */
export interface NixlPDOptions {
  mode: 'pull' | 'push';
  model: EngineOptions['model'];
  producer?: SideOptions;
  consumer?: SideOptions;
  checksums?: boolean;
  failClosed?: boolean;
  policy?: 'fail' | 'recompute';
  producerExtra?: Record<string, unknown>;
  consumerExtra?: Record<string, unknown>;
  /** Connector of the consumer (default: the mode's). */
  consumerConnector?: string;
  /** The transfer engine of both sides (`backend`; default `embedded`; `nixl`: the library found through NIXL_PREFIX). */
  transfer?: TransferEngine;
  /** Where both engines' log lines go, at level debug (default: silent). */
  logs?: { write(line: string): void };
}

/** A P/D pair over a NIXL connector. */
export interface NixlPD {
  producer: Engine;
  consumer: Engine;
  proxy: PDProxy;
  /** Consumer checksum observability. */
  obs: KVChecksumObservability;
  /** NIXL connector metrics registries. */
  producerMetrics: Registry;
  consumerMetrics: Registry;
  shutdown(): Promise<void>;
}

/** The registered name of a mode's connector. */
export const connectorOf = (mode: 'pull' | 'push') => (mode === 'pull' ? 'NixlConnector' : 'NixlPushConnector');

/** A producer and a consumer over NIXL pull or push with real embedded agents. */
export async function makeNixlPD(o: NixlPDOptions): Promise<NixlPD> {
  const id = seq++;
  const checks = o.checksums ?? true;
  const obs = new KVChecksumObservability(o.logs ? { level: 'debug', destination: o.logs, bindings: { engine: 'consumer' } } : { level: 'silent' });
  const producerMetrics = new Registry();
  const consumerMetrics = new Registry();
  const base = { model: o.model, numBlocks: 128, maxNumBatchedTokens: 256 } as const;
  const transfer = o.transfer !== undefined && o.transfer !== 'embedded' ? { backend: o.transfer } : {};
  const producer = new Engine({
    ...base,
    ...o.producer,
    engineId: `nixl-producer-${id}`,
    kvTransferConfig: {
      kv_connector: connectorOf(o.mode),
      kv_role: 'kv_producer',
      enable_kv_checksum: checks,
      kv_connector_extra_config: { metrics_registry: producerMetrics, ...transfer, ...o.producerExtra },
    },
    observability: new KVChecksumObservability(o.logs ? { level: 'debug', destination: o.logs, bindings: { engine: 'producer' } } : { level: 'silent' }),
  });
  const consumer = new Engine({
    ...base,
    ...o.consumer,
    engineId: `nixl-consumer-${id}`,
    kvTransferConfig: {
      kv_connector: o.consumerConnector ?? connectorOf(o.mode),
      kv_role: 'kv_consumer',
      enable_kv_checksum: checks,
      kv_checksum_fail_closed: o.failClosed ?? true,
      kv_load_failure_policy: o.policy ?? 'recompute',
      kv_connector_extra_config: { metrics_registry: consumerMetrics, ...transfer, ...o.consumerExtra },
    },
    observability: obs,
  });
  await Promise.all([producer.ready, consumer.ready]);
  const proxy = new PDProxy({ prefill: producer, decode: consumer });
  return {
    producer,
    consumer,
    proxy,
    obs,
    producerMetrics,
    consumerMetrics,
    async shutdown() {
      await producer.shutdown();
      await consumer.shutdown();
    },
  };
}

/** A single instance of `model`. */
export function single(model: EngineOptions['model'], o: SideOptions = {}): Engine {
  return new Engine({ model, numBlocks: 128, maxNumBatchedTokens: 256, ...o, engineId: `nixl-single-${seq++}` });
}

export { checksumCounter, metricValue, until } from '../support.js';

/**
 * A {@link TransferAgent} that delegates to a real one and flips one bit of the bytes moved by
 * the next `corrupt` transfers: a READ's destination after it landed, a WRITE's source while it
 * is in flight (restored afterwards), so the receiver gets a flipped bit.
 */
export class CorruptingAgent implements TransferAgent {
  /** Transfers still to corrupt. */
  corrupt = 0;
  /** Transfers corrupted so far. */
  corrupted = 0;
  /** Replaces the notif of every transfer made from now on (undefined result: no notif). */
  mangleNotif: ((notif: Uint8Array) => Uint8Array | undefined) | null = null;
  private readonly regions: Array<{ addr: number; view: Uint8Array }> = [];
  private readonly args = new WeakMap<TransferRequest, MakeTransferArgs>();

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
    const r = await this.inner.registerMemory(regions);
    r.regions.forEach((g, i) => {
      const src = regions[i] as { bytes: Uint8Array };
      this.regions.push({ addr: g.addr, view: src.bytes });
    });
    return r;
  }
  deregisterMemory(r: Registration) {
    return this.inner.deregisterMemory(r);
  }
  getLocalMetadata() {
    return this.inner.getLocalMetadata();
  }
  loadRemoteMetadata(md: Uint8Array) {
    return this.inner.loadRemoteMetadata(md);
  }
  invalidateRemoteMetadata(a: string) {
    return this.inner.invalidateRemoteMetadata(a);
  }
  prepDescList(agent: string | null, kind: 'DRAM' | 'VRAM', descs: Parameters<TransferAgent['prepDescList']>[2]) {
    return this.inner.prepDescList(agent, kind, descs);
  }
  releaseDescList(l: DescList) {
    return this.inner.releaseDescList(l);
  }
  async makeTransfer(a: MakeTransferArgs): Promise<TransferRequest> {
    if (this.mangleNotif && a.notif) a = { ...a, notif: this.mangleNotif(a.notif) };
    const r = await this.inner.makeTransfer(a);
    this.args.set(r, a);
    return r;
  }
  private flip(addr: number): void {
    const g = this.regions.find((x) => addr >= x.addr && addr < x.addr + x.view.byteLength)!;
    g.view[addr - g.addr] ^= 0x10;
  }
  private pending = new Map<TransferRequest, number>();
  async post(req: TransferRequest, o?: PostOptions): Promise<XferStatus> {
    const a = this.args.get(req)!;
    if (this.corrupt > 0 && a.op === 'WRITE') {
      this.corrupt--;
      this.corrupted++;
      const addr = a.local.descs[0].addr;
      this.flip(addr);
      this.pending.set(req, addr);
    } else if (this.corrupt > 0 && a.op === 'READ') {
      this.corrupt--;
      this.corrupted++;
      this.pending.set(req, -1 - a.local.descs[0].addr);
    }
    const s = await this.inner.post(req, o);
    if (s !== 'in-progress') this.settle(req);
    return s;
  }
  private settle(req: TransferRequest): void {
    const p = this.pending.get(req);
    if (p === undefined) return;
    this.pending.delete(req);
    // WRITE: restore the source; READ: flip the landed bytes.
    this.flip(p >= 0 ? p : -1 - p);
  }
  status(req: TransferRequest) {
    return this.inner.status(req);
  }
  async wait(req: TransferRequest): Promise<XferStatus> {
    const s = await this.inner.wait(req);
    this.settle(req);
    return s;
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

/** An agent factory whose agents are {@link CorruptingAgent}s (collected in `agents`). */
export function corruptingFactory(): { factory: AgentFactory; agents: CorruptingAgent[] } {
  const agents: CorruptingAgent[] = [];
  return {
    agents,
    factory: async (o) => {
      const a = new CorruptingAgent(await createAgent(o));
      agents.push(a);
      return a;
    },
  };
}

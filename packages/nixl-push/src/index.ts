/**
 * @kvconnect/nixl-push: `NixlPushConnector` (vLLM's NIXL push mode). Importing this module
 * registers it as `NixlPushConnector` in @kvconnect/core's default registry.
 *
 * 1. The producer finishes the prompt, holds the blocks under a lease and returns
 *    `kv_transfer_params` (as pull). The KV checksum scheduler hands the request's payload to
 *    `sendKvChecksums` (carrier `connector`); it rides to the producer workers with the finished
 *    blocks in the next step's metadata.
 * 2. Each consumer worker handshakes on its own side-channel clients (compatibility checked on
 *    both sides; pull and push refuse each other), works out which producer ranks will write to
 *    it (the same mapping the producer uses), and registers its blocks with the producer
 *    (`PUSH_REG` over the side channel). The producer's scheduler half serves the side channel
 *    and passes each registration to its workers in the next step's metadata.
 * 3. Each producer worker WRITEs its part of every registered consumer rank's blocks (TP sizes,
 *    block sizes, only the tokens past the consumer's local prefix hit; replicated B/C of Mamba2
 *    are written to every consumer rank that holds them). The WRITE's completion notif, delivered
 *    after the data landed, is `KV_CHECKSUM:` + MessagePack `[consumerRequestId, producerTpSize,
 *    payload]`, or the plain `consumerRequestId:producerTpSize` without checksums (SPEC 7).
 * 4. The consumer reports the load once every expected producer rank's notif arrived, with the
 *    first payload received. A malformed or unexpected notif, a refused registration (lease
 *    expired, unknown request) or a deadline (`push_timeout_ms`) fails the load (invalid blocks):
 *    it never hangs and is never used silently.
 * @packageDocumentation
 */
import { defaultRegistry, type KVConnectorFactory, type KVConnectorRegistry, type KVTransferConfig, type SchedulerContext, type WorkerContext } from '@kvconnect/core';
import { NixlScheduler, NixlWorkerBase, SideChannelError, decodeNotif, encodeNotif, planTransfer, type EngineInfo, type LoadSpec, type NixlMeta, type PushRegistration, type PushSpec } from '@kvconnect/nixl-common';

/** The registered connector name. */
export const NIXL_PUSH_CONNECTOR = 'NixlPushConnector';

/** Scheduler half of {@link NIXL_PUSH_CONNECTOR} (carrier `connector`, `sendKvChecksums`). */
export class NixlPushScheduler extends NixlScheduler {
  constructor(config: KVTransferConfig, ctx: SchedulerContext) {
    super(config, ctx, 'push');
  }
}

interface PushLoad {
  load: LoadSpec;
  /** The producer's handshake the load planned with. */
  info: EngineInfo;
  /** Producer agents expected to write to this rank, and those whose notif arrived. */
  expected: Set<string>;
  got: Set<string>;
  producerTpSize: number;
  payload: Uint8Array | null;
  registered: boolean;
  deadline: number;
}

interface ReadyPush {
  spec: PushSpec | null;
  /** Consumer agents this worker has handled (written, or nothing to write). */
  handled: Set<string>;
  inflight: number;
}

/** Worker half of {@link NIXL_PUSH_CONNECTOR}: producer WRITEs with completion notifs, consumer registration and notif accounting. */
export class NixlPushWorker extends NixlWorkerBase {
  private readonly loads = new Map<string, PushLoad>();
  /** Producer: requests finished here (their spec, once it arrived) and the consumer ranks' registrations. */
  private readonly ready = new Map<string, ReadyPush>();
  private readonly regs = new Map<string, Map<string, PushRegistration>>();
  /** Producer: this engine's handshake info (from the scheduler half's first metadata). */
  private producer: EngineInfo | null = null;

  constructor(config: KVTransferConfig, ctx: WorkerContext) {
    super(config, ctx, 'push');
  }

  // ------------------------------------------------------------------ consumer

  protected startLoad(load: LoadSpec): void {
    void this.runLoad(load);
  }

  private async runLoad(load: LoadSpec): Promise<void> {
    let stage = 'handshake';
    let info: EngineInfo | null = null;
    try {
      // The first handshake waits as long as a transfer: a busy producer answers between steps.
      info = await this.peers.peerInfo(load.remoteHost, load.remotePort, load.remoteEngineId, load.compatHash, this.config.transferTimeoutMs);
      stage = 'plan';
      const plans = planTransfer({ dst: this.rank!, producer: info, dstBlocks: load.localBlocks, srcBlocks: load.remoteBlockIds, firstToken: load.firstToken, numTokens: load.numTokens });
      const e: PushLoad = {
        load,
        info,
        expected: new Set(plans.filter((p) => p.pairs.length > 0).map((p) => p.src.agentName)),
        got: new Set(),
        producerTpSize: info.tpSize,
        payload: null,
        registered: false,
        deadline: Date.now() + this.config.pushTimeoutMs,
      };
      this.loads.set(load.requestId, e);
      stage = 'register';
      // The producer answers between its engine steps: the registration may take what is left
      // of the load's deadline, not just a handshake's time.
      await this.peers.pushRegister(
        load.remoteHost,
        load.remotePort,
        {
          consumerRequestId: load.requestId,
          producerRequestId: load.remoteRequestId,
          consumerEngineId: this.ctx.engineId,
          rank: this.rank!,
          firstToken: load.firstToken,
          numTokens: load.numTokens,
          blockIds: load.localBlocks,
        },
        Math.max(1, e.deadline - Date.now()),
        load.consumerKey,
        load.leaseCapability,
      );
      e.registered = true;
      this.check(load.requestId);
    } catch (err) {
      // The producer may have restarted (new agents, same port): the next load handshakes again.
      if (info) this.peers.invalidatePeer(load.remoteHost, load.remotePort, info);
      this.loads.delete(load.requestId);
      this.failLoad(load, err instanceof SideChannelError && err.code === 'lease-expired' ? 'lease-expired' : stage, err);
    }
  }

  private check(requestId: string): void {
    const e = this.loads.get(requestId);
    if (!e || !e.registered) return;
    for (const a of e.expected) if (!e.got.has(a)) return;
    this.loads.delete(requestId);
    this.finishLoad(e.load, e.payload);
  }

  private fail(e: PushLoad, reason: string, err?: unknown): void {
    // E.g. notifs from agents the handshake did not name (a restarted producer): handshake again.
    this.peers.invalidatePeer(e.load.remoteHost, e.load.remotePort, e.info);
    this.loads.delete(e.load.requestId);
    this.failLoad(e.load, reason, err);
  }

  protected onNotif(sender: string, bytes: Uint8Array): void {
    let n;
    try {
      n = decodeNotif(bytes);
    } catch (err) {
      this.metrics.failedNotifs.inc({ mode: 'push' });
      // The request cannot be told: fail every load still waiting for this producer rank.
      for (const e of [...this.loads.values()]) if (e.expected.has(sender) && !e.got.has(sender)) this.fail(e, 'malformed-notif', err);
      return;
    }
    const e = this.loads.get(n.remoteRequestId);
    if (!e) {
      this.metrics.failedNotifs.inc({ mode: 'push' });
      return;
    }
    if (!e.expected.has(sender) || n.size !== e.producerTpSize) {
      this.metrics.failedNotifs.inc({ mode: 'push' });
      this.fail(e, 'unexpected-notif');
      return;
    }
    e.got.add(sender);
    // Every writing producer rank carries the same bytes; keep the first (SPEC 7).
    if (n.payload && !e.payload) e.payload = n.payload;
    this.check(n.remoteRequestId);
  }

  // ------------------------------------------------------------------ producer

  protected override onMeta(meta: NixlMeta): void {
    if (!this.isProducer) return;
    if (meta.producer) this.producer = meta.producer;
    for (const p of meta.pushes ?? []) {
      const r = this.ready.get(p.requestId);
      if (r) r.spec = p;
      else this.ready.set(p.requestId, { spec: p, handled: new Set(), inflight: 0 });
    }
    // Registrations the scheduler half's side channel accepted (PUSH_REG): one per consumer rank.
    for (const reg of meta.pushRegs ?? []) {
      let m = this.regs.get(reg.producerRequestId);
      if (!m) this.regs.set(reg.producerRequestId, (m = new Map()));
      m.set(reg.rank.agentName, reg);
    }
    for (const id of new Set([...(meta.pushes ?? []).map((p) => p.requestId), ...(meta.pushRegs ?? []).map((r) => r.producerRequestId)])) this.tryWrites(id);
  }

  private tryWrites(id: string): void {
    const r = this.ready.get(id);
    const regs = this.regs.get(id);
    if (!r?.spec || !regs || this.closed || this.toReport.has(id)) return;
    const spec = r.spec;
    const info = this.producer;
    if (!info) return;
    for (const reg of regs.values()) {
      if (r.handled.has(reg.rank.agentName)) continue;
      r.handled.add(reg.rank.agentName);
      let mine;
      try {
        if (reg.numTokens > spec.numTokens) throw new Error(`consumer asks for ${reg.numTokens} tokens, the producer holds ${spec.numTokens}`);
        mine = planTransfer({ dst: reg.rank, producer: info, dstBlocks: reg.blockIds, srcBlocks: spec.blocks, firstToken: reg.firstToken, numTokens: reg.numTokens }).find((p) => p.src.agentName === this.rank!.agentName);
      } catch {
        this.metrics.failedTransfers.inc({ mode: 'push', reason: 'plan' });
        continue;
      }
      if (!mine || mine.pairs.length === 0) continue;
      r.inflight++;
      this.transfer('WRITE', reg.rank, mine.pairs, encodeNotif(reg.consumerRequestId, this.ctx.tpSize, spec.checksums))
        .catch(() => this.metrics.failedTransfers.inc({ mode: 'push', reason: 'write' }))
        .finally(() => {
          r.inflight--;
          this.checkDone(id);
        });
    }
    this.checkDone(id);
  }

  /**
   * This worker's part is done once every consumer rank registered and its writes ended: the
   * scheduler half hears it in the worker metadata (`pushDone`) and ends the worker's lease part.
   */
  private checkDone(id: string): void {
    const r = this.ready.get(id);
    const regs = this.regs.get(id);
    if (!r || !regs || r.inflight > 0) return;
    const first = regs.values().next().value;
    if (!first || regs.size < first.rank.tpSize * first.rank.ppSize) return;
    for (const a of regs.keys()) if (!r.handled.has(a)) return;
    this.pushDone.push(id);
    this.ready.delete(id);
    this.regs.delete(id);
  }

  /** WRITEs in flight keep the blocks (the scheduler's lease may have ended meanwhile). */
  protected override writing(requestId: string): boolean {
    return (this.ready.get(requestId)?.inflight ?? 0) > 0;
  }

  /** The lease ended (done, released, expired): forget the request. */
  protected override onSent(requestId: string): void {
    this.ready.delete(requestId);
    this.regs.delete(requestId);
  }

  protected override onTick(): void {
    const now = Date.now();
    for (const e of [...this.loads.values()]) if (now > e.deadline) this.fail(e, 'timeout');
  }

  protected override busy(): boolean {
    return super.busy() || this.loads.size > 0 || this.ready.size > 0;
  }
}

/** The `NixlPushConnector` factory. */
export const nixlPushConnectorFactory: KVConnectorFactory = {
  name: NIXL_PUSH_CONNECTOR,
  createScheduler: (config, ctx) => new NixlPushScheduler(config, ctx),
  createWorker: (config, ctx) => new NixlPushWorker(config, ctx),
  // The payload travels with the pushed KV (NixlPushScheduler.kvChecksumCarrier).
  kvChecksumCarriers: () => ['connector'],
};

/** Registers `NixlPushConnector` in `registry` (once). Also exported for `kv_connector_module_path`. */
export function register(registry: KVConnectorRegistry = defaultRegistry): void {
  if (!registry.has(NIXL_PUSH_CONNECTOR)) registry.register(nixlPushConnectorFactory);
}

register();

/**
 * @kvconnect/nixl-pull: `NixlConnector` (vLLM's NIXL connector, pull mode). Importing this module
 * registers it as `NixlConnector` in @kvconnect/core's default registry.
 *
 * 1. The producer finishes the prompt and returns `kv_transfer_params` (vLLM's shape:
 *    `do_remote_prefill: true`, `remote_engine_id`, `remote_request_id`, `remote_block_ids` per
 *    group, `remote_host` / `remote_port` of its side channel, `tp_size`; kvconnect's
 *    `remote_tp_size`, `lease_expiry`); the KV checksum scheduler adds `kv_checksums`
 *    (carrier `kv_transfer_params`, SPEC 7). The producer keeps the blocks (`delayFree`) until every
 *    consumer rank sent its read-done notif, the consumer released them, or the lease expired
 *    (consumer heartbeats extend it).
 * 2. Each consumer worker handshakes with the producer on its own side-channel clients
 *    (compatibility checked on both sides; the producer's scheduler half answers from its
 *    workers' handshake metadata),
 *    maps its caches onto the producer's ranks (TP sizes, block sizes, only the tokens past its
 *    local prefix hit), checks (and pins) the lease with the producer, and READs through its
 *    transfer agent; its last READ carries the read-done notif `remoteRequestId:consumerWorld`.
 * 3. A load that cannot run (lease expired, handshake refused, mapping impossible, transfer
 *    failed) is reported as invalid blocks: the engine applies `kv_load_failure_policy`; the KV is
 *    never used silently.
 * @packageDocumentation
 */
import { defaultRegistry, type KVConnectorFactory, type KVConnectorRegistry, type KVTransferConfig, type SchedulerContext, type WorkerContext } from '@kvconnect/core';
import { NixlScheduler, NixlWorkerBase, decodeNotif, encodeNotif, planTransfer, type EngineInfo, type LoadSpec } from '@kvconnect/nixl-common';

/** The registered connector name. */
export const NIXL_CONNECTOR = 'NixlConnector';

/** Read-done notifs a producer worker keeps for its next step's worker metadata, at most. */
export const MAX_READ_DONE_PER_STEP = 16_384;

/** Scheduler half of {@link NIXL_CONNECTOR} (carrier `kv_transfer_params`). */
export class NixlPullScheduler extends NixlScheduler {
  constructor(config: KVTransferConfig, ctx: SchedulerContext) {
    super(config, ctx, 'pull');
  }
}

/** Worker half of {@link NIXL_CONNECTOR}: consumer READs, producer read-done accounting. */
export class NixlPullWorker extends NixlWorkerBase {
  constructor(config: KVTransferConfig, ctx: WorkerContext) {
    super(config, ctx, 'pull');
  }

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
      const plans = planTransfer({
        dst: this.rank!,
        producer: info,
        dstBlocks: load.localBlocks,
        srcBlocks: load.remoteBlockIds,
        firstToken: load.firstToken,
        numTokens: load.numTokens,
      }).filter((p) => p.pairs.length > 0);
      if (this.config.leaseCheck) {
        stage = 'lease';
        // Pin the lease for the READ's duration; 0 = the producer no longer holds the blocks. The
        // pin is part of the transfer: the producer answers between its engine steps, which can
        // take longer than a handshake, so it waits as long as a READ would.
        const m = await this.peers.lease(load.remoteHost, load.remotePort, [load.remoteRequestId], this.config.transferTimeoutMs + 5_000, this.config.transferTimeoutMs, load.consumerKey, [load.leaseCapability]);
        if (!((m.get(load.remoteRequestId) ?? 0) > 0)) {
          this.failLoad(load, 'lease-expired');
          return;
        }
      }
      stage = 'read';
      if (plans.length === 0) {
        this.finishLoad(load);
        return;
      }
      const last = plans[plans.length - 1];
      await Promise.all(plans.slice(0, -1).map((p) => this.transfer('READ', p.src, p.pairs)));
      // The read-done notif rides on this rank's last READ, posted after every other READ completed.
      await this.transfer('READ', last.src, last.pairs, encodeNotif(load.remoteRequestId, this.world));
      this.finishLoad(load);
    } catch (e) {
      // The producer may have restarted (new agents, same port): the next load handshakes again.
      if (info) this.peers.invalidatePeer(load.remoteHost, load.remotePort, info);
      this.failLoad(load, stage, e);
    }
  }

  protected onNotif(sender: string, bytes: Uint8Array): void {
    try {
      const n = decodeNotif(bytes);
      // The scheduler half's lease table counts the readers (updateConnectorOutput).
      if (n.payload !== null || !this.isProducer) this.metrics.failedNotifs.inc({ mode: 'pull' });
      // Bounded between two steps: a flood of notifs while the engine is idle is dropped and counted.
      else if (this.readDone.length >= MAX_READ_DONE_PER_STEP) this.metrics.failedNotifs.inc({ mode: 'pull' });
      else this.readDone.push([n.remoteRequestId, sender, n.size]);
    } catch {
      this.metrics.failedNotifs.inc({ mode: 'pull' });
    }
  }
}

/** The `NixlConnector` factory. */
export const nixlConnectorFactory: KVConnectorFactory = {
  name: NIXL_CONNECTOR,
  createScheduler: (config, ctx) => new NixlPullScheduler(config, ctx),
  createWorker: (config, ctx) => new NixlPullWorker(config, ctx),
  // The consumer reads the producer's payload from `kv_transfer_params` (NixlPullScheduler.kvChecksumCarrier).
  kvChecksumCarriers: () => ['kv_transfer_params'],
};

/** Registers `NixlConnector` in `registry` (once). Also exported for `kv_connector_module_path`. */
export function register(registry: KVConnectorRegistry = defaultRegistry): void {
  if (!registry.has(NIXL_CONNECTOR)) registry.register(nixlConnectorFactory);
}

register();

/**
 * The producer's side channel, served by the NIXL scheduler half (vLLM's
 * `NixlConnectorScheduler` serves the handshake from the scheduler process with the metadata the
 * workers handed over through `set_xfer_handshake_metadata`). It answers:
 *
 * - `INFO` from the engine's handshake info ({@link engineInfoOf}: every worker's
 *   {@link RankInfo}, collected through `getHandshakeMetadata` -> `setXferHandshakeMetadata`);
 * - `LEASE` / `RELEASE` on the producer's {@link LeaseTable}, which this object owns;
 * - `PUSH_REG` (push mode): checks the lease and queues the registration; the scheduler half
 *   passes it to the producer workers in the next step's metadata (the workers WRITE).
 *
 * What the workers learn (read-done notifs, finished push writes) reaches the lease table in the
 * workers' per-step metadata, and the leases that ended reach the workers in the scheduler's
 * step metadata (scheduler.ts). One object per scheduler half: nothing is shared between engines
 * or halves through process-global state.
 * @module
 */
import type { KVCacheGroupConfig } from '@kvconnect/core';
import { checkBindHost } from '@kvconnect/transfer';
import type { NixlConfig } from './config.js';
import { LeaseTable } from './lease.js';
import type { NixlMetrics } from './metrics.js';
import { NIXL_PROTOCOL_VERSION, compatHash, encodeEngineInfo, encodeLeaseBody, type EngineInfo, type PushRegistration, type RankInfo, type SideRequest, type TransferMode } from './protocol.js';
import { SideChannelServer, type HandlerResult, type SideChannelServerStats } from './side-channel.js';

/**
 * A NIXL worker's handshake metadata (`getHandshakeMetadata`, plain data): its rank's
 * {@link RankInfo} (agent name and metadata blob, registered regions, cache layouts) and the
 * agent's backend.
 */
export interface NixlHandshakeMetadata {
  rank: RankInfo;
  backend: string;
}

/**
 * An engine's handshake info from its workers' handshake metadata, or null until every one of
 * the `tpSize * ppSize` workers reported (vLLM: the scheduler serves the metadata of all ranks).
 * Ranks are sorted by PP stage, then TP rank.
 */
export function engineInfoOf(o: { engineId: string; mode: TransferMode; tpSize: number; ppSize: number; groups: readonly KVCacheGroupConfig[]; workers: Iterable<NixlHandshakeMetadata>; salt?: string }): EngineInfo | null {
  const all = [...o.workers];
  if (all.length !== o.tpSize * o.ppSize || all.length === 0) return null;
  const ranks = all.map((w) => w.rank).sort((a, b) => a.ppRank - b.ppRank || a.tpRank - b.tpRank);
  const groupKinds = o.groups.map((g) => g.kind);
  return {
    version: NIXL_PROTOCOL_VERSION,
    mode: o.mode,
    compatHash: compatHash({ mode: o.mode, backend: all[0]!.backend, groupKinds, ranks, salt: o.salt }),
    engineId: o.engineId,
    tpSize: o.tpSize,
    ppSize: o.ppSize,
    blockSizes: o.groups.map((g) => g.blockSize),
    groupKinds,
    ranks,
  };
}

/** Push registrations queued between two engine steps, at most (more are refused `busy`). */
export const MAX_QUEUED_PUSH_REGS = 16_384;

/** Options of {@link NixlProducerChannel}. */
export interface NixlProducerChannelOptions {
  engineId: string;
  mode: TransferMode;
  /** Producer workers (`tpSize * ppSize`): each reports every request once. */
  workers: number;
  config: Pick<NixlConfig, 'leaseMs' | 'sideChannelHost' | 'sideChannelPort' | 'clusterSecret'>;
  metrics: NixlMetrics;
}

/** The producer's side-channel server, leases and push registrations (owned by the scheduler half). */
export class NixlProducerChannel {
  readonly leases: LeaseTable;
  /** The engine's handshake info once every worker reported (INFO answers it). */
  info: EngineInfo | null = null;
  private server: SideChannelServer | null = null;
  private listening: Promise<{ host: string; port: number }> | null = null;
  /** Push registrations accepted since the last {@link takePushRegs}. */
  private pushRegs: PushRegistration[] = [];

  constructor(private readonly o: NixlProducerChannelOptions) {
    this.leases = new LeaseTable({ leaseMs: o.config.leaseMs, workers: o.workers, onExpired: () => o.metrics.expiredLeases.inc({ mode: o.mode }) });
  }

  /**
   * Starts the side-channel server (once) on the configured host (loopback by default), with the
   * cluster secret when one is configured. @returns its address.
   * @throws ClusterSecretError (rejected) for a non-loopback host without a secret (`checkBindHost`).
   */
  listen(): Promise<{ host: string; port: number }> {
    if (!this.listening) {
      const secret = this.o.config.clusterSecret;
      this.listening = (async () => {
        const host = checkBindHost(this.o.config.sideChannelHost, secret, 'NIXL side channel');
        this.server = new SideChannelServer((req) => this.handle(req), { clusterSecret: secret });
        return this.server.listen(host, this.o.config.sideChannelPort);
      })();
    }
    return this.listening;
  }

  /** The side channel's address once it listens. */
  get address(): { host: string; port: number } | null {
    return this.server?.address ?? null;
  }

  /** The side-channel server's counters (buffered bytes, pending requests, dropped peers), or null before it listens. */
  sideChannelStats(): SideChannelServerStats | null {
    return this.server?.stats() ?? null;
  }

  /** The push registrations accepted since the previous call (for the next step's metadata). */
  takePushRegs(): PushRegistration[] {
    const r = this.pushRegs;
    this.pushRegs = [];
    return r;
  }

  /** Serves one side-channel request. */
  handle(req: SideRequest): HandlerResult {
    const { engineId, mode, metrics } = this.o;
    switch (req.type) {
      case 'info': {
        const info = this.info;
        if (!info) return { refuse: 'not-ready', message: `engine ${engineId}: workers still registering` };
        if (req.version !== NIXL_PROTOCOL_VERSION || req.mode !== mode || req.compatHash !== info.compatHash) {
          metrics.handshakes.inc({ mode, result: 'refused' });
          return { refuse: 'incompatible', message: `engine ${engineId} speaks version ${NIXL_PROTOCOL_VERSION}, mode ${mode}; peer: version ${req.version}, mode ${req.mode}${req.compatHash !== info.compatHash ? ', different model or backend' : ''}` };
        }
        return { ok: encodeEngineInfo(info) };
      }
      case 'lease':
        return { ok: encodeLeaseBody(this.leases.touch(req.requestIds, req.pinMs)) };
      case 'release':
        for (const id of req.requestIds) this.leases.release(id);
        return { ok: [] };
      case 'push-reg': {
        if (mode !== 'push') return { refuse: 'incompatible', message: 'PUSH_REG to a pull engine' };
        const id = req.reg.producerRequestId;
        const state = this.leases.stateOf(id);
        if (state === undefined) {
          const ended = this.leases.endedAs(id);
          return ended ? { refuse: 'lease-expired', message: `request ${id}: lease ${ended}` } : { refuse: 'unknown-request', message: `no finished request ${id}` };
        }
        if (state !== 'held') return { refuse: 'lease-expired', message: `request ${id}: lease ${state}` };
        if (this.pushRegs.length >= MAX_QUEUED_PUSH_REGS) return { refuse: 'busy', message: `engine ${engineId}: ${MAX_QUEUED_PUSH_REGS} push registrations wait for the next step` };
        this.leases.touch([id], 0);
        this.pushRegs.push(req.reg);
        return { ok: [] };
      }
    }
  }

  /** Closes the server. */
  async close(): Promise<void> {
    await this.server?.close();
  }
}

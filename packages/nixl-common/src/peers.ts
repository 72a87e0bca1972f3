/**
 * The side-channel clients of one NIXL connector half (a consumer worker, or the consumer's
 * scheduler half), and the handshakes it cached: vLLM's consumer workers each handshake with the
 * producer themselves (`NixlConnectorWorker._nixl_handshake`), and so do kvconnect's. One
 * {@link NixlPeers} belongs to one half (no process-global state): a worker process handshakes,
 * pins leases and registers pushes on its own connections; the scheduler half heartbeats and
 * releases on its own. Nothing here blocks a hook: every call returns a promise.
 * @module
 */
import type { NixlConfig } from './config.js';
import type { NixlMetrics } from './metrics.js';
import type { LocalizeAnswer, LocalizeQuery } from '@kvconnect/core';
import { NIXL_PROTOCOL_VERSION, decodeEmptyBody, decodeEngineInfo, decodeLeaseBody, decodeLocalizeBody, type EngineInfo, type PushRegistration, type TransferMode } from './protocol.js';
import { SideChannelClient, SideChannelError } from './side-channel.js';

/** A consumer's handshake failed: the producer refused (incompatible, not ready) or could not be reached. */
export class HandshakeError extends Error {
  override readonly name: string = 'HandshakeError';
  constructor(
    readonly code: string,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/** Options of {@link NixlPeers}. */
export interface NixlPeersOptions {
  mode: TransferMode;
  /** Handshake timeout and cluster secret. */
  config: Pick<NixlConfig, 'handshakeTimeoutMs' | 'clusterSecret'>;
  /** Where handshake results are counted. */
  metrics: NixlMetrics;
}

/** The side-channel clients and cached producer handshakes of one connector half. */
export class NixlPeers {
  private readonly clients = new Map<string, SideChannelClient>();
  /** Side-channel requests waiting for an answer, across this half's clients (at most 16 384). */
  private readonly waiterBudget = { used: 0, max: 16_384 };
  private readonly infos = new Map<string, Promise<EngineInfo>>();
  /** The settled value of each entry of {@link infos} (what {@link invalidatePeer} compares). */
  private readonly settled = new Map<string, EngineInfo>();
  private closed = false;

  constructor(private readonly o: NixlPeersOptions) {}

  /** The client of the side channel at `host:port` (one connection per producer). */
  client(host: string, port: number): SideChannelClient {
    const k = `${host}:${port}`;
    let c = this.clients.get(k);
    if (!c) this.clients.set(k, (c = new SideChannelClient(host, port, { timeoutMs: this.o.config.handshakeTimeoutMs, clusterSecret: this.o.config.clusterSecret, waiterBudget: this.waiterBudget })));
    return c;
  }

  /**
   * The producer's info at `host:port` (INFO handshake, cached until {@link invalidatePeer}). Both
   * sides check compatibility: the producer refuses a different version, mode or model
   * (`compatHash`: this engine's, from `compatHash` in protocol.ts over every worker's caches), and
   * so does this side. `engineId`: the producer the params named (a different engine on the port
   * is handshaken again). `timeoutMs`: how long to wait for the answer (default the handshake
   * timeout; a load passes its transfer deadline, as a busy producer answers between engine steps).
   * @throws HandshakeError
   */
  peerInfo(host: string, port: number, engineId: string | undefined, compatHash: string, timeoutMs?: number): Promise<EngineInfo> {
    const k = `${host}:${port}`;
    let p = this.infos.get(k);
    if (p) {
      return p.then((info) => {
        if ((engineId === undefined || info.engineId === engineId) && info.compatHash === compatHash) return info;
        this.invalidatePeer(host, port, info);
        return this.peerInfo(host, port, engineId, compatHash, timeoutMs);
      });
    }
    p = this.handshake(host, port, compatHash, timeoutMs);
    this.infos.set(k, p);
    p.then(
      (info) => {
        if (this.infos.get(k) === p) this.settled.set(k, info);
      },
      () => {
        if (this.infos.get(k) === p) this.infos.delete(k);
      },
    );
    return p.then((info) => {
      if (engineId !== undefined && info.engineId !== engineId) throw new HandshakeError('engine-id', `side channel ${k} serves engine ${info.engineId}, not ${engineId}`);
      return info;
    });
  }

  /**
   * Forgets the cached handshake with `host:port` when it is still `stale` (the info a failed
   * load used; a newer handshake is kept): the next load handshakes again, e.g. with a producer
   * restarted on the same port (new agents, new regions).
   */
  invalidatePeer(host: string, port: number, stale: EngineInfo): void {
    const k = `${host}:${port}`;
    if (this.settled.get(k) !== stale) return;
    this.settled.delete(k);
    this.infos.delete(k);
  }

  private async handshake(host: string, port: number, mine: string, timeoutMs?: number): Promise<EngineInfo> {
    const mode = this.o.mode;
    const metrics = this.o.metrics;
    let info: EngineInfo;
    try {
      info = await this.client(host, port).request({ type: 'info', version: NIXL_PROTOCOL_VERSION, mode, compatHash: mine }, decodeEngineInfo, timeoutMs);
    } catch (e) {
      const code = e instanceof SideChannelError ? e.code : 'transport';
      metrics.handshakes.inc({ mode, result: code });
      throw new HandshakeError(code, `handshake with ${host}:${port} failed: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
    }
    if (info.version !== NIXL_PROTOCOL_VERSION || info.mode !== mode || info.compatHash !== mine) {
      metrics.handshakes.inc({ mode, result: 'incompatible' });
      throw new HandshakeError('incompatible', `producer ${info.engineId} at ${host}:${port} is incompatible (version ${info.version}, mode ${info.mode}; this side: version ${NIXL_PROTOCOL_VERSION}, mode ${mode})`);
    }
    metrics.handshakes.inc({ mode, result: 'ok' });
    return info;
  }

  /**
   * LEASE to a producer: heartbeat (`pinMs` 0) or pin. `timeoutMs`: how long to wait for the
   * answer (default the handshake timeout; a pin before a READ passes the transfer's deadline: a
   * producer busy with a long engine step answers only after it). `consumerKey`: this consumer
   * engine's key (`consumer-binding.ts`; `LoadSpec.consumerKey`), in this and the calls below.
   * `capabilities` / `capability`: the requests' lease capabilities (protocol 19,
   * `LoadSpec.leaseCapability`; `capabilities[i]` is `requestIds[i]`'s), in this and the calls below.
   * @returns expiry per request (ms since epoch; 0 = gone).
   */
  lease(host: string, port: number, requestIds: string[], pinMs: number, timeoutMs?: number, consumerKey?: string | null, capabilities?: readonly (string | null)[]): Promise<Map<string, number>> {
    return this.client(host, port).request({ type: 'lease', requestIds, pinMs, consumerKey, capabilities }, decodeLeaseBody, timeoutMs);
  }

  /** RELEASE to a producer (best effort; errors are swallowed). */
  release(host: string, port: number, requestIds: string[], consumerKey?: string | null, capabilities?: readonly (string | null)[]): void {
    if (this.closed) return;
    this.client(host, port)
      .request({ type: 'release', requestIds, consumerKey, capabilities }, decodeEmptyBody)
      .catch(() => {});
  }

  /**
   * PUSH_REG to a producer; `timeoutMs` as for {@link lease} (a push load passes what is left of
   * its deadline). @throws SideChannelError with the refusal code.
   */
  pushRegister(host: string, port: number, reg: PushRegistration, timeoutMs?: number, consumerKey?: string | null, capability?: string | null): Promise<void> {
    return this.client(host, port).request({ type: 'push-reg', reg, consumerKey, capability }, decodeEmptyBody, timeoutMs);
  }

  /** LOCALIZE to a producer (docs/localize.md). @throws SideChannelError with the refusal code, or `timeout` / `transport`. */
  localize(host: string, port: number, requestId: string, query: LocalizeQuery, timeoutMs?: number, consumerKey?: string | null, capability?: string | null): Promise<LocalizeAnswer> {
    return this.client(host, port).request({ type: 'localize', requestId, query, consumerKey, capability }, decodeLocalizeBody, timeoutMs);
  }

  /** Closes every client (pending requests fail). */
  close(): void {
    this.closed = true;
    for (const c of this.clients.values()) c.close();
    this.clients.clear();
  }
}

/**
 * The embedded transfer agent: a {@link TransferAgent} in plain Node, over TCP (node:net), for
 * one machine or across hosts. No native code; memory is whatever the engine registers
 * (ArrayBuffer, SharedArrayBuffer, Buffer / typed-array views).
 *
 * - Each agent listens on one TCP port (loopback by default; another host needs a cluster secret,
 *   `checkBindHost` of `auth.ts`). An initiator opens one connection per remote agent; the target
 *   sends a fresh challenge and the initiator proves it holds the remote's metadata (its 32-byte
 *   secret) and, with a cluster secret, that it is a cluster member, by HMAC proofs over the
 *   challenge (`wire.ts`, `docs/security.md`); the target proves the same back. No secret crosses
 *   the wire and no data frame is sent before the handshake is done.
 * - Resources a peer can make the target hold are bounded: small headers and no payload before
 *   the handshake, a deadline per frame (`frameTimeoutMs`), a cap on partially received notif
 *   bytes across connections (`maxBufferedBytes`) and on incoming connections.
 * - Every remote access is checked at the target against its live registered regions: a peer
 *   can never read or write outside registered memory. A malformed frame closes that connection
 *   with a {@link ProtocolError} (emitted as `protocol-error`); the process goes on.
 * - Transfers are cut into frames of at most `chunkBytes` payload (coalescing small
 *   descriptors); at most `maxInflightBytes` of frames are outstanding per connection, and
 *   socket backpressure (`drain`) is respected on both sides.
 * - Striping (`lanes`, default 1): an initiator opens `lanes` connections per remote agent, the
 *   first with the handshake above, each further one ("lane") with its own handshake bound to the
 *   first's (the lane HELLO of `wire.ts`: a target accepts a lane only into an open session it
 *   authenticated, and closes it with that session). A transfer's frames are spread over the
 *   ready lanes and it completes once every frame on every lane is done; a lane that closes fails
 *   only the transfers with frames on it (`remote-disconnect`, as a closed connection; a WRITE
 *   once its frames on the other lanes were answered, `frameFailed`). A lane with frames
 *   outstanding that receives nothing for `stallTimeoutMs` is closed as dead; its READ frames are
 *   asked again on the other lanes (`laneStalled`). A closed lane is opened again after a backoff;
 *   a target that refuses lanes for good (one from before lanes) is asked for none again until its
 *   metadata changes (`OutLink`). Bounds are checked per frame at the target as on one connection.
 * - A transfer's notif is sent after the last frame was acknowledged (WRITE: after the target
 *   copied the bytes into its memory; READ: after the initiator received every byte).
 * - A connection that closes fails its transfers with `remote-disconnect`; every transfer has
 *   a deadline (`timeout`). Once a transfer completed (done, timeout, canceled, released), no
 *   byte of a late RDATA lands in its local memory: liveness is checked per received chunk.
 * - WRITE sends straight from the registered memory and READ answers straight from it (no
 *   staging copy: the frame's header and views of the memory go to the socket corked, one
 *   `writev`): like RDMA, do not modify a region while a transfer that reads it is in flight.
 *   A WRITE whose source is deregistered fails `invalid` at once, and none of its frames not yet
 *   handed to the socket is sent; the bytes of those the socket holds (at most `maxInflightBytes`,
 *   in practice one frame: the next waits for the socket's `drain`) are still read from that
 *   memory as the kernel takes them (the socket keeps it alive), as a NIC may read an RDMA
 *   source until completion. Host frames carry `chunkBytes` (4 MiB by default, up to 16 MiB,
 *   `MAX_PAYLOAD_BYTES`), frames with device segments up to {@link STAGING_CHUNK_BYTES}.
 * - Receiving (READ answers at the initiator, WRITE payloads at the target), every connection of
 *   the agent reads into its one reused 1 MiB buffer, or, for the body of a segment of 256 KiB and
 *   more, straight into the segment's memory, already bounds-checked (`SocketReads` of
 *   `embedded-conn.ts`). Before a transfer completes or a region is deregistered, the socket is
 *   pointed back at the agent's buffer, so that no byte lands in memory that is no longer the
 *   frame's; a transfer whose local memory is deregistered fails `invalid` at once.
 *
 * Same-host host memory (`shared-memory.ts`): a registered host region that lies in a shared
 * mapping of this process (a memfd of the addon, e.g. from `SharedHostArena`) is advertised in the
 * metadata with the memfd's name and descriptor, the mapping's size, the region's offset and the
 * mapping's grant word (set while some registration holds the mapping, cleared at deregistration
 * and close), under this process's `sameHostKey()` (boot id, PID and mount namespaces). An
 * initiator with the same key, once its connection's handshake proved the peer's secret and
 * the advertised process holds the far end of that connection (`processHoldsPeerSocket`: another
 * agent cannot re-advertise a third process's mappings), maps the
 * peer's memfd (`/proc/<pid>/fd/<fd>`; the addon checks it is that memfd of exactly that size) and
 * copies between the mapping and its own memory on the JS thread: READ and WRITE are then done at
 * once, and the notif follows over the connection. Each copy lies inside a region the peer
 * advertised, inside its mapping; the grant word is checked before each copy (and after a READ),
 * so a deregistered region is refused (`invalid`) as on the TCP path (a deregistration racing a
 * copy in progress is not seen by that copy). A mapping that does not open sends that peer's
 * transfers over TCP for good; memory not in a shared mapping, and peers elsewhere, use TCP.
 *
 * Device regions (VRAM, `device.ts`): registered with their device, address and CUDA IPC handle,
 * which the metadata carries with this process's host id ({@link DeviceMemory.hostId}). A READ or
 * WRITE whose every pair is local device memory and remote device memory of a peer with the same
 * host id opens the peer's IPC handles (cached per peer until its metadata changes) and copies on
 * a stream; the transfer completes (and its notif is sent) after the copies finished. Otherwise
 * device segments go over the TCP path through host staging buffers (pinned for CUDA): device to
 * staging before a WRITE frame or a READ answer is sent, staging to device after a READ answer or
 * a WRITE frame arrived, and only then the frame counts as done (WACK). Bounds are those of host
 * regions: every segment inside a live registered region of the right kind, checked at the
 * target for the TCP path; for IPC the target has granted the peer its whole registered device
 * region by publishing the handle, and the initiator checks each descriptor against the
 * advertised region before copying.
 *
 * Files: this one holds the agent (registration, descriptor lists, requests, device paths);
 * `embedded-conn.ts` its TCP connections (`OutConn`, `InConn`); `embedded-metadata.ts` its
 * metadata blob and decoder; `wire.ts` the frames and handshake.
 * @module
 */
import { EventEmitter } from 'node:events';
import { randomBytes, timingSafeEqual } from 'node:crypto';
import { checkBindHost, MIN_CLUSTER_SECRET_BYTES } from './auth.js';
import * as net from 'node:net';
import { ProtocolError, TransferError } from './errors.js';
import { deviceMemoryFor, StagingPool, type DeviceCopy, type DeviceMemory } from './device.js';
import { inFlatRegions, RegionTable, type DeviceRef, type HostRegion } from './memory.js';
import type {
  AgentCapabilities,
  DescList,
  MakeTransferArgs,
  MemoryKind,
  MemoryRegion,
  PostOptions,
  RegisteredRegion,
  Registration,
  TransferAgent,
  TransferErrorKind,
  TransferRequest,
  XferDesc,
  XferStatus,
} from './types.js';
import { F, MAX_NAME_LENGTH, MAX_NOTIF_BYTES, MAX_PAYLOAD_BYTES, MAX_SEGMENTS, SECRET_BYTES } from './wire.js';
import { EmbeddedRequest, InConn, MAX_LANES, OutConn, OutLink, READ_BUFFER_BYTES, type DevSeg, type OutFrame, type Pair } from './embedded-conn.js';
import { decodeMetadata, findPeerDevice, META_MAGIC, META_VERSION, packr, type PeerDeviceRegion, type PeerInfo, type PeerShmRegion } from './embedded-metadata.js';
import { processHoldsPeerSocket, sameHostKey, sharedMemoryBindings } from './shared-memory.js';
import type { NativeShm } from '@kvconnect/native';

import { checkDescs, checkKind, checkNotif, checkOpen, checkPositiveInt, checkPost, checkRegions, checkTransfer, endRequest, isCurrent, ownRequest, requestStatus, startPost, waitRequest } from './agent-base.js';

export { decodeMetadata, type PeerDeviceRegion, type PeerInfo, type PeerShm, type PeerShmRegion } from './embedded-metadata.js';

/** Options of {@link EmbeddedAgent.create}. */
export interface EmbeddedAgentOptions {
  /** Agent name (1..256 characters), unique among peers. */
  readonly name: string;
  /**
   * Address to listen on (default `127.0.0.1`; use `0.0.0.0` or an interface address across
   * hosts, which needs {@link clusterSecret}).
   */
  readonly host?: string;
  /**
   * The cluster secret (at least 16 bytes; `resolveClusterSecret` of `auth.ts`), or null: with it,
   * both sides of every connection prove knowledge of it in the handshake, before the per-agent
   * secret is checked, and a peer without it is refused. Agents of one deployment use the same.
   */
  readonly clusterSecret?: Uint8Array | null;
  /** A frame must complete within this many ms of its prefix (default 30 000); else the connection closes. */
  readonly frameTimeoutMs?: number;
  /** Most bytes of partially received notifs across incoming connections (default 64 MiB); a peer exceeding it is disconnected. */
  readonly maxBufferedBytes?: number;
  /** Most incoming connections (default 1024); beyond, new ones are closed at once. */
  readonly maxIncomingConnections?: number;
  /** Port to listen on (default 0: any free port). */
  readonly port?: number;
  /** Host that peers should connect to, written into the metadata (default: `host`, or `127.0.0.1` for a wildcard `host`). */
  readonly advertiseHost?: string;
  /**
   * TCP connections per remote agent (1..8, default 1): the first one's handshake, then
   * `lanes - 1` extra lanes bound to it, over which each transfer's frames are spread (see the
   * module note). On loopback UCX's TCP transport stripes over one connection per interface
   * (`ucx_perftest` with `UCX_TLS=tcp` on a host with lo and eth0: two); this is the like of it.
   * @throws TransferError `invalid` from {@link EmbeddedAgent.create} for anything but an integer in 1..8.
   */
  readonly lanes?: number;
  /**
   * Stall bound of outgoing connections in ms (0: off; default 5 000 with `lanes` above 1, 0
   * with one lane): a connection (the first or a lane) with frames outstanding that receives no
   * byte for this long is closed as dead (`remote-disconnect`), though its socket is open. Its
   * READ frames are requested again on the link's other ready lanes (safe: the closed socket
   * lands nothing more, and a READ changes nothing at the target); its WRITE frames fail as on a
   * lane that closed (the transfer fails once its frames on the other lanes were answered). A
   * stalled first connection ends the session as its close does. A transfer that ends at its
   * deadline (`timeout`) also closes as stalled each connection holding its frames that answered
   * no frame for this long (bytes that trickle in do not count: `OutConn.stallOnDeadline`). Must exceed the time one frame
   * (`chunkBytes`) takes over the link plus the target's answer time, including pauses of the
   * target's event loop (an engine's forward pass on the target's thread).
   * @throws TransferError `invalid` from {@link EmbeddedAgent.create} for anything but an integer in 0..2^31-1.
   */
  readonly stallTimeoutMs?: number;
  /** Most bytes of outstanding frames per outgoing connection, so per lane (default 64 MiB). */
  readonly maxInflightBytes?: number;
  /**
   * Most payload bytes per frame (default 4 MiB; at most 16 MiB, `MAX_PAYLOAD_BYTES` of `wire.ts`,
   * the most any peer accepts: 16 MiB frames were 15-30% slower than 4 MiB ones on the GPU
   * machine's host, bench/transfer-README.md). Frames with device segments, local or at the peer,
   * are cut at {@link STAGING_CHUNK_BYTES} (or this, if smaller): the size of their staging buffers.
   */
  readonly chunkBytes?: number;
  /** Default transfer deadline in milliseconds (default 30 000). */
  readonly transferTimeoutMs?: number;
  /** Connect plus handshake deadline in milliseconds (default 5 000). */
  readonly connectTimeoutMs?: number;
  /**
   * Most response bytes queued on one incoming connection before it stops reading that peer's
   * requests until the socket drains (default 256 MiB; READ answers, ERR refusals and WRITE
   * acknowledgements all count). Queued READ answers are views of registered memory, not copies; an initiator that respects its own window (`maxInflightBytes`, 64 MiB by
   * default) never reaches this limit, so it only throttles peers that ignore theirs.
   */
  readonly maxQueuedResponseBytes?: number;
  /** Most bytes of received, not yet polled notifs (default 64 MiB); a peer exceeding it is disconnected. */
  readonly maxQueuedNotifBytes?: number;
  /**
   * Testing only: accept incoming READ/WRITE frames but never answer them (a hung peer), so that
   * disconnect and timeout handling can be tested deterministically.
   */
  readonly stallIncoming?: boolean;
  /**
   * The device memory of VRAM regions (default: per region, {@link deviceMemoryFor} its address:
   * the emulated device memory when it holds it, else CUDA through the addon).
   */
  readonly deviceMemory?: DeviceMemory;
  /** Move device regions by CUDA IPC when the peer is on this host (default true; false: always the TCP path). */
  readonly deviceIpc?: boolean;
  /**
   * The same-host data plane (default true): advertise registered host memory that lies in shared
   * mappings (`SharedHostArena` of `shared-memory.ts`), and copy directly to and from such memory
   * of a peer on this host once the handshake with it is done (see the module note). False: always TCP.
   */
  readonly sharedMemory?: boolean;
}



/** A {@link TransferAgent} over TCP in plain Node. Create with {@link EmbeddedAgent.create}. */
export class EmbeddedAgent extends EventEmitter<{ 'protocol-error': [ProtocolError] }> implements TransferAgent {
  readonly backend = 'embedded';
  readonly capabilities: AgentCapabilities = Object.freeze({ memoryKinds: Object.freeze(['DRAM', 'VRAM'] as MemoryKind[]), read: true, write: true, notify: true });
  /** Live registered regions (internal; exposed for the wire handlers). */
  readonly regions = new RegionTable();
  /** Protocol errors seen since creation (also emitted as `protocol-error`). */
  protocolErrors = 0;
  /** @internal The one buffer every socket read of this agent's connections lands in (`SocketReads` of `embedded-conn.ts`). */
  readonly readBuffer = Buffer.allocUnsafe(READ_BUFFER_BYTES);

  private readonly secret = randomBytes(SECRET_BYTES);
  private readonly peers = new Map<string, PeerInfo>();
  private readonly conns = new Map<string, OutLink>();
  /** Peers whose target refused a lane for good (one from before lanes), with its refusal: no lane is opened to them until their metadata changes. */
  private readonly laneRefusals = new Map<string, string>();
  private readonly inConns = new Set<InConn>();
  private readonly registrations = new WeakMap<Registration, HostRegion[]>();
  private readonly lists = new WeakSet<DescList>();
  private readonly active = new Set<EmbeddedRequest>();
  private notifs = new Map<string, Uint8Array[]>();
  private notifBytes = 0;
  private closed = false;
  private readonly maxInflight: number;
  /** See {@link EmbeddedAgentOptions.lanes}. */
  readonly lanes: number;
  /** See {@link EmbeddedAgentOptions.stallTimeoutMs} (0: off). */
  readonly stallTimeoutMs: number;
  /**
   * Lane events since creation (tests and metrics): connections closed by the stall check, READ
   * frames requested again on another lane after a stall, lanes reopened after a backoff, peers
   * whose target refused a lane for good (`laneRefusals`).
   */
  readonly laneEvents = { stalled: 0, rerouted: 0, reopened: 0, refusedPeers: 0 };
  private readonly chunk: number;
  /** Most payload bytes of a frame with device segments: the size of the staging pools' buffers. */
  private readonly stageChunk: number;
  private readonly timeoutMs: number;
  /** Connect and handshake deadline, ms. */
  readonly connectTimeoutMs: number;
  /** See {@link EmbeddedAgentOptions.maxQueuedResponseBytes}. */
  readonly maxQueuedResponseBytes: number;
  /** See {@link EmbeddedAgentOptions.maxQueuedNotifBytes}. */
  readonly maxQueuedNotifBytes: number;
  /** See {@link EmbeddedAgentOptions.stallIncoming}. */
  readonly stall: boolean;
  private readonly deviceMemory: DeviceMemory | null;
  private readonly deviceIpc: boolean;
  /** Staging pools of the TCP path of device regions, per device memory. */
  private readonly pools = new Map<DeviceMemory, StagingPool>();
  /** Opened IPC mappings of peers' device regions: peer name -> region addr -> mapping. */
  private readonly ipcMaps = new Map<string, Map<number, { readonly address: bigint; readonly dm: DeviceMemory }>>();
  /** Peers whose IPC handles did not open here (their device regions go over TCP), with why. */
  private readonly ipcRefused = new Map<string, string>();
  /** Shared-memory bindings, or null (disabled, not Linux, addon without them). */
  private readonly shm: NativeShm | null;
  /** {@link sameHostKey} of this process (null: no same-host data plane). */
  private readonly hostKey: string | null;
  /** Grant words of this process's shared mappings that registrations hold, by memfd name. */
  private readonly grants = new Map<string, { readonly value: number; count: number; readonly view: Uint8Array }>();
  /** Mapped shared memory of peers: peer name -> memfd name -> the whole mapping and its grant word. */
  private readonly shmMaps = new Map<string, Map<string, { readonly bytes: Uint8Array; readonly grant: Uint32Array }>>();
  /** Peers whose shared memory did not map here (their transfers go over TCP), with why. */
  private readonly shmRefused = new Map<string, string>();
  /** Transfers and bytes moved through shared mappings (tests and metrics). */
  readonly shmStats = { transfers: 0, bytes: 0 };
  /** Transfers moved by CUDA IPC and over the TCP path with device staging (tests and metrics). */
  readonly deviceStats = { ipcTransfers: 0, ipcBytes: 0, stagedFrames: 0 };
  /** See {@link EmbeddedAgentOptions.frameTimeoutMs}. */
  readonly frameTimeoutMs: number;
  /** See {@link EmbeddedAgentOptions.maxBufferedBytes}. */
  readonly maxBufferedBytes: number;
  /** @internal Bytes of notifs being received across incoming connections. */
  partialNotifBytes = 0;
  private readonly cluster: Uint8Array | null;

  private constructor(
    readonly name: string,
    private readonly server: net.Server,
    /** Host and port peers connect to. */
    readonly address: { readonly host: string; readonly port: number },
    o: EmbeddedAgentOptions,
  ) {
    super();
    this.maxInflight = checkPositiveInt('maxInflightBytes', o.maxInflightBytes, 64 * 1024 * 1024);
    this.lanes = checkPositiveInt('lanes', o.lanes, 1, MAX_LANES);
    this.stallTimeoutMs = checkStallTimeout(o.stallTimeoutMs, this.lanes > 1 ? DEFAULT_STALL_TIMEOUT_MS : 0);
    this.chunk = checkPositiveInt('chunkBytes', o.chunkBytes, 4 * 1024 * 1024, MAX_PAYLOAD_BYTES);
    this.stageChunk = Math.min(this.chunk, STAGING_CHUNK_BYTES);
    this.timeoutMs = checkPositiveInt('transferTimeoutMs', o.transferTimeoutMs, 30_000);
    this.connectTimeoutMs = checkPositiveInt('connectTimeoutMs', o.connectTimeoutMs, 5_000);
    this.maxQueuedResponseBytes = checkPositiveInt('maxQueuedResponseBytes', o.maxQueuedResponseBytes, 256 * 1024 * 1024);
    this.maxQueuedNotifBytes = checkPositiveInt('maxQueuedNotifBytes', o.maxQueuedNotifBytes, 64 * 1024 * 1024);
    this.stall = o.stallIncoming === true;
    this.deviceMemory = o.deviceMemory ?? null;
    this.deviceIpc = o.deviceIpc !== false;
    this.hostKey = o.sharedMemory === false ? null : sameHostKey();
    this.shm = this.hostKey === null ? null : sharedMemoryBindings().shm;
    this.frameTimeoutMs = checkPositiveInt('frameTimeoutMs', o.frameTimeoutMs, 30_000);
    this.maxBufferedBytes = checkPositiveInt('maxBufferedBytes', o.maxBufferedBytes, 64 * 1024 * 1024);
    const maxIn = checkPositiveInt('maxIncomingConnections', o.maxIncomingConnections, 1024);
    this.cluster = checkClusterSecret(o.clusterSecret);
    server.on('connection', (s) => {
      if (this.closed || this.inConns.size >= maxIn) {
        s.on('error', () => {});
        s.destroy();
        return;
      }
      this.inConns.add(new InConn(this, s));
    });
    // Loopback transfers (to this agent itself) go through its own server.
    this.peers.set(name, { name, host: address.host, port: address.port, secret: this.secret, regions: [], hostId: null, devices: [], shm: null });
  }

  /**
   * Creates an agent listening on `host:port`.
   * @throws TransferError `invalid` for a bad name or option; the listen error as cause when the port is taken.
   */
  static async create(options: EmbeddedAgentOptions): Promise<EmbeddedAgent> {
    const { name } = options;
    if (typeof name !== 'string' || name.length === 0 || name.length > MAX_NAME_LENGTH) throw new TransferError('invalid', `agent name must be 1..${MAX_NAME_LENGTH} characters`);
    // Loopback unless a host is configured; another host only with a cluster secret.
    const host = checkBindHost(options.host, checkClusterSecret(options.clusterSecret), 'embedded agent');
    const server = net.createServer({ noDelay: true, pauseOnConnect: true }); // InConn adopts the socket before it reads
    await new Promise<void>((resolve, reject) => {
      server.once('error', (e) => reject(new TransferError('backend', `cannot listen on ${host}:${options.port ?? 0}: ${e.message}`, { cause: e })));
      server.listen({ host, port: options.port ?? 0 }, () => resolve());
    });
    const port = (server.address() as net.AddressInfo).port;
    const wildcard = host === '0.0.0.0' || host === '::';
    const advertise = options.advertiseHost ?? (wildcard ? '127.0.0.1' : host);
    try {
      return new EmbeddedAgent(name, server, { host: advertise, port }, options);
    } catch (e) {
      server.close();
      throw e;
    }
  }

  /** The agent's secret (internal: the wire handlers check HELLO proofs with it). */
  get secretBytes(): Uint8Array {
    return this.secret;
  }

  /** The cluster secret, or null (internal: the handshake proves it). */
  get clusterSecretBytes(): Uint8Array | null {
    return this.cluster;
  }

  /** Bytes incoming connections hold now (unparsed input and notifs being received); bounded by the options. */
  get bufferedBytes(): number {
    let n = 0;
    for (const c of this.inConns) n += c.buffered;
    return n;
  }

  /** Open incoming connections. */
  get incomingConnections(): number {
    return this.inConns.size;
  }

  private checkOpen(): void {
    checkOpen(this.closed, this.name);
  }

  async registerMemory(regions: readonly MemoryRegion[]): Promise<Registration> {
    this.checkOpen();
    const views: Array<Uint8Array | { ref: DeviceRef; length: number }> = [];
    for (const [i, r] of checkRegions(regions).entries()) {
      if ('bytes' in r) views.push(r.bytes);
      else if (r.kind === 'VRAM') views.push(this.deviceRegion(i, r));
      else throw new TransferError('invalid', `regions[${i}]: the embedded agent registers host memory given as bytes (DRAM) or device memory (VRAM)`);
    }
    const hosts = views.map((v) => (v instanceof Uint8Array ? this.regions.add(v) : this.regions.add(EMPTY, v)));
    for (const h of hosts) if (!h.device) this.grantShared(h);
    const reg: Registration = Object.freeze({
      regions: Object.freeze(hosts.map((h): RegisteredRegion => Object.freeze({ addr: h.addr, length: h.length, kind: h.device ? 'VRAM' : 'DRAM', deviceId: h.device?.device ?? 0 }))),
    });
    this.registrations.set(reg, hosts);
    return reg;
  }

  async deregisterMemory(registration: Registration): Promise<void> {
    const hosts = this.registrations.get(registration);
    if (!hosts) throw new TransferError('not-found', 'not a live registration of this agent');
    this.registrations.delete(registration);
    for (const c of this.inConns) c.reads.disarm(); // no in-place read into memory that is no longer granted
    for (const h of hosts) {
      this.regions.remove(h.addr);
      this.revokeShared(h);
    }
    // A transfer whose local memory this was fails (finish disarms its connection's in-place
    // read, and a late answer is no longer current): no byte lands in memory no longer registered.
    for (const req of [...this.active]) {
      if (req.pairs.some((p) => hosts.some((h) => p.local.addr < h.addr + h.length && h.addr < p.local.addr + p.local.length))) this.finish(req, 'invalid', 'local memory was deregistered during the transfer');
    }
  }

  async getLocalMetadata(): Promise<Uint8Array> {
    this.checkOpen();
    const fields: unknown[] = [META_MAGIC, META_VERSION, this.name, this.address.host, this.address.port, this.secret, this.regions.flat()];
    const dev = this.deviceMetadata();
    const shm = this.shmMetadata();
    fields.push(dev ?? null, shm ?? null); // META_VERSION 2: always 9 fields
    const b = packr.pack(fields);
    return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
  }

  async loadRemoteMetadata(metadata: Uint8Array): Promise<string> {
    this.checkOpen();
    const peer = decodeMetadata(metadata);
    const old = this.peers.get(peer.name);
    if (peer.name === this.name && peer.port === this.address.port && old) return peer.name; // our own
    if (old && (old.host !== peer.host || old.port !== peer.port || !timingSafeEqual(old.secret, peer.secret))) {
      this.conns.get(peer.name)?.fatal('remote-disconnect', `metadata of ${peer.name} was replaced`);
      this.laneRefusals.delete(peer.name); // another process: it may take lanes
    }
    if (old) {
      this.closeIpc(peer.name); // its device regions may have changed
      this.closeShm(peer.name);
    }
    this.peers.set(peer.name, peer);
    return peer.name;
  }

  async invalidateRemoteMetadata(agent: string): Promise<void> {
    if (agent === this.name) return;
    this.peers.delete(agent);
    this.laneRefusals.delete(agent);
    this.closeIpc(agent);
    this.closeShm(agent);
    this.conns.get(agent)?.fatal('not-found', `metadata of ${agent} was invalidated`);
  }

  async prepDescList(agent: string | null, kind: MemoryKind, descs: readonly XferDesc[]): Promise<DescList> {
    this.checkOpen();
    const vram = checkKind(kind) === 'VRAM';
    let check: (addr: number, len: number) => boolean;
    if (agent === null || agent === this.name) {
      check = (a, l) => {
        const r = this.regions.find(a, l);
        return r !== null && (r.device !== undefined) === vram;
      };
    } else {
      const peer = this.peers.get(agent);
      if (!peer) throw new TransferError('not-found', `no metadata loaded for agent ${JSON.stringify(agent)}`);
      check = (a, l) => inFlatRegions(peer.regions, a, l) && (findPeerDevice(peer.devices, a, l) !== null) === vram;
    }
    const copy: XferDesc[] = [];
    for (const [i, d] of checkDescs(descs).entries()) {
      if (!check(d.addr, d.length)) {
        throw new TransferError('invalid', `descs[${i}] (addr ${d.addr}, length ${d.length}) is not inside a registered ${kind} region of ${agent ?? this.name}`);
      }
      copy.push(vram ? d : Object.freeze({ addr: d.addr, length: d.length, deviceId: 0 }));
    }
    const list: DescList = Object.freeze({ agent, kind, descs: Object.freeze(copy) });
    this.lists.add(list);
    return list;
  }

  async releaseDescList(list: DescList): Promise<void> {
    this.lists.delete(list);
  }

  async makeTransfer(args: MakeTransferArgs): Promise<TransferRequest> {
    this.checkOpen();
    const t = checkTransfer(args, (l): l is DescList => this.lists.has(l), MAX_NOTIF_BYTES);
    const pairs: Pair[] = t.pairs.map(([local, remote]) => ({ local, remote }));
    return new EmbeddedRequest(this, t.op, t.remote.agent, pairs, t.bytes, t.notif);
  }

  private own(req: TransferRequest): EmbeddedRequest {
    return ownRequest(this, req, EmbeddedRequest);
  }

  async post(request: TransferRequest, options: PostOptions = {}): Promise<XferStatus> {
    this.checkOpen();
    const req = this.own(request);
    const timeoutMs = checkPost(req, options, this.timeoutMs, MAX_NOTIF_BYTES);
    if (options.notif !== undefined) req.notif = options.notif;
    startPost(req);
    // Resolve local memory now: a region deregistered since makeTransfer fails the post.
    const peer = this.peers.get(req.remoteAgent);
    if (!peer) return this.finish(req, 'not-found', `no metadata loaded for agent ${JSON.stringify(req.remoteAgent)}`);
    const viaIpc = this.postIpc(req, peer, timeoutMs);
    if (viaIpc !== null) return viaIpc;
    const viaShm = this.postShm(req, peer, timeoutMs);
    if (viaShm !== null) return viaShm;
    return this.postTcp(req, peer, timeoutMs);
  }

  /** Posts `req` over the TCP connection to `peer`: frames of at most `chunkBytes`, the deadline in `timeoutMs`. */
  private postTcp(req: EmbeddedRequest, peer: PeerInfo, timeoutMs: number): XferStatus {
    const frames: OutFrame[] = [];
    let cur: OutFrame | null = null;
    /** The current frame has device segments, here or at the peer (which stages them too). */
    let curStaged = false;
    const t = req.op === 'READ' ? F.READ : F.WRITE;
    for (const [i, p] of req.pairs.entries()) {
      const r = this.regions.find(p.local.addr, p.local.length);
      if (!r) return this.finish(req, 'invalid', `pair ${i}: local descriptor is no longer inside registered memory`);
      const view = r.view.subarray(p.local.addr - r.addr, p.local.addr - r.addr + p.local.length);
      let off = 0;
      // A frame holding device segments, local or remote, is cut at the staging buffers' size.
      const staged = r.device !== undefined || (peer.devices.length > 0 && findPeerDevice(peer.devices, p.remote.addr, p.remote.length) !== null);
      const cap = () => (staged || curStaged ? this.stageChunk : this.chunk);
      while (off < p.local.length) {
        if (!cur || cur.bytes >= cap() || cur.segs.length >= 2 * MAX_SEGMENTS) {
          cur = { id: 0, req, gen: req.gen, t, segs: [], locals: [], bytes: 0 };
          frames.push(cur);
          curStaged = false;
        }
        curStaged ||= staged;
        const k = Math.min(p.local.length - off, cap() - cur.bytes);
        cur.segs.push(p.remote.addr + off, k);
        if (r.device) (cur.dev ??= []).push({ i: cur.locals.length, at: cur.bytes, region: r, off: p.local.addr - r.addr + off, len: k });
        cur.locals.push(off === 0 && k === view.length ? view : view.subarray(off, off + k));
        (cur as { bytes: number }).bytes += k;
        off += k;
      }
    }
    req.pending = frames.length;
    req.onWire = 0;
    req.failing = null;
    this.active.add(req);
    req.timer = setTimeout(() => this.finish(req, 'timeout', `transfer did not finish within ${timeoutMs} ms`), timeoutMs);
    req.timer.unref();
    this.conn(peer).enqueue(frames);
    return requestStatus(req);
  }

  status(request: TransferRequest): XferStatus {
    return requestStatus(this.own(request));
  }

  wait(request: TransferRequest): Promise<XferStatus> {
    return waitRequest(this.own(request));
  }

  async release(request: TransferRequest): Promise<void> {
    const req = this.own(request);
    if (req.state === 'in-progress') this.finish(req, 'canceled', 'released while in progress');
    req.released = true;
  }

  async sendNotif(agent: string, message: Uint8Array): Promise<void> {
    this.checkOpen();
    const msg = checkNotif(message, MAX_NOTIF_BYTES);
    const peer = this.peers.get(agent);
    if (!peer) throw new TransferError('not-found', `no metadata loaded for agent ${JSON.stringify(agent)}`);
    return this.conn(peer).primary.sendNotif(msg);
  }

  async pollNotifs(): Promise<Map<string, Uint8Array[]>> {
    const out = this.notifs;
    this.notifs = new Map();
    this.notifBytes = 0;
    return out;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const req of [...this.active]) this.finish(req, 'canceled', `agent ${this.name} closed`);
    for (const c of [...this.conns.values()]) c.fatal('canceled', `agent ${this.name} closed`);
    for (const c of this.inConns) c.socket.destroy();
    for (const peer of [...this.ipcMaps.keys()]) this.closeIpc(peer);
    for (const peer of [...this.shmMaps.keys()]) this.closeShm(peer);
    for (const g of this.grants.values()) this.shm?.setGrant(g.view, 0); // peers may no longer copy
    this.grants.clear();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  // ---- internal, called by the connections ----

  private conn(peer: PeerInfo): OutLink {
    let c = this.conns.get(peer.name);
    if (!c || c.isClosed) {
      c = new OutLink(this, peer, this.laneRefusals.has(peer.name) ? 1 : this.lanes, this.maxInflight, this.connectTimeoutMs);
      this.conns.set(peer.name, c);
    }
    return c;
  }

  /**
   * @internal A connection closed: when it was a link's first, the session ended and its extra
   * lanes close with the same error; an extra lane alone is replaced by its link after a backoff,
   * or, refused for good, marks the target as one that takes no lanes (`OutLink.laneClosed`).
   */
  connClosed(c: OutConn, kind: TransferErrorKind, message: string): void {
    const link = this.conns.get(c.peer.name);
    if (link === undefined) return;
    if (link.primary !== c) {
      link.laneClosed(c);
      return;
    }
    this.conns.delete(c.peer.name);
    link.fatal(kind, message);
  }

  /**
   * The lanes to `agent` now (tests and metrics): per lane, whether its handshake is done and the
   * frames it sent; empty when there is no connection.
   */
  laneStats(agent: string): Array<{ readonly ready: boolean; readonly framesSent: number }> {
    return (this.conns.get(agent)?.lanes ?? []).map((l) => ({ ready: l.isReady, framesSent: l.framesSent }));
  }

  /**
   * Why the target `agent` takes no lanes from this agent (the refusal of a lane HELLO by a target
   * from before lanes, `OutLink`), or null: while set, connections to it open no extra lane; it is
   * forgotten when `agent`'s metadata changes (another host, port or secret) or is invalidated.
   */
  laneRefusal(agent: string): string | null {
    return this.laneRefusals.get(agent) ?? null;
  }

  /** @internal The target `agent` refused a lane for good (`OutLink.laneClosed`): no lane is opened to it again. */
  refuseLanes(agent: string, refusal: string): void {
    if (this.laneRefusals.has(agent) || !this.peers.has(agent)) return;
    this.laneRefusals.set(agent, refusal);
    this.laneEvents.refusedPeers++;
  }

  /** @internal The open first connection from `name` whose challenge was `nonce` (a session an extra lane may join), or null. */
  findSession(name: string, nonce: Uint8Array): InConn | null {
    for (const c of this.inConns) if (c.isSession(name, nonce)) return c;
    return null;
  }

  /** Extra lanes that joined the open sessions of incoming connections (tests and metrics). */
  get incomingLanes(): number {
    let n = 0;
    for (const c of this.inConns) n += c.lanes;
    return n;
  }

  /** @internal */
  inClosed(c: InConn): void {
    this.inConns.delete(c);
  }

  /**
   * @internal A connection of a link stalled (`OutConn.stalled`, option `stallTimeoutMs`) and
   * closed; `frames` are the ones it held (outstanding and queued). A READ frame of a current
   * transfer goes to the link's other ready lanes when there is one: the stalled socket is closed,
   * so nothing more of its answer can land, and a READ changes nothing at the target, so asking
   * again is safe. Every other frame fails as a closed connection's ({@link frameFailed}): a WRITE
   * once its frames on the other lanes were answered.
   */
  laneStalled(c: OutConn, frames: readonly OutFrame[], kind: TransferErrorKind, message: string): void {
    this.laneEvents.stalled++;
    const link = this.conns.get(c.peer.name);
    const other = link !== undefined && !link.isClosed && link.lanes.some((l) => l !== c && l.isReady);
    const again: OutFrame[] = [];
    for (const f of frames) {
      if (other && f.t === F.READ && isCurrent(f.req, f.gen)) {
        offWire(f);
        if (f.stage) f.stage = undefined; // its staging is dropped (not reused), a new one taken when sent
        again.push(f);
      } else this.frameFailed(f, kind, message, true);
    }
    this.laneEvents.rerouted += again.length;
    if (again.length > 0) link!.enqueue(again);
  }

  /** @internal A frame was answered (RDATA received, WACK), or its staging copy after that finished. */
  frameDone(f: OutFrame, conn: OutConn): void {
    offWire(f);
    if (f.stage) {
      this.landFrame(f, conn);
      return;
    }
    const req = f.req;
    if (!isCurrent(req, f.gen)) return;
    if (req.failing !== null) {
      if (req.onWire === 0) this.finish(req, req.failing.kind, req.failing.message);
      return;
    }
    if (--req.pending > 0) return;
    // Every frame landed: now the notif (on the link's first connection; with one lane it travels
    // behind the data).
    if (req.notif) conn.notifConn.sendNotif(req.notif).catch(() => {});
    this.finish(req, 'done', null);
  }

  /**
   * @internal A frame failed: refused (ERR), a device copy failed, or its connection closed
   * (`connClosed`). The transfer fails with that error at once, except a WRITE whose connection
   * closed while frames of it are still on the wire on other lanes: the target may still be
   * copying those into its memory, so it fails once they are answered or failed too (or at its
   * deadline), and its frames not yet sent are dropped (`EmbeddedRequest.failing`). So, as with
   * one connection, no byte of a WRITE that failed with `remote-disconnect` lands at the target
   * after it returned (a `timeout`, `canceled` or refused WRITE may still land what was on the wire).
   */
  frameFailed(f: OutFrame, kind: TransferErrorKind, message: string, connClosed = false): void {
    if (f.stage) f.stage = null; // not reused: a copy or a socket write may still hold it
    offWire(f);
    const req = f.req;
    if (!isCurrent(req, f.gen)) return;
    if (req.failing === null && !(connClosed && req.op === 'WRITE')) {
      this.finish(req, kind, message);
      return;
    }
    req.failing ??= { kind, message };
    if (req.onWire === 0) this.finish(req, req.failing.kind, req.failing.message);
  }

  private finish(req: EmbeddedRequest, state: XferStatus, message: string | null): XferStatus {
    if (!endRequest(req, state, message)) return requestStatus(req);
    // Its local memory is the caller's again: no in-place read of a late answer into it.
    this.conns.get(req.remoteAgent)?.disarm();
    this.active.delete(req);
    // A lane that held its frames to the deadline answering none is dead or dripping (stallTimeoutMs).
    if (state === 'timeout' && this.stallTimeoutMs > 0) this.conns.get(req.remoteAgent)?.stallOnDeadline(req);
    return state;
  }

  /** @internal Queues a received notif; false when the queue limit is exceeded. */
  queueNotif(from: string, msg: Uint8Array): boolean {
    if (this.notifBytes + msg.byteLength > this.maxQueuedNotifBytes) return false;
    this.notifBytes += msg.byteLength;
    let l = this.notifs.get(from);
    if (!l) this.notifs.set(from, (l = []));
    l.push(msg);
    return true;
  }

  /** @internal */
  reportProtocolError(e: ProtocolError): void {
    this.protocolErrors++;
    this.emit('protocol-error', e);
  }

  // ---- same-host host memory (see the module note) ----

  /** A host region that lies in a shared mapping of this process: its grant (held while registered) and where it is. */
  private grantShared(h: HostRegion): void {
    const info = this.shm?.lookup(h.view);
    if (!info) return;
    let g = this.grants.get(info.name);
    if (!g) this.grants.set(info.name, (g = { value: randomBytes(4).readUInt32LE(0) || 1, count: 0, view: h.view }));
    if (g.count++ === 0) this.shm!.setGrant(h.view, g.value);
    h.shm = { name: info.name, fd: info.fd, size: info.size, offset: info.offset, grant: g.value };
  }

  /** Drops a deregistered region's grant; the mapping's grant word clears when no registration holds it. */
  private revokeShared(h: HostRegion): void {
    if (!h.shm) return;
    const g = this.grants.get(h.shm.name);
    if (!g || --g.count > 0) return;
    this.grants.delete(h.shm.name);
    this.shm!.setGrant(h.view, 0);
  }

  /** The metadata's shared-memory field `[hostKey, pid, [[addr, length, name, fd, size, offset, grant], ...]]`, or null. */
  private shmMetadata(): [string, number, Array<[number, number, string, number, number, number, number]>] | null {
    if (!this.shm || this.hostKey === null) return null;
    const flat = this.regions.flat();
    const out: Array<[number, number, string, number, number, number, number]> = [];
    for (let i = 0; i < flat.length; i += 2) {
      const r = this.regions.find(flat[i]!, flat[i + 1]!)!;
      if (r.shm) out.push([r.addr, r.length, r.shm.name, r.shm.fd, r.shm.size, r.shm.offset, r.shm.grant]);
    }
    return out.length === 0 ? null : [this.hostKey, process.pid, out];
  }

  /** Forgets the mappings of `peer`'s shared memory (they are unmapped once collected). */
  private closeShm(peer: string): void {
    this.shmMaps.delete(peer);
    this.shmRefused.delete(peer);
  }

  /** The mapping of a peer's shared memory in this process (mapped once, cached). */
  private shmMapping(peer: PeerInfo, rr: PeerShmRegion): { readonly bytes: Uint8Array; readonly grant: Uint32Array } {
    let m = this.shmMaps.get(peer.name);
    if (!m) this.shmMaps.set(peer.name, (m = new Map()));
    const hit = m.get(rr.name);
    if (hit) return hit;
    const ab = this.shm!.map(`/proc/${peer.shm!.pid}/fd/${rr.fd}`, rr.size, rr.name);
    const v = { bytes: new Uint8Array(ab), grant: new Uint32Array(ab, 0, 1) };
    m.set(rr.name, v);
    return v;
  }

  /**
   * Posts `req` through shared mappings when every pair is local host memory and host memory a
   * peer on this host advertised in a shared mapping; null when the TCP path must move it. Before
   * the handshake with the peer is done it waits for it (then copies, or falls back to TCP).
   */
  private postShm(req: EmbeddedRequest, peer: PeerInfo, timeoutMs: number): XferStatus | null {
    const ps = peer.shm;
    if (!this.shm || !ps || ps.hostKey !== this.hostKey || this.shmRefused.has(peer.name)) return null;
    const plan: ShmCopy[] = [];
    for (const p of req.pairs) {
      const l = this.regions.find(p.local.addr, p.local.length);
      const rr = findPeerDevice(ps.regions, p.remote.addr, p.remote.length);
      if (!l || l.device || !rr) return null;
      plan.push({ local: l.view.subarray(p.local.addr - l.addr, p.local.addr - l.addr + p.local.length), rr, at: rr.offset + (p.remote.addr - rr.addr), len: p.local.length });
    }
    const conn = this.conn(peer).primary;
    if (conn.isReady) return this.copyShm(req, peer, plan);
    const gen = req.gen;
    const deadline = Date.now() + timeoutMs;
    this.active.add(req);
    req.timer = setTimeout(() => this.finish(req, 'timeout', `transfer did not finish within ${timeoutMs} ms`), timeoutMs);
    req.timer.unref();
    conn.whenReady().then(
      () => {
        if (!isCurrent(req, gen)) return;
        clearTimeout(req.timer!);
        req.timer = null;
        if (this.copyShm(req, peer, plan) === null) this.postTcp(req, peer, Math.max(1, deadline - Date.now()));
      },
      (e: unknown) => {
        if (isCurrent(req, gen)) this.finish(req, e instanceof TransferError ? e.kind : 'remote-disconnect', e instanceof Error ? e.message : String(e));
      },
    );
    return 'in-progress';
  }

  /**
   * Copies the pairs of `req` between local memory and the peer's mappings (after the handshake).
   * Every copy lies inside the region the peer advertised, which lies inside its mapping (checked
   * at decode, and the mapping's exact size when it was mapped); the peer's grant word must still
   * hold the advertised value before each copy, and, for READ, after the last. Null when the
   * peer's memory does not map here (for good: then the TCP path).
   */
  private copyShm(req: EmbeddedRequest, peer: PeerInfo, plan: readonly ShmCopy[]): XferStatus | null {
    const maps: Array<{ readonly bytes: Uint8Array; readonly grant: Uint32Array }> = [];
    try {
      // The advertised process must be the one that answered this connection's handshake (not
      // another process's mappings re-advertised): checked once per peer metadata.
      if (!this.shmMaps.has(peer.name) && !processHoldsPeerSocket(peer.shm!.pid, this.conn(peer).primary.socket)) throw new Error(`${peer.name}'s shared mappings are advertised for process ${peer.shm!.pid}, which does not hold this connection`);
      for (const c of plan) maps.push(this.shmMapping(peer, c.rr));
    } catch (e) {
      this.shmRefused.set(peer.name, e instanceof Error ? e.message : String(e));
      return null;
    }
    const revoked = () => this.finish(req, 'invalid', `${peer.name} no longer grants that memory (deregistered, or its metadata is stale)`);
    for (let i = 0; i < plan.length; i++) {
      const c = plan[i]!;
      const m = maps[i]!;
      if (m.grant[0] !== c.rr.grant) return revoked();
      if (c.at + c.len > m.bytes.byteLength) return this.finish(req, 'invalid', `pair ${i} is outside ${peer.name}'s mapping`);
      const remote = m.bytes.subarray(c.at, c.at + c.len);
      if (req.op === 'READ') c.local.set(remote);
      else remote.set(c.local);
    }
    if (req.op === 'READ' && maps.some((m, i) => m.grant[0] !== plan[i]!.rr.grant)) return revoked();
    this.shmStats.transfers++;
    this.shmStats.bytes += req.bytes;
    // The bytes are in place: now the notif (over the TCP connection, as for the TCP path).
    if (req.notif) this.conn(peer).primary.sendNotif(req.notif).catch(() => {});
    return this.finish(req, 'done', null);
  }

  // ---- device regions (see the module note) ----

  /** Checks a VRAM region to register and finds its device memory. */
  private deviceRegion(i: number, r: { readonly addr: number; readonly length: number; readonly deviceId: number; readonly ipcHandle: Uint8Array | null }): { ref: DeviceRef; length: number } {
    const { addr, length } = r; // checked by checkRegions
    const device = r.deviceId;
    const address = BigInt(addr);
    let dm: DeviceMemory;
    try {
      dm = this.deviceMemory ?? deviceMemoryFor(address);
    } catch (e) {
      throw new TransferError('invalid', `regions[${i}]: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
    }
    if (!dm.owns(address, length)) throw new TransferError('invalid', `regions[${i}]: [0x${address.toString(16)}, +${length}) is not device memory allocated through this process's ${dm.backend} device memory (DeviceMemory.alloc)`);
    return { ref: { dm, device, address, ipcHandle: r.ipcHandle }, length };
  }

  /** The metadata's device field: `[hostId, [[addr, length, deviceId, ipcHandle | null], ...]]`, or null without device regions. */
  private deviceMetadata(): [string, Array<[number, number, number, Uint8Array | null]>] | null {
    const flat = this.regions.flat();
    let hostId: string | null = null;
    const out: Array<[number, number, number, Uint8Array | null]> = [];
    for (let i = 0; i < flat.length; i += 2) {
      const r = this.regions.find(flat[i]!, flat[i + 1]!)!;
      if (!r.device) continue;
      hostId ??= r.device.dm.hostId;
      out.push([r.addr, r.length, r.device.device, r.device.dm.hostId === hostId ? r.device.ipcHandle : null]);
    }
    return hostId === null ? null : [hostId, out];
  }

  private stagingPool(dm: DeviceMemory): StagingPool {
    let p = this.pools.get(dm);
    if (!p) this.pools.set(dm, (p = new StagingPool(dm, this.stageChunk)));
    return p;
  }

  /** Unmaps every IPC mapping of `peer`'s regions. */
  private closeIpc(peer: string): void {
    const m = this.ipcMaps.get(peer);
    this.ipcMaps.delete(peer);
    this.ipcRefused.delete(peer);
    if (!m) return;
    for (const v of m.values()) {
      try {
        v.dm.closeIpc(v.address);
      } catch {
        /* already gone */
      }
    }
  }

  /** The mapping of a peer's device region in this process (opened once, cached). */
  private ipcMapping(peer: PeerInfo, rr: PeerDeviceRegion, local: DeviceRef): bigint {
    let m = this.ipcMaps.get(peer.name);
    if (!m) this.ipcMaps.set(peer.name, (m = new Map()));
    const hit = m.get(rr.addr);
    if (hit) return hit.address;
    const address = local.dm.openIpc(local.device, rr.ipcHandle!, rr.length);
    m.set(rr.addr, { address, dm: local.dm });
    return address;
  }

  /**
   * Posts `req` by CUDA IPC when every pair is local device memory and a device region of a peer
   * on this host; null when the TCP path must move it (or a handle did not open: then for good).
   */
  private postIpc(req: EmbeddedRequest, peer: PeerInfo, timeoutMs: number): XferStatus | null {
    if (!this.deviceIpc || peer.hostId === null || peer.devices.length === 0 || this.ipcRefused.has(peer.name)) return null;
    const plan: Array<{ dev: DeviceRef; local: bigint; remote: bigint; len: number }> = [];
    try {
      for (const p of req.pairs) {
        const l = this.regions.find(p.local.addr, p.local.length);
        const rr = findPeerDevice(peer.devices, p.remote.addr, p.remote.length);
        if (!l?.device || !rr?.ipcHandle || l.device.dm.hostId !== peer.hostId) return null;
        const mapped = this.ipcMapping(peer, rr, l.device);
        const local = l.device.address + BigInt(p.local.addr - l.addr);
        const remote = mapped + BigInt(p.remote.addr - rr.addr);
        const last = plan[plan.length - 1];
        if (last && last.dev === l.device && last.local + BigInt(last.len) === local && last.remote + BigInt(last.len) === remote) last.len += p.local.length;
        else plan.push({ dev: l.device, local, remote, len: p.local.length });
      }
    } catch (e) {
      this.ipcRefused.set(peer.name, e instanceof Error ? e.message : String(e));
      return null;
    }
    const copies: DeviceCopy[] = [];
    try {
      for (const c of plan) {
        const [dst, src] = req.op === 'READ' ? [c.local, c.remote] : [c.remote, c.local];
        copies.push(c.dev.dm.copyAsync(c.dev.device, 'd2d', dst, src, c.len));
      }
    } catch (e) {
      for (const c of copies) c.release();
      return this.finish(req, 'backend', `CUDA IPC copy failed: ${e instanceof Error ? e.message : String(e)}`);
    }
    const gen = req.gen;
    this.active.add(req);
    req.timer = setTimeout(() => this.finish(req, 'timeout', `transfer did not finish within ${timeoutMs} ms`), timeoutMs);
    req.timer.unref();
    Promise.all(copies.map((c) => c.settled())).then(
      () => {
        for (const c of copies) c.release();
        if (!isCurrent(req, gen)) return;
        this.deviceStats.ipcTransfers++;
        this.deviceStats.ipcBytes += req.bytes;
        // The copies finished: now the notif (over the TCP connection, as for the TCP path).
        if (req.notif) this.conn(peer).primary.sendNotif(req.notif).catch(() => {});
        this.finish(req, 'done', null);
      },
      (e: unknown) => {
        for (const c of copies) c.release();
        if (req.gen === gen) this.finish(req, 'backend', `CUDA IPC copy failed: ${e instanceof Error ? e.message : String(e)}`);
      },
    );
    return 'in-progress';
  }

  /**
   * @internal Copies between a staging buffer (segment `d` at byte `d.at`) and the device
   * segments, merging runs contiguous in both; resolves once every copy finished.
   */
  deviceCopies(buf: Uint8Array, dev: readonly DevSeg[], kind: 'd2h' | 'h2d'): Promise<void> {
    const copies: DeviceCopy[] = [];
    try {
      for (let j = 0; j < dev.length; ) {
        const d = dev[j]!;
        let len = d.len;
        let k = j + 1;
        while (k < dev.length && dev[k]!.region === d.region && dev[k]!.off === d.off + len && dev[k]!.at === d.at + len) len += dev[k++]!.len;
        if (!d.region.alive) throw new TransferError('invalid', 'device memory was deregistered during the transfer');
        const ref = d.region.device!;
        const host = buf.subarray(d.at, d.at + len);
        const addr = ref.address + BigInt(d.off);
        copies.push(kind === 'd2h' ? ref.dm.copyAsync(ref.device, 'd2h', host, addr, len) : ref.dm.copyAsync(ref.device, 'h2d', addr, host, len));
        j = k;
      }
    } catch (e) {
      for (const c of copies) c.release();
      return Promise.reject(e);
    }
    this.deviceStats.stagedFrames++;
    return Promise.all(copies.map((c) => c.settled())).then(
      () => {
        for (const c of copies) c.release();
      },
      (e: unknown) => {
        for (const c of copies) c.release();
        throw e;
      },
    );
  }

  /**
   * @internal Staging of an outgoing frame's device segments, when it is about to be sent: its
   * locals become staging views; a WRITE first copies device to staging (the promise; the frame
   * is sent once it resolves, or failed). Null when the frame can be sent now (READ).
   */
  stageFrame(f: OutFrame): Promise<void> | null {
    const dev = f.dev!;
    const pool = this.stagingPool(dev[0]!.region.device!.dm);
    const buf = pool.take(f.bytes);
    f.stage = { buf, pool };
    for (const d of dev) f.locals[d.i] = buf.subarray(d.at, d.at + d.len);
    if (f.t === F.READ) return null;
    return this.deviceCopies(buf, dev, 'd2h').catch((e: unknown) => this.frameFailed(f, 'backend', `device copy failed: ${e instanceof Error ? e.message : String(e)}`));
  }

  /** An outgoing frame with staging landed: a READ copies staging to device first; then it counts as done. */
  private landFrame(f: OutFrame, conn: OutConn): void {
    const { buf, pool } = f.stage!;
    const live = isCurrent(f.req, f.gen);
    if (f.t === F.WRITE || !live) {
      f.stage = null;
      pool.give(buf); // acknowledged (WRITE) or answered: no copy and no socket write holds it
      if (live) this.frameDone(f, conn);
      return;
    }
    this.deviceCopies(buf, f.dev!, 'h2d').then(
      () => {
        f.stage = null;
        pool.give(buf);
        this.frameDone(f, conn);
      },
      (e: unknown) => this.frameFailed(f, 'backend', `device copy failed: ${e instanceof Error ? e.message : String(e)}`),
    );
  }

  /** @internal A target's staging for the device segments of an incoming READ or WRITE (`views` of them become staging views). */
  stageTarget(views: Uint8Array[], dev: readonly DevSeg[], bytes: number): { buf: Uint8Array; pool: StagingPool } {
    const pool = this.stagingPool(dev[0]!.region.device!.dm);
    const buf = pool.take(bytes);
    for (const d of dev) views[d.i] = buf.subarray(d.at, d.at + d.len);
    return { buf, pool };
  }
}


const EMPTY = new Uint8Array(0);

/** A frame left the wire (answered, refused, or its connection closed): no longer counted in its post's `onWire`. */
function offWire(f: OutFrame): void {
  if (!f.wire) return;
  f.wire = false;
  if (f.gen === f.req.gen) f.req.onWire--;
}

/** Default of {@link EmbeddedAgentOptions.stallTimeoutMs} with more than one lane, ms. */
export const DEFAULT_STALL_TIMEOUT_MS = 5_000;
/** Longest delay a Node timer takes (2^31 - 1 ms); longer ones fire at once. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * Bytes of the host staging buffers of the TCP path of device regions (`StagingPool` of
 * `device.ts`; pinned for CUDA), and so the most payload of a frame with device segments: 4 MiB,
 * also the default frame size, so that pinned staging stays 4 MiB whatever `chunkBytes` is.
 */
export const STAGING_CHUNK_BYTES = 4 * 1024 * 1024;

/** One pair of a same-host copy: the local view, the peer's region and the byte range in its mapping. */
interface ShmCopy {
  readonly local: Uint8Array;
  readonly rr: PeerShmRegion;
  /** Offset in the mapping (header page included). */
  readonly at: number;
  readonly len: number;
}

/** The `stallTimeoutMs` option: `dflt` when unset, else an integer in 0..{@link MAX_TIMER_MS}. */
function checkStallTimeout(v: number | undefined, dflt: number): number {
  if (v === undefined) return dflt;
  if (!Number.isSafeInteger(v) || v < 0 || v > MAX_TIMER_MS) throw new TransferError('invalid', `stallTimeoutMs must be an integer in 0..${MAX_TIMER_MS}`);
  return v;
}

/** A cluster secret option: null when unset; a copy of at least MIN_CLUSTER_SECRET_BYTES bytes. */
function checkClusterSecret(x: Uint8Array | null | undefined): Uint8Array | null {
  if (x === undefined || x === null) return null;
  if (!(x instanceof Uint8Array) || x.length < MIN_CLUSTER_SECRET_BYTES) throw new TransferError('invalid', `clusterSecret must be at least ${MIN_CLUSTER_SECRET_BYTES} bytes`);
  return Uint8Array.prototype.slice.call(x);
}




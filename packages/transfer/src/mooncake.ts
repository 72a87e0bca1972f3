/**
 * The Mooncake agent: a {@link TransferAgent} over the Mooncake Transfer Engine's C API
 * (`libtransfer_engine.so`, `transfer_engine_c.h`), which the native addon loads at run time with
 * dlopen (`native/src/mooncake_addon.cc`). The addon builds and loads where Mooncake is absent;
 * only {@link MooncakeAgent.create} needs the library and fails with an Error whose message starts
 * `Mooncake Transfer Engine not available:` and lists every path tried.
 *
 * Where the library is looked for ({@link mooncakeLibraryCandidates}), first match wins:
 * 1. `$MOONCAKE_LIBRARY` (a file path; tests point it at
 *    `native/build/test/libfake_transfer_engine.so`);
 * 2. `$MOONCAKE_PREFIX/lib/libtransfer_engine.so`, `$MOONCAKE_PREFIX/lib/<arch>-linux-gnu/...`,
 *    `$MOONCAKE_PREFIX/lib64/libtransfer_engine.so`;
 * 3. `libtransfer_engine.so` on the library path (LD_LIBRARY_PATH, ld.so cache).
 * The real library needs `libibverbs.so.1` at run time even without RDMA hardware.
 *
 * Model. Each agent owns one Transfer Engine created with `P2PHANDSHAKE` metadata (no metadata
 * server): its segment name is what `getLocalIpAndPort` returns (`ip:port`, random port). The
 * metadata blob ({@link encodeMooncakeMetadata}) carries the agent's name, that segment name and
 * its registered regions with their absolute addresses (the C API cannot list a peer's buffers,
 * and `target_offset` is the peer's absolute address). Loading a peer's blob opens its segment
 * (re-reading the peer's buffer list when it was opened before, so regions registered since are
 * usable). A request is one batch (`allocateBatchID` / `submitTransfer[WithNotify]`); the
 * addon's thread polls every task with `getTransferStatus` until it is final, then frees the
 * batch. Notifs ride the engine's notify messages: transfer-bound ones are attached to the batch
 * and sent by the engine when the initiator sees the whole batch COMPLETED (the addon always
 * polls to the end, so they are sent even after a timeout or release); standalone ones use
 * `genNotifyInEngine`. Notify strings are NUL-terminated, so payloads travel base64-encoded
 * (`kvc1:<base64>`); the notify name is the sender's agent name (not authenticated).
 *
 * Bounds. The Transfer Engine accepts a descriptor outside the peer's registered memory and
 * fails only when polled; this agent refuses such descriptors before submitting: remote ones
 * against the regions the peer advertised, local ones against this agent's live registrations
 * (checked again at every post when either changed since the request was made).
 *
 * Error mapping: a task that ends FAILED is `remote-disconnect` (the descriptors were already
 * validated, so the peer or transport failed, or the peer deregistered the memory), TIMEOUT is
 * `timeout`, CANCELED `canceled`, INVALID `invalid`; a refused submit or a failing status call is
 * `backend`; a peer whose segment cannot be opened is `remote-disconnect`.
 *
 * Limits (the C API's): there is no cancel, so a released or timed-out transfer keeps running in
 * the engine until it ends (its bytes may still land; do not reuse the memory before the peer
 * is known to be done); the engine has no peer authentication: anyone who can reach its ports
 * and knows the segment name can access registered memory. `host` only names the segment
 * (`local_server_name`): the real engine's P2P handshake listener and TCP data listener bind to
 * every interface whatever it says (Mooncake `transfer_metadata_plugin.cpp` `findAvailableTcpPort`
 * binds `INADDR_ANY`, `tcp_transport_session_impl.h` `TcpContext` binds the any address;
 * `MC_TCP_BIND_ADDRESS` only changes the advertised address, and only outside P2PHANDSHAKE), so
 * firewall those ports (`docs/security.md (Mooncake)`); over TCP "protocol v1", COMPLETED can precede the bytes being visible at
 * the target (Mooncake PR #2086), so verify on the consumer (kvconnect's checksums do).
 * @module
 */
import { checkDescs, checkKind, checkNotif, checkOpen, checkPositiveInt, checkPost, checkRegions, checkTransfer, endRequest, isCurrent, ownRequest, requestStatus, RequestState, startPost, waitRequest } from './agent-base.js';
import type { MooncakeEngineCore, NativeMooncake } from '@kvconnect/native';
import { TransferError } from './errors.js';
import { inFlatRegions } from './memory.js';
import { groupNotifs, libraryCandidates, loadNativeLibrary, nativeBindings } from './native-agent.js';
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
  XferOp,
  XferStatus,
} from './types.js';

/** Task statuses of the C API (`STATUS_*` of transfer_engine_c.h). */
export const MOONCAKE_STATUS = { WAITING: 0, PENDING: 1, INVALID: 2, CANCELED: 3, COMPLETED: 4, TIMEOUT: 5, FAILED: 6 } as const;

const LIB = 'libtransfer_engine.so';
const NOTIF_PREFIX = 'kvc1:';
const MD_MAGIC = 'KVCMOONCAKE1\n';
const MAX_NAME = 1024;

/** The library paths {@link MooncakeAgent.create} tries, in order (see the module note). */
export function mooncakeLibraryCandidates(env: NodeJS.ProcessEnv = process.env): string[] {
  return libraryCandidates(env, { lib: LIB, envLibrary: 'MOONCAKE_LIBRARY', envPrefix: 'MOONCAKE_PREFIX' });
}

function nativeMooncake(): { m: NativeMooncake | null; reason: string } {
  const { b, reason } = nativeBindings('mooncake', 'Mooncake');
  return { m: b, reason };
}

/**
 * Loads `libtransfer_engine.so` (once per path per process).
 * @returns the path that loaded.
 * @throws Error `Mooncake Transfer Engine not available: ...` listing every path tried and why it failed.
 */
export function loadMooncakeLibrary(options: { library?: string; env?: NodeJS.ProcessEnv } = {}): string {
  const candidates = options.library ? [options.library] : mooncakeLibraryCandidates(options.env);
  return loadNativeLibrary(nativeBindings('mooncake', 'Mooncake'), 'Mooncake Transfer Engine', candidates, (m, c) => m.load(c));
}

/** What a Mooncake agent's metadata blob carries. */
export interface MooncakeMetadata {
  /** The agent's name. */
  readonly name: string;
  /** The engine's segment name (`ip:port` in P2PHANDSHAKE mode), what peers open. */
  readonly segment: string;
  /** Registered regions with their absolute addresses. */
  readonly regions: readonly RegisteredRegion[];
}

/** Encodes a metadata blob: a magic line, then JSON `{v, name, segment, regions: [[addr, length, kind, deviceId], ...]}`. */
export function encodeMooncakeMetadata(md: MooncakeMetadata): Uint8Array {
  const body = JSON.stringify({ v: 1, name: md.name, segment: md.segment, regions: md.regions.map((r) => [r.addr, r.length, r.kind, r.deviceId]) });
  return new TextEncoder().encode(MD_MAGIC + body);
}

/**
 * Decodes and validates a metadata blob.
 * @throws TransferError `invalid` for anything that is not a well-formed Mooncake agent blob.
 */
export function decodeMooncakeMetadata(blob: Uint8Array): MooncakeMetadata {
  const bad = (why: string) => new TransferError('invalid', `not a Mooncake agent metadata blob: ${why}`);
  if (!(blob instanceof Uint8Array)) throw bad('not a Uint8Array');
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(blob);
  } catch {
    throw bad('not UTF-8');
  }
  if (!text.startsWith(MD_MAGIC)) throw bad('wrong magic');
  let o: unknown;
  try {
    o = JSON.parse(text.slice(MD_MAGIC.length));
  } catch {
    throw bad('malformed JSON');
  }
  const rec = o as { v?: unknown; name?: unknown; segment?: unknown; regions?: unknown };
  if (!rec || typeof rec !== 'object' || rec.v !== 1) throw bad('unknown version');
  if (typeof rec.name !== 'string' || rec.name.length === 0 || rec.name.length > MAX_NAME || rec.name.includes('\0')) throw bad('bad agent name');
  if (typeof rec.segment !== 'string' || rec.segment.length === 0 || rec.segment.length > MAX_NAME || rec.segment.includes('\0')) throw bad('bad segment name');
  if (!Array.isArray(rec.regions)) throw bad('regions must be an array');
  const regions: RegisteredRegion[] = [];
  for (const r of rec.regions as unknown[]) {
    if (!Array.isArray(r) || r.length !== 4) throw bad('a region must be [addr, length, kind, deviceId]');
    const [addr, length, kind, dev] = r as [unknown, unknown, unknown, unknown];
    if (!Number.isSafeInteger(addr) || (addr as number) <= 0 || !Number.isSafeInteger(length) || (length as number) <= 0 || !Number.isSafeInteger((addr as number) + (length as number))) throw bad('bad region address or length');
    if (kind !== 'DRAM' && kind !== 'VRAM') throw bad('bad region kind');
    if (!Number.isSafeInteger(dev) || (dev as number) < 0) throw bad('bad region device id');
    regions.push(Object.freeze({ addr: addr as number, length: length as number, kind, deviceId: dev as number }));
  }
  return { name: rec.name, segment: rec.segment, regions };
}

/** Encodes a notif payload as a NUL-free notify string. */
function encodeNotif(b: Uint8Array): string {
  return NOTIF_PREFIX + Buffer.from(b.buffer, b.byteOffset, b.byteLength).toString('base64');
}

/** Decodes a notify string: ours are `kvc1:<base64>`; anything else is passed on as its bytes. */
function decodeNotif(b: Buffer): Uint8Array {
  const s = b.toString('latin1');
  if (s.startsWith(NOTIF_PREFIX)) {
    const d = Buffer.from(s.slice(NOTIF_PREFIX.length), 'base64');
    return new Uint8Array(d.buffer, d.byteOffset, d.byteLength);
  }
  return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
}

/** Options of {@link MooncakeAgent.create}. */
export interface MooncakeAgentOptions {
  /** Agent name, unique among peers (no NUL characters). */
  readonly name: string;
  /** Path of libtransfer_engine.so (default: the search of {@link mooncakeLibraryCandidates}). */
  readonly library?: string;
  /**
   * The host peers reach this engine at: `local_server_name`, the host of the segment name
   * (default `127.0.0.1`). It does not restrict where the real engine listens (see the module note).
   */
  readonly host?: string;
  /** The engine's metadata connection string (default `P2PHANDSHAKE`: no metadata server). */
  readonly metadata?: string;
  /** `auto_discover` (default true: discover NICs, TCP when there is no RDMA device). */
  readonly autoDiscover?: boolean;
  /** The `location` host memory is registered with (default `*`: the engine finds it). VRAM uses `cuda:<deviceId>`. */
  readonly dramLocation?: string;
  /** Polling interval while transfers are in flight, microseconds (default 20). */
  readonly pollUs?: number;
  /** Polling interval otherwise (drives notify reception), microseconds (default 1000). */
  readonly idlePollUs?: number;
  /** Default transfer deadline, milliseconds (default 30 000). */
  readonly transferTimeoutMs?: number;
}

interface MooncakeRegistration extends Registration {
  readonly pins: readonly Uint8Array[];
}

interface Remote {
  readonly name: string;
  readonly segment: string;
  readonly segmentId: number;
  /** Flat sorted [addr, len, ...] per kind and device (`DRAM:0`, `VRAM:3`). */
  readonly flat: ReadonlyMap<string, number[]>;
  readonly version: number;
}

class MooncakeList implements DescList {
  released = false;
  constructor(
    readonly agent: string | null,
    readonly kind: MemoryKind,
    readonly descs: readonly XferDesc[],
  ) {}
}

class MooncakeRequest extends RequestState {
  /** The batch of the current post, while it is in flight. */
  nativeId: number | null = null;
  constructor(
    owner: MooncakeAgent,
    op: XferOp,
    remoteAgent: string,
    bytes: number,
    count: number,
    /** Memory kind of the local and of the remote descriptors. */
    readonly kind: MemoryKind,
    readonly remoteKind: MemoryKind,
    /** (localAddr, remoteAddr, length, localDev, remoteDev) per pair. */
    readonly pairs: Float64Array,
    readonly notif: Uint8Array | null,
    public checkedLocal: number,
    public checkedRemote: number,
  ) {
    super(owner, op, remoteAgent, bytes, count);
  }
}

const regionKey = (kind: MemoryKind, dev: number) => `${kind}:${dev}`;

function flatten(regions: Iterable<RegisteredRegion>): Map<string, number[]> {
  const by = new Map<string, Array<[number, number]>>();
  for (const r of regions) {
    const k = regionKey(r.kind, r.deviceId);
    let l = by.get(k);
    if (!l) by.set(k, (l = []));
    l.push([r.addr, r.length]);
  }
  const out = new Map<string, number[]>();
  for (const [k, l] of by) {
    l.sort((x, y) => x[0] - y[0]);
    out.set(k, l.flat());
  }
  return out;
}

function inRegions(flat: ReadonlyMap<string, number[]>, kind: MemoryKind, dev: number, addr: number, length: number): boolean {
  const f = flat.get(regionKey(kind, dev));
  return !!f && inFlatRegions(f, addr, length);
}

function statusKind(status: number): TransferErrorKind {
  switch (status) {
    case MOONCAKE_STATUS.FAILED:
      return 'remote-disconnect';
    case MOONCAKE_STATUS.TIMEOUT:
      return 'timeout';
    case MOONCAKE_STATUS.CANCELED:
      return 'canceled';
    case MOONCAKE_STATUS.INVALID:
      return 'invalid';
    default:
      return 'backend';
  }
}

const STATUS_NAME: Record<number, string> = { 0: 'WAITING', 1: 'PENDING', 2: 'INVALID', 3: 'CANCELED', 4: 'COMPLETED', 5: 'TIMEOUT', 6: 'FAILED' };

/** A {@link TransferAgent} over the Mooncake Transfer Engine's C API. Create with {@link MooncakeAgent.create}. */
export class MooncakeAgent implements TransferAgent {
  readonly backend = 'mooncake';
  readonly capabilities: AgentCapabilities = Object.freeze({ memoryKinds: Object.freeze(['DRAM', 'VRAM'] as MemoryKind[]), read: true, write: true, notify: true });
  private readonly remotes = new Map<string, Remote>();
  /** Segment names opened at least once (reopening them re-reads the peer's buffers). */
  private readonly opened = new Set<string>();
  private readonly regs = new Set<MooncakeRegistration>();
  private localFlat: Map<string, number[]> = new Map();
  private localVersion = 0;
  private remoteVersion = 0;
  private readonly byId = new Map<number, MooncakeRequest>();
  /** Statuses that arrived before their submit's promise settled. */
  private readonly early = new Map<number, [number, number]>();
  private closed = false;

  private constructor(
    readonly name: string,
    /** The library path that was loaded. */
    readonly library: string,
    /** This engine's segment name (`ip:port`), as peers open it. */
    readonly segment: string,
    private readonly core: MooncakeEngineCore,
    private readonly native: NativeMooncake,
    private readonly timeoutMs: number,
    private readonly dramLocation: string,
  ) {}

  /**
   * Loads the Transfer Engine (see {@link loadMooncakeLibrary}) and creates this agent's engine.
   * @throws Error `Mooncake Transfer Engine not available: ...` when the library cannot be
   *   loaded; TransferError `backend` when the engine refuses to start.
   */
  static async create(options: MooncakeAgentOptions): Promise<MooncakeAgent> {
    const { name } = options;
    if (typeof name !== 'string' || name.length === 0 || name.length > MAX_NAME || name.includes('\0')) throw new TransferError('invalid', 'agent name must be a non-empty string without NUL characters');
    const timeout = checkPositiveInt('transferTimeoutMs', options.transferTimeoutMs, 30_000);
    const path = loadMooncakeLibrary({ library: options.library });
    const m = nativeMooncake().m!;
    let agent: MooncakeAgent | null = null;
    const core = new m.MooncakeEngineCore(
      path,
      {
        metadata: options.metadata ?? 'P2PHANDSHAKE',
        serverName: options.host ?? '127.0.0.1',
        autoDiscover: options.autoDiscover ?? true,
        pollUs: options.pollUs ?? 20,
        idlePollUs: options.idlePollUs ?? 1000,
      },
      (id, status, rc) => agent?.onStatus(id, status, rc),
    );
    let segment: string;
    try {
      segment = await core.init();
    } catch (e) {
      await core.close().catch(() => {});
      throw new TransferError('backend', `cannot start the Mooncake Transfer Engine: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
    }
    agent = new MooncakeAgent(name, path, segment, core, m, timeout, options.dramLocation ?? '*');
    return agent;
  }

  private checkOpen(): void {
    checkOpen(this.closed, this.name);
  }

  private refreshLocal(): void {
    const all: RegisteredRegion[] = [];
    for (const r of this.regs) all.push(...r.regions);
    this.localFlat = flatten(all);
    this.localVersion++;
  }

  async registerMemory(regions: readonly MemoryRegion[]): Promise<Registration> {
    this.checkOpen();
    const out: RegisteredRegion[] = [];
    const pins: Uint8Array[] = [];
    for (const r of checkRegions(regions)) {
      if ('bytes' in r) {
        pins.push(r.bytes);
        out.push(Object.freeze({ addr: this.native.addressOf(r.bytes), length: r.bytes.byteLength, kind: 'DRAM', deviceId: 0 }));
      } else {
        out.push(Object.freeze({ addr: r.addr, length: r.length, kind: r.kind, deviceId: r.deviceId }));
      }
    }
    const done: number[] = [];
    try {
      for (const r of out) {
        await this.core.registerMem(r.addr, r.length, r.kind === 'VRAM' ? `cuda:${r.deviceId}` : this.dramLocation);
        done.push(r.addr);
      }
    } catch (e) {
      for (const a of done) await this.core.unregisterMem(a).catch(() => {});
      throw new TransferError('invalid', `registerLocalMemory refused a region: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
    }
    const reg: MooncakeRegistration = Object.freeze({ regions: Object.freeze(out), pins });
    this.regs.add(reg);
    this.refreshLocal();
    return reg;
  }

  async deregisterMemory(registration: Registration): Promise<void> {
    const reg = registration as MooncakeRegistration;
    if (!this.regs.has(reg)) throw new TransferError('not-found', 'not a live registration of this agent');
    this.regs.delete(reg);
    this.refreshLocal();
    if (this.closed) return;
    let first: unknown = null;
    for (const r of reg.regions) {
      try {
        await this.core.unregisterMem(r.addr);
      } catch (e) {
        first ??= e;
      }
    }
    if (first) throw new TransferError('backend', `unregisterLocalMemory failed: ${first instanceof Error ? first.message : String(first)}`, { cause: first });
  }

  async getLocalMetadata(): Promise<Uint8Array> {
    this.checkOpen();
    const regions: RegisteredRegion[] = [];
    for (const r of this.regs) regions.push(...r.regions);
    return encodeMooncakeMetadata({ name: this.name, segment: this.segment, regions });
  }

  async loadRemoteMetadata(metadata: Uint8Array): Promise<string> {
    this.checkOpen();
    if (!(metadata instanceof Uint8Array) || metadata.byteLength === 0) throw new TransferError('invalid', 'metadata must be a non-empty Uint8Array');
    const md = decodeMooncakeMetadata(metadata);
    let segmentId: number;
    try {
      segmentId = await this.core.openSegment(md.segment, this.opened.has(md.segment));
    } catch (e) {
      throw new TransferError('remote-disconnect', `cannot open the segment ${JSON.stringify(md.segment)} of agent ${JSON.stringify(md.name)}: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
    }
    this.opened.add(md.segment);
    this.remotes.set(md.name, { name: md.name, segment: md.segment, segmentId, flat: flatten(md.regions), version: ++this.remoteVersion });
    return md.name;
  }

  async invalidateRemoteMetadata(agent: string): Promise<void> {
    this.remotes.delete(agent);
  }

  async prepDescList(agent: string | null, kind: MemoryKind, descs: readonly XferDesc[]): Promise<DescList> {
    this.checkOpen();
    checkKind(kind);
    let flat: ReadonlyMap<string, number[]> = this.localFlat;
    if (agent !== null) {
      const r = this.remotes.get(agent);
      if (!r) throw new TransferError('not-found', `no metadata loaded for agent ${JSON.stringify(agent)}`);
      flat = r.flat;
    }
    const out = checkDescs(descs);
    out.forEach((d, i) => {
      const dev = d.deviceId!;
      if (!inRegions(flat, kind, dev, d.addr, d.length)) {
        throw new TransferError('invalid', `descs[${i}] (${kind} ${d.addr}+${d.length}, device ${dev}) is outside the ${agent === null ? 'local' : `registered memory agent ${JSON.stringify(agent)} advertised`} registered regions`);
      }
    });
    return new MooncakeList(agent, kind, Object.freeze(out));
  }

  async releaseDescList(list: DescList): Promise<void> {
    if (list instanceof MooncakeList) list.released = true;
  }

  async makeTransfer(args: MakeTransferArgs): Promise<TransferRequest> {
    this.checkOpen();
    const t = checkTransfer(args, (l): l is MooncakeList => l instanceof MooncakeList && !l.released);
    const { local, remote, notif } = t;
    const rem = this.remotes.get(remote.agent);
    if (!rem) throw new TransferError('not-found', `no metadata loaded for agent ${JSON.stringify(remote.agent)}`);
    const pairs = new Float64Array(t.pairs.length * 5);
    t.pairs.forEach(([l, r], i) => pairs.set([l.addr, r.addr, l.length, l.deviceId ?? 0, r.deviceId ?? 0], 5 * i));
    // Lists were checked at prep; check again here if registrations changed since.
    const req = new MooncakeRequest(this, t.op, remote.agent, t.bytes, t.pairs.length, local.kind, remote.kind, pairs, notif ? notif.slice() : null, -1, -1);
    const why = this.boundsProblem(req, rem);
    if (why) throw new TransferError('invalid', why);
    return req;
  }

  /** Why a request's descriptors are outside the current registrations, or null. */
  private boundsProblem(req: MooncakeRequest, rem: Remote): string | null {
    const p = req.pairs;
    const n = req.count;
    if (req.checkedLocal !== this.localVersion) {
      for (let i = 0; i < n; i++) {
        if (!inRegions(this.localFlat, req.kind, p[5 * i + 3]!, p[5 * i]!, p[5 * i + 2]!)) return `pair ${i}: local ${req.kind} ${p[5 * i]}+${p[5 * i + 2]} is not inside registered memory of this agent (deregistered?)`;
      }
      req.checkedLocal = this.localVersion;
    }
    if (req.checkedRemote !== rem.version) {
      for (let i = 0; i < n; i++) {
        if (!inRegions(rem.flat, req.remoteKind, p[5 * i + 4]!, p[5 * i + 1]!, p[5 * i + 2]!)) return `pair ${i}: remote ${req.remoteKind} ${p[5 * i + 1]}+${p[5 * i + 2]} is not inside the memory agent ${JSON.stringify(rem.name)} advertises`;
      }
      req.checkedRemote = rem.version;
    }
    return null;
  }

  private own(req: TransferRequest): MooncakeRequest {
    return ownRequest(this, req, MooncakeRequest);
  }

  async post(request: TransferRequest, options: PostOptions = {}): Promise<XferStatus> {
    this.checkOpen();
    const req = this.own(request);
    const timeoutMs = checkPost(req, options, this.timeoutMs);
    const gen = startPost(req);
    const rem = this.remotes.get(req.remoteAgent);
    if (!rem) return this.finish(req, 'not-found', `no metadata loaded for agent ${JSON.stringify(req.remoteAgent)} (invalidated?)`);
    const why = this.boundsProblem(req, rem);
    if (why) return this.finish(req, 'invalid', why);
    const notif = options.notif ?? req.notif;
    const entries = new Float64Array(req.count * 3);
    for (let i = 0; i < req.count; i++) entries.set(req.pairs.subarray(5 * i, 5 * i + 3), 3 * i);
    let id: number;
    try {
      id = await this.core.submit(req.op === 'READ' ? 0 : 1, rem.segmentId, entries, notif ? this.name : null, notif ? encodeNotif(notif) : null);
    } catch (e) {
      if (isCurrent(req, gen)) this.finish(req, this.closed ? 'canceled' : 'backend', `the Transfer Engine refused the batch: ${e instanceof Error ? e.message : String(e)}`);
      return this.status(req);
    }
    if (!isCurrent(req, gen)) {
      // Released (or the agent closed) while submitting: let the batch run out.
      this.early.delete(id);
      if (!this.closed) this.core.abandon(id).catch(() => {});
      return this.status(req);
    }
    req.nativeId = id;
    this.byId.set(id, req);
    const early = this.early.get(id);
    if (early) {
      this.early.delete(id);
      this.onStatus(id, early[0], early[1]);
      return this.status(req);
    }
    req.timer = setTimeout(() => {
      if (!isCurrent(req, gen)) return;
      this.finish(req, 'timeout', `transfer did not finish within ${timeoutMs} ms (the Transfer Engine cannot cancel it: it may still complete)`);
    }, timeoutMs);
    req.timer.unref();
    return 'in-progress';
  }

  private onStatus(id: number, status: number, rc: number): void {
    const req = this.byId.get(id);
    if (!req) {
      if (!this.closed) this.early.set(id, [status, rc]);
      return;
    }
    if (req.state !== 'in-progress' || req.nativeId !== id) return;
    if (status === MOONCAKE_STATUS.COMPLETED) this.finish(req, 'done', null);
    else if (status < 0) this.finish(req, 'backend', `getTransferStatus failed with code ${rc}`);
    else this.finish(req, statusKind(status), `a task of the batch ended ${STATUS_NAME[status] ?? status}${status === MOONCAKE_STATUS.FAILED ? ' (the peer or transport failed, or the peer deregistered the memory)' : ''}`);
  }

  private finish(req: MooncakeRequest, state: XferStatus, message: string | null): XferStatus {
    if (!endRequest(req, state, message)) return this.status(req);
    const id = req.nativeId;
    req.nativeId = null;
    if (id !== null) {
      this.byId.delete(id);
      // The batch keeps running natively until it ends (no cancel in the C API): stop reporting it.
      if (state !== 'done' && !this.closed) this.core.abandon(id).catch(() => {});
    }
    return state;
  }

  status(request: TransferRequest): XferStatus {
    return requestStatus(this.own(request));
  }

  wait(request: TransferRequest): Promise<XferStatus> {
    return waitRequest(this.own(request));
  }

  async release(request: TransferRequest): Promise<void> {
    const req = this.own(request);
    if (req.released) return;
    req.released = true;
    if (req.state === 'in-progress') this.finish(req, 'canceled', 'released while in progress (the Transfer Engine cannot cancel it: it may still complete)');
  }

  async sendNotif(agent: string, message: Uint8Array): Promise<void> {
    this.checkOpen();
    checkNotif(message);
    const rem = this.remotes.get(agent);
    if (!rem) throw new TransferError('not-found', `no metadata loaded for agent ${JSON.stringify(agent)}`);
    try {
      await this.core.genNotify(rem.segmentId, this.name, encodeNotif(message));
    } catch (e) {
      throw new TransferError('remote-disconnect', `genNotifyInEngine to ${JSON.stringify(agent)} failed: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
    }
  }

  async pollNotifs(): Promise<Map<string, Uint8Array[]>> {
    const flat = this.closed ? [] : this.core.takeNotifs();
    return groupNotifs(flat, decodeNotif);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const req of [...this.byId.values()]) this.finish(req, 'canceled', `agent ${this.name} closed`);
    this.byId.clear();
    this.early.clear();
    await this.core.close().catch(() => {});
    this.regs.clear();
    this.remotes.clear();
  }
}

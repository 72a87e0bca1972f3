/**
 * The NIXL agent: a {@link TransferAgent} over NIXL's C API (`libnixl_capi.so`), which the
 * native addon loads at run time with dlopen (`native/src/nixl_addon.cc`). The addon builds and
 * loads where NIXL is absent; only {@link NixlAgent.create} needs the library and fails with an
 * Error whose message starts `NIXL not available:` and lists every path tried.
 *
 * Where the library is looked for ({@link nixlLibraryCandidates}), first match wins:
 * 1. `$NIXL_LIBRARY` (a file path; tests point it at `native/build/test/libfake_nixl_capi.so`);
 * 2. `$NIXL_PREFIX/lib/libnixl_capi.so`, `$NIXL_PREFIX/lib/<arch>-linux-gnu/libnixl_capi.so`,
 *    `$NIXL_PREFIX/lib64/libnixl_capi.so`;
 * 3. `libnixl_capi.so` on the library path (LD_LIBRARY_PATH, ld.so cache);
 * 4. without `NIXL_PREFIX`: NIXL's default prefix `/opt/nvidia/nvda_nixl` as in 2.
 * Dependencies of the library that sit next to it (libnixl.so, ...) are found even without
 * LD_LIBRARY_PATH (NIXL's libraries have no RUNPATH).
 *
 * Behaviour: every NIXL call of an agent runs on one native thread of that agent, which also
 * drives progress (no NIXL progress thread by default; docs/backends.md N1) and
 * polls notifs; JS never blocks. Memory is registered by address: `bytes` regions are pinned by
 * reference for as long as they are registered (their address is read with `addressOf`), and
 * raw `addr` regions (VRAM) are passed through.
 *
 * Error mapping (the C API collapses NIXL's status codes, so some of this is inference):
 * prep/make failures are `invalid`; a peer whose metadata is not loaded is `not-found` (checked
 * here before calling NIXL); a post that fails is `backend`; a posted transfer that later fails
 * is `remote-disconnect` (validation already passed, so the transport or peer failed).
 * @module
 */
import { checkDescs, checkKind, checkNotif, checkOpen, checkPositiveInt, checkPost, checkRegions, checkTransfer, endRequest, isCurrent, ownRequest, requestStatus, RequestState, startPost, waitRequest } from './agent-base.js';
import { NativeError, type NativeNixl as NativeTransfer, type NixlAgentCore } from '@kvconnect/native';
import { TransferError } from './errors.js';
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

/** NIXL C API status codes (`nixl_capi_status_t`). */
export const NIXL_STATUS = { SUCCESS: 0, IN_PROG: 1, INVALID_PARAM: -1, BACKEND: -2, INVALID_STATE: -3, EXCEPTION: -4, NO_TELEMETRY: -5, NOT_FOUND: -6 } as const;

const MEM_TYPE: Record<MemoryKind, number> = { DRAM: 0, VRAM: 1 };
const DEFAULT_PREFIX = '/opt/nvidia/nvda_nixl';

/** The library paths {@link NixlAgent.create} tries, in order (see the module note). */
export function nixlLibraryCandidates(env: NodeJS.ProcessEnv = process.env): string[] {
  return libraryCandidates(env, { lib: 'libnixl_capi.so', envLibrary: 'NIXL_LIBRARY', envPrefix: 'NIXL_PREFIX', defaultPrefix: DEFAULT_PREFIX });
}

/** UCX transports that stay on one host (`UCX_TLS` names; UCX's `ucx_info -d` lists them). */
const UCX_SAME_HOST_TLS = new Set(['self', 'sm', 'shm', 'posix', 'sysv', 'xpmem', 'cma', 'knem', 'cuda_ipc', 'cuda_copy', 'rocm_ipc', 'rocm_copy', 'gdr_copy']);

/**
 * The backend parameters {@link NixlAgent.create} passes to NIXL: `params` as given, plus
 * `ucx_error_handling_mode: 'none'` for the UCX backend when `UCX_TLS` selects same-host
 * transports only (e.g. `sm,self`) and `params` does not set the mode. UCX's shared-memory
 * transports do not support the peer error handling NIXL asks for by default, so without it the
 * UCX backend cannot create its endpoints (`nixl_capi_create_backend: ERROR_BACKEND`; NIXL's
 * `src/plugins/ucx/` reads `ucx_error_handling_mode`). A `UCX_TLS` list that excludes (`^...`)
 * or names any network transport leaves the parameters alone.
 */
export function nixlBackendParams(backend: string, params: Readonly<Record<string, string>> = {}, env: NodeJS.ProcessEnv = process.env): Record<string, string> {
  const out: Record<string, string> = { ...params };
  const tls = (env.UCX_TLS ?? '').trim();
  if (backend !== 'UCX' || 'ucx_error_handling_mode' in out || tls === '' || tls.startsWith('^')) return out;
  const names = tls.split(',').map((t) => t.trim().replace(/^\\/, '').split(':')[0]);
  if (names.every((t) => UCX_SAME_HOST_TLS.has(t))) out.ucx_error_handling_mode = 'none';
  return out;
}

function nativeTransfer(): { t: NativeTransfer | null; reason: string } {
  const { b, reason } = nativeBindings('transfer', 'transfer');
  return { t: b, reason };
}

/**
 * Loads `libnixl_capi.so` (once per path per process).
 * @returns the path that loaded.
 * @throws Error `NIXL not available: ...` listing every path tried and why it failed.
 */
export function loadNixlLibrary(options: { library?: string; env?: NodeJS.ProcessEnv } = {}): string {
  const candidates = options.library ? [options.library] : nixlLibraryCandidates(options.env);
  return loadNativeLibrary(nativeBindings('transfer', 'transfer'), 'NIXL', candidates, (t, c) => t.nixlLoad(c));
}

/** Options of {@link NixlAgent.create}. */
export interface NixlAgentOptions {
  /** Agent name, unique among peers. */
  readonly name: string;
  /** Path of libnixl_capi.so (default: the search of {@link nixlLibraryCandidates}). */
  readonly library?: string;
  /** NIXL backend plugin (default `UCX`). */
  readonly backend?: string;
  /** Backend parameters (strings); for same-host UCX transports `ucx_error_handling_mode: 'none'` is added unless set ({@link nixlBackendParams}). */
  readonly backendParams?: Readonly<Record<string, string>>;
  /** Use NIXL's progress thread (default false: the agent's own thread drives progress by polling). */
  readonly progressThread?: boolean;
  /** Progress-thread delay in microseconds when `progressThread` is on (default 1000; 0 spins). */
  readonly progressDelayUs?: number;
  /** Polling interval while transfers are in flight, microseconds (default 20). */
  readonly pollUs?: number;
  /** Polling interval otherwise (drives notif reception), microseconds (default 1000). */
  readonly idlePollUs?: number;
  /** Default transfer deadline, milliseconds (default 30 000). */
  readonly transferTimeoutMs?: number;
}

interface NixlRegistration extends Registration {
  readonly pins: readonly Uint8Array[];
}

class NixlList implements DescList {
  constructor(
    readonly agent: string | null,
    readonly kind: MemoryKind,
    readonly descs: readonly XferDesc[],
    readonly id: number,
  ) {}
  released = false;
}

class NixlRequest extends RequestState {
  /** The NIXL request (null after a timeout released it: the next post makes a new one). */
  nativeId: number | null;
  constructor(
    owner: NixlAgent,
    op: XferOp,
    remoteAgent: string,
    bytes: number,
    count: number,
    nativeId: number,
    readonly remake: () => Promise<number>,
  ) {
    super(owner, op, remoteAgent, bytes, count);
    this.nativeId = nativeId;
  }
}

/** `[addr, length, deviceId]` per descriptor (already checked by `checkDescs` / `checkRegions`). */
function flatDescs(descs: readonly XferDesc[]): Float64Array {
  const f = new Float64Array(descs.length * 3);
  descs.forEach((d, i) => {
    f[3 * i] = d.addr;
    f[3 * i + 1] = d.length;
    f[3 * i + 2] = d.deviceId ?? 0;
  });
  return f;
}

function nixlError(kind: TransferErrorKind, e: unknown): TransferError {
  const m = e instanceof Error ? e.message : String(e);
  return new TransferError(e instanceof NativeError && e.status === NIXL_STATUS.NOT_FOUND ? 'not-found' : kind, m, { cause: e });
}

/** A {@link TransferAgent} over NIXL's C API. Create with {@link NixlAgent.create}. */
export class NixlAgent implements TransferAgent {
  readonly backend = 'nixl';
  readonly capabilities: AgentCapabilities = Object.freeze({ memoryKinds: Object.freeze(['DRAM', 'VRAM'] as MemoryKind[]), read: true, write: true, notify: true });
  private readonly remotes = new Set<string>();
  private readonly regs = new Set<NixlRegistration>();
  private readonly byId = new Map<number, NixlRequest>();
  private closed = false;

  private constructor(
    readonly name: string,
    /** The library path that was loaded. */
    readonly library: string,
    private readonly core: NixlAgentCore,
    private readonly native: NativeTransfer,
    private readonly timeoutMs: number,
  ) {}

  /**
   * Loads NIXL (see {@link loadNixlLibrary}), creates the agent and its backend.
   * @throws Error `NIXL not available: ...` when the library cannot be loaded; TransferError
   *   `backend` when NIXL refuses the agent or backend.
   */
  static async create(options: NixlAgentOptions): Promise<NixlAgent> {
    const { name } = options;
    if (typeof name !== 'string' || name.length === 0) throw new TransferError('invalid', 'agent name must be a non-empty string');
    const path = loadNixlLibrary({ library: options.library });
    const t = nativeTransfer().t!;
    const params: string[] = [];
    for (const [k, v] of Object.entries(nixlBackendParams(options.backend ?? 'UCX', options.backendParams))) params.push(k, String(v));
    let agent: NixlAgent | null = null;
    const core = new t.NixlAgentCore(
      path,
      name,
      {
        backend: options.backend ?? 'UCX',
        params,
        progressThread: options.progressThread ?? false,
        progressDelayUs: options.progressDelayUs ?? 1000,
        pollUs: options.pollUs ?? 20,
        idlePollUs: options.idlePollUs ?? 1000,
      },
      (id, code) => agent?.onStatus(id, code),
    );
    const timeout = checkPositiveInt('transferTimeoutMs', options.transferTimeoutMs, 30_000);
    agent = new NixlAgent(name, path, core, t, timeout);
    try {
      await core.init();
    } catch (e) {
      await core.close().catch(() => {});
      throw nixlError('backend', e);
    }
    return agent;
  }

  private checkOpen(): void {
    checkOpen(this.closed, this.name);
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
    const done: MemoryKind[] = [];
    try {
      for (const kind of ['DRAM', 'VRAM'] as const) {
        const of = out.filter((r) => r.kind === kind);
        if (of.length === 0) continue;
        await this.core.registerMem(MEM_TYPE[kind], flatDescs(of));
        done.push(kind);
      }
    } catch (e) {
      for (const kind of done) await this.core.deregisterMem(MEM_TYPE[kind], flatDescs(out.filter((r) => r.kind === kind))).catch(() => {});
      throw nixlError('invalid', e);
    }
    const reg: NixlRegistration = Object.freeze({ regions: Object.freeze(out), pins });
    this.regs.add(reg);
    return reg;
  }

  async deregisterMemory(registration: Registration): Promise<void> {
    const reg = registration as NixlRegistration;
    if (!this.regs.has(reg)) throw new TransferError('not-found', 'not a live registration of this agent');
    this.regs.delete(reg);
    for (const kind of ['DRAM', 'VRAM'] as const) {
      const of = reg.regions.filter((r) => r.kind === kind);
      if (of.length === 0) continue;
      try {
        await this.core.deregisterMem(MEM_TYPE[kind], flatDescs(of));
      } catch (e) {
        throw nixlError('backend', e);
      }
    }
  }

  async getLocalMetadata(): Promise<Uint8Array> {
    this.checkOpen();
    try {
      const b = await this.core.getLocalMd();
      return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
    } catch (e) {
      throw nixlError('backend', e);
    }
  }

  async loadRemoteMetadata(metadata: Uint8Array): Promise<string> {
    this.checkOpen();
    if (!(metadata instanceof Uint8Array) || metadata.byteLength === 0) throw new TransferError('invalid', 'metadata must be a non-empty Uint8Array');
    try {
      const name = await this.core.loadRemoteMd(metadata);
      this.remotes.add(name);
      return name;
    } catch (e) {
      throw nixlError('invalid', e);
    }
  }

  async invalidateRemoteMetadata(agent: string): Promise<void> {
    if (!this.remotes.delete(agent)) return;
    try {
      await this.core.invalidateRemoteMd(agent);
    } catch (e) {
      throw nixlError('backend', e);
    }
  }

  async prepDescList(agent: string | null, kind: MemoryKind, descs: readonly XferDesc[]): Promise<DescList> {
    this.checkOpen();
    checkKind(kind);
    if (agent !== null && agent !== this.name && !this.remotes.has(agent)) throw new TransferError('not-found', `no metadata loaded for agent ${JSON.stringify(agent)}`);
    const checked = checkDescs(descs);
    try {
      const id = await this.core.prepDlist(agent ?? '', MEM_TYPE[kind], flatDescs(checked));
      return new NixlList(agent, kind, Object.freeze(checked), id);
    } catch (e) {
      throw nixlError('invalid', e);
    }
  }

  async releaseDescList(list: DescList): Promise<void> {
    if (!(list instanceof NixlList) || list.released) return;
    list.released = true;
    await this.core.releaseDlist(list.id).catch(() => {});
  }

  async makeTransfer(args: MakeTransferArgs): Promise<TransferRequest> {
    this.checkOpen();
    const t = checkTransfer(args, (l): l is NixlList => l instanceof NixlList && !l.released);
    // The indices were checked to be integers in range, so Int32Array holds them exactly.
    const li = Int32Array.from(t.localIndices);
    const ri = Int32Array.from(t.remoteIndices);
    const { local, remote, notif } = t;
    const opCode = t.op === 'READ' ? 0 : 1;
    const make = () => this.core.makeXfer(opCode, local.id, li, remote.id, ri, notif);
    try {
      const id = await make();
      const req = new NixlRequest(this, t.op, remote.agent, t.bytes, li.length, id, make);
      this.byId.set(id, req);
      return req;
    } catch (e) {
      throw nixlError('invalid', e);
    }
  }

  private own(req: TransferRequest): NixlRequest {
    return ownRequest(this, req, NixlRequest);
  }

  async post(request: TransferRequest, options: PostOptions = {}): Promise<XferStatus> {
    this.checkOpen();
    const req = this.own(request);
    const timeoutMs = checkPost(req, options, this.timeoutMs);
    if (req.nativeId === null) {
      // The previous post timed out and its NIXL request was released: make a new one.
      try {
        req.nativeId = await req.remake();
        this.byId.set(req.nativeId, req);
      } catch (e) {
        throw nixlError('invalid', e);
      }
    }
    const gen = startPost(req);
    const id = req.nativeId;
    const code = await this.core.post(id, options.notif ?? null);
    if (!isCurrent(req, gen)) return this.status(req);
    if (code === NIXL_STATUS.SUCCESS) return this.finish(req, 'done', null);
    if (code !== NIXL_STATUS.IN_PROG) return this.finish(req, 'backend', `nixl_capi_post_xfer_req failed with status ${code}`);
    req.timer = setTimeout(() => {
      if (!isCurrent(req, gen)) return;
      this.finish(req, 'timeout', `transfer did not finish within ${timeoutMs} ms`);
      // Cancel it in NIXL; a later post makes a fresh request.
      this.byId.delete(id);
      req.nativeId = null;
      this.core.releaseXfer(id).catch(() => {});
    }, timeoutMs);
    req.timer.unref();
    return 'in-progress';
  }

  private onStatus(id: number, code: number): void {
    const req = this.byId.get(id);
    if (!req || req.state !== 'in-progress') return;
    if (code === NIXL_STATUS.SUCCESS) this.finish(req, 'done', null);
    else this.finish(req, 'remote-disconnect', `transfer failed in NIXL with status ${code} (the C API does not say why; the peer or transport failed)`);
  }

  private finish(req: NixlRequest, state: XferStatus, message: string | null): XferStatus {
    return endRequest(req, state, message) ? state : this.status(req);
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
    if (req.state === 'in-progress') this.finish(req, 'canceled', 'released while in progress');
    const id = req.nativeId;
    req.nativeId = null;
    if (id === null) return;
    this.byId.delete(id);
    const rc = await this.core.releaseXfer(id);
    if (rc !== NIXL_STATUS.SUCCESS && !this.closed) throw new TransferError('backend', `nixl_capi_release_xfer_req failed with status ${rc}`);
  }

  async sendNotif(agent: string, message: Uint8Array): Promise<void> {
    this.checkOpen();
    checkNotif(message);
    if (agent !== this.name && !this.remotes.has(agent)) throw new TransferError('not-found', `no metadata loaded for agent ${JSON.stringify(agent)}`);
    try {
      await this.core.genNotif(agent, message);
    } catch (e) {
      throw nixlError('backend', e);
    }
  }

  async pollNotifs(): Promise<Map<string, Uint8Array[]>> {
    const flat = this.closed ? [] : this.core.takeNotifs();
    return groupNotifs(flat, (b) => new Uint8Array(b.buffer, b.byteOffset, b.byteLength));
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const req of this.byId.values()) if (req.state === 'in-progress') this.finish(req, 'canceled', `agent ${this.name} closed`);
    this.byId.clear();
    await this.core.close().catch(() => {});
    this.regs.clear();
  }
}

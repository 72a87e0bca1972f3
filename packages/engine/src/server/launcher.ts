/**
 * Starts engine and proxy servers as child processes, as production runs them: each child is
 * `bin/kvconnect-engine.js` or `bin/kvconnect-proxy.js` run by the current Node
 * (`process.execPath`), listening on 127.0.0.1 by default.
 *
 * The bins run the compiled `dist/` of this package (build it first: `npm run build`, or
 * `npx tsc --build packages/engine`). A launched child exits when its parent does: the launcher
 * kills its children on `process.exit`, and each child watches its stdin (`--exit-with-parent`), so
 * it also exits when the parent is killed outright.
 * @module
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream, existsSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import type { EngineProcessConfig, ProxyProcessConfig } from './main.js';

/** The bins (two folders up from `src/server` and from `dist/server`). */
export const ENGINE_BIN = fileURLToPath(new URL('../../bin/kvconnect-engine.js', import.meta.url));
/** @see ENGINE_BIN */
export const PROXY_BIN = fileURLToPath(new URL('../../bin/kvconnect-proxy.js', import.meta.url));
const DIST_MAIN = fileURLToPath(new URL('../../dist/server/main.js', import.meta.url));

/** Options shared by both launchers. */
export interface LaunchOptions {
  /** Extra CLI flags (after the generated ones; flags win over the config). */
  args?: readonly string[];
  /** How long to wait for the ready line (default 30 000 ms). */
  readyTimeoutMs?: number;
  /** Environment of the child (default the parent's). */
  env?: NodeJS.ProcessEnv;
  /** Working directory of the child (default the parent's). */
  cwd?: string;
  /** Node flags for the child (e.g. `--enable-source-maps`). */
  execArgv?: readonly string[];
  /** Copy the child's stderr to this process's stderr (default false; the tail is always kept). */
  echoStderr?: boolean;
  /** Called with every stdout JSON event line after the ready line (e.g. `exit`). */
  onEvent?: (event: Record<string, unknown>) => void;
  /**
   * A file that gets everything the child writes to stdout and stderr, as it comes (created or
   * truncated at launch, closed when the child exits), e.g. `producer.log` in a report folder.
   */
  logFile?: string;
}

/** Options of {@link launchEngineProcess}. */
export interface LaunchEngineOptions extends LaunchOptions {
  /** The engine's config (passed as `--config-json`): model, sizes, kvTransferConfig, imports, port, ... */
  config: EngineProcessConfig;
}

/** Options of {@link launchProxyProcess}. */
export interface LaunchProxyOptions extends LaunchOptions {
  /** The proxy's config (passed as `--config-json`): prefill and decode URLs, mode, port, ... */
  config: ProxyProcessConfig;
}

/** A running child server. */
export interface LaunchedProcess {
  /** `http://127.0.0.1:port` of the child's server. */
  readonly url: string;
  readonly port: number;
  readonly pid: number;
  readonly child: ChildProcess;
  /** The ready line, parsed. */
  readonly ready: Record<string, unknown>;
  /** Resolves with the exit code and signal when the child exits. */
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** The last 16 KiB of the child's stderr. */
  stderr(): string;
  /**
   * Stops the child: SIGTERM (graceful: running requests finish), then SIGKILL after `timeoutMs`
   * (default 5000). Resolves with how it exited; idempotent.
   */
  stop(timeoutMs?: number): Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

/** A launched engine. */
export interface LaunchedEngine extends LaunchedProcess {
  readonly engineId: string;
}

/** A launched proxy. */
export interface LaunchedProxy extends LaunchedProcess {
  readonly mode: 'sequential' | 'concurrent';
}

/** Raised when a child did not get ready: it exited, timed out, or printed no ready line. `stderr` is its stderr tail. */
export class LaunchError extends Error {
  constructor(
    message: string,
    readonly stderr: string,
  ) {
    super(stderr ? `${message}\n--- child stderr ---\n${stderr}` : message);
    this.name = 'LaunchError';
  }
}

const live = new Set<ChildProcess>();
let exitHook = false;

function killAllOnExit(): void {
  if (exitHook) return;
  exitHook = true;
  process.on('exit', () => {
    for (const c of live) {
      try {
        c.kill('SIGKILL');
      } catch {
        // already gone
      }
    }
  });
}

const TAIL = 16 << 10;

async function launch(bin: string, config: object, o: LaunchOptions): Promise<LaunchedProcess> {
  if (!existsSync(DIST_MAIN)) {
    throw new LaunchError(`${DIST_MAIN} is missing: build @kvconnect/engine first (npm run build, or npx tsc --build packages/engine)`, '');
  }
  killAllOnExit();
  const child = spawn(process.execPath, [...(o.execArgv ?? []), bin, '--config-json', JSON.stringify(config), '--exit-with-parent', ...(o.args ?? [])], {
    cwd: o.cwd,
    env: o.env ?? process.env,
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  live.add(child);
  let tail = '';
  const log = o.logFile !== undefined ? createWriteStream(o.logFile) : null;
  if (log) {
    log.on('error', () => {}); // a log that cannot be written loses the log, not the child
    child.stdout!.on('data', (b: Buffer) => log.write(b));
    child.once('close', () => log.end());
  }
  child.stderr!.setEncoding('utf8');
  child.stderr!.on('data', (s: string) => {
    tail = (tail + s).slice(-TAIL);
    if (o.echoStderr) process.stderr.write(s);
    log?.write(s);
  });
  child.stdin!.on('error', () => {});
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
    child.once('exit', (code, signal) => {
      live.delete(child);
      resolve({ code, signal });
    });
  });
  const lines = createInterface({ input: child.stdout!, crlfDelay: Infinity });
  const timeoutMs = o.readyTimeoutMs ?? 30_000;
  const ready = await new Promise<Record<string, unknown>>((resolve, reject) => {
    let settled = false;
    const done = (f: () => void) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      f();
    };
    const timer = setTimeout(() => {
      done(() => {
        child.kill('SIGKILL');
        reject(new LaunchError(`${bin} printed no ready line within ${timeoutMs} ms`, tail));
      });
    }, timeoutMs);
    child.once('error', (e) => done(() => reject(new LaunchError(`${bin} could not be started: ${e.message}`, tail))));
    void exited.then(({ code, signal }) => {
      // Let the last stderr bytes arrive before reporting.
      setTimeout(() => done(() => reject(new LaunchError(`${bin} exited before it was ready (code ${code}, signal ${signal})`, tail))), 50);
    });
    lines.on('line', (line) => {
      let ev: unknown;
      try {
        ev = JSON.parse(line);
      } catch {
        return;
      }
      if (typeof ev !== 'object' || ev === null) return;
      const e = ev as Record<string, unknown>;
      if (!settled && e.event === 'ready') done(() => resolve(e));
      else if (settled) o.onEvent?.(e);
    });
  });
  let stopP: Promise<{ code: number | null; signal: NodeJS.Signals | null }> | null = null;
  return {
    url: String(ready.url),
    port: Number(ready.port),
    pid: child.pid!,
    child,
    ready,
    exited,
    stderr: () => tail,
    stop(stopTimeoutMs = 5000) {
      stopP ??= (async () => {
        if (child.exitCode === null && child.signalCode === null) {
          child.kill('SIGTERM');
          const t = setTimeout(() => child.kill('SIGKILL'), stopTimeoutMs);
          const r = await exited;
          clearTimeout(t);
          return r;
        }
        return exited;
      })();
      return stopP;
    },
  };
}

/**
 * Starts `kvconnect-engine` with `options.config` and waits for its ready line.
 * @throws LaunchError (with the child's stderr) when it exits or is not ready in time.
 */
export async function launchEngineProcess(options: LaunchEngineOptions): Promise<LaunchedEngine> {
  const p = await launch(ENGINE_BIN, options.config, options);
  return Object.assign(p, { engineId: String(p.ready.engineId) });
}

/**
 * Starts `kvconnect-proxy` with `options.config` (prefill and decode URLs, mode) and waits for its
 * ready line (the proxy is ready once every engine answered `/health`).
 * @throws LaunchError (with the child's stderr) when it exits or is not ready in time.
 */
export async function launchProxyProcess(options: LaunchProxyOptions): Promise<LaunchedProxy> {
  const p = await launch(PROXY_BIN, options.config, options);
  return Object.assign(p, { mode: (p.ready.mode === 'concurrent' ? 'concurrent' : 'sequential') as 'sequential' | 'concurrent' });
}

/**
 * Both data planes of the embedded agent across two network namespaces joined by a veth pair
 * (issue #16 section 2): the test makes the namespaces and the pair itself (addresses
 * 10.213.<n>.1/30 and .2/30, only these two), runs one agent in each namespace (`ip netns exec`),
 * and checks a READ and a WRITE over TCP (heap memory) and through the shared mapping (same host,
 * same PID namespace: the network namespace does not matter). Needs root and `ip` (iproute2);
 * otherwise every case is skipped with the reason printed.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bundleFixture } from './fixtures/fork-fixture.js';

const tag = `kvc${process.pid % 100000}`;
const nsA = `${tag}-a`;
const nsB = `${tag}-b`;
const net = 10 + (process.pid % 200);
const addrA = `10.213.${net}.1`;
const addrB = `10.213.${net}.2`;

function sh(args: string[]): string | null {
  const r = spawnSync(args[0]!, args.slice(1), { encoding: 'utf8' });
  return r.status === 0 ? null : `${args.join(' ')}: ${(r.stderr || r.error?.message || `exit ${r.status}`).trim()}`;
}

/** Makes the namespaces and the veth pair; returns why not, or null. */
function setUp(): string | null {
  if (process.platform !== 'linux') return 'not Linux';
  if (process.getuid?.() !== 0) return 'not root (ip netns needs CAP_SYS_ADMIN)';
  if (spawnSync('ip', ['-V']).status !== 0) return 'ip (iproute2) is not installed';
  for (const step of [
    ['ip', 'netns', 'add', nsA],
    ['ip', 'netns', 'add', nsB],
    ['ip', 'link', 'add', `${tag}a`, 'netns', nsA, 'type', 'veth', 'peer', 'name', `${tag}b`, 'netns', nsB],
    ['ip', '-n', nsA, 'addr', 'add', `${addrA}/30`, 'dev', `${tag}a`],
    ['ip', '-n', nsB, 'addr', 'add', `${addrB}/30`, 'dev', `${tag}b`],
    ['ip', '-n', nsA, 'link', 'set', `${tag}a`, 'up'],
    ['ip', '-n', nsB, 'link', 'set', `${tag}b`, 'up'],
    ['ip', '-n', nsA, 'link', 'set', 'lo', 'up'],
    ['ip', '-n', nsB, 'link', 'set', 'lo', 'up'],
  ]) {
    const why = sh(step);
    if (why) return why;
  }
  return null;
}

let reason: string | null = 'not set up yet';
const children: ChildProcess[] = [];
let bundle = '';

beforeAll(async () => {
  reason = setUp();
  if (reason) {
    console.log(`netns.test.ts: skipped: ${reason}`);
    return;
  }
  bundle = await bundleFixture('ns-peer-process');
}, 60_000);

afterAll(() => {
  for (const c of children) c.kill();
  spawnSync('ip', ['netns', 'del', nsA]);
  spawnSync('ip', ['netns', 'del', nsB]); // the veth pair goes with them
});

/** A child agent process inside `ns`, and a function that sends one command and awaits the reply. */
function child(ns: string) {
  // `ip netns exec` execs node with the IPC descriptor inherited.
  const c = spawn('ip', ['netns', 'exec', ns, process.execPath, bundle], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'], cwd: fileURLToPath(new URL('../../..', import.meta.url)) });
  children.push(c);
  return (msg: object) =>
    new Promise<Record<string, unknown>>((resolve, reject) => {
      c.once('message', (m) => resolve(m as Record<string, unknown>));
      c.once('exit', (code) => reject(new Error(`child in ${ns} exited ${code}`)));
      c.send(msg);
    });
}

describe('embedded agent across two network namespaces (veth pair)', () => {
  it('moves READ and WRITE over TCP and through the shared mapping between the namespaces', async (ctx) => {
    if (reason) ctx.skip(`skipped: ${reason}`);
    const secret = [...randomBytes(32)];
    const a = child(nsA);
    const b = child(nsB);
    const ia = await a({ cmd: 'start', name: `${tag}-init`, host: addrA, secret });
    const ib = await b({ cmd: 'start', name: `${tag}-target`, host: addrB, secret });
    expect(ia.error ?? ib.error).toBeUndefined();
    const peer = (await a({ cmd: 'load', md: ib.md })).name as string;
    await b({ cmd: 'load', md: ia.md });
    // TCP: the target's heap region, over the veth pair.
    const tcp = await a({ cmd: 'transfer', peer, addr: ib.heap, mine: ia.mine, expect: 81, seed: 91 });
    expect(tcp).toMatchObject({ read: 'done', write: 'done', readSame: true, viaShm: 0 });
    // Same host: the target's shared region, copied directly (2 transfers: READ and WRITE).
    const shm = await a({ cmd: 'transfer', peer, addr: ib.shared, mine: ia.mine, expect: 82, seed: 92 });
    expect(shm).toMatchObject({ read: 'done', write: 'done', readSame: true, viaShm: 2 });
    expect(await b({ cmd: 'check', seed: 91 })).toMatchObject({ heap: true });
    expect(await b({ cmd: 'check', seed: 92 })).toMatchObject({ shared: true });
  }, 60_000);
});

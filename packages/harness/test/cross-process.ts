/**
 * Test support: a connector factory whose halves only ever see serialized copies of what crosses
 * between them, as when the scheduler half and every worker half run in processes of their own
 * (`@kvconnect/core` connector.ts, "Processes"). Everything the contract carries between the
 * halves goes through `v8.serialize` / `v8.deserialize` (the structured clone Node uses between
 * processes and threads) on the way, and must be plain data: a function, a class instance or any
 * other object with a prototype of its own throws {@link NotPlainDataError}.
 *
 * Crossing, and cloned: the step metadata (once per worker, as each worker process would receive
 * it), the `SchedulerOutput` given to `startLoadKv`, each worker's `TransferResults` (workerMeta
 * included) and the outputs handed to `updateConnectorOutput`, handshake metadata, and the
 * `requestFinished` result (it leaves the engine for the client). Not crossing: the engine's
 * request objects (the scheduler half lives in the engine process) and the worker's own caches.
 */
import { deserialize, serialize } from 'node:v8';
import type { KVConnectorFactory, KVConnectorScheduler, KVConnectorWorker } from '@kvconnect/core';

/** A value that would not survive the trip between processes as it is. */
export class NotPlainDataError extends Error {
  constructor(
    readonly where: string,
    readonly path: string,
    what: string,
  ) {
    super(`${where}: ${path || '(root)'} is ${what}, not plain data`);
    this.name = 'NotPlainDataError';
  }
}

const PLAIN_PROTOS = new Set<unknown>([Object.prototype, null, Array.prototype, Map.prototype, Set.prototype]);

/** Throws {@link NotPlainDataError} unless `x` is plain data (connector.ts `PlainData`). */
export function assertPlain(x: unknown, where: string, path = ''): void {
  if (x === null || x === undefined) return;
  const t = typeof x;
  if (t === 'function') throw new NotPlainDataError(where, path, 'a function');
  if (t === 'symbol') throw new NotPlainDataError(where, path, 'a symbol');
  if (t !== 'object') return;
  if (ArrayBuffer.isView(x) || x instanceof ArrayBuffer) return;
  const proto = Object.getPrototypeOf(x);
  if (!PLAIN_PROTOS.has(proto)) throw new NotPlainDataError(where, path, `an instance of ${(proto as { constructor?: { name?: string } })?.constructor?.name ?? 'a class'}`);
  if (x instanceof Map) {
    for (const [k, v] of x) {
      assertPlain(k, where, `${path}<key>`);
      assertPlain(v, where, `${path}.get(${String(k)})`);
    }
    return;
  }
  if (x instanceof Set) {
    for (const v of x) assertPlain(v, where, `${path}<item>`);
    return;
  }
  for (const [k, v] of Object.entries(x)) assertPlain(v, where, path ? `${path}.${k}` : k);
}

/** A copy of `x` as another process would receive it (checked plain first). */
export function crossing<T>(x: T, where: string): T {
  assertPlain(x, where);
  return deserialize(serialize(x)) as T;
}

/** How many values crossed, by hook (to check the wrapper was in the path). */
export type CrossCounts = Map<string, number>;

/**
 * `factory` with halves that only see serialized copies of what crosses between them.
 * @param counts incremented per hook each time a value crosses.
 */
export function crossProcessFactory(factory: KVConnectorFactory, counts: CrossCounts = new Map()): KVConnectorFactory {
  const cross = <T>(x: T, where: string): T => {
    counts.set(where, (counts.get(where) ?? 0) + 1);
    return crossing(x, where);
  };
  return {
    name: factory.name,
    createScheduler(config, ctx) {
      const s = factory.createScheduler(crossing(config, 'config'), ctx);
      const out: KVConnectorScheduler = {
        getNumNewMatchedTokens: (r, n) => s.getNumNewMatchedTokens(r, n),
        updateStateAfterAlloc: (r, b, n) => s.updateStateAfterAlloc(r, b, n),
        buildConnectorMeta: (o) => cross(s.buildConnectorMeta(o), 'buildConnectorMeta'),
        updateConnectorOutput: (outputs) => s.updateConnectorOutput(cross(outputs, 'updateConnectorOutput')),
        requestFinished: (r, b, why) => cross(s.requestFinished(r, b, why), 'requestFinished'),
        kvChecksumCarrier: (r) => s.kvChecksumCarrier(r),
        shutdown: () => s.shutdown?.(),
      };
      if (s.setXferHandshakeMetadata) out.setXferHandshakeMetadata = (m) => s.setXferHandshakeMetadata!(cross(m, 'setXferHandshakeMetadata'));
      if (s.sendKvChecksums) out.sendKvChecksums = (r, p) => s.sendKvChecksums!(r, p);
      return out;
    },
    createWorker(config, ctx) {
      const w = factory.createWorker(crossing(config, 'config'), ctx);
      const out: KVConnectorWorker = {
        registerKvCaches: (c) => w.registerKvCaches(c),
        bindConnectorMetadata: (m) => w.bindConnectorMetadata(cross(m, 'bindConnectorMetadata')),
        startLoadKv: (o) => w.startLoadKv(cross(o, 'startLoadKv')),
        getTransferResults: () => cross(w.getTransferResults(), 'getTransferResults'),
        clearConnectorMetadata: () => w.clearConnectorMetadata(),
        shutdown: () => w.shutdown?.(),
      };
      if (w.getHandshakeMetadata) out.getHandshakeMetadata = () => cross(w.getHandshakeMetadata!() ?? null, 'getHandshakeMetadata');
      if (w.waitForLayerLoad) out.waitForLayerLoad = (n) => w.waitForLayerLoad!(n);
      if (w.saveKvLayer) out.saveKvLayer = (n) => w.saveKvLayer!(n);
      if (w.waitForSave) out.waitForSave = () => w.waitForSave!();
      return out;
    },
  };
}

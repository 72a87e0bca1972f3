/**
 * The consumer's drill-down of a mismatched load (checksum-localize.ts, docs/localize.md) on the
 * fake P/D rig: the load failure policy acts at once; the workers' fine sums are asked for in the
 * next step's metadata; the result names where the sides differ, that the producer's blocks are
 * gone, that the deadline passed, or that the connector cannot ask; a verified load asks nothing.
 */
import { describe, expect, it } from 'vitest';
import { planGroup } from '@kvconnect/checksum';
import type { AttentionCacheView } from '@kvconnect/checksum';
import { LocalizeBusyError, localizeOnRank, type Localization, type LocalizeAnswer, type LocalizeQuery } from '../src/checksum-localize.js';
import type { ConnectorRequest } from '../src/connector.js';
import { METRIC_NAMES } from '../src/observability.js';
import { KVChecksumObservability } from '../src/observability.js';
import { CELL, HEADS, blockTables, captureLogger, cellAddress, writeCell, FakeConnector, logicalKV, metricValue, runConsumer, runProducer, type FakeWorker, type SideShape } from './fake-pd.js';

const TOKENS = 40;
const side = (tp: number, pp: number, blockSize: number, layout: 'NHD' | 'HND' = 'NHD'): SideShape => ({ tp, pp, blockSize, layout, kvLayout: 'kv-first' });

/** A connector whose producer answers `LOCALIZE` from the producer run's workers (or as `answer` says). */
class LocalizingConnector extends FakeConnector {
  asked: LocalizeQuery[] = [];
  constructor(private readonly answer: (q: LocalizeQuery) => Promise<LocalizeAnswer>) {
    super('kv_transfer_params');
  }
  localizeKvChecksums(_r: ConnectorRequest, q: LocalizeQuery): Promise<LocalizeAnswer> {
    this.asked.push(q);
    return this.answer(q);
  }
}

/** The producer's answer over its workers' memory (replica 0), as a NIXL producer computes it. */
function producerAnswer(workers: FakeWorker[], shape: SideShape, q: LocalizeQuery): LocalizeAnswer {
  const blocks = blockTables(1 + 100, TOKENS, shape.blockSize); // runProducer's seed 1
  const out: Array<{ groupId: number; sums: ReturnType<typeof localizeOnRank>['groups'][number]['sums'] }> = q.groups.map((g) => ({ groupId: g.groupId, sums: [] }));
  for (const w of workers) {
    const plans = w.groups.map((g) => planGroup(g, { tpRank: w.tpRank, tpSize: shape.tp, role: 'producer' }));
    const r = localizeOnRank(plans, (id) => id, [w.region], {
      requestId: 'req-1',
      numTokens: TOKENS,
      rangeTokens: q.rangeTokens,
      groups: q.groups.map((g) => {
        const B = shape.blockSize;
        const start = g.groupId === 2 ? 0 : Math.floor(g.tokenStart / B);
        const ids = g.groupId === 2 ? [blocks[2][blocks[2].length - 1]] : blocks[g.groupId].slice(start, Math.ceil(g.tokenEnd / B));
        return { groupId: g.groupId, start, blockIds: ids, tokenStart: g.tokenStart, tokenEnd: g.tokenEnd };
      }),
    });
    for (const g of r.groups) out.find((x) => x.groupId === g.groupId)!.sums.push(...g.sums);
  }
  return { status: 'held', groups: out };
}

/** Flips byte 0 (K) of local head 0, token `t` of block position `pos`, layer 1, on every consumer worker holding it. */
const corrupt = (pos: number, t: number) => (workers: FakeWorker[], blocks: number[][]) => {
  for (const w of workers) {
    const c = w.groups[0].caches.find((x) => x.name.includes('layers.1.')) as AttentionCacheView | undefined;
    if (c) w.region[cellAddress(c, blocks[0][pos], 0, t)] ^= 1;
  }
};

/**
 * Wrong head mapping across TP: consumer TP rank 1 gets the producer's global heads 0-1 of group 0
 * (what rank 0 holds) instead of its own 2-3, as a mapping that ignores the rank's head offset would.
 */
const wrongHeads = (kv: ReturnType<typeof logicalKV>, B: number) => (workers: FakeWorker[], blocks: number[][]) => {
  for (const w of workers) {
    if (w.tpRank !== 1) continue;
    for (const c of w.groups[0].caches as AttentionCacheView[]) {
      const data = kv.attn.get(Number(c.name.split('.')[2]))!;
      for (let t = 0; t < TOKENS; t++) for (let h = 0; h < c.localHeads; h++) writeCell(c, w.region, blocks[0][Math.floor(t / B)], h, t % B, data.subarray((t * HEADS + h) * CELL, (t * HEADS + h + 1) * CELL));
    }
  }
};

/** Runs a producer and a consumer whose load mismatches; then one more consumer step (the drill-down's). */
async function mismatched(p: SideShape, d: SideShape, answer: ((q: LocalizeQuery, prod: FakeWorker[]) => Promise<LocalizeAnswer>) | null, timeoutMs = 2000, corruptWith?: (kv: ReturnType<typeof logicalKV>) => Parameters<typeof runConsumer>[0]['corrupt']) {
  const kv = logicalKV(42, TOKENS);
  const prod = runProducer({ shape: p, kv, carrier: 'kv_transfer_params' });
  const connector = answer ? new LocalizingConnector((q) => answer(q, prod.workers)) : new FakeConnector('kv_transfer_params');
  const events: Localization[] = [];
  const logs: Array<Record<string, unknown>> = [];
  const obs = new KVChecksumObservability({ logger: captureLogger(logs) });
  let decided = false;
  let eventsBeforeDecision = 0;
  obs.events.on('load-mismatch', () => void (decided = true));
  obs.events.on('load-localized', (e) => {
    if (!decided) eventsBeforeDecision++;
    events.push(e);
  });
  const cons = runConsumer({ shape: d, kv, carrier: 'kv_transfer_params', params: prod.params, failClosed: true, corrupt: corruptWith ? corruptWith(kv) : corrupt(1, 3), connector, localize: { timeoutMs }, obs });
  // The engine's next step: the workers' orders, before that step's forward pass.
  const meta = cons.scheduler.buildStepMeta();
  cons.scheduler.updateFromOutputs(
    cons.workers.map((w) => {
      w.hooks.bindStepMeta(meta);
      return { ppRank: w.ppRank, tpRank: w.tpRank, finishedSending: new Set<string>(), finishedRecving: new Set<string>(), invalidBlockIds: new Set<number>(), kvChecksums: new Map(), kvChecksumReport: w.hooks.takeReport() };
    }),
  );
  return { cons, connector, events, meta, eventsBeforeDecision, logs };
}

const until = async (f: () => boolean, ms = 3000) => {
  for (const t = Date.now() + ms; !f() && Date.now() < t; ) await new Promise((r) => setTimeout(r, 5));
};

describe('drill-down of a mismatched load', () => {
  for (const [name, p, d] of [
    ['TP2 PP2 -> TP1 HND', side(2, 2, 16), side(1, 1, 16, 'HND')],
    ['TP1 block 32 -> TP2 block 16', side(1, 1, 32), side(2, 1, 16)],
  ] as const) {
    it(`${name}: the policy acts at once; then the region: layer 1, K, tokens 16-31`, async () => {
      const r = await mismatched(p, d, async (q, prod) => producerAnswer(prod, p, q));
      // Block 32 -> 16: the mismatched chunk is the producer's block, consumer positions 0-1.
      const positions = p.blockSize === 32 ? [0, 1] : [1];
      expect(r.cons.decision).toMatchObject({ action: 'recompute', verdict: { verdict: 'mismatch', mismatches: [{ groupId: 0, positions }] } });
      expect(r.eventsBeforeDecision).toBe(0);
      // Only the mismatched chunk is asked for and summed.
      expect(r.connector instanceof LocalizingConnector && r.connector.asked).toEqual([{ rangeTokens: 16, groups: [{ groupId: 0, tokenStart: positions[0] * 16, tokenEnd: 32 }] }]);
      expect(r.meta?.localize).toHaveLength(1);
      await until(() => r.events.length > 0);
      // Local head 0 is global head 0 on TP1 and on TP2 rank 0; on TP2 rank 1 it is global head 2.
      const want = d.tp === 2 ? ['layer 1, head 0, K, tokens 16-31', 'layer 1, head 2, K, tokens 16-31'] : ['layer 1, head 0, K, tokens 16-31'];
      expect(r.events.map((e) => [e.status, e.groups.map((g) => [g.groupId, g.text])])).toEqual([['localized', [[0, want]]]]);
      expect(await metricValue(r.cons.obs, METRIC_NAMES.localizations, { result: 'localized' })).toBe(1);
      expect(r.logs.some((l) => typeof l.msg === 'string' && l.msg.startsWith('KV checksum mismatch localized: group 0: layer 1, head 0, K, tokens 16-31'))).toBe(true);
      expect(r.cons.scheduler.localizer?.inProgress).toBe(0);
    });
  }

  it('wrong head mapping across TP (P TP1 -> D TP2, rank 1 gets heads 0-1): heads 2-3 of every layer, K and V, every token', async () => {
    const p = side(1, 1, 16);
    const r = await mismatched(p, side(2, 1, 16, 'HND'), async (q, prod) => producerAnswer(prod, p, q), 2000, (kv) => wrongHeads(kv, 16));
    expect(r.cons.decision.verdict?.mismatches).toEqual([{ groupId: 0, positions: [0, 1, 2] }]);
    await until(() => r.events.length > 0);
    expect(r.events.map((e) => [e.status, e.groups.map((g) => [g.groupId, g.text])])).toEqual([['localized', [[0, ['layers 0-1, heads 2-3, K and V, tokens 0-39']]]]]);
  });

  it('the producer no longer holds the blocks: gone', async () => {
    const r = await mismatched(side(1, 1, 16), side(1, 1, 16), async () => ({ status: 'gone', detail: 'request req-1: lease expired' }));
    await until(() => r.events.length > 0);
    expect(r.events.map((e) => [e.status, e.detail])).toEqual([['gone', 'request req-1: lease expired']]);
    expect(await metricValue(r.cons.obs, METRIC_NAMES.localizations, { result: 'gone' })).toBe(1);
  });

  it('no answer within the deadline: dropped (deadline), after the decision', async () => {
    const r = await mismatched(side(1, 1, 16), side(1, 1, 16), () => new Promise(() => {}), 30);
    expect(r.cons.decision.action).toBe('recompute');
    expect(r.events).toEqual([]);
    await until(() => r.events.length > 0);
    expect(r.events.map((e) => [e.status, e.detail])).toEqual([['dropped', 'deadline']]);
    expect(await metricValue(r.cons.obs, METRIC_NAMES.localizations, { result: 'dropped' })).toBe(1);
  });

  it('the producer refuses for its budget (LocalizeBusyError): dropped (busy), after the decision; another error stays error', async () => {
    const r = await mismatched(side(1, 1, 16), side(1, 1, 16), () => Promise.reject(new LocalizeBusyError('4 localizations of this consumer are being computed (at most 4)')));
    expect(r.cons.decision.action).toBe('recompute');
    await until(() => r.events.length > 0);
    expect(r.events.map((e) => [e.status, e.detail])).toEqual([['dropped', 'busy: 4 localizations of this consumer are being computed (at most 4)']]);
    expect(await metricValue(r.cons.obs, METRIC_NAMES.localizations, { result: 'dropped' })).toBe(1);
    const other = await mismatched(side(1, 1, 16), side(1, 1, 16), () => Promise.reject(new Error('refused (forbidden)')));
    await until(() => other.events.length > 0);
    expect(other.events.map((e) => e.status)).toEqual(['error']);
  });

  it('a connector that cannot ask its producer: unsupported, and no worker order', async () => {
    const r = await mismatched(side(1, 1, 16), side(1, 1, 16), null);
    expect(r.events.map((e) => e.status)).toEqual(['unsupported']);
    expect(r.meta?.localize).toBeUndefined();
  });

  it('a verified load: no order, no question, no event', async () => {
    const kv = logicalKV(42, TOKENS);
    const prod = runProducer({ shape: side(2, 1, 16), kv, carrier: 'kv_transfer_params' });
    const connector = new LocalizingConnector(async () => ({ status: 'gone', detail: 'x' }));
    const cons = runConsumer({ shape: side(1, 1, 16), kv, carrier: 'kv_transfer_params', params: prod.params, failClosed: true, connector });
    expect(cons.decision.verdict?.verdict).toBe('verified');
    expect(cons.scheduler.buildStepMeta()?.localize).toBeUndefined();
    expect(connector.asked).toEqual([]);
    expect(cons.scheduler.localizer?.inProgress).toBe(0);
  });
});

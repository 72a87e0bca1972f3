import { describe, expect, it } from 'vitest';
import { decodeReport, encodeReport, ReportFormatError, REPORT_JSON_FORMAT, type KVChecksumReport } from '../src/checksum-worker.js';
import { buildWorkers, logicalKV, layKV, blockTables } from './fake-pd.js';
import { KVChecksumScheduler } from '../src/checksum-scheduler.js';
import { KVChecksumObservability } from '../src/observability.js';
import { config, FakeConnector, groupConfigs } from './fake-pd.js';

function sampleReport(): KVChecksumReport {
  const shape = { tp: 2, pp: 1, blockSize: 16, layout: 'NHD' as const, kvLayout: 'kv-first' as const };
  const kv = logicalKV(3, 40);
  const workers = buildWorkers(shape, 3);
  const blocks = blockTables(9, 40, 16);
  for (const w of workers) layKV(w, shape, kv, blocks);
  const s = new KVChecksumScheduler({ config: config({ kv_role: 'kv_both' }), connector: new FakeConnector('connector'), tpSize: 2, ppSize: 1, groupConfigs: groupConfigs(16), observability: new KVChecksumObservability({ level: 'silent' }) });
  const r = { requestId: 'a', promptTokenIds: [], numComputedTokens: 0, numTokens: 40, kvTransferParams: { do_remote_decode: true } };
  s.onPromptComplete(r, blocks, 40);
  s.onLoadScheduled({ ...r, requestId: 'b' }, blocks, 16, 24);
  const w = workers[1].hooks;
  w.bindStepMeta(s.buildStepMeta());
  w.afterForward();
  w.afterTransferResults({ finishedSending: new Set(), finishedRecving: new Set(['b']), invalidBlockIds: new Set(), kvChecksums: new Map([['b', new Uint8Array([1, 2, 3])]]) });
  return w.takeReport()!;
}

describe('worker reports', () => {
  it('are plain data: structuredClone keeps them whole', () => {
    const r = sampleReport();
    expect(r.sends[0].groups.map((g) => g.groupId)).toEqual([0, 1, 2]);
    expect(r.recvs[0].groups[0]).toMatchObject({ start: 1, nBlocks: 2 });
    expect(r.received).toEqual([{ requestId: 'b', payload: new Uint8Array([1, 2, 3]) }]);
    expect(structuredClone(r)).toEqual(r);
  });

  it('encodeReport / decodeReport round-trip through JSON text', () => {
    const r = sampleReport();
    const text = JSON.stringify(encodeReport(r));
    expect(text).not.toMatch(/\d+n\b/);
    expect(JSON.parse(text).format).toBe(REPORT_JSON_FORMAT);
    const back = decodeReport(JSON.parse(text));
    expect(back).toEqual(r);
    expect(back.sends[0].groups[0].partials.get('1:0')).toBeInstanceOf(BigUint64Array);
  });

  it('decodeReport rejects what is not an encoded report', () => {
    const enc = encodeReport(sampleReport());
    expect(() => decodeReport({})).toThrow(ReportFormatError);
    expect(() => decodeReport({ ...enc, ppRank: -1 })).toThrow(ReportFormatError);
    const bad = JSON.parse(JSON.stringify(enc));
    bad.sends[0].groups[0].fingerprint = '18446744073709551616';
    expect(() => decodeReport(bad)).toThrow(/past 2\^64/);
    bad.sends[0].groups[0].fingerprint = '-1';
    expect(() => decodeReport(bad)).toThrow(ReportFormatError);
  });
});

import { describe, expect, it } from 'vitest';
import { parseFaults, parseScenario, resolveModelSpec, ValidationError } from '../src/index.js';

const ok = { name: 'x', model: 'GQA-S', requests: [{ promptTokens: 20 }], expect: {} };

function problems(raw: unknown): Array<{ path: string; message: string }> {
  try {
    parseScenario(raw);
  } catch (e) {
    if (e instanceof ValidationError) return [...e.problems];
    throw e;
  }
  return [];
}

describe('scenario validation', () => {
  it('accepts a minimal scenario and fills defaults', () => {
    const s = parseScenario(ok);
    expect(s).toMatchObject({ connector: 'in-process', checksums: true, mode: 'sequential', concurrency: 1, faults: [], runs: [{}], timeoutMs: 30000 });
  });

  it('reports every problem with its path', () => {
    const p = problems({
      name: '',
      model: 'nope',
      connector: 'tcp',
      producer: { tp: 0, layout: 'XYZ', extra: 1 },
      consumer: { policy: 'retry' },
      requests: [{ prompt: 'a', promptTokens: 3 }, { continueFrom: 1 }],
      faults: [{ kind: 'bit-flip', bit: 64 }, { kind: 'teleport' }, { kind: 'misplaced-tokens', tokens: [5, 2] }],
      expect: { requests: [{ request: 7, verdict: 'ok' }], counts: { bogus: 1 } },
      whatever: true,
    });
    const paths = p.map((x) => x.path);
    expect(paths).toEqual(
      expect.arrayContaining([
        'whatever',
        'name',
        'model',
        'connector',
        'producer.extra',
        'producer.tp',
        'producer.layout',
        'consumer.policy',
        'requests[0]',
        'requests[1].continueFrom',
        'faults[0].bit',
        'faults[1].kind',
        'faults[2].tokens',
        'faults[2].sourceOffset',
        'expect.requests[0].request',
        'expect.requests[0].verdict',
        'expect.counts.bogus',
      ]),
    );
    expect(p.find((x) => x.path === 'faults[0].bit')!.message).toMatch(/<= 63/);
    expect(p.find((x) => x.path === 'model')!.message).toMatch(/unknown model preset "nope"/);
  });

  it('needs exactly one of requests and generate, and an expect block', () => {
    expect(problems({ name: 'x', model: 'GQA-S', expect: {} }).map((x) => x.path)).toContain('requests');
    expect(problems({ name: 'x', model: 'GQA-S', requests: [{ promptTokens: 4 }] }).map((x) => x.path)).toContain('expect');
  });

  it('checks fault request indices against the requests', () => {
    expect(problems({ ...ok, faults: [{ kind: 'stale', requests: [3] }] }).map((x) => x.path)).toEqual(['faults[0].requests[0]']);
  });

  it('validates fault lists on their own', () => {
    expect(parseFaults([{ kind: 'payload', mode: 'drop' }])).toHaveLength(1);
    expect(() => parseFaults([{ kind: 'payload', mode: 'drop-group' }])).toThrow(/faults\[0\].groupId: required/);
  });

  it('resolves model presets and overrides', () => {
    const m = resolveModelSpec({ preset: 'GQA-S', overrides: { numLayers: 4, mamba: { nGroups: 1 } } });
    expect(m.layerTypes).toHaveLength(4);
    expect(resolveModelSpec('HYB-S').mamba!.nGroups).toBe(2);
    expect(resolveModelSpec({ preset: 'HYB-S', overrides: { mamba: { nGroups: 1 } } }).mamba!.nGroups).toBe(1);
  });
});

/**
 * Fault specs of the {@link FaultInjectingConnector} (the `faults` list of its extra config and of
 * a scenario), with strict validation. Ranges are inclusive `[first, last]`, heads are global
 * heads of a cache, tokens are request positions, layers are model-wide layer numbers.
 *
 * Which loads a fault hits: the requests it lists (`requests`: scenario request indices, matched
 * on the harness's request id prefix `r<index>.`; `requestIds`: substrings of request ids), then
 * `rate` (share of those loads, default 1), decided per request from `seed` (deterministic).
 * @module
 */
import { Checker, at, ValidationError, type Problem } from './validate.js';

/** Fill of changed bytes: what was in the consumer's slots before the load, zeros, seeded random bytes, or the bitwise complement. */
export type Fill = 'previous' | 'zero' | 'random' | 'invert';

/** Fields every fault has. */
export interface FaultCommon {
  /** Scenario request indices the fault may hit (harness request ids start with `r<index>.`). */
  requests?: number[];
  /** Substrings of request ids the fault may hit. */
  requestIds?: string[];
  /** Share of the matching loads to hit, in [0, 1] (default 1), decided per request from `seed`. */
  rate?: number;
  /** Seed of the rate decision and of random choices (default 0). */
  seed?: number;
  /** Free text shown in reports. */
  note?: string;
}

/** Selects attention cells (see `locate.ts`); absent fields select everything. */
export interface RegionFields {
  /** KV cache group id. */
  group?: number;
  layers?: [number, number];
  heads?: [number, number];
  tokens?: [number, number];
  part?: 'K' | 'V';
  /** State groups: which states (`conv`, `ssm`) and conv segments (`x`, `B`, `C`). */
  states?: Array<'conv' | 'ssm'>;
  segments?: Array<'x' | 'B' | 'C'>;
  /** Consumer TP ranks the fault applies on (default all). */
  tpRanks?: number[];
}

/**
 * One fault. Where each applies:
 * - consumer, after the inner connector reports the load finished and before the checksum worker
 *   sums it: `bit-flip`, `corrupt-region`, `misplaced-block`, `misplaced-tokens`, `wrong-layout`,
 *   `mamba-bc-sharded`, `transport-error`, `replay-params` (its fill), `notif`, `payload` on the
 *   `connector` carrier;
 * - consumer scheduler, before the checksum scheduler reads the request's params: `payload` on the
 *   `kv_transfer_params` carrier, `replay-params`;
 * - producer: `stale` (when the request finishes, before any read; restored once the consumer
 *   read it), `payload` with `side: "producer"` (bytes handed to `sendKvChecksums`).
 */
export type FaultSpec = FaultCommon &
  (
    | { kind: 'bit-flip'; group?: number; layer?: number; head?: number; token?: number; piece?: number; bit?: number; replicas?: 'first' | 'all' }
    | ({ kind: 'corrupt-region'; fill?: Fill } & RegionFields)
    | { kind: 'misplaced-block'; group?: number; position?: number; offset?: number }
    | { kind: 'misplaced-tokens'; group?: number; tokens: [number, number]; sourceOffset: number }
    | { kind: 'stale'; fill?: 'random' | 'zero' | 'none'; restore?: boolean }
    | { kind: 'wrong-layout'; group?: number; tpRanks?: number[] }
    | { kind: 'mamba-bc-sharded'; group?: number }
    | { kind: 'payload'; mode: 'drop' | 'truncate' | 'garbage' | 'drop-group'; keepBytes?: number; groupId?: number; side?: 'consumer' | 'producer' }
    | { kind: 'notif'; target: 'finished-recving' | 'kv-checksums'; mode: 'drop' | 'duplicate' | 'delay'; steps?: number; tpRanks?: number[] }
    | ({ kind: 'transport-error'; fill?: Fill } & RegionFields)
    | { kind: 'replay-params'; from: number | 'unknown'; producerBlocks?: 'intact' | 'zeroed' | 'reused' }
    | { kind: 'random-stale-range'; rangeTokens?: number; fill?: Fill }
  );

/** The fault kinds. */
export const FAULT_KINDS = [
  'bit-flip',
  'corrupt-region',
  'misplaced-block',
  'misplaced-tokens',
  'stale',
  'wrong-layout',
  'mamba-bc-sharded',
  'payload',
  'notif',
  'transport-error',
  'replay-params',
  'random-stale-range',
] as const;

/** A fault kind. */
export type FaultKind = (typeof FAULT_KINDS)[number];

const COMMON = ['kind', 'requests', 'requestIds', 'rate', 'seed', 'note'];
const REGION = ['group', 'layers', 'heads', 'tokens', 'part', 'states', 'segments', 'tpRanks'];
const FILLS = ['previous', 'zero', 'random', 'invert'] as const;

const FIELDS: Record<FaultKind, string[]> = {
  'bit-flip': ['group', 'layer', 'head', 'token', 'piece', 'bit', 'replicas'],
  'corrupt-region': [...REGION, 'fill'],
  'misplaced-block': ['group', 'position', 'offset'],
  'misplaced-tokens': ['group', 'tokens', 'sourceOffset'],
  stale: ['fill', 'restore'],
  'wrong-layout': ['group', 'tpRanks'],
  'mamba-bc-sharded': ['group'],
  payload: ['mode', 'keepBytes', 'groupId', 'side'],
  notif: ['target', 'mode', 'steps', 'tpRanks'],
  'transport-error': [...REGION, 'fill'],
  'replay-params': ['from', 'producerBlocks'],
  'random-stale-range': ['rangeTokens', 'fill'],
};

function checkRegion(c: Checker, o: Record<string, unknown>, p: string): void {
  if (o.group !== undefined) c.int(o.group, at(p, 'group'), { min: 0 });
  for (const k of ['layers', 'heads', 'tokens'] as const) if (o[k] !== undefined) c.range(o[k], at(p, k));
  if (o.part !== undefined) c.oneOf(o.part, at(p, 'part'), ['K', 'V']);
  if (o.states !== undefined) {
    if (!Array.isArray(o.states)) c.fail(at(p, 'states'), 'expected an array of "conv" | "ssm"');
    else o.states.forEach((s, i) => c.oneOf(s, at(at(p, 'states'), i), ['conv', 'ssm']));
  }
  if (o.segments !== undefined) {
    if (!Array.isArray(o.segments)) c.fail(at(p, 'segments'), 'expected an array of "x" | "B" | "C"');
    else o.segments.forEach((s, i) => c.oneOf(s, at(at(p, 'segments'), i), ['x', 'B', 'C']));
  }
  if (o.tpRanks !== undefined) c.intArray(o.tpRanks, at(p, 'tpRanks'), { min: 0 });
}

/** Checks one fault spec, adding problems under `path`. */
export function checkFault(c: Checker, raw: unknown, path: string): FaultSpec | undefined {
  const before = c.problems.length;
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) return c.fail(path, 'expected a fault object');
  const kind = c.oneOf((raw as Record<string, unknown>).kind, at(path, 'kind'), FAULT_KINDS);
  if (kind === undefined) return undefined;
  const o = c.object(raw, path, [...COMMON, ...FIELDS[kind]])!;
  if (o.requests !== undefined) c.intArray(o.requests, at(path, 'requests'), { min: 0 });
  if (o.requestIds !== undefined) c.stringArray(o.requestIds, at(path, 'requestIds'));
  if (o.rate !== undefined) c.number(o.rate, at(path, 'rate'), { min: 0, max: 1 });
  if (o.seed !== undefined) c.int(o.seed, at(path, 'seed'));
  if (o.note !== undefined) c.string(o.note, at(path, 'note'));
  const int = (k: string, min = 0) => o[k] !== undefined && c.int(o[k], at(path, k), { min });
  switch (kind) {
    case 'bit-flip':
      for (const k of ['group', 'layer', 'head', 'token', 'piece']) int(k);
      if (o.bit !== undefined) c.int(o.bit, at(path, 'bit'), { min: 0, max: 63 });
      if (o.replicas !== undefined) c.oneOf(o.replicas, at(path, 'replicas'), ['first', 'all']);
      break;
    case 'corrupt-region':
    case 'transport-error':
      checkRegion(c, o, path);
      if (o.fill !== undefined) c.oneOf(o.fill, at(path, 'fill'), FILLS);
      break;
    case 'misplaced-block':
      int('group');
      int('position');
      if (o.offset !== undefined) c.int(o.offset, at(path, 'offset'));
      break;
    case 'misplaced-tokens':
      int('group');
      if (c.required(o, 'tokens', path)) c.range(o.tokens, at(path, 'tokens'));
      if (c.required(o, 'sourceOffset', path)) c.int(o.sourceOffset, at(path, 'sourceOffset'));
      break;
    case 'stale':
      if (o.fill !== undefined) c.oneOf(o.fill, at(path, 'fill'), ['random', 'zero', 'none']);
      if (o.restore !== undefined) c.boolean(o.restore, at(path, 'restore'));
      break;
    case 'wrong-layout':
      int('group');
      if (o.tpRanks !== undefined) c.intArray(o.tpRanks, at(path, 'tpRanks'), { min: 0 });
      break;
    case 'mamba-bc-sharded':
      int('group');
      break;
    case 'payload':
      if (c.required(o, 'mode', path)) c.oneOf(o.mode, at(path, 'mode'), ['drop', 'truncate', 'garbage', 'drop-group']);
      int('keepBytes');
      int('groupId');
      if (o.mode === 'drop-group' && o.groupId === undefined) c.fail(at(path, 'groupId'), 'required with mode "drop-group"');
      if (o.side !== undefined) c.oneOf(o.side, at(path, 'side'), ['consumer', 'producer']);
      break;
    case 'notif':
      if (c.required(o, 'target', path)) c.oneOf(o.target, at(path, 'target'), ['finished-recving', 'kv-checksums']);
      if (c.required(o, 'mode', path)) c.oneOf(o.mode, at(path, 'mode'), ['drop', 'duplicate', 'delay']);
      if (o.steps !== undefined) c.int(o.steps, at(path, 'steps'), { min: 1 });
      if (o.tpRanks !== undefined) c.intArray(o.tpRanks, at(path, 'tpRanks'), { min: 0 });
      break;
    case 'replay-params':
      if (c.required(o, 'from', path) && o.from !== 'unknown') c.int(o.from, at(path, 'from'), { min: 0 });
      if (o.producerBlocks !== undefined) c.oneOf(o.producerBlocks, at(path, 'producerBlocks'), ['intact', 'zeroed', 'reused']);
      break;
    case 'random-stale-range':
      int('rangeTokens', 1);
      if (o.fill !== undefined) c.oneOf(o.fill, at(path, 'fill'), FILLS);
      break;
  }
  return c.problems.length === before ? (o as unknown as FaultSpec) : undefined;
}

/**
 * Validates a fault list.
 * @throws ValidationError listing every problem (paths under `path`).
 */
export function parseFaults(raw: unknown, path = 'faults'): FaultSpec[] {
  const c = new Checker();
  const out = checkFaultList(c, raw, path);
  if (c.problems.length > 0) throw new ValidationError('fault list', c.problems);
  return out ?? [];
}

/** Checks a fault list, adding problems to `c`. */
export function checkFaultList(c: Checker, raw: unknown, path: string): FaultSpec[] | undefined {
  if (!Array.isArray(raw)) return c.fail(path, 'expected an array of faults');
  const out: FaultSpec[] = [];
  raw.forEach((f, i) => {
    const x = checkFault(c, f, at(path, i));
    if (x) out.push(x);
  });
  return out;
}

export type { Problem };

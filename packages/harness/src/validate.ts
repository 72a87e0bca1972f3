/**
 * A small strict validator for the harness's JSON inputs (scenarios, fault specs): every problem
 * is collected with its JSON path (`faults[2].tokens[1]`) and a message, never only the first.
 * The checks are zod schemas (the one schema library of kvconnect, `@kvconnect/core`'s schema.ts).
 * @module
 */
import { z, zodProblems } from '@kvconnect/core';

/** One problem of an input: where (a JSON path; `''` is the root) and what. */
export interface Problem {
  path: string;
  message: string;
}

/** An input that does not validate; `problems` lists every problem found. */
export class ValidationError extends Error {
  readonly problems: readonly Problem[];
  constructor(what: string, problems: readonly Problem[]) {
    super(`invalid ${what}:\n${problems.map((p) => `  ${p.path || '(root)'}: ${p.message}`).join('\n')}`);
    this.name = 'ValidationError';
    this.problems = problems;
  }
}

/** The JSON kind of a value, for messages. */
export function kindOf(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  return typeof v;
}

/** True for a plain JSON object. */
export function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** `base.key` / `base[i]` path joining. */
export function at(base: string, key: string | number): string {
  if (typeof key === 'number') return `${base}[${key}]`;
  return base ? `${base}.${key}` : key;
}

/** Number checks of {@link Checker.number} / {@link Checker.int}, as zod refinements. */
function bounded(s: z.ZodType<number>, opts: { min?: number; max?: number }): z.ZodType<number> {
  let out = s;
  if (opts.min !== undefined) out = out.refine((v) => v >= opts.min!, { error: (iss) => `must be >= ${opts.min}, got ${String(iss.input)}`, abort: true });
  if (opts.max !== undefined) out = out.refine((v) => v <= opts.max!, { error: (iss) => `must be <= ${opts.max}, got ${String(iss.input)}`, abort: true });
  return out;
}

const NUMBER = z.number({ error: (iss) => `expected a number, got ${kindOf(iss.input)}` }).refine((v) => Number.isFinite(v), { error: 'expected a number, got number', abort: true });
const INT = z.custom<number>((v) => typeof v === 'number' && Number.isSafeInteger(v), { error: (iss) => `expected an integer, got ${typeof iss.input === 'number' ? iss.input : kindOf(iss.input)}` });
const STRING = z.string({ error: (iss) => `expected a string, got ${kindOf(iss.input)}` });
const BOOLEAN = z.boolean({ error: (iss) => `expected a boolean, got ${kindOf(iss.input)}` });

/**
 * Collects problems while reading a value. Readers return the value when valid, else undefined.
 * Each reader checks with a zod schema (`@kvconnect/core`'s `zodProblems` gives the paths and
 * messages), so the harness validates with the same library as the configs and the engine API.
 */
export class Checker {
  readonly problems: Problem[] = [];

  fail(path: string, message: string): undefined {
    this.problems.push({ path, message });
    return undefined;
  }

  /** `schema` on `v`: the parsed value, or undefined with its problems recorded at `path`. */
  check<T>(schema: z.ZodType<T>, v: unknown, path: string): T | undefined {
    const r = schema.safeParse(v);
    if (r.success) return r.data;
    this.problems.push(...zodProblems(r.error, path));
    return undefined;
  }

  /** An object with only `known` keys (unknown keys are problems). */
  object(v: unknown, path: string, known: readonly string[]): Record<string, unknown> | undefined {
    if (!isObject(v)) return this.fail(path, `expected an object, got ${kindOf(v)}`);
    const shape = Object.fromEntries(known.map((k) => [k, z.unknown().optional()]));
    this.check(z.strictObject(shape, { error: `unknown field (known: ${known.join(', ')})` }), v, path);
    return v;
  }

  /** A required field is present. */
  required(o: Record<string, unknown>, key: string, path: string): boolean {
    if (o[key] === undefined) {
      this.fail(at(path, key), 'required');
      return false;
    }
    return true;
  }

  string(v: unknown, path: string, opts: { nonEmpty?: boolean } = {}): string | undefined {
    return this.check(opts.nonEmpty ? STRING.min(1, { error: 'must not be empty' }) : STRING, v, path);
  }

  boolean(v: unknown, path: string): boolean | undefined {
    return this.check(BOOLEAN, v, path);
  }

  number(v: unknown, path: string, opts: { min?: number; max?: number } = {}): number | undefined {
    return this.check(bounded(NUMBER, opts), v, path);
  }

  int(v: unknown, path: string, opts: { min?: number; max?: number } = {}): number | undefined {
    return this.check(bounded(INT, opts), v, path);
  }

  oneOf<T extends string>(v: unknown, path: string, values: readonly T[]): T | undefined {
    const msg = `expected one of ${values.map((x) => JSON.stringify(x)).join(', ')}, got ${JSON.stringify(v)}`;
    return this.check(z.custom<T>((x) => typeof x === 'string' && (values as readonly string[]).includes(x), { error: msg }), v, path);
  }

  /** An inclusive integer range `[a, b]` with `a <= b`. */
  range(v: unknown, path: string, min = 0): [number, number] | undefined {
    if (!Array.isArray(v) || v.length !== 2) return this.fail(path, `expected [first, last] (two integers), got ${kindOf(v)}`);
    const a = this.int(v[0], at(path, 0), { min });
    const b = this.int(v[1], at(path, 1), { min });
    if (a === undefined || b === undefined) return undefined;
    if (a > b) return this.fail(path, `first ${a} is after last ${b}`);
    return [a, b];
  }

  intArray(v: unknown, path: string, opts: { min?: number; nonEmpty?: boolean } = {}): number[] | undefined {
    if (!Array.isArray(v)) return this.fail(path, `expected an array of integers, got ${kindOf(v)}`);
    if (opts.nonEmpty && v.length === 0) return this.fail(path, 'must not be empty');
    return this.check(z.array(bounded(INT, { min: opts.min })), v, path);
  }

  stringArray(v: unknown, path: string): string[] | undefined {
    if (!Array.isArray(v)) return this.fail(path, `expected an array of strings, got ${kindOf(v)}`);
    return this.check(z.array(STRING), v, path);
  }
}

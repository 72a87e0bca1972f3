/**
 * A small strict validator for the harness's JSON inputs (scenarios, fault specs): every problem
 * is collected with its JSON path (`faults[2].tokens[1]`) and a message, never only the first.
 * @module
 */

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

/** Collects problems while reading a value. Readers return the value when valid, else undefined. */
export class Checker {
  readonly problems: Problem[] = [];

  fail(path: string, message: string): undefined {
    this.problems.push({ path, message });
    return undefined;
  }

  /** An object with only `known` keys (unknown keys are problems). */
  object(v: unknown, path: string, known: readonly string[]): Record<string, unknown> | undefined {
    if (!isObject(v)) return this.fail(path, `expected an object, got ${kindOf(v)}`);
    for (const k of Object.keys(v)) if (!known.includes(k)) this.fail(at(path, k), `unknown field (known: ${known.join(', ')})`);
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
    if (typeof v !== 'string') return this.fail(path, `expected a string, got ${kindOf(v)}`);
    if (opts.nonEmpty && v.length === 0) return this.fail(path, 'must not be empty');
    return v;
  }

  boolean(v: unknown, path: string): boolean | undefined {
    if (typeof v !== 'boolean') return this.fail(path, `expected a boolean, got ${kindOf(v)}`);
    return v;
  }

  number(v: unknown, path: string, opts: { min?: number; max?: number } = {}): number | undefined {
    if (typeof v !== 'number' || !Number.isFinite(v)) return this.fail(path, `expected a number, got ${kindOf(v)}`);
    if (opts.min !== undefined && v < opts.min) return this.fail(path, `must be >= ${opts.min}, got ${v}`);
    if (opts.max !== undefined && v > opts.max) return this.fail(path, `must be <= ${opts.max}, got ${v}`);
    return v;
  }

  int(v: unknown, path: string, opts: { min?: number; max?: number } = {}): number | undefined {
    if (typeof v !== 'number' || !Number.isSafeInteger(v)) return this.fail(path, `expected an integer, got ${typeof v === 'number' ? v : kindOf(v)}`);
    return this.number(v, path, opts);
  }

  oneOf<T extends string>(v: unknown, path: string, values: readonly T[]): T | undefined {
    if (typeof v !== 'string' || !(values as readonly string[]).includes(v)) return this.fail(path, `expected one of ${values.map((x) => JSON.stringify(x)).join(', ')}, got ${JSON.stringify(v)}`);
    return v as T;
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
    const out: number[] = [];
    let ok = true;
    v.forEach((x, i) => {
      const n = this.int(x, at(path, i), { min: opts.min });
      if (n === undefined) ok = false;
      else out.push(n);
    });
    return ok ? out : undefined;
  }

  stringArray(v: unknown, path: string): string[] | undefined {
    if (!Array.isArray(v)) return this.fail(path, `expected an array of strings, got ${kindOf(v)}`);
    let ok = true;
    v.forEach((x, i) => {
      if (this.string(x, at(path, i)) === undefined) ok = false;
    });
    return ok ? (v as string[]) : undefined;
  }
}

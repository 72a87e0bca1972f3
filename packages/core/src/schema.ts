/**
 * Schema building blocks (zod 4) shared by every config and request validator of kvconnect: the
 * core `kv_transfer_config`, the connectors' `kv_connector_extra_config`s, the engine's process
 * config and the harness's scenarios. Each block carries the error message kvconnect has always
 * given (`expected a boolean, got string`, `required`, `unknown key (known: a, b)`), and
 * {@link zodProblems} turns a zod error into {@link ConfigProblem}s whose paths read
 * `kv_connector_extra_config.connectors[0].kv_role`.
 * @see https://zod.dev/error-customization (zod 4 error maps)
 * @module
 */
import { z } from 'zod';
import type { ConfigProblem } from './config.js';

export { z };

/** The JSON kind of a value, as error messages name it: `null`, `array`, or its `typeof`. */
export function kindOf(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  return typeof v;
}

/** True for `{}`-like objects (prototype Object or null), not arrays, class instances or functions. */
export function isPlainObject(v: unknown): v is Record<string, unknown> {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return false;
  const proto = Object.getPrototypeOf(v);
  return proto === Object.prototype || proto === null;
}

/** `required` for an absent value, else `expected <what>, got <kind>`. */
function typeError(what: string, required = 'required'): (iss: { input?: unknown }) => string {
  return (iss) => (iss.input === undefined ? required : `expected ${what}, got ${kindOf(iss.input)}`);
}

/** A string; `nonEmpty` adds `must not be empty`. Messages: `required`, `expected a string, got number`. */
export function str(o: { nonEmpty?: boolean; required?: string } = {}): z.ZodString {
  const s = z.string({ error: typeError('a string', o.required) });
  return o.nonEmpty ? s.min(1, { error: 'must not be empty' }) : s;
}

/** A boolean. Message: `expected a boolean, got string`. */
export function bool(): z.ZodBoolean {
  return z.boolean({ error: typeError('a boolean') });
}

/** One of `values`. Messages: `expected a string, got number`; `expected one of a, b, got "c"`. */
export function oneOf<const T extends readonly [string, ...string[]]>(values: T, o: { required?: string } = {}): z.ZodType<T[number]> {
  return z.string({ error: typeError('a string', o.required ?? `required (one of ${values.join(', ')})`) }).refine((v): v is T[number] => (values as readonly string[]).includes(v), {
    error: (iss) => `expected one of ${values.join(', ')}, got ${JSON.stringify(iss.input)}`,
  }) as unknown as z.ZodType<T[number]>;
}

/**
 * A safe integer in `[min, max]`. Message: `expected an integer in min..max`; without `max`:
 * `expected a non-negative integer` (min 0), `expected a positive integer` (min 1).
 */
export function int(min: number, max: number = Number.MAX_SAFE_INTEGER): z.ZodType<number> {
  const msg =
    max !== Number.MAX_SAFE_INTEGER ? `expected an integer in ${min}..${max}` : min === 0 ? 'expected a non-negative integer' : min === 1 ? 'expected a positive integer' : `expected an integer >= ${min}`;
  return z.number({ error: msg }).refine((v) => Number.isSafeInteger(v) && v >= min && v <= max, { error: msg });
}

/** A plain object (any keys). Message: `expected an object, got array`. */
export function plainObject(): z.ZodType<Record<string, unknown>> {
  return z.custom<Record<string, unknown>>((v) => isPlainObject(v), { error: (iss) => `expected an object, got ${kindOf(iss.input)}` });
}

/**
 * A plain object with exactly the keys of `shape`: any other key is a problem of its own, at its
 * path, `unknown key (known: <the keys of shape>)`; a non-object is `expected an object, got <kind>`.
 */
export function strictObject<S extends z.ZodRawShape>(shape: S): z.ZodObject<S, z.core.$strict> {
  const known = Object.keys(shape).join(', ');
  return z.strictObject(shape, {
    error: (iss) => (iss.code === 'unrecognized_keys' ? `unknown key (known: ${known})` : `expected an object, got ${kindOf(iss.input)}`),
  });
}

function pathOf(prefix: string, path: readonly PropertyKey[]): string {
  let out = prefix;
  for (const k of path) {
    if (typeof k === 'number') out += `[${k}]`;
    else out += out ? `.${String(k)}` : String(k);
  }
  return out;
}

/**
 * The problems of a zod error, one per field path (the first issue zod found there; an
 * `unrecognized_keys` issue gives one per key, at the key's path), in the order zod found them. `prefix` is prepended to every path
 * (`kv_connector_extra_config`).
 */
export function zodProblems(error: z.ZodError, prefix = ''): ConfigProblem[] {
  const out: ConfigProblem[] = [];
  const seen = new Set<string>();
  const add = (path: string, message: string) => {
    if (seen.has(path)) return;
    seen.add(path);
    out.push({ path, message });
  };
  for (const iss of error.issues) {
    if (iss.code === 'unrecognized_keys') for (const k of iss.keys) add(pathOf(prefix, [...iss.path, k]), iss.message);
    else add(pathOf(prefix, iss.path), iss.message);
  }
  return out;
}

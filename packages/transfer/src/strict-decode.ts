/**
 * Strict field decoders for values a peer sent (decoded MessagePack): the one set the side
 * channels of `@kvconnect/nixl-common` (`codec.ts`) and `@kvconnect/mooncake` (`protocol.ts`)
 * check their messages with. Each helper returns the value when its type, range and size are
 * right, and otherwise calls the package's `fail(path, detail)`, which throws that package's typed
 * error (`NixlDecodeError`, `MooncakeProtocolError`); no helper throws anything else.
 *
 * `path` names the field (`requests["r1"][1][0]`); `detail` says what is wrong and what was there
 * (`expected a string, got number`). Sizes: strings in UTF-16 code units, bins in bytes, arrays
 * and maps in entries.
 * @module
 */

/** Throws the caller's typed error for field `path`; never returns. */
export type DecodeFail = (path: string, detail: string) => never;

/** A short name of a decoded value's type, for error details (`null`, `array`, `bin`, `map`, or `typeof`). */
export function describeValue(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  if (v instanceof Uint8Array) return 'bin';
  if (v instanceof Map) return 'map';
  return typeof v;
}

/** The helpers {@link strictDecoders} returns, every one reporting through its `fail`. */
export interface StrictDecoders {
  /** A safe integer in `0..max`. */
  nat(x: unknown, path: string, max?: number): number;
  /** A safe integer in `1..max`. */
  pos(x: unknown, path: string, max?: number): number;
  /** A string of `min..max` code units (`min` default 1: not empty). */
  str(x: unknown, path: string, max: number, min?: number): string;
  /** A bin of at most `max` bytes, copied (a decoded bin may view the message buffer). */
  bin(x: unknown, path: string, max: number): Uint8Array;
  /** An array of `min..max` entries. */
  arr(x: unknown, path: string, max: number, min?: number): unknown[];
  /** A boolean. */
  bool(x: unknown, path: string): boolean;
  /** One of the strings `values`. */
  oneOf<T extends string>(x: unknown, path: string, values: readonly T[]): T;
  /** A map of at most `max` entries whose keys are strings of `1..keyMax` code units (`${path} key`). */
  strMap(x: unknown, path: string, max: number, keyMax: number): Map<string, unknown>;
}

/**
 * The strict decoders, reporting every defect through `fail`.
 * @example const { nat, str } = strictDecoders((path, detail) => { throw new MyDecodeError(`${path}: ${detail}`); });
 */
export function strictDecoders(fail: DecodeFail): StrictDecoders {
  const got = (x: unknown) => `got ${describeValue(x)}${typeof x === 'number' ? ` ${x}` : ''}`;
  const nat = (x: unknown, path: string, max = Number.MAX_SAFE_INTEGER): number => {
    if (typeof x !== 'number' || !Number.isSafeInteger(x) || x < 0) return fail(path, `expected a non-negative integer, ${got(x)}`);
    if (x > max) return fail(path, `${x} exceeds ${max}`);
    return x;
  };
  const str = (x: unknown, path: string, max: number, min = 1): string => {
    if (typeof x !== 'string') return fail(path, `expected a string, ${got(x)}`);
    if (x.length < min) return fail(path, min === 1 ? 'must not be empty' : `shorter than ${min} characters`);
    if (x.length > max) return fail(path, `longer than ${max} characters`);
    return x;
  };
  return {
    nat,
    pos(x, path, max) {
      const v = nat(x, path, max);
      return v < 1 ? fail(path, 'expected an integer >= 1, got 0') : v;
    },
    str,
    bin(x, path, max) {
      if (!(x instanceof Uint8Array)) return fail(path, `expected a bin, ${got(x)}`);
      if (x.byteLength > max) return fail(path, `${x.byteLength} bytes exceed the limit of ${max}`);
      return new Uint8Array(x);
    },
    arr(x, path, max, min = 0) {
      if (!Array.isArray(x)) return fail(path, `expected an array, ${got(x)}`);
      if (x.length > max) return fail(path, `more than ${max} entries`);
      if (x.length < min) return fail(path, `fewer than ${min} entries`);
      return x;
    },
    bool(x, path) {
      return typeof x === 'boolean' ? x : fail(path, `expected a boolean, ${got(x)}`);
    },
    oneOf<T extends string>(x: unknown, path: string, values: readonly T[]): T {
      if (typeof x !== 'string' || !(values as readonly string[]).includes(x)) return fail(path, `expected one of ${values.join(', ')}, ${typeof x === 'string' ? `got ${JSON.stringify(x.slice(0, 64))}` : got(x)}`);
      return x as T;
    },
    strMap(x, path, max, keyMax) {
      if (!(x instanceof Map)) return fail(path, `expected a map, ${got(x)}`);
      if (x.size > max) return fail(path, `more than ${max} entries`);
      for (const k of x.keys()) str(k, `${path} key`, keyMax);
      return x as Map<string, unknown>;
    },
  };
}

/**
 * The KV transfer config (vLLM's `kv_transfer_config`): validation of the raw JSON an operator
 * writes into a {@link KVTransferConfig} with defaults.
 * @module
 */
import type { KVRole, KVTransferConfig } from './connector.js';

/** One problem of a raw config: the field path (`kv_role`, `kv_connector_extra_config.connectors[0].kv_connector`) and what is wrong. */
export interface ConfigProblem {
  path: string;
  message: string;
}

/** A raw config that does not validate. `problems` lists every problem found, not only the first. */
export class KVTransferConfigError extends Error {
  readonly problems: readonly ConfigProblem[];

  constructor(problems: readonly ConfigProblem[]) {
    super(`invalid kv_transfer_config: ${problems.map((p) => `${p.path || '(root)'}: ${p.message}`).join('; ')}`);
    this.name = 'KVTransferConfigError';
    this.problems = problems;
  }
}

const ROLES: readonly KVRole[] = ['kv_producer', 'kv_consumer', 'kv_both'];
const POLICIES = ['fail', 'recompute'] as const;
const KEYS = [
  'kv_connector',
  'kv_role',
  'enable_kv_checksum',
  'kv_checksum_fail_closed',
  'kv_checksum_sample_rate',
  'kv_load_failure_policy',
  'kv_connector_extra_config',
  'kv_connector_module_path',
] as const;

function kindOf(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  return typeof v;
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return false;
  const proto = Object.getPrototypeOf(v);
  return proto === Object.prototype || proto === null;
}

/**
 * Validates a raw `kv_transfer_config` object (e.g. parsed from `--kv-transfer-config` JSON).
 *
 * Keys (vLLM names):
 * - `kv_connector` (required, non-empty string): the registered connector name;
 * - `kv_role` (required): `kv_producer`, `kv_consumer` or `kv_both`;
 * - `enable_kv_checksum` (boolean, default false): checksum KV loads (set on both sides);
 * - `kv_checksum_fail_closed` (boolean, default false): mismatched or unverified loads go to
 *   the load failure policy instead of being logged and used (SPEC 8);
 * - `kv_checksum_sample_rate` (number in (0, 1], default 1): check only a keyed sample of each
 *   request's blocks (docs/checksum-extensions.md section 2; below 1 it needs the cluster secret);
 * - `kv_load_failure_policy` (`fail` | `recompute`, default `recompute`);
 * - `kv_connector_extra_config` (plain object, default `{}`): connector options, not validated here;
 * - `kv_connector_module_path` (optional non-empty string): a module to import that registers
 *   `kv_connector` (see `KVConnectorRegistry.loadModule`).
 *
 * @param raw - the raw value; `pathPrefix` prefixes problem paths (used for nested configs).
 * An absent key takes its default; `null` is a wrong type, not a default.
 *
 * @returns a new config object with defaults filled in (the extra config is copied shallowly).
 * @throws KVTransferConfigError listing every problem: unknown keys, missing or wrongly typed
 *   fields, values outside their sets.
 */
export function parseKVTransferConfig(raw: unknown, pathPrefix = ''): KVTransferConfig {
  const p = (k: string) => (pathPrefix ? `${pathPrefix}.${k}` : k);
  const problems: ConfigProblem[] = [];
  if (!isPlainObject(raw)) {
    throw new KVTransferConfigError([{ path: pathPrefix, message: `expected an object, got ${kindOf(raw)}` }]);
  }
  for (const k of Object.keys(raw)) {
    if (!(KEYS as readonly string[]).includes(k)) problems.push({ path: p(k), message: `unknown key (known: ${KEYS.join(', ')})` });
  }
  const bool = (k: string): boolean => {
    const v = raw[k];
    if (v === undefined) return false;
    if (typeof v !== 'boolean') problems.push({ path: p(k), message: `expected a boolean, got ${kindOf(v)}` });
    return v === true;
  };

  const connector = raw.kv_connector;
  if (connector === undefined) problems.push({ path: p('kv_connector'), message: 'required' });
  else if (typeof connector !== 'string') problems.push({ path: p('kv_connector'), message: `expected a string, got ${kindOf(connector)}` });
  else if (connector.length === 0) problems.push({ path: p('kv_connector'), message: 'must not be empty' });

  const role = raw.kv_role;
  if (role === undefined) problems.push({ path: p('kv_role'), message: `required (one of ${ROLES.join(', ')})` });
  else if (typeof role !== 'string') problems.push({ path: p('kv_role'), message: `expected a string, got ${kindOf(role)}` });
  else if (!(ROLES as readonly string[]).includes(role)) problems.push({ path: p('kv_role'), message: `expected one of ${ROLES.join(', ')}, got ${JSON.stringify(role)}` });

  const enable = bool('enable_kv_checksum');
  const failClosed = bool('kv_checksum_fail_closed');

  const rate = raw.kv_checksum_sample_rate;
  if (rate !== undefined && !(typeof rate === 'number' && rate > 0 && rate <= 1)) problems.push({ path: p('kv_checksum_sample_rate'), message: `expected a number in (0, 1], got ${typeof rate === 'number' ? rate : kindOf(rate)}` });

  const policy = raw.kv_load_failure_policy === undefined ? 'recompute' : raw.kv_load_failure_policy;
  if (typeof policy !== 'string') problems.push({ path: p('kv_load_failure_policy'), message: `expected a string, got ${kindOf(policy)}` });
  else if (!(POLICIES as readonly string[]).includes(policy)) {
    problems.push({ path: p('kv_load_failure_policy'), message: `expected one of ${POLICIES.join(', ')}, got ${JSON.stringify(policy)}` });
  }

  const extra = raw.kv_connector_extra_config === undefined ? {} : raw.kv_connector_extra_config;
  if (!isPlainObject(extra)) problems.push({ path: p('kv_connector_extra_config'), message: `expected an object, got ${kindOf(extra)}` });

  const modulePath = raw.kv_connector_module_path;
  if (modulePath !== undefined) {
    if (typeof modulePath !== 'string') problems.push({ path: p('kv_connector_module_path'), message: `expected a string, got ${kindOf(modulePath)}` });
    else if (modulePath.length === 0) problems.push({ path: p('kv_connector_module_path'), message: 'must not be empty' });
  }

  if (problems.length > 0) throw new KVTransferConfigError(problems);
  const config: KVTransferConfig = {
    kv_connector: connector as string,
    kv_role: role as KVRole,
    enable_kv_checksum: enable,
    kv_checksum_fail_closed: failClosed,
    kv_load_failure_policy: policy as 'fail' | 'recompute',
    kv_connector_extra_config: { ...(extra as Record<string, unknown>) },
  };
  if (modulePath !== undefined) config.kv_connector_module_path = modulePath as string;
  if (rate !== undefined) config.kv_checksum_sample_rate = rate as number;
  return config;
}

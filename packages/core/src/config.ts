/**
 * The KV transfer config (vLLM's `kv_transfer_config`): validation of the raw JSON an operator
 * writes into a {@link KVTransferConfig} with defaults.
 * @module
 */
import type { KVRole, KVTransferConfig } from './connector.js';
import { bool, int, isPlainObject, kindOf, oneOf, plainObject, str, strictObject, z, zodProblems } from './schema.js';

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

const ROLES = ['kv_producer', 'kv_consumer', 'kv_both'] as const satisfies readonly KVRole[];
const POLICIES = ['fail', 'recompute'] as const;

/**
 * Keys of vLLM's `KVTransferConfig` (vllm/config/kv_transfer.py) that have no meaning in kvconnect:
 * accepted (type-checked as vLLM types them), kept in the config, and ignored; the engine logs
 * each one it sees at debug level ({@link ignoredTransferConfigKeys}). `kv_buffer_device`,
 * `kv_buffer_size`, `kv_rank`, `kv_parallel_size`, `kv_ip` and `kv_port` serve vLLM's NCCL-based
 * connectors (the NIXL and Mooncake connectors here find their peers through
 * `kv_transfer_params` and their own extra config); `enable_permute_local_kv` permutes a GPU
 * layout kvconnect does not have.
 */
export const IGNORED_VLLM_KEYS = ['kv_buffer_device', 'kv_buffer_size', 'kv_rank', 'kv_parallel_size', 'kv_ip', 'kv_port', 'enable_permute_local_kv'] as const;

const optionalInt = (min: number, max?: number) => int(min, max).optional();

/** The zod schema of a raw `kv_transfer_config` (see {@link parseKVTransferConfig} for the keys). */
export const kvTransferConfigSchema = strictObject({
  kv_connector: str({ nonEmpty: true }),
  kv_role: oneOf(ROLES),
  enable_kv_checksum: bool().optional(),
  kv_checksum_fail_closed: bool().optional(),
  kv_checksum_sample_rate: z
    .unknown()
    .refine((r) => typeof r === 'number' && r > 0 && r <= 1, { error: (iss) => `expected a number in (0, 1], got ${typeof iss.input === 'number' ? iss.input : kindOf(iss.input)}` })
    .transform((r) => r as number)
    .optional(),
  kv_load_failure_policy: oneOf(POLICIES).optional(),
  kv_connector_extra_config: plainObject().optional(),
  kv_connector_module_path: str({ nonEmpty: true }).optional(),
  engine_id: str({ nonEmpty: true }).optional(),
  kv_buffer_device: str({ nonEmpty: true }).optional(),
  kv_buffer_size: z.number({ error: (iss) => `expected a number, got ${kindOf(iss.input)}` }).nonnegative({ error: 'must not be negative' }).optional(),
  kv_rank: int(0).nullable().optional(),
  kv_parallel_size: optionalInt(1),
  kv_ip: str({ nonEmpty: true }).optional(),
  kv_port: optionalInt(0, 65535),
  enable_permute_local_kv: bool().optional(),
});

/**
 * Validates a raw `kv_transfer_config` object (e.g. parsed from `--kv-transfer-config` JSON).
 *
 * Keys (vLLM names, vllm/config/kv_transfer.py):
 * - `kv_connector` (required, non-empty string): the registered connector name;
 * - `kv_role` (required): `kv_producer`, `kv_consumer` or `kv_both`;
 * - `enable_kv_checksum` (boolean, default false): checksum KV loads (set on both sides);
 * - `kv_checksum_fail_closed` (boolean, default false): mismatched or unverified loads go to
 *   the load failure policy instead of being logged and used (SPEC 8);
 * - `kv_checksum_sample_rate` (number in (0, 1], default 1): check only a keyed sample of each
 *   request's blocks (docs/checksum-extensions.md section 2; below 1 it needs the cluster secret);
 * - `kv_load_failure_policy` (`fail` | `recompute`, default `recompute`);
 * - `kv_connector_extra_config` (plain object, default `{}`): connector options, validated by the
 *   connector's factory;
 * - `kv_connector_module_path` (optional non-empty string): a module to import that registers
 *   `kv_connector` (see `KVConnectorRegistry.loadModule`);
 * - `engine_id` (optional non-empty string): the engine's id, as in vLLM, when the engine is not
 *   given one itself (`--engine-id`);
 * - {@link IGNORED_VLLM_KEYS}: accepted with vLLM's types and ignored.
 *
 * @param raw - the raw value; `pathPrefix` prefixes problem paths (used for nested configs).
 * An absent key takes its default; `null` is a wrong type, not a default.
 *
 * @returns a new config object with defaults filled in (the extra config is copied shallowly).
 * @throws KVTransferConfigError listing every problem: unknown keys, missing or wrongly typed
 *   fields, values outside their sets.
 */
export function parseKVTransferConfig(raw: unknown, pathPrefix = ''): KVTransferConfig {
  if (!isPlainObject(raw)) {
    throw new KVTransferConfigError([{ path: pathPrefix, message: `expected an object, got ${kindOf(raw)}` }]);
  }
  const r = kvTransferConfigSchema.safeParse(raw);
  if (!r.success) throw new KVTransferConfigError(zodProblems(r.error, pathPrefix));
  const v = r.data;
  const config: KVTransferConfig = {
    ...v,
    kv_connector: v.kv_connector,
    kv_role: v.kv_role,
    enable_kv_checksum: v.enable_kv_checksum ?? false,
    kv_checksum_fail_closed: v.kv_checksum_fail_closed ?? false,
    kv_load_failure_policy: v.kv_load_failure_policy ?? 'recompute',
    kv_connector_extra_config: { ...(v.kv_connector_extra_config ?? {}) },
  };
  return config;
}

/** The keys of {@link IGNORED_VLLM_KEYS} that `config` sets (the engine logs them at debug level). */
export function ignoredTransferConfigKeys(config: KVTransferConfig): string[] {
  return IGNORED_VLLM_KEYS.filter((k) => (config as unknown as Record<string, unknown>)[k] !== undefined);
}

/**
 * The transfer agent a MooncakeConnector worker moves bytes with: the embedded agent by default,
 * or the Mooncake Transfer Engine (through `@kvconnect/transfer`'s Mooncake agent and the native
 * addon) with `backend: 'mooncake'`.
 * @module
 */
import * as transfer from '@kvconnect/transfer';
import type { TransferAgent } from '@kvconnect/transfer';
import type { MooncakeBackend } from './config.js';

/** Raised when `backend: 'mooncake'` is asked for and the Mooncake Transfer Engine cannot be used. */
export class MooncakeUnavailableError extends Error {
  constructor(reason: string, options?: { cause?: unknown }) {
    super(`Mooncake Transfer Engine not available: ${reason}`, options);
    this.name = 'MooncakeUnavailableError';
  }
}

interface AgentClass {
  create(options: { name: string; host?: string }): Promise<TransferAgent>;
}

/** `@kvconnect/transfer`'s Mooncake agent class, when the package provides one. */
function mooncakeAgentClass(): AgentClass | null {
  const c = (transfer as Record<string, unknown>).MooncakeAgent;
  return typeof c === 'function' && typeof (c as unknown as AgentClass).create === 'function' ? (c as unknown as AgentClass) : null;
}

/**
 * Why `backend: 'mooncake'` cannot be used, or null when it may be (the engine itself may still
 * fail to start: {@link createAgent} reports that).
 */
export function mooncakeUnavailableReason(): string | null {
  return mooncakeAgentClass() ? null : '@kvconnect/transfer provides no Mooncake agent (MooncakeAgent) in this build';
}

/**
 * Creates a worker's agent.
 * @throws MooncakeUnavailableError for `mooncake` when the Mooncake agent is missing or fails to start.
 */
export async function createAgent(backend: MooncakeBackend, name: string, host: string): Promise<TransferAgent> {
  if (backend === 'embedded') return transfer.EmbeddedAgent.create({ name, host });
  const cls = mooncakeAgentClass();
  if (!cls) throw new MooncakeUnavailableError(mooncakeUnavailableReason()!);
  try {
    return await cls.create({ name, host });
  } catch (e) {
    throw new MooncakeUnavailableError(e instanceof Error ? e.message : String(e), { cause: e });
  }
}

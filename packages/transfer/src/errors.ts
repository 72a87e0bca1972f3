/**
 * Typed errors of the transfer package.
 * @module
 */
import type { TransferErrorKind } from './types.js';

/** A failed transfer-agent call or transfer; `kind` says why (see {@link TransferErrorKind}). */
export class TransferError extends Error {
  override readonly name: string = 'TransferError';
  constructor(
    readonly kind: TransferErrorKind,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/**
 * A peer broke the embedded agent's wire protocol (malformed frame, oversized field, bad
 * handshake, wrong secret). The connection it arrived on is closed; the agent goes on serving
 * everyone else. Emitted as the agent's `protocol-error` event. `kind` is always `invalid`.
 */
export class ProtocolError extends TransferError {
  override readonly name: string = 'ProtocolError';
  /** The peer's address (`host:port`) and, once it said hello, its agent name. */
  readonly peer: string;
  constructor(peer: string, message: string, options?: { cause?: unknown }) {
    super('invalid', `${peer}: ${message}`, options);
    this.peer = peer;
  }
}

/** True if `e` is a {@link TransferError} (of one of `kinds`, when given). */
export function isTransferError(e: unknown, ...kinds: TransferErrorKind[]): e is TransferError {
  return e instanceof TransferError && (kinds.length === 0 || kinds.includes(e.kind));
}

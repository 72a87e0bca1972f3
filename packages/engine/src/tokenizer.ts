/**
 * A byte-level tokenizer: token ids 0-255 are the bytes of the UTF-8 text, then BOS, EOS and PAD.
 * Real text goes in and out; every byte string round-trips.
 * @module
 */

/** Beginning of sequence (256). */
export const BOS_TOKEN_ID = 256;
/** End of sequence (257). */
export const EOS_TOKEN_ID = 257;
/** Padding (258). */
export const PAD_TOKEN_ID = 258;
/** Vocabulary size: 256 bytes + BOS + EOS + PAD. */
export const BYTE_VOCAB_SIZE = 259;

const encoder = new TextEncoder();

/** The byte-level tokenizer of the engine's models. */
export class ByteTokenizer {
  readonly vocabSize = BYTE_VOCAB_SIZE;
  readonly bosTokenId = BOS_TOKEN_ID;
  readonly eosTokenId = EOS_TOKEN_ID;
  readonly padTokenId = PAD_TOKEN_ID;

  /** Token ids of `text`: BOS (unless `addBos` is false), then its UTF-8 bytes. */
  encode(text: string, addBos = true): number[] {
    const bytes = encoder.encode(text);
    const ids = addBos ? [BOS_TOKEN_ID] : [];
    for (const b of bytes) ids.push(b);
    return ids;
  }

  /** Text of `ids`: special tokens are dropped, invalid UTF-8 becomes U+FFFD. */
  decode(ids: readonly number[]): string {
    const bytes: number[] = [];
    for (const id of ids) if (Number.isInteger(id) && id >= 0 && id < 256) bytes.push(id);
    return new TextDecoder('utf-8', { fatal: false }).decode(Uint8Array.from(bytes));
  }
}

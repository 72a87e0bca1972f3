/**
 * `payload`: the KV checksum payload (SPEC 7) is dropped, truncated, replaced by seeded garbage,
 * or re-encoded without one group. Where: the consumer's scheduler half on the
 * `kv_transfer_params` carrier (the params the request arrived with); a consumer worker on the
 * `connector` carrier (the payload in the transfer results); with `side: "producer"`, the
 * producer's scheduler half on the payload it hands to the connector carrier.
 * @module
 */
import { decodePayload, encodePayload, PayloadError } from '@kvconnect/checksum';
import { KV_CHECKSUMS_PARAM, type KVTransferParams } from '@kvconnect/core';
import type { FaultSpec } from '../../faults.js';
import { prng } from '../../locate.js';
import type { Fault, ResultHit } from '../fault.js';
import { requestKeySeed } from '../select.js';

/** The spec of a payload fault. */
export type PayloadSpec = Extract<FaultSpec, { kind: 'payload' }>;

/** `bytes` changed by payload fault `f` (number `i`) for `requestId`; null = dropped. A payload that does not decode is left as it is by `drop-group`. */
export function mutatePayload(f: PayloadSpec, i: number, requestId: string, bytes: Uint8Array): Uint8Array | null {
  switch (f.mode) {
    case 'drop':
      return null;
    case 'truncate':
      return bytes.slice(0, Math.min(bytes.length - 1, f.keepBytes ?? Math.floor(bytes.length / 2)));
    case 'garbage': {
      const r = prng(requestKeySeed(f, i, requestId));
      return Uint8Array.from(bytes, () => r() & 0xff);
    }
    case 'drop-group':
      try {
        const p = decodePayload(bytes);
        return encodePayload({ ...p, groups: p.groups.filter((g) => g.groupId !== f.groupId) });
      } catch (e) {
        if (e instanceof PayloadError) return bytes;
        throw e;
      }
  }
}

/** A `payload` fault. */
export function payloadFault(spec: PayloadSpec, index: number): Fault<PayloadSpec> {
  const fault: Fault<PayloadSpec> = {
    spec,
    index,
    needsSnapshot: false,
    consumerParams({ requestId, params, carrier }) {
      if (carrier !== 'kv_transfer_params') return null;
      const { [KV_CHECKSUMS_PARAM]: text, ...rest } = params;
      let next: KVTransferParams = rest;
      if (spec.mode !== 'drop' && typeof text === 'string') {
        const bytes = mutatePayload(spec, index, requestId, new Uint8Array(Buffer.from(text, 'base64')));
        if (bytes !== null) next = { ...rest, [KV_CHECKSUMS_PARAM]: Buffer.from(bytes).toString('base64') };
      } else if (spec.mode !== 'drop' && text !== undefined) next = { ...params };
      return { params: next, detail: `kv_transfer_params.kv_checksums ${spec.mode}` };
    },
  };
  if (spec.side === 'producer') {
    fault.producerPayload = (requestId, payload) => ({ payload: mutatePayload(spec, index, requestId, payload), detail: `producer payload ${spec.mode}` });
  } else {
    fault.consumerPayloads = ({ results, selects }) => {
      const hits: ResultHit[] = [];
      for (const [id, bytes] of [...results.kvChecksums]) {
        if (!selects(id)) continue;
        const out = mutatePayload(spec, index, id, bytes);
        if (out === null) results.kvChecksums.delete(id);
        else results.kvChecksums.set(id, out);
        hits.push({ requestId: id, detail: `connector-carried payload ${spec.mode} (${bytes.byteLength} bytes)` });
      }
      return hits;
    };
  }
  return fault;
}

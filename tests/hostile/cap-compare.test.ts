// Hostile probes of the capability and consumer-key comparisons (@kvconnect/core lease-capability.ts,
// @kvconnect/nixl-common consumer-binding.ts) called directly, as any in-process caller may.
import { describe, expect, it } from 'vitest';
import { ConsumerBindings, LeaseCapabilities, newConsumerKey, sameCapability } from '@kvconnect/nixl-common';

/** `s` with its first character replaced by one whose low byte is that character (U+0100 + code). */
const latin1Alias = (s: string) => String.fromCharCode(0x100 + s.charCodeAt(0)) + s.slice(1);

describe('hostile: capability comparison', () => {
  it('a string that is not the capability but has its latin1 bytes is not it', () => {
    const caps = new LeaseCapabilities();
    const a = caps.grant('A');
    expect(sameCapability(a, latin1Alias(a))).toBe(false);
    expect(caps.check('A', latin1Alias(a))).toBe('another lease capability');
    expect(caps.check('A', a)).toBeNull();
  });
  it("a captured capability of request A does not act on request B", () => {
    const caps = new LeaseCapabilities();
    const a = caps.grant('A');
    caps.grant('B');
    expect(caps.check('B', a)).toBe('another lease capability');
    expect(caps.check('B', a.toUpperCase())).toBe('another lease capability');
  });
  it('a consumer key of another length is refused, not thrown', () => {
    const b = new ConsumerBindings();
    const k = newConsumerKey();
    b.claim('r', k);
    for (const other of [k.slice(1), k + '0', '\u00e9' + k.slice(1), latin1Alias(k)]) {
      expect(() => b.check('r', other)).not.toThrow();
      expect(b.check('r', other)).toMatch(/another consumer key/);
    }
    expect(b.check('r', k)).toBeNull();
  });
});

/** `createAgent` by `backend`: a NIXL library that does not load is one line saying what to install and NIXL_PREFIX. */
import { describe, expect, it } from 'vitest';
import { AgentUnavailableError, createAgent } from '../src/index.js';

describe('createAgent', () => {
  it('backend nixl without a loadable libnixl_capi.so: AgentUnavailableError, one line naming NIXL and NIXL_PREFIX', async () => {
    const e = await createAgent({ backend: 'nixl', name: 'no-nixl', host: '127.0.0.1', nixlLibrary: '/nonexistent/libnixl_capi.so' }).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(AgentUnavailableError);
    const m = (e as Error).message;
    expect(m).not.toContain('\n');
    expect(m).toMatch(/^transfer engine nixl: libnixl_capi\.so cannot be loaded; install NIXL .* set NIXL_PREFIX to its install prefix .*\/nonexistent\/libnixl_capi\.so/);
  });
  it('an unknown backend', async () => {
    await expect(createAgent({ backend: 'ucx', name: 'x', host: '127.0.0.1' })).rejects.toThrow(/unknown transfer backend "ucx"/);
  });
});

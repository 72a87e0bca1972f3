/**
 * `parseCompletionRequest` (src/server/protocol.ts, on zod): the exact 400 messages clients see,
 * every problem listed with its field path, null optional fields read as absent, what is ignored.
 */
import { describe, expect, it } from 'vitest';
import { HttpError, parseCompletionRequest, type CompletionKind, type CompletionLimits } from '../src/server/protocol.js';

function error(body: unknown, kind: CompletionKind = 'completion', limits: CompletionLimits = {}): string {
  try {
    parseCompletionRequest(body, limits, kind);
  } catch (e) {
    expect(e).toBeInstanceOf(HttpError);
    return `${(e as HttpError).status} ${(e as Error).message}`;
  }
  throw new Error('no error');
}

describe('parseCompletionRequest messages', () => {
  it.each([
    [null, '400 request body must be a JSON object, got null'],
    [{}, '400 invalid completion request: prompt: required'],
    [{ prompt: '' }, '400 invalid completion request: prompt: must not be empty'],
    [{ prompt: [] }, '400 invalid completion request: prompt: must not be empty'],
    [{ prompt: ['a', 'b'] }, '400 invalid completion request: prompt: batched prompts are not supported (one string or one token id array)'],
    [{ prompt: [1, 999] }, '400 invalid completion request: prompt: token ids must be integers in [0, 259)'],
    [{ prompt: 5 }, '400 invalid completion request: prompt: expected a string or an array of token ids, got number'],
    [{ prompt: 'x', max_tokens: 0 }, '400 invalid completion request: max_tokens: must be in [1, 4096], got 0'],
    [{ prompt: 'x', max_tokens: 1.5 }, '400 invalid completion request: max_tokens: expected an integer, got 1.5'],
    [{ prompt: 'x', max_tokens: '5' }, '400 invalid completion request: max_tokens: expected an integer, got string'],
    [{ prompt: 'x', max_tokens: 'bad', max_completion_tokens: 3 }, null],
    [{ prompt: 'x', max_completion_tokens: 5000 }, '400 invalid completion request: max_completion_tokens: must be in [1, 4096], got 5000'],
    [{ prompt: 'x', temperature: 3 }, '400 invalid completion request: temperature: must be in [0, 2], got 3'],
    [{ prompt: 'x', temperature: 'hot' }, '400 invalid completion request: temperature: expected a number, got string'],
    [{ prompt: 'x', stop: 3 }, '400 invalid completion request: stop: expected a string or an array of strings, got number'],
    [{ prompt: 'x', stop: ['a', 'b', 'c', 'd', 'e'] }, '400 invalid completion request: stop: at most 4 sequences'],
    [{ prompt: 'x', stop: [''] }, '400 invalid completion request: stop: sequences must have 1 to 256 characters'],
    [{ prompt: 'x', stop_token_ids: 1 }, '400 invalid completion request: stop_token_ids: expected an array, got number'],
    [{ prompt: 'x', stop_token_ids: [300] }, '400 invalid completion request: stop_token_ids: token ids must be integers in [0, 259)'],
    [{ prompt: 'x', ignore_eos: 1 }, '400 invalid completion request: ignore_eos: expected a boolean, got number'],
    [{ prompt: 'x', stream_options: [] }, '400 invalid completion request: stream_options: expected an object, got array'],
    [{ prompt: 'x', stream_options: { include_usage: 'y' } }, '400 invalid completion request: stream_options.include_usage: expected a boolean, got string'],
    [{ prompt: 'x', kv_transfer_params: 'p' }, '400 invalid completion request: kv_transfer_params: expected an object, got string'],
    [{ prompt: 'x', request_id: 'a b' }, '400 invalid completion request: request_id: expected 1 to 128 characters of [A-Za-z0-9._:-]'],
    [{ prompt: 'x', model: 3 }, '400 invalid completion request: model: expected a string, got number'],
    [{ prompt: 'x', n: 2 }, '400 invalid completion request: n: 2 is not supported (only 1 choice per request)'],
    [{ prompt: 'x', n: 'two' }, '400 invalid completion request: n: expected a number, got string'],
    [{ prompt: 'x', top_p: 0.5, temperature: 0.7 }, '400 invalid completion request: top_p: 0.5 is not supported (the engine samples from the whole softmax: only 1, or any value with temperature 0)'],
    [{ prompt: 'x', top_p: 0.5 }, null],
    [{ prompt: 'x', frequency_penalty: 0.1 }, '400 invalid completion request: frequency_penalty: 0.1 is not supported (penalties are not implemented: only 0)'],
    [{ prompt: 'x', logprobs: 1 }, '400 invalid completion request: logprobs: not supported (logprobs are not implemented: only null or false)'],
    [{ prompt: 'x', echo: true }, '400 invalid completion request: echo: not supported (only false)'],
    [{ prompt: 'x', logit_bias: { 1: 2 } }, '400 invalid completion request: logit_bias: not supported (only {})'],
    [
      { prompt: '', max_tokens: 0, temperature: -1, ignore_eos: 'no' },
      '400 invalid completion request: prompt: must not be empty; max_tokens: must be in [1, 4096], got 0; temperature: must be in [0, 2], got -1; ignore_eos: expected a boolean, got string',
    ],
  ])('%j -> %s', (body, want) => {
    if (want === null) expect(() => parseCompletionRequest(body)).not.toThrow();
    else expect(error(body)).toBe(want);
  });

  it('chat messages', () => {
    expect(error({ messages: [] }, 'chat')).toBe('400 invalid chat completion request: messages: expected a non-empty array of messages, got array');
    expect(error({}, 'chat')).toBe('400 invalid chat completion request: messages: expected a non-empty array of messages, got undefined');
    expect(error({ messages: [1] }, 'chat')).toBe('400 invalid chat completion request: messages[0]: expected an object, got number');
    expect(error({ messages: [{ role: 'wizard', content: 'x' }] }, 'chat')).toBe('400 invalid chat completion request: messages[0].role: expected one of system, developer, user, assistant, tool');
    expect(error({ messages: [{ role: 'user', content: 5 }] }, 'chat')).toBe('400 invalid chat completion request: messages[0].content: expected a string or an array of text parts');
    expect(error({ messages: [{ role: 'user', content: null }] }, 'chat')).toBe('400 invalid chat completion request: messages[0].content: expected a string or an array of text parts');
    expect(error({ messages: [{ role: 'user', content: [{ type: 'image_url' }] }] }, 'chat')).toBe("400 invalid chat completion request: messages[0].content: only text parts ({ type: 'text', text }) are supported");
    expect(error({ messages: [{ role: 'user', content: 'x' }], tools: [{}] }, 'chat')).toBe("400 invalid chat completion request: tools: not supported (tool calls are not implemented: only [])");
    expect(error({ messages: [{ role: 'user', content: 'x'.repeat(20) }] }, 'chat', { maxPromptLength: 10 })).toBe('400 invalid chat completion request: messages: the rendered prompt is longer than 10 characters');
    const ok = parseCompletionRequest({ messages: [{ role: 'system', content: 'be brief', name: 'x' }, { role: 'assistant', content: null }, { role: 'user', content: [{ type: 'text', text: 'a' }, { type: 'text', text: 'b' }] }], user: 'u1' }, {}, 'chat');
    expect(ok.prompt).toBe('<|system|>\nbe brief\n<|assistant|>\n\n<|user|>\nab\n<|assistant|>\n');
    expect(ok.ignored).toEqual(['user', 'messages[0].name']);
  });

  it('limits, the proxy-only refusals, the served model (404), and what is ignored', () => {
    expect(error({ prompt: 'x', kv_transfer_params: {} }, 'completion', { allowKvTransferParams: false })).toBe('400 invalid completion request: kv_transfer_params: not accepted here');
    expect(error({ prompt: 'x', request_id: 'r' }, 'completion', { allowRequestId: false })).toBe('400 invalid completion request: request_id: not accepted here');
    expect(error({ prompt: 'x', max_tokens: 9 }, 'completion', { maxTokens: 8 })).toBe('400 invalid completion request: max_tokens: must be in [1, 8], got 9');
    expect(error({ prompt: [5, 6] }, 'completion', { vocabSize: 6 })).toBe('400 invalid completion request: prompt: token ids must be integers in [0, 6)');
    expect(error({ prompt: 'abc' }, 'completion', { maxPromptLength: 2 })).toBe('400 invalid completion request: prompt: longer than 2 characters');
    expect(error({ prompt: 'x', model: 'm2' }, 'completion', { servedModels: ['m1'] })).toBe('404 The model `m2` does not exist (served: m1).');
    const r = parseCompletionRequest({ prompt: [1, 2], model: 'm1', user: 'u', stream: true, stream_options: { include_usage: true, continuous_usage_stats: true }, max_completion_tokens: 7, seed: -3, stop: 'END', stop_token_ids: [3], kv_transfer_params: { do_remote_decode: true }, request_id: 'r-1' }, { servedModels: ['m1'] });
    expect(r).toEqual({
      kind: 'completion',
      prompt: [1, 2],
      model: 'm1',
      maxTokens: 7,
      temperature: 0,
      seed: -3,
      stop: ['END'],
      stopTokenIds: [3],
      ignoreEos: false,
      stream: true,
      includeUsage: true,
      kvTransferParams: { do_remote_decode: true },
      requestId: 'r-1',
      ignored: ['user', 'stream_options.continuous_usage_stats'],
    });
  });
});

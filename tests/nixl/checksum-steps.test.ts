/**
 * KV checksums add no engine step and no round trip to a NIXL pull request (issue 16 section 3:
 * the end-to-end checksum overhead must be the sums' own cost, never a wait). Real engines in one
 * process, NixlConnector over embedded agents, host checksum backend; the same request with
 * checksums off and on (consumer fail-closed, policy recompute, as `bench/e2e.mjs` runs them):
 *
 * - consumer: the load's verdict is decided in the step right after the step whose output reported
 *   the load done (`finishedRecving`, with the consumer's sums in the same output), and the
 *   request's first token is scheduled in that same step;
 * - producer: the request finishes (its `kv_transfer_params`, with `kv_checksums` when on) in the
 *   step that computed its last prompt token;
 * - the producer's side channel serves the same requests and frames either way.
 *
 * Counted in engine steps and side-channel frames, not time.
 */
import { describe, expect, it } from 'vitest';
import type { LoadOutcomeEvent } from '@kvconnect/core';
import type { Engine } from '@kvconnect/engine';
import type { NixlScheduler } from '@kvconnect/nixl-common';
import { makeNixlPD } from './utils.js';

const PROMPT = 'How many engine steps does a verified load take? The same as an unverified one, we hope.';
const S = { maxTokens: 4, ignoreEos: true };

/** Per step of an engine: scheduled requests, loads reported done, finished requests, load outcomes decided in its schedule(). */
interface StepRecord {
  step: number;
  scheduled: string[];
  recvDone: string[];
  finished: string[];
  outcomes: string[];
}

/** Records every step of `engine` (wraps its scheduler's schedule / updateFromOutput). */
function traceSteps(engine: Engine, outcomes: LoadOutcomeEvent[]): StepRecord[] {
  const steps: StepRecord[] = [];
  const sched = engine.scheduler;
  const schedule = sched.schedule.bind(sched);
  const update = sched.updateFromOutput.bind(sched);
  sched.schedule = () => {
    const before = outcomes.length;
    const plan = schedule();
    steps.push({ step: steps.length + 1, scheduled: [...plan.numScheduledTokens.keys()], recvDone: [], finished: [], outcomes: outcomes.slice(before).map((e) => e.requestId) });
    return plan;
  };
  sched.updateFromOutput = (plan, sampled, outputs) => {
    const finished = update(plan, sampled, outputs);
    const cur = steps[steps.length - 1];
    for (const o of outputs) cur.recvDone.push(...o.finishedRecving);
    cur.finished.push(...finished.map((r) => r.requestId));
    return finished;
  };
  return steps;
}

const first = (steps: StepRecord[], f: (s: StepRecord) => boolean): number => steps.find(f)?.step ?? -1;

/** What the producer's side channel received (through its connector scheduler half, private to the engine). */
function sideChannel(e: Engine) {
  const ch = (e as unknown as { connector: NixlScheduler }).connector.channel!;
  return { frames: ch.sideChannelStats()!.framesIn, served: { ...ch.served } };
}

describe('KV checksums add no engine step and no round trip (NixlConnector pull, host sums)', () => {
  it('the same steps per request and the same side-channel traffic with checksums off and on', async () => {
    const seen: Record<'off' | 'on', unknown> = { off: null, on: null };
    for (const mode of ['off', 'on'] as const) {
      // heartbeat_ms 0: no timer-driven LEASE frames, so the side channel counts are the load's own.
      const pd = await makeNixlPD({ mode: 'pull', model: 'dense-gqa', checksums: mode === 'on', failClosed: true, policy: 'recompute', consumerExtra: { heartbeat_ms: 0 } });
      try {
        const outcomes: LoadOutcomeEvent[] = [];
        pd.obs.events.on('load-outcome', (e) => outcomes.push(e));
        const pSteps = traceSteps(pd.producer, []);
        const dSteps = traceSteps(pd.consumer, outcomes);
        const r = await pd.proxy.generate(PROMPT, S);
        expect(r.error).toBeUndefined();
        expect(r.tokenIds).toHaveLength(S.maxTokens);
        expect(outcomes).toHaveLength(1);
        expect(outcomes[0]).toMatchObject({ action: 'use', verdict: mode === 'on' ? { verdict: 'verified' } : null });
        expect(typeof r.prefill.kvTransferParams?.kv_checksums).toBe(mode === 'on' ? 'string' : 'undefined');

        const d = r.requestId;
        const recv = first(dSteps, (s) => s.recvDone.includes(d));
        const verdict = first(dSteps, (s) => s.outcomes.includes(d));
        const run = first(dSteps, (s) => s.scheduled.includes(d));
        const done = first(dSteps, (s) => s.finished.includes(d));
        expect(recv).toBeGreaterThan(0);
        // The sums rode in the output that reported the load: decided in the very next schedule().
        expect(verdict).toBe(recv + 1);
        // ... which also schedules the request's last prompt token (its first token).
        expect(run).toBe(verdict);
        expect(done - run).toBe(S.maxTokens - 1);

        const p = r.prefill.requestId;
        const pRun = first(pSteps, (s) => s.scheduled.includes(p));
        const pDone = first(pSteps, (s) => s.finished.includes(p));
        expect(pRun).toBeGreaterThan(0);
        // The producer's sums and payload are made in the step that finished the prompt.
        expect(pDone).toBe(pRun);
        seen[mode] = { consumer: { verdictAfterRecv: verdict - recv, runAfterVerdict: run - verdict, decodeSteps: done - run }, producer: { finishAfterPrompt: pDone - pRun }, sideChannel: sideChannel(pd.producer) };
      } finally {
        await pd.shutdown();
      }
    }
    expect(seen.on).toEqual(seen.off);
  });
});

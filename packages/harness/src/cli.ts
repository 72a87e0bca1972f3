/**
 * The `kvconnect` command line (commander): `kvconnect run FILE...` runs scenario files and exits
 * non-zero when an expectation fails; `kvconnect demo` runs the P/D demo and writes its report.
 * @module
 */
import { Command, InvalidArgumentError } from 'commander';
import { DEMO_CONNECTOR_ALIASES, DEMO_CONNECTORS, readPrompts, runDemo, type DemoOptions } from './demo.js';
import { MODEL_PRESET_NAMES } from './models.js';
import { runFiles } from './run-files.js';
import { TRANSFER_ENGINES } from './transfer.js';

function rate(v: string): number {
  const x = Number(v);
  if (!(x >= 0 && x <= 1)) throw new InvalidArgumentError('expected a share of loads in [0, 1]');
  return x;
}

function policyArg(v: string): 'fail' | 'recompute' {
  if (v !== 'fail' && v !== 'recompute') throw new InvalidArgumentError('expected recompute or fail');
  return v;
}

function sampleRateArg(v: string): number {
  const r = Number(v);
  if (!(r > 0 && r <= 1)) throw new InvalidArgumentError('expected a number in (0, 1]');
  return r;
}

function posInt(v: string): number {
  const x = Number(v);
  if (!Number.isSafeInteger(x) || x < 1) throw new InvalidArgumentError('expected a positive integer');
  return x;
}

/** The CLI program (not parsed yet). `print` receives every output line. */
export function buildProgram(print: (line: string) => void = (l) => console.log(l)): Command {
  const program = new Command('kvconnect').description('kvconnect harness: scenarios with expectations, fault injection, the P/D demo').showHelpAfterError();
  program
    .command('run')
    .description('run scenario files; one line per expectation, then "N passed, N failed"; exit code 1 on any failure')
    .argument('<files...>', 'scenario JSON files')
    .action(async (files: string[]) => {
      const r = await runFiles(files, print);
      process.exitCode = r.failed > 0 ? 1 : 0;
    });
  program
    .command('demo')
    .description(
      'send real prompts through P/D with KV checksums (fail-closed, recompute), inject faults into a share of loads, compare every output with a single instance, and write a Markdown report. ' +
        'By default a proxy, a producer engine (TP2) and a consumer engine (TP1) run as separate processes on 127.0.0.1, the KV moving through the embedded transfer agent or, with --transfer, NIXL or the Mooncake Transfer Engine (run `npm run build` first: the processes run dist/).',
    )
    .option('--prompts <file>', 'prompts, one per line (default examples/prompts/prompts.txt)')
    .option(
      '--faults <rate>',
      'share of loads to inject a fault into (seeded). Multi-process connectors inject consumer-side faults only (bit flip, misplaced block, wrong layout, checksum payload truncated / dropped), by the FaultInjectingConnector in the consumer process; producer-side faults (stale blocks, producer payload) need the producer in this process: use --connector in-process. Only faults that apply to the model are planned (no wrong-layout for MLA)',
      rate,
      0.25,
    )
    .option('--connector <name>', 'pull: NixlConnector, sequential proxy | push: NixlPushConnector, sequential proxy | mooncake: MooncakeConnector, concurrent proxy (each: proxy, producer, consumer as separate processes) | in-process: one process, the in-process connector (inprocess: deprecated spelling)', 'pull')
    .option('--out <dir>', 'report folder (default ./kvconnect-demo-report-<time>)')
    .option('--model <preset>', `model preset: ${MODEL_PRESET_NAMES.join(' | ')}`, 'dense-gqa')
    .option('--max-tokens <n>', 'tokens to generate per prompt', posInt, 16)
    .option('--seed <n>', 'seed of the fault choice', posInt, 1)
    .option('--concurrency <n>', 'requests in flight at once (each fault is planned for a prompt by its index, carried with the request, so the same prompts get the same faults at any concurrency)', posInt, 4)
    .option('--no-checksums', 'turn KV checksums off (faults then go undetected)')
    .option('--fail-open', 'use loads that do not verify (default: fail-closed)')
    .option('--policy <policy>', 'what a fail-closed consumer does with a load that does not verify: recompute | fail', policyArg, 'recompute')
    .option('--sample-rate <r>', 'multi-process: kv_checksum_sample_rate of both engines, in (0, 1] (docs/checksum-extensions.md; default 1: every block). Below 1, a fault that falls outside the sample is not seen: its load is used and the demo\'s fault checks FAIL by design (--faults 0 shows the sampling alone)', sampleRateArg)
    .option('--transfer <engine>', `transfer engine the connectors move KV with: ${TRANSFER_ENGINES.join(' | ')} (default embedded: the embedded agent over TCP; nixl: NIXL, for pull and push, found through NIXL_PREFIX; mooncake: the Mooncake Transfer Engine, for --connector mooncake, found through MOONCAKE_PREFIX)`, 'embedded')
    .option('--workers <kind>', 'multi-process: processes (one worker process per TP rank) | inprocess, for both engines (default: processes)')
    .option('--verbose', 'copy the engine and proxy processes\' stderr to this stderr')
    .option('--no-progress', 'no progress bar')
    .action(
      async (o: {
        prompts?: string;
        faults: number;
        connector: string;
        out?: string;
        model: string;
        maxTokens: number;
        seed: number;
        concurrency: number;
        checksums: boolean;
        failOpen?: boolean;
        policy: 'fail' | 'recompute';
        sampleRate?: number;
        verbose?: boolean;
        workers?: string;
        transfer: string;
        progress: boolean;
      }) => {
        if (!(o.connector in DEMO_CONNECTORS) && !(o.connector in DEMO_CONNECTOR_ALIASES)) throw new InvalidArgumentError(`--connector must be one of ${Object.keys(DEMO_CONNECTORS).join(', ')}`);
        const r = await runDemo({
          prompts: o.prompts ? readPrompts(o.prompts) : undefined,
          faultRate: o.faults,
          connector: o.connector,
          out: o.out,
          model: o.model,
          maxTokens: o.maxTokens,
          seed: o.seed,
          concurrency: o.concurrency,
          checksums: o.checksums,
          failClosed: !o.failOpen,
          policy: o.policy,
          sampleRate: o.sampleRate,
          echoStderr: o.verbose === true,
          workers: o.workers as DemoOptions['workers'],
          transfer: o.transfer,
          progress: o.progress && Boolean(process.stderr.isTTY),
          print,
        });
        const bad = r.result.expectations.filter((x) => !x.ok);
        for (const x of bad) print(x.line);
        process.exitCode = bad.length > 0 ? 1 : 0;
      },
    );
  return program;
}

/** Runs the CLI with `argv` (default `process.argv`). */
export async function main(argv: readonly string[] = process.argv): Promise<void> {
  try {
    await buildProgram().parseAsync(argv as string[]);
  } catch (e) {
    console.error(`kvconnect: ${e instanceof Error ? e.message : String(e)}`);
    process.exitCode = 2;
  }
}

/**
 * Prometheus text checks for tests: `promtool check metrics` (the Prometheus project's linter)
 * when it is installed, and a strict reader of the text format 0.0.4
 * (https://prometheus.io/docs/instrumenting/exposition_formats/) that every test runs.
 */
import { spawnSync } from 'node:child_process';

/** promtool's path, or null (tests that need it skip with this reason). */
export const PROMTOOL: string | null = (() => {
  const r = spawnSync('sh', ['-c', 'command -v promtool'], { encoding: 'utf8' });
  return r.status === 0 && r.stdout.trim() ? r.stdout.trim() : null;
})();

/** `promtool check metrics` over `text`: its exit code and its complaints (lint problems). */
export function promtoolCheck(text: string): { code: number | null; output: string } {
  const r = spawnSync(PROMTOOL!, ['check', 'metrics'], { input: text, encoding: 'utf8' });
  return { code: r.status, output: `${r.stdout}${r.stderr}`.trim() };
}

/** One sample of a text exposition. */
export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** The samples and `# TYPE`s of a text exposition; throws on a line the format does not allow, or a sample without a TYPE. */
export function readExposition(text: string): { samples: Sample[]; types: Map<string, string> } {
  const types = new Map<string, string>();
  const samples: Sample[] = [];
  const NAME = '[a-zA-Z_:][a-zA-Z0-9_:]*';
  const sampleRe = new RegExp(`^(${NAME})(?:\\{(.*)\\})? (\\S+)$`);
  for (const line of text.split('\n')) {
    if (line === '') continue;
    const t = new RegExp(`^# TYPE (${NAME}) (counter|gauge|histogram|summary|untyped)$`).exec(line);
    if (t) {
      types.set(t[1], t[2]);
      continue;
    }
    if (new RegExp(`^# HELP ${NAME} .*$`).test(line)) continue;
    const m = sampleRe.exec(line);
    if (!m) throw new Error(`not a Prometheus text line: ${JSON.stringify(line)}`);
    const labels: Record<string, string> = {};
    if (m[2]) {
      const rest = m[2].replace(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\\]|\\\\.)*)",?/g, (_, k: string, v: string) => {
        labels[k] = v;
        return '';
      });
      if (rest !== '') throw new Error(`bad labels in ${JSON.stringify(line)}`);
    }
    const family = m[1].replace(/_(bucket|sum|count)$/, '');
    if (!types.has(m[1]) && !types.has(family)) throw new Error(`sample without a TYPE: ${JSON.stringify(line)}`);
    const value = Number(m[3]);
    if (Number.isNaN(value) && m[3] !== 'NaN') throw new Error(`bad value in ${JSON.stringify(line)}`);
    samples.push({ name: m[1], labels, value });
  }
  return { samples, types };
}

/** The sum of the samples named `name` whose labels include `labels`. */
export function sampleValue(text: string, name: string, labels: Record<string, string> = {}): number {
  return readExposition(text)
    .samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))
    .reduce((a, s) => a + s.value, 0);
}

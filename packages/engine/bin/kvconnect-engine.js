#!/usr/bin/env node
// kvconnect-engine: one engine behind an OpenAI-style HTTP API (see src/server/main.ts, --help).
// Runs the compiled dist/ of @kvconnect/engine (npm run build).
import('../dist/server/main.js').then(
  (m) => m.runEngineMain(process.argv.slice(2)),
  (e) => {
    process.stderr.write(`kvconnect-engine: cannot load ../dist/server/main.js (build @kvconnect/engine first: npm run build): ${e && e.message ? e.message : e}\n`);
    process.exit(1);
  },
);

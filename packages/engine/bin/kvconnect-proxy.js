#!/usr/bin/env node
// kvconnect-proxy: the P/D proxy over engine servers (see src/server/main.ts, --help).
// Runs the compiled dist/ of @kvconnect/engine (npm run build).
import('../dist/server/main.js').then(
  (m) => m.runProxyMain(process.argv.slice(2)),
  (e) => {
    process.stderr.write(`kvconnect-proxy: cannot load ../dist/server/main.js (build @kvconnect/engine first: npm run build): ${e && e.message ? e.message : e}\n`);
    process.exit(1);
  },
);

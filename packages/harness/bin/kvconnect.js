#!/usr/bin/env node
// The kvconnect CLI (built from packages/harness/src/cli.ts; run `npm run build` first).
import { main } from '../dist/cli.js';

await main();

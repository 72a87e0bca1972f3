#!/usr/bin/env bash
# On the GPU machine: unpacks .carry/ (made by scripts/device-carry.sh) so that `.carry/node` runs
# the repository's built Node code: node_modules at the root points at .carry/node_modules.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .carry/node ] || xz -dk .carry/node.xz
chmod +x .carry/node
[ -e node_modules ] || ln -s .carry/node_modules node_modules
# Workspace packages resolve to their copies under .carry/node_modules/@kvconnect.
.carry/node --version
# Scripts that import packages/<pkg>/dist by path (bench/cuda/*.mjs) find the carried builds.
for d in .carry/node_modules/@kvconnect/*/dist; do
  p=$(basename "$(dirname "$d")")
  [ -d "packages/$p" ] && [ ! -e "packages/$p/dist" ] && ln -s "../../$d" "packages/$p/dist"
done
true

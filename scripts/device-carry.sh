#!/usr/bin/env bash
# Packs what Node code needs on a machine without Node (the GPU machine) into .carry/ (ignored):
#   .carry/node.xz          this machine's node binary, stripped and xz-compressed
#   .carry/node_modules/    the production dependencies, workspace packages copied as their
#                           package.json + dist/ (the native addon: index.cjs + build/Release)
# There:  bash scripts/device-unpack.sh   then   .carry/node bench/checksum.mjs
# Run `npm ci && npm run build` (and the CUDA build of the addon, if wanted) first.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .carry && mkdir -p .carry/node_modules
strip -o .carry/node "$(command -v node)"
xz -9 -T0 .carry/node
while read -r p; do
  case "$p" in
    "$PWD"|"") continue ;;
  esac
  rel=${p#"$PWD"/}
  dst=.carry/$rel
  mkdir -p "$(dirname "$dst")"
  if [ -L "$rel" ]; then  # a workspace package: its manifest and build output only
    src=$(readlink -f "$rel")
    mkdir -p "$dst"
    cp "$src/package.json" "$dst/"
    [ -d "$src/dist" ] && cp -r "$src/dist" "$dst/"
    [ -d "$src/bin" ] && cp -r "$src/bin" "$dst/"
    [ -f "$src/index.cjs" ] && cp "$src/index.cjs" "$src/index.d.ts" "$dst/"
    if [ -d "$src/build/Release" ]; then mkdir -p "$dst/build/Release" && cp "$src"/build/Release/*.node "$dst/build/Release/" && { cp "$src"/build/Release/*.so "$dst/build/Release/" 2>/dev/null || true; }; fi
    if [ -d "$src/build/test" ]; then mkdir -p "$dst/build/test" && cp "$src"/build/test/*.so "$dst/build/test/" 2>/dev/null || true; fi
  else
    cp -r "$rel" "$dst"
  fi
done < <(npm ls --omit=dev --all --parseable 2>/dev/null | sort -u)
# Heavy parts no run needs: build toolchains and sources of dependencies (cmake-ts stays: zeromq
# loads its prebuilt addon through cmake-ts/build/loader).
rm -rf .carry/node_modules/{cmake-js,node-api-headers,node-addon-api,tar} .carry/node_modules/zeromq/{src,script,vendor} 2>/dev/null || true
# cmake-ts: only the loader (and its manifest) is needed at run time; no source maps or type
# declarations anywhere.
if [ -d .carry/node_modules/cmake-ts/build ]; then
  find .carry/node_modules/cmake-ts/build -type f ! -name 'loader.js' -delete
  find .carry/node_modules/cmake-ts -mindepth 1 -maxdepth 1 ! -name build ! -name package.json -exec rm -rf {} +
fi
find .carry/node_modules \( -name '*.map' -o -name '*.d.ts' -o -name '*.d.cts' -o -name '*.d.mts' \) -type f -delete
rm -rf .carry/node_modules/zod/src  # zod's TypeScript sources (it runs from its built files)
# zeromq ships prebuilt addons for every platform: keep this one's.
plat="$(node -p 'process.platform + "/" + process.arch')"
if [ -d .carry/node_modules/zeromq/build ]; then
  find .carry/node_modules/zeromq/build -mindepth 2 -maxdepth 2 -type d | grep -v "/build/$plat\$" | xargs rm -rf
  find .carry/node_modules/zeromq/build -type d -name 'musl-*' | xargs rm -rf
fi
# bench/openai-stream.mjs drives the engine with the official client, a dev dependency: its
# runtime files only (no TypeScript sources, which are most of its size).
if [ -d node_modules/openai ]; then
  cp -r node_modules/openai .carry/node_modules/
  find .carry/node_modules/openai -type f ! -name '*.js' ! -name '*.mjs' ! -name package.json -delete
fi
du -sh .carry .carry/node.xz .carry/node_modules

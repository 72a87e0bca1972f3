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
# Optional (KVC_CARRY_UCX=0 skips it): UCX's `ucx_perftest` (Debian ucx-utils) for the UCX rows of
# bench/transfer.mjs, which finds it at .carry/ucx/bin and sets LD_LIBRARY_PATH / UCX_MODULE_DIR:
#   .carry/ucx/bin/ucx_perftest, .carry/ucx/lib/  the shared libraries it needs (ldd) except glibc's
#   .carry/ucx/lib/ucx/  the transport modules whose own libraries are all carried (cma; not ib and
#                        rdmacm, which need the RDMA stack and play no part in UCX_TLS=tcp,self)
ucx=$(command -v ucx_perftest || true)
if [ "${KVC_CARRY_UCX:-1}" != 0 ] && [ -n "$ucx" ]; then
  mkdir -p .carry/ucx/bin .carry/ucx/lib/ucx
  cp "$ucx" .carry/ucx/bin/
  glibc='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt)[.-]'
  carry_libs() {  # copies the non-glibc libraries of $1; fails when one is not found
    ldd "$1" | awk '/=>/ { print $1, $3 }' | while read -r name path; do
      [[ $name =~ $glibc ]] && continue
      [ -f "$path" ] || return 1
      [ -e ".carry/ucx/lib/$name" ] || cp -L "$path" ".carry/ucx/lib/$name"
    done
  }
  if ! carry_libs "$ucx"; then
    echo "ucx_perftest not carried: a library of it was not found (ldd $ucx)"
    rm -rf .carry/ucx
  else
  moddir=$(dirname "$(ldd "$ucx" | awk '/libucs\.so/ { print $3 }')")/ucx
  for m in "$moddir"/*.so.0; do
    [ -e "$m" ] || continue
    if ldd "$m" | awk '/=>/ { print $1 }' | grep -Ev "$glibc" | while read -r name; do [ -e ".carry/ucx/lib/$name" ] || exit 1; done; then
      cp -L "$m" .carry/ucx/lib/ucx/
    fi
  done
  echo "ucx_perftest carried: $(du -sh .carry/ucx | cut -f1) in .carry/ucx ($(find .carry/ucx -type f | wc -l) files)"
  fi
else
  echo "ucx_perftest not carried (${ucx:-not installed here}; KVC_CARRY_UCX=${KVC_CARRY_UCX:-1})"
fi
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

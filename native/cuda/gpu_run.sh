#!/usr/bin/env bash
# Runs the CUDA checksum test and benchmark on a GPU machine; no Node needed (the Node test of the
# cuda backend runs too when CARRY holds a node binary, see bench/cuda/README.md).
#
# Usage: native/cuda/gpu_run.sh CARRY
#   CARRY holds kvc_test_cuda, kvc_bench_cuda (built here with nvcc for sm_90, static cudart) and
#   checksum-v1.json; optionally node.xz and node/ (the compiled cuda.test.ts, a vitest stand-in
#   and the CUDA-built addon). Logs go to $OUT (or /tmp/kvc-out).
# If the carried executables do not run there, they are rebuilt from this tree with that machine's
# nvcc and cmake.
set -u
C=${1:-.carry}
O=${OUT:-/tmp/kvc-out}
mkdir -p "$O"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv
chmod +x "$C/kvc_test_cuda" "$C/kvc_bench_cuda" 2>/dev/null
if ! "$C/kvc_test_cuda" "$C/checksum-v1.json" --emulate --quick > "$O/emulate.log" 2>&1; then
  echo "carried executables do not run here ($(tail -1 "$O/emulate.log")): rebuilding with this machine's nvcc"
  cmake -S native -B /tmp/kvc-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVC_NODE_ADDON=OFF -DKVC_WITH_CUDA=ON \
    -DKVC_TESTS=ON -DKVC_CUDART_STATIC=ON -DCMAKE_CUDA_ARCHITECTURES=90 > "$O/build.log" 2>&1 &&
    cmake --build /tmp/kvc-build >> "$O/build.log" 2>&1 || { tail -20 "$O/build.log"; exit 1; }
  cp /tmp/kvc-build/cuda/kvc_test_cuda /tmp/kvc-build/cuda/kvc_bench_cuda "$C/"
fi
echo "== kvc_test_cuda (full log: test.log)"
timeout 300 "$C/kvc_test_cuda" "$C/checksum-v1.json" > "$O/test.log" 2>&1
echo "rc=$?"
head -1 "$O/test.log"
grep -v '^ok' "$O/test.log" | tail -25
echo "== kvc_bench_cuda"
timeout 300 "$C/kvc_bench_cuda" 2>&1 | tee "$O/bench.log"
echo "== compute-sanitizer --tool memcheck kvc_test_cuda --quick"
timeout 240 compute-sanitizer --tool memcheck "$C/kvc_test_cuda" "$C/checksum-v1.json" --quick > "$O/memcheck.log" 2>&1
echo "rc=$?"
grep -E "ERROR SUMMARY|passed, " "$O/memcheck.log" | tail -3
if [ -f "$C/node.xz" ]; then
  echo "== node: packages/checksum/test/cuda.test.ts"
  xz -dc "$C/node.xz" > /tmp/node && chmod +x /tmp/node && (cd "$C/node" && timeout 120 /tmp/node run.mjs) 2>&1 | tee "$O/node.log"
fi

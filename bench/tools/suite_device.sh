#!/usr/bin/env bash
# One device call for a session's first look at a GPU: build, every GPU test, the sanitizers, the full benchmark grid
# with FlashInfer in the same run (bench/run_device.sh's default steps), then fp8's opt-in lean kernel
# (KVPACK_LEAN_FP8=1) under the random-shape test with what is left of LIMIT_S (default 560). Carry [".whl"].
#   LIMIT_S=560 bash bench/tools/suite_device.sh
set -u
OUT=${OUT:-/tmp/kvpack_out}
t0=$(date +%s)
cd "$(dirname "$0")/../.."
bash bench/run_device.sh build,test,sanitize,bench,flashinfer 2>&1 | grep -vE "^ptxas" | tail -150
left=$(( ${LIMIT_S:-560} - ($(date +%s) - t0) ))
if [ "$left" -gt 40 ]; then
  KVPACK_LEAN_FP8=1 timeout $((left - 15)) ./build-device/kvpack_gpu_tests --gtest_filter='DecodeGpu.RandomShapes*' \
    > "$OUT/tests_lean_fp8.log" 2>&1
  echo "[$(($(date +%s) - t0)) s] lean fp8 RandomShapes rc=$?"
  grep -E "^\[  (FAILED|PASSED)|^\[       OK|Failure" "$OUT/tests_lean_fp8.log" | head
fi
rm -f "$OUT/build.log"

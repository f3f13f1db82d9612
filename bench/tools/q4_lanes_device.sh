#!/usr/bin/env bash
# One device call on branches q4-lane / q3-lane (bench/NOTES.md v33, v34): build; the write-path / dequantiser GPU
# tests (the lane layouts byte-exact against the CPU reference); the product's bench for fp8 (regular kernel, the
# default) and fp8 (lean, KVPACK_LEAN_FP8=1) + the lane formats (LEAN_FORMATS, default fp8,q4,q3) on the same GPU; then
# the DecodeGpu tests with whatever time is left (LIMIT_S, default 560).
# SKIP_REGULAR=1 skips the regular fp8 run; SHAPES / BATCHES / CONTEXTS set the grid, BENCH_EXTRA adds bench options;
# FIRST_TESTS / LAST_TESTS gtest filters.
source "$(dirname "$0")/device_env.sh" /tmp/q4l_out
build_device kvpack_cli kvpack_gpu_tests
T=./build-device/kvpack_gpu_tests
$T --gtest_filter="${FIRST_TESTS:-PagedWriteGpu.*:PagedDequantGpu.*:DecodeGpu.EmptySequence*:DecodeGpu.GraphCapture*}" > "$OUT/tests_first.log" 2>&1
stamp "first tests rc=$?"; grep -E "^\[  (FAILED|PASSED)|^\[       OK|Failure|rror" "$OUT/tests_first.log" | head -30
K=./build-device/kvpack
GRID="--shapes ${SHAPES:-32/8/128,8/1/128} --batch ${BATCHES:-1,8,64} --context ${CONTEXTS:-32k,128k} ${BENCH_EXTRA:-}"
: > "$OUT/bench.log"
if [ -z "${SKIP_REGULAR:-}" ]; then
  $K bench --formats fp8 $GRID --json "$OUT/bench_fp8_regular.json" 2>&1 | grep -vE " write" > "$OUT/bench.log"
  stamp "bench regular fp8 rc=$?"
fi
KVPACK_LEAN_FP8=1 $K bench --formats ${LEAN_FORMATS:-fp8,q4,q3} $GRID --json "$OUT/bench_lean.json" 2>&1 | grep -vE " write" >> "$OUT/bench.log"
stamp "bench lean rc=$?"; cat "$OUT/bench.log"
left=$(( ${LIMIT_S:-560} - ($(date +%s) - t0) ))
stamp "DecodeGpu tests, $left s left"
timeout $((left > 20 ? left - 10 : 10)) $T --gtest_filter="${LAST_TESTS:-DecodeGpu.BitwiseIdentical*:DecodeGpu.RandomShapes*:DecodeGpu.LongContext*}" > "$OUT/tests_decode.log" 2>&1
stamp "decode tests rc=$?"; grep -E "^\[  (FAILED|PASSED)|^\[       OK|^\[ RUN|Failure|rror" "$OUT/tests_decode.log" | head -40

#!/usr/bin/env bash
# One device call (bench/NOTES.md v36): the lean kernel's bench, ncu durations and tests
# (bench/tools/lean_tune_device.sh, without the tune) and FlashInfer's fp8 decode on the same grid in the same call
# (bench/run_device.sh bench,flashinfer; carry [".whl"] from bench/flashinfer/fetch_flashinfer.sh), then the
# DecodeGpu tests with what is left of LIMIT_S (default 560). At most 8 files come back: the logs are concatenated.
set -u
FINAL=${OUT:-/tmp/lean_fi_out}
W=/tmp/lean_fi_work
rm -rf "$W" && mkdir -p "$W" "$FINAL"
cd "$(dirname "$0")/../.."
t_start=$(date +%s)
OUT=$W/lean TUNE=0 NCU=${NCU:-1} LIMIT_S=0 LAST_TESTS=-* bash bench/tools/lean_tune_device.sh > "$W/lean_stdout.log" 2>&1
echo "[$(($(date +%s) - t_start)) s] lean part done"
cmake --build build-device -j16 --target kvpack_capi > "$W/capi_build.log" 2>&1 || tail -20 "$W/capi_build.log"
GRID=${FI_GRID:---formats fp8,q4,q3 --shapes 32/8/128,8/1/128 --batch 1,8,64 --context 32768,131072}
OUT=$W/fi BENCH_ARGS="$GRID" bash bench/run_device.sh bench,flashinfer > "$W/fi_stdout.log" 2>&1
echo "[$(($(date +%s) - t_start)) s] flashinfer part done"
left=$(( ${LIMIT_S:-560} - ($(date +%s) - t_start) ))
echo "[$(($(date +%s) - t_start)) s] DecodeGpu tests, $left s left"
timeout $((left > 20 ? left - 10 : 10)) ./build-device/kvpack_gpu_tests \
  --gtest_filter="${LAST_TESTS:-DecodeGpu.RandomShapes*:DecodeGpu.BitwiseIdentical*:DecodeGpu.LongContext*}" \
  > "$FINAL/tests_decode.log" 2>&1
echo "[$(($(date +%s) - t_start)) s] decode tests rc=$?"
cp "$W/lean/bench_model.json" "$FINAL/" 2>/dev/null
cp "$W/fi/bench.json" "$FINAL/bench_fi.json" 2>/dev/null
cp "$W/lean/ncu.log" "$FINAL/" 2>/dev/null
cp "$W/lean/tests_first.log" "$FINAL/" 2>/dev/null
{ cat "$W/lean/env.log" "$W/lean_stdout.log"; echo "== capi build"; tail -3 "$W/capi_build.log"; echo "== fi";
  cat "$W/fi_stdout.log"; echo "== flashinfer.log"; cat "$W/fi/flashinfer.log" 2>/dev/null; echo "== fi bench.log";
  cat "$W/fi/bench.log" 2>/dev/null; } > "$FINAL/log.txt"
grep -E "^\[|rc=" "$W/lean_stdout.log" | head -20
grep -vE "^(bf16|fp8|int4|int4h|q4|q3.5|q3) +write" "$W/fi/bench.log" 2>/dev/null | tail -40
tail -40 "$W/fi/flashinfer.log" 2>/dev/null
cat "$W/lean/ncu.log" 2>/dev/null | head -60
grep -E "^\[  (FAILED|PASSED)|^\[       OK|Failure" "$FINAL/tests_decode.log" | head

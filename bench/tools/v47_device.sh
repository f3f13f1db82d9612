#!/usr/bin/env bash
# One device call (bench/NOTES.md v47): the change's correctness, the full grid with FlashInfer in the same run, an
# A/B against the base (PATCH reversed, built beside it), and the lean path's timeline (stamped build), in that order
# of priority, each cut to what is left of LIMIT_S (default 450). Carry [".whl"] (bench/flashinfer/fetch_flashinfer.sh).
# Files in $OUT: bench_fi.json (full grid + FlashInfer), ab.json, stamps.txt, log.txt, env.log.
#   PATCH=bench/results/logs/v47.patch LIMIT_S=450 bash bench/tools/v47_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v47_out /tmp/v47_work 450
start_base_build /tmp/v47_base 6
start_stamps_build
build_device kvpack_cli kvpack_gpu_tests kvpack_capi
lean_registers
T=./build-device/kvpack_gpu_tests
K=./build-device/kvpack
$T --gtest_filter="${FIRST_TESTS:-DecodeGpu.LeanMergeSlice*:DecodeGpu.BitwiseIdentical*:DecodeGpu.EmptySequence*:DecodeGpu.GraphCapture*:DecodeGpu.BadArguments*}" > "$W/tests_first.log" 2>&1
stamp "first GPU tests rc=$?"; grep -E "^\[  (FAILED|PASSED)|^\[       OK|Failure|rror" "$W/tests_first.log" | head -20
fi_grid
wait $basepid; stamp "base build rc=$?"
GRID=${GRID:---formats fp8,q4,q3.5,q3 --shapes 32/8/128,8/1/128 --batch 1,8,16,32,64 --context 32768,131072}
for r in 1 2; do
  for v in base new; do
    bin=$K; [ $v = base ] && bin=/tmp/v47_base/build-device/kvpack
    [ -x "$bin" ] && [ "$(left)" -gt 150 ] || continue
    $bin bench $GRID --json "$W/ab_${v}_$r.json" > /dev/null 2>&1
  done
done
stamp "A/B done"
python3 bench/tools/ab_summary.py "$W" "$OUT/ab.json" | tee "$W/ab_summary.txt"
S=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
{ echo "== memcheck"; timeout 60 $S --tool memcheck --error-exitcode 9 $T \
    --gtest_filter='DecodeGpu.EmptySequence*:DecodeGpu.GraphCapture*:DecodeGpu.BadArguments*'; echo "rc=$?"; } > "$W/sanitizer.log" 2>&1
stamp "sanitizer done"; grep -E "^==|ERROR SUMMARY|rc=" "$W/sanitizer.log" | head -6
l=$(left); timeout $((l > 100 ? l - 60 : 10)) $T --gtest_filter="${LAST_TESTS:-DecodeGpu.RandomShapes*}" > "$W/tests_last.log" 2>&1
stamp "last GPU tests rc=$?"; grep -E "^\[  (FAILED|PASSED)|^\[       OK|Failure|rror" "$W/tests_last.log" | head -10
wait $stampspid; stamp "stamped build rc=$?"
l=$(left)
if [ "$l" -gt 25 ]; then
  KVPACK_STAMPS_OUT="$OUT/stamps.txt" timeout $((l - 10)) ./build-stamps/kvpack bench \
    ${STAMPS_GRID:---formats q4 --shapes 32/8/128,8/1/128 --batch 1,8,16 --context 32768,131072} > /dev/null 2>&1
  python3 bench/tools/stamps.py "$OUT/stamps.txt" > "$W/stamps.log" 2>&1; stamp "stamps"; cat "$W/stamps.log"
fi
{ cat "$OUT/env.log"; echo "== build"; grep -E "registers|spill|error" "$OUT/build.log" | head -80;
  echo "== tests (first)"; grep -vE "^/.*Failure$" "$W/tests_first.log" | head -200; echo "== bench + flashinfer"; cat "$W/fi_stdout.log";
  grep -vE " write" "$W/fi/bench.log" 2>/dev/null | tail -40; tail -30 "$W/fi/flashinfer.log" 2>/dev/null;
  echo "== ab summary"; cat "$W/ab_summary.txt"; echo "== sanitizer"; cat "$W/sanitizer.log" | tail -20;
  echo "== tests (last)"; grep -vE "^/.*Failure$" "$W/tests_last.log" | tail -60; echo "== stamps"; cat "$W/stamps.log" 2>/dev/null; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
gzip -f "$OUT/stamps.txt" 2>/dev/null

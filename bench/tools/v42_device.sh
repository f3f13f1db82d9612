#!/usr/bin/env bash
# One device call (bench/NOTES.md v42): a lean-kernel change against its base in the same run on the same GPU.
# The working tree is the new version; the base is the same tree with PATCH (`git diff BASE -- src`, saved in the
# tree) reversed. Builds both at once; on the new build the GPU tests FIRST_TESTS; the A/B bench, base and new
# interleaved ROUNDS times (default 2) over GRID; memcheck / racecheck; then with what is left of LIMIT_S (default
# 570) LAST_TESTS and FP8_TESTS with fp8 on its opt-in lean kernel (KVPACK_LEAN_FP8=1). Files in $OUT: log.txt, ab.json (every
# row, "variant" base / new and "round"), env.log.
#   PATCH=bench/results/logs/v42.patch bash bench/tools/v42_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v42_out
W=/tmp/v42_work
rm -rf "$W" && mkdir -p "$W"
start_base_build /tmp/v42_base 8
build_device kvpack_cli kvpack_gpu_tests
grep -E "lean_(q_prep|kernel|merge)" -A2 "$OUT/build.log" | grep -E "registers|spill" | head -20
T=./build-device/kvpack_gpu_tests
K=./build-device/kvpack
$T --gtest_filter="${FIRST_TESTS:-PagedWriteGpu.*:PagedDequantGpu.*:DecodeGpu.EmptySequence*:DecodeGpu.GraphCapture*:DecodeGpu.BadArguments*:DecodeGpu.BitwiseIdentical*}" > "$W/tests_first.log" 2>&1
stamp "first GPU tests rc=$?"; grep -E "^\[  (FAILED|PASSED)|^\[       OK|Failure|rror" "$W/tests_first.log" | head -30
wait $basepid; rc=$?
stamp "base build rc=$rc"; [ $rc -eq 0 ] || tail -20 "$W/base_build.log"
GRID=${GRID:---formats fp8,q4,q3 --shapes 32/8/128,8/1/128 --batch 1,8,64 --context 32768,131072}
: > "$W/ab.log"
for r in $(seq 1 ${ROUNDS:-2}); do
  for v in base new; do
    bin=$K; [ $v = base ] && bin=/tmp/v42_base/build-device/kvpack
    [ -x "$bin" ] || continue
    echo "== $v round $r" >> "$W/ab.log"
    env ${AB_ENV:-} $bin bench $GRID --json "$W/ab_${v}_$r.json" 2>&1 | grep -vE " write" >> "$W/ab.log"
  done
done
stamp "A/B done"
python3 bench/tools/ab_summary.py "$W" "$OUT/ab.json" | tee "$W/ab_summary.txt"
left() { echo $(( ${LIMIT_S:-570} - ($(date +%s) - t0) )); }
S=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
{ echo "== memcheck"; timeout 90 $S --tool memcheck --error-exitcode 9 $T \
    --gtest_filter='DecodeGpu.EmptySequence*:DecodeGpu.GraphCapture*:DecodeGpu.BadArguments*'; echo "rc=$?";
  echo "== racecheck"; timeout 60 $S --tool racecheck --error-exitcode 9 $T \
    --gtest_filter='DecodeGpu.EmptySequence*:DecodeGpu.GraphCapture*'; echo "rc=$?"; } > "$W/sanitizer.log" 2>&1
stamp "sanitizer done"; grep -E "^==|ERROR SUMMARY|SUMMARY|rc=" "$W/sanitizer.log" | head -20
l=$(left); timeout $((l > 60 ? l - 20 : 10)) $T --gtest_filter="${LAST_TESTS:-DecodeGpu.LongContext*:DecodeGpu.RandomShapes*}" > "$W/tests_last.log" 2>&1
stamp "last GPU tests rc=$?"; grep -E "^\[  (FAILED|PASSED)|^\[       OK|Failure|rror" "$W/tests_last.log" | head -30
l=$(left); KVPACK_LEAN_FP8=1 timeout $((l > 30 ? l - 10 : 5)) $T --gtest_filter="${FP8_TESTS:-DecodeGpu.RandomShapes*}" > "$W/tests_leanfp8.log" 2>&1
stamp "GPU tests (KVPACK_LEAN_FP8=1) rc=$?"; grep -E "^\[  (FAILED|PASSED)|^\[       OK|Failure|rror" "$W/tests_leanfp8.log" | head -10
{ cat "$OUT/env.log"; echo "== build"; grep -E "registers|spill|error" "$OUT/build.log" | head -60;
  echo "== tests (first)"; cat "$W/tests_first.log"; echo "== tests (last)"; cat "$W/tests_last.log"; echo "== tests (KVPACK_LEAN_FP8=1)"; cat "$W/tests_leanfp8.log";
  echo "== ab"; cat "$W/ab.log"; echo "== ab summary"; cat "$W/ab_summary.txt"; echo "== sanitizer"; cat "$W/sanitizer.log"; } > "$OUT/log.txt"
rm -f "$OUT/build.log"

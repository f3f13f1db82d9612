#!/usr/bin/env bash
# One device call (bench/NOTES.md v35): build; the write-path / dequantiser / empty / graph GPU tests (q3's write fix);
# `kvpack tune --every` for the lean formats (q4, q3: warps per (sequence, kv head), every candidate printed); the
# product bench of fp8 (its built-in table) and q4 / q3 with the planner's lean wave model, then with the table just
# tuned, all in the same run; then the DecodeGpu tests with whatever time is left (LIMIT_S, default 560).
# Env: SHAPES / BATCHES / CONTEXTS (the grid), TUNE_FORMATS (default q4,q3; TUNE=0 skips the tune and its bench),
# NCU=1 adds ncu's per-kernel durations (lean kernel and its merge) for NCU_CASES (default below), NSYS=1 nsys's
# per-kernel time summaries for the same cases, FIRST_TESTS /
# LAST_TESTS (gtest filters).
source "$(dirname "$0")/device_env.sh" /tmp/lean_tune_out
build_device kvpack_cli kvpack_gpu_tests
T=./build-device/kvpack_gpu_tests
K=./build-device/kvpack
$T --gtest_filter="${FIRST_TESTS:-PagedWriteGpu.*:PagedDequantGpu.*:DecodeGpu.EmptySequence*:DecodeGpu.GraphCapture*:DecodeGpu.BadArguments*}" > "$OUT/tests_first.log" 2>&1
stamp "first tests rc=$?"; grep -E "^\[  (FAILED|PASSED)|^\[       OK|Failure|rror" "$OUT/tests_first.log" | head -30
SH=${SHAPES:-32/8/128,8/1/128}
BA=${BATCHES:-1,8,64}
CT=${CONTEXTS:-32768,131072}
if [ "${TUNE:-1}" != 0 ]; then
  $K tune --formats ${TUNE_FORMATS:-q4,q3} --shapes $SH --batch $BA --context $CT --every -o "$OUT/tune_lean.json" \
    > "$OUT/tune.log" 2>&1
  stamp "tune rc=$?"; grep -v "^  " "$OUT/tune.log"
fi
GRID="--shapes $SH --batch $BA --context $CT"
$K bench --formats fp8,q4,q3 $GRID --json "$OUT/bench_model.json" 2>&1 | grep -vE " write" > "$OUT/bench.log"
stamp "bench (fp8 built-in table, q4 / q3 lean wave model) rc=$?"
if [ "${TUNE:-1}" != 0 ]; then
  echo "== with the tuned lean table" >> "$OUT/bench.log"
  $K bench --formats fp8,q4,q3 $GRID --table "$OUT/tune_lean.json" --json "$OUT/bench_tuned.json" 2>&1 \
    | grep -vE " write" >> "$OUT/bench.log"
  stamp "bench (tuned) rc=$?"
fi
cat "$OUT/bench.log"
if [ "${NCU:-0}" != 0 ]; then
  NCU_BIN=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  : > "$OUT/ncu.log"
  for c in ${NCU_CASES:-q4:8/1/128:1:131072 q4:32/8/128:8:32768 q4:32/8/128:64:32768 q3:32/8/128:8:32768}; do
    IFS=: read -r f sh b ctx <<< "$c"
    echo "== $f $sh b=$b ctx=$ctx" >> "$OUT/ncu.log"
    # skip 2: the warm-up launch of each kernel; a large pool gives a single rotation, i.e. only (1 + iters) launches
    # of each kernel (v36: --launch-skip 8 profiled nothing)
    $NCU_BIN --clock-control none --kernel-name regex:lean --launch-skip 2 --launch-count 2 \
      --metrics gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed \
      $K bench --formats $f --shapes $sh --batch $b --context $ctx --iters 3 2>&1 \
      | grep -E "lean_|gpu__time|throughput" >> "$OUT/ncu.log"
  done
  stamp "ncu done"; cat "$OUT/ncu.log"
fi
if [ "${NSYS:-0}" != 0 ]; then  # per-kernel time summaries (all launches of one bench case), if nsys is installed
  NSYS_BIN=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -1)
  : > "$OUT/nsys.log"
  if [ -z "$NSYS_BIN" ]; then echo "nsys: not installed here" >> "$OUT/nsys.log"; fi
  for c in ${NCU_CASES:-q4:8/1/128:1:131072 q4:32/8/128:8:32768 q4:32/8/128:64:32768 q3:32/8/128:8:32768}; do
    [ -n "$NSYS_BIN" ] || break
    IFS=: read -r f sh b ctx <<< "$c"
    echo "== $f $sh b=$b ctx=$ctx" >> "$OUT/nsys.log"
    "$NSYS_BIN" profile -t cuda --force-overwrite true -o /tmp/nsys_case $K bench --formats $f --shapes $sh \
      --batch $b --context $ctx --iters 10 > /dev/null 2>&1
    "$NSYS_BIN" stats -q -r cuda_gpu_kern_sum -f csv /tmp/nsys_case.nsys-rep 2>&1 | grep -E "lean|Time" \
      | cut -c1-220 >> "$OUT/nsys.log"
  done
  stamp "nsys done"; cat "$OUT/nsys.log"
fi
left=$(( ${LIMIT_S:-560} - ($(date +%s) - t0) ))
stamp "DecodeGpu tests, $left s left"
timeout $((left > 20 ? left - 10 : 10)) $T --gtest_filter="${LAST_TESTS:-DecodeGpu.BitwiseIdentical*:DecodeGpu.RandomShapes*:DecodeGpu.LongContext*}" > "$OUT/tests_decode.log" 2>&1
stamp "decode tests rc=$?"; grep -E "^\[  (FAILED|PASSED)|^\[       OK|^\[ RUN|Failure|rror" "$OUT/tests_decode.log" | head -40

#!/usr/bin/env bash
# One device call (bench/NOTES.md v40): build; the write / dequantiser / empty / graph / bad-argument GPU tests; the
# bench of fp8, q4, q3 with FlashInfer's fp8 decode in the same run (carry [".whl"] from
# bench/flashinfer/fetch_flashinfer.sh); A/B benches of q4 / q3 in the same run: PDL off (KVPACK_PDL=0), eager launches
# (--eager), leaf mode forced off / on (KVPACK_LEAN_LEAF), 1 / 2 / 4 merge slices (KVPACK_LEAN_MERGE_SLICES), fp8 on
# its regular vs its opt-in lean kernel (fp8, leanfp8), the lean default plans before v43 (rule0); VARIANTS picks them, FI_BENCH replaces the bench + FlashInfer step's `kvpack bench` options; nsys per-kernel durations if nsys is there; then the
# DecodeGpu tests and compute-sanitizer with what is left of LIMIT_S (default 570); TUNE_GRID (kvpack bench grid
# options) adds `kvpack tune --every` of TUNE_FORMATS (default q4,q3) and a bench with its table. At most 8 files back.
source "$(dirname "$0")/device_env.sh" /tmp/v40_out
build_device kvpack_cli kvpack_gpu_tests kvpack_capi
grep -E "lean_(q_prep|kernel|merge)" -A2 "$OUT/build.log" | grep -E "registers|spill" | head -20
T=./build-device/kvpack_gpu_tests
K=./build-device/kvpack
W=/tmp/v40_work
rm -rf "$W" && mkdir -p "$W"
$T --gtest_filter="${FIRST_TESTS:-PagedWriteGpu.*:PagedDequantGpu.*:DecodeGpu.EmptySequence*:DecodeGpu.GraphCapture*:DecodeGpu.BadArguments*}" > "$W/tests_first.log" 2>&1
stamp "first tests rc=$?"; grep -E "^\[  (FAILED|PASSED)|^\[       OK|Failure|rror" "$W/tests_first.log" | head -20
GRID=${GRID:---shapes 32/8/128,8/1/128 --batch 1,8,64 --context 32768,131072}
OUT=$W/fi BENCH_ARGS="${FI_BENCH:---formats fp8,q4,q3 $GRID}" bash bench/run_device.sh bench,flashinfer > "$W/fi_stdout.log" 2>&1
stamp "bench + flashinfer rc=$?"
cp "$W/fi/bench.json" "$OUT/bench_fi.json" 2>/dev/null
grep -vE " write" "$W/fi/bench.log" 2>/dev/null | tail -30
tail -25 "$W/fi/flashinfer.log" 2>/dev/null
# A/B in one process run each (same GPU, minutes apart): the default again, PDL off, eager, leaf off, leaf on.
: > "$W/ab.log"
for v in ${VARIANTS:-default pdl0 eager leaf0 leaf1}; do
  fmts=${AB_FORMATS:-q4,q3}
  case $v in
    default) env=() ; extra=() ;;
    pdl0) env=(KVPACK_PDL=0) ; extra=() ;;
    eager) env=() ; extra=(--eager) ;;
    leaf0) env=(KVPACK_LEAN_LEAF=0) ; extra=() ;;
    leaf1) env=(KVPACK_LEAN_LEAF=1) ; extra=() ;;
    slices1) env=(KVPACK_LEAN_MERGE_SLICES=1) ; extra=() ;;
    slices2) env=(KVPACK_LEAN_MERGE_SLICES=2) ; extra=() ;;
    slices4) env=(KVPACK_LEAN_MERGE_SLICES=4) ; extra=() ;;
    fp8) env=() ; extra=() ; fmts=fp8 ;;                    # fp8 on the regular kernel ...
    leanfp8) env=(KVPACK_LEAN_FP8=1) ; extra=() ; fmts=fp8 ;;  # ... against its opt-in lean kernel
    rule0) env=(KVPACK_LEAN_RULE=0) ; extra=() ;;            # the lean default plans before v43
  esac
  echo "== $v" >> "$W/ab.log"
  env "${env[@]}" $K bench --formats $fmts $GRID "${extra[@]}" --json "$W/ab_$v.json" 2>&1 | grep -vE " write" >> "$W/ab.log"
done
stamp "A/B benches done"; cat "$W/ab.log"
# $OUT/ab.json: every $W/ab_<variant>.json row with its "variant".
merge_ab() {
  python3 - "$W" > "$OUT/ab.json" <<'EOF'
import json, sys, glob, os
rows = []
for f in sorted(glob.glob(sys.argv[1] + "/ab_*.json")):
    v = os.path.basename(f)[3:-5]
    for r in json.load(open(f)):
        r["variant"] = v
        rows.append(r)
json.dump(rows, sys.stdout, indent=1)
EOF
}
merge_ab
# Optional: `kvpack tune --every` over TUNE_GRID (q4 / q3: warp-mode split counts and leaf mode), then the bench of
# that grid with the tuned table beside the default plans.
if [ -n "${TUNE_GRID:-}" ]; then
  $K tune --formats ${TUNE_FORMATS:-q4,q3} $TUNE_GRID --every -o "$OUT/tune.json" > "$W/tune.log" 2>&1
  stamp "tune rc=$?"; grep -v "^  " "$W/tune.log" | tail -40
  $K bench --formats ${TUNE_FORMATS:-q4,q3} $TUNE_GRID --table "$OUT/tune.json" --json "$W/ab_tuned.json" 2>&1 \
    | grep -vE " write" > "$W/bench_tuned.log"
  stamp "bench (tuned table) rc=$?"; cat "$W/bench_tuned.log"
  merge_ab
else
  : > "$W/tune.log"; : > "$W/bench_tuned.log"
fi
if command -v nsys > /dev/null || ls /usr/local/cuda/bin/nsys > /dev/null 2>&1; then
  NSYS_BIN=$(command -v nsys || echo /usr/local/cuda/bin/nsys)
  : > "$W/nsys.log"
  for c in ${NSYS_CASES:-q4:8/1/128:1:131072 q4:32/8/128:1:131072 q4:32/8/128:8:32768 fp8:8/1/128:1:131072}; do
    IFS=: read -r f sh b ctx <<< "$c"
    echo "== $f $sh b=$b ctx=$ctx" >> "$W/nsys.log"
    "$NSYS_BIN" profile -t cuda --force-overwrite true -o /tmp/nsys_case $K bench --formats $f --shapes $sh \
      --batch $b --context $ctx --iters 10 --eager > /dev/null 2>&1
    "$NSYS_BIN" stats -q -r cuda_gpu_kern_sum -f csv /tmp/nsys_case.nsys-rep 2>&1 | grep -vE "random|slots|probe|write" \
      | cut -c1-240 >> "$W/nsys.log"
  done
  stamp "nsys done"; cat "$W/nsys.log"
else
  echo "nsys: not installed" > "$W/nsys.log"
fi
left=$(( ${LIMIT_S:-570} - ($(date +%s) - t0) ))
stamp "DecodeGpu tests, $left s left"
timeout $((left > 100 ? left - 80 : 20)) $T --gtest_filter="${LAST_TESTS:-DecodeGpu.BitwiseIdentical*:DecodeGpu.RandomShapes*:DecodeGpu.LongContext*}" > "$W/tests_decode.log" 2>&1
stamp "decode tests rc=$?"; grep -E "^\[  (FAILED|PASSED)|^\[       OK|Failure|rror" "$W/tests_decode.log" | head -30
left=$(( ${LIMIT_S:-570} - ($(date +%s) - t0) ))
S=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
{ echo "== memcheck"; timeout $((left > 40 ? left / 2 - 5 : 5)) $S --tool memcheck --error-exitcode 9 $T \
    --gtest_filter='DecodeGpu.EmptySequence*:DecodeGpu.GraphCapture*:DecodeGpu.BadArguments*'; echo "rc=$?";
  echo "== racecheck"; timeout $((left > 40 ? left / 2 - 10 : 5)) $S --tool racecheck --error-exitcode 9 $T \
    --gtest_filter='DecodeGpu.EmptySequence*:DecodeGpu.GraphCapture*'; echo "rc=$?"; } > "$W/sanitizer.log" 2>&1
stamp "sanitizer done"; grep -E "^==|ERROR SUMMARY|rc=|PASSED|FAILED" "$W/sanitizer.log" | head -20
{ cat "$OUT/env.log"; echo "== build"; grep -E "registers|spill|error" "$OUT/build.log" | head -60;
  echo "== tests_first"; cat "$W/tests_first.log"; echo "== fi stdout"; cat "$W/fi_stdout.log";
  echo "== flashinfer.log"; cat "$W/fi/flashinfer.log" 2>/dev/null; echo "== fi bench.log"; cat "$W/fi/bench.log" 2>/dev/null;
  echo "== ab"; cat "$W/ab.log"; echo "== tune"; cat "$W/tune.log"; echo "== bench (tuned)"; cat "$W/bench_tuned.log";
  echo "== nsys"; cat "$W/nsys.log"; echo "== tests_decode"; cat "$W/tests_decode.log";
  echo "== sanitizer"; cat "$W/sanitizer.log"; } > "$OUT/log.txt"
rm -f "$OUT/build.log"

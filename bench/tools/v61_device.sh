#!/usr/bin/env bash
# One device call (bench/NOTES.md v61): decode_step (the query preparation overlapping the q write, PDL) and the q
# write's small kernel on 9-511-token launches (KVPACK_WRITE_SMALL_MAX), against main at f4eaab0 built beside it
# (this tree with bench/tools/v61.patch reversed; NO_BASE=1 skips it).
#   LIMIT_S=420 bash bench/tools/v61_device.sh
# Files in $OUT: log.txt, ab_write.json, ab_step.json (variants: base = f4eaab0; seq = this build, KVPACK_STEP_PDL=0;
# new = this build; s64 / s511 = new with KVPACK_WRITE_SMALL_MAX=64 / 511; s64a / s511a the same with the tile chosen
# per launch, KVPACK_WRITE_SMALL_TOK=0), tests.log; ncu_q4_1.txt with NCU_PROFILE=1.
# NO_BASE=1 (a short call): no base build, "base" is this build with KVPACK_STEP_PDL=0 KVPACK_WRITE_SMALL_MAX=8 (the
# two calls' order, the small kernel up to 8 tokens), and neither "new" duplicate nor "seq" runs.
source "$(dirname "$0")/device_env.sh" /tmp/v61_out /tmp/v61_work 420
PATCH=bench/tools/v61.patch
[ -z "${NO_BASE:-}" ] && start_base_build /tmp/v61_base 6
build_device kvpack_gpu_tests
grep -E "write_kv_q|lean_q_prep" -A2 "$OUT/build.log" | grep -E "registers|spill" | sort | uniq -c > "$OUT/regs.txt"
T=./build-device/kvpack_gpu_tests
gpu_tests tests_first 150 'DecodeStepGpu.*:PagedWriteGpu.*:PagedDequantGpu.*'
cp "$W/tests_first.log" "$OUT/tests.log"  # now: a call cut short still brings it back
cmake --build build-device -j16 --target kvpack_cli >> "$OUT/build.log" 2>&1; stamp "cli built"
if [ -z "${NO_BASE:-}" ]; then
  wait $basepid; stamp "base build rc=$?"; ls /tmp/v61_base/build-device/kvpack || tail -20 "$W/base_build.log"
  BASE=/tmp/v61_base/build-device/kvpack
else
  BASE="env KVPACK_STEP_PDL=0 KVPACK_WRITE_SMALL_MAX=8 ./build-device/kvpack"
fi
# The write rows (eager launches), then the whole step at 32k, each round every variant.
GRID="--formats q4,q3.5,q3 --shapes ${WSHAPES:-8/1/128,32/8/128,9/3/64} --batch 1,8,16,64 --context 8192 --iters 30"
STEP="--formats fp8,q4,q3.5,q3 --shapes 8/1/128,32/8/128 --batch 1,8,16,64 --context 32768 --step"
mkdir -p "$W/w" "$W/s"
for r in $(seq 1 ${ROUNDS:-2}); do
  $BASE bench $STEP --json "$W/s/ab_base_$r.json" > /dev/null 2>&1
  [ -z "${NO_BASE:-}" ] && KVPACK_STEP_PDL=0 ./build-device/kvpack bench $STEP --json "$W/s/ab_seq_$r.json" > /dev/null 2>&1
  ./build-device/kvpack bench $STEP --json "$W/s/ab_new_$r.json" > /dev/null 2>&1
  KVPACK_WRITE_SMALL_MAX=64 ./build-device/kvpack bench $STEP --json "$W/s/ab_s64_$r.json" > /dev/null 2>&1
  KVPACK_WRITE_SMALL_MAX=64 KVPACK_WRITE_SMALL_TOK=0 ./build-device/kvpack bench $STEP --json "$W/s/ab_s64a_$r.json" > /dev/null 2>&1
  stamp "step round $r"
  AB_KIND=step python3 bench/tools/ab_summary.py "$W/s" "$OUT/ab_step.json" > "$OUT/ab_step.txt"
  $BASE bench $GRID --json "$W/w/ab_base_$r.json" > /dev/null 2>&1
  [ -z "${NO_BASE:-}" ] && ./build-device/kvpack bench $GRID --json "$W/w/ab_new_$r.json" > /dev/null 2>&1
  KVPACK_WRITE_SMALL_MAX=64 ./build-device/kvpack bench $GRID --json "$W/w/ab_s64_$r.json" > /dev/null 2>&1
  KVPACK_WRITE_SMALL_MAX=511 ./build-device/kvpack bench $GRID --json "$W/w/ab_s511_$r.json" > /dev/null 2>&1
  KVPACK_WRITE_SMALL_MAX=64 KVPACK_WRITE_SMALL_TOK=0 ./build-device/kvpack bench $GRID --json "$W/w/ab_s64a_$r.json" > /dev/null 2>&1
  KVPACK_WRITE_SMALL_MAX=511 KVPACK_WRITE_SMALL_TOK=0 ./build-device/kvpack bench $GRID --json "$W/w/ab_s511a_$r.json" > /dev/null 2>&1
  stamp "write round $r"
  AB_KIND=write python3 bench/tools/ab_summary.py "$W/w" "$OUT/ab_write.json" > "$OUT/ab_write.txt"
  AB_KIND=step python3 bench/tools/ab_summary.py "$W/s" "$OUT/ab_step.json" > "$OUT/ab_step.txt"
  [ "$(left)" -lt 200 ] && break
done
mv "$OUT/ab_write.txt" "$W/ab_write.txt"; mv "$OUT/ab_step.txt" "$W/ab_step.txt"
python3 bench/summarize.py "$W/s/ab_new_1.json" > "$W/step_new_summary.txt" 2>&1
# The other decode tests (the query preparation's code changed: both of its orders must give the same bits).
[ "$(left)" -gt 100 ] && gpu_tests tests 90 'DecodeGpu.BitwiseIdentical*:DecodeGpu.RandomShapes*:DecodeGpu.GraphCapture*:DecodeGpu.LeanMixed*:DecodeGpu.BadArguments*'
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
if [ -n "${NCU_PROFILE:-}" ] && [ "$(left)" -gt 100 ]; then
  timeout 80 $NCU --clock-control none --cache-control none --kernel-name-base demangled \
    --kernel-name 'regex:write_kv_q_small_kernel' --launch-skip 6 --launch-count 1 --set full --sampling-interval 0 \
    --import-source no -o "$W/q4_1" -f ./build-device/kvpack bench --formats q4 --shapes 8/1/128 --batch 1 \
    --context 8192 --iters 3 > "$W/ncu.log" 2>&1
  stamp "ncu rc=$?"
  $NCU -i "$W/q4_1.ncu-rep" --page details > "$OUT/ncu_q4_1.txt" 2>&1
  $NCU -i "$W/q4_1.ncu-rep" --page source --csv --print-source sass 2> /dev/null | gzip > "$OUT/src_q4_1.csv.gz"
fi
S=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -z "${SKIP_SAN:-}" ] && [ "$(left)" -gt 70 ]; then
  { echo "== memcheck"; timeout 60 $S --tool memcheck --error-exitcode 9 $T --gtest_filter='DecodeStepGpu.BadArguments*:PagedWriteGpu.OutOfRange*'; echo "rc=$?"; } > "$W/sanitizer.log" 2>&1
  stamp "sanitizers"
fi
{ cat "$OUT/env.log" "$OUT/regs.txt"; rm -f "$OUT/env.log" "$OUT/regs.txt"
  echo "== tests (step, write, dequant)"; grep -vE "^/.*Failure$" "$W/tests_first.log" | tail -40
  echo "== A/B write"; cat "$W/ab_write.txt"; echo "== A/B step"; cat "$W/ab_step.txt"
  echo "== step summary (new)"; sed -n '/measured whole/,$p' "$W/step_new_summary.txt"
  echo "== sanitizers"; grep -E "^==|ERROR SUMMARY|rc=" "$W/sanitizer.log" 2>/dev/null
  echo "== tests (decode)"; grep -vE "^/.*Failure$" "$W/tests.log" 2>/dev/null | tail -30; } > "$OUT/log.txt"
rm -f "$OUT/build.log"

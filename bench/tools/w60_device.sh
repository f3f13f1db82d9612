#!/usr/bin/env bash
# One device call (bench/NOTES.md v60): the q write path's small kernel (launches of <= 8 tokens) against main's.
# Builds new (this tree) and base (this tree with bench/tools/w60.patch reversed: main at f4eaab0), runs the write and
# dequantiser GPU tests, an A/B of the write rows (base / new = the small kernel up to 8 tokens in tiles of 2 / s64 and
# s511: up to 64 and 511 tokens, via KVPACK_WRITE_SMALL_MAX),
# the whole decode step (bench --step) of both builds and of s64, an ncu profile of one warm 1-token launch, compute-sanitizer
# memcheck + racecheck of the small-launch tests.
#   LIMIT_S=330 bash bench/tools/w60_device.sh        Files in $OUT: log.txt, ab_write.json, step_{base,new}.json
# (NCU_PROFILE=1 adds ncu_q4_1.txt and src_q4_1.csv.gz, the PC sampler at its shortest interval, 2^5 cycles: the
# default interval left 8 samples in a 6 us launch, run 20261207T035457Z.)
source "$(dirname "$0")/device_env.sh" /tmp/w60_out /tmp/w60_work 330
PATCH=bench/tools/w60.patch
# NO_BASE=1: no base build; "base" is then this tree's default (the A/B compares the launch-size settings only).
[ -z "${NO_BASE:-}" ] && start_base_build /tmp/w60_base 6
build_device kvpack_cli kvpack_gpu_tests
grep -E "write_kv_q" -A2 "$OUT/build.log" | grep -E "registers|spill" | sort | uniq -c > "$OUT/regs.txt"
T=./build-device/kvpack_gpu_tests
gpu_tests tests_first 120 'PagedWriteGpu.*:PagedDequantGpu.*'
if [ -z "${NO_BASE:-}" ]; then
  wait $basepid; stamp "base build rc=$?"; ls /tmp/w60_base/build-device/kvpack || tail -20 "$W/base_build.log"
  BASE=/tmp/w60_base/build-device/kvpack
else
  BASE=./build-device/kvpack
fi
GRID="--formats q4,q3.5,q3 --shapes 8/1/128,32/8/128,9/3/64 --batch 1,8,16,64 --context 8192 --iters 30"
for r in $(seq 1 ${ROUNDS:-3}); do
  $BASE bench $GRID --json "$W/ab_base_$r.json" > /dev/null 2>&1
  [ -z "${NO_BASE:-}" ] && ab_bench new $r
  ab_bench s64 $r KVPACK_WRITE_SMALL_MAX=64
  ab_bench s511 $r KVPACK_WRITE_SMALL_MAX=511
  stamp "round $r"
  [ "$(left)" -lt 200 ] && break
done
AB_KIND=write python3 bench/tools/ab_summary.py "$W" "$OUT/ab_write.json" > "$W/ab_write.txt"; cat "$W/ab_write.txt"
STEP="--formats fp8,q4,q3.5,q3 --shapes 8/1/128,32/8/128 --batch 1,8,64 --context 32768 --step"
[ -z "${NO_BASE:-}" ] && $BASE bench $STEP --json "$OUT/step_base.json" > "$W/step_base.txt" 2>&1
./build-device/kvpack bench $STEP --json "$OUT/step_new.json" > "$W/step_new.txt" 2>&1
KVPACK_WRITE_SMALL_MAX=64 ./build-device/kvpack bench $STEP --json "$OUT/step_s64.json" > "$W/step_s64.txt" 2>&1
stamp "steps"
python3 bench/summarize.py "$OUT/step_base.json" > "$W/step_base_summary.txt" 2>&1
python3 bench/summarize.py "$OUT/step_new.json" > "$W/step_new_summary.txt" 2>&1
python3 bench/summarize.py "$OUT/step_s64.json" > "$W/step_s64_summary.txt" 2>&1
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
if [ -n "${NCU_PROFILE:-}" ] && [ "$(left)" -gt 130 ]; then
  timeout 90 $NCU --clock-control none --cache-control none --kernel-name-base demangled \
    --kernel-name 'regex:write_kv_q_small_kernel' --launch-skip 6 --launch-count 1 --set full --sampling-interval 0 \
    --import-source no \
    -o "$W/q4_1" -f ./build-device/kvpack bench --formats q4 --shapes 8/1/128 --batch 1 --context 8192 --iters 3 \
    > "$W/ncu.log" 2>&1
  stamp "ncu rc=$?"
  $NCU -i "$W/q4_1.ncu-rep" --page details > "$OUT/ncu_q4_1.txt" 2>&1
  $NCU -i "$W/q4_1.ncu-rep" --page source --csv --print-source sass 2> /dev/null | gzip > "$OUT/src_q4_1.csv.gz"
  tail -3 "$W/ncu.log" >> "$OUT/ncu_q4_1.txt"
fi
S=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -z "${SKIP_SAN:-}" ] && [ "$(left)" -gt 90 ]; then
  { echo "== memcheck"; timeout 60 $S --tool memcheck --error-exitcode 9 $T --gtest_filter='PagedWriteGpu.DecodeStep*:PagedWriteGpu.OutOfRange*'; echo "rc=$?"
    echo "== racecheck"; timeout 60 $S --tool racecheck --error-exitcode 9 $T --gtest_filter='PagedWriteGpu.DecodeStep*'; echo "rc=$?"; } > "$W/sanitizer.log" 2>&1
  stamp "sanitizers"; grep -E "^==|ERROR SUMMARY|rc=" "$W/sanitizer.log" | head -8
fi
{ cat "$OUT/env.log" "$OUT/regs.txt"; rm -f "$OUT/env.log" "$OUT/regs.txt"; echo "== tests (write, dequant)"; grep -vE "^/.*Failure$" "$W/tests_first.log" | tail -30
  echo "== A/B write"; cat "$W/ab_write.txt"; echo "== step base"; grep -E "step|us" "$W/step_base.txt" | tail -40
  echo "== step new"; grep -E "step|us" "$W/step_new.txt" | tail -40;
  echo "== step summaries"; for v in base new s64; do echo "-- $v"; sed -n '/measured whole/,$p' "$W/step_${v}_summary.txt"; done; echo "== sanitizers"; tail -20 "$W/sanitizer.log"
  echo "== tests (rest)"; grep -vE "^/.*Failure$" "$W/tests.log" 2>/dev/null | tail -40; } > "$OUT/log.txt"
rm -f "$OUT/build.log"

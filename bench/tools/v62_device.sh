#!/usr/bin/env bash
# One device call (bench/NOTES.md v62, v62b): main with the small q write as the default (v62: up to 64 tokens; v62b:
# while its grid fits 1.5 waves) and its tile chosen per launch. In order, each step's files written into $OUT as soon
# as it ends (a call cut short still returns them):
#   1. the write A/B on launches of 1-511 tokens (base = v61's defaults: KVPACK_WRITE_SMALL_MAX=8
#      KVPACK_WRITE_SMALL_TOK=2; new = main; s64 / s511 = main with KVPACK_WRITE_SMALL_MAX=64 / 511): ab_write.json,
#      ab_write.txt;
#   2. the full grid (every format, both head_dim-128 shapes, batch 1-64 x 8k-128k) with the decode step (--step) and
#      FlashInfer's fp8 decode in the same run (carry [".whl"], bench/flashinfer/fetch_flashinfer.sh): bench_fi.json;
#   3. the GPU tests not run in the v61 call (decode_step and the write tests passed there; TESTS_LAST overrides the
#      filter, empty: none), then memcheck of the small tests: tests.log, log.txt.
# TESTS_FIRST (a gtest filter) runs those tests before step 1 (tests_first.log).
#   LIMIT_S=540 bash bench/tools/v62_device.sh        (FI_BENCH overrides the grid; ROUNDS the write A/B's rounds)
#   TESTS_FIRST='PagedWriteGpu.*:DecodeStepGpu.*' TESTS_LAST='DecodeGpu.BitwiseIdentical*' LIMIT_S=480 \
#     bash bench/tools/v62_device.sh                  (v62b: the launch-size rule of 2026-12-07 09:00)
# WSTAMPS=1: also the small write's phase clocks (a measurement build, -DKVPACK_WRITE_STAMPS, built beside it), after
# step 1: wstamps.txt (bench/tools/write_stamps.py's table).
source "$(dirname "$0")/device_env.sh" /tmp/v62_out /tmp/v62_work 540
[ -n "${WSTAMPS:-}" ] && start_stamps_build KVPACK_WRITE_STAMPS build-wstamps 6
build_device kvpack_cli kvpack_gpu_tests kvpack_capi
T=./build-device/kvpack_gpu_tests
K=./build-device/kvpack
if [ -n "${TESTS_FIRST:-}" ]; then
  gpu_tests tests_first 200 "$TESTS_FIRST"
  cp "$W/tests_first.log" "$OUT/tests_first.log"
fi
WGRID="--formats q4,q3.5,q3 --shapes 8/1/128,32/8/128,9/3/64 --batch 1,8,16,32,64,96,128,256,511 --context 8192 --iters 30"
mkdir -p "$W/w"
for r in $(seq 1 ${ROUNDS:-2}); do
  KVPACK_WRITE_SMALL_MAX=8 KVPACK_WRITE_SMALL_TOK=2 $K bench $WGRID --json "$W/w/ab_base_$r.json" > /dev/null 2>&1
  $K bench $WGRID --json "$W/w/ab_new_$r.json" > /dev/null 2>&1
  KVPACK_WRITE_SMALL_MAX=64 $K bench $WGRID --json "$W/w/ab_s64_$r.json" > /dev/null 2>&1
  KVPACK_WRITE_SMALL_MAX=511 $K bench $WGRID --json "$W/w/ab_s511_$r.json" > /dev/null 2>&1
  stamp "write round $r"
  AB_KIND=write python3 bench/tools/ab_summary.py "$W/w" "$OUT/ab_write.json" > "$OUT/ab_write.txt"
done
[ -n "${WSTAMPS:-}" ] && write_stamps_run
FI_BENCH=${FI_BENCH:---formats bf16,fp8,int4,int4h,q4,q3.5,q3 --shapes 32/8/128,8/1/128 --batch 1,8,16,32,64 --context 8192,32768,65536,131072 --step}
[ "$(left)" -gt 150 ] && fi_grid
grep -vE " write" "$W/fi/bench.log" > "$OUT/bench_log.txt" 2>/dev/null
tail -40 "$W/fi/flashinfer.log" >> "$OUT/bench_log.txt" 2>/dev/null
l=$(left)
TESTS_LAST=${TESTS_LAST-DecodeGpu.*:PagedWriteGpu.ByteExactVsCpuEncoder}
[ "$l" -gt 60 ] && [ -n "$TESTS_LAST" ] && gpu_tests tests $((l - 45)) "$TESTS_LAST"
cp "$W/tests.log" "$OUT/tests.log" 2>/dev/null
memcheck_small 'DecodeStepGpu.BadArguments*:PagedWriteGpu.OutOfRange*:DecodeGpu.EmptySequence*:DecodeGpu.GraphCapture*'
{ cat "$OUT/env.log"; rm -f "$OUT/env.log"
  echo "== A/B write"; cat "$OUT/ab_write.txt"
  echo "== grid + flashinfer"; cat "$W/fi_stdout.log" 2>/dev/null
  echo "== tests (first)"; test_outcomes "$W/tests_first.log"
  echo "== tests"; test_outcomes "$W/tests.log"
  echo "== sanitizers"; grep -E "^==|ERROR SUMMARY|rc=" "$W/sanitizer.log" 2>/dev/null; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
stamp "done"

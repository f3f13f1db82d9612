#!/usr/bin/env bash
# One device call (bench/NOTES.md v63): the plain write kernels' prefill (fp8 through the hardware e4m3 conversion,
# fp8 and int4 with their input loaded beside the slot) against main before v63 built beside it (this tree with
# bench/tools/v63.patch reversed), then the full grid. In order, each step's files written into $OUT as it ends:
#   1. tests: BlockCoreGpu.* (the e4m3 conversion against the host's over 5 M inputs), PagedWriteGpu.*, DecodeStepGpu.*:
#      tests_first.log;
#   2. the write A/B (bf16 as the control, fp8, int4, int4h; launches of 1, 8, 64 and 65,536 tokens; base / new; through
#      device_env.sh's write_ab, whose rounds alternate who goes first: the v63 call ran the base first in both):
#      ab_write.json, ab_write.txt;
#   3. the full grid with --step and FlashInfer (carry [".whl"]; FI_BENCH overrides it): bench_fi.json, bench_log.txt;
#   4. DecodeGpu.* (TESTS_LAST overrides the filter, empty: none), memcheck of the small tests: log.txt.
#   LIMIT_S=540 bash bench/tools/v63_device.sh          (NO_GRID=1 skips step 3; ROUNDS the A/B's rounds, default 2)
source "$(dirname "$0")/device_env.sh" /tmp/v63_out /tmp/v63_work 540
PATCH=bench/tools/v63.patch
start_base_build /tmp/v63_base 6
build_device kvpack_cli kvpack_gpu_tests kvpack_capi
T=./build-device/kvpack_gpu_tests
gpu_tests tests_first 150 'BlockCoreGpu.*:PagedWriteGpu.*:DecodeStepGpu.*'
cp "$W/tests_first.log" "$OUT/tests_first.log"
wait $basepid; stamp "base build rc=$?"; ls /tmp/v63_base/build-device/kvpack > /dev/null || tail -20 "$W/base_build.log"
GRID="--formats bf16,fp8,int4,int4h --shapes 8/1/128,32/8/128 --batch 1,8,64 --context 8192 --iters 30"
write_ab /tmp/v63_base/build-device/kvpack "${ROUNDS:-2}"
if [ -z "${NO_GRID:-}" ] && [ "$(left)" -gt 150 ]; then
  FI_BENCH=${FI_BENCH:---formats bf16,fp8,int4,int4h,q4,q3.5,q3 --shapes 32/8/128,8/1/128 --batch 1,8,16,32,64 --context 8192,32768,65536,131072 --step}
  fi_grid
  { grep -vE " write" "$W/fi/bench.log"; tail -40 "$W/fi/flashinfer.log"; } > "$OUT/bench_log.txt" 2>/dev/null
fi
l=$(left)
TESTS_LAST=${TESTS_LAST-DecodeGpu.*}
[ "$l" -gt 60 ] && [ -n "$TESTS_LAST" ] && gpu_tests tests $((l - 45)) "$TESTS_LAST"
memcheck_small 'PagedWriteGpu.OutOfRange*:DecodeStepGpu.BadArguments*:DecodeGpu.EmptySequence*'
{ cat "$OUT/env.log"; rm -f "$OUT/env.log"
  echo "== build (write kernels)"; grep -E "write_kv_(group|vec)_kernel" -A2 "$OUT/build.log" | grep -E "registers|spill" | sort | uniq -c
  echo "== tests (first)"; test_outcomes "$W/tests_first.log"
  echo "== A/B write"; cat "$OUT/ab_write.txt"
  echo "== grid + flashinfer"; cat "$W/fi_stdout.log" 2>/dev/null
  echo "== tests"; test_outcomes "$W/tests.log"
  echo "== sanitizers"; grep -E "^==|ERROR SUMMARY|rc=" "$W/sanitizer.log" 2>/dev/null; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
stamp "done"

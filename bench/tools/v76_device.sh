#!/usr/bin/env bash
# One device call (bench/NOTES.md v76): main's final configuration of 2026-12-07 (group folding for q4 / q3.5 only):
# the group-folding and bitwise tests (tests.log); the group-folding test under compute-sanitizer, memcheck then
# racecheck (q4: KVPACK_TEST_FORMATS=q4; sanitizer.log); the grid with --step and FlashInfer if time is left
# (carry [".whl"]): bench_fi.json; log.txt.
#   LIMIT_S=250 bash bench/tools/v76_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v76_out /tmp/v76_work 250
build_device kvpack_cli kvpack_gpu_tests
T=./build-device/kvpack_gpu_tests
gpu_tests tests 80 'DecodeGpu.LeanGroupFold*:DecodeGpu.Bitwise*'
cp "$W/tests.log" "$OUT/tests.log"
s=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
{ for tool in memcheck racecheck; do
    echo "== $tool"
    KVPACK_TEST_FORMATS=q4 timeout $(( ($(left) - 20) / 2 )) $s --tool $tool --error-exitcode 9 $T \
      --gtest_filter='DecodeGpu.LeanGroupFold*'
    echo "rc=$?"
  done; } > "$OUT/sanitizer.log" 2>&1
stamp "sanitizers"
if [ "$(left)" -gt 60 ]; then
  FI_BENCH="--formats bf16,fp8,int4,int4h,q4,q3.5,q3 --shapes 32/8/128,8/1/128 --batch 1,8,16,32,64 --context 8192,32768,65536,131072 --step"
  fi_grid
fi
{ cat "$OUT/env.log"; rm -f "$OUT/env.log"
  echo "== tests"; test_outcomes "$OUT/tests.log"
  echo "== sanitizers"; grep -E "^==|ERROR SUMMARY|rc=|OK \]|FAILED" "$OUT/sanitizer.log"
  echo "== grid + flashinfer"; tail -5 "$W/fi_stdout.log" 2>/dev/null; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
stamp "done"

#!/usr/bin/env bash
# One device call (bench/NOTES.md v76): main's final configuration of 2026-12-07 (group folding for q4 / q3.5 only):
# the group-folding and bitwise tests (tests.log), then the grid with --step and FlashInfer (carry [".whl"]):
# bench_fi.json; log.txt.
#   LIMIT_S=300 bash bench/tools/v76_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v76_out /tmp/v76_work 300
build_device kvpack_cli kvpack_gpu_tests
T=./build-device/kvpack_gpu_tests
gpu_tests tests 100 'DecodeGpu.LeanGroupFold*:DecodeGpu.Bitwise*'
cp "$W/tests.log" "$OUT/tests.log"
FI_BENCH="--formats bf16,fp8,int4,int4h,q4,q3.5,q3 --shapes 32/8/128,8/1/128 --batch 1,8,16,32,64 --context 8192,32768,65536,131072 --step"
fi_grid
{ cat "$OUT/env.log"; rm -f "$OUT/env.log"
  echo "== tests"; test_outcomes "$OUT/tests.log"
  echo "== grid + flashinfer"; tail -5 "$W/fi_stdout.log" 2>/dev/null; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
stamp "done"

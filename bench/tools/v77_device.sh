#!/usr/bin/env bash
# One device call (bench/NOTES.md v76, v77): the group-folding test under the sanitizers (v76's, not run on
# 2026-12-07), then a KVPACK_LEAN_BULK build (the q formats' ring filled by bulk copies of whole units, prepared
# 2026-12-07 without a GPU) built beside the default one: its tests, then the A/B of the two builds. Files in $OUT:
# sanitizer.log, tests_bulk.log, ab_bulk.json / .txt, registers_bulk.txt, log.txt.
#   LIMIT_S=480 bash bench/tools/v77_device.sh
# Ran 2026-12-07 21:52 (H100; bench/NOTES.md "v77 + v78: the outcome"). KVPACK_LEAN_BULK was then removed from the
# source (not kept); to rerun its part, apply bench/results/logs/v77_lean_bulk_not_kept.patch first.
source "$(dirname "$0")/device_env.sh" /tmp/v77_out /tmp/v77_work 480
start_stamps_build KVPACK_LEAN_BULK build-bulk 8 "kvpack_cli kvpack_gpu_tests"
bulkpid=$stampspid
build_device kvpack_cli kvpack_gpu_tests
T=./build-device/kvpack_gpu_tests
sanitize_formats "$OUT/sanitizer.log" 80 'DecodeGpu.LeanGroupFold*' q4
wait $bulkpid; stamp "bulk build rc=$?"
grep -E "lean_kernel" -A2 "$W/bulk_build.log" | grep -E "registers|spill" | sort | uniq -c > "$OUT/registers_bulk.txt"
if [ -x ./build-bulk/kvpack_gpu_tests ]; then
  T=./build-bulk/kvpack_gpu_tests
  gpu_tests tests_bulk 120 'DecodeGpu.RandomShapes*:DecodeGpu.LongContext*:DecodeGpu.Bitwise*:DecodeGpu.LeanGroupFold*:DecodeGpu.LeanMerge*:DecodeGpu.GraphCapture*' \
    KVPACK_TEST_FORMATS=q4,q3.5,q3
  cp "$W/tests_bulk.log" "$OUT/"
  GRID="--formats q4,q3.5,q3 --shapes 32/8/128,8/1/128 --batch 1,8,32,64 --context 32768,131072 --iters 20"
  [ "$(left)" -gt 120 ] && bench_ab "$W/ab_bulk" 3 base=./build-device/kvpack bulk=./build-bulk/kvpack
else
  tail -30 "$W/bulk_build.log" > "$OUT/bulk_build_tail.log"
fi
# fp8 at 32q/8kv on the lean kernel (KVPACK_LEAN_FP8=1) against main's regular kernel, on this GPU (v49's H100 A/B,
# before v68 / v71: 0.86-0.96x at batch 8-64): whether the per-shape rule should take 32q/8kv too.
if [ "$(left)" -gt 70 ]; then
  GRID="--formats fp8 --shapes 32/8/128 --batch 8,32,64 --context 32768,131072 --iters 20"
  ab_env "$W/ab_fp8lean" fp8lean 2 KVPACK_LEAN_FP8 0 1
fi
{ cat "$OUT/env.log"; rm -f "$OUT/env.log"
  echo "== sanitizers"; grep -E "^==|ERROR SUMMARY|rc=|OK \]|FAILED" "$OUT/sanitizer.log"
  echo "== bulk build registers"; cat "$OUT/registers_bulk.txt"
  echo "== tests (bulk build)"; test_outcomes "$W/tests_bulk.log"
  echo "== A/B bulk"; cat "$OUT/ab_ab_bulk.txt" 2>/dev/null
  echo "== A/B fp8 lean at 32q/8kv"; cat "$OUT/ab_fp8lean.txt" 2>/dev/null; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
stamp "done"

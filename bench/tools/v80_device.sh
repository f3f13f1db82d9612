#!/usr/bin/env bash
# One device call (bench/NOTES.md v80; run 2026-12-08 on an H100): the warp pipeline's per-chunk merge without CTA
# barriers (bf16 / fp8 regular kernel), built with -DKVPACK_PIPE_ASYNC_MERGE=1 (both formats) into build-amerge
# beside the default build (when it ran: v79's two __syncthreads per chunk for both; since then the default, -1,
# takes the new merge for bf16, so a rerun's A/B compares fp8 only). The new build's bf16 / fp8 GPU tests, memcheck
# and racecheck (the new synchronisation is mbarrier-based), then the A/B of the two builds, 3 rounds (fp8 at 8q/1kv
# runs the lean kernel: the control). Files in $OUT: tests.log, sanitizer.log, ab_amerge.json / .txt, log.txt.
#   LIMIT_S=240 bash bench/tools/v80_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v80_out /tmp/v80_work 240
start_stamps_build KVPACK_PIPE_ASYNC_MERGE=1 build-amerge 8 "kvpack_cli kvpack_gpu_tests"
apid=$stampspid
build_device kvpack_cli
wait $apid; stamp "amerge build rc=$?"
[ -x ./build-amerge/kvpack_gpu_tests ] || { tail -30 "$W/amerge_build.log" > "$OUT/amerge_build_tail.log"; exit 1; }
T=./build-amerge/kvpack_gpu_tests
gpu_tests tests 90 'DecodeGpu.RandomShapes*:DecodeGpu.LongContext*:DecodeGpu.Bitwise*:DecodeGpu.GraphCapture*:DecodeGpu.Empty*' \
  KVPACK_TEST_FORMATS=bf16,fp8
cp "$W/tests.log" "$OUT/"
sanitize_formats "$OUT/sanitizer.log" 40 'DecodeGpu.RandomShapesVsFp64Reference:DecodeGpu.GraphCapture*' fp8 bf16
GRID="--formats fp8,bf16 --shapes 32/8/128,8/1/128 --batch 1,8,32,64 --context 32768,131072 --iters 20"
[ "$(left)" -gt 20 ] && bench_ab "$W/ab_amerge" 3 base=./build-device/kvpack amerge=./build-amerge/kvpack
{ cat "$OUT/env.log"; rm -f "$OUT/env.log"
  echo "== tests (bf16, fp8; async merge)"; test_outcomes "$OUT/tests.log"
  echo "== sanitizers"; grep -E "^==|ERROR SUMMARY|RACECHECK SUMMARY|rc=|OK \]|FAILED" "$OUT/sanitizer.log"
  echo "== A/B async merge"; cat "$OUT/ab_ab_amerge.txt" 2>/dev/null; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
stamp "done"

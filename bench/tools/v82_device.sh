#!/usr/bin/env bash
# One device call (bench/NOTES.md v80-v82): main as it now stands (v80's merge without CTA barriers for bf16 only,
# the per-format default of KVPACK_PIPE_ASYNC_MERGE), the whole GPU suite; on an H200 also the A/B that the H100s
# could not answer: this build against KVPACK_PIPE_SWAP_K=0 (v79's question) and KVPACK_PIPE_ASYNC_MERGE=1 (fp8 too,
# v80's), 3 rounds. Files in $OUT: gpu_suite.log, ab_h200.json / .txt, log.txt.
#   LIMIT_S=420 bash bench/tools/v82_device.sh        (H200_AB=1 runs the A/B on any GPU)
source "$(dirname "$0")/device_env.sh" /tmp/v82_out /tmp/v82_work 420
h200=$(grep -c H200 "$OUT/env.log")
[ -n "${H200_AB:-}" ] && h200=1
if [ "$h200" -gt 0 ]; then
  start_stamps_build KVPACK_PIPE_SWAP_K=0 build-swap0 5; swap_pid=$stampspid
  start_stamps_build KVPACK_PIPE_ASYNC_MERGE=1 build-amerge 5; am_pid=$stampspid
  # v84: main before the merge's shared helpers (fp8's merge rescheduled, bf16's code unchanged), beside it.
  PATCH=bench/tools/v84.patch start_base_build /tmp/v84_pre 4; pre_pid=$basepid
fi
build_device kvpack_cli kvpack_gpu_tests
T=./build-device/kvpack_gpu_tests
timeout 240 $T > "$OUT/gpu_suite.log" 2>&1; stamp "gpu suite rc=$?"
if [ "$h200" -gt 0 ]; then
  wait $swap_pid; stamp "swap0 build rc=$?"
  wait $am_pid; stamp "amerge build rc=$?"
  wait $pre_pid; stamp "pre build rc=$?"
  GRID="--formats fp8,bf16 --shapes 32/8/128,8/1/128 --batch 1,8,32,64 --context 32768,131072 --iters 20"
  [ -x ./build-swap0/kvpack ] && [ -x ./build-amerge/kvpack ] && [ "$(left)" -gt 40 ] &&
    bench_ab "$W/ab_h200" 3 base=./build-device/kvpack swap0=./build-swap0/kvpack amerge1=./build-amerge/kvpack \
      $([ -x /tmp/v84_pre/build-device/kvpack ] && echo pre=/tmp/v84_pre/build-device/kvpack)
fi
{ cat "$OUT/env.log"; rm -f "$OUT/env.log"
  echo "== whole GPU suite"; grep -E "^\[==========\]|^\[  (FAILED|PASSED)|Failure" "$OUT/gpu_suite.log" | head -30
  echo "== A/B (H200): base = main, swap0 = KVPACK_PIPE_SWAP_K=0, amerge1 = KVPACK_PIPE_ASYNC_MERGE=1, pre = ab5a551"
  cat "$OUT/ab_ab_h200.txt" 2>/dev/null; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
stamp "done"

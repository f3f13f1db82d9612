#!/usr/bin/env bash
# One device call (bench/NOTES.md v80-v84): main with bench/tools/v84.patch applied (v84's merge helpers; v80's merge
# without CTA barriers for bf16 only, the per-format default of KVPACK_PIPE_ASYNC_MERGE), the whole GPU suite, then an
# A/B (3 rounds, fp8 / bf16): that build against main as it is (pre: fp8's merge SASS differs) on any GPU; on an
# H200 also against KVPACK_PIPE_SWAP_K=0 (v79's question) and KVPACK_PIPE_ASYNC_MERGE=1 (fp8 too, v80's), which the
# H100s answered already. Files in $OUT: gpu_suite.log, ab_h200.json / .txt, log.txt.
#   LIMIT_S=420 bash bench/tools/v82_device.sh        (H200_AB=1 runs the H200 variants on any GPU)
source "$(dirname "$0")/device_env.sh" /tmp/v82_out /tmp/v82_work 420
# v84 (the merge's chunk counter and shared helpers) is kept off main until a GPU has run it: applied here to the
# device's copy of the tree (main = pre, built beside it from the same patch reversed).
if patch -s -p1 --dry-run < bench/tools/v84.patch > /dev/null 2>&1; then
  patch -s -p1 < bench/tools/v84.patch; stamp "v84 applied"
fi
h200=$(grep -c H200 "$OUT/env.log")
[ -n "${H200_AB:-}" ] && h200=1
if [ "$h200" -gt 0 ]; then
  start_stamps_build KVPACK_PIPE_SWAP_K=0 build-swap0 5; swap_pid=$stampspid
  start_stamps_build KVPACK_PIPE_ASYNC_MERGE=1 build-amerge 5; am_pid=$stampspid
fi
PATCH=bench/tools/v84.patch start_base_build /tmp/v84_pre 4; pre_pid=$basepid
build_device kvpack_cli kvpack_gpu_tests
T=./build-device/kvpack_gpu_tests
timeout 240 $T > "$OUT/gpu_suite.log" 2>&1; stamp "gpu suite rc=$?"
wait $pre_pid; stamp "pre build rc=$?"
variants=(base=./build-device/kvpack)
[ -x /tmp/v84_pre/build-device/kvpack ] && variants+=(pre=/tmp/v84_pre/build-device/kvpack)
if [ "$h200" -gt 0 ]; then
  wait $swap_pid; stamp "swap0 build rc=$?"
  wait $am_pid; stamp "amerge build rc=$?"
  [ -x ./build-swap0/kvpack ] && variants+=(swap0=./build-swap0/kvpack)
  [ -x ./build-amerge/kvpack ] && variants+=(amerge1=./build-amerge/kvpack)
fi
GRID="--formats fp8,bf16 --shapes 32/8/128,8/1/128 --batch 1,8,32,64 --context 32768,131072 --iters 20"
[ ${#variants[@]} -gt 1 ] && [ "$(left)" -gt 40 ] && bench_ab "$W/ab_h200" 3 "${variants[@]}"
{ cat "$OUT/env.log"; rm -f "$OUT/env.log"
  echo "== whole GPU suite"; grep -E "^\[==========\]|^\[  (FAILED|PASSED)|Failure" "$OUT/gpu_suite.log" | head -30
  echo "== A/B: base = main + v84, pre = main, swap0 = KVPACK_PIPE_SWAP_K=0, amerge1 = KVPACK_PIPE_ASYNC_MERGE=1"
  cat "$OUT/ab_ab_h200.txt" 2>/dev/null; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
stamp "done"

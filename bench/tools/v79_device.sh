#!/usr/bin/env bash
# One device call (bench/NOTES.md v79): the warp pipeline's scores swap-AB (KVPACK_PIPE_SWAP_K=1, the default now;
# bf16 and fp8's regular kernel) against the query-as-A scores of v17-v78 (a second build with
# -DKVPACK_PIPE_SWAP_K=0). The new build's GPU tests for bf16 and fp8 (random shapes against fp64, 128k, bitwise
# identity across plans, graph replay), memcheck and racecheck of the bitwise test on fp8, then the A/B of the two
# builds, 3 rounds (fp8 at 8q/1kv runs the lean kernel: the control). Files in $OUT: tests.log, sanitizer.log,
# ncu_fp8_swap.txt, ab_swap.json / .txt, log.txt.
#   LIMIT_S=420 bash bench/tools/v79_device.sh        (SKIP_TESTS=1: build, ncu and A/B only)
source "$(dirname "$0")/device_env.sh" /tmp/v79_out /tmp/v79_work 420
start_stamps_build KVPACK_PIPE_SWAP_K=0 build-base 6
basepid=$stampspid
build_device kvpack_cli kvpack_gpu_tests
grep -E "decode_kernel" -A2 "$OUT/build.log" | grep -E "registers|spill" | sort | uniq -c > "$OUT/registers.txt"
T=./build-device/kvpack_gpu_tests
if [ -z "${SKIP_TESTS:-}" ]; then  # SKIP_TESTS=1: the A/B (and ncu) only, e.g. on a second GPU kind
gpu_tests tests 150 'DecodeGpu.RandomShapes*:DecodeGpu.LongContext*:DecodeGpu.Bitwise*:DecodeGpu.GraphCapture*:DecodeGpu.Empty*:DecodeStepGpu.*' \
  KVPACK_TEST_FORMATS=bf16,fp8
cp "$W/tests.log" "$OUT/"
sanitize_formats "$OUT/sanitizer.log" 70 'DecodeGpu.BitwiseIdenticalAcrossPlansBatchOrderAndRuns' fp8
fi
# The new kernel's profile at v78's cell (compare logs/20261207T2156_v78_ncu_fp8_regular_h100.txt on an H100).
NCU_TIMEOUT=60 ncu_one "$OUT/ncu_fp8_swap.txt" decode_kernel "--formats fp8 --shapes 32/8/128 --batch 32 --context 128k" \
  --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section InstructionStats
stamp "ncu"
wait $basepid; stamp "base build rc=$?"
if [ -x ./build-base/kvpack ]; then
  GRID="--formats fp8,bf16 --shapes 32/8/128,8/1/128 --batch 1,8,32,64 --context 32768,131072 --iters 20"
  [ "$(left)" -gt 60 ] && bench_ab "$W/ab_swap" 3 base=./build-base/kvpack swap=./build-device/kvpack
else
  tail -30 "$W/base_build.log" > "$OUT/base_build_tail.log"
fi
{ cat "$OUT/env.log"; rm -f "$OUT/env.log"
  echo "== registers (decode_kernel)"; cat "$OUT/registers.txt"
  echo "== tests (bf16, fp8)"; test_outcomes "$OUT/tests.log"
  echo "== sanitizers"; grep -E "^==|ERROR SUMMARY|RACECHECK SUMMARY|rc=|OK \]|FAILED" "$OUT/sanitizer.log"
  echo "== ncu fp8 (swap-AB)"; grep -E "Duration|DRAM Throughput|Issued Warp Per Scheduler|No Eligible|Active Warps Per|Eligible Warps|Executed Instructions  " "$OUT/ncu_fp8_swap.txt"
  echo "== A/B swap-AB scores"; cat "$OUT/ab_ab_swap.txt" 2>/dev/null; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
stamp "done"

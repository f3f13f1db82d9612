#!/usr/bin/env bash
# One device call (bench/NOTES.md v66): main as it is (v64 landed) on whatever GPU comes, ideally the H200 the targets
# are stated on (the last H200 grid was v54's). In order, each step's files written into $OUT as it ends:
#   1. build; tests of the write path and the dequantiser (v64's kernels): tests_first.log;
#   2. the full grid with --step and FlashInfer (carry [".whl"]): bench_fi.json, bench_log.txt;
#   2b. FP8V=1: fp8's lean kernel with the lazy max, tail masks and two score chains (v67) against main at 8q/1kv:
#      ab_fp8lazy.json / .txt;
#   3. ncu (--set full, --clock-control none) of fp8's lean kernel at 8q/1kv batch 64 x 128k, eager launches (where it
#      reads 69% of the bandwidth; v65's 3 CTAs per SM did not help): hot_fp8.txt;
#   4. memcheck of the small tests; log.txt.
#   FP8V=1 LIMIT_S=400 bash bench/tools/v66_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v66_out /tmp/v66_work 400
# FP8V=1 (v67, measurement): fp8's lean kernel with the q formats' lazy max, tail masks and two score chains
# (-DKVPACK_LEAN_FP8_LAZY=1), built beside (build-fp8v) and timed against main after the grid.
[ -n "${FP8V:-}" ] && start_stamps_build "KVPACK_LEAN_FP8_LAZY=1" build-fp8v 5
build_device kvpack_cli kvpack_gpu_tests kvpack_capi
T=./build-device/kvpack_gpu_tests
gpu_tests tests_first 60 'BlockCoreGpu.*:PagedWriteGpu.*:PagedDequantGpu.*'
cp "$W/tests_first.log" "$OUT/tests_first.log"
FI_BENCH="--formats bf16,fp8,int4,int4h,q4,q3.5,q3 --shapes 32/8/128,8/1/128 --batch 1,8,16,32,64 --context 8192,32768,65536,131072 --step"
fi_grid
{ grep -vE " write" "$W/fi/bench.log"; tail -40 "$W/fi/flashinfer.log"; } > "$OUT/bench_log.txt" 2>/dev/null
if [ -n "${FP8V:-}" ]; then
  wait $stampspid; stamp "fp8v build rc=$?"; tail -2 "$W/fp8v_build.log"
  mkdir -p "$W/fp8ab"
  G8="--formats fp8 --shapes 8/1/128 --batch 1,8,16,32,64 --context 32768,131072 --iters 30"
  for r in 1 2; do
    ./build-device/kvpack bench $G8 --json "$W/fp8ab/ab_base_$r.json" > /dev/null 2>&1
    ./build-fp8v/kvpack bench $G8 --json "$W/fp8ab/ab_lazy_$r.json" > /dev/null 2>&1
    stamp "fp8 A/B round $r"
    python3 bench/tools/ab_summary.py "$W/fp8ab" "$OUT/ab_fp8lazy.json" > "$OUT/ab_fp8lazy.txt"
  done
fi
if [ "$(left)" -gt 120 ]; then
  SKIP_BUILD=1 PROFILE_FORMATS=fp8 PROFILE_SHAPE=8/1/128 PROFILE_BATCH=64 PROFILE_CTX=128k PROFILE_KERNEL=lean_kernel \
    PROFILE_BENCH_ARGS=--eager NCU_ARGS="--clock-control none" timeout $(( $(left) - 40 )) \
    bash bench/tools/profile_device.sh > "$W/profile.log" 2>&1
  stamp "ncu rc=$?"
fi
memcheck_small 'PagedWriteGpu.OutOfRange*:PagedWriteGpu.DecodeStepOneToken*:DecodeStepGpu.BadArguments*'
{ cat "$OUT/env.log"; rm -f "$OUT/env.log"
  echo "== tests (first)"; test_outcomes "$W/tests_first.log"
  echo "== grid + flashinfer"; cat "$W/fi_stdout.log" 2>/dev/null
  echo "== fp8 lean lazy (A/B)"; cat "$OUT/ab_fp8lazy.txt" 2>/dev/null
  echo "== ncu"; tail -5 "$W/profile.log" 2>/dev/null
  echo "== sanitizers"; grep -E "^==|ERROR SUMMARY|rc=" "$W/sanitizer.log" 2>/dev/null; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
stamp "done"

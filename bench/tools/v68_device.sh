#!/usr/bin/env bash
# One device call (bench/NOTES.md v66-v68): fp8's decode kernels, regular and lean, converting the high e4m3 pair of
# a word without a shift first (v68: F2FP ... R.H1; the same conversion, the same bits) against main before v68 built
# beside it (this tree with bench/tools/v68.patch reversed), and v67's lazy max on top (a measurement build). In
# order, each step's files written into $OUT as it ends:
#   1. tests of fp8 (KVPACK_TEST_FORMATS=fp8): random shapes against fp64, 128k, the bitwise test, graph capture; the
#      dequantiser against the CPU decoder (every format): tests_first.log;
#   2. the A/B, fp8 at 8q/1kv (lean) and 32q/8kv (regular), batch 1-64 x 32k and 128k, base / new / lazy, 2 rounds
#      (the second in reverse order): ab_fp8.json, ab_fp8.txt;
#   3. ncu (--set full, clocks not locked) of the new build's lean fp8 launch at 8q/1kv 64 x 128k: hot_fp8.txt;
#   4. FI=1 (carry [".whl"]): the full grid with --step and FlashInfer: bench_fi.json, bench_log.txt; log.txt.
#   LIMIT_S=420 FI=1 bash bench/tools/v68_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v68_out /tmp/v68_work 420
PATCH=bench/tools/v68.patch
start_base_build /tmp/v68_base 5
start_stamps_build "KVPACK_LEAN_FP8_LAZY=1" build-fp8v 4
build_device kvpack_cli kvpack_gpu_tests
T=./build-device/kvpack_gpu_tests
gpu_tests tests_first 150 'DecodeGpu.RandomShapes*:DecodeGpu.LongContext*:DecodeGpu.Bitwise*:DecodeGpu.GraphCapture*:PagedDequantGpu.*' KVPACK_TEST_FORMATS=fp8
cp "$W/tests_first.log" "$OUT/tests_first.log"
wait $basepid; stamp "base build rc=$?"; ls /tmp/v68_base/build-device/kvpack > /dev/null || tail -20 "$W/base_build.log"
wait $stampspid; stamp "lazy build rc=$?"; ls build-fp8v/kvpack > /dev/null || tail -20 "$W/fp8v_build.log"
mkdir -p "$W/ab"
G="--formats fp8 --shapes 8/1/128,32/8/128 --batch 1,8,16,32,64 --context 32768,131072 --iters 30"
run_ab() { "$1" bench $G --json "$W/ab/ab_$2_$3.json" > /dev/null 2>&1; }
for r in 1 2; do
  if [ $r -eq 1 ]; then
    run_ab /tmp/v68_base/build-device/kvpack base $r; run_ab ./build-device/kvpack new $r; run_ab ./build-fp8v/kvpack lazy $r
  else
    run_ab ./build-fp8v/kvpack lazy $r; run_ab ./build-device/kvpack new $r; run_ab /tmp/v68_base/build-device/kvpack base $r
  fi
  stamp "A/B round $r"
  python3 bench/tools/ab_summary.py "$W/ab" "$OUT/ab_fp8.json" > "$OUT/ab_fp8.txt"
done
if [ "$(left)" -gt 150 ]; then
  SKIP_BUILD=1 PROFILE_FORMATS=fp8 PROFILE_SHAPE=8/1/128 PROFILE_BATCH=64 PROFILE_CTX=128k PROFILE_KERNEL=lean_kernel \
    PROFILE_BENCH_ARGS=--eager NCU_ARGS="--clock-control none" timeout $(( $(left) - 100 )) \
    bash bench/tools/profile_device.sh > "$W/profile.log" 2>&1
  stamp "ncu rc=$?"
fi
if [ -n "${FI:-}" ] && [ "$(left)" -gt 80 ]; then
  FI_BENCH="--formats bf16,fp8,int4,int4h,q4,q3.5,q3 --shapes 32/8/128,8/1/128 --batch 1,8,16,32,64 --context 8192,32768,65536,131072 --step"
  fi_grid
  { grep -vE " write" "$W/fi/bench.log"; tail -40 "$W/fi/flashinfer.log"; } > "$OUT/bench_log.txt" 2>/dev/null
fi
{ cat "$OUT/env.log"; rm -f "$OUT/env.log"
  echo "== build (fp8 kernels)"; grep -E "Fp8Policy|lean_kernelILi128ELi0E" -A2 "$OUT/build.log" | grep -E "registers|spill" | sort | uniq -c
  echo "== tests (fp8)"; test_outcomes "$W/tests_first.log"
  echo "== A/B fp8"; cat "$OUT/ab_fp8.txt"
  echo "== ncu"; tail -5 "$W/profile.log" 2>/dev/null
  echo "== grid + flashinfer"; cat "$W/fi_stdout.log" 2>/dev/null; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
stamp "done"

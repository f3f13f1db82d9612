#!/usr/bin/env bash
# One device call (bench/NOTES.md v69): fp8's lean kernel copying K by whole 128-byte rows (KVPACK_LEAN_KROWS=1, a
# path in the kernel since v32 that never ran on a GPU) against the default (each K copy instruction 8 rows x 64
# bytes: half of 8 lines), in one binary. v68's ncu put that launch at 87% of the L2's throughput with DRAM at 70%.
# In order, each step's files written into $OUT as it ends:
#   1. fp8's decode tests with KVPACK_LEAN_KROWS=1 (KVPACK_TEST_FORMATS=fp8: random shapes vs fp64, 128k, the bitwise
#      test, graph capture; the lean path is fp8's at one kv head): tests_krows.log;
#   2. the A/B, fp8 at 8q/1kv batch 1-64 x 32k and 128k, KROWS 0 / 1, 3 rounds (alternating who goes first):
#      ab_krows.json, ab_krows.txt;
#   3. ncu of the launch at 8q/1kv 64 x 128k with KROWS=1 (compare bench/results/logs/*v68_ncu_hot_fp8_lean*):
#      hot_fp8.txt;
#   4. ncu of the regular fp8 kernel at 32q/8kv 64 x 128k: regular/hot_fp8.txt; log.txt.
#   LIMIT_S=300 bash bench/tools/v69_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v69_out /tmp/v69_work 300
build_device kvpack_cli kvpack_gpu_tests
T=./build-device/kvpack_gpu_tests
gpu_tests tests_krows 120 'DecodeGpu.RandomShapes*:DecodeGpu.LongContext*:DecodeGpu.Bitwise*:DecodeGpu.GraphCapture*' \
  KVPACK_TEST_FORMATS=fp8 KVPACK_LEAN_KROWS=1
cp "$W/tests_krows.log" "$OUT/tests_krows.log"
GRID="--formats fp8 --shapes 8/1/128 --batch 1,8,16,32,64 --context 32768,131072 --iters 30"
for r in 1 2 3; do
  if [ $((r % 2)) -eq 1 ]; then ab_bench base $r KVPACK_LEAN_KROWS=0; ab_bench krows $r KVPACK_LEAN_KROWS=1
  else ab_bench krows $r KVPACK_LEAN_KROWS=1; ab_bench base $r KVPACK_LEAN_KROWS=0; fi
  stamp "A/B round $r"
  python3 bench/tools/ab_summary.py "$W" "$OUT/ab_krows.json" > "$OUT/ab_krows.txt"
done
if [ "$(left)" -gt 60 ]; then
  KVPACK_LEAN_KROWS=1 SKIP_BUILD=1 PROFILE_FORMATS=fp8 PROFILE_SHAPE=8/1/128 PROFILE_BATCH=64 PROFILE_CTX=128k \
    PROFILE_KERNEL=lean_kernel PROFILE_BENCH_ARGS=--eager NCU_ARGS="--clock-control none" timeout 90 \
    bash bench/tools/profile_device.sh > "$W/profile.log" 2>&1
  stamp "ncu rc=$?"
fi
# The regular fp8 kernel too (32q/8kv 64 x 128k, 85-87% of the bandwidth; v29's profile read L2 81% / DRAM 73%):
# whether its copies have the same excess, into $OUT/regular/hot_fp8.txt.
if [ "$(left)" -gt 60 ]; then
  mkdir -p "$OUT/regular"
  OUT="$OUT/regular" SKIP_BUILD=1 PROFILE_FORMATS=fp8 PROFILE_SHAPE=32/8/128 PROFILE_BATCH=64 PROFILE_CTX=128k \
    PROFILE_KERNEL=decode_kernel PROFILE_BENCH_ARGS=--eager NCU_ARGS="--clock-control none" \
    timeout $(( $(left) - 15 )) bash bench/tools/profile_device.sh > "$W/profile_regular.log" 2>&1
  stamp "ncu (regular) rc=$?"
fi
{ cat "$OUT/env.log"; rm -f "$OUT/env.log"
  echo "== tests (fp8, KROWS=1)"; test_outcomes "$W/tests_krows.log"
  echo "== A/B KROWS"; cat "$OUT/ab_krows.txt"
  echo "== ncu (lean, KROWS=1)"; grep -E "DRAM Throughput|L2 Cache Throughput|Duration" "$OUT/hot_fp8.txt" 2>/dev/null
  echo "== ncu (regular, 32q/8kv)"; grep -E "DRAM Throughput|L2 Cache Throughput|Duration" "$OUT/regular/hot_fp8.txt" 2>/dev/null
  } > "$OUT/log.txt"
rm -f "$OUT/build.log"
stamp "done"

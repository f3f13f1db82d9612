#!/usr/bin/env bash
# One device call (bench/NOTES.md v73, v74), each step's files written into $OUT as it ends:
#   1. tests: fp8's decode tests with KVPACK_LEAN_VROWS=1 and =2 (KVPACK_TEST_FORMATS=fp8), and
#      DecodeGpu.LeanGroupFoldGivesTheSameBits (v74): tests_vrows1.log, tests_vrows2.log, tests_group.log;
#   2. ncu sector counts of lean fp8 at 8q/1kv 64 x 128k, VROWS 0 / 1 / 2: ncu_vrows{0,1,2}.txt;
#   3. A/B in one binary, 3 rounds (order alternating): fp8 8q/1kv batch 1-64 x 32k and 128k, VROWS 0 / 1 / 2
#      (ab_vrows.json/.txt); q4, q3.5, q3 at 8q/1kv and 32q/8kv batch 8-64 x 32k / 128k, KVPACK_LEAN_GROUP_FOLD 0 / 1
#      (ab_group.json/.txt);
#   4. q4's kernels alone at large cells (KVPACK_LEAN_ONLY 2 / 6 / 7): parts_q4.txt;
#   5. (carry [".whl"]) ncu of XQA at 32q/8kv batch 32 and 64 x 128k beside kvpack q4 / fp8: ncu_xqa.txt.
#   LIMIT_S=560 bash bench/tools/v74_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v74_out /tmp/v74_work 560
build_device kvpack_cli kvpack_gpu_tests
lean_registers > "$OUT/registers.txt"
T=./build-device/kvpack_gpu_tests
F='DecodeGpu.RandomShapes*:DecodeGpu.LongContext*:DecodeGpu.Bitwise*:DecodeGpu.GraphCapture*:DecodeGpu.LeanMerge*'
for v in 1 2; do
  gpu_tests tests_vrows$v 80 "$F" KVPACK_TEST_FORMATS=fp8 KVPACK_LEAN_VROWS=$v
  cp "$W/tests_vrows$v.log" "$OUT/"
done
gpu_tests tests_group 100 'DecodeGpu.LeanGroupFold*:DecodeGpu.LeanMergeSlice*'
cp "$W/tests_group.log" "$OUT/"
CELL="--formats fp8 --shapes 8/1/128 --batch 64 --context 128k"
M=l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_ltcfabric.sum,lts__t_tag_requests.avg.pct_of_peak_sustained_elapsed,lts__t_sectors.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,gpu__time_duration.sum
for v in 0 1 2; do
  [ "$(left)" -gt 200 ] || break
  KVPACK_LEAN_VROWS=$v ncu_one "$OUT/ncu_vrows$v.txt" lean_kernel "$CELL" --metrics $M
done
stamp "ncu"
GRID="--formats fp8 --shapes 8/1/128 --batch 1,8,16,32,64 --context 32768,131072 --iters 30"
ab_env "$W/abv" vrows 3 KVPACK_LEAN_VROWS 0 1 2
GRID="--formats q4,q3.5,q3 --shapes 8/1/128,32/8/128 --batch 8,32,64 --context 32768,131072 --iters 20"
ab_env "$W/abg" group 3 KVPACK_LEAN_GROUP_FOLD 0 1
for only in 2 6 7; do
  [ "$(left)" -gt 90 ] || break
  KVPACK_LEAN_ONLY=$only ./build-device/kvpack bench --formats q4 --shapes 8/1/128,32/8/128 --batch 32,64 \
    --context 32768,131072 --iters 20 2>&1 | grep -E "^q4 .*us" | sed "s/^/only=$only /" >> "$OUT/parts_q4.txt"
done
stamp "parts"
XM=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_ltcfabric.sum,lts__t_sectors.avg.pct_of_peak_sustained_elapsed,lts__t_tag_requests.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,launch__shared_mem_per_block_dynamic,sm__warps_active.avg.pct_of_peak_sustained_active,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum
if [ "$(left)" -gt 80 ] && fi_site; then
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  for b in 32 64; do
    [ "$(left)" -gt 50 ] || break
    echo "== xqa 32q/8kv b=$b 128k" >> "$OUT/ncu_xqa.txt"
    PYTHONPATH=/tmp/site FLASHINFER_WORKSPACE_BASE=/tmp/fiws timeout 45 $ncu --kernel-name regex:'kernel_mha|xqa|mha' \
      --launch-skip 2 --launch-count 1 --clock-control none --metrics $XM python3 bench/flashinfer/fi_bench.py \
      --impls xqa --shapes 32/8/128 --batch $b --context 131072 --iters 2 --no-graph --no-check --no-probe \
      --out "$W/xqa_$b.json" 2>&1 | grep -vE "^==PROF==|^\s*$" | tail -30 >> "$OUT/ncu_xqa.txt"
  done
  for f in q4 fp8; do
    [ "$(left)" -gt 20 ] || break
    echo "== kvpack $f 32q/8kv b=32 128k" >> "$OUT/ncu_xqa.txt"
    ncu_one "$OUT/ncu_xqa.txt" 'lean_kernel|decode_kernel' "--formats $f --shapes 32/8/128 --batch 32 --context 128k" --metrics $XM
  done
  stamp "ncu xqa"
fi
{ cat "$OUT/env.log"; rm -f "$OUT/env.log"
  echo "== registers"; cat "$OUT/registers.txt"
  for t in tests_vrows1 tests_vrows2 tests_group; do echo "== $t"; test_outcomes "$W/$t.log"; done
  for v in 0 1 2; do echo "== ncu VROWS=$v"; grep -E "l1tex__|lts__|duration" "$OUT/ncu_vrows$v.txt" 2>/dev/null; done
  echo "== A/B VROWS"; cat "$OUT/ab_vrows.txt" 2>/dev/null
  echo "== A/B GROUP_FOLD"; cat "$OUT/ab_group.txt" 2>/dev/null
  echo "== parts q4"; cat "$OUT/parts_q4.txt" 2>/dev/null
  echo "== ncu xqa"; grep -E "==|duration|dram__|lts__|launch__|warps_active|l1tex" "$OUT/ncu_xqa.txt" 2>/dev/null; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
stamp "done"

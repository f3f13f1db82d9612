#!/usr/bin/env bash
# One device call (bench/NOTES.md v73): fp8's lean V copies by whole sectors (KVPACK_LEAN_VROWS=1: 128-byte rows,
# 2: 32-byte sector pairs, conflict-free shared stores) against the default (every lane copies its own pieces: a
# quad's 4 lanes read halves of 4 sectors; v72's ncu: L1's global load sectors 1.5x the data). In order, each step's
# files written into $OUT as it ends:
#   1. fp8's decode tests with VROWS=1 and =2 (KVPACK_TEST_FORMATS=fp8): tests_vrows1.log, tests_vrows2.log;
#   2. ncu sector counts of the launch at 8q/1kv 64 x 128k, VROWS 0 / 1 / 2: ncu_vrows{0,1,2}.txt;
#   3. the A/B in one binary, fp8 8q/1kv batch 1-64 x 32k and 128k, 3 rounds (order alternating): ab_vrows.json/.txt.
#   LIMIT_S=480 bash bench/tools/v73_device.sh   (carry [".whl"] for step 4)
source "$(dirname "$0")/device_env.sh" /tmp/v73_out /tmp/v73_work 420
build_device kvpack_cli kvpack_gpu_tests
T=./build-device/kvpack_gpu_tests
F='DecodeGpu.RandomShapes*:DecodeGpu.LongContext*:DecodeGpu.Bitwise*:DecodeGpu.GraphCapture*:DecodeGpu.LeanMerge*'
for v in 1 2; do
  gpu_tests tests_vrows$v 100 "$F" KVPACK_TEST_FORMATS=fp8 KVPACK_LEAN_VROWS=$v
  cp "$W/tests_vrows$v.log" "$OUT/"
done
CELL="--formats fp8 --shapes 8/1/128 --batch 64 --context 128k"
M=l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_ltcfabric.sum,lts__t_tag_requests.avg.pct_of_peak_sustained_elapsed,lts__t_sectors.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,gpu__time_duration.sum
for v in 0 1 2; do
  [ "$(left)" -gt 100 ] || break
  KVPACK_LEAN_VROWS=$v ncu_one "$OUT/ncu_vrows$v.txt" lean_kernel "$CELL" --metrics $M
done
stamp "ncu"
GRID="--formats fp8 --shapes 8/1/128 --batch 1,8,16,32,64 --context 32768,131072 --iters 30"
for r in 1 2 3; do
  [ "$(left)" -gt 40 ] || break
  if [ $((r % 2)) -eq 1 ]; then order="0 1 2"; else order="2 1 0"; fi
  for v in $order; do
    name=base; [ $v -gt 0 ] && name=vrows$v
    ab_bench $name $r KVPACK_LEAN_VROWS=$v
  done
  stamp "A/B round $r"
  python3 bench/tools/ab_summary.py "$W" "$OUT/ab_vrows.json" > "$OUT/ab_vrows.txt"
done
# 4. (carry [".whl"]) How XQA reaches ~3.0 TB/s at 32q/8kv batch 32 x 128k on the H100 (98% of the streaming probe;
#    2.67 at batch 64; our kernels stop at 85-87%): ncu's L2 / fabric / DRAM counts and launch geometry of its kernel
#    at batch 32 and 64, next to kvpack q4 and fp8 at batch 32: ncu_xqa.txt.
XM=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_ltcfabric.sum,lts__t_sectors.avg.pct_of_peak_sustained_elapsed,lts__t_tag_requests.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,launch__shared_mem_per_block_dynamic,sm__warps_active.avg.pct_of_peak_sustained_active,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum
FI_TAR=$(ls .whl/flashinfer-*.tar.xz 2>/dev/null | head -1)
if [ -n "$FI_TAR" ] && [ "$(left)" -gt 90 ]; then
  mkdir -p /tmp/site
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
  tar -xJf "$FI_TAR" -C /tmp/site
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  for b in 32 64; do
    [ "$(left)" -gt 60 ] || break
    echo "== xqa 32q/8kv b=$b 128k" >> "$OUT/ncu_xqa.txt"
    PYTHONPATH=/tmp/site FLASHINFER_WORKSPACE_BASE=/tmp/fiws timeout 60 $ncu --kernel-name regex:'kernel_mha|xqa|mha' \
      --launch-skip 2 --launch-count 1 --clock-control none --metrics $XM python3 bench/flashinfer/fi_bench.py \
      --impls xqa --shapes 32/8/128 --batch $b --context 131072 --iters 2 --no-graph --no-check --no-probe \
      --out "$W/xqa_$b.json" 2>&1 | grep -vE "^==PROF==|^\s*$" | tail -30 >> "$OUT/ncu_xqa.txt"
  done
  for f in q4 fp8; do
    [ "$(left)" -gt 30 ] || break
    echo "== kvpack $f 32q/8kv b=32 128k" >> "$OUT/ncu_xqa.txt"
    ncu_one "$OUT/ncu_xqa.txt" 'lean_kernel|decode_kernel' "--formats $f --shapes 32/8/128 --batch 32 --context 128k" --metrics $XM
  done
  stamp "ncu xqa"
fi
# 5. Where q4's time goes at large cells (the partials' traffic, v48's open lead): each kernel alone
#    (KVPACK_LEAN_ONLY: 2 = the lean kernel, 6 = + the merge, 7 = all), q4 8q/1kv and 32q/8kv: parts_q4.txt.
for only in 2 6 7; do
  [ "$(left)" -gt 25 ] || break
  KVPACK_LEAN_ONLY=$only ./build-device/kvpack bench --formats q4 --shapes 8/1/128,32/8/128 --batch 8,32,64 \
    --context 32768,131072 --iters 20 2>&1 | grep -E "^q4 .*us" | sed "s/^/only=$only /" >> "$OUT/parts_q4.txt"
done
# ... and the split counts a warp-folds-whole-groups mode would run (16 warps per (sequence, kv head) at 128k: one
# fold group of 16 chunks each; here still one partial per chunk), against the plan's (one warp per chunk).
for sp in 16 32 64; do
  [ "$(left)" -gt 20 ] || break
  ./build-device/kvpack bench --formats q4 --shapes 8/1/128,32/8/128 --batch 32,64 --context 131072 --iters 20 \
    --splits $sp --leaf 0 2>&1 | grep -E "^q4 .*us" | sed "s/^/splits=$sp /" >> "$OUT/parts_q4.txt"
done
stamp "parts"
{ cat "$OUT/env.log"; rm -f "$OUT/env.log"
  for v in 1 2; do echo "== tests (fp8, VROWS=$v)"; test_outcomes "$W/tests_vrows$v.log"; done
  for v in 0 1 2; do echo "== ncu VROWS=$v"; grep -E "l1tex__|lts__|duration" "$OUT/ncu_vrows$v.txt" 2>/dev/null; done
  echo "== A/B VROWS"; cat "$OUT/ab_vrows.txt"
  echo "== parts q4"; cat "$OUT/parts_q4.txt" 2>/dev/null
  echo "== ncu xqa"; grep -E "==|duration|dram__|lts__|launch__|warps_active|l1tex" "$OUT/ncu_xqa.txt" 2>/dev/null; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
stamp "done"

#!/usr/bin/env bash
# One device call (bench/NOTES.md v70): where lean fp8's L2 traffic comes from, the grid on whatever card comes, and
# the whole GPU suite. In order, each step's files written into $OUT as it ends:
#   1. ncu, no full set: the L2's and DRAM's throughput broken down into their sub-metrics (`breakdown:`), then the L2
#      sectors by source unit and hit / miss, of three launches at 64 x 128k: lean fp8 and lean q4 at 8q/1kv (v68 / v69:
#      L2 85-87% against DRAM 68-70%, q4 85% / 85%), the regular fp8 kernel at 32q/8kv (87% / 82%): l2_<name>.txt;
#   2. the lean path's phase stamps (KVPACK_LEAN_STAMPS build, bench/NOTES.md v47; the last ones are v48's) of the
#      cells the q formats miss by their fixed costs: q4 8q/1kv batch 1-32 x 32k / 64k, 32q/8kv 8 x 32k, and lean fp8
#      beside them: stamps.txt;
#   3. FI=1 (carry [".whl"]): the full grid with --step and FlashInfer: bench_fi.json, bench_log.txt;
#   4. the whole GPU suite (every format) within what is left: tests.log; log.txt.
#   LIMIT_S=480 FI=1 bash bench/tools/v70_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v70_out /tmp/v70_work 480
start_stamps_build
build_device kvpack_cli kvpack_gpu_tests
T=./build-device/kvpack_gpu_tests
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
# l2_breakdown NAME FORMAT SHAPE KERNEL_REGEX: two ncu runs of the 4th matching launch at batch 64 x 128k (each its
# own run, so that an unknown metric name costs only its own half) into $OUT/l2_NAME.txt.
l2_breakdown() {
  local name=$1 fmt=$2 shape=$3 kern=$4
  local run="./build-device/kvpack bench --formats $fmt --shapes $shape --batch 64 --context 128k --iters 5 --eager"
  { echo "== breakdown"
    timeout 60 $NCU --kernel-name regex:$kern --launch-skip 3 --launch-count 1 --clock-control none \
      --metrics breakdown:lts__throughput.avg.pct_of_peak_sustained_elapsed,breakdown:dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum \
      $run 2>&1 | grep -vE "^==PROF==|^\s*$" | tail -60
    echo "== sectors"
    timeout 60 $NCU --kernel-name regex:$kern --launch-skip 3 --launch-count 1 --clock-control none \
      --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors.sum,lts__t_requests.sum,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,lts__t_sectors_op_atom.sum,lts__t_sectors_op_red.sum,lts__t_sectors_lookup_hit.sum,lts__t_sectors_lookup_miss.sum,lts__t_sectors_srcunit_tex.sum,lts__t_sectors_srcunit_ltcfabric.sum,lts__t_sectors_srcnode_gpc.sum,lts__d_sectors_fill_sysmem.sum,lts__d_sectors_fill_device.sum \
      $run 2>&1 | grep -vE "^==PROF==|^\s*$" | tail -30
  } > "$OUT/l2_$name.txt" 2>&1
  stamp "ncu $name"
}
l2_breakdown fp8_lean fp8 8/1/128 lean_kernel
l2_breakdown q4_lean q4 8/1/128 lean_kernel
l2_breakdown fp8_regular fp8 32/8/128 decode_kernel
wait $stampspid; stamp "stamps build rc=$?"
if [ -x build-stamps/kvpack ]; then
  for g in "--formats q4 --shapes 8/1/128 --batch 1,8,16,32 --context 32768,65536" \
           "--formats q4 --shapes 32/8/128 --batch 8 --context 32768" \
           "--formats fp8 --shapes 8/1/128 --batch 8,16 --context 32768"; do
    KVPACK_STAMPS_OUT="$W/stamps_raw.txt" ./build-stamps/kvpack bench $g --iters 10 > /dev/null 2>&1
  done
  python3 bench/tools/stamps.py "$W/stamps_raw.txt" > "$OUT/stamps.txt" 2>&1; stamp "stamps"
else
  tail -20 "$W/stamps_build.log" > "$OUT/stamps.txt"
fi
if [ -n "${FI:-}" ] && [ "$(left)" -gt 120 ]; then
  FI_BENCH="--formats bf16,fp8,int4,int4h,q4,q3.5,q3 --shapes 32/8/128,8/1/128 --batch 1,8,16,32,64 --context 8192,32768,65536,131072 --step"
  fi_grid
  { grep -vE " write" "$W/fi/bench.log"; tail -40 "$W/fi/flashinfer.log"; } > "$OUT/bench_log.txt" 2>/dev/null
fi
if [ "$(left)" -gt 40 ]; then
  gpu_tests tests $(( $(left) - 15 )) '*'
  cp "$W/tests.log" "$OUT/tests.log"
fi
{ cat "$OUT/env.log"; rm -f "$OUT/env.log"
  for f in "$OUT"/l2_*.txt; do echo "== $f"; grep -E "lts__throughput|dram__throughput|duration|ltcfabric|lookup|srcunit_tex " "$f" | head -30; done
  echo "== grid + flashinfer"; tail -5 "$W/fi_stdout.log" 2>/dev/null
  echo "== tests"; test_outcomes "$W/tests.log"; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
stamp "done"

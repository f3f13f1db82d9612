#!/usr/bin/env bash
# One device call (bench/NOTES.md v73): fp8's lean V copies by whole sectors (KVPACK_LEAN_VROWS=1: 128-byte rows,
# 2: 32-byte sector pairs, conflict-free shared stores) against the default (every lane copies its own pieces: a
# quad's 4 lanes read halves of 4 sectors; v72's ncu: L1's global load sectors 1.5x the data). In order, each step's
# files written into $OUT as it ends:
#   1. fp8's decode tests with VROWS=1 and =2 (KVPACK_TEST_FORMATS=fp8): tests_vrows1.log, tests_vrows2.log;
#   2. ncu sector counts of the launch at 8q/1kv 64 x 128k, VROWS 0 / 1 / 2: ncu_vrows{0,1,2}.txt;
#   3. the A/B in one binary, fp8 8q/1kv batch 1-64 x 32k and 128k, 3 rounds (order alternating): ab_vrows.json/.txt.
#   LIMIT_S=420 bash bench/tools/v73_device.sh
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
{ cat "$OUT/env.log"; rm -f "$OUT/env.log"
  for v in 1 2; do echo "== tests (fp8, VROWS=$v)"; test_outcomes "$W/tests_vrows$v.log"; done
  for v in 0 1 2; do echo "== ncu VROWS=$v"; grep -E "l1tex__|lts__|duration" "$OUT/ncu_vrows$v.txt" 2>/dev/null; done
  echo "== A/B VROWS"; cat "$OUT/ab_vrows.txt"; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
stamp "done"

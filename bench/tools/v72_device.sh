#!/usr/bin/env bash
# One device call (bench/NOTES.md, "The GPU suite's CPU side on all threads", and v71's open question): the whole GPU
# suite timed with the tests' CPU work on all threads, then lean fp8's loads: where its 0.85 GB of read sectors beyond
# the data come from (ncu's memory tables per instruction kind, --print-details all; KROWS 0 / 1 with v71's stores),
# then the grid with FlashInfer (H200 if one comes; FI=1, carry [".whl"]). Files in $OUT: tests.log, ncu_krows0.txt,
# ncu_krows1.txt, bench_fi.json, log.txt.
#   LIMIT_S=540 FI=1 bash bench/tools/v72_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v72_out /tmp/v72_work 540
build_device kvpack_cli kvpack_gpu_tests
T=./build-device/kvpack_gpu_tests
gpu_tests tests 300 '*'
cp "$W/tests.log" "$OUT/tests.log"
CELL="--formats fp8 --shapes 8/1/128 --batch 64 --context 128k"
for kr in 0 1; do
  [ "$(left)" -gt 60 ] || break
  export KVPACK_LEAN_KROWS=$kr
  ncu_one "$OUT/ncu_krows$kr.txt" lean_kernel "$CELL" --section MemoryWorkloadAnalysis_Tables --print-details all
  ncu_one "$OUT/ncu_krows$kr.txt" lean_kernel "$CELL" --metrics lts__t_requests_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,gpu__time_duration.sum
  unset KVPACK_LEAN_KROWS
  stamp "ncu krows=$kr"
done
if [ -n "${FI:-}" ] && [ "$(left)" -gt 120 ]; then
  FI_BENCH="--formats bf16,fp8,int4,int4h,q4,q3.5,q3 --shapes 32/8/128,8/1/128 --batch 1,8,16,32,64 --context 8192,32768,65536,131072 --step"
  fi_grid
fi
{ cat "$OUT/env.log"; rm -f "$OUT/env.log"
  echo "== tests"; grep -E "^\[  (FAILED|PASSED)|^\[       OK|Failure" "$OUT/tests.log" | head -40
  for kr in 0 1; do echo "== ncu krows=$kr"; grep -E "l1tex__|lts__|duration" "$OUT/ncu_krows$kr.txt"; done
  echo "== grid + flashinfer"; tail -5 "$W/fi_stdout.log" 2>/dev/null; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
stamp "done"

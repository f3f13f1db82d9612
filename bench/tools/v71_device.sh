#!/usr/bin/env bash
# One device call (bench/NOTES.md v71): lean fp8's chunk partial stored in whole sectors (KVPACK_LEAN_FP8_ST=2, the
# default now: lane pairs swap a quarter, then 16-byte stores) against the 4-byte stores before it (=0, built beside
# it), and the GPU tests v70's call did not reach. In order, each step's files written into $OUT as it ends:
#   1. tests: fp8's decode tests (random shapes vs fp64, 128k, the bitwise test, graph capture), then every format's
#      tests v70 did not reach (merge slice counts, mixed grid, graph capture, decode_step, bad arguments): tests.log;
#   2. the A/B, fp8 at 8q/1kv (the lean kernel) batch 1-64 x 32k and 128k, base (=0) / st2, 3 rounds alternating:
#      ab_st.json, ab_st.txt;
#   3. ncu of the launch at 8q/1kv 64 x 128k, both builds: L2 requests and sectors by source and op, and the memory
#      tables per instruction kind: ncu_st0.txt, ncu_st2.txt; log.txt.
#   LIMIT_S=300 bash bench/tools/v71_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v71_out /tmp/v71_work 300
start_stamps_build "KVPACK_LEAN_FP8_ST=0" build-st0 6
build_device kvpack_cli kvpack_gpu_tests
T=./build-device/kvpack_gpu_tests
gpu_tests tests_fp8 100 'DecodeGpu.RandomShapes*:DecodeGpu.LongContext*:DecodeGpu.Bitwise*:DecodeGpu.GraphCapture*' \
  KVPACK_TEST_FORMATS=fp8
gpu_tests tests_rest 100 'DecodeGpu.LeanMergeSlice*:DecodeGpu.LeanMixedGrid*:DecodeGpu.GraphCapture*:DecodeStepGpu.*:DecodeGpu.BadArguments*'
cat "$W/tests_fp8.log" "$W/tests_rest.log" > "$OUT/tests.log"
wait $stampspid; stamp "st0 build rc=$?"; ls build-st0/kvpack > /dev/null || tail -20 "$W/st0_build.log"
GRID="--formats fp8 --shapes 8/1/128 --batch 1,8,16,32,64 --context 32768,131072 --iters 30"
bench_ab "$W/st" 3 base=./build-st0/kvpack st2=./build-device/kvpack
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for v in st0:./build-st0/kvpack st2:./build-device/kvpack; do
  [ "$(left)" -gt 25 ] || break
  timeout $(( $(left) - 10 )) $NCU --kernel-name regex:lean_kernel --launch-skip 3 --launch-count 1 --clock-control none \
    --section MemoryWorkloadAnalysis_Tables \
    --metrics lts__t_requests_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_write.sum,lts__t_requests_srcunit_ltcfabric.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum,lts__t_sectors_srcunit_ltcfabric.sum,lts__t_tag_requests.avg.pct_of_peak_sustained_elapsed,lts__ltcfabric2ltc_cycles_active.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,gpu__time_duration.sum \
    "${v#*:}" bench --formats fp8 --shapes 8/1/128 --batch 64 --context 128k --iters 5 --eager 2>&1 \
    | grep -vE "^==PROF==|^\s*$" > "$OUT/ncu_${v%%:*}.txt"
  stamp "ncu ${v%%:*}"
done
{ cat "$OUT/env.log"; rm -f "$OUT/env.log"
  echo "== tests"; test_outcomes "$OUT/tests.log"
  echo "== A/B"; cat "$OUT/ab_st.txt"
  for v in st0 st2; do echo "== ncu $v"; grep -E "lts__|dram__|duration" "$OUT/ncu_$v.txt"; done; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
stamp "done"

#!/usr/bin/env bash
# One device call (bench/NOTES.md v64, v64b): the plain write kernels coarsened (fp8 4 tokens per thread, int4 and
# int4h 2; the index arithmetic, the slot's page by shifts, and fp8's scale load and reciprocal shared; every load
# issued before the first slot check; fp8 converting pairs with one cvt; sanitize() and int4's clamp / |x| as min /
# max; v64b: int4h's rotation across the lanes of a vector) against main built beside it. bench/tools/v64.patch (src,
# include, and the GPU test of the pair conversion) is applied to the device's copy of the tree first; the base is
# that copy with the patch reversed (main). In order, each step's files
# written into $OUT as it ends:
#   1. tests: BlockCoreGpu.* (e4m3 and the new pair conversion against the host over 5 M inputs), PagedWriteGpu.*,
#      PagedDequantGpu.*: tests_first.log (DecodeStepGpu.* after step 3, in what time is left);
#   2. the write A/B (bf16, fp8, int4, int4h, q4; launches of 1, 8, 64 and 65,536 tokens; ROUNDS rounds, default 3,
#      base and new alternating who goes first): ab_write.json, ab_write.txt;
#   3. WSTAMPS=1: the small q write's phase clocks (a -DKVPACK_WRITE_STAMPS build beside it, bench/NOTES.md v62):
#      wstamps.txt;
#   4. memcheck of the small write tests; log.txt.
#   LIMIT_S=420 WSTAMPS=1 bash bench/tools/v64_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v64_out /tmp/v64_work 420
PATCH=bench/tools/v64.patch
# v64 / v64b are kept off main until a GPU has run them: applied here to the device's copy of the tree (skipped when
# the tree has them already); main as it is becomes the base.
if patch -p1 -N -s --dry-run < "$PATCH" > /dev/null 2>&1; then patch -p1 -N -s < "$PATCH" && stamp "v64 applied"; fi
start_base_build /tmp/v64_base 5
if [ -n "${WSTAMPS:-}" ]; then
  (cmake -S . -B build-wstamps -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPACK_GPU_ONLY=ON -DKVPACK_CUDA_ARCHS=90a-real \
     -DCMAKE_CUDA_FLAGS=-DKVPACK_WRITE_STAMPS > "$W/wstamps_build.log" 2>&1 && cmake --build build-wstamps -j4 \
     --target kvpack_cli >> "$W/wstamps_build.log" 2>&1) &
  wstampspid=$!
fi
build_device kvpack_cli kvpack_gpu_tests kvpack_capi
T=./build-device/kvpack_gpu_tests
gpu_tests tests_first 60 'BlockCoreGpu.*:PagedWriteGpu.*:PagedDequantGpu.*'
cp "$W/tests_first.log" "$OUT/tests_first.log"
wait $basepid; stamp "base build rc=$?"; ls /tmp/v64_base/build-device/kvpack > /dev/null || tail -20 "$W/base_build.log"
GRID="--formats bf16,fp8,int4,int4h,q4 --shapes 8/1/128,32/8/128 --batch 1,8,64 --context 8192 --iters 30"
for r in $(seq 1 ${ROUNDS:-3}); do
  if [ $((r % 2)) -eq 1 ]; then
    /tmp/v64_base/build-device/kvpack bench $GRID --json "$W/ab_base_$r.json" > /dev/null 2>&1
    ./build-device/kvpack bench $GRID --json "$W/ab_new_$r.json" > /dev/null 2>&1
  else
    ./build-device/kvpack bench $GRID --json "$W/ab_new_$r.json" > /dev/null 2>&1
    /tmp/v64_base/build-device/kvpack bench $GRID --json "$W/ab_base_$r.json" > /dev/null 2>&1
  fi
  stamp "write round $r"
  AB_KIND=write python3 bench/tools/ab_summary.py "$W" "$OUT/ab_write.json" > "$OUT/ab_write.txt"
done
if [ -n "${WSTAMPS:-}" ]; then
  wait $wstampspid; stamp "wstamps build rc=$?"
  KVPACK_WRITE_STAMPS_OUT="$W/wstamps_raw.txt" ./build-wstamps/kvpack bench --formats q4,q3 \
    --shapes 8/1/128,32/8/128,9/3/64 --batch 1,8,64 --context 8192 --iters 5 > /dev/null 2>&1
  python3 bench/tools/write_stamps.py "$W/wstamps_raw.txt" > "$OUT/wstamps.txt" 2>&1; stamp "wstamps"
  tail -5 "$W/wstamps_build.log" > "$W/wstamps_build_tail.log"
fi
l=$(left)
[ "$l" -gt 50 ] && gpu_tests tests $((l - 35)) 'DecodeStepGpu.*'
memcheck_small 'PagedWriteGpu.OutOfRange*:PagedWriteGpu.DecodeStepOneToken*:DecodeStepGpu.BadArguments*'
{ cat "$OUT/env.log"; rm -f "$OUT/env.log"
  echo "== build (write kernels)"; grep -E "write_kv_(group|vec)_kernel" -A2 "$OUT/build.log" | grep -E "registers|spill" | sort | uniq -c
  echo "== tests (first)"; test_outcomes "$W/tests_first.log"
  echo "== A/B write"; cat "$OUT/ab_write.txt"
  echo "== tests (decode_step)"; test_outcomes "$W/tests.log"
  echo "== wstamps build"; cat "$W/wstamps_build_tail.log" 2>/dev/null
  echo "== sanitizers"; grep -E "^==|ERROR SUMMARY|rc=" "$W/sanitizer.log" 2>/dev/null; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
stamp "done"

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
[ -n "${WSTAMPS:-}" ] && start_stamps_build KVPACK_WRITE_STAMPS build-wstamps 4
build_device kvpack_cli kvpack_gpu_tests kvpack_capi
T=./build-device/kvpack_gpu_tests
gpu_tests tests_first 60 'BlockCoreGpu.*:PagedWriteGpu.*:PagedDequantGpu.*'
cp "$W/tests_first.log" "$OUT/tests_first.log"
wait $basepid; stamp "base build rc=$?"; ls /tmp/v64_base/build-device/kvpack > /dev/null || tail -20 "$W/base_build.log"
GRID="--formats bf16,fp8,int4,int4h,q4 --shapes 8/1/128,32/8/128 --batch 1,8,64 --context 8192 --iters 30"
write_ab /tmp/v64_base/build-device/kvpack "${ROUNDS:-3}"
[ -n "${WSTAMPS:-}" ] && write_stamps_run
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

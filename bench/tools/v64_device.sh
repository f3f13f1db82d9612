#!/usr/bin/env bash
# One device call (bench/NOTES.md v64, v64b): the plain write kernels coarsened (fp8 4 tokens per thread, int4 and
# int4h 2; the index arithmetic, the slot's page by shifts, and fp8's scale load and reciprocal shared; every load
# issued before the first slot check; fp8 converting pairs with one cvt; sanitize() and int4's clamp / |x| as min /
# max; v64b: int4h's rotation across the lanes of a vector) against main before v64 built beside it (the tree with
# bench/tools/v64.patch, src, include and the GPU test of the pair conversion, reversed). In order, each step's files
# written into $OUT as it ends:
#   1. tests: BlockCoreGpu.* (e4m3 and the new pair conversion against the host over 5 M inputs), PagedWriteGpu.*,
#      PagedDequantGpu.*: tests_first.log (DecodeStepGpu.* after step 3, in what time is left);
#   2. the write A/B (bf16, fp8, int4, int4h, q4; launches of 1, 8, 64 and 65,536 tokens; ROUNDS rounds, default 3,
#      base and new alternating who goes first): ab_write.json, ab_write.txt;
#   3. WSTAMPS=1: the small q write's phase clocks (a -DKVPACK_WRITE_STAMPS build beside it, bench/NOTES.md v62):
#      wstamps.txt;
#   3b. FP8AB=1: fp8's lean kernel at 3 CTAs per SM (v65, -DKVPACK_LEAN_FP8_MINB=3 -DKVPACK_LEAN_FP8_STAGES=2) against
#      the default at 8q/1kv: ab_fp8m3.json, ab_fp8m3.txt;
#   4. FI=1 (carry [".whl"]): the full grid with --step and FlashInfer: bench_fi.json, bench_log.txt;
#   5. memcheck of the small write tests; log.txt.
#   LIMIT_S=420 WSTAMPS=1 bash bench/tools/v64_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v64_out /tmp/v64_work 420
PATCH=bench/tools/v64.patch
# v64 / v64b: applied here to the device's copy of the tree when it lacks them (main has had them since their run,
# so the apply is skipped); the base is that tree with the patch reversed.
if patch -p1 -N -s --dry-run < "$PATCH" > /dev/null 2>&1; then patch -p1 -N -s < "$PATCH" && stamp "v64 applied"; fi
start_base_build /tmp/v64_base 5
[ -n "${WSTAMPS:-}" ] && start_stamps_build KVPACK_WRITE_STAMPS build-wstamps 4
# FP8AB=1 (v65, measurement): fp8's lean kernel at 3 CTAs per SM on a 2-stage ring, built beside (build-fp8m3).
[ -n "${FP8AB:-}" ] && { start_stamps_build "KVPACK_LEAN_FP8_MINB=3 -DKVPACK_LEAN_FP8_STAGES=2" build-fp8m3 4; fp8pid=$stampspid; }
build_device kvpack_cli kvpack_gpu_tests kvpack_capi
T=./build-device/kvpack_gpu_tests
gpu_tests tests_first 60 'BlockCoreGpu.*:PagedWriteGpu.*:PagedDequantGpu.*'
cp "$W/tests_first.log" "$OUT/tests_first.log"
wait $basepid; stamp "base build rc=$?"; ls /tmp/v64_base/build-device/kvpack > /dev/null || tail -20 "$W/base_build.log"
GRID="--formats bf16,fp8,int4,int4h,q4 --shapes 8/1/128,32/8/128 --batch 1,8,64 --context 8192 --iters 30"
write_ab /tmp/v64_base/build-device/kvpack "${ROUNDS:-3}"
[ -n "${WSTAMPS:-}" ] && write_stamps_run
if [ -n "${FP8AB:-}" ]; then
  wait $fp8pid; stamp "fp8m3 build rc=$?"; tail -3 "$W/fp8m3_build.log"
  grep -E "lean_kernelILi128ELi0E" -A2 "$W/fp8m3_build.log" | grep -E "registers|spill" | head -4 > "$OUT/fp8m3_regs.txt"
  mkdir -p "$W/fp8ab"
  G8="--formats fp8 --shapes 8/1/128 --batch 1,8,16,32,64 --context 32768,131072 --iters 30"
  for r in 1 2; do
    ./build-device/kvpack bench $G8 --json "$W/fp8ab/ab_base_$r.json" > /dev/null 2>&1
    ./build-fp8m3/kvpack bench $G8 --json "$W/fp8ab/ab_m3_$r.json" > /dev/null 2>&1
    stamp "fp8 A/B round $r"
    python3 bench/tools/ab_summary.py "$W/fp8ab" "$OUT/ab_fp8m3.json" > "$OUT/ab_fp8m3.txt"
  done
fi
# FI=1 (carry [".whl"]): the full grid with --step and FlashInfer, v64 applied.
if [ -n "${FI:-}" ] && [ "$(left)" -gt 150 ]; then
  FI_BENCH="--formats bf16,fp8,int4,int4h,q4,q3.5,q3 --shapes 32/8/128,8/1/128 --batch 1,8,16,32,64 --context 8192,32768,65536,131072 --step"
  fi_grid
  { grep -vE " write" "$W/fi/bench.log"; tail -40 "$W/fi/flashinfer.log"; } > "$OUT/bench_log.txt" 2>/dev/null
fi
l=$(left)
[ "$l" -gt 50 ] && gpu_tests tests $((l - 35)) 'DecodeStepGpu.*'
memcheck_small 'PagedWriteGpu.OutOfRange*:PagedWriteGpu.DecodeStepOneToken*:DecodeStepGpu.BadArguments*'
{ cat "$OUT/env.log"; rm -f "$OUT/env.log"
  echo "== build (write kernels)"; grep -E "write_kv_(group|vec)_kernel" -A2 "$OUT/build.log" | grep -E "registers|spill" | sort | uniq -c
  echo "== tests (first)"; test_outcomes "$W/tests_first.log"
  echo "== A/B write"; cat "$OUT/ab_write.txt"
  echo "== fp8 lean 3 CTAs per SM (A/B)"; cat "$OUT/fp8m3_regs.txt" "$OUT/ab_fp8m3.txt" 2>/dev/null
  echo "== grid + flashinfer"; cat "$W/fi_stdout.log" 2>/dev/null
  echo "== tests (decode_step)"; test_outcomes "$W/tests.log"
  echo "== wstamps build"; cat "$W/wstamps_build_tail.log" 2>/dev/null
  echo "== sanitizers"; grep -E "^==|ERROR SUMMARY|rc=" "$W/sanitizer.log" 2>/dev/null; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
stamp "done"

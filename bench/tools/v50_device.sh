#!/usr/bin/env bash
# One device call (bench/NOTES.md v50): the q formats' leaf-only lean kernel instance (lean_kernel<D, B2, true>:
# leaf mode without the chunk accumulator in the loop, 128 registers, 4 CTAs per SM instead of 3; same bits). In
# order of priority: the tests that compare its bits with the general instance and with warp mode; its A/B in one
# binary (KVPACK_LEAN_LEAF_ONLY=0 = before); leaf mode forced (KVPACK_LEAN_LEAF=1) on the cells the rule gives to
# warp mode or the mixed grid; the full grid with FlashInfer; the other GPU tests; the sanitizers. Each cut to what is
# left of LIMIT_S (default 540). Carry [".whl"]. Files in $OUT: bench_fi.json, leaf_only.json, log.txt (rewritten after
# each step, so a call cut short still returns what ran).
#   LIMIT_S=540 bash bench/tools/v50_device.sh
# v51 (q3.5's leaf-only instance on 3 stages, 4 CTAs per SM; branch q35-leaf3), with the tests v50 ran out of time for:
#   AB_GRID="--formats q3.5,q4 --shapes 8/1/128,32/8/128 --batch 1,8,16 --context 32768,65536,131072" AB_FORCED_LEAF=0 \
#   FIRST_TESTS='DecodeGpu.BitwiseIdentical*:DecodeGpu.LeanMixed*:DecodeGpu.LeanMergeSlice*:DecodeGpu.RandomShapes*' \
#   LIMIT_S=540 bash bench/tools/v50_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v50_out /tmp/v50_work 540
AB_TITLE="leaf-only A/B"
build_device kvpack_cli kvpack_gpu_tests kvpack_capi
lean_registers
T=./build-device/kvpack_gpu_tests
FIRST=${FIRST_TESTS:-DecodeGpu.BitwiseIdentical*:DecodeGpu.RandomShapes*:DecodeGpu.GraphCapture*:DecodeGpu.EmptySequence*:DecodeGpu.BadArguments*}
gpu_tests tests_first 0 "$FIRST"
report
# A/B, 2 interleaved rounds: base = the general instance for leaf mode (before), new = the leaf-only instance (the
# default), leaf = leaf mode forced everywhere (on the leaf-only instance).
# AB_GRID overrides the A/B's cells; AB_FORCED_LEAF=0 skips the "leaf" variant (v51: q3.5's 3-stage leaf-only ring).
LG=${AB_GRID:-"--formats q4,q3.5,q3 --shapes 8/1/128,32/8/128 --batch 1,8,16,32 --context 32768,65536,131072"}
for r in 1 2; do
  [ "$(left)" -gt 200 ] || break
  GRID="$LG" ab_bench base $r KVPACK_LEAN_LEAF_ONLY=0
  GRID="$LG" ab_bench new $r
  [ "${AB_FORCED_LEAF:-1}" = 1 ] && GRID="$LG" ab_bench leaf $r KVPACK_LEAN_LEAF=1
done
ab_done leaf_only
finish_call

#!/usr/bin/env bash
# One device call (bench/NOTES.md v52): the q formats' warp-only lean kernel instance (lean_kernel<D, B2,
# LeanInst::kWarpOnly>: warp mode with the chunk accumulator in shared memory, 128 registers, a 2-stage ring, 4 CTAs
# per SM instead of 3; same bits). In order of priority: the GPU tests that compare its bits (bitwise identity with
# the general instance and leaf mode, the mixed grid, merge slices, random shapes vs fp64); its A/B in one binary
# (base = KVPACK_LEAN_WARP_ONLY=0; new = KVPACK_LEAN_WARP_ONLY=1, the instance for every q format where the mixed
# rule, which still counts the general instance's 3 CTAs per SM, does not mix; nomix = that without the mixed grid:
# main's default for q3); the full grid with FlashInfer (main's default); the other GPU tests; the sanitizers.
# Each cut to what is left of LIMIT_S (default 540). Carry [".whl"]. Files in $OUT: bench_fi.json, warp_only.json,
# log.txt (rewritten after each step, so a call cut short still returns what ran).
#   LIMIT_S=540 bash bench/tools/v52_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v52_out /tmp/v52_work 540
AB_TITLE="warp-only A/B"
build_device kvpack_cli kvpack_gpu_tests kvpack_capi
lean_registers
T=./build-device/kvpack_gpu_tests
FIRST=${FIRST_TESTS:-DecodeGpu.BitwiseIdentical*:DecodeGpu.LeanMixed*:DecodeGpu.LeanMergeSlice*:DecodeGpu.RandomShapes*}
gpu_tests tests_first 0 "$FIRST"
report
LG=${AB_GRID:-"--formats q4,q3.5,q3 --shapes 8/1/128,32/8/128 --batch 1,8,16,32,64 --context 8192,32768,65536,131072"}
for r in 1 2; do
  [ "$(left)" -gt 60 ] || break  # (the first call of v52 had 200 here: its tests left too little, see NOTES)
  GRID="$LG" ab_bench base $r KVPACK_LEAN_WARP_ONLY=0
  GRID="$LG" ab_bench new $r KVPACK_LEAN_WARP_ONLY=1
  GRID="$LG" ab_bench nomix $r KVPACK_LEAN_WARP_ONLY=1 KVPACK_LEAN_MIX=0
done
ab_done warp_only
finish_call

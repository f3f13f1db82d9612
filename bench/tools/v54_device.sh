#!/usr/bin/env bash
# One device call (bench/NOTES.md v53 + v52b; run it on branch q3-wo3, whose change the patch holds): the branch's GPU
# tests (bitwise, random shapes), then A/B in one call: q3's warp cells, main (base, built beside from the reversed
# $PATCH) vs the branch (new: the warp-only instance on 3 stages) vs the branch with the general instance (gen:
# KVPACK_LEAN_WARP_ONLY=0); q4 / q3.5 with the warp-only instance forced (rounds 11, 12); SmolLM2's 9q/3kv/64, the
# branch's general (base) vs warp-only instance (wo) (rounds 21, 22). Then the full grid with FlashInfer of the
# branch, the other GPU tests and the sanitizers while time is left. Carry [".whl"]. Files in $OUT: ab.json,
# bench_fi.json, log.txt.
#   PATCH=bench/results/logs/v53_q3_wo3.patch LIMIT_S=540 bash bench/tools/v54_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v54_out /tmp/v54_work 540
PATCH=${PATCH:-bench/results/logs/v53_q3_wo3.patch}
start_base_build /tmp/v54_base 6
build_device kvpack_cli kvpack_gpu_tests
T=./build-device/kvpack_gpu_tests
FIRST='DecodeGpu.BitwiseIdentical*:DecodeGpu.RandomShapes*'
gpu_tests tests_first 0 "$FIRST"
report
wait $basepid; stamp "base build rc=$?"
G3="--formats q3 --shapes 8/1/128,32/8/128 --batch 8,16,32,64 --context 32768,65536,131072"
G4="--formats q4,q3.5 --shapes 32/8/128 --batch 16,64 --context 32768,131072"
L64="--formats q4,q3.5,q3 --shapes 9/3/64 --batch 1,8,32,64 --context 8192,32768,131072"
NEW=./build-device/kvpack BASE=/tmp/v54_base/build-device/kvpack
for r in 1 2; do
  [ "$(left)" -gt 200 ] || break
  [ -x $BASE ] && $BASE bench $G3 --json "$W/ab_base_$r.json" > /dev/null 2>&1
  $NEW bench $G3 --json "$W/ab_new_$r.json" > /dev/null 2>&1
  KVPACK_LEAN_WARP_ONLY=0 $NEW bench $G3 --json "$W/ab_gen_$r.json" > /dev/null 2>&1
  [ -x $BASE ] && KVPACK_LEAN_WARP_ONLY=1 $BASE bench $G4 --json "$W/ab_base_1$r.json" > /dev/null 2>&1
  KVPACK_LEAN_WARP_ONLY=1 $NEW bench $G4 --json "$W/ab_new_1$r.json" > /dev/null 2>&1
  KVPACK_LEAN_WARP_ONLY=0 $NEW bench $L64 --json "$W/ab_base_2$r.json" > /dev/null 2>&1
  KVPACK_LEAN_WARP_ONLY=1 $NEW bench $L64 --json "$W/ab_wo_2$r.json" > /dev/null 2>&1
done
AB_TITLE="q3 3-stage warp-only A/B; q4/q3.5 forced; 9q/3kv/64 general vs warp-only"
ab_done ab
finish_call

#!/usr/bin/env bash
# One device call (bench/NOTES.md v55, H200): main's rule with the warp-only instance at head_dim 64 checked (the
# bitwise test), then A/B in one call for the q formats at both head_dim-128 shapes, batch 8-64 x 32k-128k: main
# (base), the warp-only instance forced (wo: KVPACK_LEAN_WARP_ONLY=1; nomix: also KVPACK_LEAN_MIX=0), and the general
# instance at 4 CTAs per SM (g4: a second build with -DKVPACK_LEAN_GEN_MINB=4: 128 registers, part of the chunk
# accumulator spilled, q3.5's ring 3 stages; the warp-only instance then never has more CTAs, so g4 runs the general
# one in warp mode for every format). Then ncu (stall reasons, hottest SASS) of the lean kernel for q4 and q3 at
# 32q/8kv 32 x 128k, and the full grid with FlashInfer as main ships it. Carry [".whl"]. Files in $OUT: ab.json,
# bench_fi.json, hot_q4.txt, hot_q3.txt, log.txt.
#   LIMIT_S=480 bash bench/tools/v55_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v55_out /tmp/v55_work 480
(cmake -S . -B build-g4 -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPACK_GPU_ONLY=ON -DKVPACK_CUDA_ARCHS=90a-real \
   -DCMAKE_CUDA_FLAGS=-DKVPACK_LEAN_GEN_MINB=4 > "$W/g4_build.log" 2>&1 && cmake --build build-g4 -j6 --target kvpack_cli \
   >> "$W/g4_build.log" 2>&1) &
g4pid=$!
build_device kvpack_cli kvpack_gpu_tests
T=./build-device/kvpack_gpu_tests
FIRST='DecodeGpu.BitwiseIdentical*'
gpu_tests tests_first 0 "$FIRST"
report
wait $g4pid; stamp "g4 build rc=$?"; grep -E "lean_kernel.*Li128ELi[678]ELNS0_8LeanInstE0" -A2 "$W/g4_build.log" | grep -E "spill|registers" | head -4
GRID="--formats q4,q3.5,q3 --shapes 32/8/128,8/1/128 --batch 8,16,32,64 --context 32768,65536,131072"
for r in 1 2; do
  [ "$(left)" -gt 220 ] || break
  ab_bench base $r
  ab_bench wo $r KVPACK_LEAN_WARP_ONLY=1
  ab_bench nomix $r KVPACK_LEAN_WARP_ONLY=1 KVPACK_LEAN_MIX=0
  [ -x build-g4/kvpack ] && ./build-g4/kvpack bench $GRID --json "$W/ab_g4_$r.json" > /dev/null 2>&1
done
AB_TITLE="q formats: main vs warp-only forced (wo, nomix) vs the general instance at 4 CTAs (g4)"
ab_done ab
[ "$(left)" -gt 150 ] && OUT=$OUT SKIP_BUILD=1 PROFILE_KERNEL=lean_kernel PROFILE_BENCH_ARGS=--eager PROFILE_FORMATS="q4 q3" \
  PROFILE_SHAPE=32/8/128 PROFILE_BATCH=32 PROFILE_CTX=128k timeout $(( $(left) - 60 )) bash bench/tools/profile_device.sh \
  > "$W/profile.log" 2>&1
stamp "ncu rc=$?"
[ "$(left)" -gt 50 ] && fi_grid
report
rm -f "$OUT/build.log"


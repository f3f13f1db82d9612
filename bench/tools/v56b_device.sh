#!/usr/bin/env bash
# v56's minimal call (bench/NOTES.md v56; the session had ~250 s of device time left): the new kernel's random-shape
# test against fp64 first, then one A/B round against v55's kernel built beside it (base: -DKVPACK_LEAN_SCORE_CHAINS=1
# -DKVPACK_LEAN_VSCALE_COOP=0), then the bitwise test while time is left. Files in $OUT: ab.json, log.txt.
#   LIMIT_S=190 bash bench/tools/v56b_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v56b_out /tmp/v56b_work 190
(cmake -S . -B build-base -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPACK_GPU_ONLY=ON -DKVPACK_CUDA_ARCHS=90a-real \
   "-DCMAKE_CUDA_FLAGS=-DKVPACK_LEAN_SCORE_CHAINS=1 -DKVPACK_LEAN_VSCALE_COOP=0" > "$W/base.log" 2>&1 &&
   cmake --build build-base -j6 --target kvpack_cli >> "$W/base.log" 2>&1) &
p1=$!
build_device kvpack_cli kvpack_gpu_tests
T=./build-device/kvpack_gpu_tests
gpu_tests tests_first $(( $(left) - 40 )) 'DecodeGpu.RandomShapes*'
report
wait $p1; stamp "base build rc=$?"
GRID="--formats q4,q3.5,q3 --shapes 32/8/128,8/1/128 --batch 8,32,64 --context 32768,131072"
[ -x build-base/kvpack ] && ./build-base/kvpack bench $GRID --json "$W/ab_base_1.json" > /dev/null 2>&1
ab_bench new 1
AB_TITLE="v56: base (v55 kernel) vs new (2 score chains + V scales per lane), one round"
ab_done ab
l=$(left); [ "$l" -gt 30 ] && { gpu_tests tests $((l - 10)) 'DecodeGpu.BitwiseIdentical*'; report; }
rm -f "$OUT/build.log"

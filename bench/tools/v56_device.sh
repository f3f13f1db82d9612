#!/usr/bin/env bash
# One device call (bench/NOTES.md v56): main's lean kernel with the scores' HMMAs in two chains per unit and the V
# scale bytes gathered one per lane (new): A/B in one call against two
# builds beside it: base (-DKVPACK_LEAN_SCORE_CHAINS=1 -DKVPACK_LEAN_VSCALE_COOP=0: v55's kernel) and coop
# (-DKVPACK_LEAN_SCORE_CHAINS=1: the V scale change alone, bit-exact to base); on an H200 also the warp-only instance
# forced for every q format (wo, KVPACK_LEAN_WARP_ONLY=1 on the new build). Then the new build's bitwise and
# random-shape GPU tests, and the grid with FlashInfer of the new build while time is left. Carry [".whl"]. Files in $OUT: ab.json, bench_fi.json, log.txt.
#   LIMIT_S=380 bash bench/tools/v56_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v56_out /tmp/v56_work 380
side_build() {  # side_build DIR FLAGS: kvpack_cli with those CUDA flags into DIR, in the background
  (cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPACK_GPU_ONLY=ON -DKVPACK_CUDA_ARCHS=90a-real \
     "-DCMAKE_CUDA_FLAGS=$2" > "$W/$1.log" 2>&1 && cmake --build "$1" -j5 --target kvpack_cli >> "$W/$1.log" 2>&1) &
}
side_build build-base "-DKVPACK_LEAN_SCORE_CHAINS=1 -DKVPACK_LEAN_VSCALE_COOP=0"; p1=$!
side_build build-coop "-DKVPACK_LEAN_SCORE_CHAINS=1"; p2=$!
build_device kvpack_cli kvpack_gpu_tests
lean_registers
wait $p1 $p2; stamp "side builds done"; ls build-base/kvpack build-coop/kvpack
T=./build-device/kvpack_gpu_tests
GRID="--formats q4,q3.5,q3 --shapes 32/8/128,8/1/128 --batch 8,16,32,64 --context 32768,65536,131072"
h200=0; grep -q H200 "$OUT/env.log" && h200=1
for r in 1 2; do
  [ -x build-base/kvpack ] && ./build-base/kvpack bench $GRID --json "$W/ab_base_$r.json" > /dev/null 2>&1
  ab_bench new $r
  [ -x build-coop/kvpack ] && ./build-coop/kvpack bench $GRID --json "$W/ab_coop_$r.json" > /dev/null 2>&1
  [ $h200 = 1 ] && ab_bench wo $r KVPACK_LEAN_WARP_ONLY=1
done
AB_TITLE="v56: base (v55 kernel) vs new (2 score chains + V scales per lane) vs coop (V scales only) [vs wo on H200]"
ab_done ab
FIRST='DecodeGpu.BitwiseIdentical*:DecodeGpu.RandomShapes*'
gpu_tests tests_first $(( $(left) - 15 )) "$FIRST"
report
[ "$(left)" -gt 50 ] && fi_grid
report
rm -f "$OUT/build.log"

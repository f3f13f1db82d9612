#!/usr/bin/env bash
# One device call (bench/NOTES.md v56-v58; branch v56-chains, merged): the lean kernel as the branch left it (new:
# two score HMMA chains per unit, V scale bytes gathered one per lane, score masks only on steps that need them, the
# q formats' lazy leaf max with v57b's vote, the warp-only instance at head_dim 64), A/B in one call against three
# builds beside it: base (-DKVPACK_LEAN_SCORE_CHAINS=1 -DKVPACK_LEAN_VSCALE_COOP=0 -DKVPACK_LEAN_LAZY=0
# -DKVPACK_LEAN_TAIL_MASK=0: the kernel before), coop (the V scale change and the masks: same bits as base) and lazy
# (coop + the lazy max and its vote); on an H200 also the warp-only instance forced for every q format (wo, on the
# new build). Then the new build's GPU tests (bitwise, random shapes, the head_dim-64 instances, mixed grid, merge
# slices, 128k, empty, graph) and the grid with FlashInfer while time is left. Carry [".whl"]. Files in $OUT:
# ab.json, bench_fi.json, log.txt.
#   LIMIT_S=560 bash bench/tools/v56_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v56_out /tmp/v56_work 560
side_build() {  # side_build DIR FLAGS: kvpack_cli with those CUDA flags into DIR, in the background
  (cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPACK_GPU_ONLY=ON -DKVPACK_CUDA_ARCHS=90a-real \
     "-DCMAKE_CUDA_FLAGS=$2" > "$W/$1.log" 2>&1 && cmake --build "$1" -j4 --target kvpack_cli >> "$W/$1.log" 2>&1) &
}
side_build build-base "-DKVPACK_LEAN_SCORE_CHAINS=1 -DKVPACK_LEAN_VSCALE_COOP=0 -DKVPACK_LEAN_LAZY=0 -DKVPACK_LEAN_TAIL_MASK=0"; p1=$!
side_build build-coop "-DKVPACK_LEAN_SCORE_CHAINS=1 -DKVPACK_LEAN_LAZY=0"; p2=$!
side_build build-lazy "-DKVPACK_LEAN_SCORE_CHAINS=1"; p3=$!
build_device kvpack_cli kvpack_gpu_tests
lean_registers
wait $p1 $p2 $p3; stamp "side builds done"; ls build-base/kvpack build-coop/kvpack build-lazy/kvpack
T=./build-device/kvpack_gpu_tests
GRID="--formats q4,q3.5,q3 --shapes 32/8/128,8/1/128 --batch 8,16,32,64 --context 32768,65536,131072"
h200=0; grep -q H200 "$OUT/env.log" && h200=1
for r in 1 2; do
  for v in base coop lazy; do
    [ -x build-$v/kvpack ] && ./build-$v/kvpack bench $GRID --json "$W/ab_${v}_$r.json" > /dev/null 2>&1
  done
  ab_bench new $r
  [ $h200 = 1 ] && ab_bench wo $r KVPACK_LEAN_WARP_ONLY=1
done
AB_TITLE="v56-v58: base vs coop (V scales per lane, tail masks) vs lazy (+ lazy max, vote) vs new (+ 2 score chains)"
ab_done ab
FIRST='DecodeGpu.RandomShapes*:DecodeGpu.BitwiseIdentical*:DecodeGpu.LeanInstances*'
gpu_tests tests_first $(( $(left) - 60 )) "$FIRST"
report
[ "$(left)" -gt 120 ] && gpu_tests tests $(( $(left) - 50 )) 'DecodeGpu.LeanMixed*:DecodeGpu.LeanMergeSlice*:DecodeGpu.LongContext*:DecodeGpu.Empty*:DecodeGpu.Graph*'
report
[ "$(left)" -gt 50 ] && fi_grid
report
rm -f "$OUT/build.log"

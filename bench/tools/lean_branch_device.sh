#!/usr/bin/env bash
# One device call on branch lean-fp8 (bench/NOTES.md v33): the product's fp8 decode, regular kernel (the default)
# against the lean kernel with K copied by half-rows (KVPACK_LEAN_KROWS=0) and by whole rows (=1), in one run each on
# the same GPU; then ncu of the lean kernel and of bench/tools/lean_probe.cu's fp8 on 32q/8kv batch 8 x 32k; then
# the DecodeGpu tests with whatever time is left.
source "$(dirname "$0")/device_env.sh" /tmp/lean_out
( cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPACK_GPU_ONLY=ON -DKVPACK_CUDA_ARCHS=90a-real \
    && cmake --build build-device -j14 --target kvpack_cli kvpack_gpu_tests ) > "$OUT/build.log" 2>&1 &
bpid=$!
nvcc -O3 -std=c++20 --expt-relaxed-constexpr -lineinfo -I include -I src -DFMT_USE_CONSTEXPR=1 \
  -gencode=arch=compute_90a,code=sm_90a -o /tmp/lean_probe bench/tools/lean_probe.cu > "$OUT/probe_build.log" 2>&1
stamp "probe built rc=$?"
wait $bpid; rc=$?; stamp "product build rc=$rc"; grep -E "lean_fp8|registers" "$OUT/build.log" | head -4
[ $rc -eq 0 ] || { tail -30 "$OUT/build.log"; exit 1; }
K=./build-device/kvpack
GRID="--formats fp8 --shapes 32/8/128,8/1/128 --batch 1,8,64 --context 32k,128k"
: > "$OUT/bench.log"
for v in old k0 k1; do
  case $v in old) env="KVPACK_LEAN_FP8=0";; k0) env="KVPACK_LEAN_FP8=1 KVPACK_LEAN_KROWS=0";; k1) env="KVPACK_LEAN_FP8=1 KVPACK_LEAN_KROWS=1";; esac
  echo "== $v ($env)" >> "$OUT/bench.log"
  env $env $K bench $GRID --json "$OUT/bench_$v.json" 2>&1 | grep -vE " write" >> "$OUT/bench.log"
  stamp "bench $v rc=$?"
done
cat "$OUT/bench.log"
tmp=$(mktemp -d)
prof() {  # name, kernel regex, launch-skip, command...
  local n=$1 k=$2 s=$3; shift 3
  timeout 150 ncu --kernel-name "regex:$k" --launch-skip "$s" --launch-count 1 --set full --import-source yes \
    -f -o "$tmp/$n" "$@" > "$tmp/ncu_$n.log" 2>&1
  stamp "ncu $n rc=$?"
  ncu --import "$tmp/$n.ncu-rep" --page source --print-source sass --csv > "$tmp/sass_$n.csv" 2>&1
  { python3 bench/tools/ncu_hot.py "$tmp/sass_$n.csv" 60
    ncu --import "$tmp/$n.ncu-rep" --page details --section WarpStateStats --section Occupancy --section LaunchStats \
      --section SpeedOfLight --section SchedulerStats --section MemoryWorkloadAnalysis 2>&1; } > "$OUT/hot_$n.txt"
}
prof lean_k${PROF_KROWS:-0} lean_fp8_kernel 3 env KVPACK_LEAN_KROWS=${PROF_KROWS:-0} $K bench --formats fp8 --shapes 32/8/128 --batch 8 --context 32k --iters 5
# lean_probe --bench --stages 3: configs in order (1 x 128k fp8, q4), (8 x 32k fp8, ...): 6 launches each (iters 3).
prof probe lean_decode 16 /tmp/lean_probe --bench --stages 3 --iters 3
for n in lean_k${PROF_KROWS:-0} probe; do
  echo "#### $n"; grep -E "Duration|DRAM Throughput|Memory Throughput|Issue Slots Busy|Executed Ipc A|No Eligible|Registers Per|Achieved Occ|Warp Cycles Per Issued|Executed Instructions  " "$OUT/hot_$n.txt" | head -14
done
rm -rf "$tmp"
left=$((560 - ($(date +%s) - t0)))
stamp "tests, $left s left"
for kr in 0 1; do
  KVPACK_LEAN_KROWS=$kr timeout $((left / 2 - 5)) ./build-device/kvpack_gpu_tests \
    --gtest_filter='DecodeGpu.BitwiseIdentical*:DecodeGpu.RandomShapes*:DecodeGpu.GraphCapture*:DecodeGpu.EmptySequence*' \
    > "$OUT/tests_k$kr.log" 2>&1
  stamp "tests krows=$kr rc=$?"; grep -E "^\[  (FAILED|PASSED)|^\[       OK|Failure" "$OUT/tests_k$kr.log" | head
done

#!/usr/bin/env bash
# One device call for bench/tools/lean_probe.cu (bench/NOTES.md v31): the probe's fp64 check and its timings, and
# the product's `kvpack bench` for fp8 / q4 on the same GPU in the same call (built in the background meanwhile).
#   bash bench/tools/lean_device.sh   (PROBE_ARGS: lean_probe option sets separated by '|', one bench run each;
#                                      NVCC_EXTRA: extra nvcc flags, e.g. -DLEAN_EXACT=0; PRODUCT=0 skips the product)
source "$(dirname "$0")/device_env.sh" /tmp/lean_out
if [ "${PRODUCT:-1}" = 1 ]; then
  ( cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPACK_GPU_ONLY=ON -DKVPACK_CUDA_ARCHS=90a-real \
      && cmake --build build-device -j12 --target kvpack_cli ) > "$OUT/build.log" 2>&1 &
  bpid=$!
fi
nvcc -O3 -std=c++20 --expt-relaxed-constexpr -I include -I src -DFMT_USE_CONSTEXPR=1 ${NVCC_EXTRA:-} -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -o /tmp/lean_probe bench/tools/lean_probe.cu \
  > "$OUT/lean_build.log" 2>&1 || { stamp "probe build failed"; tail -30 "$OUT/lean_build.log"; }
stamp "probe built"; grep -E "registers|spill" "$OUT/lean_build.log" | head -8
{ /tmp/lean_probe --check; /tmp/lean_probe --check --fold; /tmp/lean_probe --check --magic | grep q4; } > "$OUT/lean_check.log" 2>&1
stamp "check rc=$?"; cat "$OUT/lean_check.log"
# PROBE_ARGS: one or more option sets separated by '|', one bench run each.
IFS='|' read -ra runs <<< "${PROBE_ARGS:-}"
[ ${#runs[@]} -eq 0 ] && runs=("")
: > "$OUT/lean_bench.log"
for a in "${runs[@]}"; do
  echo "== lean_probe --bench $a" >> "$OUT/lean_bench.log"
  /tmp/lean_probe --bench $a >> "$OUT/lean_bench.log" 2>&1; stamp "bench [$a] rc=$?"
done
cat "$OUT/lean_bench.log"
if [ "${PRODUCT:-1}" = 1 ]; then
  wait $bpid; stamp "product build rc=$?"; tail -3 "$OUT/build.log"
  ./build-device/kvpack bench --formats fp8,q4 --batch 1,8,64 --context 32k,128k --json "$OUT/product.json" \
    > "$OUT/product.log" 2>&1
  stamp "product bench rc=$?"; grep -vE " write" "$OUT/product.log" | tail -40
fi
stamp "done"

#!/usr/bin/env bash
# One device call (bench/NOTES.md v47): where a lean decode launch spends its time. Builds kvpack with the
# lean path's %globaltimer stamps compiled in (KVPACK_LEAN_STAMPS, src/cuda/lean_stamps.cuh; a separate build tree,
# the shipped kernels are untouched), runs `kvpack bench` over GRID with KVPACK_STAMPS_OUT, and prints each cell's
# timeline (bench/tools/stamps.py). Files in $OUT: stamps.txt (raw), stamps.json, bench.json, log.txt.
#   GRID="--formats q4 --shapes 8/1/128 --batch 1,8 --context 32768,131072" bash bench/tools/stamps_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/stamps_out
{ cmake -S . -B build-stamps -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPACK_GPU_ONLY=ON -DKVPACK_CUDA_ARCHS=90a-real \
    -DCMAKE_CUDA_FLAGS=-DKVPACK_LEAN_STAMPS && cmake --build build-stamps -j16 --target kvpack_cli; } > "$OUT/build.log" 2>&1
rc=$?; stamp "stamped build rc=$rc"; [ $rc -eq 0 ] || { grep -E "error" -A3 "$OUT/build.log" | head -30; tail -20 "$OUT/build.log"; exit 1; }
GRID=${GRID:---formats q4 --shapes 32/8/128,8/1/128 --batch 1,8,16,64 --context 32768,131072}
rm -f "$OUT/stamps.txt"
KVPACK_STAMPS_OUT="$OUT/stamps.txt" ./build-stamps/kvpack bench $GRID --json "$OUT/bench.json" 2>&1 | grep -vE " write|filled" > "$OUT/log.txt"
stamp "bench rc=$?"
python3 bench/tools/stamps.py "$OUT/stamps.txt" --json "$OUT/stamps.json" | tee -a "$OUT/log.txt"
gzip -f "$OUT/stamps.txt"
rm -f "$OUT/build.log"

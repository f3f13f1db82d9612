#!/usr/bin/env bash
# Short device call (bench/NOTES.md v56-v58): main's kernel after the merge of branch v56-chains (new) against its
# arithmetic before it (base: -DKVPACK_LEAN_SCORE_CHAINS=1 -DKVPACK_LEAN_VSCALE_COOP=0 -DKVPACK_LEAN_LAZY=0
# -DKVPACK_LEAN_TAIL_MASK=0), A/B in one call, 2 interleaved rounds, both head_dim-128 shapes plus SmolLM2's
# 9q/3kv/64. For the H200 (the issue-bound GPU); no tests (they ran on the same code in run 20261206T231946Z).
#   LIMIT_S=200 bash bench/tools/v56h_device.sh          Files in $OUT: ab.json, log.txt.
source "$(dirname "$0")/device_env.sh" /tmp/v56h_out /tmp/v56h_work 200
(cmake -S . -B build-base -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPACK_GPU_ONLY=ON -DKVPACK_CUDA_ARCHS=90a-real \
   "-DCMAKE_CUDA_FLAGS=-DKVPACK_LEAN_SCORE_CHAINS=1 -DKVPACK_LEAN_VSCALE_COOP=0 -DKVPACK_LEAN_LAZY=0 -DKVPACK_LEAN_TAIL_MASK=0" \
   > "$W/base.log" 2>&1 && cmake --build build-base -j8 --target kvpack_cli >> "$W/base.log" 2>&1) & p1=$!
{ cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPACK_GPU_ONLY=ON -DKVPACK_CUDA_ARCHS=90a-real \
    && cmake --build build-device -j8 --target kvpack_cli; } > "$OUT/build.log" 2>&1
stamp "build rc=$?"; wait $p1; stamp "base build done"; ls build-base/kvpack build-device/kvpack || exit 1
T=
GRID="--formats q4,q3.5,q3 --shapes 32/8/128,8/1/128,9/3/64 --batch 8,32,64 --context 32768,131072"
for r in 1 2; do
  ./build-base/kvpack bench $GRID --json "$W/ab_base_$r.json" > /dev/null 2>&1
  ab_bench new $r
  [ "$(left)" -lt 40 ] && break
done
AB_TITLE="v56-v58 merged (new) vs the arithmetic before (base)"
ab_done ab
rm -f "$OUT/build.log"

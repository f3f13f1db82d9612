#!/usr/bin/env bash
# Second device call of v52 (bench/NOTES.md): main's rule (the warp-only instance for q3 at head_dim 128, without the
# mixed grid) checked and timed: the bitwise GPU test, q3's A/B in one binary (base = KVPACK_LEAN_WARP_ONLY=0), the
# warp-only instance at head_dim 64 (SmolLM2's 9q/3kv/64, every q format; wo = KVPACK_LEAN_WARP_ONLY=1: not measured
# in v52, so not the default there), then the full grid with FlashInfer (main's configuration). Carry [".whl"]. Files
# in $OUT: bench_fi.json, q3_rule.json (both A/Bs), log.txt.
#   LIMIT_S=280 bash bench/tools/v52b_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v52b_out /tmp/v52b_work 280
build_device kvpack_cli kvpack_gpu_tests
T=./build-device/kvpack_gpu_tests
gpu_tests tests_first 0 'DecodeGpu.BitwiseIdentical*'
LG="--formats q3 --shapes 8/1/128,32/8/128 --batch 1,8,16,32,64 --context 8192,32768,65536,131072"
L64="--formats q4,q3.5,q3 --shapes 9/3/64 --batch 1,8,32,64 --context 8192,32768,131072"
for r in 1 2; do
  GRID="$LG" ab_bench base $r KVPACK_LEAN_WARP_ONLY=0
  GRID="$LG" ab_bench new $r
  GRID="$L64" ab_bench base 1$r KVPACK_LEAN_WARP_ONLY=0  # rounds 11, 12: own files (ab_bench names them by round)
  GRID="$L64" ab_bench wo 1$r KVPACK_LEAN_WARP_ONLY=1
done
python3 bench/tools/ab_summary.py "$W" "$OUT/q3_rule.json" > "$W/ab_summary.txt"
stamp "q3 A/B"
[ "$(left)" -gt 60 ] && fi_grid
{ cat "$OUT/env.log"; grep -vE "^/.*Failure$" "$W/tests_first.log" | tail -20; cat "$W/ab_summary.txt";
  cat "$W/fi_stdout.log" 2>/dev/null; } > "$OUT/log.txt"
rm -f "$OUT/build.log"

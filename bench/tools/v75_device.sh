#!/usr/bin/env bash
# One device call (bench/NOTES.md v75): the group-folding instance on by default where lean_default_group_fold says
# (2.5 waves of one-group warps), VROWS cut to its measured mode. In order, files into $OUT as each step ends:
#   1. the whole GPU suite: tests.log;
#   2. A/B in one binary, KVPACK_LEAN_GROUP_FOLD=0 against the default rule, q4 / q3.5 / q3 at 32q/8kv batch 16-64 x
#      64k / 128k and 8q/1kv batch 64 x 128k, 3 rounds alternating: ab_group.json/.txt;
#   3. the grid with --step and FlashInfer (carry [".whl"]): bench_fi.json; log.txt.
#   LIMIT_S=420 bash bench/tools/v75_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v75_out /tmp/v75_work 420
build_device kvpack_cli kvpack_gpu_tests
T=./build-device/kvpack_gpu_tests
gpu_tests tests 200 '*'
cp "$W/tests.log" "$OUT/tests.log"
GRID="--formats q4,q3.5,q3 --shapes 32/8/128,8/1/128 --batch 16,32,64 --context 65536,131072 --iters 20"
mkdir -p "$W/abg"
for r in 1 2 3; do
  [ "$(left)" -gt 150 ] || break
  if [ $((r % 2)) -eq 1 ]; then order="base rule"; else order="rule base"; fi
  for v in $order; do
    if [ $v = base ]; then val=0; else val=-1; fi
    KVPACK_LEAN_GROUP_FOLD=$val ./build-device/kvpack bench $GRID --json "$W/abg/ab_${v}_$r.json" > /dev/null 2>&1
  done
  stamp "A/B round $r"
  python3 bench/tools/ab_summary.py "$W/abg" "$OUT/ab_group.json" > "$OUT/ab_group.txt"
done
if [ "$(left)" -gt 60 ]; then
  FI_BENCH="--formats bf16,fp8,int4,int4h,q4,q3.5,q3 --shapes 32/8/128,8/1/128 --batch 1,8,16,32,64 --context 8192,32768,65536,131072 --step"
  fi_grid
fi
{ cat "$OUT/env.log"; rm -f "$OUT/env.log"
  echo "== tests"; test_outcomes "$OUT/tests.log"
  echo "== A/B group fold (base: off, rule: the default)"; cat "$OUT/ab_group.txt" 2>/dev/null
  echo "== grid + flashinfer"; tail -5 "$W/fi_stdout.log" 2>/dev/null; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
stamp "done"

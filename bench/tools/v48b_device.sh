#!/usr/bin/env bash
# One short device call (bench/NOTES.md v48b; apply bench/patches/v48b_lean_pre.patch first: `git apply`): the ring steps a lean warp issues before the prepared query's wait
# (KVPACK_LEAN_PRE), A/B'd in one binary on the small cells, then the full grid with FlashInfer (the defaults), then
# the bitwise-identity test with KVPACK_LEAN_PRE=1 and =0; each cut to what is left of LIMIT_S (default 270). Carry [".whl"].
# Files in $OUT: ab.json, bench_fi.json, log.txt, env.log.
#   LIMIT_S=270 bash bench/tools/v48b_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v48b_out /tmp/v48b_work 270
build_device kvpack_cli kvpack_gpu_tests kvpack_capi
T=./build-device/kvpack_gpu_tests
GRID=${GRID:---formats q4,q3.5,q3 --shapes 32/8/128,8/1/128 --batch 1,8,16 --context 32768,131072}
for r in 1 2; do
  for v in base pre0 pre1; do
    [ "$(left)" -gt 150 ] || continue
    case $v in
      base) ab_bench $v $r ;;
      pre0) ab_bench $v $r KVPACK_LEAN_PRE=0 ;;
      pre1) ab_bench $v $r KVPACK_LEAN_PRE=1 ;;
    esac
  done
  stamp "A/B round $r"
done
python3 bench/tools/ab_summary.py "$W" "$OUT/ab.json" | tee "$W/ab_summary.txt"
if [ "$(left)" -gt 70 ]; then
  fi_grid
fi
for pre in 1 0; do
  l=$(left)
  [ "$l" -gt 20 ] || continue
  gpu_tests tests_pre$pre $((l - 5)) 'DecodeGpu.BitwiseIdentical*:DecodeGpu.GraphCapture*' KVPACK_LEAN_PRE=$pre
done
{ cat "$OUT/env.log"; echo "== ab summary"; cat "$W/ab_summary.txt"; echo "== bench + flashinfer"; cat "$W/fi_stdout.log" 2>/dev/null;
  tail -30 "$W/fi/flashinfer.log" 2>/dev/null; for pre in 1 0; do echo "== tests KVPACK_LEAN_PRE=$pre";
  grep -vE "^/.*Failure$" "$W/tests_pre$pre.log" 2>/dev/null | tail -20; done; } > "$OUT/log.txt"
rm -f "$OUT/build.log"

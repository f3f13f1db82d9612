#!/usr/bin/env bash
# One device call (bench/NOTES.md v48): the mixed lean grid (lean_mixed_chunks) and the preparation split over 4 CTAs
# (KVPACK_LEAN_PREP_SPLIT), A/B'd in one binary through their measurement switches. In order of priority: the tests of
# the change; A/B round 1 (base / new / prep only); the full grid with FlashInfer; A/B round 2; the rest of the GPU
# tests; memcheck and racecheck; a sweep of forced mixed splits and merge slice counts; the stamped timeline. Each cut
# to what is left of LIMIT_S (default 560). Carry [".whl"].
# Files in $OUT: ab.json, bench_fi.json, sweep.txt, stamps.txt.gz, log.txt, env.log.
#   LIMIT_S=560 bash bench/tools/v48_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v48_out /tmp/v48_work 560
start_stamps_build
build_device kvpack_cli kvpack_gpu_tests kvpack_capi
lean_registers
T=./build-device/kvpack_gpu_tests
K=./build-device/kvpack
FIRST=${FIRST_TESTS:-DecodeGpu.LeanMixed*:DecodeGpu.BitwiseIdentical*:DecodeGpu.LeanMergeSlice*:DecodeGpu.EmptySequence*:DecodeGpu.GraphCapture*:DecodeGpu.BadArguments*}
gpu_tests tests_first 0 "$FIRST"
GRID=${GRID:---formats q4,q3.5,q3 --shapes 32/8/128,8/1/128 --batch 1,8,16,32,64 --context 32768,65536,131072}
# Variants: base = v47's behaviour (no mixed grid, one preparation CTA per (sequence, kv head)); new = the defaults;
# prep = the preparation split only; leaf = leaf mode forced (the mixed grid's other end).
ab_round() {  # ab_round ROUND VARIANT...
  local r=$1 v; shift
  for v in "$@"; do
    case $v in
      base) ab_bench $v $r KVPACK_LEAN_MIX=0 KVPACK_LEAN_PREP_SPLIT=1 ;;
      new) ab_bench $v $r ;;
      prep) ab_bench $v $r KVPACK_LEAN_MIX=0 ;;
      leaf) ab_bench $v $r KVPACK_LEAN_LEAF=1 ;;
    esac
  done
  stamp "A/B round $r"
}
ab_round 1 ${VARIANTS:-base new prep}
if [ "$(left)" -gt 90 ]; then
  fi_grid
fi
[ "$(left)" -gt 330 ] && ab_round 2 base new
python3 bench/tools/ab_summary.py "$W" "$OUT/ab.json" | tee "$W/ab_summary.txt"
# The rest of the GPU tests (random shapes vs fp64, 128k, write path, dequantiser), then the sanitizers.
l=$(left)
if [ "$l" -gt 120 ]; then
  gpu_tests tests_rest $((l - 60)) "-$FIRST"
fi
l=$(left)
[ "$l" -gt 40 ] && sanitize_small $T $l 'DecodeGpu.EmptySequence*:DecodeGpu.GraphCapture*:DecodeGpu.BadArguments*'
# Forced mixed splits (warp-mode chunks per (sequence, kv head)) on cells of 2,048 and 4,096 chunk-warps.
{
  for cell in "32/8/128 1 131072" "8/1/128 8 131072"; do
    set -- $cell
    for mix in 0 rule 64 132 164 228; do
      [ "$(left)" -gt 40 ] || continue
      e="KVPACK_LEAN_MIX=$mix"; [ $mix = rule ] && e="KVPACK_LEAN_MIX=-1"
      us=$(env $e $K bench --formats q4 --shapes $1 --batch $2 --context $3 --json "$W/sw.json" > /dev/null 2>&1 &&
           python3 -c "import json; print(' '.join('%.1f' % r['median_us'] for r in json.load(open('$W/sw.json')) if r.get('kind', 'decode') == 'decode'))")
      echo "q4 $1 batch $2 ctx $3 mix $mix: $us us"
    done
  done
  # The merge's slice count (lean_merge_slices picks 16 at batch 1 x 128k; never compared on a GPU against others).
  for cell in "8/1/128 1 131072"; do
    set -- $cell
    for sl in 4 8 16; do
      [ "$(left)" -gt 40 ] || continue
      us=$(env KVPACK_LEAN_MERGE_SLICES=$sl $K bench --formats q4 --shapes $1 --batch $2 --context $3 --json "$W/sw.json" > /dev/null 2>&1 &&
           python3 -c "import json; print(' '.join('%.1f' % r['median_us'] for r in json.load(open('$W/sw.json')) if r.get('kind', 'decode') == 'decode'))")
      echo "q4 $1 batch $2 ctx $3 merge slices $sl: $us us"
    done
  done
} > "$OUT/sweep.txt" 2>&1
stamp "sweep done"; cat "$OUT/sweep.txt"
wait $stampspid; stamp "stamped build rc=$?"
l=$(left)
if [ "$l" -gt 25 ]; then
  KVPACK_STAMPS_OUT="$OUT/stamps.txt" timeout $((l - 10)) ./build-stamps/kvpack bench \
    ${STAMPS_GRID:---formats q4 --shapes 32/8/128,8/1/128 --batch 1,8 --context 32768,131072} > /dev/null 2>&1
  python3 bench/tools/stamps.py "$OUT/stamps.txt" > "$W/stamps.log" 2>&1; stamp "stamps"; cat "$W/stamps.log"
fi
{ cat "$OUT/env.log"; echo "== build"; grep -E "registers|spill|error" "$OUT/build.log" | head -80;
  echo "== tests (first)"; grep -vE "^/.*Failure$" "$W/tests_first.log" | head -200; echo "== ab summary"; cat "$W/ab_summary.txt";
  echo "== sweep"; cat "$OUT/sweep.txt"; echo "== bench + flashinfer"; cat "$W/fi_stdout.log" 2>/dev/null;
  grep -vE " write" "$W/fi/bench.log" 2>/dev/null | tail -40; tail -30 "$W/fi/flashinfer.log" 2>/dev/null;
  echo "== tests (rest)"; grep -vE "^/.*Failure$" "$W/tests_rest.log" 2>/dev/null | tail -80;
  echo "== sanitizers"; tail -30 "$W/sanitizer.log" 2>/dev/null; echo "== stamps"; cat "$W/stamps.log" 2>/dev/null; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
gzip -f "$OUT/stamps.txt" 2>/dev/null

#!/usr/bin/env bash
# One device call (bench/NOTES.md v49): the lean merge split (lean_merge_split) and main's state on whatever GPU
# comes. In order of priority: the split's tests; the split's A/B in one binary (KVPACK_LEAN_MERGE_SPLIT); the full
# grid with FlashInfer; page scatter A/B (`kvpack bench --pages shuffled|contiguous`) on the latency-bound cells;
# fp8's regular kernel against its opt-in lean one; the stamped timeline of both page orders; the other GPU tests; the
# sanitizers; fp8's opt-in lean kernel under random shapes. Each cut to what is left of LIMIT_S (default 560).
# As run (2026-12-06, bench/NOTES.md v49) it had bench/patches/v49_merge_split.patch applied (`git apply` it first to
# repeat the split's A/B; on main, without it, KVPACK_LEAN_MERGE_SPLIT does not exist and its three variants are one).
# Carry [".whl"]. Files in $OUT: bench_fi.json, split.json, pages.json, fp8_lean.json, stamps_*.txt.gz, log.txt.
#   LIMIT_S=560 bash bench/tools/v49_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v49_out /tmp/v49_work 560
start_stamps_build
build_device kvpack_cli kvpack_gpu_tests kvpack_capi
lean_registers
T=./build-device/kvpack_gpu_tests
# The tests of the merge split first (every slice count with and without it, the counters' reset), then the others.
FIRST=${FIRST_TESTS:-DecodeGpu.LeanMergeSlice*:DecodeGpu.BitwiseIdentical*:DecodeGpu.GraphCapture*:DecodeGpu.EmptySequence*:DecodeGpu.BadArguments*}
gpu_tests tests_first 0 "$FIRST"
# The merge split A/B (lean_merge_split): base = off (KVPACK_LEAN_MERGE_SPLIT=0), new = the rule, on = wherever a
# sequence has more than one round; 2 interleaved rounds on the cells of small merge grids.
WP=$W; W=$W/split; mkdir -p "$W"
SG="--formats q4,q3.5,q3 --shapes 8/1/128,32/8/128 --batch 1,8 --context 65536,131072"
for r in 1 2; do
  GRID="$SG" ab_bench base $r KVPACK_LEAN_MERGE_SPLIT=0
  GRID="$SG" ab_bench new $r
  GRID="$SG" ab_bench on $r KVPACK_LEAN_MERGE_SPLIT=1
done
stamp "merge split A/B"
python3 bench/tools/ab_summary.py "$W" "$OUT/split.json" | tee "$WP/split_summary.txt"
W=$WP
if [ "$(left)" -gt 200 ]; then
  fi_grid
fi
# Page order A/B: base = shuffled pages (the default), contig = each sequence's pages in order.
PG="--formats fp8,q4,q3 --shapes 8/1/128,32/8/128 --batch 1,8,16 --context 32768,131072"
[ "$(left)" -gt 150 ] && for r in 1 2; do
  GRID="$PG --pages shuffled" ab_bench base $r
  GRID="$PG --pages contiguous" ab_bench contig $r
done
stamp "pages A/B"
python3 bench/tools/ab_summary.py "$W" "$OUT/pages.json" | tee "$W/ab_summary.txt"
# fp8: the regular kernel (KVPACK_LEAN_FP8=0; as run, the default) against the lean one (=1), one round.
WP=$W; W=$W/fp8; mkdir -p "$W"
[ "$(left)" -gt 160 ] && for r in 1; do
  GRID="--formats fp8 --shapes 32/8/128,8/1/128 --batch 1,8,16,32,64 --context 32768,65536,131072" ab_bench base $r KVPACK_LEAN_FP8=0
  GRID="--formats fp8 --shapes 32/8/128,8/1/128 --batch 1,8,16,32,64 --context 32768,65536,131072" ab_bench lean $r KVPACK_LEAN_FP8=1
done
stamp "fp8 lean A/B"
python3 bench/tools/ab_summary.py "$W" "$OUT/fp8_lean.json" | tee "$WP/fp8_summary.txt"
W=$WP
[ "$(left)" -gt 120 ] && { wait $stampspid; stamp "stamped build rc=$?"; }
for p in shuffled contiguous; do
  [ "$(left)" -gt 120 ] || continue
  KVPACK_STAMPS_OUT="$OUT/stamps_$p.txt" timeout 60 ./build-stamps/kvpack bench --pages $p \
    --formats q4 --shapes 8/1/128,32/8/128 --batch 1,8 --context 32768,131072 > /dev/null 2>&1
  python3 bench/tools/stamps.py "$OUT/stamps_$p.txt" > "$W/stamps_$p.log" 2>&1; stamp "stamps $p"
done
l=$(left)
if [ "$l" -gt 120 ]; then
  gpu_tests tests $((l - 70)) "-$FIRST"
fi
l=$(left)
[ "$l" -gt 40 ] && sanitize_small $T $l 'DecodeGpu.EmptySequence*:DecodeGpu.GraphCapture*:DecodeGpu.BadArguments*:PagedWriteGpu.OutOfRange*'
l=$(left)
if [ "$l" -gt 30 ]; then
  gpu_tests tests_lean_fp8 $((l - 10)) 'DecodeGpu.RandomShapes*' KVPACK_LEAN_FP8=1
fi
{ cat "$OUT/env.log"; echo "== build"; grep -E "registers|spill|error" "$OUT/build.log" | head -80;
  echo "== tests (first)"; grep -vE "^/.*Failure$" "$W/tests_first.log" | tail -60;
  echo "== bench + flashinfer"; cat "$W/fi_stdout.log" 2>/dev/null;
  grep -vE " write" "$W/fi/bench.log" 2>/dev/null | tail -40; tail -30 "$W/fi/flashinfer.log" 2>/dev/null;
  echo "== merge split A/B"; cat "$W/split_summary.txt"; echo "== pages A/B"; cat "$W/ab_summary.txt"; echo "== fp8 regular / lean"; cat "$W/fp8_summary.txt";
  for p in shuffled contiguous; do echo "== stamps $p"; cat "$W/stamps_$p.log" 2>/dev/null; done
  echo "== tests"; grep -vE "^/.*Failure$" "$W/tests.log" 2>/dev/null | tail -120;
  echo "== sanitizers"; tail -30 "$W/sanitizer.log" 2>/dev/null;
  echo "== lean fp8"; tail -20 "$W/tests_lean_fp8.log" 2>/dev/null; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
gzip -f "$OUT"/stamps_*.txt 2>/dev/null

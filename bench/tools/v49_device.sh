#!/usr/bin/env bash
# One device call (bench/NOTES.md v49): main as it stands (v48 + the host-side review commit) on whatever GPU comes.
# In order of priority: the full grid with FlashInfer; page scatter A/B (`kvpack bench --pages shuffled|contiguous`,
# 2 interleaved rounds) on the latency-bound cells; fp8's regular kernel against its opt-in lean one; the stamped
# timeline of both page orders; every GPU test; the sanitizers; fp8's opt-in lean kernel under random shapes. Each cut
# to what is left of LIMIT_S (default 560).
# Carry [".whl"]. Files in $OUT: bench_fi.json, pages.json, fp8_lean.json, stamps_*.txt.gz, log.txt, env.log.
#   LIMIT_S=560 bash bench/tools/v49_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v49_out
left() { echo $(( ${LIMIT_S:-560} - ($(date +%s) - t0) )); }
W=/tmp/v49_work
rm -rf "$W" && mkdir -p "$W"
start_stamps_build
build_device kvpack_cli kvpack_gpu_tests kvpack_capi
lean_registers
T=./build-device/kvpack_gpu_tests
OUT=$W/fi BENCH_ARGS="${FI_BENCH:---formats bf16,fp8,int4,int4h,q4,q3.5,q3 --shapes 32/8/128,8/1/128 --batch 1,8,16,32,64 --context 8192,32768,65536,131072}" \
  bash bench/run_device.sh bench,flashinfer > "$W/fi_stdout.log" 2>&1
stamp "bench + flashinfer rc=$?"
cp "$W/fi/bench.json" "$OUT/bench_fi.json" 2>/dev/null
# Page order A/B: base = shuffled pages (the default), contig = each sequence's pages in order.
PG="--formats fp8,q4,q3 --shapes 8/1/128,32/8/128 --batch 1,8,16 --context 32768,131072"
for r in 1 2; do
  GRID="$PG --pages shuffled" ab_bench base $r
  GRID="$PG --pages contiguous" ab_bench contig $r
done
stamp "pages A/B"
python3 bench/tools/ab_summary.py "$W" "$OUT/pages.json" | tee "$W/ab_summary.txt"
# fp8: the regular kernel (default) against its opt-in lean variant (KVPACK_LEAN_FP8=1), 2 interleaved rounds.
WP=$W; W=$W/fp8; mkdir -p "$W"
for r in 1 2; do
  GRID="--formats fp8 --shapes 32/8/128,8/1/128 --batch 1,8,16,32,64 --context 32768,65536,131072" ab_bench base $r
  GRID="--formats fp8 --shapes 32/8/128,8/1/128 --batch 1,8,16,32,64 --context 32768,65536,131072" ab_bench lean $r KVPACK_LEAN_FP8=1
done
stamp "fp8 lean A/B"
python3 bench/tools/ab_summary.py "$W" "$OUT/fp8_lean.json" | tee "$WP/fp8_summary.txt"
W=$WP
wait $stampspid; stamp "stamped build rc=$?"
for p in shuffled contiguous; do
  KVPACK_STAMPS_OUT="$OUT/stamps_$p.txt" timeout 60 ./build-stamps/kvpack bench --pages $p \
    --formats q4 --shapes 8/1/128,32/8/128 --batch 1,8 --context 32768,131072 > /dev/null 2>&1
  python3 bench/tools/stamps.py "$OUT/stamps_$p.txt" > "$W/stamps_$p.log" 2>&1; stamp "stamps $p"
done
l=$(left)
if [ "$l" -gt 120 ]; then
  timeout $((l - 70)) $T > "$W/tests.log" 2>&1
  stamp "GPU tests rc=$?"; grep -E "^\[  (FAILED|PASSED)|^\[       OK|Failure|rror" "$W/tests.log" | head -40
fi
S=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
l=$(left)
if [ "$l" -gt 40 ]; then
  { echo "== memcheck"; timeout $(((l - 10) / 2)) $S --tool memcheck --error-exitcode 9 $T \
      --gtest_filter='DecodeGpu.EmptySequence*:DecodeGpu.GraphCapture*:DecodeGpu.BadArguments*:PagedWriteGpu.OutOfRange*'; echo "rc=$?";
    echo "== racecheck"; timeout $(((l - 10) / 2)) $S --tool racecheck --error-exitcode 9 $T \
      --gtest_filter='DecodeGpu.EmptySequence*:DecodeGpu.GraphCapture*'; echo "rc=$?"; } > "$W/sanitizer.log" 2>&1
  stamp "sanitizers done"; grep -E "^==|ERROR SUMMARY|rc=" "$W/sanitizer.log" | head -8
fi
l=$(left)
if [ "$l" -gt 30 ]; then
  KVPACK_LEAN_FP8=1 timeout $((l - 10)) $T --gtest_filter='DecodeGpu.RandomShapes*' > "$W/tests_lean_fp8.log" 2>&1
  stamp "lean fp8 RandomShapes rc=$?"; grep -E "^\[  (FAILED|PASSED)|^\[       OK|Failure" "$W/tests_lean_fp8.log" | head
fi
{ cat "$OUT/env.log"; echo "== build"; grep -E "registers|spill|error" "$OUT/build.log" | head -80;
  echo "== bench + flashinfer"; cat "$W/fi_stdout.log" 2>/dev/null;
  grep -vE " write" "$W/fi/bench.log" 2>/dev/null | tail -40; tail -30 "$W/fi/flashinfer.log" 2>/dev/null;
  echo "== pages A/B"; cat "$W/ab_summary.txt"; echo "== fp8 regular / lean"; cat "$W/fp8_summary.txt";
  for p in shuffled contiguous; do echo "== stamps $p"; cat "$W/stamps_$p.log" 2>/dev/null; done
  echo "== tests"; grep -vE "^/.*Failure$" "$W/tests.log" 2>/dev/null | tail -120;
  echo "== sanitizers"; tail -30 "$W/sanitizer.log" 2>/dev/null;
  echo "== lean fp8"; tail -20 "$W/tests_lean_fp8.log" 2>/dev/null; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
gzip -f "$OUT"/stamps_*.txt 2>/dev/null

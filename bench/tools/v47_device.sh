#!/usr/bin/env bash
# One device call (bench/NOTES.md v47): the change's correctness, the full grid with FlashInfer in the same run, an
# A/B against the base (PATCH reversed, built beside it), and the lean path's timeline (stamped build), in that order
# of priority, each cut to what is left of LIMIT_S (default 450). Carry [".whl"] (bench/flashinfer/fetch_flashinfer.sh).
# Files in $OUT: bench_fi.json (full grid + FlashInfer), ab.json, stamps.txt, log.txt, env.log.
#   PATCH=bench/results/logs/v47.patch LIMIT_S=450 bash bench/tools/v47_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v47_out
root=$(pwd)
left() { echo $(( ${LIMIT_S:-450} - ($(date +%s) - t0) )); }
W=/tmp/v47_work
rm -rf "$W" /tmp/v47_base && mkdir -p "$W" /tmp/v47_base
cp -r $(ls -A | grep -vE '^(build|build-device|build-stamps|\.git|\.whl)$') /tmp/v47_base/
(cd /tmp/v47_base && patch -s -R -p1 < "$root/$PATCH") || { echo "reverse patch failed"; exit 1; }
(cd /tmp/v47_base && cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPACK_GPU_ONLY=ON \
   -DKVPACK_CUDA_ARCHS=90a-real > "$W/base_build.log" 2>&1 && cmake --build build-device -j6 --target kvpack_cli \
   >> "$W/base_build.log" 2>&1) &
basepid=$!
(cmake -S . -B build-stamps -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPACK_GPU_ONLY=ON -DKVPACK_CUDA_ARCHS=90a-real \
   -DCMAKE_CUDA_FLAGS=-DKVPACK_LEAN_STAMPS > "$W/stamps_build.log" 2>&1 && cmake --build build-stamps -j4 \
   --target kvpack_cli >> "$W/stamps_build.log" 2>&1) &
stampspid=$!
build_device kvpack_cli kvpack_gpu_tests kvpack_capi
grep -E "lean_(q_prep|kernel|merge)" -A2 "$OUT/build.log" | grep -E "registers|spill" | sort | uniq -c | head -20
T=./build-device/kvpack_gpu_tests
K=./build-device/kvpack
$T --gtest_filter="${FIRST_TESTS:-DecodeGpu.LeanMergeSlice*:DecodeGpu.BitwiseIdentical*:DecodeGpu.EmptySequence*:DecodeGpu.GraphCapture*:DecodeGpu.BadArguments*}" > "$W/tests_first.log" 2>&1
stamp "first GPU tests rc=$?"; grep -E "^\[  (FAILED|PASSED)|^\[       OK|Failure|rror" "$W/tests_first.log" | head -20
OUT=$W/fi BENCH_ARGS="${FI_BENCH:---formats bf16,fp8,int4,int4h,q4,q3.5,q3 --shapes 32/8/128,8/1/128 --batch 1,8,16,32,64 --context 8192,32768,65536,131072}" \
  bash bench/run_device.sh bench,flashinfer > "$W/fi_stdout.log" 2>&1
stamp "bench + flashinfer rc=$?"
cp "$W/fi/bench.json" "$OUT/bench_fi.json" 2>/dev/null
wait $basepid; stamp "base build rc=$?"
GRID=${GRID:---formats fp8,q4,q3.5,q3 --shapes 32/8/128,8/1/128 --batch 1,8,16,32,64 --context 32768,131072}
for r in 1 2; do
  for v in base new; do
    bin=$K; [ $v = base ] && bin=/tmp/v47_base/build-device/kvpack
    [ -x "$bin" ] && [ "$(left)" -gt 150 ] || continue
    $bin bench $GRID --json "$W/ab_${v}_$r.json" > /dev/null 2>&1
  done
done
stamp "A/B done"
python3 - "$W" > "$OUT/ab.json" <<'PY'
import json, sys, glob, os
rows = []
for f in sorted(glob.glob(sys.argv[1] + "/ab_*.json")):
    v, r = os.path.basename(f)[3:-5].split("_")
    for x in json.load(open(f)):
        x["variant"], x["round"] = v, int(r)
        rows.append(x)
json.dump(rows, sys.stdout, indent=1)
PY
python3 - "$OUT/ab.json" <<'PY' | tee "$W/ab_summary.txt"
import json, sys
rows = [r for r in json.load(open(sys.argv[1])) if r.get("kind", "decode") == "decode"]
key = lambda r: (r["format"], r["num_qo_heads"], r["num_kv_heads"], r["batch"], r["context"])
best = {}
for r in rows:
    best.setdefault((key(r), r["variant"]), []).append(r["median_us"])
print(f"{'format':6} {'shape':8} {'batch':>5} {'ctx':>7} {'base us':>9} {'new us':>9} {'base/new':>8}  (min over rounds)")
for k in sorted({key(r) for r in rows}, key=lambda k: (k[0], -k[1], k[3], k[4])):
    a, b = best.get((k, "base")), best.get((k, "new"))
    if a and b:
        print(f"{k[0]:6} {k[1]}q/{k[2]}kv {k[3]:5} {k[4]:7} {min(a):9.1f} {min(b):9.1f} {min(a) / min(b):8.3f}")
PY
S=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
{ echo "== memcheck"; timeout 60 $S --tool memcheck --error-exitcode 9 $T \
    --gtest_filter='DecodeGpu.EmptySequence*:DecodeGpu.GraphCapture*:DecodeGpu.BadArguments*'; echo "rc=$?"; } > "$W/sanitizer.log" 2>&1
stamp "sanitizer done"; grep -E "^==|ERROR SUMMARY|rc=" "$W/sanitizer.log" | head -6
l=$(left); timeout $((l > 100 ? l - 60 : 10)) $T --gtest_filter="${LAST_TESTS:-DecodeGpu.RandomShapes*}" > "$W/tests_last.log" 2>&1
stamp "last GPU tests rc=$?"; grep -E "^\[  (FAILED|PASSED)|^\[       OK|Failure|rror" "$W/tests_last.log" | head -10
wait $stampspid; stamp "stamped build rc=$?"
l=$(left)
if [ "$l" -gt 25 ]; then
  KVPACK_STAMPS_OUT="$OUT/stamps.txt" timeout $((l - 10)) ./build-stamps/kvpack bench \
    ${STAMPS_GRID:---formats q4 --shapes 32/8/128,8/1/128 --batch 1,8,16 --context 32768,131072} > /dev/null 2>&1
  python3 bench/tools/stamps.py "$OUT/stamps.txt" > "$W/stamps.log" 2>&1; stamp "stamps"; cat "$W/stamps.log"
fi
{ cat "$OUT/env.log"; echo "== build"; grep -E "registers|spill|error" "$OUT/build.log" | head -80;
  echo "== tests (first)"; grep -vE "^/.*Failure$" "$W/tests_first.log" | head -200; echo "== bench + flashinfer"; cat "$W/fi_stdout.log";
  grep -vE " write" "$W/fi/bench.log" 2>/dev/null | tail -40; tail -30 "$W/fi/flashinfer.log" 2>/dev/null;
  echo "== ab summary"; cat "$W/ab_summary.txt"; echo "== sanitizer"; cat "$W/sanitizer.log" | tail -20;
  echo "== tests (last)"; grep -vE "^/.*Failure$" "$W/tests_last.log" | tail -60; echo "== stamps"; cat "$W/stamps.log" 2>/dev/null; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
gzip -f "$OUT/stamps.txt" 2>/dev/null

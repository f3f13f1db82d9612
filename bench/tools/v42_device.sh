#!/usr/bin/env bash
# One device call (bench/NOTES.md v42): a lean-kernel change against its base in the same run on the same GPU.
# The working tree is the new version; the base is the same tree with PATCH (`git diff BASE -- src`, saved in the
# tree) reversed. Builds both at once; on the new build the GPU tests FIRST_TESTS; the A/B bench, base and new
# interleaved ROUNDS times (default 2) over GRID; memcheck / racecheck; then with what is left of LIMIT_S (default
# 570) LAST_TESTS and FP8_TESTS with fp8 on its opt-in lean kernel (KVPACK_LEAN_FP8=1). Files in $OUT: log.txt, ab.json (every
# row, "variant" base / new and "round"), env.log.
#   PATCH=bench/results/logs/v42.patch bash bench/tools/v42_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v42_out
root=$(pwd)
W=/tmp/v42_work
rm -rf "$W" /tmp/v42_base && mkdir -p "$W" /tmp/v42_base
cp -r $(ls -A | grep -vE '^(build|build-device|\.git|\.whl)$') /tmp/v42_base/
(cd /tmp/v42_base && patch -s -R -p1 < "$root/$PATCH") || { echo "reverse patch failed"; exit 1; }
(cd /tmp/v42_base && cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPACK_GPU_ONLY=ON \
   -DKVPACK_CUDA_ARCHS=90a-real > "$W/base_build.log" 2>&1 && cmake --build build-device -j8 --target kvpack_cli \
   >> "$W/base_build.log" 2>&1) &
basepid=$!
build_device kvpack_cli kvpack_gpu_tests
grep -E "lean_(q_prep|kernel|merge)" -A2 "$OUT/build.log" | grep -E "registers|spill" | head -20
T=./build-device/kvpack_gpu_tests
K=./build-device/kvpack
$T --gtest_filter="${FIRST_TESTS:-PagedWriteGpu.*:PagedDequantGpu.*:DecodeGpu.EmptySequence*:DecodeGpu.GraphCapture*:DecodeGpu.BadArguments*:DecodeGpu.BitwiseIdentical*}" > "$W/tests_first.log" 2>&1
stamp "first GPU tests rc=$?"; grep -E "^\[  (FAILED|PASSED)|^\[       OK|Failure|rror" "$W/tests_first.log" | head -30
wait $basepid; rc=$?
stamp "base build rc=$rc"; [ $rc -eq 0 ] || tail -20 "$W/base_build.log"
GRID=${GRID:---formats fp8,q4,q3 --shapes 32/8/128,8/1/128 --batch 1,8,64 --context 32768,131072}
: > "$W/ab.log"
for r in $(seq 1 ${ROUNDS:-2}); do
  for v in base new; do
    bin=$K; [ $v = base ] && bin=/tmp/v42_base/build-device/kvpack
    [ -x "$bin" ] || continue
    echo "== $v round $r" >> "$W/ab.log"
    env ${AB_ENV:-} $bin bench $GRID --json "$W/ab_${v}_$r.json" 2>&1 | grep -vE " write" >> "$W/ab.log"
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
left() { echo $(( ${LIMIT_S:-570} - ($(date +%s) - t0) )); }
S=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
{ echo "== memcheck"; timeout 90 $S --tool memcheck --error-exitcode 9 $T \
    --gtest_filter='DecodeGpu.EmptySequence*:DecodeGpu.GraphCapture*:DecodeGpu.BadArguments*'; echo "rc=$?";
  echo "== racecheck"; timeout 60 $S --tool racecheck --error-exitcode 9 $T \
    --gtest_filter='DecodeGpu.EmptySequence*:DecodeGpu.GraphCapture*'; echo "rc=$?"; } > "$W/sanitizer.log" 2>&1
stamp "sanitizer done"; grep -E "^==|ERROR SUMMARY|SUMMARY|rc=" "$W/sanitizer.log" | head -20
l=$(left); timeout $((l > 60 ? l - 20 : 10)) $T --gtest_filter="${LAST_TESTS:-DecodeGpu.LongContext*:DecodeGpu.RandomShapes*}" > "$W/tests_last.log" 2>&1
stamp "last GPU tests rc=$?"; grep -E "^\[  (FAILED|PASSED)|^\[       OK|Failure|rror" "$W/tests_last.log" | head -30
l=$(left); KVPACK_LEAN_FP8=1 timeout $((l > 30 ? l - 10 : 5)) $T --gtest_filter="${FP8_TESTS:-DecodeGpu.RandomShapes*}" > "$W/tests_leanfp8.log" 2>&1
stamp "GPU tests (KVPACK_LEAN_FP8=1) rc=$?"; grep -E "^\[  (FAILED|PASSED)|^\[       OK|Failure|rror" "$W/tests_leanfp8.log" | head -10
{ cat "$OUT/env.log"; echo "== build"; grep -E "registers|spill|error" "$OUT/build.log" | head -60;
  echo "== tests (first)"; cat "$W/tests_first.log"; echo "== tests (last)"; cat "$W/tests_last.log"; echo "== tests (KVPACK_LEAN_FP8=1)"; cat "$W/tests_leanfp8.log";
  echo "== ab"; cat "$W/ab.log"; echo "== ab summary"; cat "$W/ab_summary.txt"; echo "== sanitizer"; cat "$W/sanitizer.log"; } > "$OUT/log.txt"
rm -f "$OUT/build.log"

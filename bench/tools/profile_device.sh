#!/usr/bin/env bash
# One device call: build, a quick GPU test subset, then a source-level ncu profile (SASS lines with executed
# instructions and stall samples) of one decode launch per format, summarised by bench/tools/ncu_hot.py.
#   PROFILE_FORMATS="fp8 q4" PROFILE_SHAPE=32/8/128 PROFILE_BATCH=8 PROFILE_CTX=32k bash bench/tools/profile_device.sh
set -u
OUT=${OUT:-/tmp/kvpack_out}
cd "$(dirname "$0")/../.."
bash bench/run_device.sh build > "$OUT/build_step.log" 2>&1 || { tail -30 "$OUT/build_step.log"; exit 1; }
B=build-device
./$B/kvpack_gpu_tests --gtest_filter="${GTEST_FILTER:-DecodeGpu.BitwiseIdentical*:PagedDequantGpu.*:DecodeGpu.GraphCapture*:DecodeGpu.EmptySequence*}" 2>&1 | grep -E "^\[  (FAILED|PASSED)|Failure" | head -20
for f in ${PROFILE_FORMATS:-fp8 q4}; do
  timeout 240 ncu --kernel-name regex:decode_kernel --launch-skip 3 --launch-count 1 --set full --import-source yes \
    --page source --print-source sass --csv ./$B/kvpack bench --formats "$f" --shapes "${PROFILE_SHAPE:-32/8/128}" \
    --batch "${PROFILE_BATCH:-8}" --context "${PROFILE_CTX:-32k}" --iters 5 > "$OUT/src_$f.csv" 2>&1
  echo "== $f rc=$?"
  python3 bench/tools/ncu_hot.py "$OUT/src_$f.csv" 50 > "$OUT/hot_$f.txt" 2>&1
  head -45 "$OUT/hot_$f.txt"
done

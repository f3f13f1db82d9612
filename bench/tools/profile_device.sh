#!/usr/bin/env bash
# One device call: build, a quick GPU test subset, then one ncu profile (--set full, source counters) of one decode
# launch per format, exported once and printed three ways into $OUT/hot_<format>.txt: hottest SASS lines and opcode
# histogram (bench/tools/ncu_hot.py), hottest CUDA source lines (same script on the cuda view: needs -lineinfo,
# which the build has), and the warp-state / occupancy sections of the details page.
#   PROFILE_FORMATS="fp8 q4" PROFILE_SHAPE=32/8/128 PROFILE_BATCH=8 PROFILE_CTX=32k bash bench/tools/profile_device.sh
# SKIP_BUILD=1 skips the build and the tests (when a previous step of the same call built the tree).
set -u
OUT=${OUT:-/tmp/kvpack_out}
cd "$(dirname "$0")/../.."
B=build-device
if [ -z "${SKIP_BUILD:-}" ]; then
  bash bench/run_device.sh build > "$OUT/build_step.log" 2>&1 || { tail -30 "$OUT/build_step.log"; exit 1; }
  ./$B/kvpack_gpu_tests --gtest_filter="${GTEST_FILTER:-DecodeGpu.BitwiseIdentical*:PagedDequantGpu.*:DecodeGpu.GraphCapture*:DecodeGpu.EmptySequence*}" 2>&1 | grep -E "^\[  (FAILED|PASSED)|Failure" | head -20
fi
tmp=$(mktemp -d)
for f in ${PROFILE_FORMATS:-fp8 q4}; do
  timeout 300 ncu --kernel-name regex:decode_kernel --launch-skip 3 --launch-count 1 --set full --import-source yes \
    -f -o "$tmp/prof_$f" ./$B/kvpack bench --formats "$f" --shapes "${PROFILE_SHAPE:-32/8/128}" \
    --batch "${PROFILE_BATCH:-8}" --context "${PROFILE_CTX:-32k}" --iters 5 > "$tmp/ncu_$f.log" 2>&1
  echo "== $f rc=$?"
  rep="$tmp/prof_$f.ncu-rep"
  ncu --import "$rep" --page source --print-source sass --csv > "$tmp/sass_$f.csv" 2>&1
  ncu --import "$rep" --page source --print-source cuda --csv > "$tmp/cuda_$f.csv" 2>&1
  {
    echo "##### SASS view"; python3 bench/tools/ncu_hot.py "$tmp/sass_$f.csv" 50
    echo; echo "##### CUDA source view"; python3 bench/tools/ncu_hot.py "$tmp/cuda_$f.csv" 40
    echo; echo "##### details (warp state, occupancy, launch)"
    ncu --import "$rep" --page details --section WarpStateStats --section Occupancy --section LaunchStats \
      --section SpeedOfLight --section SchedulerStats 2>&1
  } > "$OUT/hot_$f.txt" 2>&1
  sed -n '1,40p' "$OUT/hot_$f.txt"
done
rm -rf "$tmp"

#!/usr/bin/env bash
# One device call: build, a quick GPU test subset, then one ncu profile (--set full, source counters) of one decode
# launch per format, exported once and printed three ways into $OUT/hot_<format>.txt: hottest SASS lines and opcode
# histogram (bench/tools/ncu_hot.py), hottest CUDA source lines (same script on the cuda view: needs -lineinfo,
# which the build has), and the warp-state / occupancy sections of the details page.
#   PROFILE_FORMATS="fp8 q4" PROFILE_SHAPE=32/8/128 PROFILE_BATCH=8 PROFILE_CTX=32k bash bench/tools/profile_device.sh
# NCU_ARGS adds ncu options (e.g. "--warp-sampling-interval 0" for more stall samples of a short kernel).
# PROFILE_KERNEL: the kernel-name regex (default decode_kernel; the lean path's: lean_kernel); PROFILE_BENCH_ARGS adds
# `kvpack bench` options (the lean kernel: --eager, since ncu does not see the kernels of a replayed CUDA graph).
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
  timeout 300 ncu --kernel-name regex:${PROFILE_KERNEL:-decode_kernel} --launch-skip 3 --launch-count 1 --set full --import-source yes ${NCU_ARGS:-} \
    -f -o "$tmp/prof_$f" ./$B/kvpack bench --formats "$f" --shapes "${PROFILE_SHAPE:-32/8/128}" \
    --batch "${PROFILE_BATCH:-8}" --context "${PROFILE_CTX:-32k}" --iters 5 ${PROFILE_BENCH_ARGS:-} > "$tmp/ncu_$f.log" 2>&1
  echo "== $f rc=$?"
  rep="$tmp/prof_$f.ncu-rep"
  ncu --import "$rep" --page source --print-source sass --csv > "$tmp/sass_$f.csv" 2>&1
  ncu --import "$rep" --page source --print-source cuda --csv > "$tmp/cuda_$f.csv" 2>&1
  [ -n "${KEEP_SASS:-}" ] && gzip -c "$tmp/sass_$f.csv" > "$OUT/sass_$f.csv.gz"
  {
    echo "##### SASS view"; python3 bench/tools/ncu_hot.py "$tmp/sass_$f.csv" ${HOT_N:-50}
    echo; echo "##### CUDA source view"; python3 bench/tools/ncu_hot.py "$tmp/cuda_$f.csv" 40
    echo; echo "##### stall reasons (sampled warp states, share of all samples)"
    ncu --import "$rep" --page raw --csv > "$tmp/raw_$f.csv" 2>&1
    python3 - "$tmp/raw_$f.csv" <<'PY'
import csv, io, sys
t = open(sys.argv[1], errors="replace").read()
rows = list(csv.reader(io.StringIO(t[t.find('"ID"'):] if '"ID"' in t else t)))
hdr, val = rows[0], rows[-1]
num = lambda x: float(x.replace(",", "")) if x.replace(",", "").replace(".", "", 1).isdigit() else 0.0
st = {h: num(v) for h, v in zip(hdr, val) if h.startswith("smsp__pcsamp_warps_issue_stalled_") and not h.endswith("_not_issued")}
tot = sum(st.values()) or 1
for h, v in sorted(st.items(), key=lambda kv: -kv[1])[:16]:
    print(f"  {h.replace('smsp__pcsamp_warps_issue_stalled_', ''):28} {v:12,.0f} {100 * v / tot:5.1f}%")
PY
    echo; echo "##### details (warp state, occupancy, launch)"
    ncu --import "$rep" --page details --section WarpStateStats --section Occupancy --section LaunchStats \
      --section SpeedOfLight --section SchedulerStats 2>&1
  } > "$OUT/hot_$f.txt" 2>&1
  sed -n '1,40p' "$OUT/hot_$f.txt"
done
rm -rf "$tmp"

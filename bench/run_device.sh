#!/usr/bin/env bash
# One device call: build the GPU-only tree, run the GPU tests (plain, then memcheck/racecheck on a small subset),
# the benchmark, optionally the tuner; logs and JSON go to $OUT (at most 8 files come back).
#   bash bench/run_device.sh [STEPS]    STEPS: comma list of build,test,sanitize,bench,flashinfer,tune,sass
#                                       (default build,test,sanitize,bench,flashinfer)
# Env: BENCH_ARGS (extra `kvpack bench` options), TUNE_ARGS, TABLE_FILE (bench's table when this call did not tune;
# the tune step also leaves its table at build-device/tune.json for a later call on the same warm machine),
# GTEST_FILTER (for the test step), FI_ARGS (extra bench/flashinfer/fi_bench.py options), FI_DIR (folder of the
# carried FlashInfer files, default .whl).
# The flashinfer step (after bench) runs FlashInfer's fp8 decode (XQA and the tensor-core wrapper) on the grid of
# $OUT/bench.json and writes its rows into that same file; it needs the files of bench/flashinfer/fetch_flashinfer.sh
# carried in FI_DIR (or flashinfer importable), else it says so and skips.
set -u
STEPS=${1:-build,test,sanitize,bench,flashinfer}
OUT=${OUT:-/tmp/kvpack_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
B=build-device
has() { [[ ",$STEPS," == *",$1,"* ]]; }
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
  nvcc --version | tail -2
} > "$OUT/env.log" 2>&1

if has build; then
  stamp "configure+build"
  { cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPACK_GPU_ONLY=ON -DKVPACK_CUDA_ARCHS=90a-real \
      && cmake --build $B -j16 --target kvpack_gpu_tests kvpack_cli kvpack_capi; } > "$OUT/build.log" 2>&1
  rc=$?; stamp "build rc=$rc"; grep -E "error|registers|spill" "$OUT/build.log" | grep -v "0 bytes spill" | head -40
  [ $rc -eq 0 ] || { tail -50 "$OUT/build.log"; exit 1; }
fi

if has test; then
  stamp "gpu tests"
  ./$B/kvpack_gpu_tests --gtest_filter="${GTEST_FILTER:-*}" > "$OUT/tests.log" 2>&1
  stamp "gpu tests rc=$?"; grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[       OK|Failure|error" "$OUT/tests.log" | head -60
fi

if has sanitize; then
  stamp "compute-sanitizer"
  S=compute-sanitizer
  command -v $S >/dev/null || S=/usr/local/cuda/bin/compute-sanitizer
  small='PagedWriteGpu.OutOfRange*:DecodeGpu.BadArguments*:DecodeGpu.EmptySequence*:DecodeGpu.GraphCapture*:PagedDequantGpu.*'
  { echo "== memcheck"; $S --tool memcheck --error-exitcode 9 ./$B/kvpack_gpu_tests --gtest_filter="$small:PagedWriteGpu.DecodeStep*"; echo "rc=$?";
    echo "== racecheck"; $S --tool racecheck --error-exitcode 9 ./$B/kvpack_gpu_tests --gtest_filter='DecodeGpu.EmptySequence*:DecodeGpu.GraphCapture*'; echo "rc=$?";
    echo "== synccheck"; $S --tool synccheck --error-exitcode 9 ./$B/kvpack_gpu_tests --gtest_filter='DecodeGpu.EmptySequence*'; echo "rc=$?";
  } > "$OUT/sanitizer.log" 2>&1
  stamp "sanitizer done"; grep -E "^==|ERROR SUMMARY|rc=|PASSED|FAILED" "$OUT/sanitizer.log" | head -30
fi

if has tune; then
  stamp "tune"
  ./$B/kvpack tune ${TUNE_ARGS:-} -o "$OUT/tune.json" > "$OUT/tune.log" 2>&1
  stamp "tune rc=$?"; tail -5 "$OUT/tune.log"
  cp "$OUT/tune.json" $B/tune.json 2>/dev/null || true   # a later call on the same warm machine: TABLE_FILE=$B/tune.json
fi

if has bench; then
  stamp "bench"
  TABLE=""
  [ -f "$OUT/tune.json" ] && TABLE="--table $OUT/tune.json"
  [ -z "$TABLE" ] && [ -n "${TABLE_FILE:-}" ] && TABLE="--table $TABLE_FILE"
  ./$B/kvpack bench $TABLE ${BENCH_ARGS:-} --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
  stamp "bench rc=$?"; grep -vE "^(bf16|fp8|int4|int4h|q4|q3.5|q3) +write" "$OUT/bench.log" | tail -60
fi

if has flashinfer; then
  stamp "flashinfer baseline"
  FI_DIR=${FI_DIR:-.whl}
  FI_TAR=$(ls "$FI_DIR"/flashinfer-*.tar.xz 2>/dev/null | head -1)
  if [ -n "$FI_TAR" ]; then
    mkdir -p /tmp/site
    if ls "$FI_DIR"/*.whl >/dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$FI_DIR"/*.whl 2>&1 | grep -v "WARNING: Running pip as" || true
    fi
    tar -xJf "$FI_TAR" -C /tmp/site
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  if [ -n "$FI_TAR" ] || python3 -c "import flashinfer" >/dev/null 2>&1; then
    [ -f "$OUT/bench.json" ] || echo "flashinfer: no $OUT/bench.json (bench step not run): own run_id, no kvpack ratios"
    FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fiws} PYTHONUNBUFFERED=1 \
      python3 bench/flashinfer/fi_bench.py --kvpack-json "$OUT/bench.json" --capi $B/libkvpack_capi.so \
      --out "$OUT/bench.json" ${FI_ARGS:-} > "$OUT/flashinfer.log" 2>&1
    stamp "flashinfer rc=$?"; grep -vE "^ *(File|\^|~)" "$OUT/flashinfer.log" | tail -60
  else
    stamp "flashinfer: not importable and no $FI_DIR/flashinfer-*.tar.xz carried (bench/flashinfer/fetch_flashinfer.sh): skipped"
  fi
fi

if has sass; then
  # Instruction histogram of the decode kernels: tensor-core (HMMA), async copies, shared loads, FMAs, shuffles.
  for f in $B/CMakeFiles/kvpack_cuda.dir/src/cuda/decode_*.cu.o; do
    echo "== $f"; cuobjdump --dump-sass "$f" 2>/dev/null | grep -oE "HMMA[.A-Z0-9]*|LDGSTS[.A-Z0-9]*|LDS(\.[A-Z0-9]+)*|FFMA|SHFL\.[A-Z]+|F2FP[.A-Z0-9]*|HADD2[.A-Z0-9]*" | sort | uniq -c
  done > "$OUT/sass_counts.txt" 2>&1 || true
  head -40 "$OUT/sass_counts.txt"
fi
stamp "all done"

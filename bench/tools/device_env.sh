# Sourced by the one-call device scripts (lean_device.sh, lean_branch_device.sh, q4_lanes_device.sh, lean_tune_device.sh,
# v47-v56):
#   source "$(dirname "$0")/device_env.sh" DEFAULT_OUT [WORK_DIR [DEFAULT_LIMIT_S]]
# OUT (default DEFAULT_OUT) created, the working directory set to the repository root, `stamp MSG` printing the
# seconds since this point, `left` the seconds left of LIMIT_S (default DEFAULT_LIMIT_S, else 560) since this point,
# W = WORK_DIR emptied (when given), `build_device TARGET...` and the helpers below, and the GPU's name, driver and
# clocks in $OUT/env.log.
set -u
OUT=${OUT:-$1}
mkdir -p "$OUT"
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }
limit_default=${3:-560}
left() { echo $(( ${LIMIT_S:-$limit_default} - ($(date +%s) - t0) )); }
if [ -n "${2:-}" ]; then
  W=$2
  rm -rf "$W" && mkdir -p "$W"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$OUT/env.log" 2>&1
# build_device TARGET...: configure and build the GPU-only tree (build-device, sm_90a) into $OUT/build.log; prints
# the errors and exits the calling script when the build fails.
build_device() {
  { cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPACK_GPU_ONLY=ON -DKVPACK_CUDA_ARCHS=90a-real \
      && cmake --build build-device -j16 --target "$@"; } > "$OUT/build.log" 2>&1
  local rc=$?
  stamp "build rc=$rc"; grep -E "error" -A3 "$OUT/build.log" | head -30
  [ $rc -eq 0 ] || { tail -30 "$OUT/build.log"; exit 1; }
}
# start_base_build DIR JOBS: the working tree copied to DIR with $PATCH (a `git diff BASE -- src include` saved in the
# tree) reversed, its kvpack_cli built into DIR/build-device in the background (log: $W/base_build.log); sets basepid.
start_base_build() {
  local dir=$1 jobs=$2 root
  root=$(pwd)
  rm -rf "$dir" && mkdir -p "$dir"
  cp -r $(ls -A | grep -vE '^(build|build-device|build-stamps|\.git|\.whl)$') "$dir"/
  (cd "$dir" && patch -s -R -p1 < "$root/$PATCH") || { echo "reverse patch failed"; exit 1; }
  (cd "$dir" && cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPACK_GPU_ONLY=ON \
     -DKVPACK_CUDA_ARCHS=90a-real > "$W/base_build.log" 2>&1 && cmake --build build-device -j"$jobs" --target kvpack_cli \
     >> "$W/base_build.log" 2>&1) &
  basepid=$!
}
# start_stamps_build [MACRO DIR JOBS [TARGETS]]: a measurement build of kvpack_cli (or TARGETS, a space-separated
# list) in the background, compiled with -DMACRO into
# DIR (log: $W/<DIR without "build-">_build.log); sets stampspid. Default: the lean path's phase clocks
# (KVPACK_LEAN_STAMPS, bench/NOTES.md v47) into build-stamps with 4 jobs; the small q write's are KVPACK_WRITE_STAMPS
# into build-wstamps (v62; write_stamps_run below).
start_stamps_build() {
  local macro=${1:-KVPACK_LEAN_STAMPS} dir=${2:-build-stamps} jobs=${3:-4} targets=${4:-kvpack_cli}
  local log="$W/${dir#build-}_build.log"
  (cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPACK_GPU_ONLY=ON -DKVPACK_CUDA_ARCHS=90a-real \
     -DCMAKE_CUDA_FLAGS=-D"$macro" > "$log" 2>&1 && cmake --build "$dir" -j"$jobs" \
     --target $targets >> "$log" 2>&1) &
  stampspid=$!
}
# write_stamps_run: after `start_stamps_build KVPACK_WRITE_STAMPS build-wstamps`, the small q write's phase clocks
# (q4 and q3, three shapes, launches of 1, 8 and 64 tokens) through bench/tools/write_stamps.py into $OUT/wstamps.txt,
# the build log's tail into $W/wstamps_build_tail.log.
write_stamps_run() {
  wait $stampspid; stamp "wstamps build rc=$?"
  KVPACK_WRITE_STAMPS_OUT="$W/wstamps_raw.txt" ./build-wstamps/kvpack bench --formats q4,q3 \
    --shapes 8/1/128,32/8/128,9/3/64 --batch 1,8,64 --context 8192 --iters 5 > /dev/null 2>&1
  python3 bench/tools/write_stamps.py "$W/wstamps_raw.txt" > "$OUT/wstamps.txt" 2>&1; stamp "wstamps"
  tail -5 "$W/wstamps_build.log" > "$W/wstamps_build_tail.log"
}
# write_ab BASE_KVPACK ROUNDS: the write A/B of `kvpack bench $GRID`, BASE_KVPACK (the base build's binary) against
# ./build-device/kvpack, for ROUNDS rounds, who goes first alternating (odd rounds the base); after each round the
# summary into $OUT/ab_write.json and $OUT/ab_write.txt.
write_ab() {
  local base=$1 r
  for r in $(seq 1 "$2"); do
    if [ $((r % 2)) -eq 1 ]; then
      "$base" bench $GRID --json "$W/ab_base_$r.json" > /dev/null 2>&1
      ./build-device/kvpack bench $GRID --json "$W/ab_new_$r.json" > /dev/null 2>&1
    else
      ./build-device/kvpack bench $GRID --json "$W/ab_new_$r.json" > /dev/null 2>&1
      "$base" bench $GRID --json "$W/ab_base_$r.json" > /dev/null 2>&1
    fi
    stamp "write round $r"
    AB_KIND=write python3 bench/tools/ab_summary.py "$W" "$OUT/ab_write.json" > "$OUT/ab_write.txt"
  done
}
# lean_registers: the lean path's kernels' registers and spills from $OUT/build.log, counted.
lean_registers() {
  grep -E "lean_(q_prep|kernel|merge)" -A2 "$OUT/build.log" | grep -E "registers|spill" | sort | uniq -c | head -20
}
# bench_ab DIR ROUNDS NAME=BINARY ...: `BINARY bench $GRID` of each build for ROUNDS rounds, the order reversed on even
# rounds, into DIR/ab_NAME_ROUND.json (names without "_"; one of them "base"); after each round the summary
# (bench/tools/ab_summary.py) into $OUT/ab_<DIR's name>.json and .txt. (For new scripts: write_ab and the v64 / v68
# loops are older copies of this.)
bench_ab() {
  local dir=$1 rounds=$2 r v
  shift 2
  mkdir -p "$dir"
  for r in $(seq 1 "$rounds"); do
    [ "$(left)" -gt 30 ] || break  # the rounds already summarised stay in $OUT
    local order=("$@")
    [ $((r % 2)) -eq 0 ] && order=($(printf '%s\n' "$@" | tac))
    for v in "${order[@]}"; do "${v#*=}" bench $GRID --json "$dir/ab_${v%%=*}_$r.json" > /dev/null 2>&1; done
    stamp "A/B round $r"
    python3 bench/tools/ab_summary.py "$dir" "$OUT/ab_$(basename "$dir").json" > "$OUT/ab_$(basename "$dir").txt"
  done
}
# ncu_one FILE KERNEL_REGEX "BENCH CELL ARGS" [NCU_ARGS ...]: ncu (clocks not locked) of the 4th launch matching
# KERNEL_REGEX in `kvpack bench CELL --iters 5 --eager` (eager: ncu does not see a replayed graph's kernels), its
# report appended to FILE. One run per call, so that an unknown metric name costs only that run. NCU_TIMEOUT: its
# limit in seconds (default 45).
ncu_one() {
  local f=$1 kern=$2 cell=$3 ncu
  shift 3
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  timeout "${NCU_TIMEOUT:-45}" $ncu --kernel-name regex:$kern --launch-skip 3 --launch-count 1 --clock-control none "$@" \
    ./build-device/kvpack bench $cell --iters 5 --eager 2>&1 | grep -vE "^==PROF==|^\s*$" >> "$f"
}
# ab_env DIR NAME ROUNDS VAR VALUES...: `kvpack bench $GRID` with VAR=value for each value (the first one "base", the
# others "<NAME><value>"), ROUNDS rounds alternating the order, summaries into $OUT/ab_NAME.json/.txt.
ab_env() {
  local dir=$1 name=$2 rounds=$3 var=$4 r v n
  shift 4
  mkdir -p "$dir"
  local first=$1
  for r in $(seq 1 "$rounds"); do
    [ "$(left)" -gt 60 ] || break
    local order=("$@")
    [ $((r % 2)) -eq 0 ] && order=($(printf '%s\n' "$@" | tac))
    for v in "${order[@]}"; do
      n=$name$v; [ "$v" = "$first" ] && n=base
      env "$var=$v" ./build-device/kvpack bench $GRID --json "$dir/ab_${n}_$r.json" > /dev/null 2>&1
    done
    stamp "A/B $name round $r"
    python3 bench/tools/ab_summary.py "$dir" "$OUT/ab_$name.json" > "$OUT/ab_$name.txt"
  done
}
# fi_site: FlashInfer's wheels and its JIT tree (carried in .whl/, bench/flashinfer/fetch_flashinfer.sh) installed into
# /tmp/site (run Python with PYTHONPATH=/tmp/site); fails when .whl/ holds no FlashInfer tree.
fi_site() {
  local tar
  tar=$(ls .whl/flashinfer-*.tar.xz 2>/dev/null | head -1)
  [ -n "$tar" ] || return 1
  mkdir -p /tmp/site
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
  tar -xJf "$tar" -C /tmp/site
}
# ab_bench VARIANT ROUND [VAR=VALUE ...]: build-device's `kvpack bench $GRID` with those environment variables (the
# lean path's measurement switches) into $W/ab_VARIANT_ROUND.json, the file names bench/tools/ab_summary.py reads.
ab_bench() {
  local v=$1 r=$2
  shift 2
  env "$@" ./build-device/kvpack bench $GRID --json "$W/ab_${v}_$r.json" > /dev/null 2>&1
}
# sanitize_small TESTS SECONDS MEMCHECK_FILTER: memcheck (MEMCHECK_FILTER) then racecheck (empty sequences, graph
# capture) of the test binary TESTS within SECONDS in all, into $W/sanitizer.log; prints the summaries.
sanitize_small() {
  local t=$1 l=$2 filter=$3 s
  s=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  { echo "== memcheck"; timeout $(((l - 10) / 2)) $s --tool memcheck --error-exitcode 9 $t --gtest_filter="$filter"
    echo "rc=$?"
    echo "== racecheck"; timeout $(((l - 10) / 2)) $s --tool racecheck --error-exitcode 9 $t \
      --gtest_filter='DecodeGpu.EmptySequence*:DecodeGpu.GraphCapture*'
    echo "rc=$?"; } > "$W/sanitizer.log" 2>&1
  stamp "sanitizers done"; grep -E "^==|ERROR SUMMARY|rc=" "$W/sanitizer.log" | head -8
}
# fi_grid: the full benchmark grid (every format, both shapes, batch 1-64 x 8k-128k; FI_BENCH overrides it) with
# FlashInfer's fp8 decode in the same run (bench/run_device.sh bench,flashinfer) into $W/fi, its JSON copied to
# $OUT/bench_fi.json.
fi_grid() {
  OUT=$W/fi BENCH_ARGS="${FI_BENCH:---formats bf16,fp8,int4,int4h,q4,q3.5,q3 --shapes 32/8/128,8/1/128 --batch 1,8,16,32,64 --context 8192,32768,65536,131072}" \
    bash bench/run_device.sh bench,flashinfer > "$W/fi_stdout.log" 2>&1
  stamp "bench + flashinfer rc=$?"
  cp "$W/fi/bench.json" "$OUT/bench_fi.json" 2>/dev/null
}
# memcheck_small FILTER: memcheck of the GPU tests ($T) matching FILTER within what is left of LIMIT_S (less 10 s),
# into $W/sanitizer.log, when more than 30 s are left.
memcheck_small() {
  local s
  s=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  [ "$(left)" -gt 30 ] || return 0
  { echo "== memcheck"; timeout $(( $(left) - 10 )) $s --tool memcheck --error-exitcode 9 $T --gtest_filter="$1"
    echo "rc=$?"; } > "$W/sanitizer.log" 2>&1
  stamp "sanitizer"
}
# sanitize_formats FILE SECONDS FILTER FORMAT...: compute-sanitizer memcheck then racecheck of the GPU tests ($T)
# matching FILTER, once per format (KVPACK_TEST_FORMATS), each run within SECONDS, into FILE.
sanitize_formats() {
  local file=$1 secs=$2 filter=$3 s f tool
  shift 3
  s=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  { for f in "$@"; do for tool in memcheck racecheck; do
      echo "== $tool $f"
      KVPACK_TEST_FORMATS=$f timeout "$secs" $s --tool $tool --error-exitcode 9 $T --gtest_filter="$filter"
      echo "rc=$?"
    done; done; } > "$file" 2>&1
  stamp "sanitizers"
}
# test_outcomes FILE: a gtest log's outcome lines (passed / failed tests, failures, errors).
test_outcomes() {
  grep -E "^\[  (FAILED|PASSED)|^\[       OK|Failure|rror" "$1" 2>/dev/null | head -40
}
# gpu_tests NAME SECONDS FILTER [VAR=VALUE ...]: the GPU tests ($T) matching the gtest FILTER, with those environment
# variables, within SECONDS (0: no limit), into $W/NAME.log; prints the exit status and the outcome lines.
gpu_tests() {
  local name=$1 secs=$2 filter=$3
  shift 3
  if [ "$secs" -gt 0 ]; then
    env "$@" timeout "$secs" $T --gtest_filter="$filter" > "$W/$name.log" 2>&1
  else
    env "$@" $T --gtest_filter="$filter" > "$W/$name.log" 2>&1
  fi
  stamp "$name rc=$?"
  test_outcomes "$W/$name.log"
}
# report: $OUT/log.txt from what the v50-style scripts have run so far (env, registers, the first tests,
# the A/B's summary, the grid with FlashInfer, the other tests, the sanitizers), rewritten after each step so that a
# call cut short still returns it. AB_TITLE names the A/B section.
report() {
  { cat "$OUT/env.log"; echo "== build"; grep -E "registers|spill|error" "$OUT/build.log" 2>/dev/null | head -80;
    echo "== tests (first)"; grep -vE "^/.*Failure$" "$W/tests_first.log" 2>/dev/null | tail -60;
    echo "== ${AB_TITLE:-A/B}"; cat "$W/ab_summary.txt" 2>/dev/null;
    echo "== bench + flashinfer"; cat "$W/fi_stdout.log" 2>/dev/null;
    grep -vE " write" "$W/fi/bench.log" 2>/dev/null | tail -40; tail -30 "$W/fi/flashinfer.log" 2>/dev/null;
    echo "== tests"; grep -vE "^/.*Failure$" "$W/tests.log" 2>/dev/null | tail -120;
    echo "== sanitizers"; tail -30 "$W/sanitizer.log" 2>/dev/null; } > "$OUT/log.txt"
}
# ab_done NAME: the A/B's rows into $OUT/NAME.json and its summary into $W/ab_summary.txt (printed), then report.
ab_done() {
  stamp "$AB_TITLE"
  python3 bench/tools/ab_summary.py "$W" "$OUT/$1.json" | tee "$W/ab_summary.txt"
  report
}
# finish_call: what the v50-style scripts run after their A/B, each while enough of LIMIT_S is left: the full grid
# with FlashInfer, the GPU tests not in $FIRST, memcheck and racecheck of the small tests; report after each.
finish_call() {
  local l
  [ "$(left)" -gt 180 ] && fi_grid
  report
  l=$(left)
  [ "$l" -gt 100 ] && gpu_tests tests $((l - 60)) "-$FIRST"
  report
  l=$(left)
  [ "$l" -gt 40 ] && sanitize_small $T $l 'DecodeGpu.EmptySequence*:DecodeGpu.GraphCapture*:DecodeGpu.BadArguments*:PagedWriteGpu.OutOfRange*'
  report
  rm -f "$OUT/build.log"
}

#!/usr/bin/env bash
# The full device call of a kernel version: build, all GPU tests, sanitizers, the benchmark with a given table,
# the q formats once more with the fallback plans (comparison), and FlashInfer's fp8 decode in the same run.
#   TABLE=bench/results/tune_v9.json bash bench/tools/full_device.sh     (device tool, carry [".whl"])
set -u
OUT=${OUT:-/tmp/kvpack_out}
cd "$(dirname "$0")/../.."
TABLE=${TABLE:-bench/results/tune_v9.json}
BENCH_ARGS="--table $TABLE" bash bench/run_device.sh build,test,sanitize,bench 2>&1 | grep -vE "^ptxas|^q|^bf16|^fp8|^int4" | tail -40
./build-device/kvpack bench --formats q4,q3.5,q3 --table bench/results/tune_v4.json --json "$OUT/bench_qfallback.json" \
  > /dev/null 2>&1; echo "q fallback bench rc=$?"
rm -f "$OUT/build.log.gz"; gzip -f "$OUT/build.log" 2>/dev/null; rm -f "$OUT/build.log.gz"
bash bench/run_device.sh flashinfer 2>&1 | tail -5
python3 bench/summarize.py "$OUT/bench.json" | head -5

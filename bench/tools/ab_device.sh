#!/usr/bin/env bash
# One device call comparing a change against its base in the same run on the same GPU: the working tree is the new
# version, the base is the same tree with PATCH reversed (PATCH = `git diff BASE` saved in the tree). Builds both,
# runs the GPU tests (GTEST_FILTER, default all) and the sanitizers on the new build, then `kvpack bench` with the
# same table and arguments for base and new, and prints new/base time ratios.
#   PATCH=bench/v14.patch BENCH_ARGS="--formats fp8,q4 --batch 8,64 --context 32k,128k" bash bench/tools/ab_device.sh
# Files in $OUT: tests.log, sanitizer.log, bench_base.json, bench.json, ab.txt (+ env.log).
set -u
OUT=${OUT:-/tmp/kvpack_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
TABLE=${TABLE:-bench/results/tune_v9.json}
root=$(pwd)
rm -rf /tmp/base && mkdir -p /tmp/base && cp -r $(ls -A | grep -vE '^(build|build-device|\.git|\.whl)$') /tmp/base/
(cd /tmp/base && patch -s -R -p1 < "$root/$PATCH") || { echo "reverse patch failed"; exit 1; }
(cd /tmp/base && cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPACK_GPU_ONLY=ON \
   -DKVPACK_CUDA_ARCHS=90a-real > /tmp/base_cfg.log 2>&1 && cmake --build build-device -j16 --target kvpack_cli \
   > /tmp/base_build.log 2>&1) &
basepid=$!
bash bench/run_device.sh ${STEPS:-build,test,sanitize} 2>&1 | grep -vE "^ptxas|^q|^bf16|^fp8|^int4" | tail -40
wait $basepid || { echo "base build failed"; tail -20 /tmp/base_build.log; exit 1; }
rm -f "$OUT"/build.log
for t in base new; do
  bin=./build-device/kvpack; js=$OUT/bench.json
  [ $t = base ] && bin=/tmp/base/build-device/kvpack && js=$OUT/bench_base.json
  s=$(date +%s)
  $bin bench --table "$TABLE" ${BENCH_ARGS:-} --json "$js" > "/tmp/bench_$t.log" 2>&1
  echo "bench ($t) rc=$? $(( $(date +%s) - s )) s"
done
python3 - "$OUT/bench_base.json" "$OUT/bench.json" <<'PY' | tee "$OUT/ab.txt"
import json, sys
load = lambda f: {(r["format"], r["num_qo_heads"], r["num_kv_heads"], r["batch"], r["context"], r.get("num_tokens", 0), r["kind"]): r
                  for r in json.load(open(f)) if r.get("impl", "kvpack") == "kvpack"}
a, b = load(sys.argv[1]), load(sys.argv[2])
print(f"{'format':6} {'shape':8} {'batch':>5} {'ctx':>7} {'base us':>9} {'new us':>9} {'speedup':>7}  {'new %read':>9}")
for k in sorted(b, key=lambda k: (k[6], k[0], -k[1], k[3], k[4], k[5])):
    if k not in a: continue
    ra, rb = a[k], b[k]
    what = f"{k[3]:5} {k[4]:7}" if k[6] == "decode" else f"write {k[5]:>7} tok"
    print(f"{k[0]:6} {k[1]}q/{k[2]}kv {what} {ra['median_us']:9.1f} {rb['median_us']:9.1f} {ra['median_us'] / rb['median_us']:7.3f}  {100 * rb.get('frac_read_bw', 0):8.1f}%")
PY

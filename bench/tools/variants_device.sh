#!/usr/bin/env bash
# One device call comparing compile-time variants of the same tree in the same run on the same GPU: the main build
# (run_device.sh's build step, then STEPS, default test,sanitize, while the variants build), one build per variant
# with extra CUDA flags (kvpack_cli only), then `kvpack bench` with the same table and arguments on the main build
# and on every variant, and the main/variant time ratios (> 1: the variant is faster).
#   VARIANTS="fixed4:-DKVPACK_EXP_FIXED4=1 raw:-DKVPACK_EXP_FIXED4=2" \
#     BENCH_ARGS="--formats fp8,q4 --batch 8,64 --context 32k,128k" bash bench/tools/variants_device.sh
# Variants may compute wrong values (speed-of-light experiments): only the main build is tested.
# VAR_BENCH_ARGS: the variants' bench options when they differ from the main build's (e.g. only the formats a
# variant changes; the table below then shows "-" for the rest), default BENCH_ARGS.
# Files in $OUT: the run_device.sh logs, bench_main.json, bench_<variant>.json, variants.txt.
set -u
OUT=${OUT:-/tmp/kvpack_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
TABLE=${TABLE:-bench/results/tune_v9.json}
bash bench/run_device.sh build 2>&1 | tail -5
pids=()
for v in ${VARIANTS:-}; do
  name=${v%%:*} flags=${v#*:}
  (cmake -S . -B "build-var-$name" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPACK_GPU_ONLY=ON -DKVPACK_CUDA_ARCHS=90a-real \
     "-DCMAKE_CUDA_FLAGS=$flags" > "/tmp/var_$name.cfg.log" 2>&1 &&
   cmake --build "build-var-$name" -j8 --target kvpack_cli > "/tmp/var_$name.build.log" 2>&1) &
  pids+=($!)
done
[ -n "${STEPS-test,sanitize}" ] && bash bench/run_device.sh "${STEPS-test,sanitize}" 2>&1 | tail -40
for pid in "${pids[@]}"; do wait "$pid" || echo "a variant build failed"; done
run_bench() {  # name binary [args]
  local s; s=$(date +%s)
  "$2" bench --table "$TABLE" ${3:-${BENCH_ARGS:-}} --json "$OUT/bench_$1.json" > "/tmp/bench_$1.log" 2>&1
  echo "bench ($1) rc=$? $(( $(date +%s) - s )) s"
}
run_bench main ./build-device/kvpack
names=()
for v in ${VARIANTS:-}; do
  name=${v%%:*}
  if [ -x "build-var-$name/kvpack" ]; then run_bench "$name" "build-var-$name/kvpack" "${VAR_BENCH_ARGS:-}"; names+=("$name");
  else echo "variant $name: no binary"; tail -20 "/tmp/var_$name.build.log"; fi
done
python3 - "$OUT" "${names[@]}" <<'PY' | tee "$OUT/variants.txt"
import json, sys
out, names = sys.argv[1], sys.argv[2:]
load = lambda n: {(r["format"], r["num_qo_heads"], r["num_kv_heads"], r["batch"], r["context"]): r
                  for r in json.load(open(f"{out}/bench_{n}.json")) if r.get("kind") == "decode"}
main = load("main")
var = {n: load(n) for n in names}
print(f"{'format':6} {'shape':8} {'batch':>5} {'ctx':>7} {'main us':>9} {'%read':>6}" +
      "".join(f" {n + ' us':>12} {'speedup':>7}" for n in names))
for k in sorted(main, key=lambda k: (k[0], -k[1], k[3], k[4])):
    r = main[k]
    line = f"{k[0]:6} {k[1]}q/{k[2]}kv {k[3]:5} {k[4]:7} {r['median_us']:9.1f} {100 * r.get('frac_read_bw', 0):5.1f}%"
    for n in names:
        v = var[n].get(k)
        line += f" {v['median_us']:12.1f} {r['median_us'] / v['median_us']:7.3f}" if v else f" {'-':>12} {'-':>7}"
    print(line)
PY

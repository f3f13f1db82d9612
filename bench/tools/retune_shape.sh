#!/usr/bin/env bash
# One device call after a change that affects only some shapes: build, all GPU tests and sanitizers, `kvpack tune`
# for SHAPES x FORMATS only, a merged table (BASE with those entries replaced), then `kvpack bench` on SHAPES with
# BASE and with the merged table in the same run (bench_base.json / bench.json in $OUT).
#   SHAPES=8/1/128 FORMATS=bf16,fp8,q4,q3.5,q3 BASE=bench/results/tune_v9.json bash bench/tools/retune_shape.sh
# TUNE_ARGS (e.g. "--batch 1,8") narrows the tune; BENCH_ARGS goes to both benches; STEPS (default
# build,test,sanitize) to bench/run_device.sh.
set -u
OUT=${OUT:-/tmp/kvpack_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
B=build-device
SHAPES=${SHAPES:-8/1/128}
FORMATS=${FORMATS:-bf16,fp8,q4,q3.5,q3}
BASE=${BASE:-bench/results/tune_v9.json}
bash bench/run_device.sh ${STEPS:-build,test,sanitize} 2>&1 | grep -vE "^ptxas|^q|^bf16|^fp8|^int4" | tail -40
s=$(date +%s)
./$B/kvpack tune --formats "$FORMATS" --shapes "$SHAPES" ${TUNE_ARGS:-} -o /tmp/tune_part.json > "$OUT/tune.log" 2>&1
echo "tune rc=$? $(( $(date +%s) - s )) s"
python3 - "$BASE" /tmp/tune_part.json "$OUT/tune.json" <<'PY'
import json, sys
base, part, out = (json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3])
key = lambda e: (e["format"], e["num_qo_heads"], e["num_kv_heads"], e["head_dim"], e["page_size"], e["batch"], e["context"])
new = {key(e): e for e in part["entries"]}
merged = dict(base)
merged["entries"] = [new.pop(key(e), e) for e in base["entries"]] + list(new.values())
json.dump(merged, open(out, "w"), indent=1)
print(f"merged: {len(part['entries'])} tuned entries into {len(merged['entries'])} -> {out}")
PY
for t in base new; do
  tab=$BASE; js=$OUT/bench_base.json
  [ $t = new ] && tab=$OUT/tune.json && js=$OUT/bench.json
  s=$(date +%s)
  ./$B/kvpack bench --shapes "$SHAPES" --formats "$FORMATS" ${BENCH_ARGS:-} --table "$tab" --json "$js" > "/tmp/bench_$t.log" 2>&1
  echo "bench ($t table) rc=$? $(( $(date +%s) - s )) s"
done
python3 bench/summarize.py "$OUT/bench_base.json" 2>&1 | head -12
python3 bench/summarize.py "$OUT/bench.json" 2>&1 | head -12
rm -f "$OUT"/build.log*

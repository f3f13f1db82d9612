#!/usr/bin/env bash
# One device call: build, `kvpack tune` per format (each format's table is saved on its own, so a time limit loses
# at most the format in progress), the merged table, then `kvpack bench` with it and FlashInfer's fp8 decode in the
# same run.   TUNE_FORMATS="fp8 q4" TUNE_LIMIT=60 bash bench/tools/tune_device.sh      (device tool, carry [".whl"])
set -u
OUT=${OUT:-/tmp/kvpack_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
B=build-device
bash bench/run_device.sh build 2>&1 | tail -3
for f in ${TUNE_FORMATS:-bf16 fp8 int4 int4h q4 q3.5 q3}; do
  s=$(date +%s)
  timeout "${TUNE_LIMIT:-90}" ./$B/kvpack tune --formats "$f" ${TUNE_ARGS:-} -o "/tmp/tune_$f.json" > "/tmp/tune_$f.log" 2>&1
  echo "tune $f rc=$? $(( $(date +%s) - s )) s"
done
python3 - "$OUT/tune.json" /tmp/tune_*.json <<'PY'
import json, sys
out, parts = sys.argv[1], sys.argv[2:]
tables = [json.load(open(p)) for p in parts]
if not tables:
    sys.exit("no per-format tables")
merged = dict(tables[0])
merged["entries"] = [e for t in tables for e in t["entries"]]
json.dump(merged, open(out, "w"), indent=1)
print(f"merged {len(merged['entries'])} entries from {len(parts)} tables into {out}")
PY
cat /tmp/tune_*.log > "$OUT/tune.log"
bash bench/run_device.sh bench,flashinfer 2>&1 | grep -E "rc=|wrote|status" | head

#!/usr/bin/env bash
# One device call (bench/NOTES.md v44): each of the lean path's three kernels timed alone (KVPACK_LEAN_ONLY: 1 the
# query preparation, 2 the lean kernel, 4 the merge; 7 all, as shipped) over GRID, graph-timed like every bench row.
# The outputs of the partial runs are wrong by design; only the times are kept. Files in $OUT: parts.json (rows with
# "only"), log.txt.
#   GRID="--formats q4 --shapes 8/1/128 --batch 1,8 --context 32768,131072" bash bench/tools/lean_parts_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/parts_out
build_device kvpack_cli
K=./build-device/kvpack
W=/tmp/parts_work
rm -rf "$W" && mkdir -p "$W"
GRID=${GRID:---formats q4,q3.5 --shapes 32/8/128,8/1/128 --batch 1,8,64 --context 32768,131072}
for m in ${MASKS:-7 1 2 4 6 3}; do
  echo "== only=$m" >> "$W/log.txt"
  KVPACK_LEAN_ONLY=$m $K bench $GRID --json "$W/p_$m.json" 2>&1 | grep -vE " write|filled" >> "$W/log.txt"
done
stamp "benches done"
python3 - "$W" > "$OUT/parts.json" <<'PY'
import json, sys, glob, os
rows = []
for f in sorted(glob.glob(sys.argv[1] + "/p_*.json")):
    m = int(os.path.basename(f)[2:-5])
    for r in json.load(open(f)):
        if r.get("kind", "decode") == "decode":
            r["only"] = m
            rows.append(r)
json.dump(rows, sys.stdout, indent=1)
PY
python3 - "$OUT/parts.json" <<'PY' | tee -a "$W/log.txt"
import json, sys
rows = json.load(open(sys.argv[1]))
key = lambda r: (r["format"], r["num_qo_heads"], r["num_kv_heads"], r["batch"], r["context"])
t = {(key(r), r["only"]): r["median_us"] for r in rows}
masks = sorted({r["only"] for r in rows}, key=lambda m: (m != 7, m))
print("format shape     batch     ctx " + " ".join(f"{'only=' + str(m):>9}" for m in masks))
for k in sorted({key(r) for r in rows}):
    print(f"{k[0]:6} {k[1]}q/{k[2]}kv {k[3]:5} {k[4]:7} " + " ".join(f"{t.get((k, m), float('nan')):9.1f}" for m in masks))
PY
cp "$W/log.txt" "$OUT/log.txt"

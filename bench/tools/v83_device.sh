#!/usr/bin/env bash
# One device call (bench/NOTES.md v83; prepared 2026-12-08, not yet run): the lean path's launch rules, derived on
# H100s (v40-v52, v74), swept on the GPU at hand at the target cells where q4 / q3.5 / q3 miss most (32k-64k, batch
# 8-64, both shapes), with the measurement switches that already exist (no code change): the warp-only instance for
# q4 / q3.5 (v55 left the H200 question open), merge slices, the query preparation's CTAs per pair, the mixed grid,
# leaf mode, PDL. Each switch is an A/B in one binary against the rule (the first value), 3 rounds, min over rounds.
# A value that beats the rule in a cell by more than run-to-run noise (~1%) is a candidate for a per-GPU rule.
# Files in $OUT (few: the device returns about 8): ab_v83.json (every row with "switch", "variant", "round"),
# log.txt (every switch's table).
#   LIMIT_S=330 bash bench/tools/v83_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v83_out /tmp/v83_work 330
build_device kvpack_cli
GRID="--formats q4,q3.5,q3 --shapes 32/8/128,8/1/128 --batch 8,16,32,64 --context 32768,65536 --iters 20"
SWITCHES="wonly slices leaf mix prep pdl"
ab_env "$W/wonly" wonly 3 KVPACK_LEAN_WARP_ONLY -1 0 1
ab_env "$W/slices" slices 3 KVPACK_LEAN_MERGE_SLICES 0 1 4 16
ab_env "$W/leaf" leaf 3 KVPACK_LEAN_LEAF -1 0 1
ab_env "$W/mix" mix 3 KVPACK_LEAN_MIX -1 0
ab_env "$W/prep" prep 3 KVPACK_LEAN_PREP_SPLIT 0 1 4
ab_env "$W/pdl" pdl 3 KVPACK_PDL 1 0
python3 - "$OUT" $SWITCHES <<'PY'
import json, os, sys
out, rows = sys.argv[1], []
for s in sys.argv[2:]:
    f = os.path.join(out, f"ab_{s}.json")
    if os.path.exists(f):
        for r in json.load(open(f)):
            r["switch"] = s
            rows.append(r)
        os.remove(f)
json.dump(rows, open(os.path.join(out, "ab_v83.json"), "w"), indent=1)
PY
{ cat "$OUT/env.log"; rm -f "$OUT/env.log"
  for s in $SWITCHES; do
    echo "== $s"; cat "$OUT/ab_$s.txt" 2>/dev/null; rm -f "$OUT/ab_$s.txt"
  done; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
stamp "done"

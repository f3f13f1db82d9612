#!/usr/bin/env python3
"""A/B of two builds timed in one device call (bench/tools/v42_device.sh, v47_device.sh).

Reads the bench files DIR/ab_<variant>_<round>.json (variant: "base" and any others, names without "_"), writes every
row with its "variant" and "round" to OUT (JSON), and prints per cell the base and every other variant's median (min
over rounds) with base / variant.

  python3 bench/tools/ab_summary.py DIR OUT.json
  AB_KIND=write python3 bench/tools/ab_summary.py DIR OUT.json   (the write rows, by number of tokens; or step)
"""
import glob
import json
import os
import sys


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    rows = []
    for f in sorted(glob.glob(os.path.join(sys.argv[1], "ab_*.json"))):
        v, r = os.path.basename(f)[3:-5].split("_")
        for x in json.load(open(f)):
            x["variant"], x["round"] = v, int(r)
            rows.append(x)
    json.dump(rows, open(sys.argv[2], "w"), indent=1)
    kind = os.environ.get("AB_KIND", "decode")
    rows = [r for r in rows if r.get("kind", "decode") == kind]
    # write rows: by number of tokens (in the "ctx" column)
    key = lambda r: (r["format"], r["num_qo_heads"], r["num_kv_heads"], r["batch"],
                     r["num_tokens"] if kind == "write" else r["context"])
    best = {}
    for r in rows:
        best.setdefault((key(r), r["variant"]), []).append(r["median_us"])
    # "base" first, then the other variants in name order; each with base / variant.
    others = sorted({r["variant"] for r in rows} - {"base"})
    head = f"{'format':6} {'shape':8} {'batch':>5} {'tokens' if kind == 'write' else 'ctx':>7} {'base us':>9}"
    for v in others:
        head += f" {v + ' us':>10} {'base/' + v:>10}"
    print(head + "  (min over rounds)")
    for k in sorted({key(r) for r in rows}, key=lambda k: (k[0], -k[1], k[3], k[4])):
        a = best.get((k, "base"))
        if not a:
            continue
        line = f"{k[0]:6} {k[1]}q/{k[2]}kv {k[3]:5} {k[4]:7} {min(a):9.2f}"
        for v in others:
            b = best.get((k, v))
            line += f" {min(b):10.2f} {min(a) / min(b):10.3f}" if b else f" {'-':>10} {'-':>10}"
        print(line)

if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A bench file with some cells taken from A/B files of the same run (bench/NOTES.md v49).

Where a device call timed a grid with one configuration and A/B'd another in the same binary on the same GPU, this
assembles the table of the configuration that ships: every kvpack decode row of an A/B file's VARIANT (the fastest of
its rounds) replaces the grid's row of the same (format, shape, batch, context); each replaced row says where it came
from ("overlay": "FILE VARIANT", its own run_id: every `kvpack bench` process of a device call has one), and every
kvpack row's speedup_vs_fp8 is recomputed from the resulting fp8 rows. Rows of another GPU are refused; that the files
come from one device call (one machine, as ratios must) is the caller's to know: the device scripts name them so.

  python3 bench/tools/overlay.py GRID.json OUT.json --ab AB.json VARIANT [FILTER ...] [--ab ...]
(optional filters: QO/KV/D,... only those shapes' rows of that file, e.g. 8/1/128; format=F,... only those formats'
rows, e.g. format=q3)
"""
import argparse
import json
import os


def key(r):
    return (r["format"], r["num_qo_heads"], r["num_kv_heads"], r["head_dim"], r["batch"], r["context"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("grid")
    ap.add_argument("out")
    ap.add_argument("--ab", nargs="+", action="append", metavar="FILE VARIANT [SHAPES]", required=True)
    a = ap.parse_args()
    rows = json.load(open(a.grid))
    gpu = {r["gpu"] for r in rows if r.get("impl", "kvpack") == "kvpack"}
    index = {key(r): i for i, r in enumerate(rows)
             if r.get("kind", "decode") == "decode" and r.get("impl", "kvpack") == "kvpack"}
    for ab in a.ab:
        if len(ab) < 2:
            raise SystemExit(f"--ab {' '.join(ab)}: expected FILE VARIANT [SHAPES] [format=F,...]")
        path, variant = ab[:2]
        shapes = formats = None
        for f in ab[2:]:
            if f.startswith("format="):
                formats = set(f[len("format="):].split(","))
            else:
                shapes = {tuple(int(x) for x in s.split("/")) for s in f.split(",")}
        best = {}
        for r in json.load(open(path)):
            if r.get("variant") != variant or r.get("kind", "decode") != "decode":
                continue
            if shapes is not None and (r["num_qo_heads"], r["num_kv_heads"], r["head_dim"]) not in shapes:
                continue
            if formats is not None and r["format"] not in formats:
                continue
            if r["gpu"] not in gpu:
                raise SystemExit(f"{path}: GPU {r['gpu']} is not the grid's {sorted(gpu)}")
            if key(r) not in best or r["median_us"] < best[key(r)]["median_us"]:
                best[key(r)] = r
        if not best:
            raise SystemExit(f"{path}: no decode rows of variant '{variant}'")
        for k, r in best.items():
            r = {x: v for x, v in r.items() if x not in ("variant", "round", "speedup_vs_fp8")}
            r["overlay"] = f"{os.path.basename(path)} {variant}"
            if k in index:
                rows[index[k]] = r
            else:
                index[k] = len(rows)
                rows.append(r)
    fp8 = {key(r)[1:]: r["median_us"] for r in rows
           if r.get("kind", "decode") == "decode" and r.get("impl", "kvpack") == "kvpack" and r["format"] == "fp8"}
    for r in rows:
        if r.get("kind", "decode") == "decode" and r.get("impl", "kvpack") == "kvpack" and key(r)[1:] in fp8:
            r["speedup_vs_fp8"] = fp8[key(r)[1:]] / r["median_us"]
    json.dump(rows, open(a.out, "w"), indent=1)
    print(f"{a.out}: {len(rows)} rows, {sum('overlay' in r for r in rows)} from A/B files")


if __name__ == "__main__":
    main()

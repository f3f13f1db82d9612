#!/usr/bin/env python3
"""Summarise a `kvpack bench` JSON file as Markdown tables (for docs/PERFORMANCE.md).

usage: python3 bench/summarize.py bench/results/RUN.json
"""
import json
import sys
from collections import defaultdict


def main(path):
    rows = json.load(open(path))
    dec = [r for r in rows if r.get("kind") == "decode"]
    wr = [r for r in rows if r.get("kind") == "write"]
    if not dec:
        print("no decode rows")
        return
    r0 = dec[0]
    print(f"run `{r0['run_id']}` on {r0['gpu']}, streaming read bandwidth measured in the same run: "
          f"**{r0['read_bw_tbs']:.2f} TB/s**; page size {r0['page_size']}; median of CUDA-event timings.\n")
    shapes = sorted({(r["num_qo_heads"], r["num_kv_heads"], r["head_dim"]) for r in dec}, reverse=True)
    formats = []
    for r in dec:
        if r["format"] not in formats:
            formats.append(r["format"])
    for sh in shapes:
        print(f"### {sh[0]}q/{sh[1]}kv, head_dim {sh[2]}\n")
        print("| batch | context | " + " | ".join(f"{f} us (TB/s, % read)" for f in formats) + " | " +
              " | ".join(f"{f} vs fp8" for f in formats if f != "fp8") + " |")
        print("|---|---|" + "---|" * len(formats) + "---|" * len([f for f in formats if f != "fp8"]))
        by = defaultdict(dict)
        for r in dec:
            if (r["num_qo_heads"], r["num_kv_heads"], r["head_dim"]) == sh:
                by[(r["batch"], r["context"])][r["format"]] = r
        for (b, c) in sorted(by):
            cells = []
            for f in formats:
                r = by[(b, c)].get(f)
                cells.append("" if r is None else
                             f"{r['median_us']:.1f} ({r['bandwidth_tbs']:.2f}, {100 * r['frac_read_bw']:.0f}%)")
            sp = []
            for f in formats:
                if f == "fp8":
                    continue
                r = by[(b, c)].get(f)
                sp.append("" if r is None or "speedup_vs_fp8" not in r else f"{r['speedup_vs_fp8']:.2f}x")
            print(f"| {b} | {c // 1024}k | " + " | ".join(cells) + " | " + " | ".join(sp) + " |")
        print()
    if wr:
        print("### Write path (one layer, K and V)\n")
        print("| format | shape | tokens | us | TB/s | % read |")
        print("|---|---|---|---|---|---|")
        for r in wr:
            print(f"| {r['format']} | {r['num_qo_heads']}q/{r['num_kv_heads']}kv/{r['head_dim']} | {r['num_tokens']} | "
                  f"{r['median_us']:.2f} | {r['bandwidth_tbs']:.3f} | {100 * r['frac_read_bw']:.0f}% |")


def write_share(path):
    """Decode-step write (batch tokens, one layer) as a share of the same step's attention time."""
    rows = json.load(open(path))
    dec = {(r["format"], r["num_qo_heads"], r["batch"], r["context"]): r["median_us"] for r in rows
           if r.get("kind") == "decode"}
    wr = {(r["format"], r["num_qo_heads"], r["num_tokens"]): r["median_us"] for r in rows if r.get("kind") == "write"}
    print("### Write path share of a decode step (write of `batch` tokens / attention time)\n")
    print("| format | shape | batch | " + " | ".join(f"{c // 1024}k" for c in sorted({k[3] for k in dec})) + " |")
    ctxs = sorted({k[3] for k in dec})
    print("|---|---|---|" + "---|" * len(ctxs))
    for (f, qo, b) in sorted({(k[0], k[1], k[2]) for k in dec}, key=lambda x: (x[1], x[0], x[2])):
        if (f, qo, b) not in wr:
            continue
        cells = [f"{100 * wr[(f, qo, b)] / dec[(f, qo, b, c)]:.1f}%" for c in ctxs if (f, qo, b, c) in dec]
        print(f"| {f} | {qo}q | {b} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
    print()
    write_share(sys.argv[1])

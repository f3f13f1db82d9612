#!/usr/bin/env python3
"""Markdown tables for docs/QUALITY.md from `kvpack ruler --json` files (one run, or runs of the same prompts merged).

    python3 scripts/ruler_tables.py RUN.json [RUN.json ...] [--length N]

Per length: exact-match accuracy per task (rows) and format (columns, in the order of the registry), then over all
tasks: accuracy +- binomial s.e., accuracy - bf16 with the paired s.e. (the same prompts answered by both), prompts
lost / gained against bf16, and the mean teacher-forced KL on the gold answer span. Records are matched by (task,
length, sample index); a file's formats must have answered the same prompts (bf16 is in every run).
"""
import argparse
import json
import math
from collections import defaultdict

ORDER = ["bf16", "fp8", "int4", "int4h", "q4", "q3.5", "q3"]
TASKS = ["niah_number", "niah_uuid", "niah_multikey", "niah_multivalue", "niah_multiquery", "variable_tracking",
         "common_words"]

ap = argparse.ArgumentParser()
ap.add_argument("files", nargs="+")
ap.add_argument("--length", type=int, default=None, help="only this prompt length")
a = ap.parse_args()

# (format, task, length, index) -> record; a later file overrides an earlier one for the same prompt and format.
rec = {}
for f in a.files:
    for r in json.load(open(f))["records"]:
        rec[(r["format"], r["task"], r["length"], r["index"])] = r

lengths = sorted({k[2] for k in rec if a.length is None or k[2] == a.length})
for L in lengths:
    fmts = [f for f in ORDER if any(k[0] == f and k[2] == L for k in rec)]
    prompts = sorted({(k[1], k[3]) for k in rec if k[0] == "bf16" and k[2] == L})
    missing = [(f, t, i) for f in fmts for t, i in prompts if (f, t, L, i) not in rec]
    if missing:
        raise SystemExit(f"{missing[0][0]} has no answer for {missing[0][1]} #{missing[0][2]} at length {L}: "
                         "not the same prompts")
    allc = {f: [1.0 if rec[(f, t, L, i)]["correct"] else 0.0 for t, i in prompts] for f in fmts}
    by = defaultdict(list)  # (format, task) -> correct flags
    for f in fmts:
        for (t, _), c in zip(prompts, allc[f]):
            by[(f, t)].append(c)
    # The suite's order for the tasks it knows, then any other task in the files (never dropped from the rows).
    tasks = [t for t in TASKS if any(p[0] == t for p in prompts)]
    tasks += sorted({p[0] for p in prompts} - set(tasks))
    n_per = {t: sum(1 for p in prompts if p[0] == t) for t in tasks}
    print(f"\nLength {L}: {len(prompts)} prompts ({', '.join(f'{t} {n_per[t]}' for t in tasks)}), formats {', '.join(fmts)}\n")
    print("| task (n) | " + " | ".join(fmts) + " |")
    print("|---" * (len(fmts) + 1) + "|")
    for t in tasks:
        print(f"| {t} ({n_per[t]}) | " + " | ".join(f"{sum(by[(f, t)]) / n_per[t]:.2f}" for f in fmts) + " |")
    n = len(prompts)
    row_acc, row_d, row_lg, row_kl = [], [], [], []
    for f in fmts:
        p = sum(allc[f]) / n
        row_acc.append(f"{p:.3f} +- {math.sqrt(p * (1 - p) / n):.3f}")
        d = [x - y for x, y in zip(allc[f], allc["bf16"])]
        md = sum(d) / n
        sd = math.sqrt(sum((x - md) ** 2 for x in d) / (n - 1)) if n > 1 else 0.0
        row_d.append(f"{md:+.3f} ({sd / math.sqrt(n):.3f})")
        row_lg.append(f"{sum(1 for x in d if x < 0)} / {sum(1 for x in d if x > 0)}")
        kl = [rec[(f, t, L, i)]["gold_kl"] for t, i in prompts]
        row_kl.append(f"{sum(kl) / n:.3g}" if f != "bf16" else "0")
    print("| all tasks: accuracy +- s.e. | " + " | ".join(row_acc) + " |")
    print("| accuracy - bf16 (paired s.e.) | " + " | ".join(row_d) + " |")
    print("| prompts lost / gained vs bf16 | " + " | ".join(row_lg) + " |")
    print("| mean gold-span KL | " + " | ".join(row_kl) + " |")

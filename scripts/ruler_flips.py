#!/usr/bin/env python3
"""Where a format loses (or gains) RULER needle prompts against bf16, from `kvpack ruler --json` files.

For every format: prompts lost / gained vs bf16 (paired), split into answers that never start the needle (the first
answer token flipped) and copy errors (the answer starts uuid/number-shaped but differs), and, when the records carry
`first_margin` (bf16's logit of the first gold token minus its best other logit), the bf16 margins of the prompts the
format flips against those it keeps.

  python3 scripts/ruler_flips.py RUN.json [RUN.json ...] [--task niah_uuid]
Each file is reported on its own, its own bf16 the reference for its formats; with several files a pooled summary
follows (prompts of different files are different prompts, e.g. other seeds): accuracy, accuracy - bf16 with its
paired standard error, lost / gained, for the formats every file has.
"""
import argparse, json, re, statistics

ap = argparse.ArgumentParser()
ap.add_argument("files", nargs="+")
ap.add_argument("--task", default="niah_uuid")
a = ap.parse_args()
needle = re.compile(r"^[\s:\n]*[0-9a-f]{8}-|^[\s:\n]*\d{5,}")
pooled = {}  # format -> list of (bf16 correct, format correct), one per prompt of every file
for path in a.files:
    recs = [r for r in json.load(open(path))["records"] if r["task"] == a.task]
    by = {}
    for r in recs:
        by.setdefault((r["length"], r["index"]), {})[r["format"]] = r
    fmts = [f for f in dict.fromkeys(r["format"] for r in recs) if f != "bf16"]
    n = len(by)
    bf_ok = sum(v["bf16"]["correct"] for v in by.values())
    print(f"{path}: {a.task}, {n} prompts, bf16 correct {bf_ok}")
    for f in fmts:
        pooled.setdefault(f, {})[path] = [(bool(v["bf16"]["correct"]), bool(v[f]["correct"])) for v in by.values()]
        lost = [k for k, v in by.items() if v["bf16"]["correct"] and not v[f]["correct"]]
        gained = [k for k, v in by.items() if not v["bf16"]["correct"] and v[f]["correct"]]
        copy = [k for k in lost if needle.match(by[k][f]["answer"])]
        acc = sum(v[f]["correct"] for v in by.values()) / n
        line = (f"  {f:6} accuracy {acc:.3f}  lost {len(lost):2} (first token {len(lost) - len(copy)}, copy errors "
                f"{len(copy)})  gained {len(gained)}")
        if all("first_margin" in v["bf16"] for v in by.values()):
            ok = [k for k, v in by.items() if v["bf16"]["correct"]]
            m_lost = [by[k]["bf16"]["first_margin"] for k in lost if k not in copy]
            m_kept = [by[k]["bf16"]["first_margin"] for k in ok if k not in lost]
            if m_lost and m_kept:
                line += (f"  | bf16 first-token margin: flipped median {statistics.median(m_lost):.2f}, kept median "
                         f"{statistics.median(m_kept):.2f} nats")
        print(line)

if len(a.files) > 1:
    print(f"pooled over {len(a.files)} files:")
    for f, per in pooled.items():
        if len(per) < len(a.files):
            continue
        pairs = [x for path in a.files for x in per[path]]
        n = len(pairs)
        d = [int(c) - int(b) for b, c in pairs]
        mean = sum(d) / n
        se = (sum((x - mean) ** 2 for x in d) / (n - 1) / n) ** 0.5 if n > 1 else 0.0
        print(f"  {f:6} {n} prompts: bf16 {sum(b for b, _ in pairs) / n:.3f}, {f} {sum(c for _, c in pairs) / n:.3f}, "
              f"- bf16 {mean:+.3f} (paired s.e. {se:.3f}), lost {d.count(-1)} / gained {d.count(1)}")

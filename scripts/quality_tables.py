#!/usr/bin/env python3
"""Markdown tables for docs/QUALITY.md from the JSON of `kvpack eval --json` (one or more texts).

    python3 scripts/quality_tables.py out/eval-32k.json [--targets]

Prints, per text and pooled: format, bits, positions, mean KL, p99 KL, top-1, words changed, dNLL, ppl; per text
the mean KL / top-1 of each position bucket; with --targets, the issue's quality targets against the baselines
(q4 vs int4h, q3.5 vs int4, q3 vs 2 x int4) per text.
"""
import argparse
import json


def g(x):
    return f"{x:.3g}" if x else "0"


def main_table(formats):
    out = ["| format | bits | positions | mean KL | p99 KL | top-1 | words changed | dNLL | ppl |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in formats:
        out.append(f"| {r['format']} | {r['bits_per_element']:g} | {r['positions']} | {g(r['kl_mean'])} | "
                   f"{g(r['kl_p99'])} | {r['top1_agreement']:.4f} | {r['words_changed']:.4f} | "
                   f"{r['delta_nll']:+.4f} | {r['ppl']:.3f} |")
    return out


def bucket_table(formats):
    b0 = formats[0]["buckets"]
    head = " | ".join(f"[{b['lo']}, {b['hi']})" for b in b0)
    out = [f"| format | {head} |", "|---|" + "---|" * len(b0)]
    for r in formats:
        cells = " | ".join(f"{g(b['kl_mean'])} / {b['top1_agreement']:.3f}" for b in r["buckets"])
        out.append(f"| {r['format']} | {cells} |")
    return out


def targets(per_text):
    out = ["| target | " + " | ".join(n for n, _ in per_text) + " | met? |", "|---|" + "---|" * (len(per_text) + 1)]
    rows = [("q4 mean KL <= int4h's, top-1 >= int4h's (4.0 vs 4.5 bits)", "q4", "int4h", 1.0, True),
            ("q3.5 mean KL <= int4's (3.5 vs 4.5 bits)", "q3.5", "int4", 1.0, False),
            ("q3 mean KL <= 2 x int4's", "q3", "int4", 2.0, False)]
    for label, f, base, mult, top1 in rows:
        cells, met = [], True
        for _, fm in per_text:
            if f not in fm or base not in fm:
                cells.append("-")
                met = False
                continue
            a, b = fm[f], fm[base]
            lim = mult * b["kl_mean"]
            ok = a["kl_mean"] <= lim and (not top1 or a["top1_agreement"] >= b["top1_agreement"])
            met &= ok
            c = f"KL {a['kl_mean']:.4f} vs {lim:.4f} ({100 * (a['kl_mean'] / lim - 1):+.0f}%)"
            if top1:
                c += f", top-1 {a['top1_agreement']:.4f} vs {b['top1_agreement']:.4f}"
            cells.append(c)
        out.append(f"| {label} | " + " | ".join(cells) + f" | {'yes' if met else 'no'} |")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json")
    ap.add_argument("--targets", action="store_true")
    a = ap.parse_args()
    d = json.load(open(a.json))
    # Several texts: per_text holds each text, then "pooled" (= the top-level formats); one text: only the top level.
    texts = [t for t in d.get("per_text", []) if t["text"] != "pooled"]
    texts = texts or [{"text": d.get("text"), "formats": d["formats"]}]
    per_text = []
    for t in texts:
        fm = t["formats"]
        print(f"### {t['text']}: {fm[0]['positions']} positions, window {d.get('window')}\n")
        print("\n".join(main_table(fm)) + "\n")
        if fm[0].get("buckets"):
            print(f"#### {t['text']}: mean KL / top-1 by position bucket\n")
            print("\n".join(bucket_table(fm)) + "\n")
        per_text.append((t["text"], {r["format"]: r for r in fm}))
    if len(texts) > 1:
        print(f"### All texts pooled: {d['formats'][0]['positions']} positions\n")
        print("\n".join(main_table(d["formats"])) + "\n")
    if a.targets:
        print("\n".join(targets(per_text)))


if __name__ == "__main__":
    main()

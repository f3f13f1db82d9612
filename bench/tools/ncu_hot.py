#!/usr/bin/env python3
"""Summarise an `ncu --page source --print-source sass --csv` dump: opcode histogram weighted by executed
instructions, and the hottest SASS lines by executed instructions and by stall samples.
Usage: python3 bench/tools/ncu_hot.py FILE.csv [N]"""
import csv, collections, io, sys

path = sys.argv[1]
top = int(sys.argv[2]) if len(sys.argv) > 2 else 60
text = open(path, errors="replace").read()
# ncu prints its own log lines before the CSV: start at the header row.
start = text.find('"Address"')
if start < 0:
    start = text.find('"#"')
rows = list(csv.reader(io.StringIO(text[start:])))
hdr, body = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
def col(*names):
    for i, h in enumerate(hdr):
        if all(n.lower() in h.lower() for n in names):
            return i
    return None
c_src = col("Source")
c_exec = col("Instructions Executed")
c_stall = col("Warp Stall Sampling (All")
print("columns:", [h for h in hdr][:12], "...")
def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0
tot = sum(num(r[c_exec]) for r in body) if c_exec is not None else 0
stall_tot = sum(num(r[c_stall]) for r in body) if c_stall is not None else 0
print(f"lines {len(body)}  executed warp instructions {tot:,.0f}  stall samples {stall_tot:,.0f}")
hist = collections.Counter()
for r in body:
    op = r[c_src].strip().split()
    op = [o for o in op if not o.startswith("@")]
    if op:
        hist[op[0].split(".")[0]] += num(r[c_exec]) if c_exec is not None else 0
print("\nopcode share of executed instructions:")
for op, n in hist.most_common(30):
    print(f"  {op:10} {n:14,.0f} {100 * n / max(tot, 1):5.1f}%")
for name, c in (("executed", c_exec), ("stall samples", c_stall)):
    if c is None:
        continue
    print(f"\nhottest lines by {name}:")
    idx = sorted(range(len(body)), key=lambda i: -num(body[i][c]))[:top]
    for i in sorted(idx):
        r = body[i]
        print(f"  {i:5d} {num(r[c_exec]) if c_exec is not None else 0:12,.0f} {num(r[c_stall]) if c_stall is not None else 0:8,.0f}  {r[c_src][:90]}")

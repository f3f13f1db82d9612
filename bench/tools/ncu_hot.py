#!/usr/bin/env python3
"""Summarise an `ncu --page source --csv` dump (SASS view, or CUDA view with -lineinfo): opcode histogram weighted by
executed instructions (SASS view), the hottest lines by executed instructions and by stall samples, and (SASS view)
the basic blocks (runs of consecutive lines executed equally often) that execute the most instructions.
Usage: python3 bench/tools/ncu_hot.py FILE.csv [N]"""
import csv, collections, io, sys

path = sys.argv[1]
top = int(sys.argv[2]) if len(sys.argv) > 2 else 60
text = open(path, errors="replace").read()
# ncu prints log lines before the CSV, and the CUDA view one table per source file: parse every table whose header
# row has a "Source" column, keep the rows as long as their header.
lines = text.splitlines()
tables, hdr = [], None
for ln in lines:
    if not ln.startswith('"'):
        continue
    row = next(csv.reader([ln]))
    if "Source" in row and any("Instructions Executed" in h for h in row):
        hdr = row
        tables.append((hdr, []))
    elif hdr is not None and len(row) == len(hdr):
        tables[-1][1].append(row)
if not tables:
    print(f"no source table found in {path}")
    sys.exit(0)
hdr = tables[0][0]
body = [r for h, rows in tables if h == hdr for r in rows]
def col(*names):
    for i, h in enumerate(hdr):
        if all(n.lower() in h.lower() for n in names):
            return i
    return None
c_src = col("Source")
c_exec = col("Instructions Executed")
c_stall = col("Warp Stall Sampling (All")
c_line = col("Line") if col("Line") is not None else col("#")
print("columns:", [h for h in hdr][:12], "...")
def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0
tot = sum(num(r[c_exec]) for r in body) if c_exec is not None else 0
stall_tot = sum(num(r[c_stall]) for r in body) if c_stall is not None else 0
print(f"lines {len(body)}  executed warp instructions {tot:,.0f}  stall samples {stall_tot:,.0f}")
sass = col("Address") is not None
if sass:
    hist = collections.Counter()
    for r in body:
        op = [o for o in r[c_src].strip().split() if not o.startswith("@")]
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
        tag = r[c_line] if (not sass and c_line is not None) else str(i)
        print(f"  {tag:>5} {num(r[c_exec]) if c_exec is not None else 0:12,.0f} "
              f"{num(r[c_stall]) if c_stall is not None else 0:8,.0f}  {r[c_src].strip()[:100]}")
if sass and c_exec is not None:
    blocks, i = [], 0
    while i < len(body):
        j, n = i, num(body[i][c_exec])
        while j + 1 < len(body) and num(body[j + 1][c_exec]) == n:
            j += 1
        st = sum(num(body[k][c_stall]) for k in range(i, j + 1)) if c_stall is not None else 0
        blocks.append((n * (j - i + 1), i, j, n, st))
        i = j + 1
    print("\nbasic blocks by executed instructions (lines i..j, times each line ran, stall samples):")
    for t, i, j, n, st in sorted(blocks, reverse=True)[:30]:
        print(f"  {i:5d}..{j:5d} {t:13,.0f} {100 * t / max(tot, 1):5.1f}%  x{n:10,.0f}  stalls {st:7,.0f}  "
              f"{body[i][c_src].strip()[:40]} .. {body[j][c_src].strip()[:40]}")

#!/usr/bin/env python3
"""Timeline of the lean path's kernels from %globaltimer stamps (bench/NOTES.md v47).

Reads the file that a stamped build (KVPACK_LEAN_STAMPS) of `kvpack bench` writes under KVPACK_STAMPS_OUT: one line
per record, `label key rotation smid t0 t1 t2 t3 t4`. For each cell (label) and its middle rotation (one decode
launch of the graph replay), prints every phase in microseconds from the first stamp of that launch:
  prep   start .. end (one record per (sequence, kv head) CTA)
  lean   start, after the prepared query is read (t1), after the main loop (t2), end (t3): per warp, min/median/max
  merge  start, after griddepcontrol.wait (t1), after the fold (t2), after G.o (t3), end (t4): per CTA
and the gap to the next launch's first stamp (the replay's launch overhead). --json writes the same as rows.

  python3 bench/tools/stamps.py stamps.txt [--json out.json]
"""
import argparse
import json
import statistics
import sys
from collections import defaultdict

KINDS = {1: "prep", 2: "lean", 3: "merge"}
PHASES = {"prep": ["start", "end"], "lean": ["start", "query", "loop", "end"],
          "merge": ["start", "waited", "folded", "rotated", "end"]}


def parse(path):
    cells = defaultdict(lambda: defaultdict(list))
    for ln in open(path):
        f = ln.split()
        if len(f) != 9:
            continue
        label, key, rot, smid = f[0], int(f[1]), int(f[2]), int(f[3])
        t = [int(x) for x in f[4:9]]
        kind = KINDS.get(key >> 56)
        if kind is None:
            raise SystemExit(f"{path}: record with unknown kernel id {key >> 56}: {ln.strip()}")
        cells[label][rot].append((kind, smid, t, (key >> 32) & 0xffffff, (key >> 8) & 0xffffff, key & 0xff))
    return cells


def summary(recs, origin):
    out = {}
    for kind, names in PHASES.items():
        rs = [r for r in recs if r[0] == kind]
        if not rs:
            continue
        d = {"records": len(rs), "sms": len({r[1] for r in rs})}
        for j, name in enumerate(names):
            v = [(r[2][j] - origin) / 1e3 for r in rs if r[2][j]]
            if v:
                d[name] = [round(min(v), 2), round(statistics.median(v), 2), round(max(v), 2)]
        if kind == "lean":
            dur = [(r[2][3] - r[2][0]) / 1e3 for r in rs if r[2][3]]
            loop = [(r[2][2] - r[2][1]) / 1e3 for r in rs if r[2][2] and r[2][1]]
            d["warp_us"] = [round(min(dur), 2), round(statistics.median(dur), 2), round(max(dur), 2)]
            d["loop_us"] = [round(min(loop), 2), round(statistics.median(loop), 2), round(max(loop), 2)]
            # Peak concurrency of lean warps (an estimate of the waves).
            ev = sorted([(r[2][0], 1) for r in rs] + [(r[2][3], -1) for r in rs if r[2][3]])
            cur = peak = 0
            for _, e in ev:
                cur += e
                peak = max(peak, cur)
            d["peak_warps"] = peak
        out[kind] = d
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    for label, rots in parse(a.file).items():
        order = sorted(rots, key=lambda r: min(x[2][0] for x in rots[r]))
        mid = order[(len(order) - 1) // 2]
        recs = rots[mid]
        origin = min(r[2][0] for r in recs)
        end = max(max(t for t in r[2] if t) for r in recs)
        nxt = order.index(mid) + 1
        gap = (min(x[2][0] for x in rots[order[nxt]]) - end) / 1e3 if nxt < len(order) else None
        s = summary(recs, origin)
        row = {"cell": label, "rotations": len(order), "launch_us": round((end - origin) / 1e3, 2),
               "gap_to_next_us": None if gap is None else round(gap, 2), **s}
        rows.append(row)
        print(f"== {label}: one launch {row['launch_us']} us (rotation {order.index(mid)} of {len(order)}), "
              f"gap to the next launch {row['gap_to_next_us']} us")
        for kind in PHASES:
            if kind not in s:
                continue
            d = s[kind]
            ph = "  ".join(f"{n} {d[n][0]}/{d[n][1]}/{d[n][2]}" for n in PHASES[kind] if n in d)
            extra = ""
            if kind == "lean":
                extra = f"  warp {d['warp_us']}  loop {d['loop_us']}  peak warps {d['peak_warps']}"
            print(f"  {kind:5} x{d['records']:5} on {d['sms']:3} SMs  {ph}{extra}")
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Phase clocks of the small q write kernel (measurement build, -DKVPACK_WRITE_STAMPS; bench/NOTES.md v62).

Reads the file `kvpack bench` appends to with KVPACK_WRITE_STAMPS_OUT=<file>: one line per CTA, the label
(write/<format>/<shape>/n<tokens>) then 13 words: blockIdx.x, blockIdx.y, the tile's tokens, %smid, %globaltimer at
the end, and thread 0's clock64() at the kernel's start, after each of its 6 barriers and at its end. Prints per label
the median and the maximum over CTAs of each phase's cycles (the phases of write_kv_q_small_kernel: 1 global loads and
their stores, 2 transform, 3 RMS byte and candidates, 4 differences, 5 candidates' errors, 6 pick and codes, 7 stores)
and of the whole CTA, and the spread of the CTAs' end times.

  python3 bench/tools/write_stamps.py FILE
"""
import collections
import statistics
import sys

PHASES = ["loads", "transform", "rms+cand", "diffs", "errors", "pick+codes", "stores"]


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    by = collections.defaultdict(list)
    for ln in open(sys.argv[1]):
        f = ln.split()
        if len(f) != 14:
            continue
        by[f[0]].append([int(x) for x in f[1:]])
    for label, recs in by.items():
        clocks = [r[5:13] for r in recs]
        ends = [r[4] for r in recs]
        print(f"{label}: {len(recs)} CTAs, end times spread over {(max(ends) - min(ends)) / 1e3:.2f} us")
        print(f"  {'phase':12} {'median cyc':>10} {'max cyc':>8}")
        for i, name in enumerate(PHASES):
            d = [c[i + 1] - c[i] for c in clocks]
            print(f"  {i + 1} {name:10} {statistics.median(d):10.0f} {max(d):8d}")
        tot = [c[7] - c[0] for c in clocks]
        print(f"  {'whole CTA':12} {statistics.median(tot):10.0f} {max(tot):8d}")


if __name__ == "__main__":
    main()

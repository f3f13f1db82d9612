#!/usr/bin/env python3
"""Build kvpack's calibration and held-out evaluation texts from Debian documentation packages.

  data/calib.txt   <- python3.11-doc      (reStructuredText sources of the tutorial, howtos and library reference)
  data/eval-a.txt  <- debian-handbook     (English HTML chapters)       held-out text A
  data/eval-b.txt  <- postgresql-doc-15   (HTML manual pages)            held-out text B

Deterministic: files are read in sorted order, HTML is reduced to text with the standard library's parser,
whitespace is normalised, and each output is cut at a fixed character count on a paragraph boundary. Running it
twice gives the same bytes (the SHA-256 of each file is printed). Calibration and evaluation come from different
packages, so no evaluation text is ever seen by calibration.
"""
import argparse
import hashlib
import html.parser
import pathlib
import re
import sys

SOURCES = {
    "calib.txt": ("python3.11-doc", "/usr/share/doc/python3.11-doc/html/_sources",
                  ["tutorial/*.rst.txt", "howto/*.rst.txt", "library/*.rst.txt"], 160_000),
    "eval-a.txt": ("debian-handbook", "/usr/share/doc/debian-handbook/html/en-US", ["*.html"], 400_000),
    "eval-b.txt": ("postgresql-doc-15", "/usr/share/doc/postgresql-doc-15/html", ["*.html"], 400_000),
}


class _Text(html.parser.HTMLParser):
    SKIP = {"script", "style", "head", "nav", "title"}
    BLOCK = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "table", "dt", "dd", "section"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out, self.skip = [], 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skip += 1
        elif tag in self.BLOCK:
            self.out.append("\n\n")

    def handle_endtag(self, tag):
        if tag in self.SKIP:
            self.skip = max(0, self.skip - 1)
        elif tag in self.BLOCK:
            self.out.append("\n\n")

    def handle_data(self, data):
        if not self.skip:
            self.out.append(data)


def to_text(path: pathlib.Path) -> str:
    raw = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".html":
        p = _Text()
        p.feed(raw)
        raw = "".join(p.out)
    paras = []
    for para in re.split(r"\n\s*\n", raw):
        para = re.sub(r"[ \t\r\f\v]+", " ", para).strip()
        para = re.sub(r" ?\n ?", "\n", para)
        if len(para) >= 20:
            paras.append(para)
    return "\n\n".join(paras)


def build(root: str, patterns, limit: int) -> str:
    base = pathlib.Path(root)
    if not base.is_dir():
        raise SystemExit(f"error: {root} not found (install the Debian package first: scripts/setup.sh does)")
    files = sorted({f for pat in patterns for f in base.glob(pat)})
    out, size = [], 0
    for f in files:
        for para in to_text(f).split("\n\n"):
            if size + len(para) + 2 > limit:
                return "\n\n".join(out) + "\n"
            out.append(para)
            size += len(para) + 2
    raise SystemExit(f"error: {root} holds only {size} characters, {limit} needed")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--out-dir", default="data")
    args = ap.parse_args()
    out = pathlib.Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, (pkg, root, patterns, limit) in SOURCES.items():
        text = build(root, patterns, limit)
        (out / name).write_text(text, encoding="utf-8")
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        print(f"{out / name}: {len(text.encode())} bytes from {pkg} (sha256 {digest})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

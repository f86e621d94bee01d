#!/usr/bin/env python3
"""Sentence length of the prose in README.md and docs/*.md.

    python3 .ci/prose.py                # README.md and docs/*.md; exit 1 if a limit is broken
    python3 .ci/prose.py FILE...        # these files
    python3 .ci/prose.py --report ...   # print the figures, always exit 0
    python3 .ci/prose.py --list ...     # and every sentence over 60 words

Prose is what a reader reads as sentences: fenced code blocks, tables, headings and HTML
comments are skipped. A paragraph or a list item is split into sentences at `.`, `?` or `!`
followed by a space and a capital, a digit, a quote or a backtick. Words are split at white
space; a link counts as its text, not its address.

The limits (issue 37): at most 2% of the sentences of each file over 60 words, none over 120.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LONG = 60
MAX = 120
SHARE = 0.02

SPLIT = re.compile(r"(?<=[.?!])[)\"']?\s+(?=[A-Z0-9`\"'(*\[])")
LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s+")


def paragraphs(text: str):
    """The prose blocks of a markdown text, each one string."""
    block: list[str] = []
    fence = None
    comment = False
    for line in text.splitlines():
        s = line.strip()
        if fence:
            if s.startswith(fence):
                fence = None
            continue
        if comment:
            comment = "-->" not in s
            continue
        if s.startswith("```") or s.startswith("~~~"):
            yield from flush(block)
            fence = s[:3]
            continue
        if s.startswith("<!--"):
            yield from flush(block)
            comment = "-->" not in s
            continue
        if not s or s.startswith("|") or s.startswith("#") or line.startswith("    ") and not block:
            yield from flush(block)
            continue
        if ITEM.match(line):
            yield from flush(block)
            line = ITEM.sub("", line)
        block.append(line.strip())
    yield from flush(block)


def flush(block: list[str]):
    if block:
        yield " ".join(block)
        block.clear()


def sentences(text: str) -> list[str]:
    out = []
    for para in paragraphs(text):
        para = LINK.sub(r"\1", para)
        out += [s for s in SPLIT.split(para) if s.strip()]
    return out


def words(sentence: str) -> int:
    return len(sentence.split())


def figures(path: Path):
    ss = sentences(path.read_text())
    lens = [words(s) for s in ss]
    long = sum(n > LONG for n in lens)
    longest = max(lens, default=0)
    first = ss[lens.index(longest)] if ss else ""
    return len(ss), long, longest, first


def main(argv: list[str]) -> int:
    report = "--report" in argv or "--list" in argv
    listing = "--list" in argv
    names = [a for a in argv if a not in ("--report", "--list")]
    files = [Path(n) for n in names] or [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    bad = []
    total = total_long = 0
    print(f"{'file':<28} {'sentences':>9} {'> 60':>5} {'share':>6} {'longest':>7}")
    for f in files:
        n, long, longest, first = figures(f)
        total += n
        total_long += long
        share = long / n if n else 0.0
        name = str(f.relative_to(REPO)) if f.is_absolute() and f.is_relative_to(REPO) else str(f)
        print(f"{name:<28} {n:>9} {long:>5} {share:>6.1%} {longest:>7}")
        if listing:
            for s in sentences(f.read_text()):
                if words(s) > LONG:
                    print(f"  [{words(s)}] {s}")
        if share > SHARE or longest > MAX:
            bad.append(f"{name}: {share:.1%} over {LONG} words, longest {longest}: {first[:100]}...")
    print(f"{'all':<28} {total:>9} {total_long:>5} {total_long / max(total, 1):>6.1%}")
    for b in bad:
        print(f"prose: {b}", file=sys.stderr)
    return 1 if bad and not report else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

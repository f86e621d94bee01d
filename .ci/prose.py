#!/usr/bin/env python3
"""Sentence length of the prose in README.md and docs/*.md.

    python3 .ci/prose.py                # README.md and docs/*.md; exit 1 if a limit is broken
    python3 .ci/prose.py FILE...        # these files
    python3 .ci/prose.py --report ...   # print the figures, always exit 0
    python3 .ci/prose.py --list ...     # and every sentence over 60 words

docs/benchmarks.md is generated, and only a full benchmark run writes it again: its prose is
checked where it is written, in the strings bench/bench.py prints (`bench/bench.py` as a FILE,
and in the default set). A `{...}` field counts as one word.

Prose is what a reader reads as sentences: fenced code blocks, tables, headings and HTML
comments are skipped. A paragraph or a list item is split into sentences at `.`, `?` or `!`
followed by a space and a capital, a digit, a quote or a backtick. Words are split at white
space; a link counts as its text, not its address.

The limits (issue 37): at most 2% of the sentences of each file over 60 words, none over 120.
"""

from __future__ import annotations

import ast
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


def bench_prose(source: str) -> str:
    """The Markdown lines bench.py's `render` and `before_after` emit through `a(...)` and
    `b(...)`, fields as `X`, one paragraph each."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if node.func.id not in ("a", "b") or len(node.args) != 1:
            continue
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            out.append(arg.value)
        elif isinstance(arg, ast.JoinedStr):
            out.append("".join(v.value if isinstance(v, ast.Constant) else "X" for v in arg.values))
    return "\n\n".join(out)


def sentences(text: str) -> list[str]:
    out = []
    for para in paragraphs(text):
        para = LINK.sub(r"\1", para)
        out += [s for s in SPLIT.split(para) if s.strip()]
    return out


def words(sentence: str) -> int:
    return len(sentence.split())


def read(path: Path) -> str:
    text = path.read_text()
    return bench_prose(text) if path.suffix == ".py" else text


def figures(path: Path):
    ss = sentences(read(path))
    lens = [words(s) for s in ss]
    long = sum(n > LONG for n in lens)
    longest = max(lens, default=0)
    first = ss[lens.index(longest)] if ss else ""
    return len(ss), long, longest, first


def main(argv: list[str]) -> int:
    report = "--report" in argv or "--list" in argv
    listing = "--list" in argv
    names = [a for a in argv if a not in ("--report", "--list")]
    docs = [p for p in sorted((REPO / "docs").glob("*.md")) if p.name != "benchmarks.md"]
    files = [Path(n) for n in names] or [REPO / "README.md", *docs, REPO / "bench/bench.py"]
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
            for s in sentences(read(f)):
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

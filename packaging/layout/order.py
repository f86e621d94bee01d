#!/usr/bin/env python3
"""Write lld's symbol order for agent-run from a trace of real runs.

    order.py MAP OUT CALLGRIND_FILE...
    order.py --check MAP ORDER

MAP is the linker map of the traced binary (`-Wl,-Map`, see wrapper/build.rs); each
CALLGRIND_FILE is a `valgrind --tool=callgrind --dump-instr=yes` output of one process of a run
of that binary (the wrapper, and its forks: the keeper, the workload's side before exec).
Every input section of `.text` that holds an executed instruction is hot. OUT gets one symbol
per hot section (the first the map names in it), in the order the sections had in the traced
binary, so that the next link puts them together at the start of `.text`.

The binary is stripped, so callgrind knows no function names: it names code by address
(`0x...`), and with --dump-instr=yes every executed instruction's address is in the file. The
map says which section each address is in. Addresses of other objects (the dynamic loader has
none: the binary is static) are skipped: callgrind marks them with another `ob=`.

Prints how many sections and bytes are hot, out of how many in `.text`. With --check, says
whether the link of MAP put the sections of ORDER first in `.text` (exit 1 if not).
"""

import bisect
import re
import sys


LINE = re.compile(r"^\s*([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)\s+\d+ (.*)$")


def parse_map(path):
    """(start, size, symbol) of every input section of the output section .text, from lld's
    map: an output section's name follows the columns at once, an input section's after 8 more
    spaces (`file:(.text.SYMBOL)`), a symbol's after 16 (lld writes it demangled: the mangled
    name is taken from the section's, and only a section of C code, named plainly `.text`,
    takes its first symbol line, whose name is the same either way)."""
    sections = []
    in_text = False
    cur = None
    for line in open(path, encoding="utf-8", errors="replace"):
        m = LINE.match(line.rstrip("\n"))
        if not m:
            continue
        vma, size, rest = int(m.group(1), 16), int(m.group(2), 16), m.group(3)
        indent = len(rest) - len(rest.lstrip(" "))
        rest = rest.strip()
        if indent == 0:
            in_text = rest == ".text"
            cur = None
        elif not in_text:
            continue
        elif indent < 16:
            sec = rest[rest.rfind(":(") + 2 : -1] if rest.endswith(")") and ":(" in rest else ""
            # `.text.SYM`, or `.text.unlikely.SYM` (and hot, startup, exit) for functions
            # the compiler marked cold: the symbol is the part from `_R` (v0) or `_Z` (legacy,
            # the prebuilt std) on.
            m2 = re.match(r"\.text\.(?:(?:unlikely|hot|startup|exit)\.)?(_[RZ].*)$", sec)
            sym = m2.group(1) if m2 else None
            cur = [vma, size, sym]
            sections.append(cur)
        elif cur is not None and cur[2] is None and cur[0] <= vma < cur[0] + max(cur[1], 1):
            cur[2] = rest
    return [(s, n, sym) for s, n, sym in sections if sym and n]


def executed(paths, binary_hint="agent-run"):
    """Addresses of executed instructions in the binary's own object."""
    out = set()
    for path in paths:
        ours = False
        names = {}
        for line in open(path, encoding="utf-8", errors="replace"):
            if line.startswith("ob="):
                m = re.match(r"ob=(\(\d+\))?\s*(.*)", line.strip())
                ident, name = m.group(1), m.group(2)
                if ident and name:
                    names[ident] = name
                name = name or names.get(ident, "")
                ours = name.endswith(binary_hint)
                continue
            if not ours:
                continue
            # With --dump-instr=yes, cost lines start with the instruction address (0x...),
            # or a relative one (+N / -N) after the first, when positions are compressed;
            # order.py asks for --compress-pos=no, so each is absolute.
            if line.startswith("0x"):
                try:
                    out.add(int(line.split()[0], 16))
                except ValueError:
                    pass
    return out


def check(map_path, order_path):
    """Whether the link whose map this is put the ordered sections first in .text: they must
    lie together, from the start of .text, within 64 KiB of their own size."""
    sections = sorted(parse_map(map_path))
    want = {l.strip() for l in open(order_path, encoding="utf-8") if l.strip()}
    hot = [(s, n) for s, n, sym in sections if sym in want]
    if not hot or not sections:
        print(f"order.py: none of the {len(want)} ordered functions is in {map_path}", file=sys.stderr)
        return 1
    span = max(s + n for s, n in hot) - sections[0][0]
    size = sum(n for _, n in hot)
    ok = span <= size + 65536
    print(f"order.py: the {len(hot)} traced sections ({size // 1024} KiB) span the first {span // 1024} KiB of .text: {'ok' if ok else 'NOT first'}")
    return 0 if ok else 1


def main(argv):
    if len(argv) == 4 and argv[1] == "--check":
        return check(argv[2], argv[3])
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    map_path, out_path, traces = argv[1], argv[2], argv[3:]
    sections = parse_map(map_path)
    if not sections:
        print(f"order.py: no .text input sections in {map_path}", file=sys.stderr)
        return 1
    sections.sort()
    starts = [s for s, _, _ in sections]
    hot = set()
    for addr in executed(traces):
        i = bisect.bisect_right(starts, addr) - 1
        if i >= 0 and addr < sections[i][0] + sections[i][1]:
            hot.add(i)
    if not hot:
        print("order.py: no executed address falls in .text: is the trace of this binary?", file=sys.stderr)
        return 1
    with open(out_path, "w", encoding="utf-8") as f:
        for i in sorted(hot):
            f.write(sections[i][2] + "\n")
    hot_bytes = sum(sections[i][1] for i in hot)
    all_bytes = sum(n for _, n, _ in sections)
    print(
        f"order.py: {len(hot)} of {len(sections)} .text sections hot, "
        f"{hot_bytes // 1024} of {all_bytes // 1024} KiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""Make N final run dirs fast, by copying one run dir that agent-run itself wrote.

    python3 bench/fixtures.py --agent-run target/release/agent-run ROOT N [--prefix f]

Each copy is what a finished run leaves behind: status.json (run_id, cgroup name and times
rewritten for the copy), events.jsonl, stdout.log, stderr.log, lock, pid, pgid, mode 0700 / 0600.
The template is one `agent-run --quiet` run of `echo` in a scratch root. Standard library only;
bench/bench.py imports `make_final` from here.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FILES = ("status.json", "events.jsonl", "stdout.log", "stderr.log", "lock", "pid", "pgid")


def template(agent_run, env=None):
    """The files of one finished run, as {name: bytes}, and its run id."""
    scratch = Path(tempfile.mkdtemp(prefix="agent-run-fixture-"))
    try:
        r = subprocess.run(
            [str(agent_run), "--root", str(scratch / "r"), "--quiet", "tpl", "--", shutil.which("echo") or "/bin/echo", "fixture"],
            env=env,
            stdin=subprocess.DEVNULL,
        )
        d = scratch / "r" / "tpl"
        if r.returncode != 0 or not (d / "status.json").exists():
            raise RuntimeError("could not produce a template run dir with agent-run")
        return {name: (d / name).read_bytes() for name in FILES if (d / name).exists()}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def make_final(root, n, files, prefix="f", start=0):
    """Create run dirs PREFIX00000 .. under root (made 0700 if missing), each a copy of `files`."""
    root = Path(root)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = json.loads(files["status.json"])
    rest = {k: v for k, v in files.items() if k != "status.json"}
    cg = (st.get("containment") or {}).get("cgroup")
    cg_parent = os.path.dirname(cg) if cg else None
    rootfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        for i in range(start, start + n):
            rid = f"{prefix}{i:05d}"
            os.mkdir(rid, 0o700, dir_fd=rootfd)
            dfd = os.open(rid, os.O_RDONLY | os.O_DIRECTORY, dir_fd=rootfd)
            try:
                st["run_id"] = rid
                if cg_parent:
                    # The name agent-run gives the run's cgroup (removed after the final record).
                    st["containment"]["cgroup"] = f"{cg_parent}/agent-run.{rid}.{os.fstat(dfd).st_ino:x}"
                for name, data in rest.items():
                    fd = os.open(name, flags, 0o600, dir_fd=dfd)
                    if data:
                        os.write(fd, data)
                    os.close(fd)
                fd = os.open("status.json", flags, 0o600, dir_fd=dfd)
                os.write(fd, (json.dumps(st, indent=2) + "\n").encode())
                os.close(fd)
            finally:
                os.close(dfd)
    finally:
        os.close(rootfd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agent-run", default="target/release/agent-run")
    ap.add_argument("--prefix", default="f")
    ap.add_argument("root")
    ap.add_argument("n", type=int)
    a = ap.parse_args()
    make_final(a.root, a.n, template(a.agent_run), a.prefix)
    return 0


if __name__ == "__main__":
    sys.exit(main())

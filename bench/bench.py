#!/usr/bin/env python3
"""agent-run benchmark harness: agent-run side by side with bare, setsid, timeout and tini.

    python3 bench/bench.py            # full run: builds, measures, writes docs/benchmarks.md
    python3 bench/bench.py --quick    # CI size: writes a temp file (or --out PATH)

Python 3.11, standard library only. Builds the release binaries (cargo build --release) unless
--no-build. Installs nothing: a peer that is not installed gets a "not installed" cell.
Every process it starts carries BENCH_SESSION=<uuid> in its environment and is killed by pid
(through a pidfd, after re-checking the marker) when the harness ends, even on errors or ^C.
Exit status: 0 when every measurement ran (missed targets are reported, not failed), 1 when a
scenario hit a harness error, 2 when the harness could not start (build failed, bad option).
See bench/README.md.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime as dt
import json
import os
import platform
import select
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
SESSION_VAR = "BENCH_SESSION"
TRIAL_VAR = "BENCH_TRIAL"
MiB = 1 << 20
GiB = 1 << 30

# The targets of the issue, shown beside the figures.
TARGETS = {
    "launch": "<= tini's overhead + 2 ms (median and p99)",
    "stop_coop": "< 20 ms to the final record",
    "stop_shell": "< 50 ms",
    "stop_stubborn": "within 50 ms of the grace",
    "stop_escapee": "nothing survives",
    "rss": "< 2 MiB",
    "stream": ">= 1 GB/s and >= 80% of cat",
    "lateness": "p99 < 100 ms at 10,000 leases",
    "burst": "p99 < 100 ms",
    "rescan": "< 100 ms CPU for 10,000 dirs",
    "idle": "near zero",
}


# --------------------------------------------------------------------------------------------
# Small helpers: statistics, /proc, formatting
# --------------------------------------------------------------------------------------------


def pct(values, p):
    """Percentile with linear interpolation (numpy's default); None for no values."""
    v = sorted(values)
    if not v:
        return None
    if len(v) == 1:
        return v[0]
    k = (len(v) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def summary(values):
    return {
        "n": len(values),
        "median": pct(values, 50),
        "p90": pct(values, 90),
        "p99": pct(values, 99),
        "min": min(values) if values else None,
        "max": max(values) if values else None,
    }


def fms(x, digits=None):
    """Milliseconds for a table cell."""
    if x is None:
        return "—"
    if digits is None:
        digits = 2 if abs(x) < 10 else (1 if abs(x) < 100 else 0)
    return f"{x:.{digits}f}"


def read_stat(pid):
    """Fields of /proc/PID/stat, or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            s = f.read()
    except OSError:
        return None
    o, c = s.find(b"("), s.rfind(b")")
    rest = s[c + 2 :].split()
    # rest[0] is field 3; field N is rest[N - 3].
    return {
        "comm": s[o + 1 : c].decode(errors="replace"),
        "state": rest[0].decode(),
        "ppid": int(rest[1]),
        "pgid": int(rest[2]),
        "sid": int(rest[3]),
        "utime": int(rest[11]),
        "stime": int(rest[12]),
        "start": int(rest[19]),
    }


def read_status(pid):
    """Selected lines of /proc/PID/status, or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        k, _, v = line.partition(":")
        v = v.strip()
        if k in ("SigIgn", "SigCgt", "SigBlk"):
            out[k] = int(v, 16)
        elif k in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
            out[k] = int(v.split()[0])  # kB
        elif k == "Threads":
            out[k] = int(v)
    return out


def cpu_ns(pid):
    """CPU time of every thread of PID in ns (schedstat: exact), or None."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for t in tids:
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def cpu_ticks_ms(pid):
    st = read_stat(pid)
    if st is None:
        return None
    return (st["utime"] + st["stime"]) * 1000.0 / CLK_TCK


def environ_has(pid, needle: bytes):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        return False
    return needle in env.split(b"\0")


def all_pids():
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            out.append(int(name))
    return out


def tagged_pids(var, value):
    """Live (non-zombie) processes whose environment holds VAR=value, except this one."""
    needle = f"{var}={value}".encode()
    me = os.getpid()
    out = []
    for pid in all_pids():
        if pid == me or not environ_has(pid, needle):
            continue
        st = read_stat(pid)
        if st is None or st["state"] in ("Z", "X"):
            continue
        out.append(pid)
    return out


def sig_bit(sig):
    return 1 << (int(sig) - 1)


def rfc3339_epoch(s):
    if not s:
        return None
    return dt.datetime.strptime(s, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.timezone.utc).timestamp()


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


_T0 = time.monotonic()


def log(msg):
    print(f"bench: [{time.monotonic() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


class HarnessError(Exception):
    pass


# --------------------------------------------------------------------------------------------
# Process bookkeeping: everything we start is found again and killed by pid
# --------------------------------------------------------------------------------------------


class Procs:
    def __init__(self):
        self.session = uuid.uuid4().hex
        self.popens: list[subprocess.Popen] = []
        self.spawned: set[int] = set()  # raw posix_spawn children not yet reaped
        self.trial = 0

    def env(self, trial=None, extra=None):
        e = dict(os.environ)
        e[SESSION_VAR] = self.session
        if trial is not None:
            e[TRIAL_VAR] = trial
        if extra:
            e.update(extra)
        return e

    def new_trial(self):
        self.trial += 1
        return f"{self.session[:8]}-{self.trial}"

    def popen(self, argv, **kw):
        kw.setdefault("env", self.env())
        kw.setdefault("stdin", subprocess.DEVNULL)
        p = subprocess.Popen(argv, **kw)
        self.popens.append(p)
        return p

    def forget_done(self):
        self.popens = [p for p in self.popens if p.returncode is None and p.poll() is None]

    def kill_tagged(self, var, value, sig=signal.SIGKILL):
        """Kill every live process carrying VAR=value, by pid, pinned and re-checked."""
        needle = f"{var}={value}".encode()
        n = 0
        for pid in tagged_pids(var, value):
            if kill_pid(pid, sig, check=lambda p: environ_has(p, needle)):
                n += 1
        return n

    def cleanup(self):
        """Kill and reap everything of this session. Safe to call more than once."""
        for p in self.popens:
            if p.returncode is None and p.poll() is None:
                kill_pid(p.pid)  # our unreaped child: its pid cannot have been reused
        for _ in range(3):
            if self.kill_tagged(SESSION_VAR, self.session) == 0:
                break
            time.sleep(0.05)
        for p in self.popens:
            with contextlib.suppress(Exception):
                p.wait(timeout=5)
        for pid in list(self.spawned):
            kill_pid(pid)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            self.spawned.discard(pid)
        self.popens = []


def kill_pid(pid, sig=signal.SIGKILL, check=None):
    """Signal one process by pid through a pidfd; `check(pid)` runs after the pidfd is open, so
    the process checked is the process signalled. Returns whether the signal was sent."""
    if pid <= 1 or pid == os.getpid():
        return False
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        if check is not None and not check(pid):
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# Peers
# --------------------------------------------------------------------------------------------


class Peer:
    def __init__(self, name, label, prefix, available=True, why=""):
        self.name = name
        self.label = label
        self._prefix = prefix  # callable(run_id, opts) -> argv prefix
        self.available = available
        self.why = why

    def argv(self, cmd, run_id=None, **opts):
        return self._prefix(run_id, opts) + list(cmd)


def make_peers(ctx):
    peers = []
    peers.append(Peer("bare", "bare", lambda rid, o: []))

    def tool(name, label, prefix_fn):
        path = shutil.which(name)
        if path is None:
            peers.append(Peer(name, label, None, False, "not installed"))
        else:
            peers.append(Peer(name, label, lambda rid, o: prefix_fn(path, o)))

    tool("setsid", "`setsid`", lambda p, o: [p])
    # -k: the strongest configuration timeout has: KILL after the same grace as agent-run.
    tool("timeout", f"`timeout -k {ctx.grace_s:g}s 1d`", lambda p, o: [p, "-k", f"{ctx.grace_s:g}s", "1d"])
    tool("tini", "`tini -s -g --`", lambda p, o: [p, "-s", "-g", "--"])

    ar = str(ctx.agent_run)

    def ar_prefix(rid, o):
        a = [ar, "--root", str(o.get("root", ctx.ar_root))]
        if o.get("quiet", True):
            a.append("--quiet")
        a += ["--grace", f"{ctx.grace_s:g}s", rid, "--"]
        return a

    peers.append(Peer("agent-run", "agent-run", ar_prefix))
    return peers


def which_abs(cmd):
    p = shutil.which(cmd)
    if p is None:
        raise HarnessError(f"{cmd} is not on PATH")
    return p


# --------------------------------------------------------------------------------------------
# The context: options, binaries, temp dirs
# --------------------------------------------------------------------------------------------


class Ctx:
    def __init__(self, args):
        self.args = args
        self.quick = args.quick
        self.procs = Procs()
        # By default the scratch dir (every run root, the 1 GiB output files) lives in $HOME,
        # the filesystem of agent-run's default root ($HOME/.agent-runs), not in /tmp.
        self.tmp = Path(tempfile.mkdtemp(prefix=".agent-run-bench-", dir=args.tmpdir or os.path.expanduser("~")))
        os.chmod(self.tmp, 0o700)
        self.ar_root = self.tmp / "runs"
        self.ar_root.mkdir(mode=0o700)
        self.bin_dir = None
        # The TERM -> KILL grace of agent-run (and timeout -k) in the stop scenarios.
        self.grace_s = 0.5 if args.quick else 2.0
        self.results = {}
        self.versions = None
        self.errors = []
        self.run_counter = 0
        self.devnull = os.open(os.devnull, os.O_RDWR)
        self.load_start = loadavg()
        self.create_scratch = create_cost_us(self.tmp)
        self.create_tmp = create_cost_us(tempfile.gettempdir())

    @property
    def agent_run(self):
        return self.bin_dir / "agent-run"

    @property
    def watchdog(self):
        return self.bin_dir / "agent-run-watchdog"

    def run_id(self, prefix):
        self.run_counter += 1
        return f"{prefix}-{self.run_counter}"

    def n(self, full, quick):
        return quick if self.quick else full

    def fresh_root(self, name):
        r = self.tmp / name
        r.mkdir(mode=0o700)
        return r


# --------------------------------------------------------------------------------------------
# Build
# --------------------------------------------------------------------------------------------


def build(ctx):
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    if not target.is_absolute():
        target = REPO / target
    ctx.bin_dir = Path(ctx.args.bin_dir) if ctx.args.bin_dir else target / "release"
    if ctx.args.no_build:
        log(f"--no-build: using {ctx.bin_dir}")
    else:
        cmd = ["cargo", "build", "--release", "-p", "agent-run", "-p", "agent-run-watchdog"]
        log("building: " + " ".join(cmd))
        t = time.monotonic()
        r = subprocess.run(cmd, cwd=REPO)
        if r.returncode != 0:
            raise HarnessError(f"cargo build failed with exit {r.returncode}")
        ctx.results["build_s"] = time.monotonic() - t
    for b in (ctx.agent_run, ctx.watchdog):
        if not os.access(b, os.X_OK):
            raise HarnessError(f"{b} is missing (build it, or pass --bin-dir)")
    # What is measured is what was built now: the tree may change while the benchmark runs.
    ctx.versions = versions()


# --------------------------------------------------------------------------------------------
# 1. Launch overhead
# --------------------------------------------------------------------------------------------


def spawn_wait_ns(ctx, argv, env):
    fa = [
        (os.POSIX_SPAWN_DUP2, ctx.devnull, 0),
        (os.POSIX_SPAWN_DUP2, ctx.devnull, 1),
        (os.POSIX_SPAWN_DUP2, ctx.devnull, 2),
    ]
    t0 = time.perf_counter_ns()
    pid = os.posix_spawn(argv[0], argv, env, file_actions=fa)
    ctx.procs.spawned.add(pid)
    _, status = os.waitpid(pid, 0)
    t1 = time.perf_counter_ns()
    ctx.procs.spawned.discard(pid)
    return t1 - t0, os.waitstatus_to_exitcode(status)


def tmpfs_dir():
    """A fresh 0700 directory on a tmpfs (/dev/shm), or None when there is none."""
    shm = Path("/dev/shm")
    try:
        with open("/proc/self/mountinfo") as f:
            on_tmpfs = any(l.split(" - ")[1].split()[0] == "tmpfs" and l.split()[4] == str(shm) for l in f if " - " in l)
    except OSError:
        on_tmpfs = False
    if not on_tmpfs or not os.access(shm, os.W_OK):
        return None
    return Path(tempfile.mkdtemp(prefix="agent-run-bench-", dir=shm))


# agent-run without a run cgroup (the procfs mode): the launch's series and phases beside the
# default, to price the containment.
NO_CGROUP = {"AGENT_RUN_CGROUP": "off"}


def bench_launch(ctx, peers):
    """Every wrapper interleaved, one launch each per round, so a load spike hits them alike;
    agent-run twice: its root on the run root's filesystem (ext4 here) and on a tmpfs."""
    n = ctx.n(1000, 30)
    warm = 5
    true = which_abs("true")
    env = ctx.procs.env()
    root = ctx.fresh_root("launch")
    shm = tmpfs_dir()
    series = [(p, p.name, root, {}) for p in peers if p.available]
    ar = next((p for p in peers if p.name == "agent-run" and p.available), None)
    if ar is not None:
        # The default mode, as `ssh host agent-run ID -- cmd` runs it: the output streamed.
        series.append((ar, "agent-run-stream", root, {"quiet": False}))
    if ar is not None and shm is not None:
        series.append((ar, "agent-run-tmpfs", shm / "runs", {}))
        (shm / "runs").mkdir(mode=0o700)
        # The same without the run's cgroup (procfs mode): what the containment costs a launch.
        series.append((ar, "agent-run-tmpfs-nocg", shm / "runs-nocg", {"env": NO_CGROUP}))
        (shm / "runs-nocg").mkdir(mode=0o700)
    times = {name: [] for _, name, _, _ in series}
    bad = {name: 0 for _, name, _, _ in series}
    # The disk's state now (it changes with what ran before: a build's writeback, a GiB log):
    # file creations alone, and with an fsync after each directory's files, as launches do.
    probe = {"create_us": create_cost_us(root.parent), "create_fsync_us": create_cost_us(root.parent, fsync=True)}
    noise = noise_probe(ctx.n(5.0, 1.0))
    log(f"launch: {n} runs of `true` per wrapper" + ("" if shm else " (no tmpfs for the second agent-run series)"))
    phases = None
    try:
        for i in range(warm + n):
            for p, name, r, o in series:
                o = dict(o)
                extra = o.pop("env", None)
                argv = p.argv([true], run_id=f"l{i}-{name}", root=r, **o)
                ns, code = spawn_wait_ns(ctx, argv, dict(env, **extra) if extra else env)
                if code != 0:
                    bad[name] += 1
                if i >= warm:
                    times[name].append(ns / 1e6)
        # Before these roots go: on an ext4 without a journal every file creation skips the
        # inodes deleted in the last minutes, so the phases would time our own bulk delete.
        if ar is not None:
            phases = launch_phases(ctx, ar, true, env)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if shm is not None:
            shutil.rmtree(shm, ignore_errors=True)
    res = {}
    for p in peers:
        if not p.available:
            res[p.name] = {"skip": p.why}
    for _, name, _, _ in series:
        res[name] = summary(times[name])
        res[name]["nonzero_exits"] = bad[name]
    base = res["bare"]
    for _, name, _, _ in series:
        r = res[name]
        r["over_bare"] = r["median"] - base["median"]
        r["p90_over_bare"] = r["p90"] - base["p90"]
        r["p99_over_bare"] = r["p99"] - base["p99"]
    if shm is None:
        res["agent-run-tmpfs"] = {"skip": "no tmpfs at /dev/shm"}
    res["disk_probe"] = probe
    res["noise"] = noise
    if phases is not None:
        res["phases"] = phases
    return res


def launch_phases(ctx, ar, true, env):
    """Where a launch's time goes: AGENT_RUN_PHASES launches of `true`, root on the run root's
    filesystem and on a tmpfs; per phase the median and p99 of its own time (bench/phases.py)."""
    import phases  # bench/phases.py, beside this file

    n = ctx.n(200, 20)
    out = {}
    roots = [("fs", ctx.fresh_root("phases"), {})]
    shm = tmpfs_dir()
    if shm is not None:
        roots.append(("tmpfs", shm / "runs", {}))
        (shm / "runs").mkdir(mode=0o700)
        # Without the run's cgroup: the phases it adds, side by side.
        roots.append(("tmpfs, no cgroup", shm / "runs-nocg", NO_CGROUP))
        (shm / "runs-nocg").mkdir(mode=0o700)
    log(f"launch phases: {n} timed launches per root")
    try:
        for where, root, extra in roots:
            fd, path = tempfile.mkstemp(prefix="agent-run-phases-")
            os.close(fd)
            penv = dict(env, AGENT_RUN_PHASES=path, **extra)
            spans = []
            try:
                for i in range(n):
                    t0 = time.monotonic_ns() // 1000
                    spawn_wait_ns(ctx, ar.argv([true], run_id=f"p{i}", root=root), penv)
                    spans.append((t0, time.monotonic_ns() // 1000))
                with open(path) as f:
                    lines = f.readlines()
                count, rows = phases.summarise(lines)
                keeper = phases.summarise_helpers(lines)
                outside = phases.outside_main(lines, spans)
                cpu = phases.summarise_cpu(lines)
            finally:
                os.unlink(path)
            out[where] = {"n": count, "rows": rows, "keeper": keeper, "outside": outside, "cpu": cpu}
    finally:
        for _, root, _ in roots:
            shutil.rmtree(root, ignore_errors=True)
        if shm is not None:
            shutil.rmtree(shm, ignore_errors=True)
    return out


# --------------------------------------------------------------------------------------------
# 2. Stop latency
# --------------------------------------------------------------------------------------------

COOP = 'trap "exit 0" TERM; (trap "exit 0" TERM; while :; do sleep 0.05; done) & while :; do sleep 0.05; done'
STUBBORN = '(trap "" TERM HUP; exec sleep 100000) & trap "exit 0" TERM; wait'
ESCAPEE = 'setsid sleep 100000 & sleep 100000 & trap "exit 0" TERM; wait'


def _count(procs, comm, pred=lambda pid, st, s: True):
    n = 0
    for pid, (st, s) in procs.items():
        if st["comm"] == comm and pred(pid, st, s):
            n += 1
    return n


def _catches_term(pid, st, s):
    return bool(s["SigCgt"] & sig_bit(signal.SIGTERM))


def _ignores_term(pid, st, s):
    return bool(s["SigIgn"] & sig_bit(signal.SIGTERM))


def _ignores_term_hup(pid, st, s):
    return _ignores_term(pid, st, s) and bool(s["SigIgn"] & sig_bit(signal.SIGHUP))


STOP_SCENARIOS = [
    {
        "key": "coop",
        "title": "(a) cooperative tree: bash + subshell, both exit on TERM",
        "cmd": ["bash", "-c", COOP],
        "ready": lambda P: _count(P, "bash", _catches_term) >= 2,
        "target": TARGETS["stop_coop"],
    },
    {
        "key": "shell",
        "title": "(b) interactive shell ignoring TERM: `bash -i`, stdin a pipe held open",
        "cmd": ["bash", "--norc", "--noprofile", "-i"],
        "stdin_pipe": True,
        "ready": lambda P: _count(P, "bash", _ignores_term) >= 1,
        "target": TARGETS["stop_shell"],
    },
    {
        "key": "stubborn",
        "title": "(c) stubborn child ignoring TERM and HUP (figures are minus the grace)",
        "cmd": ["bash", "-c", STUBBORN],
        "ready": lambda P: _count(P, "bash", _catches_term) >= 1 and _count(P, "sleep", _ignores_term_hup) >= 1,
        "minus_grace": True,
        "target": TARGETS["stop_stubborn"],
    },
    {
        "key": "escapee",
        "title": "(d) tree with a `setsid` escapee (bash + sleep + `setsid sleep`)",
        "cmd": ["bash", "-c", ESCAPEE],
        "ready": lambda P: _count(P, "bash", _catches_term) >= 1
        and _count(P, "sleep", lambda pid, st, s: st["sid"] == pid) >= 1
        and _count(P, "sleep", lambda pid, st, s: st["sid"] != pid) >= 1,
        "target": TARGETS["stop_escapee"],
    },
]


def tree_of(trial):
    """pid -> (stat, status) of the live processes of one trial."""
    out = {}
    for pid in tagged_pids(TRIAL_VAR, trial):
        st, s = read_stat(pid), read_status(pid)
        if st and s and "SigCgt" in s:
            out[pid] = (st, s)
    return out


def stop_trial(ctx, peer, scen, cap_s):
    trial = ctx.procs.new_trial()
    rid = ctx.run_id(f"stop-{scen['key']}")
    argv = peer.argv(scen["cmd"], run_id=rid)
    p = ctx.procs.popen(
        argv,
        env=ctx.procs.env(trial),
        stdin=subprocess.PIPE if scen.get("stdin_pipe") else subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    fds = {}
    try:
        deadline = time.monotonic() + 10
        while True:
            procs = tree_of(trial)
            if scen["ready"](procs):
                break
            if p.poll() is not None:
                raise HarnessError(f"{peer.name}: the wrapper exited ({p.returncode}) before the tree was ready")
            if time.monotonic() > deadline:
                raise HarnessError(f"{peer.name}: the tree did not form within 10 s: {procs}")
            time.sleep(0.005)
        time.sleep(0.02)  # let the tree settle (the last trap set, the loops sleeping)
        members = set(tree_of(trial)) - {p.pid}
        for pid in members:
            with contextlib.suppress(OSError):
                fds[pid] = os.pidfd_open(pid)
        fds[p.pid] = os.pidfd_open(p.pid)
        poller = select.poll()
        by_fd = {}
        for pid, fd in fds.items():
            poller.register(fd, select.POLLIN)
            by_fd[fd] = pid
        gone = {}
        wall0 = time.time()
        t0 = time.perf_counter_ns()
        os.kill(p.pid, signal.SIGTERM)  # our unreaped child: the pid is ours
        end = t0 + int(cap_s * 1e9)
        while len(gone) < len(fds):
            left = (end - time.perf_counter_ns()) / 1e6
            if left <= 0:
                break
            for fd, _ in poller.poll(max(1, int(left))):
                now = time.perf_counter_ns()
                poller.unregister(fd)
                gone[by_fd[fd]] = (now - t0) / 1e6
        survivors = []
        for pid in members:
            if pid in gone:
                continue
            st = read_stat(pid)
            if st and st["state"] not in ("Z", "X"):
                survivors.append(st["comm"])
        # Anything of the trial we did not know of (forked after the snapshot) still alive.
        for pid in tagged_pids(TRIAL_VAR, trial):
            if pid not in members and pid != p.pid:
                survivors.append((read_stat(pid) or {}).get("comm", "?"))
        wrapper_ms = gone.get(p.pid)
        execs = peer.name in ("bare", "setsid")
        if wrapper_ms is None and execs:
            survivors.append((read_stat(p.pid) or {}).get("comm", "?"))
        tree_ms = max((gone[m] for m in members if m in gone), default=0.0)
        out = {
            "wrapper_ms": wrapper_ms,
            "wrapper_hangs": wrapper_ms is None and not execs,
            "execs": execs,
            "all_ms": max(wrapper_ms, tree_ms) if (wrapper_ms is not None and not survivors) else None,
            "survivors": survivors,
            "members": len(members),
        }
        if peer.name == "agent-run" and wrapper_ms is not None:
            st = read_json(ctx.ar_root / rid / "status.json") or {}
            ended = rfc3339_epoch(st.get("ended_at"))
            out["state"] = st.get("state")
            out["reason"] = st.get("reason")
            out["record_ms"] = (ended - wall0) * 1000 if ended else None
            out["cleanup_ms"] = (st.get("cleanup") or {}).get("duration_ms")
            out["rc"] = p.returncode if p.poll() is not None else None
        return out
    finally:
        for pid, fd in fds.items():
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            os.close(fd)
        if p.poll() is None:
            kill_pid(p.pid)
        with contextlib.suppress(Exception):
            if p.stdin:
                p.stdin.close()
        with contextlib.suppress(Exception):
            p.wait(timeout=5)
        ctx.procs.kill_tagged(TRIAL_VAR, trial)
        ctx.procs.forget_done()


def bench_stop(ctx, peers):
    n = ctx.n(30, 3)
    n_surv = ctx.n(3, 1)  # a peer that leaves survivors is not repeated beyond this
    res = {}
    for scen in STOP_SCENARIOS:
        # How long to wait before calling what is left a survivor: past the grace wherever a
        # peer could escalate (timeout -k), else well past any cooperative exit.
        cap = {"coop": ctx.n(1.5, 0.5), "shell": ctx.grace_s + ctx.n(1.0, 0.5), "stubborn": ctx.grace_s + ctx.n(1.5, 0.5), "escapee": ctx.n(1.5, 0.5)}[scen["key"]]
        log(f"stop {scen['key']}: up to {n} trials per wrapper")
        r = {"_load": [loadavg()]}
        for p in peers:
            if not p.available:
                r[p.name] = {"skip": p.why}
                continue
            trials = []
            for i in range(n):
                trials.append(stop_trial(ctx, p, scen, cap))
                if i + 1 >= n_surv and all(t["survivors"] or t["all_ms"] is None for t in trials):
                    break
            r[p.name] = summarize_stop(trials, scen, ctx)
        r["_load"].append(loadavg())
        res[scen["key"]] = r
    return res


def summarize_stop(trials, scen, ctx):
    minus = ctx.grace_s * 1000 if scen.get("minus_grace") else 0.0
    ok = [t for t in trials if t["all_ms"] is not None]
    s = {"trials": len(trials), "clean": len(ok)}
    surv = [t for t in trials if t["survivors"] or t["all_ms"] is None]
    if surv:
        comms = sorted({c for t in surv for c in t["survivors"]})
        s["survivors"] = comms
        s["survived_trials"] = len(surv)
        w = [t["wrapper_ms"] for t in surv if t["wrapper_ms"] is not None]
        s["wrapper_exited"] = len(w)
        s["wrapper_ms"] = summary(w) if w else None
        s["execs"] = surv[0]["execs"]
    if ok:
        s["all"] = summary([t["all_ms"] - minus for t in ok])
    rec = [t["record_ms"] - minus for t in trials if t.get("record_ms") is not None]
    if rec:
        s["record"] = summary(rec)
        s["states"] = sorted({f"{t.get('state')}/{t.get('reason')}" for t in trials})
    cl = [t["cleanup_ms"] - minus for t in trials if t.get("cleanup_ms") is not None]
    if cl:
        s["cleanup"] = summary(cl)
    return s


# --------------------------------------------------------------------------------------------
# 3. The wrapper's own footprint: peak RSS and CPU while `sleep D` runs
# --------------------------------------------------------------------------------------------


def bench_footprint(ctx, peers):
    dur = ctx.n(10.0, 1.5)
    rounds = ctx.n(3, 1)
    sleep = which_abs("sleep")
    variants = [(p, True) for p in peers]
    ar = next(p for p in peers if p.name == "agent-run")
    variants.append((ar, False))  # streaming: not --quiet, stdout a pipe the harness drains
    samples = {}
    log(f"footprint: {rounds} rounds of `sleep {dur:g}` under every wrapper at once")
    for _ in range(rounds):
        running = []
        for p, quiet in variants:
            if not p.available:
                continue
            key = p.name if quiet else "agent-run (streaming)"
            rid = ctx.run_id("rss")
            out = subprocess.DEVNULL if quiet else subprocess.PIPE
            pr = ctx.procs.popen(
                p.argv([sleep, f"{dur:g}"], run_id=rid, quiet=quiet), stdout=out, stderr=subprocess.DEVNULL
            )
            running.append((key, pr, time.monotonic()))
        time.sleep(0.5)
        early = {key: cpu_ns(pr.pid) for key, pr, _ in running}
        time.sleep(max(0.0, dur - 0.5 - 0.25))
        t_mid = time.monotonic()
        for key, pr, t_start in running:
            s = read_status(pr.pid) or {}
            c = cpu_ns(pr.pid)
            samples.setdefault(key, []).append(
                {
                    "hwm_kb": s.get("VmHWM"),
                    "rss_kb": s.get("VmRSS"),
                    "anon_kb": s.get("RssAnon"),
                    "file_kb": s.get("RssFile"),
                    "threads": s.get("Threads"),
                    "cpu_ms": (c or 0) / 1e6,
                    "cpu_ticks_ms": cpu_ticks_ms(pr.pid),
                    "steady_cpu_ms": ((c or 0) - (early.get(key) or 0)) / 1e6,
                    "steady_s": t_mid - t_start - 0.5,
                    "comm": (read_stat(pr.pid) or {}).get("comm"),
                }
            )
        for key, pr, _ in running:
            if pr.stdout:
                pr.stdout.read()
            pr.wait(timeout=30)
        ctx.procs.forget_done()
    res = {}
    for p, quiet in variants:
        key = p.name if quiet else "agent-run (streaming)"
        if not p.available:
            res[key] = {"skip": p.why}
            continue
        ss = samples[key]
        res[key] = {
            "hwm_kb": statistics.median(s["hwm_kb"] for s in ss),
            "hwm_kb_max": max(s["hwm_kb"] for s in ss),
            "anon_kb": statistics.median(s["anon_kb"] or 0 for s in ss),
            "file_kb": statistics.median(s["file_kb"] or 0 for s in ss),
            "cpu_ms": statistics.median(s["cpu_ms"] for s in ss),
            "steady_cpu_ms": statistics.median(s["steady_cpu_ms"] for s in ss),
            "steady_s": statistics.median(s["steady_s"] for s in ss),
            "threads": max(s["threads"] or 0 for s in ss),
            "comm": ss[0]["comm"],
            "rounds": len(ss),
            "execs": p.name in ("bare", "setsid"),
        }
    res["_dur"] = dur
    return res


# --------------------------------------------------------------------------------------------
# 4. Output streaming
# --------------------------------------------------------------------------------------------


def drain(fd, buf):
    mv = memoryview(buf)
    n = 0
    while True:
        k = os.readv(fd, [mv])
        if k == 0:
            return n
        n += k


def timed_stream(ctx, argv, env=None):
    """Run argv with stdout a pipe the harness drains; (seconds, bytes, exit code)."""
    buf = bytearray(MiB)
    t0 = time.perf_counter_ns()
    p = ctx.procs.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env or ctx.procs.env())
    n = drain(p.stdout.fileno(), buf)
    p.wait()
    t1 = time.perf_counter_ns()
    p.stdout.close()
    return (t1 - t0) / 1e9, n, p.returncode


def bench_output(ctx, peers):
    size = ctx.n(GiB, 32 * MiB)
    reps = ctx.n(5, 2)
    head = which_abs("head")
    cat = which_abs("cat")
    src = ctx.tmp / "same-bytes.bin"
    subprocess.run([head, "-c", str(size), "/dev/zero"], stdout=open(src, "wb"), check=True)
    root = ctx.fresh_root("stream")
    gen = [head, "-c", str(size), "/dev/zero"]
    rows = {}
    log(f"output: {size // MiB} MiB x {reps} per row")

    def add(key, secs, n, extra=None):
        r = rows.setdefault(key, {"secs": [], "bytes_ok": 0, "runs": 0, "log_ok": None})
        r["secs"].append(secs)
        r["runs"] += 1
        r["bytes_ok"] += int(n == size)
        if extra is not None:
            r["log_ok"] = (r["log_ok"] if r["log_ok"] is not None else 0) + int(extra)

    warm_buf = bytearray(MiB)

    def ref_file():
        dst = ctx.tmp / "to-file.bin"
        t0 = time.perf_counter_ns()
        with open(dst, "wb") as f:
            subprocess.run(gen, stdout=f, check=True)
        add("ref: workload -> file (disk)", (time.perf_counter_ns() - t0) / 1e9, os.path.getsize(dst))
        os.unlink(dst)

    def cat_file():
        # From the page cache, as agent-run's wrapper reads a log the workload just wrote: read
        # the file once first (this host's page cache does not keep every gigabyte written).
        with open(src, "rb") as f:
            while f.readinto(warm_buf):
                pass
        s, n, _ = timed_stream(ctx, [cat, str(src)])
        add("cat FILE -> pipe", s, n)

    def through(p):
        if p.name == "agent-run":
            rid = ctx.run_id("out")
            s, n, rc = timed_stream(ctx, p.argv(gen, run_id=rid, root=root, quiet=False))
            logsize = os.path.getsize(root / rid / "stdout.log")
            add("agent-run (log + stream)", s, n, logsize == size)
            shutil.rmtree(root / rid, ignore_errors=True)
        else:
            s, n, _ = timed_stream(ctx, p.argv(gen, run_id="x"))
            add(p.name, s, n)

    steps = [ref_file, cat_file] + [(lambda p=p: through(p)) for p in peers if p.available]
    for rep in range(reps):
        # Rotate the order, and start every measurement with no dirty pages in flight: the
        # writeback of one run's gigabyte must not be charged to the next.
        k = rep % len(steps)
        for step in steps[k:] + steps[:k]:
            os.sync()
            step()
    os.unlink(src)
    res = {"size": size, "rows": {}}
    for key, r in rows.items():
        gbps = [size / s / 1e9 for s in r["secs"]]
        res["rows"][key] = {
            "gbps": statistics.median(gbps),
            "gbps_min": min(gbps),
            "secs": statistics.median(r["secs"]),
            "all_bytes": r["bytes_ok"] == r["runs"],
            "runs": r["runs"],
            "log_ok": None if r["log_ok"] is None else r["log_ok"] == r["runs"],
        }
    for p in peers:
        if not p.available:
            res["rows"][p.name] = {"skip": p.why}
    # first-byte latency: `echo` then a pause, through each wrapper
    res["first_byte"] = first_byte(ctx, peers, root)
    return res


def first_byte(ctx, peers, root):
    n = ctx.n(20, 3)
    out = {}
    cmd = ["sh", "-c", "echo ready; sleep 0.3"]
    for p in peers:
        if not p.available:
            continue
        quiet = False
        lat = []
        for _ in range(n):
            rid = ctx.run_id("fb")
            t0 = time.perf_counter_ns()
            pr = ctx.procs.popen(p.argv(cmd, run_id=rid, root=root, quiet=quiet), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            os.read(pr.stdout.fileno(), 64)
            lat.append((time.perf_counter_ns() - t0) / 1e6)
            pr.stdout.read()
            pr.wait()
            pr.stdout.close()
        out[p.name] = summary(lat)
    ctx.procs.forget_done()
    return out


# --------------------------------------------------------------------------------------------
# 5. Watchdog
# --------------------------------------------------------------------------------------------


def status_template(ctx):
    root = ctx.fresh_root("template")
    r = subprocess.run(
        [str(ctx.agent_run), "--root", str(root), "--quiet", "tpl", "--", which_abs("true")],
        env=ctx.procs.env(),
        stdin=subprocess.DEVNULL,
    )
    st = read_json(root / "tpl" / "status.json")
    if r.returncode != 0 or not st:
        raise HarnessError("could not produce a status.json template with agent-run")
    return st


def rfc3339(epoch):
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def write_file(dirfd, name, data: bytes):
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dirfd)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def fabricate(root: Path, rid, tpl, *, final, pid, start_ticks, wrapper_pid, wrapper_ticks, deadline=None, stage=False):
    """A run dir with a status.json (and lease.json) in the schema agent-run writes. Only the
    files the watchdog reads: creating files is the slow part of a 10,000-run fixture."""
    now = time.time()
    st = dict(tpl)
    st.update(
        run_id=rid,
        pid=pid,
        pgid=pid,
        sid=pid,
        start_ticks=start_ticks,
        wrapper_pid=wrapper_pid,
        wrapper_start_ticks=wrapper_ticks,
        argv=["sleep", "100000"],
        created_at=rfc3339(now),
        started_at=rfc3339(now),
        cleanup=None,
        error=None,
        term_signal=None,
        # The fabricated runs' processes are plain sleepers outside any run cgroup: held by
        # /proc scans. (The template's own cgroup names another run: the watchdog would refuse
        # the record, 77, and never stop it.)
        containment={"mode": "procfs", "cgroup": None},
        resources=None,
        output=None,
    )
    if final:
        st.update(state="finished", reason=None, exit_code=0, ended_at=rfc3339(now))
    else:
        st.update(state="running", reason=None, exit_code=None, ended_at=None)
    name = f".stage-{rid}" if stage else rid
    d = root / name
    os.mkdir(d, 0o700)
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        write_file(dfd, "status.json", (json.dumps(st, indent=2) + "\n").encode())
        if deadline is not None:
            lease = {"deadline_epoch": deadline, "lease_s": max(1.0, deadline - now)}
            write_file(dfd, "lease.json", (json.dumps(lease) + "\n").encode())
    finally:
        os.close(dfd)
    if stage:
        os.rename(d, root / rid)
    return root / rid


def dead_pid(ctx):
    """A pid that was ours and is gone (and its start ticks)."""
    p = ctx.procs.popen([which_abs("sleep"), "1000"])
    st = read_stat(p.pid)
    kill_pid(p.pid)
    p.wait()
    return p.pid, st["start"]


def sleeper(ctx, run_id=None, run_dir=None):
    """A live process, its own session leader, optionally carrying a run's marker: AGENT_RUN_ID
    and AGENT_RUN_DIR, both, as a workload of that run does (the watchdog takes a process for
    the run's only when both match: the id, and the run dir by its device and inode)."""
    extra = {"AGENT_RUN_ID": run_id, "AGENT_RUN_DIR": str(run_dir)} if run_id else None
    p = ctx.procs.popen([which_abs("sleep"), "100000"], env=ctx.procs.env(extra=extra), start_new_session=True)
    for _ in range(200):
        st = read_stat(p.pid)
        if st and st["comm"] == "sleep":
            return p, st["start"]
        time.sleep(0.001)
    raise HarnessError("a sleeper did not start")


# The stand-in wrapper's program: open and flock each run dir named on stdin (until an empty
# line), say so, then exec a copy of sleep named agent-run, which keeps the locks (an open file
# description survives exec). Its start time is the fork's: before the run dirs it holds.
STANDIN = r"""
import fcntl, os, resource, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
want = max(hard, int(open("/proc/sys/fs/nr_open").read()))
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
except (ValueError, OSError):
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
n = 0
for line in sys.stdin:
    if not line.strip():
        break
    fd = os.open(line.strip(), os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.set_inheritable(fd, True)
    n += 1
print(f"locked {n}", flush=True)
os.execv(sys.argv[1], ["agent-run", "100000"])
"""


class StandIn:
    """A live wrapper of many runs as the watchdog verifies one (comm and exe agent-run, started
    before the run dirs, holding each dir's flock), so that their runs are not orphans. Start it
    first ([`standin`]), write the run dirs, then `hold` them."""

    def __init__(self, ctx):
        copy = ctx.tmp / "standin" / "agent-run"
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(which_abs("sleep"), copy)
        self.p = ctx.procs.popen(
            [sys.executable, "-c", STANDIN, str(copy)],
            env=ctx.procs.env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        self.pid = self.p.pid
        self.ticks = read_stat(self.pid)["start"]

    def hold(self, dirs):
        dirs = [str(d) for d in dirs]
        self.p.stdin.write(("\n".join(dirs) + "\n\n").encode())
        self.p.stdin.flush()
        line = self.p.stdout.readline().decode().strip()
        if line != f"locked {len(dirs)}":
            raise HarnessError(f"the stand-in wrapper said {line!r}")
        for _ in range(2000):
            st = read_stat(self.pid)
            if st and st["comm"] == "agent-run":
                return
            time.sleep(0.001)
        raise HarnessError("the stand-in wrapper did not exec")

    def stop(self):
        kill_pid(self.pid)
        self.p.wait()


class NotifySocket:
    """A NOTIFY_SOCKET the watchdog sends READY=1 to after its first full scan."""

    def __init__(self, path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)

    def wait_ready(self, timeout):
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return False
            self.sock.settimeout(left)
            try:
                msg = self.sock.recv(4096)
            except socket.timeout:
                return False
            if b"READY=1" in msg.split(b"\n"):
                return True

    def close(self):
        self.sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def start_daemon(ctx, root, name, scan="30s", ready_timeout=600):
    ns = NotifySocket(ctx.tmp / f"notify-{name}.sock")
    t0 = time.monotonic()
    p = ctx.procs.popen(
        [str(ctx.watchdog), "--root", str(root), "--scan-interval", scan],
        env=ctx.procs.env(extra={"NOTIFY_SOCKET": ns.path}),
        stdout=subprocess.DEVNULL,
        stderr=open(ctx.tmp / f"watchdog-{name}.log", "wb"),
    )
    ok = ns.wait_ready(ready_timeout)
    ready_s = time.monotonic() - t0
    ns.close()
    if not ok:
        stop_daemon(ctx, p)
        raise HarnessError(f"watchdog {name} did not report READY=1 within {ready_timeout} s")
    return p, ready_s


def stop_daemon(ctx, p):
    if p.poll() is None:
        kill_pid(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=35)
        except subprocess.TimeoutExpired:
            kill_pid(p.pid)
            p.wait()


def fill_final(ctx, root, n, tpl, start=0):
    dpid, dticks = ctx._dead
    for i in range(start, n):
        fabricate(root, f"f{i:05d}", tpl, final=True, pid=dpid, start_ticks=dticks, wrapper_pid=dpid, wrapper_ticks=dticks)


def lateness_run(ctx, tpl, n, kind, k, spacing, lead=None):
    """N runs with leases pending in the watchdog; K of them (orphaned, one live sleeper each)
    expire at staggered deadlines after READY. kind: 'live' (the N-K fillers have a live wrapper,
    one stand-in that holds all their locks) or 'orphan-own' (every filler's wrapper is gone and
    each has a live process of its own)."""
    root = ctx.fresh_root(f"late-{kind}-{n}")
    lead = lead if lead is not None else ctx.n(2.0, 0.5)
    load_start = loadavg()
    dpid, dticks = ctx._dead
    shared, sticks = sleeper(ctx)
    far = time.time() + 86400
    own = []
    if kind == "orphan-own":
        # The literal load: every pending run has its own live process.
        for i in range(n - k):
            pr, ticks = sleeper(ctx, run_id=f"w{i:05d}", run_dir=root / f"w{i:05d}")
            own.append(pr)
            fabricate(root, f"w{i:05d}", tpl, final=False, pid=pr.pid, start_ticks=ticks, wrapper_pid=dpid, wrapper_ticks=dticks, deadline=far)
    # Live fillers: one stand-in wrapper holds every filler's lock, as a live wrapper holds its
    # run's (a plain process named in the record would not be taken for their wrapper).
    standin = StandIn(ctx) if kind == "live" else None
    for i in range(n - k if kind != "orphan-own" else 0):
        if standin:
            fabricate(root, f"w{i:05d}", tpl, final=False, pid=shared.pid, start_ticks=sticks, wrapper_pid=standin.pid, wrapper_ticks=standin.ticks, deadline=far)
        else:
            fabricate(root, f"w{i:05d}", tpl, final=False, pid=shared.pid, start_ticks=sticks, wrapper_pid=dpid, wrapper_ticks=dticks, deadline=far)
    if standin:
        standin.hold(root / f"w{i:05d}" for i in range(n - k))
    # The K measured runs exist before the daemon starts, with leases a day away, as a run dir
    # exists before its workload (whose marker names it); after READY each gets its staggered
    # deadline by a lease.json renamed into place, as `renew` writes it.
    sleepers = []
    for i in range(k):
        rid = f"m{i:03d}"
        pr, ticks = sleeper(ctx, run_id=rid, run_dir=root / rid)
        sleepers.append((pr, ticks))
        fabricate(root, rid, tpl, final=False, pid=pr.pid, start_ticks=ticks, wrapper_pid=dpid, wrapper_ticks=dticks, deadline=far)
    p, ready_s = start_daemon(ctx, root, f"late-{kind}-{n}")
    c_ready = cpu_ns(p.pid)
    hwm_ready = (read_status(p.pid) or {}).get("VmHWM")
    t_ready = time.time()
    deadlines = {}
    for i in range(k):
        rid = f"m{i:03d}"
        dl = t_ready + lead + i * spacing
        deadlines[rid] = dl
        tmp = root / rid / ".lease.json.tmp"
        tmp.write_text(json.dumps({"deadline_epoch": dl, "lease_s": max(1.0, dl - time.time())}) + "\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, root / rid / "lease.json")
    t_last = t_ready + lead + (k - 1) * spacing
    # Held by scanning alone, a run stopped without its wrapper is `unknown`, `unprovable`:
    # nothing can prove that nothing of it is left.
    seen = poll_finals(root, deadlines, t_last + 60, (("unknown", "unprovable"), ("cancelled", "lease_expired")))
    late, pending = seen["late"], seen["pending"]
    # What a run still pending holds (a harness that missed a final record must say so).
    pending_states = sorted(
        f"{rid}: {(read_json(root / rid / 'status.json') or {}).get('state')}" for rid in pending
    )
    c_end = cpu_ns(p.pid)
    hwm = (read_status(p.pid) or {}).get("VmHWM")
    tasks = int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])
    stop_daemon(ctx, p)
    for pr, _ in sleepers:
        kill_pid(pr.pid)
        pr.wait()
    for pr in own + [shared]:
        kill_pid(pr.pid)
    for pr in own + [shared]:
        pr.wait()
    if standin:
        standin.stop()
    # the fillers must not have been touched
    touched = sum(
        1 for i in range(0, n - k, max(1, (n - k) // 50)) if (read_json(root / f"w{i:05d}" / "status.json") or {}).get("state") != "running"
    )
    if os.environ.get("AGENT_RUN_BENCH_KEEP_JOURNALS"):
        for rid in deadlines:
            shutil.copy(root / rid / "events.jsonl", Path(os.environ["AGENT_RUN_BENCH_KEEP_JOURNALS"]) / f"{kind}-{n}-{rid}.jsonl")
    bad_states = [v for key, v in late.items() if key.endswith("!")]
    vals = [v for key, v in late.items() if not key.endswith("!")]
    shutil.rmtree(root, ignore_errors=True)
    ctx.procs.forget_done()
    return {
        "n": n,
        "k": k,
        "kind": kind,
        "spacing_s": spacing,
        "window_s": lead + (k - 1) * spacing,
        "ready_s": ready_s,
        "ready_cpu_ms": (c_ready or 0) / 1e6,
        "run_cpu_ms": ((c_end or 0) - (c_ready or 0)) / 1e6,
        "hwm_kb": hwm or hwm_ready,
        "lateness": summary(vals),
        "ended_at_lateness": summary(list(seen["ended_late"].values())),
        "act_lateness": summary([v for v in seen["act_late"].values() if v is not None]),
        "act_to_stop_end": summary(seen["stop_ms"]),
        "stop_end_to_final": summary(seen["final_ms"]),
        "not_final": len(pending),
        "pending_states": pending_states,
        "load": [load_start, loadavg()],
        "pid_max": int(Path("/proc/sys/kernel/pid_max").read_text()),
        "tasks": tasks,
        "bad_states": bad_states,
        "fillers_touched": touched,
    }


def orphan_burst(ctx, mode, n, window=1.0, lead=None):
    """n orphaned runs of agent-run itself whose leases end within `window` seconds, a watchdog
    daemon running: how late each final record is. Each run is a detached `sleep` (it dies on
    TERM) whose wrapper is SIGKILLed; then each gets its deadline by a lease.json renamed into
    place (without its wrapper a run's lease only ever comes earlier). mode: "cgroup" (each run
    in a cgroup of its own, as root) or "procfs" (`--cgroup off`: held by /proc scans alone)."""
    root = ctx.fresh_root(f"burst-{mode}")
    lead = lead if lead is not None else ctx.n(2.0, 1.0)
    load_start = loadavg()
    p, ready_s = start_daemon(ctx, root, f"burst-{mode}")
    ids = [f"b{i:03d}" for i in range(n)]
    extra = ["--cgroup", "off"] if mode == "procfs" else []
    ar = str(ctx.agent_run)
    for rid in ids:
        r = subprocess.run([ar, "--root", str(root), "-d", "--lease", "1h", *extra, rid, "--", which_abs("sleep"), "100000"], env=ctx.procs.env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if r.returncode != 0:
            raise HarnessError(f"agent-run -d {rid} exited {r.returncode}: {r.stderr.decode(errors='replace')[:300]}")
    held = [(read_json(root / rid / "status.json") or {}).get("containment") or {} for rid in ids]
    cgroups = [Path(c["cgroup"]) for c in held if c.get("cgroup")]
    wrappers = [(read_json(root / rid / "status.json") or {}).get("wrapper_pid") for rid in ids]
    for w in wrappers:
        if w:
            kill_pid(w, check=lambda pid: (read_stat(pid) or {}).get("comm") == "agent-run")
    # Every wrapper gone (a zombie is gone: its lock is released) before the leases move.
    end = time.monotonic() + 30
    while time.monotonic() < end and any(w and (read_stat(w) or {"state": "Z"})["state"] not in ("Z", "X") for w in wrappers):
        time.sleep(0.01)
    c0 = cpu_ns(p.pid)
    t0 = time.time()
    deadlines = {rid: t0 + lead + i * window / n for i, rid in enumerate(ids)}
    for rid, dl in deadlines.items():
        tmp = root / rid / ".lease.json.tmp"
        tmp.write_text(json.dumps({"deadline_epoch": dl, "lease_s": max(1.0, dl - time.time())}) + "\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, root / rid / "lease.json")
    want = (("cancelled", "lease_expired"),) if mode == "cgroup" else (("unknown", "unprovable"), ("cancelled", "lease_expired"))
    seen = poll_finals(root, deadlines, t0 + lead + window + 60, want)
    c1 = cpu_ns(p.pid)
    late, pending = seen["late"], seen["pending"]
    states = sorted({f"{(read_json(root / r / 'status.json') or {}).get('state')}/{(read_json(root / r / 'status.json') or {}).get('reason')}" for r in ids})
    out = {
        "n": n,
        "mode": mode,
        "held_by": sorted({str(c.get("mode")) for c in held}),
        "load_start": load_start,
        "window_s": window,
        "ready_s": ready_s,
        "lateness": summary([v for key, v in late.items() if not key.endswith("!")]),
        "act_lateness": summary([v for v in seen["act_late"].values() if v is not None]),
        "act_to_stop_end": summary(seen["stop_ms"]),
        "stop_end_to_final": summary(seen["final_ms"]),
        "cpu_ms": ((c1 or 0) - (c0 or 0)) / 1e6,
        "not_final": len(pending),
        "bad_states": [v for key, v in late.items() if key.endswith("!")],
        "states": states,
    }
    if os.environ.get("AGENT_RUN_BENCH_KEEP_JOURNALS"):
        for rid in ids:
            shutil.copy(root / rid / "events.jsonl", Path(os.environ["AGENT_RUN_BENCH_KEEP_JOURNALS"]) / f"burst-{mode}-{rid}.jsonl")
    end_round(ctx, p, root, out)
    # A cgroup the watchdog did not remove (a run it did not finish), emptied by end_round.
    for cg in cgroups:
        with contextlib.suppress(OSError):
            cg.rmdir()
    ctx.procs.forget_done()
    return out


def poll_finals(root, deadlines, give_up, want=(("cancelled", "lease_expired"),)):
    """Wait for the final record of each run in `deadlines` (run id -> lease deadline, epoch)
    until `give_up`: how late each is seen (ms), and from its journal when the watchdog acted
    and stopped. A run that ends in a (state, reason) not in `want` is listed as "<rid>!"."""
    pending = set(deadlines)
    late = {}
    act_late = {}
    stop_ms, final_ms = [], []
    # Poll, every millisecond, only the runs whose deadline has passed (a stat each), so the
    # time the final record appears is known to ~1 ms without loading the machine. `ended_at`
    # is stamped before the record is written and fsynced; "seen" is when it is there.
    seen_key = {}
    ended_late = {}
    while pending and time.time() < give_up:
        now = time.time()
        for rid in [r for r in pending if deadlines[r] <= now + 0.002]:
            try:
                sb = os.stat(root / rid / "status.json")
            except OSError:
                continue
            # Not the inode alone: a record is exchanged into place and the old file unlinked,
            # so `running` -> `cancelling` -> final can hand the final record the inode the
            # `running` one had (ext4 reuses a freed inode at once), and a poll that saw
            # `running` and then missed `cancelling` would wait for a change it already had.
            key = (sb.st_ino, sb.st_ctime_ns, sb.st_size)
            if seen_key.get(rid) == key:
                continue
            seen_key[rid] = key
            st = read_json(root / rid / "status.json")
            if not (st and st.get("state") in ("cancelled", "unknown", "finished")):
                continue
            t_seen = time.time()
            late[rid] = (t_seen - deadlines[rid]) * 1000
            ended_late[rid] = (rfc3339_epoch(st["ended_at"]) - deadlines[rid]) * 1000
            ev = watchdog_events(root / rid)
            act_late[rid] = (ev["first"] - deadlines[rid]) * 1000 if ev.get("first") else None
            if ev.get("first") and ev.get("stop_end"):
                stop_ms.append((ev["stop_end"] - ev["first"]) * 1000)
                final_ms.append((t_seen - ev["stop_end"]) * 1000)
            pending.discard(rid)
            if (st.get("state"), st.get("reason")) not in want:
                late[rid + "!"] = f"{st.get('state')}/{st.get('reason')}"
        time.sleep(0.001)
    return {"late": late, "pending": pending, "ended_late": ended_late, "act_late": act_late, "stop_ms": stop_ms, "final_ms": final_ms}


def watchdog_events(d):
    """Times (epoch) of the watchdog's first journal line and of its stop_begin / stop_end."""
    out = {}
    try:
        with open(d / "events.jsonl") as f:
            for line in f:
                ev = json.loads(line)
                if ev.get("by") != "watchdog":
                    continue
                t = rfc3339_epoch(ev["ts"])
                out.setdefault("first", t)
                if ev.get("event") in ("stop_begin", "stop_end"):
                    out.setdefault(ev["event"], t)
    except (OSError, ValueError):
        pass
    return out


# The watchdog's settled ledger takes no record changed within the last 2 s (the contract: a
# rewrite in the same clock tick could keep its change time), so a pass right after the fixture
# is written reads the newest records in full, every pass, until they are 2 s old: a rescan
# figure measured then is of a root that is partly not yet settled, not of the steady state of
# a daemon's periodic rescan. Wait that long after writing a fixture, before the warm pass.
SETTLE_S = 2.1


def once_cpu(ctx, root, reps):
    """CPU (user+sys ms) and wall of `agent-run-watchdog --once` over root, median of reps (the
    first writes the settled ledger `.watchdog.settled`; the median is of passes that read it),
    SETTLE_S after the fixture was written."""
    time.sleep(SETTLE_S)
    cpu, wall = [], []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        pid = os.posix_spawn(
            str(ctx.watchdog),
            [str(ctx.watchdog), "--root", str(root), "--once"],
            ctx.procs.env(),
            file_actions=[(os.POSIX_SPAWN_DUP2, ctx.devnull, 1), (os.POSIX_SPAWN_DUP2, ctx.devnull, 2)],
        )
        ctx.procs.spawned.add(pid)
        _, status, ru = os.wait4(pid, 0)
        ctx.procs.spawned.discard(pid)
        wall.append((time.perf_counter_ns() - t0) / 1e6)
        if os.waitstatus_to_exitcode(status) != 0:
            raise HarnessError(f"agent-run-watchdog --once exited {os.waitstatus_to_exitcode(status)}")
        cpu.append((ru.ru_utime + ru.ru_stime) * 1000)
    return {"cpu_ms": statistics.median(cpu), "wall_ms": statistics.median(wall), "reps": reps}


def bench_watchdog(ctx):
    if os.environ.get("AGENT_RUN_BENCH_BURST_ONLY"):
        # For one experiment: the burst rows alone.
        return {"burst": bench_burst(ctx)}
    res = {}
    tpl = status_template(ctx)
    ctx._dead = dead_pid(ctx)
    sizes = [100, 1000, 10000] if not ctx.quick else [100, 1000]
    reps = ctx.n(5, 2)

    # Rescan CPU over final dirs, and over pending dirs of both kinds.
    log(f"watchdog: --once over {sizes} final run dirs")
    res["rescan"] = {}
    roots = {}
    for n in sizes:
        root = ctx.fresh_root(f"final-{n}")
        fill_final(ctx, root, n, tpl)
        roots[n] = root
        log(f"watchdog: {n} final run dirs written")
        res["rescan"][f"final {n}"] = once_cpu(ctx, root, reps)
    pend_sizes = [100, 1000, 10000] if not ctx.quick else [100]
    # Pending dirs held by one live stand-in wrapper (`StandIn`: it holds every dir's lock, as a
    # wrapper holds its run's). Not orphans sharing one session leader: a shared process is no
    # orphan's by the trust rules, so a pass would stop them all; the lateness rows measure
    # real orphans.
    for kind in ("live",):
        shared, sticks = sleeper(ctx)
        for n in pend_sizes:
            root = ctx.fresh_root(f"pend-{kind}-{n}")
            far = time.time() + 86400
            standin = StandIn(ctx)
            for i in range(n):
                fabricate(root, f"p{i:05d}", tpl, final=False, pid=shared.pid, start_ticks=sticks, wrapper_pid=standin.pid, wrapper_ticks=standin.ticks, deadline=far)
            standin.hold(root / f"p{i:05d}" for i in range(n))
            log(f"watchdog: --once over {n} pending ({kind}) run dirs")
            res["rescan"][f"{kind} {n}"] = once_cpu(ctx, root, reps if n < 10000 else 1)
            standin.stop()
            shutil.rmtree(root, ignore_errors=True)
        kill_pid(shared.pid)
        shared.wait()

    # Idle CPU of the daemon over final runs.
    idle_s = ctx.n(60.0, 2.0)
    idle_sizes = sizes if not ctx.quick else [1000]
    log(f"watchdog: idle CPU over {idle_sizes} final runs for {idle_s:g} s (daemons side by side)")
    daemons = []
    for n in idle_sizes:
        p, ready_s = start_daemon(ctx, roots[n], f"idle-{n}")
        daemons.append((n, p, ready_s, cpu_ns(p.pid), cpu_ticks_ms(p.pid), time.monotonic()))
    time.sleep(idle_s)
    res["idle"] = {}
    for n, p, ready_s, c0, k0, t0 in daemons:
        c1, k1 = cpu_ns(p.pid), cpu_ticks_ms(p.pid)
        el = time.monotonic() - t0
        s = read_status(p.pid) or {}
        res["idle"][n] = {
            "cpu_ms": (c1 - c0) / 1e6,
            "ticks_ms": k1 - k0,
            "secs": el,
            "ready_s": ready_s,
            "startup_cpu_ms": c0 / 1e6,
            "hwm_kb": s.get("VmHWM"),
        }
        stop_daemon(ctx, p)
    for root in roots.values():
        shutil.rmtree(root, ignore_errors=True)

    # Lease lateness.
    res["lateness"] = []
    if ctx.quick:
        plan = [(200, "live", 10, 0.1), (200, "orphan-own", 10, 0.1)]
    else:
        # No "orphan" fillers sharing one process: under the trust rules a process is an
        # orphaned run's only by its marker (AGENT_RUN_ID and AGENT_RUN_DIR of that run), which
        # one shared process cannot carry for 10,000 runs; those runs would be settled at once.
        plan = [
            (100, "live", 100, 0.4),
            (1000, "live", 100, 0.4),
            (10000, "live", 100, 0.4),
            (1000, "orphan-own", 100, 0.4),
            (10000, "orphan-own", 100, 0.4),
        ]
    if os.environ.get("AGENT_RUN_BENCH_LATENESS"):
        # For one experiment: N:KIND:K:SPACING[,...] instead of the plan above.
        plan = [(int(n), kind, int(k), float(sp)) for n, kind, k, sp in (x.split(":") for x in os.environ["AGENT_RUN_BENCH_LATENESS"].split(","))]
    for n, kind, k, spacing in plan:
        log(f"watchdog: lease lateness, {n} pending leases ({kind} fillers), {k} expiring {spacing:g} s apart")
        res["lateness"].append(lateness_run(ctx, tpl, n, kind, k, spacing))

    res["burst"] = bench_burst(ctx)
    return res


def bench_burst(ctx):
    """Orphaned runs of agent-run itself whose leases end in the same second: held in cgroups
    (as root only) and by /proc scans."""
    out = []
    n = ctx.n(200, 20)
    for mode in ["cgroup", "procfs"] if os.geteuid() == 0 else ["procfs"]:
        log(f"watchdog: {n} orphaned runs ({mode}) whose leases end in one second")
        out.append(orphan_burst(ctx, mode, n))
    return out


# --------------------------------------------------------------------------------------------
# 6. cancel round trip
# --------------------------------------------------------------------------------------------


def bench_cancel(ctx):
    n = ctx.n(50, 5)
    root = ctx.fresh_root("cancel")
    ar = str(ctx.agent_run)
    detach, rtt, states, left = [], [], {}, 0
    log(f"cancel: {n} detached cooperative runs, each cancelled")
    for i in range(n):
        trial = ctx.procs.new_trial()
        rid = f"c{i}"
        env = ctx.procs.env(trial)
        t0 = time.perf_counter_ns()
        r = subprocess.run([ar, "--root", str(root), "-d", rid, "--", "bash", "-c", COOP], env=env, stdin=subprocess.DEVNULL, capture_output=True)
        detach.append((time.perf_counter_ns() - t0) / 1e6)
        if r.returncode != 0:
            raise HarnessError(f"agent-run -d exited {r.returncode}: {r.stderr.decode(errors='replace')}")
        end = time.monotonic() + 5
        while _count(tree_of(trial), "bash", _catches_term) < 2 and time.monotonic() < end:
            time.sleep(0.005)
        time.sleep(0.02)
        t0 = time.perf_counter_ns()
        c = subprocess.run([ar, "--root", str(root), "cancel", rid], env=ctx.procs.env(), stdin=subprocess.DEVNULL, capture_output=True)
        rtt.append((time.perf_counter_ns() - t0) / 1e6)
        st = read_json(root / rid / "status.json") or {}
        key = f"exit {c.returncode}: {st.get('state')}/{st.get('reason')}"
        states[key] = states.get(key, 0) + 1
        time.sleep(0.01)
        left += len(tagged_pids(TRIAL_VAR, trial))
        ctx.procs.kill_tagged(TRIAL_VAR, trial)
    shutil.rmtree(root, ignore_errors=True)
    return {"detach": summary(detach), "cancel": summary(rtt), "outcomes": states, "left_behind": left}


# --------------------------------------------------------------------------------------------
# 7. Scale: 1k / 10k / 100k run dirs, 1,000 live runs
# --------------------------------------------------------------------------------------------


def spawn_rusage(ctx, argv, stdout=None):
    """Run argv to completion: (exit code, user+sys CPU ms, wall ms, peak RSS KiB, user ms, sys
    ms). CPU and wall from wait4. The peak RSS comes from GNU time's %M when it is installed: a
    child spawned by this Python starts from Python's own address space, and ru_maxrss keeps
    that high-water mark across the exec (20+ MiB that are not the program's); time(1) is small,
    so its child's mark is the program's own (to about 1 MiB)."""
    out = stdout if stdout is not None else ctx.devnull
    gnu_time = Path("/usr/bin/time").exists()
    rss_file = ctx.tmp / "maxrss"
    run = argv
    if gnu_time:
        run = ["/usr/bin/time", "-f", "%M", "-o", str(rss_file), *argv]
    t0 = time.perf_counter_ns()
    pid = os.posix_spawn(run[0], run, ctx.procs.env(), file_actions=[(os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, ctx.devnull, 2)])
    ctx.procs.spawned.add(pid)
    _, status, ru = os.wait4(pid, 0)
    ctx.procs.spawned.discard(pid)
    wall = (time.perf_counter_ns() - t0) / 1e6
    code = os.waitstatus_to_exitcode(status)
    rss = ru.ru_maxrss
    if gnu_time:
        with contextlib.suppress(OSError, ValueError):
            rss = int(rss_file.read_text().split()[-1])
    return code, (ru.ru_utime + ru.ru_stime) * 1000, wall, rss, ru.ru_utime * 1000, ru.ru_stime * 1000


def rusage_median(ctx, argv, reps, what):
    rows = []
    for _ in range(reps):
        code, cpu, wall, rss, u, sy = spawn_rusage(ctx, argv)
        if code != 0:
            raise HarnessError(f"{what} exited {code}")
        rows.append((cpu, wall, rss, u, sy))
    rows.sort()
    cpu, wall, rss, u, sy = rows[len(rows) // 2]
    return {"cpu_ms": cpu, "user_ms": u, "sys_ms": sy, "wall_ms": wall, "maxrss_kb": rss, "reps": reps, "load": loadavg()}


def pss_kb(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def bench_scale(ctx):
    import fixtures  # bench/fixtures.py, beside this file

    res = {"once": {}, "list": {}, "daemon": {}, "live": {}}
    files = fixtures.template(ctx.agent_run, env=ctx.procs.env())
    sizes = [1000, 10000, 100000] if not ctx.quick else [100, 1000]
    list_sizes = [10000, 100000] if not ctx.quick else [1000]
    roots = {}
    have = 0
    root = ctx.fresh_root("scale")
    for n in sizes:
        log(f"scale: {n:,} final run dirs (copies of one agent-run run dir)")
        t = time.monotonic()
        fixtures.make_final(root, n - have, files, start=have)
        have = n
        res.setdefault("fixture_s", {})[n] = time.monotonic() - t
        wd = [str(ctx.watchdog), "--root", str(root), "--once"]
        time.sleep(SETTLE_S)  # every record old enough for the ledger (SETTLE_S)
        spawn_rusage(ctx, wd)  # warm the caches (and write the settled ledger): every figure is a warm pass
        res["once"][n] = rusage_median(ctx, wd, ctx.n(5 if n < 100000 else 3, 3), "agent-run-watchdog --once")
        log(f"scale: --once over {n:,}: {res['once'][n]['cpu_ms']:.0f} ms CPU")
        if n in list_sizes:
            ar = str(ctx.agent_run)
            for key, argv in (
                ("list", [ar, "--root", str(root), "list"]),
                ("list --json", [ar, "--root", str(root), "list", "--json"]),
                ("gc (nothing old enough)", [ar, "--root", str(root), "gc", "--older-than", "1d"]),
            ):
                res["list"].setdefault(n, {})[key] = rusage_median(ctx, argv, ctx.n(3, 1), key)
                x = res["list"][n][key]
                log(f"scale: {key} over {n:,}: {x['cpu_ms']:.0f} ms CPU, {x['wall_ms']:.0f} ms wall")
        if n == sizes[-1]:
            # The daemon's first pass (startup to READY=1) over the largest root.
            p, ready_s = start_daemon(ctx, root, f"scale-{n}")
            c = cpu_ns(p.pid)
            hwm = (read_status(p.pid) or {}).get("VmHWM")
            stop_daemon(ctx, p)
            res["daemon"] = {"n": n, "ready_s": ready_s, "cpu_ms": (c or 0) / 1e6, "hwm_kb": hwm}
    # gc that removes every run (100,000 at full size, wall time the figure): the cleanup of the
    # fixture too.
    load = loadavg()
    code, cpu, wall, rss, u, sy = spawn_rusage(ctx, [str(ctx.agent_run), "--root", str(root), "gc", "--older-than", "0s"])
    res["gc_all"] = {"n": have, "code": code, "cpu_ms": cpu, "wall_ms": wall, "maxrss_kb": rss, "left": sum(1 for e in os.scandir(root) if not e.name.startswith(".")), "load": load}
    log(f"scale: gc --older-than 0s removing {have:,} runs: {wall:.0f} ms wall, {cpu:.0f} ms CPU")
    shutil.rmtree(root, ignore_errors=True)
    res["live"] = live_runs(ctx, ctx.n(1000, 20))
    return res


def launch_many(ctx, root, ids, lease):
    ar = str(ctx.agent_run)
    t0 = time.monotonic()
    for rid in ids:
        r = subprocess.run([ar, "--root", str(root), "-d", "--lease", lease, rid, "--", which_abs("sleep"), "100000"], env=ctx.procs.env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if r.returncode != 0:
            raise HarnessError(f"agent-run -d {rid} exited {r.returncode}: {r.stderr.decode(errors='replace')[:300]}")
    return time.monotonic() - t0


def final_times(root, ids):
    """ended_at (epoch) of every final run, and how many are not final."""
    ended, pending = {}, 0
    for rid in ids:
        st = read_json(root / rid / "status.json") or {}
        if st.get("state") in ("finished", "cancelled", "unknown", "launch_failed") and st.get("ended_at"):
            ended[rid] = rfc3339_epoch(st["ended_at"])
        else:
            pending += 1
    return ended, pending


def end_round(ctx, p, root, figures):
    """The end of a round of live runs: the load into its figures, the daemon `p` stopped, the
    processes of the runs still alive counted (`left`) and killed, the root removed."""
    figures["load"] = loadavg()
    stop_daemon(ctx, p)
    time.sleep(0.2)
    figures["left"] = len(tagged_pids(SESSION_VAR, ctx.procs.session))
    ctx.procs.kill_tagged(SESSION_VAR, ctx.procs.session)
    shutil.rmtree(root, ignore_errors=True)


def live_runs(ctx, n):
    """n detached `sleep` runs with a lease each; the watchdog idle beside them; every run
    stopped by one many-id cancel; then n more stopped by lease expiry."""
    out = {"n": n}
    root = ctx.fresh_root("live")
    ids = [f"l{i:04d}" for i in range(n)]
    log(f"scale: launching {n} detached runs (sleep, --lease 1h)")
    secs = launch_many(ctx, root, ids, "1h")
    out["launch_s"] = secs
    out["launch_rate"] = n / secs
    wrappers = [(read_json(root / rid / "status.json") or {}).get("wrapper_pid") for rid in ids]
    rss = [(read_status(w) or {}).get("VmRSS") for w in wrappers if w]
    pss = [pss_kb(w) for w in wrappers if w]
    out["wrappers_alive"] = sum(1 for w in wrappers if w and read_stat(w))
    out["rss_total_kb"] = sum(x for x in rss if x)
    out["pss_total_kb"] = sum(x for x in pss if x)
    idle_s = ctx.n(10.0, 2.0)
    p, ready_s = start_daemon(ctx, root, "live")
    c0 = cpu_ns(p.pid)
    t0 = time.monotonic()
    time.sleep(idle_s)
    c1 = cpu_ns(p.pid)
    out["daemon"] = {"ready_s": ready_s, "startup_cpu_ms": (c0 or 0) / 1e6, "idle_cpu_ms": ((c1 or 0) - (c0 or 0)) / 1e6, "idle_s": time.monotonic() - t0, "hwm_kb": (read_status(p.pid) or {}).get("VmHWM"), "load": loadavg()}
    log(f"scale: one cancel of {n} ids")
    t_sig = time.time()
    t0 = time.perf_counter_ns()
    # --wait sized to the batch: the default (a run's grace + 5 s) bounds one run's stop, and
    # 1,000 stops at once on two cores take longer; the figure is the time to the last record.
    r = subprocess.run([str(ctx.agent_run), "--root", str(root), "cancel", "--wait", f"{max(60, n)}s", *ids], env=ctx.procs.env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    cancel_ms = (time.perf_counter_ns() - t0) / 1e6
    ended, pending = final_times(root, ids)
    out["cancel"] = {
        "code": r.returncode,
        "return_ms": cancel_ms,
        "last_final_ms": (max(ended.values()) - t_sig) * 1000 if ended else None,
        "not_final": pending,
    }
    end_round(ctx, p, root, out["cancel"])

    # Round 2: lease expiry (the wrappers enforce their own leases; the watchdog watches too).
    root = ctx.fresh_root("live-lease")
    lease_s = max(ctx.n(20, 3), int(out["launch_s"] * 1.5) + ctx.n(10, 2))
    log(f"scale: launching {n} detached runs (sleep, --lease {lease_s}s), left to expire")
    p, _ = start_daemon(ctx, root, "live-lease")
    launch_many(ctx, root, ids, f"{lease_s}s")
    deadlines = {}
    for rid in ids:
        le = read_json(root / rid / "lease.json") or {}
        if le.get("deadline_epoch"):
            deadlines[rid] = le["deadline_epoch"]
    give_up = max(deadlines.values()) + 60 if deadlines else time.time() + 60
    while time.time() < give_up:
        ended, pending = final_times(root, ids)
        if not pending:
            break
        time.sleep(0.25)
    late = [(ended[r] - deadlines[r]) * 1000 for r in ended if r in deadlines]
    out["lease"] = {
        "lease_s": lease_s,
        "lateness": summary(late),
        "last_deadline_to_last_final_ms": (max(ended.values()) - max(deadlines.values())) * 1000 if ended and deadlines else None,
        "not_final": pending,
        "states": sorted({f"{(read_json(root / r / 'status.json') or {}).get('state')}/{(read_json(root / r / 'status.json') or {}).get('reason')}" for r in ids[:: max(1, n // 20)]}),
    }
    end_round(ctx, p, root, out["lease"])
    return out


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def paras(a, *texts):
    """Markdown paragraphs or headings: each text, then a blank line."""
    for t in texts:
        a(t)
        a("")


def table_head(a, head):
    """A table's header row, then its rule."""
    a(head)
    a("|" + "---|" * (head.count("|") - 1))


def measured(a, r, keys, skipped):
    """(key, label, result) for each (key, label) with a result in `r`. A skipped one gets the
    row `skipped` instead, formatted with its label and why."""
    for k, label in keys:
        x = r.get(k)
        if x is None:
            continue
        if "skip" in x:
            a(skipped.format(label=label, why=x["skip"]))
            continue
        yield k, label, x


def where_table(a, head, cols, rows):
    """A markdown table of a median and a p99 (µs) per column: `cols` is [(where, data)] ("fs",
    "tmpfs"), `rows` is [(label, get)] with get(data) -> (median, p99) or None (a dash)."""
    a(f"| {head} | " + " | ".join(f"{w} median µs | {w} p99 µs" for w, _ in cols) + " |")
    a("|---|" + "---|---|" * len(cols))
    for label, get in rows:
        cells = []
        for _, data in cols:
            v = get(data)
            cells += [f"{v[0]:.0f}", f"{v[1]:.0f}"] if v else ["—", "—"]
        a(f"| {label} | " + " | ".join(cells) + " |")


def create_cost_us(base, fsync=False):
    """Median µs to create an empty file in a fresh subdirectory of `base` (what a launch does
    about ten times), or None when base is not writable. With `fsync`, the last file of each
    subdirectory gets 300 bytes and an fsync, as back-to-back launches do (their final
    records): on this VM's disk that can make every creation after it several times slower."""
    try:
        d = Path(tempfile.mkdtemp(prefix=".create-probe-", dir=base))
    except OSError:
        return None
    v = []
    try:
        for k in range(20):
            sub = d / f"d{k}"
            os.mkdir(sub, 0o700)
            for i in range(3):
                t = time.perf_counter_ns()
                fd = os.open(sub / f"f{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                v.append((time.perf_counter_ns() - t) / 1e3)
                if fsync and i == 2:
                    os.write(fd, b"x" * 300)
                    os.fsync(fd)
                os.close(fd)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return statistics.median(v)


NOISE_PROBE = r"""
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
secs = float(sys.argv[2])
now = time.perf_counter_ns
end = now() + int(secs * 1e9)
last = now()
g05 = g1 = 0
worst = 0
while True:
    t = now()
    g = t - last
    last = t
    if g > 500_000:
        g05 += 1
        if g > 1_000_000:
            g1 += 1
        worst = max(worst, g)
    if t > end:
        break
print(g05, g1, worst)
"""


def noise_probe(secs):
    """How often this machine takes a CPU away for more than 0.5 ms and 1 ms: a busy loop on
    each CPU at once (pinned), noting every gap between two readings of the clock. On an idle
    VM such gaps are the host's (or the guest kernel's own threads'); a launch of ~2 ms that
    meets one is a tail launch whatever runs in it. None where it cannot run."""
    cpus = sorted(os.sched_getaffinity(0))
    procs = []
    try:
        for c in cpus:
            procs.append(subprocess.Popen([sys.executable, "-c", NOISE_PROBE, str(c), str(secs)], stdout=subprocess.PIPE, text=True))
        out = [p.communicate(timeout=secs + 30)[0].split() for p in procs]
    except (OSError, subprocess.TimeoutExpired):
        for p in procs:
            p.kill()
            p.wait()
        return None
    if any(len(o) != 3 or p.returncode != 0 for o, p in zip(out, procs)):
        return None
    g05 = sum(int(o[0]) for o in out)
    g1 = sum(int(o[1]) for o in out)
    return {
        "secs": secs,
        "cpus": len(cpus),
        "gaps_over_0_5ms_per_cpu_s": g05 / secs / len(cpus),
        "gaps_over_1ms_per_cpu_s": g1 / secs / len(cpus),
        "max_gap_ms": max(int(o[2]) for o in out) / 1e6,
    }


def loadavg():
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def machine(scratch):
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = "?"
    with contextlib.suppress(OSError):
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    fs = "?"
    with contextlib.suppress(OSError):
        tmp = os.path.realpath(scratch)
        best = ""
        for line in open("/proc/mounts"):
            parts = line.split()
            mnt, typ = parts[1], parts[2]
            if (tmp == mnt or tmp.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, fs = mnt, typ
    return {
        "load": loadavg(),
        "kernel": platform.release(),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory": mem,
        "tmp_fs": fs,
    }


def versions():
    out = {}
    for name, cmd in [("tini", ["tini", "--version"]), ("timeout", ["timeout", "--version"]), ("setsid", ["setsid", "--version"]), ("bash", ["bash", "--version"])]:
        if shutil.which(name):
            with contextlib.suppress(Exception):
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=5)
                out[name] = (r.stdout or r.stderr).splitlines()[0].strip()
    with contextlib.suppress(Exception):
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        # The harness and its report do not count as changes to what is measured.
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench", ":!docs/benchmarks.md"],
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stdout.strip()
        out["agent-run"] = f"git {rev}" + (" + uncommitted changes" if dirty else "") + " (at build time)"
    return out


def verdict(ok):
    if ok is None:
        return "—"
    if isinstance(ok, str):
        return ok
    return "meets" if ok else "**misses**"


def stop_verdict(x, limit):
    """meets when median and p99 are under the limit and nothing survived."""
    s = x.get("all")
    if x.get("survivors") or not s:
        return False
    if s["p99"] < limit:
        return True
    if s["median"] < limit:
        return "meets at the median; **p99 misses**"
    return False


def before_after(R):
    """The before/after table of issue 17, from a run's results (also from a --json file)."""
    B = []
    b = B.append

    def g(*keys):
        x = R
        for k in keys:
            if not isinstance(x, dict):
                return None
            x = x.get(k, x.get(str(k)) if not isinstance(k, str) else None)
            if x is None:
                return None
        return x

    b("## Before and after (issue 17)")
    b("")
    b("\"Before\" is docs/benchmarks.md as it stood (a full run on the static binaries of git 1cb0da3, load 0.5-1.0) and, for the figures it did not have, the session's own baseline with the same fixtures (`bench/fixtures.py`, GNU time, warm cache). \"After\" is this run: see its load averages; while it ran, other builds shared the machine.")
    b("")
    b("| figure | target | before | after |")
    b("|---|---|---|---|")
    la = g("launch", "agent-run", "over_bare")
    lt = g("launch", "tini", "over_bare")
    b(f"| launch overhead of `true`, median over bare | tini's + 2 ms | +2.00 ms (tini +0.72) | {'+' + fms(la) if la is not None else '—'} ms (tini {'+' + fms(lt) if lt is not None else '—'}) |")
    la99, lt99 = g("launch", "agent-run", "p99_over_bare"), g("launch", "tini", "p99_over_bare")
    if la99 is not None:
        b(f"| launch overhead of `true`, p99 over bare's p99 | tini's + 2 ms | — (not measured) | {fms(la99)} ms (tini {fms(lt99)}) |")
    lm = g("launch", "agent-run-tmpfs", "over_bare")
    if lm is not None:
        lm99 = g("launch", "agent-run-tmpfs", "p99_over_bare")
        b(f"| launch overhead, root on tmpfs: median / p99 over bare | tini's + 2 ms | — (not measured) | {fms(lm)} / {fms(lm99)} ms |")
    co = g("stop", "coop", "agent-run", "all")
    b(f"| cooperative stop (cgroup), all gone: median / p99 | <= 3 ms median | 4.67 / 5.41 ms | {fms(co and co['median'])} / {fms(co and co['p99'])} ms |")
    st = g("stop", "stubborn", "agent-run", "all")
    ld = g("stop", "stubborn", "_load") or ["?"]
    b(f"| stubborn child: stop minus grace, p99 | within 50 ms | 94.2 ms (load 0.5-1.0) | {fms(st and st['p99'])} ms (load {ld[0]} → {ld[-1]}) |")
    before_late = {"live": "12.2", "orphan-own": "252"}
    for x in (g("watchdog", "lateness") or []):
        if x["n"] == 10000:
            ldx = x.get("load", ["?"])
            b(f"| lease lateness p99, 10,000 pending, {x['kind']} fillers | < 100 ms | {before_late.get(x['kind'], '—')} ms | {fms(x['lateness']['p99'])} ms (load {ldx[0]} → {ldx[-1]}) |")
    before_once = {1000: "9.33 ms (docs); 10 ms, 2.5 MiB", 10000: "83.5 ms (docs); 130 ms, 3.0 MiB", 100000: "1,130-1,380 ms (560 user + 600 sys), 8 MiB"}
    for n, txt in before_once.items():
        x = g("scale", "once", n)
        b(f"| `--once` over {n:,} final dirs: CPU, peak RSS | {'< 1 s, linear' if n == 100000 else ''} | {txt} | {fms(x and x['cpu_ms'])} ms, {(x['maxrss_kb'] / 1024 if x else 0):.1f} MiB |")
    before_list = {(10000, "list"): "200 ms, 47 MiB", (100000, "list"): "2,600 ms, 450 MiB"}
    for n in (10000, 100000):
        for key in ("list", "list --json", "gc (nothing old enough)"):
            x = g("scale", "list", n, key)
            if x is None:
                continue
            b(f"| `{key}` at {n:,} runs: CPU, peak RSS | | {before_list.get((n, key), '— (not measured)')} | {fms(x['cpu_ms'])} ms, {x['maxrss_kb'] / 1024:.1f} MiB |")
    lv = g("scale", "live")
    if lv:
        b(f"| {lv['n']:,} live runs: one cancel to the last final record | | — (new) | {fms(lv['cancel']['last_final_ms'])} ms |")
        b(f"| {lv['n']:,} live runs: idle daemon CPU | near zero | — (new) | {fms(lv['daemon']['idle_cpu_ms'])} ms over {lv['daemon']['idle_s']:.0f} s |")
    b("")
    return B


def launch_phases_section(a, ph):
    """Section 1, where the time of one launch goes: the phases (`AGENT_RUN_PHASES`), the time
    around `main`, the keeper's marks, each process's CPU, and what the design pays."""
    a("")
    a("Where the time of one launch goes (`AGENT_RUN_PHASES`, each phase's own time; its own loop after the interleaved one; \"fs\" is the run root's filesystem; \"tmpfs, no cgroup\" runs with `AGENT_RUN_CGROUP=off`, to show the phases the run's cgroup adds):")
    a("")
    wheres = [w for w in ("fs", "tmpfs", "tmpfs, no cgroup") if w in ph]
    names = [row[0] for row in ph[wheres[0]]["rows"]]
    for w in wheres[1:]:
        names += [row[0] for row in ph[w]["rows"] if row[0] not in names]

    def row_of(rows, name):
        row = next((x for x in rows if x[0] == name), None)
        return (row[2], row[3]) if row else None

    where_table(a, "phase", [(w, ph[w]["rows"]) for w in wheres],
                [(f"**{n}**" if n == "total" else f"`{n}`", lambda rows, n=n: row_of(rows, n)) for n in names])
    outs = [(w, ph[w].get("outside")) for w in wheres if ph[w].get("outside")]
    if outs:
        a("")
        a("Around `main` (the harness notes CLOCK_MONOTONIC at its `posix_spawn` and after its `waitpid`; the line gives the clock at `main`'s entry): \"before main\" is the harness's spawn, the exec of the static binary and the C library's start; \"after exit\" is the exit of the wrapper's process (its teardown) until the harness's wait returns:")
        a("")
        spans = (("before_main", "before main"), ("main", "main (the phases above)"), ("after_exit", "after exit"), ("wall", "**wall**"))
        where_table(a, "span", outs, [(label, lambda o, k=k: o.get(k)) for k, label in spans])
    ks = [(w, ph[w].get("keeper")) for w in wheres if ph[w].get("keeper")]
    if ks:
        a("")
        a("The keeper's own line: its marks on the wrapper's clock, µs since the wrapper's `main`. It is forked in `keeper`, after the spawn. The marks are forked; go (the workload has exec'd and is recorded running: the keeper waits for that before its own start, so those steps never wait behind it for a CPU); ready (sources and journal set up); EOF (the workload's last writer gone); exit (logs synced, output.json written):")
        a("")
        where_table(a, "keeper mark", ks, [(f"`{n}`", lambda rows, n=n: row_of(rows, n)) for n in [row[0] for row in ks[0][1]]])
    cs = [(w, ph[w].get("cpu")) for w in wheres if ph[w].get("cpu")]
    if cs:
        a("")
        a("Each process's own CPU, at its exit (getrusage: user + system µs; the kernel's split of the two is by ticks, so only the sum is exact; and its minor page faults). Two cores run three processes at a launch (the wrapper, the keeper, the workload), so the CPU of each is time the others may wait for:")
        a("")

        def field_of(fields, role, k):
            f = {name: (m, p99) for name, _, m, p99 in fields.get(role, [])}
            return f.get(k)

        where_table(a, "process", cs, [
            ("wrapper: CPU µs", lambda c: field_of(c, "wrapper", "cpu_us")),
            ("wrapper: minor faults", lambda c: field_of(c, "wrapper", "minflt")),
            ("keeper: CPU µs", lambda c: field_of(c, "keeper", "cpu_us")),
            ("keeper: minor faults", lambda c: field_of(c, "keeper", "minflt")),
        ])
    a("")
    paras(
        a,
        "The ext4 rows also move with the filesystem's recent deletions. This machine's root has no journal. There, at every file creation, ext4's inode allocator skips every inode deleted in the last 60 s (360 s while its inode table block is dirty), reading each one's on-disk copy. After a bulk delete (a test suite's run roots, the scale scenario's 100,000 dirs) a file creation took 1.1 ms here instead of 0.02 ms, for minutes. The disk probe above shows the state this scenario met.",
        "What a launch must pay by the contract: the starting record before the spawn, pid == pgid == sid verified, the keeper (every byte kept), and the final record durable before exit. `final_record` is one fsync of status.json after it is exchanged into place, on the ext4 driver. On this machine's root, ext4 without a journal mounted `discard`, that fsync is a device flush.",
        "What the design adds above that floor, each in the table:",
    )
    a("- the run's cgroup: `cgroup_parent` reads /proc/self/mountinfo, ~60 µs in a fresh process here because the kernel formats every mount for it; `cgroup` and `cgroup_rm` make and remove it, the kernel making and removing its ~20 interface files;")
    a("- the keeper's fork (`keeper`), right after the spawn, so the copy of the wrapper's page tables runs beside the workload's exec; its logs are opened before the spawn, in `keeper_prep`;")
    a("- the records and the journal;")
    a("- the scan for leftovers at the leader's exit (`leftovers`): the pids handed out since the leader, one by one when they are few, for a process that left the run's cgroup and tree; pidfd_open(2) says which of them lead a thread group, one syscall per pid;")
    a("- the parse of `start`'s options.")
    a("")
    a("Costs removed earlier, each measured side by side:")
    a("")
    a("- The keeper's start raced the workload's exec and the `running` record for a CPU. The keeper now waits for both: ~0.2 ms of the median, more of the p99.")
    a("- musl's opendir for the listings at the leader's exit mapped a page per listing and unmapped it at closedir: ~20 µs here.")
    a("- The keeper's three 1 MiB buffers were mapped at its start and unmapped at its exit. Now they are mapped at their first use, and a keeper that only splices under its cap maps none: ~80 µs of the keeper's CPU, which the wrapper's final record waits for.")
    a("- The workload's clone child and the keeper reset all 64 signal actions. Now they reset only those not at their default, read once from /proc/self/status for both: ~60 syscalls fewer while the wrapper waits for the exec.")
    a("- A descriptor per caught signal: one wake-up descriptor now serves every handler, 12 syscalls fewer.")
    a("- A second read of the cgroup's members at the leader's exit, when the cgroup had just said it was empty.")
    a("- The rename over the old record cost a synchronous block allocation and, on a `discard` mount, a discard: ~4 ms a record here. Now it is an exchange and an unlink.")
    a("- The second flush of the final record: the dir's fsync, where the file's fsync carries the rename.")
    a("- The listing of /proc at the leader's exit.")
    a("- The heartbeat's thread for a run over within 250 ms. It starts at 250 ms, if the run lasts (`threads`).")
    a("- The wait for the keeper's teardown before the final record. The record goes out at the EOF of the keeper's done pipe, once output.json is in place, and the keeper's exit runs beside it: `keeper_wait` 83 -> 2 µs, the launch 27 µs shorter on tmpfs and 60 µs on ext4, interleaved. `keeper_exit` is the wait for that exit after the record.")
    a("- The read of /proc/PID/status for each pid that scan probes, to skip threads. pidfd_open refuses a pid that does not lead its thread group: `leftovers` 111 -> 85 µs median on tmpfs, interleaved, 1,000 launches each.")
    a("")
    a("Tried and left out, measured side by side:")
    a("")
    a("- a non-PIE binary (no relocations at start: under 0.02 ms);")
    a("- opt-level 2 or 3 instead of `s` (no faster, 0.4 MB larger);")
    a("- reading /proc/self/mountinfo into a 16 KiB stack buffer (slower: four fresh stack pages to fault in);")
    a("- a thread started at `main`'s entry to read /proc/self/mountinfo and /proc/self/cgroup beside the argument parse. It was worse by 0.12 ms, interleaved: the thread's stack, its start and its own faults cost more than the ~50 µs it could overlap (`parse` 50 -> 106 µs, `cgroup_parent` 147 -> 194 µs);")
    a("- reading the workload's /proc/PID/stat before the keeper's fork instead of after it. No change: the fork itself, ~0.1 ms, is the wrapper's page tables and fds, and it runs while the workload execs.")


def launch_section(a, r, ctx, peers, summ):
    """Section 1: the launch overhead of `true` through each wrapper, and where its time goes."""
    paras(
        a,
        "## 1. Launch overhead: `true` through each wrapper",
        "Wall time from `posix_spawn` to `waitpid` returning, stdio on /dev/null. agent-run runs with `--quiet` and a fresh run id each time (it creates the run dir, writes three records, fsyncs the final one); the streaming row runs it without `--quiet`, as `ssh host agent-run ID -- cmd` does (its streaming thread copies the logs to stdout).",
    )
    a("Every wrapper is measured in the same rounds, one launch each per round (interleaved), so a load spike hits them alike. agent-run runs three times per round: with its root on the run root's filesystem (quiet and streaming), and on a tmpfs (/dev/shm), where its fsyncs and file creations cost next to nothing.")
    dp = r.get("disk_probe") or {}
    if dp.get("create_us") is not None:
        a("")
        a(f"The run root's disk just before this scenario: a file creation took {fms(dp['create_us'] / 1000, 3)} ms (median), and {fms((dp.get('create_fsync_us') or 0) / 1000, 3)} ms with an fsync after each directory's three files, as back-to-back launches do. A launch creates about ten files: on this VM both have ranged from under 0.05 ms to 1.1 ms between runs of the same binary (the host's disk after a build or a GiB of logs), and the ext4 rows move with it.")
    a("")
    table_head(a, "| wrapper | n | median ms | p90 ms | p99 ms | over bare: median / p99 | target |")
    rows = [(p.name, p.label) for p in peers] + [("agent-run-stream", "agent-run, streaming (no `--quiet`)"), ("agent-run-tmpfs", "agent-run, root on tmpfs"), ("agent-run-tmpfs-nocg", "agent-run, root on tmpfs, `AGENT_RUN_CGROUP=off` (no run cgroup: not a target, the price of the containment)")]
    for name, label, x in measured(a, r, rows, "| {label} | — | {why} | | | | |"):
        tgt = TARGETS["launch"] if name.startswith("agent-run") and not name.endswith("-nocg") else ""
        over = "—" if name == "bare" else f"{fms(x['over_bare'])} / {fms(x.get('p99_over_bare'))}"
        a(f"| {label} | {x['n']} | {fms(x['median'])} | {fms(x['p90'])} | {fms(x['p99'])} | {over} | {tgt} |")
    cg, nocg = r.get("agent-run-tmpfs", {}), r.get("agent-run-tmpfs-nocg", {})
    if "median" in cg and "median" in nocg:
        a("")
        a(f"The run's cgroup, side by side on tmpfs: it costs {fms(cg['median'] - nocg['median'])} ms of the median and {fms(cg['p99'] - nocg['p99'])} ms of the p99 (the row without it runs in the procfs mode, which the contract keeps for hosts without a usable cgroup2). Its parts are in the phase table below. They are: finding the cgroup2 mount (/proc/self/mountinfo: the kernel formats every mount, ~60 µs in a fresh process here) and the wrapper's own cgroup; making and removing the directory; the clone into it (a css_set made for the new cgroup, linked to each of this hybrid host's ten hierarchies) and the workload's exit from it. The last part is reading its cpu.stat for the record. The kernel also frees what the cgroup used later, in its own threads (RCU callbacks and workqueues), which may be part of the p99's difference (not measured apart). This is the [containment] design's price, and tini pays none of it.")
    nz = r.get("noise")
    if nz:
        a("")
        a(f"This machine's own noise, measured just before the scenario: a busy loop pinned to each of its {nz['cpus']} CPUs for {nz['secs']:g} s saw {nz['gaps_over_0_5ms_per_cpu_s']:.1f} gaps over 0.5 ms and {nz['gaps_over_1ms_per_cpu_s']:.1f} over 1 ms per CPU-second (the longest {fms(nz['max_gap_ms'])} ms): the CPU taken away by the host or by the guest kernel's own threads. A launch that meets one is one of the slowest. How often that happens grows with the launch's length and with the number of processes it waits for (agent-run: the wrapper, the workload, the keeper). So the p99s above measure this noise as much as the wrapper. At ~2 gaps over 1 ms per CPU-second, a 2.3 ms launch that keeps both CPUs busy meets one about once in 100-150 launches: the p99's neighbourhood.")
    a("")
    a("How to time a launch: `AGENT_RUN_PHASES=/abs/file agent-run ID -- true` makes the wrapper append, at its exit, one JSON line to that file with the time at the end of each launch phase (microseconds from `main`'s entry: `parse`, `root`, `run_dir`, `lock`, ... `spawn`, `verify`, `running_record`, ... `final_record`, `exit`). The line also carries `zero_monotonic_us`, CLOCK_MONOTONIC at `main`'s entry, so a harness that notes the same clock around its spawn and wait sees the time before `main` and after the exit; the keeper, forked from the wrapper, appends a line of its own (`\"role\": \"keeper\"`) on the same clock. `python3 bench/phases.py /abs/file` prints the median and p99 of each phase's own time over all the lines (`--markdown` for a table), then the keeper's marks. Unset, the variable costs one getenv; it is never passed to the workload. For syscall counts of one launch: `strace -f -c -o /tmp/s agent-run --root /tmp/r ID -- true`.")
    ph = r.get("phases") or {}
    if ph:
        launch_phases_section(a, ph)
    ti = r.get("tini", {})
    for name, where in (("agent-run", "run root's fs"), ("agent-run-stream", "run root's fs, streaming"), ("agent-run-tmpfs", "tmpfs")):
        x = r.get(name, {})
        if "over_bare" not in x:
            continue
        if "over_bare" in ti:
            ok_med = x["over_bare"] <= ti["over_bare"] + 2.0
            ok_99 = x["p99_over_bare"] <= ti["p99_over_bare"] + 2.0
            ok = True if ok_med and ok_99 else ("meets at the median; **p99 misses**" if ok_med else False)
            got = f"{fms(x['over_bare'])} / {fms(x['p99_over_bare'])} ms (tini {fms(ti['over_bare'])} / {fms(ti['p99_over_bare'])})"
        else:
            ok, got = None, f"{fms(x['over_bare'])} ms (no tini to compare)"
        summ.append((f"launch overhead over bare, median / p99 ({where})", TARGETS["launch"], got, ok))
    a("")


def stop_section(a, r, ctx, peers, summ):
    """Section 2: stop latency, TERM to the wrapper until no process of the tree is left."""
    a("## 2. Stop latency: TERM to the wrapper until no process of the tree is left")
    a("")
    a(f"TERM goes to the wrapper (for bare and `setsid`, which exec, to the workload itself). \"all gone\" is the time until every process of the tree seen before the signal has exited and the wrapper has exited (pidfd + poll on each); agent-run writes its final record before it exits, so this includes the record. \"record\" is agent-run's `ended_at` minus the signal time (1 ms resolution; `ended_at` is stamped just before the final record is written and fsynced). When processes are still alive at the cap ({ctx.n(1.5, 0.5):g} s for (a) and (d), grace + {ctx.n(1.0, 0.5):g} s for (b), grace + {ctx.n(1.5, 0.5):g} s for (c)), the cell says what survived and the trial is not repeated beyond "
      f"{ctx.n(3, 1)}. Survivors are killed by pid afterwards. agent-run runs with `--grace {ctx.grace_s:g}s` (HUP step at the default 500 ms); `timeout` with `-k {ctx.grace_s:g}s`, its strongest setting (it escalates only while its own child lives, and exits with it); `tini -g` forwards the signal to the child's group and waits for the child.")
    a("")
    for scen in STOP_SCENARIOS:
        rr = r.get(scen["key"])
        if rr is None:
            continue
        paras(
            a,
            f"### {scen['title']}",
            f"`{shlex.join(scen['cmd'])}`",
        )
        table_head(a, "| wrapper | trials | all gone: median / p90 / p99 ms | record (ended_at) median / p99 ms | outcome |")
        for p in peers:
            x = rr[p.name]
            if "skip" in x:
                a(f"| {p.label} | — | {x['skip']} | | |")
                continue
            allc = "—"
            if "all" in x:
                s = x["all"]
                allc = f"{fms(s['median'])} / {fms(s['p90'])} / {fms(s['p99'])}"
            rec = f"{fms(x['record']['median'])} / {fms(x['record']['p99'])}" if "record" in x else ""
            if x.get("survivors"):
                w = x.get("wrapper_ms")
                if x.get("execs"):
                    wtxt = "no wrapper process"
                elif w and x["wrapper_exited"] == x["survived_trials"]:
                    wtxt = f"the wrapper exited after {fms(w['median'])} ms, leaving them"
                else:
                    wtxt = "the wrapper was still waiting at the cap"
                what = ", ".join(x["survivors"])
                outcome = f"**survives**: {what} ({x['survived_trials']}/{x['trials']} trials); {wtxt}"
            else:
                outcome = "all gone" + (f"; {', '.join(x['states'])}" if x.get("states") else "")
            a(f"| {p.label} | {x['trials']} | {allc} | {rec} | {outcome} |")
        if rr.get("_load"):
            a("")
            a(f"Load average over this scenario: {rr['_load'][0]} at the start, {rr['_load'][-1]} at the end.")
        x = rr.get("agent-run", {})
        if "skip" not in x:
            key = scen["key"]
            if key == "coop":
                val = x.get("all", {}).get("median")
                summ.append(("cooperative stop to final record (median / p99)", TARGETS["stop_coop"], f"{fms(val)} / {fms(x.get('all', {}).get('p99'))} ms", stop_verdict(x, 20)))
            elif key == "shell":
                val = x.get("all", {}).get("median")
                summ.append(("interactive shell stop (median / p99)", TARGETS["stop_shell"], f"{fms(val)} / {fms(x.get('all', {}).get('p99'))} ms", stop_verdict(x, 50)))
            elif key == "stubborn":
                val = x.get("all", {}).get("median")
                ld = rr.get("_load", ["?", "?"])
                summ.append(("stubborn child: stop minus grace (median / p99)", TARGETS["stop_stubborn"], f"{fms(val)} / {fms(x.get('all', {}).get('p99'))} ms (load {ld[0]} → {ld[-1]})", stop_verdict(x, 50)))
            else:
                summ.append(("setsid escapee", TARGETS["stop_escapee"], "survivors" if x.get("survivors") else f"all gone, {fms(x.get('all', {}).get('median'))} ms", not x.get("survivors")))
        a("")


def footprint_section(a, r, ctx, peers, summ):
    """Section 3: the wrapper's own memory and CPU while a `sleep` runs."""
    d = r["_dur"]
    paras(
        a,
        f"## 3. The wrapper's own footprint while `sleep {d:g}` runs",
        f"Peak RSS is VmHWM of the wrapper process itself (not its children), sampled 0.25 s before the workload ends; CPU is the wrapper's own (all threads, from /proc/PID/task/*/schedstat): total over its life so far, and the steady state after its first 0.5 s. All wrappers ran side by side, {r['agent-run']['rounds']} rounds; medians. bare and `setsid` exec the workload: there is no wrapper process, the figures are `sleep`'s own. File-backed pages (the binary's text, libc) are shared with every other process mapping the same files; anonymous pages are the wrapper's own.",
    )
    table_head(a, "| wrapper | peak RSS (VmHWM) | of which anon / file-backed (at the sample) | threads | CPU total ms | steady-state CPU ms (per s) | target |")
    keys = [p.name for p in peers] + ["agent-run (streaming)"]
    labels = {p.name: p.label for p in peers}
    labels["agent-run (streaming)"] = "agent-run, streaming (no `--quiet`)"
    for k, label, x in measured(a, r, [(k, labels[k]) for k in keys], "| {label} | {why} | | | | | |"):
        note = " (`sleep` itself)" if x["execs"] else ""
        tgt = TARGETS["rss"] if k.startswith("agent-run") else ""
        per_s = x["steady_cpu_ms"] / x["steady_s"] if x["steady_s"] > 0 else 0
        a(f"| {label} | {x['hwm_kb'] / 1024:.2f} MiB{note} | {x['anon_kb'] / 1024:.2f} / {x['file_kb'] / 1024:.2f} MiB | {x['threads']} | {fms(x['cpu_ms'])} | {fms(x['steady_cpu_ms'])} ({per_s:.3f}) | {tgt} |")
    x = r["agent-run"]
    summ.append(("wrapper peak RSS (`--quiet`)", TARGETS["rss"], f"{x['hwm_kb'] / 1024:.2f} MiB", x["hwm_kb"] < 2048))
    x = r.get("agent-run (streaming)")
    if x and "skip" not in x:
        summ.append(("wrapper peak RSS (streaming)", TARGETS["rss"], f"{x['hwm_kb'] / 1024:.2f} MiB", x["hwm_kb"] < 2048))
    a("")


def output_section(a, r, ctx, peers, summ):
    """Section 4: output throughput and first-byte latency."""
    size = r["size"]
    paras(
        a,
        f"## 4. Output: {size // MiB} MiB written by the workload (`head -c {size} /dev/zero`)",
        "Throughput from spawn until the harness has read EOF on the pipe and reaped the wrapper (GB/s = 10^9 bytes/s, median of the runs; min in brackets). agent-run runs without `--quiet`: the workload writes a pipe, the output keeper splices it into stdout.log, and the wrapper sends the log to its stdout, a pipe the harness drains. \"every byte once\" checks the byte count read from the pipe, and for agent-run also the size of stdout.log. Every measurement starts after `sync`, in rotating order. agent-run's log goes to disk and is fsynced before the run's counts appear (docs/contract.md, output.json), all inside the measured time. The disk reference (the same workload writing a file on the same filesystem, no pipe, no fsync) and the disk's own write speed bound it. `cat` and the disk reference pay no fsync.",
    )
    table_head(a, "| path | runs | GB/s (min) | % of cat | % of the disk reference | every byte once | target |")
    rows = r["rows"]
    cat = rows.get("cat FILE -> pipe", {}).get("gbps")
    ref = rows.get("ref: workload -> file (disk)", {}).get("gbps")
    order = ["cat FILE -> pipe", "ref: workload -> file (disk)"] + [p.name for p in peers if p.name != "agent-run"] + ["agent-run (log + stream)"]
    labels = {p.name: f"{p.label} (workload writes the pipe)" for p in peers}
    labels["cat FILE -> pipe"] = "`cat` of the same bytes (a file in page cache) -> pipe"
    labels["ref: workload -> file (disk)"] = "reference: workload -> a file on this disk, no pipe"
    labels["agent-run (log + stream)"] = "agent-run: workload -> stdout.log, wrapper -> pipe"
    for k, label, x in measured(a, rows, [(k, labels.get(k, k)) for k in order], "| {label} | — | {why} | | | | |"):
        once = "yes" if x["all_bytes"] else "**no**"
        if x["log_ok"] is not None:
            once += ", log " + ("complete" if x["log_ok"] else "**wrong size**")
        pc = f"{100 * x['gbps'] / cat:.0f}%" if cat and not k.startswith("ref") else ""
        pr = f"{100 * x['gbps'] / ref:.0f}%" if ref and k.startswith("agent-run") else ""
        tgt = TARGETS["stream"] if k.startswith("agent-run") else ""
        a(f"| {label} | {x['runs']} | {x['gbps']:.2f} ({x['gbps_min']:.2f}) | {pc} | {pr} | {once} | {tgt} |")
    x = rows.get("agent-run (log + stream)")
    if x and cat:
        ok = x["gbps"] >= 1.0 and x["gbps"] >= 0.8 * cat and x["all_bytes"] and x["log_ok"]
        floor = f" (1 GB/s is above what `cat` itself reaches here, {cat:.2f} GB/s, and the disk reference, {ref:.2f})" if ref and x["gbps"] < 1.0 and max(cat, ref) < 1.0 else ""
        summ.append(("streaming throughput", TARGETS["stream"], f"{x['gbps']:.2f} GB/s, {100 * x['gbps'] / cat:.0f}% of cat; every byte once: {'yes' if x['all_bytes'] and x['log_ok'] else 'NO'}{floor}", ok))
    fb = r.get("first_byte")
    if fb:
        a("")
        a("First-byte latency (spawn until the first line `echo ready` reaches the harness; `sh -c 'echo ready; sleep 0.3'`):")
        a("")
        table_head(a, "| wrapper | n | median ms | p90 ms | p99 ms |")
        for p in peers:
            x = fb.get(p.name)
            if x:
                a(f"| {p.label} | {x['n']} | {fms(x['median'])} | {fms(x['p90'])} | {fms(x['p99'])} |")
    a("")


def lateness_cells(x):
    """The four lateness cells of a lease row (lateness and burst tables alike): final seen,
    the watchdog's first act, act to stop_end, stop_end to final seen."""
    s, sa = x["lateness"], x["act_lateness"]
    s1, s2 = x.get("act_to_stop_end", {}), x.get("stop_end_to_final", {})
    return f"{fms(s['median'])} / {fms(s['p99'])} / {fms(s['max'])} | {fms(sa['median'])} / {fms(sa['p99'])} | {fms(s1.get('median'))} / {fms(s1.get('max'))} | {fms(s2.get('median'))} / {fms(s2.get('max'))}"


def lateness_ok(x):
    """Whether a lease row meets its target: p99 under 100 ms, every run final, no bad state
    (None without a p99)."""
    p99 = x["lateness"]["p99"]
    return None if p99 is None else (p99 < 100 and x["not_final"] == 0 and not x["bad_states"])


def watchdog_section(a, r, ctx, peers, summ):
    """Section 5: the watchdog's rescan, idle CPU and lease lateness."""
    paras(
        a,
        "## 5. Watchdog",
        "Run dirs are fabricated (mode 0700, files 0600) from the schema of a status.json that agent-run itself wrote. \"final\" runs are `finished`. \"live\" pending runs are `running` with a lease a day away and a live wrapper (one stand-in for every wrapper: a process named agent-run, started before the run dirs, holding each run dir's flock, as the watchdog verifies a wrapper): the watchdog pins the wrapper and holds the run until its lease + grace + slack. \"orphan\" pending runs are `running` with a lease a day away, a dead wrapper and a live process (one shared session leader): the watchdog owns them and holds them until the lease expires.",
    )
    rs = r.get("rescan", {})
    if rs:
        paras(
            a,
            "### One full rescan: `agent-run-watchdog --once`",
            "CPU is user + sys of the process from `wait4` rusage (median of the repeats; the 10,000 pending rows ran once).",
        )
        table_head(a, "| run dirs | CPU ms | wall ms | target |")
        for k, x in rs.items():
            tgt = TARGETS["rescan"] if k == "final 10000" else ""
            a(f"| {k} | {fms(x['cpu_ms'])} | {fms(x['wall_ms'])} | {tgt} |")
        x = rs.get("final 10000")
        if x:
            summ.append(("rescan of 10,000 final run dirs (CPU)", TARGETS["rescan"], f"{fms(x['cpu_ms'])} ms", x["cpu_ms"] < 100))
        a("")
    idle = r.get("idle", {})
    if idle:
        a("### The daemon idle over final runs (default `--scan-interval 30s`)")
        a("")
        table_head(a, "| final runs | startup to READY=1 | startup CPU ms | CPU while idle | over | per hour (extrapolated) | peak RSS |")
        for n, x in idle.items():
            per_h = x["cpu_ms"] / x["secs"] * 3600
            a(f"| {int(n):,} | {x['ready_s'] * 1000:.0f} ms | {fms(x['startup_cpu_ms'])} | {fms(x['cpu_ms'])} ms | {x['secs']:.0f} s | {per_h / 1000:.2f} s | {(x['hwm_kb'] or 0) / 1024:.1f} MiB |")
        k1 = idle.get(1000) or idle.get("1000")
        if k1:
            summ.append(("daemon CPU while idle, 1,000 final runs", TARGETS["idle"], f"{fms(k1['cpu_ms'])} ms over {k1['secs']:.0f} s", k1["cpu_ms"] / k1["secs"] < 1.0))
        a("")
    lat = r.get("lateness", [])
    if lat:
        paras(
            a,
            "### Lease lateness",
            "K orphaned runs, each with its own live process (a `sleep` in its own session carrying the run's `AGENT_RUN_ID` and `AGENT_RUN_DIR`), get leases expiring at staggered deadlines after the daemon's READY=1, while N − K other runs have leases pending a day away. Lateness (\"final\") = the moment the harness sees the final record in status.json (it stats the runs past their deadline every millisecond) minus the lease deadline; \"act\" = the watchdog's first journal line for the run minus the deadline; then the stop (act → the journal's stop_end) and the final record (stop_end → seen; includes the fsync). Journal times have 1 ms resolution. Default `--scan-interval 30s`: a window longer than 30 s includes one periodic full rescan.",
        )
        table_head(a, "| pending leases (N) | fillers | K, spacing, window | startup to READY | startup CPU | final: p50 / p99 / max ms | act: p50 / p99 ms | act → stop_end p50 / max ms | stop_end → final seen p50 / max ms | not final | CPU during window | peak RSS | load average (start → end) |")
        for x in lat:
            bad = f" ({', '.join(x['bad_states'])})" if x["bad_states"] else ""
            if x.get("not_final") and x.get("pending_states"):
                bad += f" (at the end: {', '.join(x['pending_states'])})"
            a(f"| {x['n']:,} | {x['kind']} | {x['k']}, {x['spacing_s']:g} s, {x['window_s']:.0f} s | {x['ready_s'] * 1000:.0f} ms | {fms(x['ready_cpu_ms'])} ms | {lateness_cells(x)} | {x['not_final']}{bad} | {fms(x['run_cpu_ms'])} ms | {(x['hwm_kb'] or 0) / 1024:.1f} MiB | {' → '.join(x.get('load', ['?']))} |")
        a("")
        a("Design of the fixture: the K measured runs are orphans, each with its own live process carrying the run's marker (AGENT_RUN_ID and AGENT_RUN_DIR: the watchdog takes a process for an orphaned run's only by both). They are present with leases a day away before the daemon starts. After READY=1 each gets its staggered deadline through a lease.json renamed into place, as `agent-run renew` writes it. The N − K fillers are \"live\" or \"orphan-own\". A live filler's record names one stand-in as its wrapper, a process named agent-run that holds every filler's lock: the watchdog takes it for their live wrapper and holds their runs. (Until 12-06 the stand-in was a plain `sleep`, which the watchdog rightly took for no wrapper: it stopped all 10,000 fillers during the measured window, and that row measured their stops.) \"orphan-own\" is the literal load: every filler an orphan with its own marked process, held by the watchdog until a lease a day away. An earlier \"orphan\" kind, whose fillers shared one session leader, is gone: a shared process is no filler's by the trust rules, so those runs were settled at once, and its figures measured that, not pending leases.")
        own = [x for x in lat if x["kind"] == "orphan-own" and x.get("pid_max")]
        if own:
            x = own[-1]
            a("")
            window = (x['pid_max'] - 300 - x['tasks']) / 100000
            a(f"How the orphan-own row stays on target: a watchdog stop of an orphan held by scanning alone looks at /proc again and again. It looks first, at each deadline, once every member is gone, and a second empty time, which procfs mode needs to call a stop done, since a fork racing a scan can hide from one look. One look of every pid reads the stat of all {x['tasks']:,} processes (tens of µs each here). A look may skip the older pids only while the pid counter cannot have come around since the look they were read in. By time alone (`procfs::no_wrap_within`: the free pids at 100,000 forks a second; safety CS-78, R-23) that is {window * 1000:.0f} ms with kernel.pid_max = {x['pid_max']:,} and {x['tasks']:,} tasks, shorter than one look of such a table. So before the change every look of every stop read the whole table (p99 1,573 ms). The watchdog now follows the counter (`pid_counter`, safety CS-82): it reads `ns_last_pid` at a quarter of that bound, so the chain of readings says how far the counter moved. While that is short of a whole cycle, a stop's first look is the last look of every pid for the older pids plus a fresh read of the pids handed out since. Its later looks read only those. The act → stop_end time above is then the stop itself: TERM, the pidfd wake-up at the exit, and the looks that call the run empty (at most one every 25 ms while stops overlap). A run held in a cgroup needs no look at all to know it is empty (`cgroup.events`).")
        top = max(x["n"] for x in lat)
        big = [x for x in lat if x["n"] == top]
        for x in big:
            p99 = x["lateness"]["p99"]
            ok = lateness_ok(x)
            if ok is False and x["lateness"]["median"] is not None and x["lateness"]["median"] < 100 and x["not_final"] == 0:
                ok = "meets at the median; **p99 misses**"
            ld = x.get("load", ["?", "?"])
            summ.append((f"lease lateness p99, {x['n']:,} pending ({x['kind']} fillers)", TARGETS["lateness"], f"{fms(p99)} ms" + (f", {x['not_final']} not final" if x["not_final"] else "") + f" (load {ld[0]} → {ld[-1]})", ok))
        a("")

    burst = r.get("burst", [])
    if burst:
        paras(
            a,
            "### Orphaned runs whose leases end in one second",
            "N detached runs of agent-run itself (`sleep`, which dies on TERM), a watchdog daemon running. Every wrapper is SIGKILLed; then each run's lease.json is renamed into place with a deadline spread over one second (without its wrapper a run's lease only ever comes earlier). Lateness as above: the final record seen minus the deadline. \"cgroup\": each run in a cgroup of its own (as root); \"procfs\": `--cgroup off`, held by /proc scans alone (final state `unknown`, reason `unprovable`).",
        )
        table_head(a, "| runs | held by | final: p50 / p99 / max ms | act: p50 / p99 ms | act → stop_end p50 / max ms | stop_end → final seen p50 / max ms | not final | final states | watchdog CPU | load average (start → end) |")
        for x in burst:
            a(f"| {x['n']} | {x['mode']} | {lateness_cells(x)} | {x['not_final']} | {', '.join(x['states'])} | {fms(x['cpu_ms'])} ms | {x.get('load_start')} → {x.get('load')} |")
            p99 = x["lateness"]["p99"]
            summ.append((f"{x['n']} orphaned runs ({x['mode']}), leases ending in one second: lateness p99", TARGETS["burst"], f"{fms(p99)} ms" + (f", {x['not_final']} not final" if x["not_final"] else ""), lateness_ok(x)))
        a("")


def cancel_section(a, x, ctx, peers, summ):
    """Section 6: the `agent-run cancel` round trip."""
    paras(
        a,
        "## 6. `agent-run cancel` round trip",
        "A detached cooperative run (`agent-run -d ID -- bash -c '<cooperative tree>'`), then `agent-run cancel ID` timed from spawn to exit (it returns once the final record is written).",
    )
    table_head(a, "| step | n | median ms | p90 ms | p99 ms |")
    a(f"| `agent-run -d` until it returns (run is `running`) | {x['detach']['n']} | {fms(x['detach']['median'])} | {fms(x['detach']['p90'])} | {fms(x['detach']['p99'])} |")
    a(f"| `agent-run cancel` round trip | {x['cancel']['n']} | {fms(x['cancel']['median'])} | {fms(x['cancel']['p90'])} | {fms(x['cancel']['p99'])} |")
    a("")
    a("Outcomes: " + ", ".join(f"{k} x{v}" for k, v in x["outcomes"].items()) + f"; processes of the run alive 10 ms after cancel returned: {x['left_behind']}.")
    a("")


def scale_section(a, r, ctx, peers, summ):
    """Section 7: many run dirs, and many live runs."""
    paras(
        a,
        "## 7. Scale: 1,000 / 10,000 / 100,000 run dirs, and 1,000 live runs",
        "Final run dirs are copies of one run dir agent-run wrote (`bench/fixtures.py`: status.json with the run id and cgroup name rewritten, events.jsonl, stdout.log, stderr.log, lock, pid, pgid). CPU is user + sys of the process (`wait4` rusage), peak RSS its `ru_maxrss`; every figure is a warm pass (one unmeasured pass first, which also writes the settled ledger `.watchdog.settled` that the measured `--once` passes read: an unchanged final record costs them two `statx`, not a read), median of the repeats. The warm pass comes 2.1 s after the fixture is written: the ledger takes no record changed within the last 2 s, and runs before 12-02 measured the newest records of the fixture read in full at every pass. \"growth\" is the CPU ratio to the size 10x smaller (linear: 10x).",
        "### One `agent-run-watchdog --once` pass over final run dirs",
    )
    table_head(a, "| run dirs | CPU ms (user + sys) | wall ms | peak RSS | growth per 10x | load average | target |")
    prev = None
    for n, x in sorted(r["once"].items(), key=lambda kv: int(kv[0])):
        n = int(n)
        g = f"{x['cpu_ms'] / prev[1]:.1f}x" if prev and prev[0] * 10 == n and prev[1] > 0 else "—"
        tgt = "< 1 s CPU, linear or better" if n == 100000 else ""
        a(f"| {n:,} | {fms(x['cpu_ms'])} ({fms(x['user_ms'])} + {fms(x['sys_ms'])}) | {fms(x['wall_ms'])} | {x['maxrss_kb'] / 1024:.1f} MiB | {g} | {x['load']} | {tgt} |")
        if n == 100000:
            summ.append(("`--once` pass over 100,000 final run dirs (CPU)", "< 1 s CPU, linear or better", f"{fms(x['cpu_ms'])} ms, {x['maxrss_kb'] / 1024:.1f} MiB (load {x['load']})", x["cpu_ms"] < 1000))
        prev = (n, x["cpu_ms"])
    d = r.get("daemon") or {}
    if d:
        a("")
        a(f"The daemon's first pass (startup to READY=1) over {d['n']:,} final run dirs: {d['ready_s'] * 1000:.0f} ms wall, {fms(d['cpu_ms'])} ms CPU, peak RSS {(d['hwm_kb'] or 0) / 1024:.1f} MiB.")
    a("")
    a("### `agent-run list` and `gc`")
    a("")
    table_head(a, "| run dirs | command | CPU ms (user + sys) | wall ms | peak RSS | load average |")
    for n, rows in sorted(r["list"].items(), key=lambda kv: int(kv[0])):
        for key, x in rows.items():
            a(f"| {int(n):,} | `{key}` | {fms(x['cpu_ms'])} ({fms(x['user_ms'])} + {fms(x['sys_ms'])}) | {fms(x['wall_ms'])} | {x['maxrss_kb'] / 1024:.1f} MiB | {x['load']} |")
            if int(n) == 100000 and key == "list --json":
                summ.append(("`list --json` over 100,000 final runs (wall)", "within 1.5 s wall", f"{fms(x['wall_ms'])} ms wall, {fms(x['cpu_ms'])} ms CPU (load {x['load']})", x["wall_ms"] < 1500))
    g = r.get("gc_all")
    if g:
        a(f"| {g['n']:,} | `gc --older-than 0s` (removes every run) | {fms(g['cpu_ms'])} | {fms(g['wall_ms'])} | {g['maxrss_kb'] / 1024:.1f} MiB | {g.get('load', '—')}; exit {g['code']}, {g['left']} entries left |")
        if g["n"] == 100000:
            summ.append(("`gc` removing 100,000 runs (wall)", "within 15 s wall", f"{fms(g['wall_ms'])} ms wall, {fms(g['cpu_ms'])} ms CPU (load {g.get('load', '?')}), {g['left']} left", g["wall_ms"] < 15000 and g["left"] == 0))
    lv = r.get("live") or {}
    if lv:
        n = lv["n"]
        a("")
        paras(
            a,
            f"### {n:,} concurrent live runs on this machine",
            f"`agent-run -d --lease 1h ID -- sleep 100000`, {n:,} times in a row; then the watchdog daemon on that root; then ONE `agent-run cancel ID1 ... ID{n}`. A second round of {n:,} runs with a short lease is left to expire (the wrappers enforce their own leases; the daemon watches too).",
        )
        dm = lv["daemon"]
        c = lv["cancel"]
        le = lv["lease"]
        table_head(a, "| figure | value |")
        a(f"| launch rate (`agent-run -d` in a row) | {lv['launch_rate']:.0f} runs/s ({lv['launch_s']:.1f} s for {n:,}) |")
        a(f"| wrappers alive after the launches | {lv['wrappers_alive']:,} |")
        a(f"| total RSS of the wrappers (PSS: shared pages split) | {lv['rss_total_kb'] / 1024:.0f} MiB ({lv['pss_total_kb'] / 1024:.0f} MiB PSS) |")
        a(f"| watchdog daemon: startup to READY=1 / its CPU | {dm['ready_s'] * 1000:.0f} ms / {fms(dm['startup_cpu_ms'])} ms |")
        a(f"| watchdog daemon: CPU while idle beside {n:,} live wrappers | {fms(dm['idle_cpu_ms'])} ms over {dm['idle_s']:.0f} s (load {dm['load']}) |")
        a(f"| one `cancel` of {n:,} ids: until it returned / until the last final record (`ended_at`) | {fms(c['return_ms'])} ms / {fms(c['last_final_ms'])} ms; exit {c['code']}, {c['not_final']} not final, {c['left']} processes left (load {c['load']}) |")
        s_ = le["lateness"]
        a(f"| lease expiry ({le['lease_s']} s leases): `ended_at` minus the deadline, p50 / p99 / max | {fms(s_['median'])} / {fms(s_['p99'])} / {fms(s_['max'])} ms (n = {s_['n']}); {le['not_final']} not final, {le['left']} processes left; states {', '.join(le['states'])} (load {le['load']}) |")
        a(f"| lease expiry: last deadline to the last final record | {fms(le['last_deadline_to_last_final_ms'])} ms |")
        summ.append((f"{n:,} live runs: one many-id cancel, to the last final record", "every run final, nothing left", f"{fms(c['last_final_ms'])} ms, {c['not_final']} not final, {c['left']} left", c["not_final"] == 0 and c["left"] == 0 and c["code"] == 0))
        summ.append((f"{n:,} live runs: idle watchdog CPU", TARGETS["idle"], f"{fms(dm['idle_cpu_ms'])} ms over {dm['idle_s']:.0f} s", dm["idle_cpu_ms"] / dm["idle_s"] < 10.0))
    a("")


SECTIONS = (
    ("launch", launch_section),
    ("stop", stop_section),
    ("footprint", footprint_section),
    ("output", output_section),
    ("watchdog", watchdog_section),
    ("cancel", cancel_section),
    ("scale", scale_section),
)


# What [simplify] (issue 37) removed, each measured side by side: release builds of each step,
# `agent-run --quiet ID -- /bin/true` with the root on tmpfs, every binary in the same rounds
# (interleaved, 400 rounds, two runs on 2026-12-06, load under 3). The figure is the change of
# the launch median over bare, step by step: what the mechanism bought.
SIMPLIFY_REMOVALS = (
    ("the own C `main` and runtime start (`no_main`)", "-0.01 / +0.11"),
    ("the hand parser of `start` beside clap", "+0.06 / +0.05"),
    ("the keeper's CPU-affinity choreography", "+0.04 / +0.07"),
    ("the keeper's go pipe (it starts at its fork)", "+0.16 / +0.05"),
    ("the keeper's done pipe (the record waits for its exit)", "-0.01 / +0.03"),
    ("clap's start-only parse (one parse for every subcommand)", "+0.06 / +0.05"),
    ("clone3 on a stack of its own with `asm!` (now without CLONE_VM)", "+0.10 / +0.11"),
)


# What stays for speed, with its figure measured side by side (see the section's text).
SPEED_KEPT = (
    ("the musl build's heap (dlmalloc), in the wrapper", "launch median over bare", "1.52 ms", "1.89 ms"),
    ("the same heap in the watchdog", "`--once` over 1,000 live runs, wall", "97-102 ms", "117-123 ms"),
    ("the watchdog's settled ledger", "`--once` over 100,000 final runs, CPU", "430 ms", "870 ms"),
    ("`list --json` serializes its array by a thread a CPU", "`list --json` over 100,000 final runs, wall", "1.2-1.5 s", "1.4-1.8 s"),
    ("`cancel`'s last check reads only the pids newer than the wrapper it saw alive", "`cancel` round trip, median", "4.9-6.1 ms", "5.7-6.9 ms"),
    ("that check shares its look at /proc with the other runs of the cancel", "one cancel of 1,000 live runs, wall / CPU (no watchdog beside it)", "7.3 s / 1.9 s", "12.0 s / 9.4 s"),
    ("clap makes a subcommand's arguments only when that subcommand runs (`Later`)", "the wrapper's own memory (anonymous, `--quiet`); launch median over bare on tmpfs", "188 KiB; 1.49-1.53 ms", "272 KiB; 1.58-1.62 ms"),
)


def simplify_removals(a):
    paras(
        a,
        "## Removed in [simplify] (issue 37)",
        "Each row is a mechanism whose only purpose was speed, and what removing it cost the launch median over bare, in ms, in two runs. Each was under the bar of 0.2 ms a launch, so it went. Together they cost about 0.4 ms: 1.64-1.80 ms over bare before, 2.03-2.17 ms after, against a target of tini's overhead + 2 ms. The symbol-ordering link is not in this table: it changed the static build's page faults, not its launch. Without it a wrapper maps nearly all of its binary's text, so its peak RSS rose from 0.95 MiB (71cf49c) to about 1.9 MiB. Those pages are the binary's, shared by every wrapper on the host: 1,000 live wrappers hold 137 MiB of PSS (shared pages split among them) where 71cf49c's held 169 MiB, measured side by side. The watchdog's hand JSON tokenizer went too: a `--once` pass over 100,000 final runs took 430 ms of CPU before and after.",
    )
    a("| removed | launch median over bare, run 1 / run 2 (ms) |")
    a("|---|---|")
    for what, delta in SIMPLIFY_REMOVALS:
        a(f"| {what} | {delta} |")
    a("")
    paras(
        a,
        "### Kept for speed",
        "Each mechanism below buys more than the bar (0.2 ms of a launch, or 10% of the figure it serves), measured side by side on the static musl build. The ordinary path got faster too: a sweep over many runs reads each record through a peek that borrows the few fields it needs (shared/src/peek.rs), where it parsed the whole record.",
    )
    a("| kept | the figure it serves | with it | without it |")
    a("|---|---|---|---|")
    for row in SPEED_KEPT:
        a("| " + " | ".join(row) + " |")
    a("")


def render(ctx, peers, command, started, elapsed):
    R = ctx.results
    m = machine(ctx.tmp)
    v = ctx.versions or versions()
    L = []
    a = L.append
    mode = "quick (CI size)" if ctx.quick else "full"
    paras(
        a,
        "# agent-run benchmarks",
        f"Generated by `bench/bench.py` ({mode} mode) on {started} in {elapsed / 60:.1f} min. Do not edit by hand: re-run the command below.",
    )
    a("```")
    a(command)
    a("```")
    a("")
    a(f"- Machine: Linux {m['kernel']}, {m['nproc']} CPUs ({m['cpu']}), {m['memory']} RAM; load average {ctx.load_start} at the start, {m['load']} at the end")
    cs, ct = ctx.create_scratch, ctx.create_tmp
    a(f"- Run roots and scratch files: a temp dir in $HOME ({m['tmp_fs']}), the filesystem of the default run root. Creating a file in a new directory there takes {fms(cs and cs / 1000, 3)} ms (median; {fms(ct and ct / 1000, 3)} ms in {tempfile.gettempdir()}): a launch creates about ten.")
    a("- Versions: " + "; ".join(f"{k}: {val}" for k, val in v.items()))
    a("- Percentiles interpolate linearly; *n* is the number of runs behind each figure. Times are wall-clock from `perf_counter_ns` unless said otherwise.")
    a("")
    header_end = len(L)
    summ = []  # (figure, target, measured, ok)

    for name, section in SECTIONS:
        if name in R:
            section(a, R[name], ctx, peers, summ)
    simplify_removals(a)

    if ctx.errors:
        a("## Harness errors")
        a("")
        for e in ctx.errors:
            a(f"- {e}")
        a("")

    L[header_end:header_end] = before_after(R)

    # summary at the top
    S = ["## Targets", "", "| figure | target | measured | |", "|---|---|---|---|"]
    for fig, tgt, meas, ok in summ:
        S.append(f"| {fig} | {tgt} | {meas} | {verdict(ok)} |")
    S.append("")
    return "\n".join(L[:header_end] + S + L[header_end:]) + "\n"


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------

SCENARIOS = ["launch", "stop", "footprint", "output", "watchdog", "cancel", "scale"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="CI size: fewer iterations, smaller workloads (under 60 s; CI runs it)")
    ap.add_argument("--out", help="where to write the markdown (full default: docs/benchmarks.md; quick default: a temp file)")
    ap.add_argument("--json", help="also write the raw results as JSON here")
    ap.add_argument("--only", help=f"comma-separated subset of: {','.join(SCENARIOS)}")
    ap.add_argument("--no-build", action="store_true", help="do not run cargo build; use the binaries in target/release (or --bin-dir)")
    ap.add_argument("--bin-dir", help="directory holding agent-run and agent-run-watchdog")
    ap.add_argument("--tmpdir", help="where run roots and scratch files go (default: $TMPDIR or /tmp)")
    ap.add_argument("--merge", metavar="JSON", help="start from the results of an earlier full run (its --json file): the scenarios of --only are measured again and replace theirs, and the whole report is written (the header names both runs)")
    ap.add_argument("--before-after", metavar="JSON", help="print the before/after table of issue 17 from a --json file of a full run, and exit")
    args = ap.parse_args(argv)
    if args.before_after:
        print("\n".join(before_after(json.loads(Path(args.before_after).read_text()))))
        return 0
    only = SCENARIOS if not args.only else [s.strip() for s in args.only.split(",")]
    for s in only:
        if s not in SCENARIOS:
            ap.error(f"unknown scenario {s!r}")
    if args.out:
        out = Path(args.out)
    elif (args.quick or args.only) and not args.merge:
        out = Path(tempfile.gettempdir()) / f"agent-run-bench-{'quick' if args.quick else 'partial'}-{time.strftime('%Y%m%d-%H%M%S')}.md"
    else:
        out = REPO / "docs" / "benchmarks.md"

    command = "python3 bench/bench.py" + "".join(f" {shlex.quote(a)}" for a in (argv if argv is not None else sys.argv[1:]))
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    t_start = time.monotonic()

    ctx = Ctx(args)
    if args.merge:
        ctx.results = json.loads(Path(args.merge).read_text())
        command += f"  (the scenarios not in --only are from the earlier full run in {args.merge})"

    def on_signal(sig, frame):
        raise KeyboardInterrupt(f"signal {sig}")

    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    atexit.register(ctx.procs.cleanup)

    code = 0
    try:
        try:
            build(ctx)
        except HarnessError as e:
            log(f"error: {e}")
            return 2
        peers = make_peers(ctx)
        for p in peers:
            if not p.available:
                log(f"{p.name}: {p.why}; its cells will say so")
        runners = {
            "launch": lambda: bench_launch(ctx, peers),
            "stop": lambda: bench_stop(ctx, peers),
            "footprint": lambda: bench_footprint(ctx, peers),
            "output": lambda: bench_output(ctx, peers),
            "watchdog": lambda: bench_watchdog(ctx),
            "cancel": lambda: bench_cancel(ctx),
            "scale": lambda: bench_scale(ctx),
        }
        for name in SCENARIOS:
            if name not in only:
                continue
            # Whatever the build or the scenario before left dirty goes to disk first: on a
            # slow disk its writeback would otherwise be measured as this scenario's fsyncs and
            # file creations (seen: every metadata operation ~1 ms in a launch loop started
            # right after the static build).
            t = time.monotonic()
            os.sync()
            log(f"{name}: sync before it took {time.monotonic() - t:.1f} s")
            t = time.monotonic()
            try:
                ctx.results[name] = runners[name]()
            except KeyboardInterrupt:
                raise
            except Exception as e:  # a harness error: report it, go on with the others
                ctx.errors.append(f"{name}: {type(e).__name__}: {e}")
                log(f"{name}: harness error:\n{traceback.format_exc()}")
                code = 1
            finally:
                ctx.procs.cleanup()
            log(f"{name}: done in {time.monotonic() - t:.1f} s")
        elapsed = time.monotonic() - t_start
        text = render(ctx, peers, command, started, elapsed)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        log(f"wrote {out}")
        if args.json:
            Path(args.json).write_text(json.dumps(ctx.results, indent=2, default=str) + "\n")
            log(f"wrote {args.json}")
        return code
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}); cleaning up")
        return 130
    finally:
        ctx.procs.cleanup()
        os.close(ctx.devnull)
        shutil.rmtree(ctx.tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

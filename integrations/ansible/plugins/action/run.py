# -*- coding: utf-8 -*-
# Copyright: agent-run developers
# SPDX-License-Identifier: MIT OR Apache-2.0
"""The controller half of agentrun.remote.run.

Why an action plugin, and not `until:` polls of `state: status` in the playbook:

- The wait belongs to the task. With `until:` the playbook author writes the loop, and the lease is
  renewed only as often as the loop's `delay` says; a forgotten `until:` leaves a fire-and-forget
  run that nobody renews. Here `state: finished` (the default) is a plain task that returns the
  command's rc and output, and the renewal is always there while it waits.
- The controller's death has to stop the work, and only the controller can prove it is alive. The
  module runs on the host: a host-side loop renewing its own lease would outlive the controller.
  The action plugin runs in the controller's worker process; each renewal is a command sent over
  the connection, so renewals stop exactly when the controller does (or loses the host).
- An interrupted controller must cancel, and only code running in the controller can react to
  Ctrl-C. Ansible forwards SIGINT and SIGTERM to every worker; this plugin catches them while it
  waits, sends `agent-run cancel` for the run it waits for, then lets Ansible's own handler end the
  worker. `until:` polls have no hook for that: the run would be left to its lease.
- It is cheap: one module execution starts the run and waits on the host for a first while (a
  command that ends within it costs what `ansible.builtin.command` costs); after that each poll is
  one small shell command over the connection (`agent-run renew` then `agent-run wait --timeout`,
  which returns the moment the run is final), not a Python module per poll.

The flow for `state: finished`:

1. the module starts the run detached with `--lease` (or finds it: a rerun replays it), renews it
   and waits on the host for at most a third of the lease;
2. while it is not final: every poll renews the lease and waits a third of it on the host; the
   worker checks that its parent (ansible-playbook) is still alive; it never renews for a dead
   controller;
3. once final, the module reads the record and the bounded output and builds the result.

An interruption during step 1 cancels through the host's fence of the id (module_utils/fence.py,
the collection's README: "A cancel that comes before the run exists"), so that a module still on
its way to `agent-run start` starts nothing, or its run is found and cancelled.

The lease token (agent-run renews a lease only for the holder of the run's token) belongs to the
controller: the task's `lease_token`, else the controller user's own, kept in
$ANSIBLE_HOME/agent-run/lease-token (0600, made on first use), so that a later playbook run
renews what an earlier one started. It travels to the host as a no_log module argument, and to
each poll's `agent-run renew` on the command's stdin (a shell variable there, then that one
command's environment), never on a command line. Where the connection cannot carry stdin (no
pipelining: paramiko, `su`, or become without `pipelining = True`, where sudo may want a tty),
each poll is a module execution instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shlex
import signal
import stat
import threading
import time
import uuid

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.agentrun.remote.plugins.module_utils import fence as fence_mod

display = Display()


def fence_source():
    """The source of module_utils/fence.py, which the cancel runs on the host with `python -c`."""
    with open(fence_mod.__file__.replace(".pyc", ".py"), "r") as f:
        return f.read()

# AGENTRUN_ANSIBLE_TRACE=FILE: every worker appends what it does while it waits (signal received,
# cancel sent, cancel returned...) to FILE, one line each with monotonic and wall-clock times, so
# that the hops of a Ctrl-C can be timed against the host's events.jsonl.
TRACE = os.environ.get("AGENTRUN_ANSIBLE_TRACE")


def trace(what):
    if not TRACE:
        return
    try:
        line = "%.6f %.6f %d %s\n" % (time.monotonic(), time.time(), os.getpid(), what)
        fd = os.open(TRACE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode("utf-8", errors="replace"))
        finally:
            os.close(fd)
    except OSError:
        pass

DEFAULT_LEASE_MS = 60000
# The poll (renewal) interval is a third of the lease, within these bounds (seconds).
POLL_MIN_S = 0.2
POLL_MAX_S = 30.0
POLL_MARK = "@agentrun-poll rc="
LABEL_VALUE_MAX = 1024

DURATION_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)?\s*$")
# A lease token as agent-run takes it.
TOKEN_RE = re.compile(r"^[A-Za-z0-9._+/=~-]{16,256}$")
TOKEN_DIR = "agent-run"
TOKEN_FILE = "lease-token"
# agent-run's exit code for a refused renewal (no lease token, or another one).
EXIT_NOPERM = 77
UNIT_MS = {"ms": 1, "s": 1000, "m": 60000, "h": 3600000, "d": 86400000, None: 1000}


def duration_ms(value):
    """A duration option in ms; None when absent or not understood (the module says why)."""
    if value is None or value == "" or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return int(round(value * 1000)) if value >= 0 else None
    m = DURATION_RE.match(str(value))
    if not m:
        return None
    return int(round(float(m.group(1)) * UNIT_MS[m.group(2)]))


def slug(text, limit):
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip("-.")
    s = re.sub(r"-{2,}", "-", s)
    return (s[:limit].rstrip("-.") or "x")


def label_value(text):
    """A label value agent-run accepts: no control characters, at most 1024 bytes."""
    s = re.sub(r"[\x00-\x1f\x7f]+", " ", str(text))
    b = s.encode("utf-8", errors="replace")[:LABEL_VALUE_MAX]
    return b.decode("utf-8", errors="ignore")


class TokenError(Exception):
    pass


def ansible_home():
    """The controller's Ansible home ($ANSIBLE_HOME, [defaults] home; ~/.ansible by default)."""
    try:
        from ansible import constants as C
        home = getattr(C, "ANSIBLE_HOME", None)
    except ImportError:
        home = None
    return os.path.abspath(os.path.expanduser(home or "~/.ansible"))


def controller_token(home=None):
    """The controller user's lease token, from HOME/agent-run/lease-token; made there first when
    missing (0600, in a 0700 directory of ours). Two workers making it at once agree: the file is
    linked into place only if none is there (never replaced), and both read what is there."""
    home = home or ansible_home()
    d = os.path.join(home, TOKEN_DIR)
    path = os.path.join(d, TOKEN_FILE)
    try:
        os.makedirs(home, 0o700, exist_ok=True)
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise TokenError("cannot make or open the directory %s: %s" % (d, e.strerror))
    try:
        st = os.fstat(dfd)
        if st.st_uid != os.geteuid():
            raise TokenError("%s is not owned by uid %d" % (d, os.geteuid()))
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.fchmod(dfd, 0o700)
        for _ in range(3):
            try:
                fd = os.open(TOKEN_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
            except FileNotFoundError:
                _make_token(dfd)
                continue
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                    raise TokenError("%s is not a regular file of uid %d" % (path, os.geteuid()))
                if stat.S_IMODE(st.st_mode) & 0o077:
                    raise TokenError(
                        "%s can be read by others (mode %04o), so the token may be known: remove it (a new one "
                        "is made, and runs started with the old one can no longer be renewed) or chmod it 0600"
                        % (path, stat.S_IMODE(st.st_mode)))
                data = os.read(fd, 1024)
            finally:
                os.close(fd)
            token = data.decode("ascii", errors="replace").strip()
            if not TOKEN_RE.match(token):
                raise TokenError("%s does not hold a lease token (16 to 256 characters of A-Z a-z 0-9 . _ - + / = ~)"
                                 % path)
            return token
        raise TokenError("%s vanished each time it was made" % path)
    except OSError as e:
        raise TokenError("cannot read or make %s: %s" % (path, e.strerror))
    finally:
        os.close(dfd)


def _make_token(dfd):
    """A new token into TOKEN_FILE in directory `dfd`, unless one is there by then."""
    tmp = ".%s.%d.%s" % (TOKEN_FILE, os.getpid(), uuid.uuid4().hex)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    try:
        try:
            os.write(fd, (secrets.token_urlsafe(32) + "\n").encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, TOKEN_FILE, src_dir_fd=dfd, dst_dir_fd=dfd)
        except FileExistsError:
            pass  # another worker's, made meanwhile: that one it is
    finally:
        os.unlink(tmp, dir_fd=dfd)
    os.fsync(dfd)


def refused(run_id):
    """The task's result when agent-run refused a renewal (77): the run is not this task's."""
    return dict(failed=True, run_id=run_id, final=False, rc=None, msg=(
        "agent-run refused to renew run %s (exit 77): it was started with another lease token than this task's: "
        "by another controller user, with another ANSIBLE_HOME or with another lease_token. Only its starter can "
        "renew it; give this task the lease_token that started it. Without renewals the host stops it when its "
        "lease expires" % run_id))


class _Interrupted(BaseException):
    """A signal (INT, TERM) reached the worker while it waited for the run."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


class _ControllerGone(Exception):
    pass


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

    # ---- helpers ----------------------------------------------------------------------------

    def _derive_id(self, args, task_vars):
        host = task_vars.get("inventory_hostname") or "host"
        play = task_vars.get("ansible_play_name") or ""
        task = self._task.get_name() if self._task.name else ""
        where = task
        if not task:
            path = self._task.get_path() or ""
            where = os.path.basename(path) or "task"
        item = None
        if self._task.loop is not None or getattr(self._task, "loop_with", None):
            loop_var = task_vars.get("ansible_loop_var") or "item"
            item = task_vars.get(loop_var)
        command = args.get("argv")
        if command is None and args.get("cmd") is not None:
            command = [args.get("executable") or "/bin/sh", "-c", args.get("cmd")]
        key = json.dumps([play, where, host, item, command], sort_keys=True, default=str)
        digest = hashlib.sha256(key.encode("utf-8", errors="surrogatepass")).hexdigest()[:12]
        return "ans-%s-%s-%s" % (slug(host, 24), slug(where, 40), digest)

    def _auto_labels(self, task_vars):
        return {
            "ansible.host": label_value(task_vars.get("inventory_hostname") or ""),
            "ansible.play": label_value(task_vars.get("ansible_play_name") or ""),
            "ansible.task": label_value(self._task.get_name() if self._task.name else self._task.get_path() or ""),
        }

    def _sh_path(self, path):
        """A path for the remote shell, with a leading ~/ meaning the remote user's home."""
        quote = self._connection._shell.quote
        path = str(path)
        if path == "~":
            return '"$HOME"'
        if path.startswith("~/"):
            return '"$HOME"/' + quote(path[2:])
        return quote(path)

    def _agent_run(self, args, known, with_env=True, assign=""):
        """The shell words that call the host's agent-run with the task's root (after the task's
        environment as assignments, unless not `with_env`, then `assign`)."""
        quote = self._connection._shell.quote
        env = self._compute_environment_string() if with_env else ""
        env = " ".join(w for w in (env, assign) if w)
        if known.get("binary"):
            binary = quote(known["binary"])
        else:
            name = str(args.get("binary") or "agent-run")
            if "/" in name:
                binary = self._sh_path(name)
            else:
                binary = '"$(PATH="$PATH:$HOME/.local/bin:/usr/local/bin:/usr/bin:/bin" command -v %s || echo %s)"' % (
                    quote(name), quote(name))
        words = ([env] if env else []) + [binary]
        if known.get("root"):
            words += ["--root", quote(known["root"])]
        elif args.get("root"):
            words += ["--root", self._sh_path(args["root"])]
        return " ".join(words)

    def _raw(self, cmd, in_data=None):
        sudoable = True  # so that become applies, as it does to the module
        res = self._low_level_execute_command(cmd, sudoable=sudoable, in_data=in_data)
        return res.get("rc"), (res.get("stdout") or "") + "\n" + (res.get("stderr") or "")

    def _cancel(self, args, base, known, token):
        """Best effort: cancel the run this task waits for (or every active attempt of `base` when
        the run id is not known yet). Bounded by agent-run's own --wait (the run's grace + 5s).

        When the run id is not known yet, the module may still be on its way to starting the run:
        the cancel then goes through the host's fence of `base` (module_utils/fence.py), which
        marks this task invocation (`token`) cancelled and cancels by label under the lock the
        module holds from choosing the attempt until `start --detach` has returned."""
        quote = self._connection._shell.quote
        ar = self._agent_run(args, known)
        by_label = None
        if known.get("run_id"):
            cmd = "%s cancel --json %s >/dev/null 2>&1" % (ar, quote(known["run_id"]))
        else:
            by_label = "%s cancel --json --label %s >/dev/null 2>&1" % (ar, quote("agentrun.id=" + base))
            cmd = by_label
            interpreter = (self._used_interpreter or "").lstrip("#!").strip()
            try:
                source = fence_source() if interpreter else None
            except (OSError, AttributeError) as e:
                display.vvv("agentrun.remote.run: no fence source (%s): cancelling by label only" % e)
                source = None
            if source:
                # The module was sent (Ansible chose its interpreter): it may still start the run.
                env = self._compute_environment_string()
                root = self._sh_path(args["root"]) if args.get("root") else "''"
                plain = self._agent_run(args, known, with_env=False)
                cmd = "%s %s -c %s %s %s %s -- %s cancel --json --label %s >/dev/null 2>&1; [ $? -ne 127 ] || %s" % (
                    env, " ".join(quote(w) for w in shlex.split(interpreter)), quote(source), root, quote(base),
                    quote(token), plain, quote("agentrun.id=" + base), by_label)
        try:
            trace("cancel start %s%s" % (known.get("run_id") or base, " via the fence" if by_label and cmd != by_label else ""))
            self._raw(cmd)
            trace("cancel done %s" % (known.get("run_id") or base))
            return True
        except BaseException as e:  # the connection may be gone too: the lease stops the run then
            display.vvv("agentrun.remote.run: cancel of %s failed: %s" % (known.get("run_id") or base, e))
            return False

    # ---- the task -------------------------------------------------------------------------

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        args = dict(self._task.args)
        private = sorted(k for k in args if str(k).startswith("_"))
        if private:
            result.update(failed=True, msg="unsupported option(s) %s (options starting with _ are internal)" % ", ".join(private))
            return result
        state = args.get("state") or "finished"
        if "run_id" in args and "id" not in args:
            args["id"] = args.pop("run_id")
        if not args.get("id") and state in ("finished", "started"):
            args["id"] = self._derive_id(args, task_vars)
        args["_labels"] = self._auto_labels(task_vars)
        module = self._task.resolved_action or "agentrun.remote.run"

        # The lease token: the task's, else the controller user's (made on first use). Only what
        # starts or renews needs it.
        given = args.pop("lease_token", None)
        if given not in (None, "") and not TOKEN_RE.match(str(given)):
            result.update(failed=True, msg="lease_token must be 16 to 256 characters of A-Z a-z 0-9 . _ - + / = ~")
            return result
        if state in ("finished", "started", "status") and not self._task.check_mode:
            if given not in (None, ""):
                args["_lease_token"] = str(given)
            else:
                try:
                    args["_lease_token"] = controller_token()
                except TokenError as e:
                    result.update(failed=True, msg="cannot use the controller's lease token: %s; or give the task "
                                  "a lease_token" % e)
                    return result

        if state != "finished" or self._task.check_mode:
            result.update(self._execute_module(module_name=module, module_args=args, task_vars=task_vars))
            return result
        result.update(self._finished(module, args, task_vars))
        return result

    def _finished(self, module, args, task_vars):
        base = str(args["id"])
        lease_ms = duration_ms(args.get("lease"))
        poll_s = min(POLL_MAX_S, max(POLL_MIN_S, (lease_ms or DEFAULT_LEASE_MS) / 3000.0))
        known = {}
        parent = os.getppid()
        # This invocation of the task, for the host's fence (see _cancel).
        token = uuid.uuid4().hex

        # While it waits, INT and TERM (which Ansible forwards to every worker on Ctrl-C) become
        # _Interrupted here, so that the run is cancelled before the worker ends. From the first
        # one on, later ones (Ansible sends TERM to workers still alive after a Ctrl-C) are only
        # noted, so that nothing interrupts the cancel; they are delivered once it is sent.
        saved = {}
        pending = []
        in_main = threading.current_thread() is threading.main_thread()

        def note(signum, _frame):
            pending.append(signum)

        def interrupted(signum, _frame):
            trace("signal %d %s" % (signum, base))
            for sig in saved:
                signal.signal(sig, note)
            raise _Interrupted(signum)

        if in_main:
            for sig in (signal.SIGINT, signal.SIGTERM):
                saved[sig] = signal.getsignal(sig)
                signal.signal(sig, interrupted)
        try:
            first = dict(args, _wait=poll_s, _token=token)
            res = self._execute_module(module_name=module, module_args=first, task_vars=task_vars)
            known.update(run_id=res.get("run_id"))
            agent = res.get("agent_run") or {}
            known["binary"] = agent.get("binary")
            run_dir = (res.get("record") or {}).get("run_dir")
            if isinstance(run_dir, str) and "/" in run_dir:
                known["root"] = run_dir.rsplit("/", 1)[0]
            if res.get("failed") or res.get("final", True) or not res.get("run_id"):
                return res
            run_lease_ms = lease_ms
            if run_lease_ms is None:
                own = res.get("lease_s")
                run_lease_ms = int(own * 1000) if isinstance(own, (int, float)) and own > 0 else DEFAULT_LEASE_MS
            poll_s = min(POLL_MAX_S, max(POLL_MIN_S, run_lease_ms / 3000.0))
            failed = self._wait_final(module, args, task_vars, known, run_lease_ms, poll_s, parent)
            if failed:
                failed.setdefault("id", base)
                return failed
            collect = dict(args, _collect=known["run_id"], _changed=bool(res.get("changed")))
            return self._execute_module(module_name=module, module_args=collect, task_vars=task_vars)
        except _ControllerGone:
            # ansible-playbook is gone (SIGKILL): nobody reads this worker's result. Stop renewing and
            # end the worker now; the host stops the run when its lease expires.
            os._exit(1)
        except AnsibleConnectionFailure:
            raise
        except BaseException as e:
            # Interrupted (Ctrl-C, SIGTERM), the task's own `timeout:` keyword, or anything else that
            # ends the wait early: cancel the run on the host, then let Ansible handle what happened.
            if in_main:
                for sig in saved:
                    signal.signal(sig, note)
            self._cancel(args, base, known, token)
            signum = e.signum if isinstance(e, _Interrupted) else (pending[0] if pending else None)
            if in_main:
                for sig, handler in saved.items():
                    signal.signal(sig, handler)
                saved.clear()
                if signum is not None:
                    # Ansible's own handler (the worker's): it ends the worker's process group.
                    os.kill(os.getpid(), signum)
            if isinstance(e, _Interrupted):
                return dict(failed=True, id=base, run_id=known.get("run_id"),
                            msg="interrupted by signal %d: run %s cancelled" % (e.signum, known.get("run_id") or base))
            raise
        finally:
            if in_main:
                for sig, handler in saved.items():
                    signal.signal(sig, handler)

    def _stdin_reaches_host(self):
        """Whether a command's stdin reaches the host's shell through this connection, as a
        pipelined module's does: a connection that can pipeline, and no become unless pipelining
        is on (become without it may need a tty, which stdin data rules out)."""
        conn = self._connection
        if not getattr(conn, "has_pipelining", False):
            return False
        if not conn.become:
            return True
        try:
            return bool(conn.is_pipelining_enabled())
        except Exception:  # an older or odd connection plugin: the module path is always right
            return False

    def _wait_final(self, module, args, task_vars, known, lease_ms, poll_s, parent):
        """Renew and wait until the run is final. Returns None when it is (or when agent-run says
        something the module should report), a failed result when agent-run refused a renewal;
        raises _ControllerGone when ansible-playbook died."""
        quote = self._connection._shell.quote
        ar = self._agent_run(args, known)
        run_id = quote(known["run_id"])
        token = args.get("_lease_token") or ""
        by_stdin = self._stdin_reaches_host()
        # The token is read from stdin into a shell variable, and given to `renew` alone, in its
        # environment: the command line (which /proc shows every user) never holds it.
        renew = "%s renew %s --lease %dms >/dev/null 2>&1" % (
            self._agent_run(args, known, assign='AGENT_RUN_LEASE_TOKEN="$t"'), run_id, lease_ms)
        wait = "%s wait --timeout %dms --json %s 2>/dev/null" % (ar, int(poll_s * 1000), run_id)
        cmd = "IFS= read -r t || :; %s; r=$?; t=; %s; rc=$?; echo; echo '%s'$rc' renew='$r" % (renew, wait, POLL_MARK)
        data = (token + "\n").encode("ascii")
        # The lease runs out this long after the last renewal that reached the host.
        last_ok = time.monotonic()
        while True:
            if os.getppid() != parent:
                raise _ControllerGone()
            try:
                trace("poll %s%s" % ("" if by_stdin else "by module ", known["run_id"]))
                if not by_stdin:
                    res = self._execute_module(module_name=module, task_vars=task_vars, module_args=dict(
                        args, _poll=known["run_id"], _wait=poll_s, lease="%dms" % lease_ms))
                    if res.get("unreachable"):
                        raise AnsibleConnectionFailure(res.get("msg") or "unreachable")
                    last_ok = time.monotonic()
                    if res.get("failed"):
                        return res
                    if res.get("final") or res.get("wait_rc") not in (75, None):
                        return
                    continue
                rc, text = self._raw(cmd, in_data=data)
            except AnsibleConnectionFailure as e:
                if time.monotonic() - last_ok > lease_ms / 1000.0:
                    raise AnsibleConnectionFailure(
                        "lost the connection to the host while waiting for run %s, for longer than its lease (%s): "
                        "the host has stopped it (reason lease_expired); ask with state: status, id: %s (%s)"
                        % (known["run_id"], "%dms" % lease_ms, args.get("id"), e))
                time.sleep(min(1.0, poll_s))
                continue
            last_ok = time.monotonic()
            text = text.replace("\r", "")
            at = text.rfind(POLL_MARK)
            if at < 0:
                return  # not our output: let the module look at the run
            m = re.match(r"(\d+) renew=(\d+)", text[at + len(POLL_MARK):])
            wait_rc = int(m.group(1)) if m else None
            if m and int(m.group(2)) == EXIT_NOPERM:
                return refused(known["run_id"])
            body = text[:at]
            start = body.find("{")
            doc = None
            if start >= 0:
                try:
                    doc = json.JSONDecoder().raw_decode(body[start:])[0]
                except ValueError:
                    doc = None
            if isinstance(doc, dict) and doc.get("final"):
                return
            if wait_rc == 75 and doc is None:
                continue  # still running: renew again
            return

#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: agent-run developers
# SPDX-License-Identifier: MIT OR Apache-2.0
"""The host half of agentrun.remote.run: one step of a run, done with the host's agent-run.

The action plugin of the same name (plugins/action/run.py) runs on the controller, derives the
run id, and for state=finished waits on the controller's side, renewing the lease, so that a
controller that dies or is interrupted stops the remote work. This module never renews a lease
on its own while it waits: a lease renewed by the host itself would outlive the controller.
From choosing the attempt until `agent-run start --detach` has returned it holds the host's fence
of the id (module_utils/fence.py), which a cancel that does not know the run id yet goes through.

The run's lease token comes from the controller (the action plugin: the task's `lease_token`, or
the controller user's own). It reaches agent-run only in the environment of `agent-run start` and
`agent-run renew` (AGENT_RUN_LEASE_TOKEN), never on a command line nor in any other call.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: run
short_description: Run a command on the managed host under agent-run, so that stopping the play stops it
version_added: "0.1.0"
description:
  - Runs a command on the managed host under C(agent-run), a wrapper that gives the command its own
    session, keeps a record of it in C(~/.agent-runs/<id>/) and stops the whole process tree (background
    jobs, C(nohup)ed helpers and double-forked daemons included) when the run is cancelled, times out or
    loses its lease.
  - With O(state=finished) (the default) the task starts the run detached, waits for it on the
    controller's side while renewing its lease, and returns its exit code, its output (bounded) and its
    final record. Ctrl-C of C(ansible-playbook), a task C(timeout) or a signal to the controller cancels the
    run on every host that was waiting for one; if the controller dies without a word (SIGKILL, a lost
    machine), nobody renews the lease and the host stops the run when it expires.
  - The run id is the idempotence key. Running the same play again finds the same runs and does not run
    a command twice, it reports how the first run ended (see O(id) and O(rerun)).
  - O(state=started) starts the run and returns at once (fire and forget, with a lease or not);
    O(state=status) reads the record and renews the lease; O(state=cancelled) stops the run and returns
    the final record.
  - The managed host needs the C(agent-run) binary (a static binary, or the Debian package; see the
    collection's README) and Python, as for any module.
options:
  id:
    description:
      - The run id on the host, 1 to 128 characters of C(A-Z a-z 0-9 . _ -), not starting with C(.) or C(-).
      - When it is not given, the action plugin derives one from the play's name, the task's name (its file
        and line when it has none), the inventory host name, the loop item and the command, for example
        C(ans-web1-build-3f9c0e6b2d1a). So a rerun of the same play finds the same runs, and an edited command
        is a new run.
      - Required for O(state=status) and O(state=cancelled). Give the same O(id) to a O(state=started) task and
        to the O(state=finished), O(state=status) or O(state=cancelled) tasks that follow it, in the same play
        or a later one.
    type: str
    aliases: [run_id]
  argv:
    description:
      - The command as a list of words, run without a shell. Each word reaches the host as it is.
      - Mutually exclusive with O(cmd). One of them is required to start a run; to wait for, read or cancel
        a run that exists (O(id) given), neither is needed.
    type: list
    elements: str
  cmd:
    description:
      - The command as a shell string, run as O(executable) C(-c) O(cmd).
    type: str
  executable:
    description:
      - The shell that runs O(cmd).
    type: str
    default: /bin/sh
  chdir:
    description:
      - The directory to run the command in. It must exist. By default, the module's working directory
        on the host (usually the remote user's home).
    type: path
    aliases: [cwd]
  env:
    description:
      - Variables to set in the command's environment. The record keeps their names, never their values.
      - The values are on the command line of the short-lived C(agent-run start) process on the host, and in
        the task's arguments; use C(no_log) on the task for secrets.
    type: dict
  lease:
    description:
      - The run's lease, a dead man's switch. Without a renewal within O(lease), the host stops the run
        (reason C(lease_expired), exit 124). The controller renews it about every third of the lease
        while the task waits, and O(state=status) renews it.
      - A duration, C(90), C(90s), C(500ms), C(5m), C(2h) or C(7d). A bare number is seconds.
      - A controller that dies leaves each run to run on for at most its lease (plus a third of it, the
        time between two renewals). Shorter leases stop orphans sooner and cost more renewals.
      - When it is not given, a new run gets C(60s); a run that exists keeps its own lease length for the
        renewals.
      - V(0) starts a run without a lease; only with O(state=started). Such a run is stopped only by its
        O(timeout), a O(state=cancelled) task, or on the host.
    type: raw
  lease_token:
    description:
      - The run's lease token. Only whoever holds it renews the run's lease; the host keeps only its
        SHA-256. 16 to 256 characters of C(A-Z a-z 0-9 . _ - + / = ~).
      - A run started with it needs it again for every renewal (O(state=status), O(state=finished)), from
        any later play or playbook run.
      - When it is not given, the controller's own is used, one per controller user. It lives in
        C($ANSIBLE_HOME/agent-run/lease-token) (C(~/.ansible/agent-run/lease-token) by default), mode 0600 in
        a 0700 directory. The first task that needs it makes it. So runs started by one controller user
        are renewed by that user's later playbooks, and by nobody else's.
      - The managed host sees the token only in the environment of the two calls that need it,
        C(agent-run start) and C(agent-run renew) (C(AGENT_RUN_LEASE_TOKEN)). It is never on a command line,
        and agent-run keeps it out of the command's environment. It goes to the host on the module's stdin (or
        in its arguments file, without pipelining), and on the stdin of each renewal command.
    type: str
  timeout:
    description:
      - A wall-clock limit, counted on the host from the run's start. When it is reached the whole run is
        stopped (reason C(timeout), exit 124) and the result carries C(timedout), so C(result is timedout)
        is true. Renewing the lease does not extend it. Same duration syntax as O(lease).
      - Unlike the task keyword C(timeout), which only stops Ansible waiting (this collection cancels the
        run then too), this limit is enforced on the host even if the controller is gone.
    type: raw
  grace:
    description:
      - The time between TERM and KILL when the run is stopped. agent-run's default is 5s.
    type: raw
  labels:
    description:
      - Labels kept in the run's record (key to string value). Keys are 1 to 128 characters of
        C(A-Z a-z 0-9 . _ - /). C(agent-run list --label KEY=VALUE) on the host selects runs by label.
      - The action plugin adds C(ansible.host), C(ansible.play), C(ansible.task) and C(agentrun.id) (the
        run id before any O(rerun) suffix).
    type: dict
  state:
    description:
      - V(finished) starts the run (unless it exists), waits until it is final and returns its result; the
        task fails when the run did not finish with exit code 0.
      - V(started) starts the run detached and returns its record at once. It fails only when the run
        ended at once with an exit code other than 0 (for example 127, command not found).
      - V(status) returns the run's record and its output so far, and renews its lease. It never starts
        anything.
      - V(cancelled) stops the run (the whole process tree; TERM, HUP, then KILL after O(grace)) and returns
        the final record. A run that is already final, or that does not exist, is left as it is.
    type: str
    choices: [finished, started, status, cancelled]
    default: finished
  rerun:
    description:
      - What a task does when its run id already names a final run.
      - V(stopped) runs the command again, as a new attempt with the id C(<id>.r2), C(<id>.r3)...,
        when the last attempt was stopped before it finished (V(cancelled) by Ctrl-C, a cancel, a
        timeout or its lease) or never started (V(launch_failed), for example a command not found). A
        run that finished, whatever its exit code, is never run again, nor one whose outcome is
        V(unknown) (it may have done its work, or have processes left).
      - V(failed) also runs it again when it finished with an exit code other than 0, or its outcome is
        V(unknown).
      - V(never) never runs a command twice under one id; the task reports how the run ended.
      - A run that is still active is never started again; the task waits for it (O(state=finished)).
    type: str
    choices: [stopped, failed, never]
    default: stopped
  root:
    description:
      - The run root on the host. By default agent-run's own, C($AGENT_RUN_ROOT), else C(~/.agent-runs) of
        the remote user (of the C(become) user with C(become)).
    type: path
  binary:
    description:
      - The agent-run binary on the host. A name is looked up in C(PATH), then in C(~/.local/bin),
        C(/usr/local/bin) and C(/usr/bin) (ssh sessions often lack C(~/.local/bin) in C(PATH)).
    type: str
    default: agent-run
  max_output:
    description:
      - How many bytes of each of stdout and stderr the result carries, the last ones. When the output was
        longer, C(stdout_truncated) (C(stderr_truncated)) is true and C(stdout_bytes) (C(stderr_bytes)) is
        its whole length; the whole output stays in the run dir on the host (C(agent-run logs <id>)).
    type: int
    default: 65536
attributes:
  action:
    support: full
    details: The action plugin derives the run id, waits and renews the lease on the controller, and
      cancels the run when the controller is interrupted.
  async:
    support: none
    details: Use O(state=started) instead of C(async), and O(state=status) or O(state=finished) later.
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details: Nothing is started, renewed or cancelled; the result says what would be done.
  diff_mode:
    support: full
    details: The run's state before and after the task.
  platform:
    support: full
    platforms: posix
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
notes:
  - Set C(forks) to at least the number of hosts a long task runs on, or Ansible waits for the first hosts
    before it starts the run on the others.
  - Interrupting C(ansible-playbook) (Ctrl-C, SIGTERM) or reaching a task C(timeout) cancels the runs the
    play's tasks are waiting for, on every host. After a Ctrl-C, C(ansible-playbook) exits only once every
    one of them is final (it waits for its workers); after a SIGTERM it exits at once and its workers
    finish the cancels. Runs started with O(state=started) are left to their lease.
  - A cancel that comes before the run exists (during the task's first module call, when the controller
    does not know the run id yet) still sticks. The module holds an exclusive flock of
    C(<root>/.ansible-fence.<id>) from choosing the attempt until C(agent-run start --detach) has returned; the
    controller's cancel takes the same lock, leaves a mark for this task invocation there and cancels by the
    label C(agentrun.id=<id>). So either the run exists and is cancelled, or the module finds the mark and
    starts nothing (RV(not_started)). A later run of the play is a new invocation and is not refused.
  - The fence file lives only while it is needed. The module removes it, under its lock, once the run exists
    and no mark is left in it; a mark is removed by the module it was left for. A fence whose marks nobody
    came for is removed a day later, by the next task that starts a run in that root.
  - Renewals need the run's lease token (see O(lease_token)). A run started by another controller user, or
    with another O(lease_token), cannot be renewed by this task; it fails, saying so.
  - When the controller is killed (SIGKILL), its workers stop renewing and exit; each host stops its run
    when the lease expires (the wrapper does, or C(agent-run-watchdog) if the wrapper is gone).
  - The command's stdin is C(/dev/null). It runs without a terminal, so a prompt fails at once instead of
    hanging the play.
seealso:
  - module: ansible.builtin.command
    description: Runs a command without agent-run; Ctrl-C of the play leaves it running on the host.
  - module: ansible.builtin.async_status
    description: Ansible's own async jobs, which keep running when the controller dies.
author:
  - agent-run developers
"""

EXAMPLES = r"""
- name: Run the test suite on every host; Ctrl-C stops it everywhere
  agentrun.remote.run:
    argv: [make, -j4, test]
    chdir: /srv/app
    timeout: 30m
    lease: 60s
  register: tests

- name: Show where it failed
  ansible.builtin.debug:
    msg: "{{ tests.stderr_lines[-20:] }}"
  when: tests is failed

- name: A shell command, with variables and labels
  agentrun.remote.run:
    cmd: ./migrate.sh --all 2>&1 | tee migrate.log
    chdir: /srv/app
    env:
      MODE: production
    labels:
      ticket: OPS-123

- name: Tell a timeout from a failure
  agentrun.remote.run:
    cmd: ./slow-check.sh
    timeout: 5m
  register: check
  failed_when: check is failed and check is not timedout

- name: Fire and forget, with a lease of its own
  agentrun.remote.run:
    id: nightly-reindex
    argv: [/usr/local/bin/reindex]
    state: started
    lease: 2h

- name: Later (another play, or another playbook run) see how it is doing; renews the lease
  agentrun.remote.run:
    id: nightly-reindex
    state: status
  register: reindex

- name: Wait for it to end, renewing the lease meanwhile
  agentrun.remote.run:
    id: nightly-reindex
    state: finished

- name: Or stop it, with its whole process tree
  agentrun.remote.run:
    id: nightly-reindex
    state: cancelled

- name: The binary and the run root for every task of a play
  hosts: all
  module_defaults:
    group/agentrun.remote.all:
      binary: /opt/agent-run/bin/agent-run
      root: /var/lib/ci/runs
  tasks:
    - agentrun.remote.run:
        argv: [uptime]
"""

RETURN = r"""
run_id:
  description: The run's id on the host (with its C(.rN) suffix for a rerun attempt).
  returned: always, except when agent-run could not be found or run
  type: str
  sample: ans-web1-build-3f9c0e6b2d1a
id:
  description: The run id the task asked for or derived, before any O(rerun) suffix.
  returned: always
  type: str
state:
  description:
    - The run's state, C(starting), C(running), C(cancelling), or one of the final states C(finished),
      C(cancelled), C(launch_failed), C(unknown). C(absent) when the run does not exist.
  returned: always
  type: str
  sample: finished
reason:
  description:
    - Why the run was stopped or is unknown, C(cancel_request), C(timeout), C(lease_expired), C(signal:TERM),
      C(survivors), C(wrapper_lost), C(host_rebooted)...; null for a run that finished by itself.
  returned: always
  type: str
rc:
  description:
    - The run's exit code, as C(agent-run wait) gives it, null while the run is active. The command's own
      status, 128+N for a signal, 124 for a timeout or an expired lease, 143 for a cancel, 127 for a command
      not found, 75 for an unknown outcome.
  returned: always
  type: int
  sample: 0
stdout:
  description: The run's standard output, its last O(max_output) bytes (decoded as UTF-8, invalid bytes replaced).
  returned: when the run exists
  type: str
stderr:
  description: The run's standard error, its last O(max_output) bytes.
  returned: when the run exists
  type: str
stdout_lines:
  description: O(stdout) split into lines.
  returned: when the run exists
  type: list
  elements: str
stderr_lines:
  description: O(stderr) split into lines.
  returned: when the run exists
  type: list
  elements: str
stdout_bytes:
  description: The whole length of the standard output on the host, in bytes.
  returned: when the run exists
  type: int
stderr_bytes:
  description: The whole length of the standard error on the host, in bytes.
  returned: when the run exists
  type: int
stdout_truncated:
  description: Whether O(stdout) holds less than the whole output (only its last O(max_output) bytes).
  returned: when the run exists
  type: bool
stderr_truncated:
  description: Whether O(stderr) holds less than the whole error output.
  returned: when the run exists
  type: bool
timedout:
  description:
    - Present when the run was stopped by its O(timeout) or because its lease expired, so that the
      C(timedout) test (C(result is timedout)) is true. C(period) is the timeout (or the lease) in seconds,
      C(reason) is C(timeout) or C(lease_expired).
  returned: when the run was stopped by its timeout or its lease
  type: dict
  sample: {"period": 30.0, "reason": "timeout"}
cancelled:
  description:
    - Whether the run ended C(cancelled) (stopped, every process of it confirmed gone), or the task was
      cancelled before its run existed (then RV(not_started) is true too).
  returned: always
  type: bool
not_started:
  description:
    - True when the controller cancelled the task (Ctrl-C, SIGTERM, the task's C(timeout)) while this module
      was still on its way to starting the run; it found the cancel's mark on the host and started nothing.
      C(state) is C(absent) then, and a rerun of the task starts the run.
  returned: when the task was cancelled before its run existed
  type: bool
final:
  description: Whether the run is in a final state.
  returned: always
  type: bool
cmd:
  description: The command as agent-run recorded it (argv).
  returned: when the run exists
  type: list
  elements: str
start:
  description: When the run started (RFC 3339, UTC).
  returned: when the run exists
  type: str
end:
  description: When the run ended (RFC 3339, UTC), null while it is active.
  returned: when the run exists
  type: str
delta:
  description: How long the run took (or has taken so far), as C(H:MM:SS.ffffff), like the command module's.
  returned: when the run exists
  type: str
record:
  description:
    - The run's record as C(agent-run status --json) prints it, status.json (pid, pgid, sid, cleanup with the
      signals sent and any survivors, labels, timeout_ms, ...) plus derived fields (final, outcome_exit_code,
      lease_remaining_s, run_dir).
  returned: when the run exists
  type: dict
attempt:
  description: Which attempt of O(id) this is, 1 for the run named O(id), N for C(<id>.rN).
  returned: when the run exists
  type: int
agent_run:
  description: The agent-run binary used on the host and its version.
  returned: when agent-run was found
  type: dict
  sample: {"binary": "/usr/bin/agent-run", "version": "0.1.0"}
"""

import atexit
import datetime
import json
import os
import re
import stat
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.agentrun.remote.plugins.module_utils.fence import Fence, FenceError, sweep

# What the run needs from the host's agent-run (`agent-run version --json` "features").
NEEDED_ALWAYS = ("labels", "version")
NEEDED_FOR = {"timeout": "timeout", "chdir": "cwd", "env": "env"}

RUN_ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
DURATION_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)?\s*$")
UNIT_MS = {"ms": 1, "s": 1000, "m": 60000, "h": 3600000, "d": 86400000, None: 1000}
FINAL_STATES = ("finished", "cancelled", "launch_failed", "unknown")
STOPPED_STATES = ("cancelled", "launch_failed")
READ_CAP = 16 * 1024 * 1024
# How long the module waits for the fence of its run id (held by another task of the same id
# while it starts its run, or by the cancel of one).
FENCE_WAIT_S = 120.0
# How long, at the end of its call, it waits for the fence to drop a mark of its own.
MARK_WAIT_S = 30.0
# The variable that carries the lease token to agent-run start and renew (only to them).
TOKEN_ENV = "AGENT_RUN_LEASE_TOKEN"
# agent-run's exit code for a refused renewal (no lease token, or another one).
EXIT_NOPERM = 77


def test_pause(point, base):
    """Test-only: with AGENTRUN_ANSIBLE_TEST_PAUSE=POINT:DIR in the module's environment, stop at
    POINT (`fence`: before the fence is taken; `start`: under it, before `agent-run start`), say so
    in DIR/<id>.<POINT>.paused (this process's pid), and go on once DIR/<id>.<POINT>.go exists
    (or after 300 s). The collection's tests use it to land a cancel at a chosen place."""
    spec = os.environ.get("AGENTRUN_ANSIBLE_TEST_PAUSE") or ""
    want, _, where = spec.partition(":")
    if want != point or not where:
        return
    stem = os.path.join(where, "%s.%s" % (base, point))
    fd = os.open(stem + ".paused", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, ("%d\n" % os.getpid()).encode())
    finally:
        os.close(fd)
    deadline = time.monotonic() + 300
    while not os.path.exists(stem + ".go") and time.monotonic() < deadline:
        time.sleep(0.01)


def duration_ms(value, name):
    """A duration option (a number of seconds, or '90s', '500ms', '5m', '2h', '7d') in ms, or None."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ValueError("%s: expected a duration such as 90s, got %r" % (name, value))
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError("%s: a duration cannot be negative (%r)" % (name, value))
        return int(round(value * 1000))
    m = DURATION_RE.match(str(value))
    if not m:
        raise ValueError(
            "%s: %r is not a duration (write 90, 90s, 500ms, 5m, 2h or 7d)" % (name, value)
        )
    return int(round(float(m.group(1)) * UNIT_MS[m.group(2)]))


def attempt_number(base, run_id):
    """1 for `base`, N for `base.rN`, None for anything else."""
    if run_id == base:
        return 1
    if run_id.startswith(base + ".r"):
        tail = run_id[len(base) + 2:]
        if tail.isdigit() and not tail.startswith("0"):
            n = int(tail)
            if n >= 2:
                return n
    return None


def parse_json_doc(text):
    """The JSON document agent-run printed on stdout, or None."""
    text = (text or "").strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def last_line_json(text):
    for line in reversed((text or "").strip().splitlines()):
        doc = parse_json_doc(line)
        if doc is not None:
            return doc
    return None


def first_error_line(err):
    lines = [l.strip() for l in (err or "").splitlines() if l.strip()]
    return lines[-1] if lines else ""


class AgentRun(object):
    """The host's agent-run, called with the module's --root."""

    def __init__(self, module):
        self.module = module
        self.root = module.params["root"]
        self.binary = self._find(module.params["binary"])
        self._version = None

    def _find(self, name):
        name = os.path.expanduser(name or "agent-run")
        if "/" in name:
            if os.path.isfile(name) and os.access(name, os.X_OK):
                return name
            self.module.fail_json(
                msg="agent-run is not at %s on this host (not an executable file); install it there "
                "(a static binary or the Debian package, see the collection's README) or fix binary:" % name,
                id=self.module.params.get("id"), state="absent", final=False, cancelled=False, rc=None,
                reason=None,
            )
        extra = [os.path.expanduser("~/.local/bin"), "/usr/local/bin", "/usr/bin", "/bin"]
        found = self.module.get_bin_path(name, required=False, opt_dirs=extra)
        if not found:
            self.module.fail_json(
                msg="agent-run (%s) was not found on this host, in PATH (%s) nor in %s; install it there (a "
                "static binary in ~/.local/bin, or the Debian package: see the collection's README) or give "
                "its path with binary:" % (name, os.environ.get("PATH", ""), ", ".join(extra)),
                id=self.module.params.get("id"), state="absent", final=False, cancelled=False, rc=None,
                reason=None,
            )
        return found

    def argv(self, *args):
        cmd = [self.binary]
        if self.root:
            cmd += ["--root", self.root]
        return cmd + list(args)

    def call(self, *args, token=None):
        """agent-run ARGS; with `token`, the lease token in its environment (start and renew only)."""
        env = {TOKEN_ENV: token} if token else None
        rc, out, err = self.module.run_command(self.argv(*args), errors="surrogate_or_replace", environ_update=env)
        return rc, out, err

    def renew(self, run_id, lease_ms, token):
        """agent-run renew RUN_ID [--lease]: (rc, out, err); a refusal (77) fails the task, saying why."""
        args = ["renew"] + self.json_flag() + [run_id] + (["--lease", "%dms" % lease_ms] if lease_ms else [])
        rc, out, err = self.call(*args, token=token)
        if rc == EXIT_NOPERM:
            self.fail("renew %s" % run_id, rc, out, err, run_id=run_id, hint=(
                "run %s was started with another lease token than this task's: by another controller user, "
                "with another ANSIBLE_HOME, by a collection older than the host's agent-run, or with another "
                "lease_token. Only its starter can renew it; give this task the lease_token that started it. "
                "Without renewals the host stops it when its lease expires" % run_id))
        return rc, out, err

    def fail(self, what, rc, out, err, hint=None, **extra):
        detail = first_error_line(err) or (out or "").strip()[:400] or "no message"
        msg = "agent-run %s failed on this host (exit %s): %s" % (what, rc, detail)
        if hint:
            msg += "; " + hint
        self.module.fail_json(msg=msg, agent_rc=rc, agent_stderr=err, agent_run=self.info(), **extra)

    def version(self):
        if self._version is None:
            rc, out, err = self.call("version", "--json")
            doc = parse_json_doc(out)
            if rc != 0 or not isinstance(doc, dict):
                self.module.fail_json(
                    msg="%s does not answer `version --json` (exit %s: %s): it is not agent-run, or one too old "
                    "for this collection; install a newer one (see the collection's README)"
                    % (self.binary, rc, first_error_line(err) or "no output"),
                    id=self.module.params.get("id"), state="absent", final=False, cancelled=False, rc=None,
                    reason=None,
                )
            self._version = doc
        return self._version

    def info(self):
        info = {"binary": self.binary}
        if self._version:
            info["version"] = self._version.get("version")
        if self.root:
            info["root"] = self.root
        return info

    def json_flag(self):
        """["--json"] when the host's agent-run has it on every subcommand (feature json_flag); [] for an
        older one, which prints JSON anyway when its stdout is not a terminal."""
        return ["--json"] if "json_flag" in (self.version().get("features") or []) else []

    def require(self, features):
        have = set(self.version().get("features") or [])
        missing = [f for f in features if f not in have]
        if missing:
            self.module.fail_json(
                msg="the agent-run at %s on this host (version %s) lacks what this task needs: %s; install a newer "
                "one (see the collection's README)" % (self.binary, self.version().get("version"), ", ".join(missing)),
                id=self.module.params.get("id"), state="absent", final=False, cancelled=False, rc=None,
                reason=None, agent_run=self.info(),
            )

    def status(self, run_id):
        """The run's `status --json` record, or None when there is no such run."""
        rc, out, err = self.call("status", "--json", run_id)
        doc = parse_json_doc(out)
        if rc == 69:
            return None
        if isinstance(doc, list):
            doc = doc[0] if doc else None
            if isinstance(doc, dict) and doc.get("state") is None and doc.get("error_exit_code") == 69:
                return None
        if rc != 0 or not isinstance(doc, dict) or doc.get("state") is None:
            self.fail("status %s" % run_id, rc, out, err, run_id=run_id)
        return doc

    def attempts(self, base):
        """Every attempt of `base` on the host, as {number: run_id}."""
        found = {}
        rc, out, err = self.call("list", "--json", "--label", "agentrun.id=" + base)
        doc = parse_json_doc(out)
        if rc != 0 or not isinstance(doc, list):
            self.fail("list", rc, out, err, id=base)
        for entry in doc:
            run_id = entry.get("run_id") if isinstance(entry, dict) else None
            n = attempt_number(base, run_id) if isinstance(run_id, str) else None
            if n:
                found[n] = run_id
        if 1 not in found:
            # A run named `base` that was not started by this collection (no label) still counts.
            if self.status(base) is not None:
                found[1] = base
        return found


def read_tail(dir_fd, name, limit):
    """The last `limit` bytes of run file `name` and its size, read without following symlinks or
    blocking on a FIFO (the workload can replace its own log files). (b"", 0, note) on trouble."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)
    except FileNotFoundError:
        return b"", 0, None
    except OSError as e:
        return b"", 0, "%s: cannot open it: %s" % (name, e.strerror)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return b"", 0, "%s is not a regular file: not read" % name
        size = st.st_size
        if limit <= 0:
            return b"", size, None
        start = max(0, size - limit)
        os.lseek(fd, start, os.SEEK_SET)
        chunks = []
        left = min(limit, size - start)
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks), size, None
    finally:
        os.close(fd)


def read_run_files(rec, limit):
    """stdout/stderr (their tails) and the lease length, from the run dir of record `rec`."""
    out = {"stdout": "", "stderr": "", "stdout_bytes": 0, "stderr_bytes": 0,
           "stdout_truncated": False, "stderr_truncated": False}
    notes = []
    lease_s = None
    run_dir = rec.get("run_dir")
    if not isinstance(run_dir, str):
        return out, lease_s, ["the record names no run_dir"]
    try:
        dfd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        return out, lease_s, ["cannot open the run dir %s: %s" % (run_dir, e.strerror)]
    try:
        for stream in ("stdout", "stderr"):
            data, size, note = read_tail(dfd, stream + ".log", limit)
            if note:
                notes.append(note)
            out[stream] = data.decode("utf-8", errors="replace")
            out[stream + "_bytes"] = size
            out[stream + "_truncated"] = size > len(data)
    finally:
        os.close(dfd)
    lease_s = lease_length(rec)
    out["stdout_lines"] = out["stdout"].splitlines()
    out["stderr_lines"] = out["stderr"].splitlines()
    return out, lease_s, notes


def lease_length(rec):
    """The run's lease length in seconds (lease.json's lease_s), or None."""
    run_dir = rec.get("run_dir")
    if not isinstance(run_dir, str):
        return None
    try:
        dfd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        data, _size, _note = read_tail(dfd, "lease.json", 65536)
    finally:
        os.close(dfd)
    lease = parse_json_doc(data.decode("utf-8", errors="replace"))
    if isinstance(lease, dict) and isinstance(lease.get("lease_s"), (int, float)) and lease["lease_s"] > 0:
        return float(lease["lease_s"])
    return None


def parse_time(text):
    if not isinstance(text, str):
        return None
    try:
        return datetime.datetime.strptime(text.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")
    except ValueError:
        try:
            return datetime.datetime.strptime(text.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S%z")
        except ValueError:
            return None


def human_duration(seconds):
    if seconds < 1:
        return "%dms" % round(seconds * 1000)
    if seconds < 60:
        return "%.1fs" % seconds
    m, s = divmod(int(seconds), 60)
    if m < 60:
        return "%dm %ds" % (m, s)
    h, m = divmod(m, 60)
    return "%dh %dm" % (h, m)


def summary(rec):
    """One line about the run, as a person would say it."""
    state = rec.get("state")
    run_id = rec.get("run_id")
    rc = rec.get("outcome_exit_code")
    started = parse_time(rec.get("started_at"))
    ended = parse_time(rec.get("ended_at"))
    took = ""
    if started and ended:
        took = " after %s" % human_duration((ended - started).total_seconds())
    if state == "finished":
        return "run %s: finished%s, exit %s" % (run_id, took, rc)
    if state == "cancelled":
        return "run %s: cancelled (%s)%s, exit %s" % (run_id, rec.get("reason"), took, rc)
    if state == "launch_failed":
        return "run %s: the command could not be started (%s), exit %s" % (run_id, rec.get("error"), rc)
    if state == "unknown":
        extra = ""
        survivors = (rec.get("cleanup") or {}).get("survivors") if isinstance(rec.get("cleanup"), dict) else None
        if survivors:
            extra = ", survivors %s" % survivors
        return "run %s: outcome unknown (%s%s), exit %s" % (run_id, rec.get("reason"), extra, rc)
    return "run %s: %s" % (run_id, state)


def result_from(rec, params, run_files=True):
    """The task result for record `rec` (a dict from status --json)."""
    res = {
        "run_id": rec.get("run_id"),
        "state": rec.get("state"),
        "reason": rec.get("reason"),
        "rc": rec.get("outcome_exit_code"),
        "final": rec.get("state") in FINAL_STATES,
        "cancelled": rec.get("state") == "cancelled",
        "cmd": rec.get("argv"),
        "start": rec.get("started_at"),
        "end": rec.get("ended_at"),
        "record": rec,
        "msg": summary(rec),
    }
    started = parse_time(rec.get("started_at"))
    if started:
        ended = parse_time(rec.get("ended_at")) or datetime.datetime.now(datetime.timezone.utc)
        res["delta"] = str(ended - started)
    lease_s = None
    if run_files:
        files, lease_s, notes = read_run_files(rec, params["max_output"])
        res.update(files)
        cut = [s for s in ("stdout", "stderr") if files[s + "_truncated"]]
        if cut:
            res["msg"] += "; %s truncated to the last %d bytes (the whole output is in %s on the host)" % (
                " and ".join(cut), params["max_output"], rec.get("run_dir"))
        if notes:
            res["run_file_notes"] = notes
    if lease_s is not None:
        res["lease_s"] = lease_s
    if res["state"] == "cancelled" and res["reason"] in ("timeout", "lease_expired"):
        if res["reason"] == "timeout":
            period = (rec.get("timeout_ms") or 0) / 1000.0
        else:
            period = lease_s if lease_s is not None else (duration_ms(params.get("lease"), "lease") or 0) / 1000.0
        res["timedout"] = {"period": period or True, "reason": res["reason"]}
    return res


def describe(rec_or_none, argv=None, run_id=None):
    """Diff text for a run's state."""
    if rec_or_none is None:
        return "run_id: %s\nstate: absent\n" % run_id
    lines = ["run_id: %s" % rec_or_none.get("run_id"), "state: %s" % rec_or_none.get("state")]
    if rec_or_none.get("reason"):
        lines.append("reason: %s" % rec_or_none.get("reason"))
    if rec_or_none.get("argv") is not None:
        lines.append("command: %s" % json.dumps(rec_or_none.get("argv")))
    return "\n".join(lines) + "\n"


def would_be(run_id, state, argv):
    lines = ["run_id: %s" % run_id, "state: %s" % state]
    if argv is not None:
        lines.append("command: %s" % json.dumps(argv))
    return "\n".join(lines) + "\n"


def drop_own_mark(root, base, token):
    """A cancel that came after this module had passed the fence (while it waited for the run)
    left a mark for this invocation, which no module will use: remove it, and the fence with its
    last mark. Best effort."""
    try:
        fence = Fence(root, base, MARK_WAIT_S, create=False)
    except (FenceError, OSError):
        return
    try:
        if not fence.missing:
            fence.consume(token)
    finally:
        fence.release()


def main():
    module = AnsibleModule(
        argument_spec=dict(
            id=dict(type="str", aliases=["run_id"]),
            argv=dict(type="list", elements="str"),
            cmd=dict(type="str"),
            executable=dict(type="str", default="/bin/sh"),
            chdir=dict(type="path", aliases=["cwd"]),
            env=dict(type="dict"),
            lease=dict(type="raw"),
            timeout=dict(type="raw"),
            grace=dict(type="raw"),
            labels=dict(type="dict"),
            state=dict(type="str", default="finished", choices=["finished", "started", "status", "cancelled"]),
            rerun=dict(type="str", default="stopped", choices=["stopped", "failed", "never"]),
            root=dict(type="path"),
            binary=dict(type="str", default="agent-run"),
            max_output=dict(type="int", default=65536),
            lease_token=dict(type="str", no_log=True),
            # Internal, set by the action plugin (not documented: not for playbooks).
            _labels=dict(type="dict"),  # the labels the action plugin adds
            _wait=dict(type="float"),  # state=finished: wait this long on the host, then report
            _collect=dict(type="str"),  # state=finished: report on this exact run (the wait is over)
            _changed=dict(type="bool", default=False),  # _collect: whether the start phase started it
            _token=dict(type="str", no_log=False),  # state=finished: this task invocation (the fence)
            _lease_token=dict(type="str", no_log=True),  # the run's lease token (lease_token, or the controller's)
            _poll=dict(type="str"),  # state=finished: renew this run and wait _wait (the plugin's poll, by module)
        ),
        mutually_exclusive=[("argv", "cmd")],
        supports_check_mode=True,
    )
    p = module.params
    base = p["id"]
    state = p["state"]
    # The token goes to start and renew through their environment only: not to any other call
    # (nor to the workload) from the task's own environment.
    os.environ.pop(TOKEN_ENV, None)
    token = p["_lease_token"] or p["lease_token"]

    def fail(msg, **kw):
        kw.setdefault("id", base)
        kw.setdefault("state", "absent")
        kw.setdefault("final", False)
        kw.setdefault("cancelled", False)
        kw.setdefault("rc", None)
        kw.setdefault("reason", None)
        module.fail_json(msg=msg, **kw)

    if not base:
        fail("id is required for state=%s (the action plugin derives one only for finished and started)" % state)
    if not RUN_ID_RE.match(base):
        fail("id %r is not a run id: 1 to 128 characters of A-Z a-z 0-9 . _ -, not starting with . or -" % base)
    if p["max_output"] < 0:
        fail("max_output must be 0 or more bytes, not %d" % p["max_output"])
    try:
        lease_ms = duration_ms(p["lease"], "lease")
        timeout_ms = duration_ms(p["timeout"], "timeout")
        grace_ms = duration_ms(p["grace"], "grace")
    except ValueError as e:
        fail(str(e))
    if timeout_ms == 0:
        fail("timeout must be above 0 (leave it out for no timeout)")
    if lease_ms == 0 and state != "started":
        fail("lease 0 (no lease) is only for state=started: a run the task waits for needs a lease, or a "
             "controller that dies would leave it running")

    ar = AgentRun(module)

    if p["_poll"]:
        # The plugin's poll where its connection cannot carry the token on stdin: renew, then wait.
        rc, _out, _err = ar.renew(p["_poll"], lease_ms, token)
        wait_ms = max(1, int(float(p["_wait"] or 1) * 1000))
        wrc, wout, _werr = ar.call("wait", "--timeout", "%dms" % wait_ms, "--json", p["_poll"])
        doc = parse_json_doc(wout)
        module.exit_json(changed=False, id=base, run_id=p["_poll"], renew_rc=rc, wait_rc=wrc,
                         final=bool(isinstance(doc, dict) and doc.get("final")))

    if p["_collect"]:
        rec = ar.status(p["_collect"])
        if rec is None:
            fail("run %s vanished from this host while the task waited for it" % p["_collect"], run_id=p["_collect"])
        res = result_from(rec, p)
        res.update(id=base, changed=p["_changed"], agent_run=ar.info(),
                   attempt=attempt_number(base, rec.get("run_id")))
        if not res["final"]:
            res["msg"] = "the wait for run %s ended before the run did (agent-run wait gave up): %s" % (
                rec.get("run_id"), res["msg"])
            module.fail_json(**res)
        if res["rc"] != 0:
            module.fail_json(**res)
        module.exit_json(failed=False, **res)

    # The fence (module_utils/fence.py): held from choosing the attempt until `start --detach` has
    # returned, so that a cancel of this id that does not know the run id yet (the plugin's, when
    # Ctrl-C or the task's timeout comes during this call) either finds the run by its label, or
    # has left its mark for this task invocation here first; then nothing is started.
    # The fence goes once the run exists, and at the latest when this module exits (a failure): its
    # file is removed then, unless it holds a mark.
    fence = None
    if state in ("finished", "started") and not module.check_mode:
        test_pause("fence", base)
        try:
            fence = Fence(p["root"], base, FENCE_WAIT_S)
            atexit.register(fence.release)
            cancelled_first = bool(p["_token"]) and fence.consume(p["_token"])
        except (FenceError, OSError) as e:
            fail("cannot take the fence of run id %s on this host: %s" % (base, e), agent_run=ar.info())
        if cancelled_first:
            fence.release()
            module.fail_json(
                msg="cancelled before it started: the controller cancelled this task (Ctrl-C, SIGTERM or the "
                "task's timeout) before its run existed on this host, so nothing was started; a rerun of the "
                "task starts it", id=base, run_id=None, state="absent", final=False, cancelled=True,
                not_started=True, rc=None, reason="cancel_request", changed=False, agent_run=ar.info())

    attempts = ar.attempts(base)
    newest_n = max(attempts) if attempts else None
    newest_id = attempts[newest_n] if newest_n else None
    rec = ar.status(newest_id) if newest_id else None
    if newest_id and rec is None:
        # Gone between list and status (gc): look again from the start.
        attempts = ar.attempts(base)
        newest_n = max(attempts) if attempts else None
        newest_id = attempts[newest_n] if newest_n else None
        rec = ar.status(newest_id) if newest_id else None

    argv = None
    if p["argv"] is not None:
        argv = [str(a) for a in p["argv"]]
        if not argv:
            fail("argv is empty: give the command and its arguments")
    elif p["cmd"] is not None:
        argv = [p["executable"], "-c", p["cmd"]]

    # ---- status and cancelled: never start anything -----------------------------------------
    if state == "status":
        if rec is None:
            fail("there is no run %s on this host%s" % (base, " under %s" % ar.root if ar.root else ""),
                 run_id=base, agent_run=ar.info())
        renewed = None
        if not module.check_mode and rec.get("state") not in FINAL_STATES and rec.get("lease_deadline_epoch"):
            rc, out, err = ar.renew(rec["run_id"], lease_ms, token)
            if rc == 0:
                renewed = last_line_json(out)
            elif rc != 69:  # 69: it became final meanwhile, or its wrapper is gone
                ar.fail("renew %s" % rec["run_id"], rc, out, err, run_id=rec["run_id"])
            rec = ar.status(rec["run_id"]) or rec
        res = result_from(rec, p)
        res.update(id=base, changed=False, renewed=renewed, agent_run=ar.info(), attempt=newest_n)
        module.exit_json(failed=False, **res)

    if state == "cancelled":
        if rec is None:
            module.exit_json(failed=False, changed=False, id=base, run_id=base, state="absent", final=False, cancelled=False,
                             rc=None, reason=None, msg="no run %s on this host: nothing to cancel" % base,
                             agent_run=ar.info())
        if rec.get("state") in FINAL_STATES:
            res = result_from(rec, p)
            res.update(id=base, changed=False, agent_run=ar.info(), attempt=newest_n)
            res["msg"] = "already final: " + res["msg"]
            module.exit_json(failed=False, **res)
        before = describe(rec)
        if module.check_mode:
            res = result_from(rec, p)
            res.update(id=base, changed=True, agent_run=ar.info(), attempt=newest_n,
                       msg="would cancel run %s (%s)" % (rec.get("run_id"), rec.get("state")))
            if module._diff:
                res["diff"] = dict(before=before, after=would_be(rec.get("run_id"), "cancelled", rec.get("argv")))
            module.exit_json(failed=False, **res)
        rc, out, err = ar.call("cancel", "--json", rec["run_id"])
        if rc not in (0, 75):
            ar.fail("cancel %s" % rec["run_id"], rc, out, err, run_id=rec["run_id"])
        rec = ar.status(rec["run_id"]) or rec
        res = result_from(rec, p)
        res.update(id=base, changed=True, agent_run=ar.info(), attempt=newest_n)
        if module._diff:
            res["diff"] = dict(before=before, after=describe(rec))
        if rec.get("state") not in ("cancelled", "finished", "launch_failed"):
            res["msg"] = "cancel did not confirm the end of the run: " + res["msg"]
            module.fail_json(**res)
        module.exit_json(failed=False, **res)

    # ---- finished and started ------------------------------------------------------------------
    rerun = p["rerun"]
    start_id = None
    attempt = newest_n
    if rec is None:
        start_id = base
        attempt = 1
    elif rec.get("state") in FINAL_STATES and argv is not None and rerun != "never" and (
        rec.get("state") in STOPPED_STATES
        or (rerun == "failed" and (rec.get("state") == "unknown" or rec.get("outcome_exit_code") not in (0, None)))
    ):
        attempt = newest_n + 1
        start_id = "%s.r%d" % (base, attempt)
        if not RUN_ID_RE.match(start_id):
            fail("id %s is too long for another attempt (%s is over 128 characters): give a shorter id"
                 % (base, start_id))
    if start_id is not None and argv is None:
        if rec is None:
            fail("there is no run %s on this host to wait for: give argv or cmd to start it" % base,
                 agent_run=ar.info())
        start_id = None  # a stopped run and no command to run again: report it as it is

    if start_id is None:
        # The run exists: replay it (final), or wait for it (active). Same command, if one is given.
        if argv is not None and module.check_mode and rec.get("argv_b64") is None and rec.get("argv") != argv:
            fail("run %s exists on this host with a different command (%s, not %s): the task would fail"
                 % (rec["run_id"], json.dumps(rec.get("argv")), json.dumps(argv)),
                 run_id=rec["run_id"], record=rec, agent_run=ar.info())
        if argv is not None and not module.check_mode:
            # `start -d` of an existing id never runs anything; it refuses a different command (65).
            rc, out, err = ar.call("start", "-d", *ar.json_flag(), rec["run_id"], "--", *argv)
            if rc == 65:
                fail("run %s exists on this host with a different command (%s, not %s): give the task another id, "
                     "or cancel and remove the old run" % (rec["run_id"], json.dumps(rec.get("argv")), json.dumps(argv)),
                     run_id=rec["run_id"], record=rec, agent_run=ar.info())
        run_id = rec["run_id"]
        changed = False
    else:
        run_id = start_id
        changed = True
        if module.check_mode:
            res = dict(changed=True, id=base, run_id=run_id, state="absent", final=False, cancelled=False, rc=None,
                       reason=None, attempt=attempt, agent_run=ar.info(),
                       msg="would start run %s: %s" % (run_id, json.dumps(argv)))
            if rec is not None:
                res["msg"] += " (attempt %d: %s)" % (attempt, summary(rec))
            if module._diff:
                res["diff"] = dict(before=describe(None, run_id=run_id),
                                   after=would_be(run_id, "running", argv))
            module.exit_json(failed=False, **res)
        needed = list(NEEDED_ALWAYS) + [feat for opt, feat in NEEDED_FOR.items() if p.get(opt) is not None
                                        and (opt != "timeout" or timeout_ms)]
        ar.require(needed)
        args = ["start", "--detach"] + ar.json_flag()
        if lease_ms is None:
            lease_ms = 60000
        if lease_ms:
            args += ["--lease", "%dms" % lease_ms]
        if timeout_ms:
            args += ["--timeout", "%dms" % timeout_ms]
        if grace_ms is not None:
            args += ["--grace", "%dms" % grace_ms]
        if p["chdir"]:
            args += ["--cwd", p["chdir"]]
        for k, v in sorted((p["env"] or {}).items()):
            args += ["--env", "%s=%s" % (k, "" if v is None else v)]
        labels = dict(p["_labels"] or {})
        labels.update(p["labels"] or {})
        labels["agentrun.id"] = base
        for k, v in sorted(labels.items()):
            args += ["--label", "%s=%s" % (k, "" if v is None else v)]
        args += [run_id, "--"] + argv
        test_pause("start", base)
        rc, out, err = ar.call(*args, token=token if lease_ms else None)
        line = last_line_json(out)
        if not isinstance(line, dict) or line.get("run_id") != run_id:
            if rc == 65:
                fail("run %s exists on this host with a different command: give the task another id" % run_id,
                     run_id=run_id, agent_run=ar.info())
            ar.fail("start %s" % run_id, rc, out, err, run_id=run_id, id=base, state="absent", final=False,
                    cancelled=False, rc=None, reason=None)
    if fence is not None:
        # The run exists now (running or final, labelled agentrun.id=<id>): a cancel by label finds it.
        fence.release()
        try:
            sweep(p["root"])
        except (FenceError, OSError):
            pass

    if module.check_mode:
        res = result_from(rec, p)
        res.update(id=base, changed=False, agent_run=ar.info(), attempt=attempt)
        if res["final"]:
            res["msg"] = "would replay: " + res["msg"]
        else:
            res["msg"] = "would wait for: " + res["msg"] if state == "finished" else res["msg"]
        if res["final"] and res["rc"] != 0 and state == "finished":
            module.fail_json(**res)
        module.exit_json(failed=False, **res)

    before = describe(rec) if not changed else describe(None, run_id=run_id)
    rec = ar.status(run_id)
    if rec is None:
        fail("run %s vanished from this host right after it was started" % run_id, run_id=run_id)
    if state == "finished" and p["_wait"] and rec.get("state") not in FINAL_STATES:
        # The controller asked just now, so it is alive: renew a run found active (a run started by
        # an earlier task), then wait here for at most a third of the lease, never longer.
        own_lease_s = lease_length(rec)
        if not changed and rec.get("lease_deadline_epoch"):
            rc, _out, _err = ar.renew(run_id, lease_ms, token)
            if rc == 0 and lease_ms:
                own_lease_s = lease_ms / 1000.0
        wait_s = float(p["_wait"])
        if own_lease_s:
            wait_s = min(wait_s, own_lease_s / 3.0)
        rc, out, err = ar.call("wait", "--timeout", "%dms" % max(1, int(wait_s * 1000)), "--json", run_id)
        if rc in (64, 77, 78) and parse_json_doc(out) is None:
            ar.fail("wait %s" % run_id, rc, out, err, run_id=run_id)
        rec = ar.status(run_id) or rec
    if state == "finished" and p["_token"]:
        drop_own_mark(p["root"], base, p["_token"])
    res = result_from(rec, p)
    res.update(id=base, changed=changed, agent_run=ar.info(), attempt=attempt)
    if module._diff and changed:
        res["diff"] = dict(before=before, after=describe(rec))
    if res["final"] and res["rc"] != 0:
        module.fail_json(**res)
    module.exit_json(failed=False, **res)


if __name__ == "__main__":
    main()

# -*- coding: utf-8 -*-
# Copyright: agent-run developers
# SPDX-License-Identifier: MIT OR Apache-2.0
"""The per-id fence on the host: what makes a cancel that comes before the run exists stick.

The action plugin learns the run id only when the module's first call returns; a Ctrl-C or a task
`timeout:` during that call can only cancel by label (`agentrun.id=BASE`), and the module, still
running on the host, could create the run after that cancel returned. So:

- the module takes an exclusive flock of `<root>/.ansible-fence.<BASE>` before it chooses the
  attempt and keeps it until `agent-run start --detach` has returned (the run exists then, with
  its label). Under the lock it first looks for a cancel mark of its own token (a random token
  the plugin gives each task invocation); if there is one, it starts nothing, removes the mark
  and reports the task cancelled, not started;
- the plugin's cancel, when it does not know the run id, runs this file on the host
  (`python -c SOURCE ROOT BASE TOKEN -- agent-run ... cancel --label agentrun.id=BASE`): under
  the same lock it writes the mark for the token, then cancels by label whatever exists, and
  only then lets the lock go.

Either the module had the lock first, and its run exists and is cancelled by the label; or the
cancel had it first, and the module finds the mark. A later invocation of the task (a rerun) has
another token and is not refused. Marks whose module never came (it had passed already, or was
never sent) are dropped after a day, and at most 256 are kept.

A fence lives only while it is needed: whoever lets it go with no mark left in it (the module
once `start --detach` has returned, or once it has used up its own mark) removes the file,
under the lock. So a run root keeps no fence of a run that `agent-run gc` removed. The removal
is safe against other playbooks: a process that waited for the lock of the removed file finds,
once it has the lock, that the path no longer names the file it locked, and starts again with
the file that is there now (or a new one). Whoever holds the lock of the file at the path holds
the fence. A fence left by a cancel whose module never came (its marks only) goes once its
newest mark is a day old: the module's sweep removes it (`sweep`).

The root is the user's run root, writable by every run of the user (hostile ground, see the
contract): the root must be a directory of ours that is not a symlink nor group or world
writable; the fence file is opened without following symlinks or blocking (O_NOFOLLOW,
O_NONBLOCK), must be a regular file of ours with one link (a FIFO, a symlink or a hard link to
another file is refused, never written), mode 0600, read with a cap. Names starting with `.` are
never run dirs (run ids do not start with `.`), and agent-run skips them.

Only the Python standard library: the module imports this file, and the plugin sends it as is.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time

PREFIX = ".ansible-fence."
MARKS_CAP = 64 * 1024
KEEP_S = 86400.0
KEEP_N = 256
RUN_ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
TOKEN_RE = re.compile(r"^[0-9a-f]{32}$")


class FenceError(Exception):
    pass


class _Timeout(BaseException):
    pass


def root_path(root):
    """The run root as agent-run resolves it: `root`, else $AGENT_RUN_ROOT, else ~/.agent-runs."""
    if root:
        path = os.path.expanduser(root)
    elif os.environ.get("AGENT_RUN_ROOT"):
        path = os.environ["AGENT_RUN_ROOT"]
    elif os.environ.get("HOME"):
        path = os.path.join(os.environ["HOME"], ".agent-runs")
    else:
        raise FenceError("neither root, AGENT_RUN_ROOT nor HOME is set")
    return os.path.abspath(path)


def _check_dir(st, path):
    if not stat.S_ISDIR(st.st_mode):
        raise FenceError("the run root %s is not a directory (or is a symlink)" % path)
    if st.st_uid != os.geteuid():
        raise FenceError("the run root %s is not owned by uid %d" % (path, os.geteuid()))
    if st.st_mode & 0o022:
        raise FenceError("the run root %s is group or world writable" % path)


def _open_root(path):
    try:
        os.lstat(path)
    except FileNotFoundError:
        try:
            os.makedirs(path, 0o700, exist_ok=True)
        except OSError as e:
            raise FenceError("cannot create the run root %s: %s" % (path, e.strerror))
    try:
        dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise FenceError("cannot open the run root %s: %s" % (path, e.strerror))
    try:
        _check_dir(os.fstat(dfd), path)
    except FenceError:
        os.close(dfd)
        raise
    return dfd


class Fence(object):
    """The fence of run id `base` under `root`, locked (exclusive flock) for the object's life.

    With `create=False` a missing fence is not made: `missing` is true then, and nothing is
    held."""

    def __init__(self, root, base, wait_s, create=True):
        if not RUN_ID_RE.match(base or ""):
            raise FenceError("%r is not a run id" % (base,))
        self.path = os.path.join(root_path(root), PREFIX + base)
        self.name = os.path.basename(self.path)
        self.fd = None
        self.missing = False
        self.dfd = _open_root(os.path.dirname(self.path))
        try:
            deadline = time.monotonic() + wait_s
            while self.fd is None:
                fd = self._open(create)
                if fd is None:
                    self.missing = True
                    return
                try:
                    self._lock(fd, max(0.001, deadline - time.monotonic()))
                    if _names(self.dfd, self.name, fd):
                        self._check(fd)
                        self.fd = fd
                        break
                except BaseException:
                    os.close(fd)
                    raise
                # Removed (or replaced) while we waited for its lock: the fence is whatever the
                # path names now.
                os.close(fd)
                if time.monotonic() >= deadline:
                    raise FenceError("%s kept changing for %gs" % (self.path, wait_s))
        except BaseException:
            os.close(self.dfd)
            self.dfd = None
            raise

    def _open(self, create):
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        if create:
            flags |= os.O_CREAT
        try:
            return os.open(self.name, flags, 0o600, dir_fd=self.dfd)
        except FileNotFoundError:
            if create:
                raise FenceError("cannot open %s: it vanished as it was made" % self.path)
            return None
        except OSError as e:
            raise FenceError("cannot open %s: %s" % (self.path, e.strerror))

    def _check(self, fd):
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
            raise FenceError("%s is not a regular file of ours with one link: not used" % self.path)
        if stat.S_IMODE(st.st_mode) != 0o600:
            os.fchmod(fd, 0o600)

    def _lock(self, fd, wait_s):
        """Blocks for the lock (a waiter the kernel shows in /proc/locks), at most wait_s."""

        def expired(_signum, _frame):
            raise _Timeout()

        old = signal.signal(signal.SIGALRM, expired)
        try:
            signal.setitimer(signal.ITIMER_REAL, wait_s)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _Timeout:
            raise FenceError("%s is held by another process for more than %gs" % (self.path, wait_s))
        finally:
            signal.signal(signal.SIGALRM, old)

    def _read(self):
        chunks = []
        size = 0
        os.lseek(self.fd, 0, os.SEEK_SET)
        while size <= MARKS_CAP:
            b = os.read(self.fd, MARKS_CAP + 1 - size)
            if not b:
                break
            chunks.append(b)
            size += len(b)
        if size > MARKS_CAP:
            return {}
        try:
            doc = json.loads(b"".join(chunks).decode("utf-8"))
        except ValueError:
            return {}
        marks = doc.get("cancelled") if isinstance(doc, dict) else None
        if not isinstance(marks, dict):
            return {}
        return dict((k, v) for k, v in marks.items()
                    if isinstance(k, str) and TOKEN_RE.match(k) and isinstance(v, (int, float)))

    def _write(self, marks):
        data = (json.dumps({"cancelled": _kept(marks)}, sort_keys=True) + "\n").encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def mark(self, token):
        """The cancel side: the task invocation `token` is cancelled."""
        if not TOKEN_RE.match(token or ""):
            raise FenceError("%r is not a token" % (token,))
        marks = self._read()
        marks[token] = time.time()
        self._write(marks)

    def consume(self, token):
        """The module's side: whether `token` was cancelled (the mark is removed then)."""
        if self.fd is None:
            return False
        marks = self._read()
        if token not in marks:
            return False
        del marks[token]
        self._write(marks)
        return True

    def release(self):
        """Let the fence go, and remove its file when no live mark is left in it. The removal
        is done under the lock: a process waiting for it finds the path changed and starts
        again (see __init__)."""
        if self.fd is None:
            self.close()
            return
        try:
            marks = self._read()
            kept = _kept(marks)
            if not kept:
                os.unlink(self.name, dir_fd=self.dfd)
            elif kept != marks:
                self._write(kept)
        except OSError:
            pass  # best effort: the file stays, the lock goes
        finally:
            self.close()

    def close(self):
        if self.fd is not None:
            os.close(self.fd)  # the lock goes with the last descriptor of the open file
            self.fd = None
        if self.dfd is not None:
            os.close(self.dfd)
            self.dfd = None


def _kept(marks):
    """The marks still kept: younger than KEEP_S, the newest KEEP_N."""
    now = time.time()
    kept = sorted(((t, k) for k, t in marks.items() if now - t < KEEP_S), reverse=True)[:KEEP_N]
    return dict((k, t) for t, k in kept)


def _names(dfd, name, fd):
    """Whether `name` in directory `dfd` is still the file open as `fd`."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def sweep(root, limit=64):
    """Remove the fences under `root` that nobody holds and that nobody wrote for KEEP_S (so
    every mark in them has expired): those of cancels whose module never came. Best effort;
    at most `limit` of them a call. Returns how many were removed."""
    removed = 0
    dfd = _open_root(root_path(root))
    try:
        names = [n for n in os.listdir(dfd) if n.startswith(PREFIX)]
        now = time.time()
        for name in names:
            if removed >= limit:
                break
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
            except OSError:
                continue
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or now - st.st_mtime < KEEP_S:
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # held: in use
                if _names(dfd, name, fd):
                    os.unlink(name, dir_fd=dfd)
                    removed += 1
            except OSError:
                continue
            finally:
                os.close(fd)
    finally:
        os.close(dfd)
    return removed


def main(argv):
    """python -c SOURCE ROOT BASE TOKEN -- CANCEL-COMMAND...: mark, then cancel under the lock."""
    if len(argv) < 5 or argv[4] != "--":
        sys.stderr.write("usage: fence ROOT BASE TOKEN -- COMMAND...\n")
        return 64
    root, base, token, command = argv[1], argv[2], argv[3], argv[5:]
    fence = None
    marked = False
    try:
        fence = Fence(root or None, base, 30.0)
        fence.mark(token)
        marked = True
    except (FenceError, OSError) as e:
        # Still cancel what exists; the caller learns that the mark is not there.
        sys.stderr.write("agentrun fence: %s\n" % e)
        if fence is not None:
            fence.close()
            fence = None
    try:
        rc = subprocess.call(command) if command else 0
    except OSError as e:
        sys.stderr.write("agentrun fence: cannot run %s: %s\n" % (command[0], e.strerror))
        rc = 127 if e.errno == errno.ENOENT else 126
    finally:
        if fence is not None:
            fence.close()  # the mark stays for the module: its file too
    return rc if marked or rc else 70


if __name__ == "__main__":
    sys.exit(main(sys.argv))

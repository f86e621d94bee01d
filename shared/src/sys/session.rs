//! What a `pre_exec` closure may call: a new session, its controlling terminal, descriptors marked close-on-exec. All async-signal-safe.

use super::*;

/// In a forked child before exec: start a new session (setsid(2), one raw syscall in rustix's
/// backend). Async-signal-safe.
pub(super) fn child_setsid() -> io::Result<()> {
    rustix::process::setsid()?;
    Ok(())
}

/// Make `cmd` start its program in a new session with a clean signal state and no inherited
/// descriptor above stderr (the detached wrapper; the workload has
/// [`crate::spawn::spawn_workload`]). The `pre_exec` closure calls only async-signal-safe
/// functions: sigaction, sigprocmask, setsid and close_range.
pub fn spawn_in_new_session(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let signals = nondefault_signals();
    // SAFETY: the closure runs in the forked child before exec; it allocates nothing, takes no
    // lock and calls only the async-signal-safe syscalls above (signal-safety(7)).
    unsafe {
        cmd.pre_exec(move || {
            child_reset_signals(signals)?;
            child_setsid()?;
            child_cloexec_from_3()
        });
    }
}

/// In a forked child before exec, after setsid: make the terminal on `fd` this session's
/// controlling terminal (ioctl TIOCSCTTY, tty_ioctl(4)), so the workload's session owns it:
/// a hangup of the pty (its master closed) sends SIGHUP to the session's foreground group and
/// its leader, and `tty`, job control and `/dev/tty` work as in a terminal. Async-signal-safe:
/// one ioctl(2).
pub fn child_set_ctty(fd: RawFd) -> io::Result<()> {
    // SAFETY: TIOCSCTTY takes an integer argument (0: do not steal a terminal that is already
    // some other session's); no memory is passed.
    if unsafe { libc::ioctl(fd, libc::TIOCSCTTY, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `CLOSE_RANGE_CLOEXEC` (linux/close_range.h, kernel 5.11+).
pub(super) const CLOSE_RANGE_CLOEXEC: libc::c_uint = 4;

/// In a forked child before exec: mark every descriptor above stderr close-on-exec
/// (close_range(2) with CLOSE_RANGE_CLOEXEC), so no descriptor the wrapper inherited leaks
/// into the workload, while std's exec-error pipe still works. Async-signal-safe: one
/// syscall.
pub(super) fn child_cloexec_from_3() -> io::Result<()> {
    // SAFETY: close_range takes integers only.
    let r = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC) };
    if r < 0 {
        let e = io::Error::last_os_error();
        // Kernels before 5.11 lack the flag: every fd we open is O_CLOEXEC anyway.
        if e.raw_os_error() == Some(libc::EINVAL) || e.raw_os_error() == Some(libc::ENOSYS) {
            return Ok(());
        }
        return Err(e);
    }
    Ok(())
}

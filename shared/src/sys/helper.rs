//! A forked helper without an exec (the output keeper): its session, descriptors, signals and title.

use super::*;

/// Whether this process has exactly one thread (`Threads:` of /proc/self/status): what
/// [`fork_helper`] requires of its caller. `None` when it cannot be read.
pub fn single_threaded() -> Option<bool> {
    let status = read_kernel_file("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Threads:"))?;
    Some(line["Threads:".len()..].trim() == "1")
}

/// Fork a helper that runs `body` and exits with what it returns, never returning here (the
/// output keeper: no exec, so no second program load on the launch's path).
///
/// The child starts a new session (setsid), has stdin, stdout and stderr on `null`, holds no
/// descriptor above stderr but those in `keep` (every other one is closed), has every signal at
/// its default action except `ignore` (SIG_IGN), an empty signal mask, `name` as its comm
/// (truncated to 15 bytes) and `title` as its /proc/PID/cmdline (written over the wrapper's
/// argument strings in place, cut to fit, the rest of them zeroed). Then it runs `body` and
/// `_exit`s with its code (no atexit handler, no flush of buffers copied from the parent). In
/// the parent `body` is dropped unrun (so what it owns is closed there) and the child's pid
/// returned. `reset` is the set of signals whose action is not the default here
/// ([`nondefault_signals`], read after the caller's last change of one): the child resets
/// those.
///
/// The caller must be single-threaded (checked in debug builds): the child of a fork runs
/// ordinary Rust code (allocations, locks, threads of its own), which is sound only when no
/// other thread of the parent could have held a lock at the fork.
pub fn fork_helper<F: FnOnce() -> u8>(
    keep: &[RawFd],
    null: BorrowedFd<'_>,
    ignore: &[Sig],
    reset: u64,
    name: &std::ffi::CStr,
    title: &[&[u8]],
    body: F,
) -> io::Result<Pid> {
    debug_assert_eq!(
        single_threaded(),
        Some(true),
        "fork_helper needs a single-threaded caller"
    );
    // Every signal stays blocked from before the fork until the child has reset the actions:
    // no handler of the parent's (signal-hook's, writing to the parent's pipe) runs in it.
    let signals = reset;
    let old_mask = block_all_signals();
    // SAFETY: fork(2) through the C library (glibc's atfork handlers reset malloc and the
    // thread's cached state; musl's fork does as much for its own); the caller is
    // single-threaded, so the child's copy of every lock is unheld and it may run any code.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let code = match helper_setup(keep, null.as_raw_fd(), signals, ignore, name, title) {
            Ok(()) => body(),
            Err(_) => 70,
        };
        // SAFETY: _exit(2) ends the process at once; nothing of ours needs to run after.
        unsafe { libc::_exit(code.into()) }
    }
    let err = io::Error::last_os_error();
    set_signal_mask(&old_mask);
    drop(body);
    if pid < 0 {
        return Err(err);
    }
    Ok(Pid::new(pid.into()).expect("fork returns the child's positive pid"))
}

/// The child half of [`fork_helper`], before its body: session, stdio, descriptors,
/// signals, name and title.
pub(super) fn helper_setup(
    keep: &[RawFd],
    null: RawFd,
    signals: u64,
    ignore: &[Sig],
    name: &std::ffi::CStr,
    title: &[&[u8]],
) -> io::Result<()> {
    rustix::process::setsid()?;
    for fd in 0..3 {
        // SAFETY: dup2(2) of two integers; `null` is open (the parent holds it).
        if unsafe { libc::dup2(null, fd) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    close_all_but(keep)?;
    // Every action back to its default (the parent's handlers are not ours), then the
    // ignored ones, then the mask emptied.
    child_reset_signals_keep_mask(signals);
    for &sig in ignore {
        // SAFETY: installing SIG_IGN touches no memory of ours.
        unsafe { libc::signal(sig.number(), libc::SIG_IGN) };
    }
    // SAFETY: an empty set built on the stack.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        // PR_SET_NAME copies at most 16 bytes of the string (NUL included).
        libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0);
    }
    set_title(title);
    Ok(())
}

/// Close every descriptor above stderr but those in `keep` (close_range(2) over the gaps;
/// before 5.9, the numbers /proc/self/fd lists).
pub(super) fn close_all_but(keep: &[RawFd]) -> io::Result<()> {
    let mut keep: Vec<u32> = keep.iter().filter(|&&f| f > 2).map(|&f| f as u32).collect();
    keep.sort_unstable();
    // The gaps between the kept numbers, the last one open-ended.
    let mut ranges = Vec::new();
    let mut from = 3u32;
    for &k in &keep {
        if k > from {
            ranges.push((from, k - 1));
        }
        from = k.saturating_add(1);
    }
    ranges.push((from, u32::MAX));
    for (lo, hi) in &ranges {
        // SAFETY: close_range takes integers only; no descriptor in range is one Rust
        // code in this process will use again (the child runs only its body, which owns
        // exactly the descriptors in `keep`).
        let r = unsafe { libc::syscall(libc::SYS_close_range, *lo, *hi, 0u32) };
        if r < 0 {
            if errno() != libc::ENOSYS {
                return Err(io::Error::last_os_error());
            }
            let open: Vec<u32> = std::fs::read_dir("/proc/self/fd")?
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect();
            for fd in open {
                if fd > 2 && keep.binary_search(&fd).is_err() {
                    // SAFETY: as above; EBADF (the listing's own descriptor) is harmless.
                    unsafe { libc::close(fd as i32) };
                }
            }
            return Ok(());
        }
    }
    Ok(())
}

/// Write `words` (NUL-separated) over this process's argument strings, the range
/// [arg_start, arg_end) of /proc/self/stat (fields 48 and 49), so /proc/PID/cmdline and ps
/// show them. Cut to fit; the rest of the range is zeroed. Nothing happens when the range
/// cannot be read.
pub(super) fn set_title(words: &[&[u8]]) {
    let Ok(stat) = read_kernel_file("/proc/self/stat") else {
        return;
    };
    // Fields after the command name, which is in parentheses and may hold anything.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
        return;
    };
    // `rest` starts at field 3 (state): field N is rest's N-3.
    let f: Vec<&str> = rest.split_whitespace().collect();
    let (Some(start), Some(end)) = (
        f.get(48 - 3).and_then(|v| v.parse::<usize>().ok()),
        f.get(49 - 3).and_then(|v| v.parse::<usize>().ok()),
    ) else {
        return;
    };
    if start == 0 || end <= start || end - start > (1 << 20) {
        return;
    }
    let len = end - start;
    let mut bytes = Vec::with_capacity(len);
    for w in words {
        bytes.extend_from_slice(w);
        bytes.push(0);
    }
    bytes.resize(len, 0);
    bytes[len - 1] = 0;
    // SAFETY: [start, end) is this process's argument area on its initial stack, mapped
    // writable and ours (the kernel reports it from mm->arg_start/arg_end); we are the only
    // thread, and the only other reader, std's copy of the argv pointers, reads NUL-
    // terminated strings from it, which it still holds (the last byte is NUL).
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), start as *mut u8, len) };
}

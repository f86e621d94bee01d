//! The exec of the workload as execvp(3) does it, prepared before the clone ([`Exec`]), and the child's steps from its clone to that exec: async-signal-safe only.

use super::*;

/// The shell execvp(3) hands a file to when the kernel cannot execute it (ENOEXEC).
pub(super) const BSHELL: &std::ffi::CStr = c"/bin/sh";

/// execvp(3)'s search path when the environment has no PATH (glibc's `_CS_PATH`).
pub(super) const DEFAULT_PATH: &[u8] = b"/bin:/usr/bin";

/// Everything the workload's exec needs, prepared before the clone so that the child only
/// reads memory: argv and envp as C strings with their pointer arrays, the paths to try in
/// order, the working directory.
///
/// The program is found as std's `Command` finds it (execvp(3) in the child, glibc's rules):
/// a name with a `/` is executed as it is; any other is tried in each entry of the PATH of the
/// workload's own environment (`/bin:/usr/bin` without one; an empty entry is the working
/// directory), skipping entries that answer ENOENT, ENOTDIR, EACCES (remembered: reported
/// when nothing else ran), ESTALE, ENODEV or ETIMEDOUT, and stopping at any other error. A
/// file the kernel cannot execute (ENOEXEC) is run by `/bin/sh`, as execvp does.
pub struct Exec {
    _strings: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    /// The paths execve(2) is tried with, in order.
    candidates: Vec<CString>,
    /// For each candidate, the argv of `/bin/sh CANDIDATE ARGS...` (the ENOEXEC fallback).
    sh_argvs: Vec<Vec<*const libc::c_char>>,
    /// Whether `candidates` come from a PATH search (the skip rules apply).
    search: bool,
    cwd: Option<CString>,
    /// The errno the exec fails with before any attempt: an empty name (ENOENT), a name
    /// longer than NAME_MAX (ENAMETOOLONG).
    early: Option<i32>,
}

impl Exec {
    /// `argv[0]` is the program; `env` is the workload's whole environment, in order.
    pub fn new(
        argv: &[std::ffi::OsString],
        env: &[(std::ffi::OsString, std::ffi::OsString)],
        cwd: Option<&std::path::Path>,
    ) -> io::Result<Exec> {
        use std::os::unix::ffi::OsStrExt;
        let nul = || {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "nul byte found in provided data",
            )
        };
        let c = |b: Vec<u8>| CString::new(b).map_err(|_| nul());
        let program = argv
            .first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no command"))?
            .as_bytes();
        let mut strings = Vec::with_capacity(argv.len() + env.len());
        for a in argv {
            strings.push(c(a.as_bytes().to_vec())?);
        }
        let mut path = None;
        for (k, v) in env {
            let mut kv = Vec::with_capacity(k.len() + v.len() + 1);
            kv.extend_from_slice(k.as_bytes());
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            strings.push(c(kv)?);
            if k.as_bytes() == b"PATH" {
                path = Some(v.as_bytes());
            }
        }
        let ptrs = |s: &[CString]| -> Vec<*const libc::c_char> {
            s.iter()
                .map(|s| s.as_ptr())
                .chain([std::ptr::null()])
                .collect()
        };
        // The C strings' buffers are their own heap allocations: the pointers stay valid
        // while `strings` lives, wherever the vector moves.
        let argv_ptrs = ptrs(&strings[..argv.len()]);
        let envp_ptrs = ptrs(&strings[argv.len()..]);
        let (mut candidates, mut search, mut early) = (Vec::new(), false, None);
        if program.is_empty() {
            early = Some(libc::ENOENT);
        } else if program.contains(&b'/') {
            candidates.push(c(program.to_vec())?);
        } else if program.len() > 255 {
            early = Some(libc::ENAMETOOLONG);
        } else {
            search = true;
            for dir in path.unwrap_or(DEFAULT_PATH).split(|&b| b == b':') {
                let mut p = Vec::with_capacity(dir.len() + 1 + program.len());
                if !dir.is_empty() {
                    p.extend_from_slice(dir);
                    p.push(b'/');
                }
                p.extend_from_slice(program);
                candidates.push(c(p)?);
            }
        }
        let sh_argvs = candidates
            .iter()
            .map(|cand| {
                [BSHELL.as_ptr(), cand.as_ptr()]
                    .into_iter()
                    .chain(argv_ptrs[1..].iter().copied())
                    .collect()
            })
            .collect();
        let cwd = cwd
            .map(|d| c(d.as_os_str().as_bytes().to_vec()))
            .transpose()?;
        Ok(Exec {
            _strings: strings,
            argv: argv_ptrs,
            envp: envp_ptrs,
            candidates,
            sh_argvs,
            search,
            cwd,
            early,
        })
    }
}

/// The workload's child, from the clone to the exec: never returns. It execs, or writes the
/// step that failed and its errno to the report pipe and `_exit`s 127.
///
/// # Safety
///
/// Only in the process just made by [`clone3`] or [`fork`], before anything else ran in
/// it, with every signal blocked. It allocates nothing, takes no lock, cannot panic and
/// calls only async-signal-safe functions (signal-safety(7)): dup2, fcntl, chdir,
/// rt_sigaction, sigprocmask, setsid, ioctl, write, close_range, execve, _exit.
pub(super) unsafe fn child(plan: &ChildPlan<'_>) -> ! {
    let (step, errno) = child_steps(plan);
    let s = (step as u32).to_ne_bytes();
    let e = (errno as u32).to_ne_bytes();
    let msg = [s[0], s[1], s[2], s[3], e[0], e[1], e[2], e[3]];
    // SAFETY: write(2) of a buffer on our stack to the report pipe (8 bytes: one atomic
    // pipe write), then _exit(2), which runs no handler of ours and flushes nothing.
    unsafe {
        libc::write(plan.report, msg.as_ptr().cast(), msg.len());
        libc::_exit(127)
    }
}

/// The child's steps in order; returns only on a failure, with its step and errno.
pub(super) fn child_steps(plan: &ChildPlan<'_>) -> (ChildStep, i32) {
    let os = |e: io::Error| e.raw_os_error().unwrap_or(libc::EIO);
    for (src, dst) in plan.stdio {
        let Some(src) = src else { continue };
        // SAFETY: dup2(2) and fcntl(2) take numbers; both are async-signal-safe. A source
        // already at its number keeps it, without its close-on-exec flag.
        let r = unsafe {
            if src == dst {
                libc::fcntl(src, libc::F_SETFD, 0)
            } else {
                loop {
                    let r = libc::dup2(src, dst);
                    if r >= 0 || errno() != libc::EINTR {
                        break r;
                    }
                }
            }
        };
        if r < 0 {
            return (ChildStep::Stdio, errno());
        }
    }
    if let Some(cwd) = &plan.exec.cwd {
        // SAFETY: chdir(2) reads a C string prepared before the clone.
        if unsafe { libc::chdir(cwd.as_ptr()) } != 0 {
            return (ChildStep::Cwd, errno());
        }
    }
    if let Err(e) = child_reset_signals(plan.signals) {
        return (ChildStep::Signals, os(e));
    }
    if let Err(e) = child_setsid() {
        return (ChildStep::Setsid, os(e));
    }
    if let Some(fd) = plan.ctty {
        if let Err(e) = child_set_ctty(fd) {
            return (ChildStep::Ctty, os(e));
        }
    }
    if let Some(fd) = plan.procs {
        // SAFETY: write(2) of a static byte to a descriptor opened before the clone.
        if unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) } != 1 {
            return (ChildStep::Cgroup, errno());
        }
    }
    if plan.cgroupns {
        // SAFETY: unshare(2) takes a flag and changes only this task's namespaces;
        // async-signal-safe.
        if unsafe { libc::unshare(libc::CLONE_NEWCGROUP) } != 0 {
            return (ChildStep::Cgroup, errno());
        }
    }
    if let Err(e) = child_cloexec_from_3() {
        return (ChildStep::Cloexec, os(e));
    }
    (ChildStep::Exec, child_exec(plan.exec))
}

/// execve(2) of each candidate path in turn, by execvp(3)'s rules ([`Exec`]); returns only
/// when none ran, with the errno execvp would leave.
pub(super) fn child_exec(exec: &Exec) -> i32 {
    if let Some(e) = exec.early {
        return e;
    }
    let (mut last, mut got_eacces) = (libc::ENOENT, false);
    for (path, sh_argv) in exec.candidates.iter().zip(&exec.sh_argvs) {
        // SAFETY: execve(2) reads the path, argv and envp prepared before the clone (each
        // array ends with NULL); it returns only on failure.
        let mut e = unsafe {
            libc::execve(path.as_ptr(), exec.argv.as_ptr(), exec.envp.as_ptr());
            errno()
        };
        if e == libc::ENOEXEC {
            // SAFETY: as above, `/bin/sh PATH ARGS...`, prepared before the clone.
            e = unsafe {
                libc::execve(BSHELL.as_ptr(), sh_argv.as_ptr(), exec.envp.as_ptr());
                errno()
            };
        }
        if !exec.search {
            return e;
        }
        match e {
            libc::EACCES => got_eacces = true,
            libc::ENOENT | libc::ESTALE | libc::ENOTDIR | libc::ENODEV | libc::ETIMEDOUT => {}
            _ => return e,
        }
        last = e;
    }
    if got_eacces {
        libc::EACCES
    } else {
        last
    }
}

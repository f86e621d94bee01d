//! Whole-file reads, writeback, the lock of a file, the mode of a descriptor's file and when
//! it was made.

use super::*;

/// Start writing back the dirty pages of the file open as `fd` (sync_file_range(2) with
/// `SYNC_FILE_RANGE_WRITE` over the whole file): asynchronous, no wait for completion, no
/// durability promise. A writer that calls it as it goes overlaps the disk's work with its
/// own, so its final fsync waits only for the last pages instead of all of them.
pub fn start_writeback(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: sync_file_range(2) takes a descriptor and three integers and touches no memory of
    // ours; `fd` is a live descriptor for the duration of the call (BorrowedFd). Offset 0 and
    // length 0 mean from the start to the end of the file.
    let r = unsafe { libc::sync_file_range(fd.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Non-blocking exclusive `flock(2)`. Ok(false) when another open file description holds it.
pub fn try_lock_exclusive(fd: BorrowedFd<'_>) -> io::Result<bool> {
    match rustix::fs::flock(fd, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// chmod(2) of what an `O_PATH` descriptor names, through its /proc/self/fd link (fchmod(2)
/// refuses an `O_PATH` descriptor; the link reaches the very inode, not a path that could have
/// been swapped).
pub fn chmod_fd_path(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
    rustix::fs::chmod(link.as_str(), rustix::fs::Mode::from_raw_mode(mode)).map_err(Into::into)
}

/// Let go of a `flock(2)` this open file description holds.
pub fn unlock(fd: BorrowedFd<'_>) -> io::Result<()> {
    rustix::fs::flock(fd, rustix::fs::FlockOperation::Unlock).map_err(Into::into)
}

/// A file the kernel makes as it is read (/proc, /sys, the cgroup2 mount), whole, as text.
/// Plain reads into a 4 KiB buffer that grows, until EOF (the run dir's reader, uncapped):
/// `fs::read_to_string` first asks for the size (statx says 0 for such files) and then starts
/// with 32-byte probe reads, six to nine syscalls for a file this reads in three or four. A
/// file that is not UTF-8 is `InvalidData`, as there.
pub fn read_kernel_file(path: impl AsRef<std::path::Path>) -> std::io::Result<String> {
    let buf = read_capped(&mut std::fs::File::open(path)?, u64::MAX)?;
    String::from_utf8(buf).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Read up to `cap + 1` bytes: plain `read(2)` calls into a growing buffer, without the size
/// probe and seek that `read_to_string` adds (two syscalls per record, 10,000 records per
/// rescan).
pub fn read_capped(f: &mut std::fs::File, cap: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let limit = usize::try_from(cap).unwrap_or(usize::MAX).saturating_add(1);
    let mut buf = vec![0u8; 4096.min(limit)];
    let mut n = 0;
    while n < limit {
        if n == buf.len() {
            buf.resize((buf.len() * 2).min(limit), 0);
        }
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // A FIFO swapped in between the fstat and here cannot happen (same fd), but a
            // regular file on a filesystem that answers EAGAIN is reported, not spun on.
            Err(e) => return Err(e),
        }
    }
    buf.truncate(n);
    Ok(buf)
}

/// When the file open as `fd` (`md` its metadata) was made: its birth time (`statx`, through
/// rustix: std asks statx for it only with glibc, so a static musl build had none), else its
/// change time, which is never earlier.
pub fn born(fd: BorrowedFd<'_>, md: &std::fs::Metadata) -> Option<std::time::SystemTime> {
    use rustix::fs::{statx, AtFlags, StatxFlags};
    use std::os::unix::fs::MetadataExt;
    let at = |secs: i64, nanos: u32| {
        let secs = u64::try_from(secs).ok()?;
        std::time::UNIX_EPOCH.checked_add(std::time::Duration::new(secs, nanos))
    };
    match statx(fd, "", AtFlags::EMPTY_PATH, StatxFlags::BTIME) {
        Ok(x) if x.stx_mask & StatxFlags::BTIME.bits() != 0 => {
            at(x.stx_btime.tv_sec, x.stx_btime.tv_nsec)
        }
        _ => at(md.ctime(), u32::try_from(md.ctime_nsec()).ok()?),
    }
}

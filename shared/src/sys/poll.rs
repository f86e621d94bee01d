//! Waiting: poll(2), inotify(7) and epoll(7).

use super::*;

/// One `poll(2)` entry.
pub struct PollFd {
    pub fd: RawFd,
    pub events: i16,
    pub revents: i16,
}

/// `poll(2)` with a timeout (None blocks). EINTR is reported as zero ready fds.
pub fn poll(fds: &mut [PollFd], timeout: Option<Duration>) -> io::Result<usize> {
    let mut set: Vec<rustix::event::PollFd<'_>> = fds
        .iter()
        .map(|p| {
            // SAFETY: the borrow lives only for this call, which neither closes the descriptor
            // nor does I/O on it: poll(2) takes the number, and a number that is not open comes
            // back as POLLNVAL, as with a raw poll.
            let fd = unsafe { BorrowedFd::borrow_raw(p.fd) };
            rustix::event::PollFd::from_borrowed_fd(fd, PollFlags::from_bits_retain(p.events as _))
        })
        .collect();
    let t = timeout.and_then(timespec);
    let n = match rustix::event::poll(&mut set, t.as_ref()) {
        Ok(n) => n,
        Err(rustix::io::Errno::INTR) => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    for (p, r) in fds.iter_mut().zip(&set) {
        p.revents = r.revents().bits() as i16;
    }
    Ok(n)
}

/// Wait until `fd` is readable (or at its EOF, or in error), at most until `deadline`, through
/// interruptions. Whether it is (false also when poll itself fails).
pub fn readable_by(fd: BorrowedFd<'_>, deadline: Instant) -> bool {
    let mut fds = [PollFd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match poll(&mut fds, Some(left)) {
            Ok(0) if left.is_zero() => return false,
            Ok(0) => {} // EINTR
            Ok(_) => return true,
            Err(_) => return false,
        }
    }
}

/// An inotify instance (inotify(7)), non-blocking and close-on-exec: event-driven waits for
/// records and leases instead of sleep loops.
pub struct Inotify {
    fd: OwnedFd,
}

/// One inotify event: the watch it came from, its mask, and the name inside a watched directory.
#[derive(Debug, Clone)]
pub struct InotifyEvent {
    pub wd: i32,
    pub mask: u32,
    pub name: String,
}

impl Inotify {
    /// `IN_MOVED_TO | IN_CLOSE_WRITE | IN_CREATE`: a file renamed into place, written or created.
    pub const CHANGED: u32 = libc::IN_MOVED_TO | libc::IN_CLOSE_WRITE | libc::IN_CREATE;
    /// `IN_MODIFY`: bytes appended.
    pub const MODIFIED: u32 = libc::IN_MODIFY;

    /// A new instance.
    pub fn new() -> io::Result<Inotify> {
        let fd = inotify::init(inotify::CreateFlags::NONBLOCK | inotify::CreateFlags::CLOEXEC)?;
        Ok(Inotify { fd })
    }

    /// Throw away pending events (callers re-read the files they care about).
    pub fn drain(&self) {
        let mut buf = [0u8; 4096];
        while matches!(rustix::io::read(&self.fd, &mut buf), Ok(n) if n > 0) {}
    }

    /// Wait up to `timeout` for an event (drained before returning). Returns whether one came.
    pub fn wait(&self, timeout: Duration) -> bool {
        let mut fds = [PollFd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let ready = poll(&mut fds, Some(timeout)).unwrap_or(0) > 0;
        self.drain();
        ready
    }

    /// The descriptor, to poll together with others.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Watch `path` for `mask` events (IN_DONT_FOLLOW: a symlink is watched as itself) and
    /// return the watch descriptor.
    pub fn add_watch(&self, path: &std::path::Path, mask: u32) -> io::Result<i32> {
        let flags = inotify::WatchFlags::from_bits_retain(mask | libc::IN_DONT_FOLLOW);
        Ok(inotify::add_watch(&self.fd, path, flags)?)
    }

    /// Watch the file open as `fd` for `mask` events: the inode we hold, whatever name it has
    /// now (through the /proc/self/fd magic link, which no other process can redirect).
    pub fn add_watch_fd(&self, fd: BorrowedFd<'_>, mask: u32) -> io::Result<i32> {
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let flags = inotify::WatchFlags::from_bits_retain(mask);
        Ok(inotify::add_watch(&self.fd, path, flags)?)
    }

    /// Stop watching a descriptor (errors ignored: the watch may already be gone).
    pub fn rm_watch(&self, wd: i32) {
        let _ = inotify::remove_watch(&self.fd, wd);
    }

    /// Read every pending event without blocking.
    pub fn read_events(&self) -> Vec<InotifyEvent> {
        let mut out = Vec::new();
        let mut buf = vec![MaybeUninit::<u8>::uninit(); 64 * 1024];
        let mut events = inotify::Reader::new(&self.fd, &mut buf);
        // EAGAIN: nothing more is pending.
        while let Ok(ev) = events.next() {
            out.push(InotifyEvent {
                wd: ev.wd(),
                mask: ev.events().bits(),
                name: ev
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            });
        }
        out
    }
}

impl std::os::fd::AsFd for Inotify {
    fn as_fd(&self) -> BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.fd)
    }
}

/// An epoll instance (epoll(7)): one wait over thousands of pidfds without rebuilding a poll set.
pub struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    /// A new close-on-exec instance.
    pub fn new() -> io::Result<Epoll> {
        Ok(Epoll {
            fd: epoll::create(epoll::CreateFlags::CLOEXEC)?,
        })
    }

    /// Watch `fd` for readability; `token` comes back with its events.
    pub fn add(&self, fd: RawFd, token: u64) -> io::Result<()> {
        // SAFETY: borrowed for this call only: epoll_ctl(2) takes the number and keeps no
        // reference to our descriptor (closing it removes it from the interest list).
        let src = unsafe { BorrowedFd::borrow_raw(fd) };
        Ok(epoll::add(
            &self.fd,
            src,
            epoll::EventData::new_u64(token),
            epoll::EventFlags::IN,
        )?)
    }

    /// Stop watching `fd` (closing the fd also removes it).
    pub fn remove(&self, fd: RawFd) {
        // SAFETY: as in `add`: the number, for this call only.
        let src = unsafe { BorrowedFd::borrow_raw(fd) };
        let _ = epoll::delete(&self.fd, src);
    }

    /// Wait up to `timeout` (None: forever) and return the tokens that are ready.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<Vec<u64>> {
        let mut evs: Vec<epoll::Event> = Vec::with_capacity(256);
        let t = timeout.and_then(timespec);
        match epoll::wait(
            &self.fd,
            rustix::buffer::spare_capacity(&mut evs),
            t.as_ref(),
        ) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        }
        Ok(evs
            .iter()
            .map(|e| {
                let data = e.data;
                data.u64()
            })
            .collect())
    }
}

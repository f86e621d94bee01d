//! The process's start, for a binary with its own C `main`: arguments, descriptors 0-2, SIGPIPE; and the musl binaries' heap.

/// The global allocator of the static binaries under musl: blocks under [`HEAP_LARGE`] from a
/// dlmalloc heap, which keeps the memory it got (musl's mallocng maps and unmaps pages as a
/// launch allocates and frees: ~60 mmap/munmap calls and their page faults), larger ones from
/// the C library, which maps them (so a zeroed one is fresh pages nobody touches: the keeper's
/// buffers are megabytes a short run never writes). Each block goes back to the allocator it
/// came from: `dealloc` and `realloc` get the layout it was allocated with.
#[cfg(target_env = "musl")]
pub struct Heap;

/// The size from which [`Heap`] hands a block to the C library.
#[cfg(target_env = "musl")]
pub const HEAP_LARGE: usize = 128 << 10;

#[cfg(target_env = "musl")]
pub(super) static SMALL: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

// SAFETY: every method forwards to one of two sound allocators, chosen by the block's size,
// which `GlobalAlloc` guarantees is the same at `dealloc` (and `realloc`'s old layout) as it was
// at the allocation; a `realloc` across the threshold allocates in the other one, copies the
// smaller of the two sizes and frees the old block in its own.
#[cfg(target_env = "musl")]
unsafe impl std::alloc::GlobalAlloc for Heap {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        if l.size() >= HEAP_LARGE {
            std::alloc::System.alloc(l)
        } else {
            SMALL.alloc(l)
        }
    }

    unsafe fn alloc_zeroed(&self, l: std::alloc::Layout) -> *mut u8 {
        if l.size() >= HEAP_LARGE {
            std::alloc::System.alloc_zeroed(l)
        } else {
            SMALL.alloc_zeroed(l)
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        if l.size() >= HEAP_LARGE {
            std::alloc::System.dealloc(p, l)
        } else {
            SMALL.dealloc(p, l)
        }
    }

    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, new: usize) -> *mut u8 {
        match (l.size() >= HEAP_LARGE, new >= HEAP_LARGE) {
            (true, true) => std::alloc::System.realloc(p, l, new),
            (false, false) => SMALL.realloc(p, l, new),
            _ => {
                // SAFETY (of the layout): `realloc`'s caller guarantees `new`, rounded up to
                // the alignment, does not overflow isize.
                let nl = std::alloc::Layout::from_size_align_unchecked(new, l.align());
                let q = self.alloc(nl);
                if !q.is_null() {
                    std::ptr::copy_nonoverlapping(p, q, l.size().min(new));
                    self.dealloc(p, l);
                }
                q
            }
        }
    }
}

/// The command line that [`runtime_start`] was given, owned (the keeper's title later
/// overwrites the argument area).
pub(super) static ARGS: std::sync::OnceLock<Vec<std::ffi::OsString>> = std::sync::OnceLock::new();

/// The process's arguments: those `main` handed to [`runtime_start`], else std's (a binary
/// with Rust's own start, the tests). std fills its copy from the C library's init only
/// with glibc; under musl a binary that starts at its own C `main` has nothing there.
pub fn args_os() -> Vec<std::ffi::OsString> {
    match ARGS.get() {
        Some(a) => a.clone(),
        None => std::env::args_os().collect(),
    }
}

/// What Rust's runtime start does before `main` that agent-run needs, for a binary that
/// starts at its own C `main`: descriptors 0, 1 and 2 open (on /dev/null when closed),
/// SIGPIPE ignored, and the arguments kept for [`args_os`] (`argc` strings at `argv`, as
/// the C library passes them to `main`).
///
/// # Safety
///
/// `argv` is null or holds `argc` pointers to NUL-terminated strings that stay valid while
/// this runs: the arguments the C library passed to `main`.
pub unsafe fn runtime_start(argc: std::ffi::c_int, argv: *const *const std::ffi::c_char) {
    use std::os::unix::ffi::OsStrExt;
    let mut args = Vec::with_capacity(usize::try_from(argc).unwrap_or(0));
    if !argv.is_null() {
        for i in 0..usize::try_from(argc).unwrap_or(0) {
            // SAFETY: the caller's contract: `argc` valid pointers at `argv`, each to a
            // NUL-terminated string (the C library's arguments to `main`, on the initial
            // stack, which nothing has written to yet).
            let arg = unsafe {
                let p = *argv.add(i);
                if p.is_null() {
                    break;
                }
                std::ffi::CStr::from_ptr(p)
            };
            args.push(std::ffi::OsStr::from_bytes(arg.to_bytes()).to_owned());
        }
    }
    let _ = ARGS.set(args);
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    });
    // SAFETY: poll(2) reads and writes the three entries of an array on our stack; open(2)
    // reads a NUL-terminated literal; signal(2) installs SIG_IGN and touches no memory of
    // ours. Called first in `main`: no descriptor is in use by Rust code yet.
    unsafe {
        if libc::poll(fds.as_mut_ptr(), 3, 0) >= 0 {
            for f in &fds {
                if f.revents & libc::POLLNVAL != 0 {
                    libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
                }
            }
        }
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

/// Restore SIGPIPE's default action (Rust's runtime ignores it), so a command whose output
/// goes to a closed pipe (`agent-run list | head`) ends quietly like any Unix filter. Not
/// for the supervising wrapper: a dropped SSH channel must never kill it. Raw: rustix's
/// sigaction is in its unstable `runtime` API.
pub fn default_sigpipe() {
    // SAFETY: installing SIG_DFL for SIGPIPE touches no memory of ours.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

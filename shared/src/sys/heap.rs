//! The musl binaries' heap: the one speed-only mechanism [simplify] kept. Measured side by side
//! on the static musl build (2026-12-06, 400 interleaved launches, twice): the launch median over
//! bare is 1.52-1.54 ms with it and 1.88-1.91 ms without (0.37 ms, above the bar of 0.2 ms).
//! The watchdog uses it too: a `--once` pass over 1,000 live runs took 97-102 ms of wall time
//! with it and 117-123 ms without (musl's own allocator unmapped and mapped a page for each
//! /proc file it read).

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

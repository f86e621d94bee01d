//! The keeper's ring: the most recent bytes of a stream past its `--max-output` cap, appended
//! after a marker at EOF (see [`crate::keeper`]).

/// The last `cap` bytes pushed: a fixed buffer written with memcpy (no per-byte work, so a
/// 10 GB stream past the cap costs its reads).
pub struct Ring {
    /// `cap` bytes from the first push on (a stream that never passes its cap never maps it).
    buf: Vec<u8>,
    cap: usize,
    /// Where the next byte goes.
    at: usize,
    len: usize,
}

impl Ring {
    pub fn new(cap: usize) -> Ring {
        Ring {
            buf: Vec::new(),
            cap,
            at: 0,
            len: 0,
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        let cap = self.cap;
        if cap == 0 {
            return;
        }
        if self.buf.is_empty() {
            self.buf = vec![0; cap];
        }
        let bytes = &bytes[bytes.len().saturating_sub(cap)..];
        let first = bytes.len().min(cap - self.at);
        self.buf[self.at..self.at + first].copy_from_slice(&bytes[..first]);
        let rest = bytes.len() - first;
        self.buf[..rest].copy_from_slice(&bytes[first..]);
        self.at = (self.at + bytes.len()) % cap;
        self.len = (self.len + bytes.len()).min(cap);
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The bytes in two parts, older first.
    pub fn halves(&self) -> (&[u8], &[u8]) {
        let cap = self.cap;
        if self.len < cap {
            (&self.buf[..self.len], &[])
        } else {
            (&self.buf[self.at..], &self.buf[..self.at])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Ring;

    fn contents(r: &Ring) -> Vec<u8> {
        let (a, b) = r.halves();
        [a, b].concat()
    }

    #[test]
    fn the_ring_keeps_the_most_recent_bytes_in_order() {
        let mut r = Ring::new(5);
        r.push(b"ab");
        assert_eq!(contents(&r), b"ab");
        r.push(b"cde");
        assert_eq!(contents(&r), b"abcde");
        r.push(b"fg");
        assert_eq!(contents(&r), b"cdefg");
        r.push(b"0123456789");
        assert_eq!(contents(&r), b"56789");
        r.push(b"x");
        assert_eq!(contents(&r), b"6789x");
        assert_eq!(r.len(), 5);
        let mut z = Ring::new(0);
        z.push(b"abc");
        assert!(z.is_empty());
    }
}

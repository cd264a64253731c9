//! FNV-1a (64 bits): the one stable hash vitals uses where a value must be the same on every
//! machine and every run — deterministic jitter in the engine, spreads and shards in the prober,
//! the simulator's per-endpoint seeds. Not for hash tables (no seed, no flood resistance).

const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0100_0000_01b3;

/// An FNV-1a hash being built: feed it bytes, then [`Fnv64::finish`].
#[derive(Debug, Clone, Copy)]
pub struct Fnv64(u64);

impl Default for Fnv64 {
    fn default() -> Self {
        Fnv64::new()
    }
}

impl Fnv64 {
    pub const fn new() -> Fnv64 {
        Fnv64(OFFSET)
    }

    /// Feed bytes.
    pub fn bytes(mut self, bytes: impl IntoIterator<Item = u8>) -> Fnv64 {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(PRIME);
        }
        self
    }

    /// Feed each part followed by a zero byte (so that `["ab", "c"]` and `["a", "bc"]` differ).
    pub fn parts(self, parts: &[&[u8]]) -> Fnv64 {
        parts.iter().fold(self, |h, p| h.bytes(p.iter().copied().chain([0])))
    }

    pub fn finish(self) -> u64 {
        self.0
    }
}

/// FNV-1a of `bytes`.
pub fn fnv64(bytes: &[u8]) -> u64 {
    Fnv64::new().bytes(bytes.iter().copied()).finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_published_test_vectors() {
        assert_eq!(fnv64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn parts_are_kept_apart() {
        let a = Fnv64::new().parts(&[b"ab", b"c"]).finish();
        let b = Fnv64::new().parts(&[b"a", b"bc"]).finish();
        assert_ne!(a, b);
        assert_eq!(a, fnv64(b"ab\0c\0"));
    }
}

//! A seeded xorshift64 generator: the same numbers on every run, so a failing test
//! reproduces. Not for anything that needs real randomness.

#[derive(Debug, Clone)]
pub struct Xorshift(u64);

impl Xorshift {
    /// `seed` must not be 0 (xorshift would stay at 0 forever).
    pub fn new(seed: u64) -> Self {
        assert_ne!(seed, 0, "xorshift seed");
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

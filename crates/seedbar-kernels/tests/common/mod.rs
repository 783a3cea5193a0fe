//! What the kernel tests share: a deterministic pseudo-random stream (xorshift), so
//! failures reproduce.

pub struct Stream(pub u64);

// Each test binary uses part of it.
#[allow(dead_code)]
impl Stream {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `[-1, 1]`, in steps of 1e-6.
    pub fn float(&mut self) -> f32 {
        (self.next() % 2_000_001) as f32 / 1_000_000.0 - 1.0
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn floats(&mut self, n: usize, spread: f32) -> Vec<f32> {
        (0..n).map(|_| self.float() * spread).collect()
    }
}

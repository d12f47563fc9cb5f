//! The shapes our CUDA kernels take: plain data, compiled with or without the `cuda` feature, so
//! that a machine without a GPU can tell which path a GPU would take and count it. Knows nothing
//! of models or devices.

/// A layer's head shape: key heads, value heads, their dims, the conv's width, the norm's eps.
#[derive(Debug, Clone, Copy)]
pub struct GdnShape {
    pub nk: usize,
    pub nv: usize,
    pub dk: usize,
    pub dv: usize,
    pub conv_kernel: usize,
    pub eps: f64,
}

impl GdnShape {
    pub fn conv_dim(&self) -> usize {
        2 * self.nk * self.dk + self.nv * self.dv
    }

    /// Rows of a head's state each thread of the recurrent kernel keeps.
    pub fn parts(&self) -> usize {
        self.dk / self.dk.min(32)
    }

    /// Whether the kernels take this shape: dk of 16, 32, 64 or 128, value heads a multiple of
    /// the key heads, dv x parts a power of two of at most 512 threads, a conv of 2 to 8 taps.
    pub fn supported(&self) -> bool {
        let threads = self.dv * self.parts();
        [16, 32, 64, 128].contains(&self.dk)
            && self.nk > 0
            && self.nv.is_multiple_of(self.nk)
            && threads.is_power_of_two()
            && threads <= 512
            && (2..=8).contains(&self.conv_kernel)
    }
}

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

/// An attention layer's q/k/v shape, as the fused epilogue (`qkv_rope`) takes it.
#[derive(Debug, Clone, Copy)]
pub struct QkvShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Leading dims of each head RoPE rotates (the head_dim but for partial RoPE).
    pub rotary: usize,
    /// q_proj gives a query and an output gate per head (Qwen3.5).
    pub gate: bool,
    pub eps: f64,
    pub q_scale: f64,
}

impl QkvShape {
    /// Columns of the stacked projection's rows.
    pub fn width(&self) -> usize {
        let q = self.heads * self.head_dim * if self.gate { 2 } else { 1 };
        q + 2 * self.kv_heads * self.head_dim
    }

    /// Whether the kernel takes this shape: one thread per element of a head (head_dim a
    /// multiple of 32, at most 512), an even rotary width within the head.
    pub fn supported(&self) -> bool {
        let d = self.head_dim;
        d > 0
            && d.is_multiple_of(32)
            && d <= 512
            && self.rotary > 0
            && self.rotary.is_multiple_of(2)
            && self.rotary <= d
            && self.heads > 0
            && self.kv_heads > 0
    }
}

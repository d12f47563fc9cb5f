//! The plumbing our CPU candle ops share (the single ops of `model::diff_ops`, the packed linear
//! of `model::host_linear`, the fused attention, the trainer's AdamW): a custom op's f32 inputs as
//! slices in its forward pass, and a tensor's data borrowed without a copy in its backward pass.
//! Knows nothing of what the ops compute.

use candle_core::{CpuStorage, Layout, Result, Storage, Tensor};

/// A contiguous f32 input of a custom op's forward, as a slice.
pub(crate) fn slice<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [f32]> {
    let CpuStorage::F32(data) = s else {
        candle_core::bail!("expected f32 inputs")
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&data[a..b]),
        None => candle_core::bail!("expected contiguous inputs"),
    }
}

/// [`slice`] for the tensor an in-place op writes.
pub(crate) fn slice_mut<'a>(s: &'a mut CpuStorage, l: &Layout) -> Result<&'a mut [f32]> {
    match (s, l.contiguous_offsets()) {
        (CpuStorage::F32(data), Some((a, b))) => Ok(&mut data[a..b]),
        _ => candle_core::bail!("expected a contiguous f32 tensor"),
    }
}

/// A CPU f32 tensor's data borrowed for a backward pass (no copy): [`view`] it, then [`F32View::get`].
pub(crate) struct F32View<'a> {
    guard: std::sync::RwLockReadGuard<'a, Storage>,
    start: usize,
    end: usize,
}

impl F32View<'_> {
    pub(crate) fn get(&self) -> Result<&[f32]> {
        match &*self.guard {
            Storage::Cpu(CpuStorage::F32(v)) => Ok(&v[self.start..self.end]),
            _ => candle_core::bail!("expected an f32 CPU tensor"),
        }
    }
}

/// Borrows `t` if it is a contiguous f32 tensor on the CPU; `None` for anything else.
pub(crate) fn host_view(t: &Tensor) -> Option<F32View<'_>> {
    if !t.device().is_cpu() || t.dtype() != candle_core::DType::F32 || !t.is_contiguous() {
        return None;
    }
    view(t).ok()
}

/// Borrows `t`, which must be contiguous (call `.contiguous()` first: free when it already is).
pub(crate) fn view(t: &Tensor) -> Result<F32View<'_>> {
    let (guard, layout) = t.storage_and_layout();
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("expected a contiguous tensor")
    };
    Ok(F32View { guard, start, end })
}

//! A GPU sampling step's one upload and one download, into buffers kept from step to step.
//!
//! The upload: everything a step's kernels read that the host decides (tokens, positions, the
//! paged attention's slots, token sequences, lengths and block tables, the state slots' ids and
//! sequence starts, the sampling rows and their temperatures) is appended on the host as
//! sections of 32-bit words ([`Staging`]), copied into page-locked memory and sent in one copy
//! into a device buffer of u32 words ([`StepIo::upload`]); each consumer reads its section in
//! place ([`StepBuf`]: a device address, or a u32 tensor view for candle). The download: the
//! candidate draw's outputs land in one device buffer and come back in one copy into page-locked
//! memory ([`StepIo::download`]), the step's one wait.
//!
//! The buffers grow (to the next power of two) when a step needs more, and are kept: a warm
//! step allocates nothing here. Before the host rewrites the page-locked upload buffer it waits
//! for the last copy out of it (an event, normally long done).
//!
//! Knows nothing of what the sections mean.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{
    result, sys, CudaContext, CudaEvent, CudaSlice, PinnedHostSlice,
};
use candle_core::op::BackpropOp;
use candle_core::{bail, CudaDevice, CudaStorage, Result, Storage, Tensor};

use crate::cuda::kernels::{driver, slice_ptr, tensor_ptr};

/// Smallest buffer either way, in words: growth stays rare.
const MIN_WORDS: usize = 1 << 12;

/// A section of the staged words: its first word and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Section {
    pub offset: usize,
    pub len: usize,
}

/// A step's upload, assembled on the host.
#[derive(Debug, Default)]
pub struct Staging {
    words: Vec<u32>,
}

impl Staging {
    pub fn new() -> Staging {
        Staging::default()
    }

    /// Starts the section at a multiple of 4 words (16 bytes: vector loads and i64 alike).
    fn start(&mut self) -> usize {
        let off = self.words.len().next_multiple_of(4);
        self.words.resize(off, 0);
        off
    }

    fn done(&self, offset: usize) -> Section {
        Section {
            offset,
            len: self.words.len() - offset,
        }
    }

    pub fn u32s(&mut self, values: impl IntoIterator<Item = u32>) -> Section {
        let off = self.start();
        self.words.extend(values);
        self.done(off)
    }

    /// f32 values, as their bits.
    pub fn f32s(&mut self, values: impl IntoIterator<Item = f32>) -> Section {
        self.u32s(values.into_iter().map(f32::to_bits))
    }

    /// i64 values, two little-endian words each (the section's `len` counts words).
    pub fn i64s(&mut self, values: impl IntoIterator<Item = i64>) -> Section {
        let off = self.start();
        for v in values {
            self.words.push(v as u32);
            self.words.push((v >> 32) as u32);
        }
        self.done(off)
    }

    /// Words staged so far.
    pub fn len(&self) -> usize {
        self.words.len()
    }

    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }
}

/// A step's uploaded words on the device: the buffer as a u32 tensor, which its views keep
/// alive.
#[derive(Debug, Clone)]
pub struct StepBuf {
    words: Tensor,
    base: u64,
}

impl StepBuf {
    /// Device address of the buffer's first word.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Device address of `s`'s first word.
    pub fn ptr(&self, s: Section) -> u64 {
        self.base + 4 * s.offset as u64
    }

    /// `s` as a u32 tensor (a view, no copy).
    pub fn tensor(&self, s: Section) -> Result<Tensor> {
        self.words.narrow(0, s.offset, s.len)
    }
}

/// What one [`StepIo::upload`] or [`StepIo::download`] did: whether a buffer grew.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Grew(pub bool);

/// The kept buffers of a GPU sampler's steps.
pub struct StepIo {
    dev: CudaDevice,
    up_host: Option<PinnedHostSlice<u32>>,
    up_dev: Option<StepBuf>,
    /// Recorded after each upload (made once, recorded again each step), and whether a
    /// recording is not yet waited for: the host waits for it before rewriting `up_host`.
    up_done: Option<CudaEvent>,
    up_pending: bool,
    down_dev: Option<CudaSlice<u32>>,
    down_host: Option<PinnedHostSlice<u32>>,
    /// The split attention's partials (outputs, then max and sum), f32.
    partials: Option<CudaSlice<f32>>,
}

impl std::fmt::Debug for StepIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepIo")
            .field("upload_words", &self.up_host.as_ref().map(|h| h.len()))
            .field("download_words", &self.down_host.as_ref().map(|h| h.len()))
            .finish()
    }
}

fn context(dev: &CudaDevice) -> Arc<CudaContext> {
    dev.cuda_stream().context().clone()
}

impl StepIo {
    pub fn new(dev: &CudaDevice) -> StepIo {
        StepIo {
            dev: dev.clone(),
            up_host: None,
            up_dev: None,
            up_done: None,
            up_pending: false,
            down_dev: None,
            down_host: None,
            partials: None,
        }
    }

    /// Sends `staging` to the device in one copy from page-locked memory.
    pub fn upload(&mut self, staging: &Staging) -> Result<(StepBuf, Grew)> {
        // the raw copies below do not bind the device's context to this thread (cudarc's own
        // calls do)
        driver("CUDA context", context(&self.dev).bind_to_thread())?;
        let n = staging.words.len().max(1);
        let grew = self.up_host.as_ref().is_none_or(|h| h.len() < n);
        if grew {
            // the old buffers stay alive as long as the views of earlier steps that use them
            let cap = n.next_power_of_two().max(MIN_WORDS);
            self.wait_upload()?;
            // SAFETY: every word the kernels read is written below before the copy.
            self.up_host = Some(driver("page-locked memory", unsafe {
                context(&self.dev).alloc_pinned::<u32>(cap)
            })?);
            // SAFETY: as above: the copy writes every word a consumer reads.
            let slice = unsafe { self.dev.alloc::<u32>(cap)? };
            let words = Tensor::from_storage(
                Storage::Cuda(CudaStorage::wrap_cuda_slice(slice, self.dev.clone())),
                cap,
                BackpropOp::none(),
                false,
            );
            let base = tensor_ptr(&words)?;
            self.up_dev = Some(StepBuf { words, base });
        }
        self.wait_upload()?;
        let (Some(host), Some(buf)) = (self.up_host.as_mut(), self.up_dev.as_ref()) else {
            bail!("step upload: no buffers")
        };
        let host = driver("page-locked memory", host.as_mut_slice())?;
        host[..staging.words.len()].copy_from_slice(&staging.words);
        let stream = self.dev.cuda_stream();
        // SAFETY: the device buffer holds `cap` >= n words; the host words stay untouched until
        // `up_done` (recorded next) has passed, which `wait_upload` checks before any rewrite.
        unsafe {
            driver(
                "copy to the device",
                result::memcpy_htod_async(buf.base, &host[..n], stream.cu_stream()),
            )?;
        }
        match &self.up_done {
            Some(e) => driver("CUDA event", e.record(&stream))?,
            None => {
                let flags = Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
                self.up_done = Some(driver("CUDA event", stream.record_event(flags))?);
            }
        }
        self.up_pending = true;
        Ok((buf.clone(), Grew(grew)))
    }

    fn wait_upload(&mut self) -> Result<()> {
        if let (true, Some(e)) = (self.up_pending, &self.up_done) {
            driver("CUDA event", e.synchronize())?;
        }
        self.up_pending = false;
        Ok(())
    }

    /// A device buffer of at least `words` words for the step's outputs, and its address.
    /// Its words are not initialised: the caller's kernel writes every word it reads back.
    pub fn output(&mut self, words: usize) -> Result<(u64, Grew)> {
        let grew = self.down_dev.as_ref().is_none_or(|d| d.len() < words);
        if grew {
            let cap = words.next_power_of_two().max(MIN_WORDS);
            // SAFETY: see above; `download` copies only what the kernel wrote.
            self.down_dev = Some(unsafe { self.dev.alloc::<u32>(cap)? });
            self.down_host = Some(driver("page-locked memory", unsafe {
                // not write-combined: the host reads these
                context(&self.dev).alloc_pinned_with_flags::<u32>(cap, 0)
            })?);
        }
        let d = self.down_dev.as_ref().expect("set above");
        Ok((slice_ptr(&self.dev, d), Grew(grew)))
    }

    /// The first `words` words of the output buffer, in one copy, waiting for the device.
    pub fn download(&mut self, words: usize) -> Result<&[u32]> {
        let (Some(d), Some(h)) = (self.down_dev.as_ref(), self.down_host.as_mut()) else {
            bail!("step download: no output buffer")
        };
        if words > d.len() {
            bail!("step download: {words} words from a buffer of {}", d.len())
        }
        driver("CUDA context", context(&self.dev).bind_to_thread())?;
        let stream = self.dev.cuda_stream();
        let src = slice_ptr(&self.dev, d);
        let host = driver("page-locked memory", h.as_mut_slice())?;
        // SAFETY: both ranges hold `words` words; the wait below ends the copy before the host
        // reads.
        unsafe {
            driver(
                "copy to the host",
                result::memcpy_dtoh_async(&mut host[..words], src, stream.cu_stream()),
            )?;
        }
        driver("synchronize", stream.synchronize())?;
        Ok(&host[..words])
    }

    /// The split attention's partials: `floats` f32 values kept from step to step (none
    /// initialised: the attention writes each before its reduce reads it). A growth frees the
    /// old buffer: one step at a time uses them (a [`super::GpuStep`] holds their address, not
    /// the buffer).
    pub fn partials(&mut self, floats: usize) -> Result<(u64, Grew)> {
        let grew = self.partials.as_ref().is_none_or(|p| p.len() < floats);
        if grew {
            // SAFETY: see above.
            self.partials = Some(unsafe {
                self.dev
                    .alloc::<f32>(floats.next_power_of_two().max(MIN_WORDS))?
            });
        }
        let p = self.partials.as_ref().expect("set above");
        Ok((slice_ptr(&self.dev, p), Grew(grew)))
    }
}

impl Drop for StepIo {
    /// The page-locked upload buffer is freed only after the copy out of it.
    fn drop(&mut self) {
        let _ = self.wait_upload();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_start_on_16_bytes_and_i64s_are_two_words_each() {
        let mut s = Staging::new();
        let a = s.u32s([1, 2, 3]);
        let b = s.i64s([-1, 1 << 40]);
        let c = s.f32s([1.5]);
        assert_eq!(a, Section { offset: 0, len: 3 });
        assert_eq!(b, Section { offset: 4, len: 4 });
        assert_eq!(c, Section { offset: 8, len: 1 });
        assert_eq!(&s.words[4..8], &[u32::MAX, u32::MAX, 0, 1 << 8]);
        assert_eq!(s.words[8], 1.5f32.to_bits());
        assert_eq!(s.words[3], 0);
    }
}

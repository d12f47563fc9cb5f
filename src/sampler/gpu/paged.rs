//! The paged KV cache in GPU memory and the attention backend that reads it through
//! `kernels/paged_attention.cu`. Same layout and semantics as the CPU reference
//! (`sampler::kv_cache`): per layer, K and V are `[num_blocks][Hkv][block_size][D]`, a step's
//! tokens are written to the slots their block tables give, then every token attends over
//! positions `0..=pos` of its own sequence.
//!
//! The cache holds the model's dtype (f32 or bf16) or, as an option, fp8 e4m3 (stored as is,
//! no scale: half the bytes of bf16, and KV reads dominate long decodes). A [`GpuStep`] uploads a
//! step's metadata once (slot of each new token, each token's sequence and context length, the
//! block tables padded to the longest) and is shared by every layer. Knows nothing of
//! scheduling; the caller reserves slots and copies shared blocks before they are written.

use std::time::Instant;

use candle_core::cuda_backend::cudarc::driver::{
    result, sys, CudaEvent, CudaFunction, CudaSlice, LaunchConfig, PushKernelArg,
};
use candle_core::op::BackpropOp;
use candle_core::{bail, CudaDevice, CudaStorage, DType, Device, Result, Storage, Tensor};

use crate::cuda::kernels::{checked, paged_fn, slice_ptr, tensor_ptr};
use crate::model::attention::AttentionBackend;
use crate::model::ModelConfig;
use crate::sampler::block_pool::BlockId;
use crate::sampler::gpu_plan::{partitions, GraphPlan, StepCosts};
use crate::sampler::kv_cache::SeqStep;
use crate::sampler::state_slots::step_slots;

use super::step_io::{Section, Staging, StepBuf, StepIo};

/// Threads per attention block (4 warps).
const THREADS: u32 = 128;

#[derive(Debug)]
pub struct GpuKvCache {
    pub block_size: usize,
    pub num_blocks: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    model_dtype: DType,
    fp8: bool,
    /// Each model layer's place in `k` and `v` (none for a layer that keeps no keys).
    slots: Vec<Option<usize>>,
    k: Vec<CudaSlice<u8>>,
    v: Vec<CudaSlice<u8>>,
    dev: CudaDevice,
    sm_count: usize,
    /// The kernels for this cache's dtypes and head shape, loaded once; `attn_name` is the
    /// attention kernel's name (v5 where it applies, see [`default_variant`]).
    write_fn: CudaFunction,
    attn_fn: CudaFunction,
    attn_name: String,
    reduce_fn: CudaFunction,
}

impl GpuKvCache {
    /// Bytes of one cache element.
    pub fn elem_bytes(model_dtype: DType, fp8: bool) -> usize {
        if fp8 {
            1
        } else {
            model_dtype.size_in_bytes()
        }
    }

    /// Bytes one token's keys and values take over all layers.
    pub fn bytes_per_token(cfg: &ModelConfig, model_dtype: DType, fp8: bool) -> usize {
        cfg.kv_values_per_token() * Self::elem_bytes(model_dtype, fp8)
    }

    pub fn new(
        cfg: &ModelConfig,
        block_size: usize,
        num_blocks: usize,
        device: &Device,
        model_dtype: DType,
        fp8: bool,
    ) -> Result<Self> {
        let dev = device.as_cuda_device()?.clone();
        match (model_dtype, fp8) {
            (DType::F32, false) | (DType::BF16, _) => {}
            (d, true) => bail!("an fp8 KV cache needs a bf16 model, not {d:?}"),
            (d, false) => bail!("the CUDA sampler runs f32 or bf16 models, not {d:?}"),
        }
        let g = cfg.num_heads / cfg.num_kv_heads.max(1);
        if ![1, 2, 4, 8].contains(&g)
            || cfg.head_dim > 256
            || cfg.head_dim == 0
            || !cfg.head_dim.is_multiple_of(8)
        {
            bail!(
                "the CUDA paged attention handles 1, 2, 4 or 8 query heads per KV head and a \
                 head_dim that is a multiple of 8 up to 256; this model has {} / {} heads of {}",
                cfg.num_heads,
                cfg.num_kv_heads,
                cfg.head_dim
            );
        }
        let bytes = num_blocks
            * block_size
            * cfg.num_kv_heads
            * cfg.head_dim
            * Self::elem_bytes(model_dtype, fp8);
        let kv_layers = cfg.kv_layers().len();
        let mut k = Vec::with_capacity(kv_layers);
        let mut v = Vec::with_capacity(kv_layers);
        for _ in 0..kv_layers {
            k.push(dev.alloc_zeros::<u8>(bytes.max(1))?);
            v.push(dev.alloc_zeros::<u8>(bytes.max(1))?);
        }
        let sm_count = dev
            .cuda_stream()
            .context()
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| candle_core::Error::Msg(format!("device attribute: {e:?}")))?
            as usize;
        let suffix = kernel_suffix(model_dtype, fp8);
        let write_fn = paged_fn(&dev, &format!("write_kv_{suffix}"))?;
        let attn_name = attn_name(
            suffix,
            cfg.head_dim,
            g,
            default_variant(model_dtype, block_size),
        );
        let attn_fn = paged_fn(&dev, &attn_name)?;
        let reduce = if model_dtype == DType::F32 {
            "f32"
        } else {
            "bf16"
        };
        let reduce_fn = paged_fn(&dev, &format!("paged_attn_reduce_{reduce}"))?;
        Ok(GpuKvCache {
            block_size,
            num_blocks,
            num_kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            model_dtype,
            fp8,
            slots: cfg.kv_slots(),
            k,
            v,
            dev,
            sm_count,
            write_fn,
            attn_fn,
            attn_name,
            reduce_fn,
        })
    }

    /// The attention kernel this cache runs by default.
    pub fn attn_kernel(&self) -> &str {
        &self.attn_name
    }

    /// The keys and values of model layer `layer`.
    fn layer(&self, layer: usize) -> Option<(&CudaSlice<u8>, &CudaSlice<u8>)> {
        let slot = (*self.slots.get(layer)?)?;
        Some((self.k.get(slot)?, self.v.get(slot)?))
    }

    fn block_bytes(&self) -> usize {
        self.block_size
            * self.num_kv_heads
            * self.head_dim
            * Self::elem_bytes(self.model_dtype, self.fp8)
    }

    /// The fixed launch shape of a decode step padded to `rows` rows whose longest block table
    /// has `blocks` entries ([`GraphPlan`]).
    pub fn graph_plan(&self, rows: usize, blocks: usize) -> GraphPlan {
        GraphPlan::new(
            rows,
            blocks,
            self.block_size,
            self.num_kv_heads,
            self.sm_count,
        )
    }

    /// Copies every layer's keys and values of block `src` into `dst` (copy on write).
    pub fn copy_block(&mut self, src: BlockId, dst: BlockId) -> Result<()> {
        let n = self.block_bytes();
        let stream = self.dev.cuda_stream();
        for layer in self.k.iter().chain(self.v.iter()) {
            let base = slice_ptr(&self.dev, layer);
            // SAFETY: both ranges lie inside this layer's allocation (block ids < num_blocks,
            // checked below), and the copy is ordered on candle's stream with every kernel.
            if (src.0 as usize).max(dst.0 as usize) >= self.num_blocks {
                bail!("copy_block: block id out of range");
            }
            unsafe {
                result::memcpy_dtod_async(
                    base + (dst.0 as usize * n) as u64,
                    base + (src.0 as usize * n) as u64,
                    n,
                    stream.cu_stream(),
                )
                .map_err(|e| candle_core::Error::Msg(format!("copy_block: {e:?}")))?;
            }
        }
        Ok(())
    }
}

/// The kernels' name suffix for a model dtype and cache dtype.
fn kernel_suffix(model_dtype: DType, fp8: bool) -> &'static str {
    match (model_dtype, fp8) {
        (DType::F32, _) => "f32",
        (_, false) => "bf16",
        (_, true) => "bf16_fp8",
    }
}

/// The attention kernel for `d` (8 elements per lane, a power of two from 2 to 32 lanes per key
/// row) and `g` query heads per KV head; `variant` names a version or benchmark variant (`_v5`,
/// `_r4`; `_v4` is v4 itself, whose names carry no suffix).
fn attn_name(suffix: &str, d: usize, g: usize, variant: &str) -> String {
    let lanes = (d / 8).next_power_of_two().max(2);
    let variant = if variant == "_v4" { "" } else { variant };
    format!("paged_attn_{suffix}_l{lanes}_g{g}{variant}")
}

/// The attention kernel a cache runs: v5 (table entries in shared memory, loads one stage ahead;
/// `kernels/NOTES.md`) for bf16 and fp8 caches in blocks of a power of two, else v4.
fn default_variant(model_dtype: DType, block_size: usize) -> &'static str {
    if model_dtype != DType::F32 && block_size.is_power_of_two() {
        "_v5"
    } else {
        "_v4"
    }
}

/// A step's metadata on the device, shared by every layer: addresses in the step's one upload
/// ([`StepBuf`]), and of the split attention's partials.
pub struct GpuStep {
    tokens: usize,
    /// Each new token's cache slot (i64), sequence and context length (u32), and the block
    /// tables padded to the longest (u32).
    slots: u64,
    tok_seq: u64,
    tok_len: u64,
    tables: u64,
    max_blocks: usize,
    part_size: usize,
    num_parts: usize,
    /// Split-K partials: (T, Hq, P, D) outputs and (T, Hq, P, 2) max and sum (0 without a
    /// split).
    part_out: u64,
    part_ml: u64,
    /// Keeps the uploaded words alive, and for a step made alone ([`GpuStep::new`]) its
    /// buffers.
    _buf: StepBuf,
    _own: Option<Box<StepIo>>,
}

/// A step's metadata staged for the upload ([`GpuStep::stage`]), before it has addresses.
pub struct StagedStep {
    tokens: usize,
    slots: Section,
    tok_seq: Section,
    tok_len: Section,
    tables: Section,
    max_blocks: usize,
    part_size: usize,
    num_parts: usize,
    /// f32 values of the partials (outputs, then max and sum), 0 without a split.
    partial_floats: usize,
    part_out_floats: usize,
}

impl StagedStep {
    /// Whether the step splits long contexts (and so uses the partials).
    pub fn split(&self) -> bool {
        self.num_parts > 1
    }
}

impl GpuStep {
    /// Stages the step's metadata of `seqs` (whose tokens attend with `num_heads` query heads)
    /// into `staging`: each new token's slot, sequence and context length, the block tables.
    pub fn stage(
        cache: &GpuKvCache,
        seqs: &[SeqStep],
        num_heads: usize,
        staging: &mut Staging,
    ) -> Result<StagedStep> {
        Self::stage_as(cache, seqs, num_heads, staging, None)
    }

    /// [`Self::stage`], shaped by a CUDA graph's `plan` when given: a decode step (one token per
    /// sequence) padded to the plan's rows, each padded row with no cache slot (the KV write
    /// skips it) and a context of one key read through a table of zeros (its output is never
    /// read), the tables at the plan's stride and the attention split as the plan says.
    pub fn stage_as(
        cache: &GpuKvCache,
        seqs: &[SeqStep],
        num_heads: usize,
        staging: &mut Staging,
        plan: Option<&GraphPlan>,
    ) -> Result<StagedStep> {
        let bs = cache.block_size;
        let tokens: usize = seqs.iter().map(|s| s.num_new).sum();
        let longest = seqs
            .iter()
            .map(|s| s.block_table.blocks.len())
            .max()
            .unwrap_or(0)
            .max(1);
        let (rows, max_blocks) = match plan {
            None => (tokens, longest),
            Some(p) => {
                if seqs.iter().any(|s| s.num_new != 1) || p.rows < tokens || p.max_blocks < longest
                {
                    bail!(
                        "a graph's plan ({} rows, tables of {}) does not fit a step of {tokens} \
                         tokens, tables of {longest}",
                        p.rows,
                        p.max_blocks
                    );
                }
                (p.rows, p.max_blocks)
            }
        };
        let mut slots = Vec::with_capacity(rows);
        let mut tok_seq = Vec::with_capacity(rows);
        let mut tok_len = Vec::with_capacity(rows);
        let mut tables = vec![0u32; seqs.len().max(rows) * max_blocks];
        let mut max_len = 1;
        for (i, s) in seqs.iter().enumerate() {
            for (j, b) in s.block_table.blocks.iter().enumerate() {
                if b.0 as usize >= cache.num_blocks {
                    bail!(
                        "block {} is outside the cache ({} blocks)",
                        b.0,
                        cache.num_blocks
                    );
                }
                tables[i * max_blocks + j] = b.0;
            }
            for p in s.start_pos..s.start_pos + s.num_new {
                let slot = s
                    .block_table
                    .slot(p, bs)
                    .ok_or_else(|| candle_core::Error::Msg("slot not reserved".into()))?;
                slots.push(slot as i64);
                tok_seq.push(i as u32);
                tok_len.push(p as u32 + 1);
                max_len = max_len.max(p + 1);
            }
        }
        for i in tokens..rows {
            slots.push(-1);
            tok_seq.push(i as u32);
            tok_len.push(1);
        }
        let (part_size, num_parts) = match plan {
            None => partitions(tokens, cache.num_kv_heads, max_len, bs, cache.sm_count),
            Some(p) => (p.part_size, p.num_parts),
        };
        let partial_rows = if num_parts > 1 {
            rows * num_heads * num_parts
        } else {
            0
        };
        Ok(StagedStep {
            tokens: rows,
            slots: staging.i64s(slots),
            tok_seq: staging.u32s(tok_seq),
            tok_len: staging.u32s(tok_len),
            tables: staging.u32s(tables),
            max_blocks,
            part_size,
            num_parts,
            partial_floats: partial_rows * (cache.head_dim + 2),
            part_out_floats: partial_rows * cache.head_dim,
        })
    }

    /// The staged step at its addresses in the uploaded `buf`, with the partials from `io`
    /// (kept from step to step: the kernel writes every (max, sum) pair, and every output row
    /// whose max is finite, before the reduce reads them; rows with max = -inf are never read).
    pub fn on(staged: StagedStep, buf: &StepBuf, io: &mut StepIo) -> Result<GpuStep> {
        let (part_out, part_ml) = if staged.num_parts > 1 {
            let (p, _) = io.partials(staged.partial_floats)?;
            (p, p + 4 * staged.part_out_floats as u64)
        } else {
            (0, 0)
        };
        Ok(GpuStep {
            tokens: staged.tokens,
            slots: buf.ptr(staged.slots),
            tok_seq: buf.ptr(staged.tok_seq),
            tok_len: buf.ptr(staged.tok_len),
            tables: buf.ptr(staged.tables),
            max_blocks: staged.max_blocks,
            part_size: staged.part_size,
            num_parts: staged.num_parts,
            part_out,
            part_ml,
            _buf: buf.clone(),
            _own: None,
        })
    }

    /// A step on its own buffers (benchmarks and tests; the sampler's steps share the
    /// backend's).
    pub fn new(cache: &GpuKvCache, seqs: &[SeqStep], num_heads: usize) -> Result<Self> {
        let mut staging = Staging::new();
        let staged = Self::stage(cache, seqs, num_heads, &mut staging)?;
        let mut io = Box::new(StepIo::new(&cache.dev));
        let (buf, _) = io.upload(&staging)?;
        let mut step = Self::on(staged, &buf, &mut io)?;
        step._own = Some(io);
        Ok(step)
    }

    /// Address of the split attention's partials (0 without a split): a graph of the step
    /// bakes it in.
    pub fn partials_ptr(&self) -> u64 {
        self.part_out
    }

    /// Key partitions per token in this step (1 = no split).
    pub fn num_parts(&self) -> usize {
        self.num_parts
    }

    /// Shared memory of an attention block: the warps' merge area (max, sum and output of each
    /// query head) and, for v5, the block-table entries of one partition.
    fn attn_shared_bytes(&self, g: usize, d: usize, block_size: usize) -> u32 {
        let nw = (THREADS / 32) as usize;
        let table = self.part_size.div_ceil(block_size) + 1;
        (4 * (nw * g * (d + 2) + table)) as u32
    }
}

/// The step's q and k against the cache and step they attend over.
fn check_step(cache: &GpuKvCache, step: &GpuStep, q: &Tensor, k: &Tensor) -> Result<()> {
    let (t, _, d) = q.dims3()?;
    let hkv = cache.num_kv_heads;
    if t != step.tokens || d != cache.head_dim || k.dims3()? != (t, hkv, d) {
        bail!(
            "paged attention: q {:?} / k {:?} do not match the step ({} tokens, {hkv} KV heads \
             of {})",
            q.dims(),
            k.dims(),
            step.tokens,
            cache.head_dim
        );
    }
    if q.dtype() != cache.model_dtype {
        bail!(
            "paged attention: q is {:?}, the cache {:?}",
            q.dtype(),
            cache.model_dtype
        );
    }
    Ok(())
}

/// A new buffer of `n` values of `dtype` (f32, else bf16) and its device pointer.
///
/// # Safety
/// Its values are not initialised: the caller's kernels write every one before anything reads
/// it.
unsafe fn uninit_output(
    dev: &candle_core::cuda_backend::CudaDevice,
    dtype: DType,
    n: usize,
) -> Result<(CudaStorage, u64)> {
    Ok(match dtype {
        DType::F32 => {
            let s = unsafe { dev.alloc::<f32>(n)? };
            let p = slice_ptr(dev, &s);
            (CudaStorage::wrap_cuda_slice(s, dev.clone()), p)
        }
        _ => {
            let s = unsafe { dev.alloc::<half::bf16>(n)? };
            let p = slice_ptr(dev, &s);
            (CudaStorage::wrap_cuda_slice(s, dev.clone()), p)
        }
    })
}

/// Joins the split partitions of a step's attention (`parts`: their outputs and their maxima
/// and sums) into `out`, (t, hq, d).
fn reduce_parts(
    cache: &GpuKvCache,
    (t, hq, d): (usize, usize, usize),
    out: u64,
    (pop, pmp): (u64, u64),
    num_parts: usize,
) -> Result<()> {
    let cfg = LaunchConfig {
        grid_dim: (t as u32, hq as u32, 1),
        block_dim: (d.next_multiple_of(32).min(256) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let (hq_i, d_i, np_i) = (hq as i32, d as i32, num_parts as i32);
    let stream = cache.dev.cuda_stream();
    let mut b = stream.launch_builder(&cache.reduce_fn);
    b.arg(&out)
        .arg(&pop)
        .arg(&pmp)
        .arg(&hq_i)
        .arg(&d_i)
        .arg(&np_i);
    // SAFETY: the arguments match the reduce kernel's parameters in kernels/paged_attention.cu
    // (pointers as u64, int as i32), and the buffers live until the step ends (stream order).
    checked(unsafe { b.launch(cfg) })
}

/// Attention over the GPU paged cache for one step.
pub struct GpuPagedAttention<'a> {
    pub cache: &'a mut GpuKvCache,
    pub step: &'a GpuStep,
    /// Time each call on the device with a pair of CUDA events (profiling only): no
    /// synchronisation until [`Self::device_seconds`] reads them.
    pub sync_timing: bool,
    /// A kernel variant's name suffix (`_v4`: the previous version; `_r4`: another number of
    /// rounds), for the attention benchmark and tests; `None` runs the cache's default kernel.
    pub variant: Option<&'static str>,
    pub seconds: f64,
    /// The CUDA events around each call, with `sync_timing`.
    pub events: Vec<(CudaEvent, CudaEvent)>,
    /// Tokens each sequence brings to the step, and the recurrent layers' state slots with
    /// each sequence's slot (models with recurrent layers only).
    pub seq_lens: Vec<usize>,
    pub states: crate::sampler::state_slots::StepSlots<'a>,
    /// What the calls issued since the last [`AttentionBackend::take_cost`].
    pub spent: crate::model::layer_ops::Cost,
}

impl AttentionBackend for GpuPagedAttention<'_> {
    /// The layer's pool of state slots in GPU memory and the step's rows of it, for the Gated
    /// DeltaNet kernels to update in place (`None` for slots on the host).
    fn recurrent_pool(
        &mut self,
        layer: usize,
        values: usize,
    ) -> Result<Option<crate::model::attention::PoolStep>> {
        let (states, slots) = step_slots(&mut self.states, layer)?;
        let step = states.pool_step(layer, values, slots, &self.seq_lens);
        self.spent += states.take_cost();
        step
    }

    /// The sequences' states gathered from their slots (in GPU memory, or on the host and
    /// moved to the device).
    fn recurrent_state(
        &mut self,
        layer: usize,
        values: usize,
    ) -> Result<crate::model::attention::RecurrentStep> {
        let (states, slots) = step_slots(&mut self.states, layer)?;
        let dev = Device::Cuda(self.cache.dev.clone());
        let step = states.step_state(layer, values, slots, &self.seq_lens, &dev);
        self.spent += states.take_cost();
        step
    }

    fn store_recurrent_state(&mut self, layer: usize, state: Tensor) -> Result<()> {
        let (states, slots) = step_slots(&mut self.states, layer)?;
        let r = states.store_step_state(layer, slots, &state);
        self.spent += states.take_cost();
        r
    }

    /// The attention calls' kernels, output buffers and copies of strided inputs, and the state
    /// slots' gathers and scatters.
    fn take_cost(&mut self) -> crate::model::layer_ops::Cost {
        std::mem::take(&mut self.spent)
    }

    fn attend(
        &mut self,
        layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        window: Option<usize>,
    ) -> Result<Tensor> {
        if let Some(w) = window {
            candle_core::bail!(
                "layer {layer}: sliding-window attention (window {w}) is not in the GPU paged \
                 attention kernels yet"
            )
        }
        if !self.sync_timing {
            let t0 = Instant::now();
            let out = self.attend_inner(layer, q, k, v);
            self.seconds += t0.elapsed().as_secs_f64();
            return out;
        }
        let stream = self.cache.dev.cuda_stream();
        let event = || {
            stream
                .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| candle_core::Error::Msg(format!("CUDA event: {e:?}")))
        };
        let start = event()?;
        let out = self.attend_inner(layer, q, k, v)?;
        self.events.push((start, event()?));
        Ok(out)
    }
}

impl GpuPagedAttention<'_> {
    /// Seconds spent in attention: on the device between each call's events with `sync_timing`
    /// (waits for the last), else the host time of the calls (their launches).
    pub fn device_seconds(&self) -> Result<f64> {
        let mut s = self.seconds;
        for (a, b) in &self.events {
            let ms = a
                .elapsed_ms(b)
                .map_err(|e| candle_core::Error::Msg(format!("CUDA event: {e:?}")))?;
            s += ms as f64 / 1e3;
        }
        Ok(s)
    }

    fn attend_inner(&mut self, layer: usize, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        let cache = &*self.cache;
        let step = self.step;
        let (t, hq, d) = q.dims3()?;
        let hkv = cache.num_kv_heads;
        check_step(cache, step, q, k)?;
        let Some((kc, vc)) = cache.layer(layer) else {
            bail!("layer {layer} keeps no keys in the cache");
        };
        let dev = &cache.dev;
        let stream = dev.cuda_stream();
        // copies of strided inputs; the KV write, the attention kernel into its new output, and
        // the reduce of split partitions
        let strided = [q, k, v].iter().filter(|x| !x.is_contiguous()).count() as u64;
        self.spent += StepCosts::paged_attend(strided, step.num_parts > 1);
        let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
        let qp = tensor_ptr(&q)?;
        let (kcp, vcp) = (slice_ptr(dev, kc), slice_ptr(dev, vc));
        let (hkv_i, d_i, bs_i) = (hkv as i32, d as i32, cache.block_size as i32);
        // 1. write the new keys and values
        write_kv(cache, step, layer, &k, &v)?;

        // 2. attention, split over key partitions when the step is small
        let n = t * hq * d;
        // SAFETY: the attention (or its reduce) writes every element of the output.
        let (storage, outp) = unsafe { uninit_output(dev, q.dtype(), n)? };
        let g = hq / hkv;
        let variant_fn;
        let f = match self.variant {
            None => &cache.attn_fn,
            Some(v) => {
                let suffix = kernel_suffix(cache.model_dtype, cache.fp8);
                variant_fn = paged_fn(dev, &attn_name(suffix, d, g, v))?;
                &variant_fn
            }
        };
        let (pop, pmp) = (step.part_out, step.part_ml);
        let (tables, tok_seq, tok_len) = (step.tables, step.tok_seq, step.tok_len);
        let (hq_i, mb_i, ps_i, np_i) = (
            hq as i32,
            step.max_blocks as i32,
            step.part_size as i32,
            step.num_parts as i32,
        );
        let scale = 1f32 / (d as f32).sqrt();
        let cfg = LaunchConfig {
            grid_dim: (t as u32, hkv as u32, step.num_parts as u32),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: step.attn_shared_bytes(g, d, cache.block_size),
        };
        let mut b = stream.launch_builder(f);
        b.arg(&outp)
            .arg(&pop)
            .arg(&pmp)
            .arg(&qp)
            .arg(&kcp)
            .arg(&vcp)
            .arg(&tables)
            .arg(&tok_seq)
            .arg(&tok_len)
            .arg(&hq_i)
            .arg(&hkv_i)
            .arg(&d_i)
            .arg(&bs_i)
            .arg(&mb_i)
            .arg(&ps_i)
            .arg(&np_i)
            .arg(&scale);
        // SAFETY (every launch here): the arguments match the kernel's parameters in
        // kernels/paged_attention.cu (pointers as u64, int as i32, float as f32), and the buffers
        // behind them live until the step ends; candle's stream orders any free after the launch.
        checked(unsafe { b.launch(cfg) })?;
        if step.num_parts > 1 {
            reduce_parts(cache, (t, hq, d), outp, (pop, pmp), step.num_parts)?;
        }
        Ok(Tensor::from_storage(
            Storage::Cuda(storage),
            (t, hq, d),
            BackpropOp::none(),
            false,
        ))
    }
}

/// Writes `k`, `v` (T, Hkv, D), contiguous, into layer `layer` at the step's slots.
pub fn write_kv(
    cache: &GpuKvCache,
    step: &GpuStep,
    layer: usize,
    k: &Tensor,
    v: &Tensor,
) -> Result<()> {
    let (t, hkv, d) = k.dims3()?;
    if t != step.tokens || v.dims3()? != (t, hkv, d) || hkv != cache.num_kv_heads {
        bail!(
            "write_kv: k {:?} / v {:?} do not match the step",
            k.dims(),
            v.dims()
        );
    }
    let Some((kc, vc)) = cache.layer(layer) else {
        bail!("layer {layer} keeps no keys in the cache");
    };
    let dev = &cache.dev;
    let (kp, vp) = (tensor_ptr(k)?, tensor_ptr(v)?);
    let (kcp, vcp) = (slice_ptr(dev, kc), slice_ptr(dev, vc));
    let slots = step.slots;
    let (hkv_i, d_i, bs_i) = (hkv as i32, d as i32, cache.block_size as i32);
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&cache.write_fn);
    b.arg(&kp)
        .arg(&vp)
        .arg(&kcp)
        .arg(&vcp)
        .arg(&slots)
        .arg(&hkv_i)
        .arg(&d_i)
        .arg(&bs_i);
    let cfg = LaunchConfig {
        grid_dim: (t as u32, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match `write_kv_*` in kernels/paged_attention.cu; the tensors and
    // the step outlive the launch (stream order).
    checked(unsafe { b.launch(cfg) })
}

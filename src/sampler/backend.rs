//! The sampler's device, decided once: [`Backend`] is built for the model's device when the
//! engine starts and owns what differs between devices: the paged KV cache (its bytes per
//! token, the memory a default one may take, block copies), how a step's attention runs over
//! it, where the logits of the sampling rows land, which rows' candidates a draw needs, and
//! whether timing waits for the device. The engine asks it and never branches on the device.
//!
//! On the CPU: [`KvCache`] with [`PagedAttention`], logits straight into a reused host buffer,
//! steps run inside rayon's pool. On a CUDA GPU (the `cuda` feature): the GPU cache and kernels
//! of [`super::gpu`], logits on the device, and only each row's best candidates brought to the
//! host when the sampling settings allow it.
//!
//! Knows nothing of requests, sequences or sampling rules.

use anyhow::{bail, Result};
use candle_core::{Device, Tensor};

use super::block_pool::CopyOnWrite;
use super::kv_cache::{KvCache, PagedAttention, SeqStep};
use super::params::SamplingParams;
use super::sampling::CandidateRow;
use super::state_slots::StepSlots;
use crate::model::{ModelConfig, Transformer};

/// A step's logits rows, end to end.
pub enum Logits {
    Host(Vec<f32>),
    Device(Tensor),
}

/// The paged KV cache and the step's device work, on the model's device.
pub enum Backend {
    Cpu {
        cache: KvCache,
        /// The logits rows, reused from step to step (a decode step's rows are megabytes,
        /// which a fresh allocation would zero or fault in every step).
        logits_buf: Vec<f32>,
    },
    #[cfg(feature = "cuda")]
    Cuda(Box<GpuBackend>),
}

/// The GPU's side: the paged cache, the buffers a step's one upload and one download go
/// through, what the last step staged for its sampling rows, and the decode steps' CUDA graphs
/// with the logits the last replayed step left in their kept rows.
#[cfg(feature = "cuda")]
pub struct GpuBackend {
    cache: super::gpu::GpuKvCache,
    io: super::gpu::step_io::StepIo,
    sampling: Option<StagedSampling>,
    graphs: super::gpu::graphs::DecodeGraphs,
    graph_logits: Option<Tensor>,
}

/// A step's sampling rows and their temperatures as staged in its upload, and where.
#[cfg(feature = "cuda")]
struct StagedSampling {
    buf: super::gpu::step_io::StepBuf,
    rows: Vec<u32>,
    rows_at: super::gpu::step_io::Section,
    temperatures: Vec<f32>,
    temperatures_at: super::gpu::step_io::Section,
}

/// Decode steps under CUDA graphs: replayed, captured, and run eagerly under a graph's plan
/// (the first step of each plan, and every step once graphs are off).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct GraphCounts {
    pub replayed: u64,
    pub captured: u64,
    pub eager: u64,
}

/// How a sampling row ranks its logits on the device: 0 for greedy, else its temperature.
pub fn row_temperature(p: &SamplingParams) -> f32 {
    if p.is_greedy() {
        0.0
    } else {
        p.temperature
    }
}

/// Bytes one token's keys and values take in the cache on the model's device.
pub fn kv_cache_bytes_per_token(model: &Transformer, kv_fp8: bool) -> usize {
    #[cfg(feature = "cuda")]
    if model.device().is_cuda() {
        return super::gpu::GpuKvCache::bytes_per_token(model.config(), model.dtype(), kv_fp8);
    }
    let _ = kv_fp8;
    KvCache::bytes_per_token(model.config())
}

/// Memory a default KV cache may take on `device`: a quarter of the host's available memory, or
/// 90% of the GPU's free memory (the weights are loaded by then).
pub fn kv_cache_memory(device: &Device) -> Result<u64> {
    #[cfg(feature = "cuda")]
    if device.is_cuda() {
        let (free, _) = crate::cuda::kernels::memory_info(device)?;
        return Ok(free / 10 * 9);
    }
    let _ = device;
    Ok(crate::machine::available_memory_bytes().unwrap_or(4 << 30) / 4)
}

/// Brings device logits to the host as f32 rows.
pub fn logits_to_host(logits: &Tensor) -> Result<Vec<f32>> {
    use rayon::prelude::*;
    let flat = logits.flatten_all()?;
    if flat.dtype() == candle_core::DType::BF16 {
        let v: Vec<half::bf16> = flat.to_vec1()?;
        return Ok(v.par_iter().map(|x| x.to_f32()).collect());
    }
    Ok(flat.to_dtype(candle_core::DType::F32)?.to_vec1()?)
}

/// A step's work on the device: the sequences' block tables and positions, each one's new
/// tokens, and the recurrent layers' state slots.
pub struct StepInputs<'a> {
    pub seq_steps: Vec<SeqStep<'a>>,
    pub tokens: &'a [u32],
    pub positions: &'a [u32],
    /// The state slots and each scheduled sequence's slot (models with recurrent layers).
    pub states: StepSlots<'a>,
    /// The rows of the step's hidden states that sample, and each one's temperature
    /// ([`row_temperature`]): on a GPU they go up with the step's metadata.
    pub sample_rows: &'a [u32],
    pub temperatures: Vec<f32>,
    pub sync_timing: bool,
}

/// What our GPU sampler cannot run: sliding-window layers (its paged kernels have no window
/// ring yet). The one check behind preflight's refusal and the engine's.
pub fn check_gpu_model(cfg: &ModelConfig) -> Result<()> {
    let sliding = cfg
        .layer_kinds
        .contains(&crate::model::LayerKind::SlidingAttention);
    if let Some(w) = cfg.sliding_window.filter(|_| sliding) {
        bail!(
            "{:?}'s sliding-window layers run in our CPU sampler only (window {w}): the GPU paged \
             kernels have no window ring yet (use device = \"cpu\", or engine = \"mistralrs\", \
             whose windows differ from transformers')",
            cfg.family
        );
    }
    Ok(())
}

impl Backend {
    /// The backend of `model`'s device, with a cache of `num_blocks` blocks of `block_size`
    /// tokens (fp8 keys and values with `kv_fp8`, CUDA only), for steps of up to `max_num_seqs`
    /// sequences.
    pub fn new(
        model: &Transformer,
        block_size: usize,
        num_blocks: usize,
        kv_fp8: bool,
        max_num_seqs: usize,
    ) -> Result<Backend> {
        if model.device().is_cuda() {
            check_gpu_model(model.config())?;
            #[cfg(feature = "cuda")]
            return Ok(Backend::Cuda(Box::new(GpuBackend {
                graphs: super::gpu::graphs::DecodeGraphs::new(
                    model.device().as_cuda_device()?,
                    max_num_seqs,
                ),
                graph_logits: None,
                cache: super::gpu::GpuKvCache::new(
                    model.config(),
                    block_size,
                    num_blocks,
                    model.device(),
                    model.dtype(),
                    kv_fp8,
                )?,
                io: super::gpu::step_io::StepIo::new(model.device().as_cuda_device()?),
                sampling: None,
            })));
        }
        if !model.device().is_cpu() {
            bail!("the sampler runs on the CPU or, built with the cuda feature, on CUDA GPUs");
        }
        // the host runs a step of any size as it comes: no buckets, no graphs
        let _ = max_num_seqs;
        if kv_fp8 {
            bail!("an fp8 KV cache needs the CUDA sampler (build with --features cuda)");
        }
        Ok(Backend::Cpu {
            cache: KvCache::new(model.config(), block_size, num_blocks),
            logits_buf: Vec::new(),
        })
    }

    /// Decode steps on a GPU replay CUDA graphs (the default) or run eagerly (`enforce_eager`);
    /// an error on the CPU, which has none.
    pub fn set_cuda_graphs(&mut self, on: bool) -> Result<()> {
        match self {
            Backend::Cpu { .. } if on => Ok(()),
            Backend::Cpu { .. } => bail!("enforce_eager: CUDA graphs are a cuda device's"),
            #[cfg(feature = "cuda")]
            Backend::Cuda(g) => {
                g.graphs.set_enabled(on);
                Ok(())
            }
        }
    }

    /// Decode steps replayed from CUDA graphs, captured, and run eagerly under a graph's plan
    /// (zeros on the CPU).
    pub fn graph_counts(&self) -> GraphCounts {
        match self {
            Backend::Cpu { .. } => GraphCounts::default(),
            #[cfg(feature = "cuda")]
            Backend::Cuda(g) => {
                let c = g.graphs.counts;
                GraphCounts {
                    replayed: c.replayed,
                    captured: c.captured,
                    eager: c.eager,
                }
            }
        }
    }

    /// Whether the step runs on the host (whose parallel loops want rayon's pool).
    pub fn is_host(&self) -> bool {
        matches!(self, Backend::Cpu { .. })
    }

    pub fn copy_block(&mut self, c: CopyOnWrite) -> Result<()> {
        match self {
            Backend::Cpu { cache, .. } => cache.copy_block(c.src, c.dst),
            #[cfg(feature = "cuda")]
            Backend::Cuda(g) => g.cache.copy_block(c.src, c.dst)?,
        }
        Ok(())
    }

    /// With `sync_timing`, waits for the device so that the next clock reading is device time.
    pub fn synchronize(&self, dev: &Device, sync_timing: bool) -> Result<()> {
        if sync_timing && !self.is_host() {
            dev.synchronize()?;
        }
        Ok(())
    }

    /// The model's final hidden states for the step's tokens, through the paged cache; and the
    /// seconds spent in attention.
    pub fn forward(&mut self, model: &Transformer, step: StepInputs) -> Result<(Tensor, f64)> {
        match self {
            Backend::Cpu { cache, .. } => {
                let dev = model.device();
                let tokens = Tensor::new(step.tokens, dev)?;
                let positions = Tensor::new(step.positions, dev)?;
                let mut attn = PagedAttention::new(cache, step.seq_steps);
                if let Some((states, slots)) = step.states {
                    attn = attn.with_states(states, slots);
                }
                crate::model::clock::mark(None, "step_inputs");
                let h = forward_marked(model, &tokens, &positions, &mut attn)?;
                Ok((h, attn.seconds))
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(g) => g.forward(model, step),
        }
    }

    /// The logits of the hidden `rows` that sample: on the host straight into last step's
    /// buffer (no tensor round trip), on a GPU on the device (the rows as the step's upload
    /// brought them).
    pub fn logits(&mut self, model: &Transformer, hidden: &Tensor, rows: &[u32]) -> Result<Logits> {
        match self {
            Backend::Cpu { logits_buf, .. } => {
                let picked = hidden.index_select(&Tensor::new(rows, hidden.device())?, 0)?;
                let mut out = std::mem::take(logits_buf);
                model.logits_host_into(&picked, &mut out)?;
                Ok(Logits::Host(out))
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(g) => {
                // a step under a graph's plan left its logits in the kept rows
                if let Some(l) = g.graph_logits.take() {
                    if l.dim(0)? == rows.len()
                        && rows.iter().enumerate().all(|(i, &r)| r as usize == i)
                    {
                        return Ok(Logits::Device(l));
                    }
                }
                let Some(s) = g.sampling.as_ref().filter(|s| s.rows == rows) else {
                    bail!("logits: rows {rows:?} are not the step's staged sampling rows")
                };
                let ids = s.buf.tensor(s.rows_at)?;
                let picked =
                    crate::model::ops::pick_rows(hidden, &ids, crate::model::ops::Exec::Sampling)?;
                Ok(Logits::Device(model.logits(&picked)?))
            }
        }
    }

    /// Takes back a step's host rows for the next step.
    pub fn recycle(&mut self, rows: Vec<f32>) {
        match self {
            Backend::Cpu { logits_buf, .. } => *logits_buf = rows,
            #[cfg(feature = "cuda")]
            Backend::Cuda(_) => {}
        }
    }

    /// Each device row's best candidates, each as many as the row's own settings need
    /// ([`super::sampling::candidates_needed`] for its `(settings, generated tokens)` in
    /// `rows`). `None` where some row's draw needs its whole row (and on the CPU, whose rows are
    /// on the host): the rows go to the host.
    pub fn candidates(
        &mut self,
        logits: &Tensor,
        rows: &[(&SamplingParams, usize)],
    ) -> Result<Option<Vec<CandidateRow>>> {
        match self {
            Backend::Cpu { .. } => {
                let _ = (logits, rows);
                Ok(None)
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(g) => g.candidates(logits, rows),
        }
    }
}

#[cfg(feature = "cuda")]
impl GpuBackend {
    /// [`Backend::forward`] on the GPU: the step's one upload, then the layers over it.
    fn forward(&mut self, model: &Transformer, step: StepInputs) -> Result<(Tensor, f64)> {
        use super::gpu::step_io::Staging;
        use super::gpu::{GpuPagedAttention, GpuStep};
        let cfg = model.config();
        // the kernels index tables by these: checked here, where they are plain numbers
        if let Some(t) = step.tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
            bail!(
                "token id {t} is outside the vocabulary ({})",
                cfg.vocab_size
            )
        }
        if let Some(p) = step
            .positions
            .iter()
            .find(|&&p| p as usize >= cfg.max_position_embeddings)
        {
            bail!(
                "position {p} is past the model's {} positions",
                cfg.max_position_embeddings
            )
        }
        if step.temperatures.len() != step.sample_rows.len() {
            bail!(
                "{} temperatures for {} sampling rows",
                step.temperatures.len(),
                step.sample_rows.len()
            )
        }
        self.graph_logits = None;
        if let Some(plan) = self.graph_plan(cfg, &step) {
            return self.forward_planned(model, step, plan);
        }
        let mut staging = Staging::new();
        let tokens_at = staging.u32s(step.tokens.iter().copied());
        let positions_at = staging.u32s(step.positions.iter().copied());
        let staged = GpuStep::stage(&self.cache, &step.seq_steps, cfg.num_heads, &mut staging)?;
        let seq_lens: Vec<usize> = step.seq_steps.iter().map(|s| s.num_new).collect();
        let state_rows = step.states.as_ref().map(|(_, slots)| {
            (
                staging.u32s(slots.iter().map(|&s| s as u32)),
                crate::model::attention::seq_starts(&seq_lens).map(|s| staging.u32s(s)),
            )
        });
        let (buf, meta) = self.upload(staging, staged, step.sample_rows, step.temperatures)?;
        let mut states = step.states;
        if let (Some((slots_of, slots)), Some((ids, starts))) = (states.as_mut(), state_rows) {
            let starts = starts.map(|s| buf.tensor(s)).transpose()?;
            slots_of.set_step_rows(slots, buf.tensor(ids)?, &seq_lens, starts)?;
        }
        let (tokens, positions) = (buf.tensor(tokens_at)?, buf.tensor(positions_at)?);
        let mut attn = GpuPagedAttention {
            cache: &mut self.cache,
            step: &meta,
            sync_timing: step.sync_timing,
            variant: None,
            seconds: 0.0,
            events: Vec::new(),
            seq_lens,
            states,
            spent: Default::default(),
        };
        crate::model::clock::mark(None, "step_inputs");
        let h = forward_marked(model, &tokens, &positions, &mut attn);
        // the slot ids were views of this step's upload, which the next step rewrites
        if let Some((slots_of, _)) = attn.states.as_mut() {
            slots_of.forget_step_rows();
        }
        let h = h?;
        let seconds = attn.device_seconds()?;
        Ok((h, seconds))
    }

    /// The step's one upload: `staging` with the sampling rows and their temperatures last (a
    /// graph reads nothing after its own sections), its metadata at their addresses; the rows
    /// kept for [`Backend::logits`] and [`Backend::candidates`].
    fn upload(
        &mut self,
        mut staging: super::gpu::step_io::Staging,
        staged: super::gpu::paged::StagedStep,
        rows: &[u32],
        temperatures: Vec<f32>,
    ) -> Result<(super::gpu::step_io::StepBuf, super::gpu::GpuStep)> {
        let rows_at = staging.u32s(rows.iter().copied());
        let temperatures_at = staging.f32s(temperatures.iter().copied());
        // last step's rows are views of words this upload rewrites
        self.sampling = None;
        let (buf, _) = self.io.upload(&staging)?;
        let meta = super::gpu::GpuStep::on(staged, &buf, &mut self.io)?;
        self.sampling = Some(StagedSampling {
            buf: buf.clone(),
            rows: rows.to_vec(),
            rows_at,
            temperatures,
            temperatures_at,
        });
        Ok((buf, meta))
    }

    /// The plan a step runs under a CUDA graph with, if it may: graphs on, no q/k/v bias, no
    /// timing split or clock, a recurrent model's slots on the GPU (its padded rows take the
    /// padding slot), a decode step (one token per sequence, each sampling) of at most the
    /// largest bucket's rows.
    fn graph_plan(
        &self,
        cfg: &ModelConfig,
        step: &StepInputs,
    ) -> Option<crate::sampler::gpu_plan::GraphPlan> {
        let n = step.seq_steps.len();
        let decode = step.seq_steps.iter().all(|s| s.num_new == 1)
            && step.tokens.len() == n
            && step.sample_rows.len() == n
            && step
                .sample_rows
                .iter()
                .enumerate()
                .all(|(i, &r)| r as usize == i);
        // (a Qwen2 q/k/v bias is a broadcast add, whose candle kernel uploads its layout from
        // the host: such a graph would be refused)
        if !self.graphs.on()
            || cfg.attention_bias
            || step.sync_timing
            || crate::model::clock::running()
            || step
                .states
                .as_ref()
                .is_some_and(|(s, _)| s.padding_slot().is_none())
            || !decode
        {
            return None;
        }
        let rows = self.graphs.bucket(n)?;
        let blocks = step
            .seq_steps
            .iter()
            .map(|s| s.block_table.blocks.len())
            .max()
            .unwrap_or(1);
        Some(self.cache.graph_plan(rows, blocks))
    }

    /// [`Self::forward`] of a decode step under a CUDA graph's `plan`: the step's upload padded
    /// to the plan's rows, then the forward and the LM head replayed (or captured, or run
    /// eagerly: [`super::gpu::graphs`]) into kept rows; the logits wait in
    /// `graph_logits` for [`Backend::logits`].
    fn forward_planned(
        &mut self,
        model: &Transformer,
        step: StepInputs,
        plan: crate::sampler::gpu_plan::GraphPlan,
    ) -> Result<(Tensor, f64)> {
        use super::gpu::step_io::Staging;
        use super::gpu::GpuStep;
        let cfg = model.config();
        let n = step.seq_steps.len();
        let pad = plan.rows - n;
        let mut staging = Staging::new();
        let tokens_at = staging.u32s(
            step.tokens
                .iter()
                .copied()
                .chain(std::iter::repeat_n(0, pad)),
        );
        let positions_at = staging.u32s(
            step.positions
                .iter()
                .copied()
                .chain(std::iter::repeat_n(0, pad)),
        );
        let staged = GpuStep::stage_as(
            &self.cache,
            &step.seq_steps,
            cfg.num_heads,
            &mut staging,
            Some(&plan),
        )?;
        // a recurrent model's slots: the padded rows' is the padding slot
        let mut state_ids_at = None;
        let mut step = step;
        if let Some((slots_of, slots)) = step.states.as_mut() {
            let Some(pad_slot) = slots_of.padding_slot() else {
                bail!("a graph's step of a recurrent model needs its slots on the GPU")
            };
            slots.resize(plan.rows, pad_slot);
            state_ids_at = Some(staging.u32s(slots.iter().map(|&s| s as u32)));
        }
        let (buf, meta) = self.upload(staging, staged, step.sample_rows, step.temperatures)?;
        let (tokens, positions) = (buf.tensor(tokens_at)?, buf.tensor(positions_at)?);
        let mut states = step.states;
        if let (Some((slots_of, slots)), Some(ids_at)) = (states.as_mut(), state_ids_at) {
            slots_of.set_step_rows(slots, buf.tensor(ids_at)?, &vec![1; plan.rows], None)?;
        }
        let GpuBackend { cache, graphs, .. } = self;
        let addresses = [buf.base(), meta.partials_ptr()];
        let mut body = PlannedStep {
            model,
            tokens,
            positions,
            cache,
            meta: &meta,
            rows: plan.rows,
            real: n,
            states,
            saved: Vec::new(),
        };
        let out = graphs.run(plan, addresses, n, &mut body);
        // the slot ids were views of this step's upload, which the next step rewrites
        if let Some((slots_of, _)) = body.states.as_mut() {
            slots_of.forget_step_rows();
        }
        let out = out?;
        self.graph_logits = Some(out.logits);
        Ok((out.hidden, 0.0))
    }

    /// [`Backend::candidates`] on the GPU: the rows' temperatures from the step's upload, the
    /// candidates into the kept output buffer and back in one copy.
    fn candidates(
        &mut self,
        logits: &Tensor,
        rows: &[(&SamplingParams, usize)],
    ) -> Result<Option<Vec<CandidateRow>>> {
        use super::gpu::sampling::{top_candidates_with, Temperatures};
        // a row that needs its whole row sends the batch to the host (one copy, the draws in
        // parallel), as a batch of one setting always did
        let Some(needs) = rows
            .iter()
            .map(|&(p, generated)| super::sampling::candidates_needed(p, generated))
            .collect::<Option<Vec<usize>>>()
        else {
            return Ok(None);
        };
        let Some(k) = needs.iter().max().copied() else {
            return Ok(None);
        };
        // one temperature for the launch when all rows agree
        let per_row: Vec<f32> = rows.iter().map(|&(p, _)| row_temperature(p)).collect();
        let (temperatures, at) = match rows.first() {
            Some(&(p, _))
                if per_row
                    .iter()
                    .all(|t| t.to_bits() == row_temperature(p).to_bits()) =>
            {
                let one = Temperatures::One {
                    greedy: p.is_greedy(),
                    temperature: p.temperature,
                };
                (one, None)
            }
            _ => {
                let Some(s) = self.sampling.as_ref().filter(|s| {
                    s.temperatures.len() == per_row.len()
                        && s.temperatures
                            .iter()
                            .zip(&per_row)
                            .all(|(a, b)| a.to_bits() == b.to_bits())
                }) else {
                    bail!("candidates: the rows' temperatures are not the step's staged ones")
                };
                let at = s.buf.ptr(s.temperatures_at);
                (Temperatures::PerRow(per_row), Some(at))
            }
        };
        let got = top_candidates_with(logits, k, &temperatures, at, &mut self.io)?;
        Ok(Some(
            got.into_iter()
                .zip(needs)
                .map(|(mut c, n)| {
                    c.truncate(n);
                    c
                })
                .collect(),
        ))
    }
}

/// A decode step under a CUDA graph's plan, as [`super::gpu::graphs::DecodeGraphs`] runs it:
/// the model's forward over the step's upload, then the LM head on every row; a recurrent
/// model's states of the real rows kept and put back for the check of a new graph.
#[cfg(feature = "cuda")]
struct PlannedStep<'a, 's> {
    model: &'a Transformer,
    tokens: Tensor,
    positions: Tensor,
    cache: &'a mut super::gpu::GpuKvCache,
    meta: &'a super::gpu::GpuStep,
    rows: usize,
    real: usize,
    states: StepSlots<'s>,
    /// Each recurrent layer's states of the real rows, kept by `save`.
    saved: Vec<Option<Tensor>>,
}

#[cfg(feature = "cuda")]
impl super::gpu::graphs::StepBody for PlannedStep<'_, '_> {
    fn run(&mut self) -> candle_core::Result<(Tensor, Tensor)> {
        let mut attn = super::gpu::GpuPagedAttention {
            cache: &mut *self.cache,
            step: self.meta,
            sync_timing: false,
            variant: None,
            seconds: 0.0,
            events: Vec::new(),
            seq_lens: vec![1; self.rows],
            states: self
                .states
                .as_mut()
                .map(|(s, slots)| (&mut **s, slots.clone())),
            spent: Default::default(),
        };
        let h = self
            .model
            .forward_hidden(&self.tokens, &self.positions, &mut attn)?;
        let l = self.model.logits(&h)?;
        Ok((h, l))
    }

    fn save_bytes(&self) -> u64 {
        self.states
            .as_ref()
            .map_or(0, |(s, _)| s.step_rows_bytes(self.real))
    }

    fn save(&mut self) -> candle_core::Result<()> {
        self.saved = match self.states.as_ref() {
            Some((s, _)) => s.save_step_rows(self.real)?,
            None => Vec::new(),
        };
        Ok(())
    }

    fn rewind(&mut self) -> candle_core::Result<()> {
        if let Some((s, _)) = self.states.as_mut() {
            s.restore_step_rows(&self.saved)?;
        }
        Ok(())
    }
}

/// The model's forward; under a running clock ([`crate::model::clock`]) with a mark after each
/// op (the counting wrapper carrying the marks, nothing counted).
fn forward_marked(
    model: &Transformer,
    tokens: &Tensor,
    positions: &Tensor,
    attn: &mut dyn crate::model::attention::AttentionBackend,
) -> Result<Tensor> {
    if !crate::model::clock::running() {
        return Ok(model.forward_hidden(tokens, positions, attn)?);
    }
    let mut counts = crate::model::layer_ops::Counts::timing();
    let count = crate::model::transformer::CountInto {
        counts: &mut counts,
        as_cuda: false,
    };
    Ok(model.forward_hidden_counted(tokens, positions, attn, Some(count))?)
}

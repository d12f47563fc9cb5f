//! The training memory budget, printed before step 1 and checked by `pipeline preflight`, for
//! the device the run trains on (host RAM on the CPU, GPU memory on a GPU): the f32 master
//! weights and the compute dtype's working copy, AdamW's moments, the f32 gradient sums and a
//! micro-batch's fresh gradients, the activations with and without recompute, the LM head's
//! chunk, and the optimizer update's temporaries.
//!
//! Activations are counted from what the differentiable forward keeps per token and layer (norm
//! intermediates, projections, RoPE, the attention's output and per-row log-sum-exp, the SwiGLU
//! intermediates) in the compute dtype; attention keeps no `(heads, L, L)` tensor on any path
//! (the fused CPU op, or the query-blocked one of `model::attention::block`), only one block's
//! f32 scores while a layer runs. The peak is the larger of the backward's (activations, the
//! head's chunk and the fresh gradients) and the update's. Also here: the GPUs a plan can name
//! and their peak rates, for MFU. Knows nothing of the training loop.

use candle_core::{DType, Device};

use super::settings::{StepSize, TrainOps, TrainSettings};
use crate::model::{LayerKind, ModelConfig};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// f32 master weights.
    pub master: u64,
    /// The compute dtype's working copy (0 when computing in f32: the master is the model).
    pub working: u64,
    /// AdamW's two moments (on the device unless offloaded to the host).
    pub optimizer: u64,
    /// The step's f32 gradient sums.
    pub grad_sums: u64,
    /// A micro-batch's gradients before they are summed (0 when they are the sums: one f32
    /// micro-batch per step): every parameter's without recompute, one layer's or the
    /// embedding's with it.
    pub grads_fresh: u64,
    pub grads_fresh_recompute: u64,
    /// What the forward keeps for the backward, and the backward's own peak over it.
    pub activations: (u64, u64),
    pub activations_recompute: (u64, u64),
    /// The LM head and loss over every loss position at once, or over a chunk.
    pub logits: u64,
    pub logits_chunked: u64,
    /// The optimizer update's temporaries (candle ops over slices of the largest tensor; 0 for
    /// the in-place host passes).
    pub update: u64,
    /// The CUDA context, cuBLAS's workspaces and the allocator's slack (0 on the CPU).
    pub runtime: u64,
    /// The largest tensor in f32: what a checkpoint or export holds on the host at a time.
    pub largest_tensor: u64,
    /// Per layer, with recompute: what it keeps when it keeps its activations instead
    /// (`kept_layers`), its backward's peak over them, and its fresh gradients; a layer's input
    /// (what recompute keeps of each), and the attention's block beside a backward.
    pub layer_input: u64,
    pub attn_block: u64,
    pub layer_kept: Vec<u64>,
    pub layer_backward: Vec<u64>,
    pub layer_fresh: Vec<u64>,
    /// The moments live in host memory (`optimizer_offload`).
    pub offloaded: bool,
}

impl Budget {
    /// What the configured run holds at its peak, on its device.
    pub fn total(&self, s: &TrainSettings) -> u64 {
        self.resident() + self.transient(s)
    }

    /// What lives on the device through the whole run: weights, moments (unless offloaded),
    /// gradient sums, the runtime.
    pub fn resident(&self) -> u64 {
        let moments = if self.offloaded { 0 } else { self.optimizer };
        self.master + self.working + moments + self.grad_sums + self.runtime
    }

    /// The step's transient peak: the forward and backward's or the update's, whichever is
    /// larger; with recompute, the last `kept_layers` keeping their activations (none unless
    /// set: the least the run needs).
    pub fn transient(&self, s: &TrainSettings) -> u64 {
        self.transient_kept(s, s.kept_layers.unwrap_or(0))
    }

    /// [`Self::total`] with the last `kept` layers keeping their activations (recompute).
    pub fn total_kept(&self, s: &TrainSettings, kept: usize) -> u64 {
        self.resident() + self.transient_kept(s, kept)
    }

    /// The most layers (from the last) that keep their activations with the run's total within
    /// `limit` bytes (recompute; 0 without it, or when even none fits).
    pub fn kept_layers_within(&self, s: &TrainSettings, limit: u64) -> usize {
        if !s.recompute {
            return 0;
        }
        (0..=self.layer_kept.len())
            .rev()
            .find(|&k| self.total_kept(s, k) <= limit)
            .unwrap_or(0)
    }

    /// [`Self::transient`] with the last `kept` layers keeping their activations.
    fn transient_kept(&self, s: &TrainSettings, kept: usize) -> u64 {
        let (act, fresh) = if s.recompute {
            let n = self.layer_kept.len();
            let top = n - kept.min(n)..n;
            let kept_bytes: u64 = self.layer_kept[top.clone()].iter().sum();
            let backward = self.layer_backward[top.clone()]
                .iter()
                .max()
                .copied()
                .unwrap_or(0);
            let fresh: u64 = self.layer_fresh[top].iter().sum();
            // a kept layer's input is no longer kept apart; the kept layers' backward has the
            // attention's block beside it, as without recompute
            let kept_backward = if kept > 0 {
                backward + self.attn_block
            } else {
                0
            };
            (
                (
                    self.activations_recompute.0 + kept_bytes
                        - self.layer_input * kept.min(n) as u64,
                    self.activations_recompute.1.max(kept_backward),
                ),
                self.grads_fresh_recompute.max(fresh),
            )
        } else {
            (self.activations, self.grads_fresh)
        };
        let logits = if s.loss_chunk_tokens > 0 {
            self.logits_chunked
        } else {
            self.logits
        };
        (act.0 + logits.max(act.1) + fresh).max(self.update)
    }

    /// Host memory beside it: the offloaded moments, and one tensor at a time of a checkpoint
    /// or export (for a GPU run; a CPU run's budget is all host memory).
    pub fn host(&self) -> u64 {
        let moments = if self.offloaded { self.optimizer } else { 0 };
        moments + 2 * self.largest_tensor
    }

    pub fn lines(&self, s: &TrainSettings) -> Vec<String> {
        use crate::bytes::format_bytes as f;
        let mark = |on: bool| if on { "  <- this run" } else { "" };
        let chunked = s.loss_chunk_tokens > 0;
        let fresh = if s.recompute {
            self.grads_fresh_recompute
        } else {
            self.grads_fresh
        };
        let mut out = vec![format!(
            "  master weights (f32)          {}",
            f(self.master)
        )];
        if self.working > 0 {
            out.push(format!(
                "  working copy ({:?})           {}",
                s.compute(),
                f(self.working)
            ));
        }
        out.extend([
            format!(
                "  optimizer state (m, v)        {}{}",
                f(self.optimizer),
                if self.offloaded { " (on the host)" } else { "" }
            ),
            format!("  gradient sums (f32)           {}", f(self.grad_sums)),
            format!("  micro-batch gradients         {}", f(fresh)),
            format!(
                "  activations                   {}{}",
                f(self.activations.0 + self.activations.1),
                mark(!s.recompute)
            ),
            format!(
                "  activations with recompute    {}{}",
                f(self.activations_recompute.0 + self.activations_recompute.1),
                mark(s.recompute)
            ),
            format!(
                "  logits, all at once           {}{}",
                f(self.logits),
                mark(!chunked)
            ),
            format!(
                "  logits, chunked               {}{}",
                f(self.logits_chunked),
                mark(chunked)
            ),
            format!("  optimizer update temporaries  {}", f(self.update)),
        ]);
        if self.runtime > 0 {
            out.push(format!(
                "  CUDA context, workspaces      {}",
                f(self.runtime)
            ));
        }
        out.push(format!(
            "  total at the peak             {} (weights, state and sums {}, the step's peak {})",
            f(self.total(s)),
            f(self.resident()),
            f(self.transient(s))
        ));
        out
    }
}

/// The budget of training `cfg` (with `params` parameters) under `s`, every position carrying a
/// loss (an upper bound when the data is not known).
pub fn budget(cfg: &ModelConfig, params: u64, s: &TrainSettings) -> Budget {
    budget_with(cfg, params, s, 1.0)
}

/// [`budget`] for data whose share `loss_share` of the tokens carries a loss (completion
/// tokens: only they reach the LM head).
///
/// Calibrated on the CPU with `pipeline bench train` (peak RSS of a step, see docs/training.md's
/// table): what each layer keeps is counted from the ops that run, the rest is measured: the
/// backward's peak over the kept activations (see `backward` below), the candle-op head's 2.5
/// f32 copies of its logits, the update's nine f32 temporaries per slice.
pub fn budget_with(cfg: &ModelConfig, params: u64, s: &TrainSettings, loss_share: f64) -> Budget {
    let compute = s.compute();
    // bytes per computed value; our CPU ops (f32 on the CPU), or the device-generic composition
    let cb = compute.size_in_bytes() as u64;
    let host_ops = !s.on_gpu() && compute == DType::F32 && s.ops == TrainOps::Auto;
    let tokens = s.micro_batch_tokens as u64;
    let seq = s.max_seq_len as u64;
    let (h, i, v) = (
        cfg.hidden_size as u64,
        cfg.intermediate_size as u64,
        cfg.vocab_size as u64,
    );
    let per_token_layer = |kind| kept_per_token(cfg, kind, host_ops, cb);
    let attn_block = attention_block_bytes(cfg, host_ops, seq);
    // bf16 on the CPU: the matmuls' f32 copies (`emulated_per_token`) and the layers' weights
    // in f32
    let emulated = cb < 4 && !s.on_gpu();
    let emulation = |kind| u64::from(emulated) * emulated_per_token(cfg, kind);
    let emulated_weights = |l: usize| u64::from(emulated) * cfg.layer_params(l) as u64 * 4;
    let layer_bytes = |kind| per_token_layer(kind) * tokens * cb + emulation(kind) * tokens;
    let all_layers: u64 = cfg.layer_kinds.iter().map(|k| layer_bytes(*k)).sum();
    // The backward's peak over what a layer keeps, in tenths (measured with `bench train`): an
    // attention layer's is about twice its kept values (1.6-2 times measured); a Gated DeltaNet
    // layer's with recompute about once (1.07); bf16 on the CPU with recompute 1.2 times (its
    // kept values count the emulation's f32 copies, which the gradients do not double).
    let backward = |kind: LayerKind, recompute: bool| match (kind, recompute) {
        (LayerKind::GatedDeltaNet, true) => 11,
        (LayerKind::Attention | LayerKind::SlidingAttention, true) if emulated => 12,
        _ => 20,
    };
    let largest_backward = |recompute: bool| {
        cfg.layer_kinds
            .iter()
            .map(|k| layer_bytes(*k) * backward(*k, recompute) / 10)
            .max()
            .unwrap_or(0)
    };
    let layers = cfg.num_layers() as u64;
    let state = s.optimizer_state.moment_bytes();
    let loss_rows = ((tokens as f64 * loss_share.clamp(0.0, 1.0)).ceil() as u64).max(1);
    let chunk = if s.loss_chunk_tokens == 0 {
        loss_rows
    } else {
        (s.loss_chunk_tokens as u64).min(loss_rows)
    };
    let head = |rows| head_bytes(cfg, rows, tokens, cb, host_ops, emulated);
    let embed = v * h;
    let largest_tensor = embed.max(i * h);
    let largest_layer_params = (0..cfg.num_layers())
        .map(|l| cfg.layer_params(l) as u64)
        .max()
        .unwrap_or(0);
    // one micro-batch per step: in f32 the first micro-batch's gradients become the sums
    let single = match s.step_size() {
        StepSize::Tokens(t) => t as u64 <= tokens,
        StepSize::Rows(r) => r as u64 * seq <= tokens,
    };
    let fresh = |n: u64| if single && cb == 4 { 0 } else { n * cb };
    Budget {
        master: params * 4,
        working: if cb < 4 { params * cb } else { 0 },
        optimizer: params * state,
        grad_sums: params * 4,
        grads_fresh: fresh(params),
        grads_fresh_recompute: fresh(largest_layer_params.max(embed)),
        activations: (
            all_layers
                + 2 * h * tokens * cb
                + attn_block
                + (0..cfg.num_layers()).map(emulated_weights).sum::<u64>(),
            largest_backward(false),
        ),
        activations_recompute: (
            (layers + 1) * h * tokens * cb,
            largest_backward(true)
                + attn_block
                + (0..cfg.num_layers())
                    .map(emulated_weights)
                    .max()
                    .unwrap_or(0),
        ),
        logits: head(loss_rows),
        logits_chunked: head(chunk),
        // the in-place host passes on the CPU (whatever the compute dtype: the master is f32)
        update: if !s.on_gpu() && s.ops == TrainOps::Auto {
            0
        } else {
            9 * largest_tensor.min(super::adamw::SLICE as u64) * 4
        },
        runtime: if s.on_gpu() { 1 << 30 } else { 0 },
        largest_tensor: largest_tensor * 4,
        offloaded: s.optimizer_offload,
        layer_input: h * tokens * cb,
        attn_block,
        layer_kept: cfg
            .layer_kinds
            .iter()
            .enumerate()
            .map(|(l, k)| layer_bytes(*k) + emulated_weights(l))
            .collect(),
        layer_backward: cfg
            .layer_kinds
            .iter()
            .map(|k| layer_bytes(*k) * backward(*k, false) / 10)
            .collect(),
        layer_fresh: (0..cfg.num_layers())
            .map(|l| fresh(cfg.layer_params(l) as u64))
            .collect(),
    }
}

/// Values the differentiable forward keeps per token in a layer of `kind` (`cb`: bytes per
/// computed value; `host_ops`: our CPU ops, else the device-generic composition).
fn kept_per_token(cfg: &ModelConfig, kind: LayerKind, host_ops: bool, cb: u64) -> u64 {
    let (h, i) = (cfg.hidden_size as u64, cfg.intermediate_size as u64);
    let (hq, hkv, d) = (
        cfg.num_heads as u64,
        cfg.num_kv_heads as u64,
        cfg.head_dim as u64,
    );
    // Gemma's two more norms per layer: our ops keep each one's output; composed, its input,
    // f32 copy and output
    let sandwich = match (cfg.sandwich_norms, host_ops) {
        (false, _) => 0,
        (true, true) => 2 * h,
        (true, false) => 6 * h,
    };
    let gate = if cfg.attention_gate { 3 * hq * d } else { 0 };
    match kind {
        // our ops: each norm's output (2h), o_proj, residuals and down (3h), the SwiGLU's
        // gate, up and product (3i); q/k/v, their norms and RoPE, the attention's output
        LayerKind::Attention | LayerKind::SlidingAttention if host_ops => {
            5 * h + 3 * i + (hq + 2 * hkv) * d + 2 * (hq + hkv) * d + hq * d + gate + sandwich
        }
        // composed: two RMS norms (3h each), o_proj and residuals (4h), SwiGLU (4i); q/k/v,
        // their norms (3 each) and RoPE (4 each), the heads-first copies, GQA expansion,
        // output and its transpose (6 hq d), the log-sum-exp
        LayerKind::Attention | LayerKind::SlidingAttention => {
            10 * h
                + 4 * i
                + (hq + 2 * hkv) * d
                + 7 * (hq + hkv) * d
                + 6 * hq * d
                + hq
                + gate
                + sandwich
        }
        // Gated DeltaNet: the projections, conv and SiLU (8 conv_dim), the heads'
        // normalised, repeated and chunked copies (9 Hv (dk + dv)), the chunk's decay, L and
        // T matrices and the inverse's halves (10 Hv C), the gated norm (6 value_dim); its
        // tensors are f32 whatever the compute dtype (fitted to `bench train` on hybrid-20m)
        LayerKind::GatedDeltaNet => {
            10 * h
                + 4 * i
                + cfg.linear.map_or(0, |l| {
                    let (nv, dk, dv) = (
                        l.num_value_heads as u64,
                        l.key_head_dim as u64,
                        l.value_head_dim as u64,
                    );
                    let c = crate::model::layer_ops::candle_deltanet::CHUNK as u64;
                    (8 * l.conv_dim() as u64
                        + 9 * nv * (dk + dv)
                        + 10 * nv * c
                        + 6 * l.value_dim() as u64)
                        * 4
                        / cb
                })
        }
    }
}

/// One attention block's f32 scores, exponentials, probabilities and their gradient while a
/// layer runs, on the device-generic path (the CPU's fused op keeps less): rows of `seq`.
fn attention_block_bytes(cfg: &ModelConfig, host_ops: bool, seq: u64) -> u64 {
    let block = crate::model::attention::block::BLOCK as u64;
    let has_attention = cfg
        .layer_kinds
        .iter()
        .any(|k| matches!(k, LayerKind::Attention | LayerKind::SlidingAttention));
    if has_attention && !host_ops {
        4 * cfg.num_heads as u64 * block.min(seq) * seq * 4
    } else {
        0
    }
}

/// bf16 on the CPU: each matmul runs on f32 copies of its operands and rounds its f32 result
/// (see `model::ops::matmul`), and the graph keeps all three: per token the projections' inputs
/// (q, k, v, o, gate, up, down) and outputs in f32 (a GPU's bf16 GEMM keeps none of these).
/// The bytes per token of a layer of `kind`.
fn emulated_per_token(cfg: &ModelConfig, kind: LayerKind) -> u64 {
    let (h, i) = (cfg.hidden_size as u64, cfg.intermediate_size as u64);
    let (hq, hkv, d) = (
        cfg.num_heads as u64,
        cfg.num_kv_heads as u64,
        cfg.head_dim as u64,
    );
    let mixer = match kind {
        LayerKind::Attention | LayerKind::SlidingAttention => {
            3 * h + hq * d + (hq + 2 * hkv) * d + h
        }
        LayerKind::GatedDeltaNet => cfg.linear.map_or(0, |l| {
            5 * h + l.value_dim() as u64 + l.conv_dim() as u64 + h
        }),
    };
    (mixer + 2 * h + i + 2 * i + h) * 4
}

/// The head over `rows` positions of a micro-batch of `tokens`: on our packed gemm (`host_ops`),
/// the logits (the gradient overwrites them); through candle ops, 2.5 f32 copies of the logits
/// and one in the compute dtype below f32 (`cb` bytes; `emulated`: bf16 on the CPU, with the
/// head's weight in f32). Plus the hidden states' gradient.
fn head_bytes(
    cfg: &ModelConfig,
    rows: u64,
    tokens: u64,
    cb: u64,
    host_ops: bool,
    emulated: bool,
) -> u64 {
    let (v, h) = (cfg.vocab_size as u64, cfg.hidden_size as u64);
    let logits = if host_ops {
        rows * v * 4
    } else if emulated {
        rows * v * 10 + v * h * 4
    } else {
        rows * v * 10 + if cb < 4 { rows * v * cb } else { 0 }
    };
    logits + tokens * h * cb
}

/// Disk a run writes: the export in `dtype_bytes`, and its checkpoints of master weights and
/// moments: `keep` of them plus the one being written, or as many as a run of `steps` steps
/// writes (every `checkpoint_every`, and the last) when that is fewer.
pub fn disk_bytes(params: u64, dtype_bytes: u64, s: &TrainSettings, steps: Option<u64>) -> u64 {
    let state = s.optimizer_state.moment_bytes();
    let kept = s.keep_checkpoints as u64 + 1;
    let steps = match (steps, s.max_steps) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let written = steps.map(|n| n.div_ceil(s.checkpoint_every.max(1)).max(1));
    params * dtype_bytes + written.map_or(kept, |w| w.min(kept)) * params * (4 + state)
}

/// Rows in one optimizer step for rows of `row_tokens` tokens: `tokens_per_step` over the row,
/// else `rows_per_step`, else 32.
pub fn rows_per_step(s: &TrainSettings, row_tokens: u64) -> u64 {
    match (s.rows_per_step, s.tokens_per_step) {
        (_, Some(t)) => (t as u64 / row_tokens.max(1)).max(1),
        (Some(r), _) => r as u64,
        (None, None) => 32,
    }
}

/// Optimizer steps a run over `rows` rows of `row_tokens` tokens takes (`max_steps` caps it).
pub fn planned_steps(s: &TrainSettings, rows: u64, row_tokens: u64) -> u64 {
    let per_step = rows_per_step(s, row_tokens);
    let steps = (rows * s.epochs).div_ceil(per_step).max(1);
    s.max_steps.map_or(steps, |m| steps.min(m))
}

/// A GPU a plan can name: its memory and dense peak rates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gpu {
    pub name: &'static str,
    /// Bytes of device memory.
    pub memory: u64,
    /// Dense bf16 tensor-core peak, FLOP/s.
    pub bf16_flops: f64,
    /// f32 (TF32 off) peak, FLOP/s.
    pub f32_flops: f64,
    /// Memory bandwidth, bytes/s (0: unknown): decode speed scales with it.
    pub bandwidth: f64,
}

/// Known GPUs, by the names `--gpu` takes and the prefixes of their CUDA device names (NVIDIA's
/// data sheets, SXM parts; dense, no sparsity).
pub const GPUS: &[(&str, Gpu)] = &[
    (
        "h100",
        Gpu {
            name: "NVIDIA H100 80GB",
            memory: 80 * GB,
            bf16_flops: 989e12,
            f32_flops: 67e12,
            bandwidth: 3.35e12,
        },
    ),
    (
        "h200",
        Gpu {
            name: "NVIDIA H200 141GB",
            memory: 141 * GB,
            bf16_flops: 989e12,
            f32_flops: 67e12,
            bandwidth: 4.8e12,
        },
    ),
    (
        "b200",
        Gpu {
            name: "NVIDIA B200 180GB",
            memory: 180 * GB,
            bf16_flops: 2250e12,
            f32_flops: 75e12,
            bandwidth: 8.0e12,
        },
    ),
    (
        "a100",
        Gpu {
            name: "NVIDIA A100 80GB",
            memory: 80 * GB,
            bf16_flops: 312e12,
            f32_flops: 19.5e12,
            bandwidth: 2.04e12,
        },
    ),
];

const GB: u64 = 1_000_000_000;

/// `h100`, `h200`, `b200`, `a100`, or a memory size (`80GB`, `74.5GiB`).
pub fn parse_gpu(s: &str) -> anyhow::Result<Gpu> {
    let key = s.to_ascii_lowercase();
    if let Some((_, g)) = GPUS.iter().find(|(k, _)| *k == key) {
        return Ok(*g);
    }
    match crate::bytes::parse_bytes(s) {
        Ok(memory) => Ok(Gpu {
            name: "a GPU of the given memory",
            memory,
            bf16_flops: 0.0,
            f32_flops: 0.0,
            bandwidth: 0.0,
        }),
        Err(_) => anyhow::bail!(
            "--gpu `{s}`: use {} or a memory size (80GB, 74.5GiB)",
            GPUS.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// The name `--gpu` and `run.gpu_hour_price` know `g` by (`h100`), for a GPU of the table.
pub fn gpu_key(g: &Gpu) -> Option<&'static str> {
    GPUS.iter().find(|(_, t)| t.name == g.name).map(|(k, _)| *k)
}

/// The table's entry for a CUDA device name (`NVIDIA H100 80GB HBM3`, ...).
pub fn gpu_by_device_name(name: &str) -> Option<Gpu> {
    let n = name.to_ascii_lowercase();
    GPUS.iter()
        .find(|(k, _)| n.contains(&format!(" {k}")))
        .map(|(_, g)| *g)
}

/// This machine's first GPU, when this binary opens it and the table knows it.
pub fn local_gpu() -> Option<Gpu> {
    #[cfg(feature = "cuda")]
    {
        if let Ok(dev) = crate::cuda::sampler_device(0) {
            return gpu_by_device_name(&device_name(&dev));
        }
    }
    None
}

/// The device's name as its driver gives it (`cpu` for the CPU).
pub fn device_name(dev: &Device) -> String {
    match dev {
        Device::Cpu => format!("cpu, {} threads", rayon::current_num_threads()),
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => crate::cuda::device_name(dev).unwrap_or_else(|e| format!("cuda: {e}")),
        _ => format!("{dev:?}"),
    }
}

/// The peak FLOP/s MFU is measured against: a known GPU's dense rate for `dtype`, or the CPU's
/// matmul rate measured now. An unknown GPU is an error naming `peak_tflops`.
pub fn peak_flops(dev: &Device, dtype: DType) -> anyhow::Result<f64> {
    if dev.is_cpu() {
        return crate::machine::cpu_matmul_ceiling();
    }
    let name = device_name(dev);
    match gpu_by_device_name(&name) {
        Some(g) if dtype == DType::F32 => Ok(g.f32_flops),
        Some(g) => Ok(g.bf16_flops),
        None => anyhow::bail!("no peak rate is known for {name}: set train.peak_tflops (for MFU)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen3-4B's card, its parameters, and a GPU run at 4,096 tokens with recompute.
    fn qwen3_4b_with_recompute() -> (ModelConfig, u64, TrainSettings) {
        let cfg = crate::model::cards::card("Qwen/Qwen3-4B").unwrap().unwrap();
        let params = cfg.num_params() as u64;
        let s: TrainSettings = toml::from_str(
            "device = \"cuda\"\nmicro_batch_tokens = 4096\nmax_seq_len = 4096\nrecompute = true",
        )
        .unwrap();
        (cfg, params, s)
    }

    /// The target: Qwen3-4B full fine-tuning at 4,096 tokens per micro-batch, bf16
    /// compute over fp32 master weights and moments, fits an 80 GB H100 with recompute and the
    /// chunked loss; without recompute it does not, and the budget says so.
    #[test]
    fn qwen3_4b_fits_an_h100_with_recompute() {
        let (cfg, params, s) = qwen3_4b_with_recompute();
        let b = budget(&cfg, params, &s);
        eprintln!("Qwen3-4B on an H100:\n{}", b.lines(&s).join("\n"));
        let h100 = parse_gpu("h100").unwrap().memory;
        assert!(b.total(&s) <= h100, "{}", b.lines(&s).join("\n"));
        assert!(b.total(&s) as f64 <= 80.0 * (1u64 << 30) as f64);
        assert_eq!(b.master, params * 4);
        assert_eq!(b.working, params * 2);
        assert_eq!(b.optimizer, params * 8);
        let no_recompute = TrainSettings {
            recompute: false,
            ..s.clone()
        };
        let nb = budget(&cfg, params, &no_recompute);
        eprintln!("without recompute:\n{}", nb.lines(&no_recompute).join("\n"));
        assert!(nb.total(&no_recompute) > h100);
        // the moments on the host leave room to spare
        let offload = TrainSettings {
            optimizer_offload: true,
            ..s.clone()
        };
        let ob = budget(&cfg, params, &offload);
        assert_eq!(ob.total(&offload) + ob.optimizer, b.total(&s));
        assert_eq!(ob.host(), ob.optimizer + 2 * ob.largest_tensor);
    }

    /// With recompute the plan keeps the last layers' activations as far as the memory allows:
    /// none keeps the recompute budget, all come near the budget without recompute, and the
    /// count it picks is the most that fits.
    #[test]
    fn the_plan_keeps_as_many_layers_as_fit() {
        let (cfg, params, s) = qwen3_4b_with_recompute();
        let b = budget(&cfg, params, &s);
        let layers = cfg.num_layers();
        assert_eq!(b.total_kept(&s, 0), b.total(&s));
        let totals: Vec<u64> = (0..=layers).map(|k| b.total_kept(&s, k)).collect();
        assert!(totals.windows(2).all(|w| w[0] <= w[1]), "{totals:?}");
        // every layer kept: the activations without recompute, give or take the inputs
        let none = TrainSettings {
            recompute: false,
            ..s.clone()
        };
        let all = totals[layers] as f64 / budget(&cfg, params, &none).total(&none) as f64;
        assert!((0.9..1.1).contains(&all), "{all}");
        for limit in [
            totals[0] - 1,
            totals[0],
            totals[3] + 1,
            totals[layers],
            u64::MAX,
        ] {
            let k = b.kept_layers_within(&s, limit);
            if limit < totals[0] {
                assert_eq!(k, 0);
                continue;
            }
            assert!(totals[k] <= limit, "{k} at {limit}");
            assert!(k == layers || totals[k + 1] > limit, "{k} at {limit}");
        }
        // on 70% of an H100, none (weights, gradients and moments take 72 GB); on 70% of an
        // H200, some but not all of Qwen3-4B's 36 layers
        let share = |gpu: &str| (parse_gpu(gpu).unwrap().memory as f64 * 0.7) as u64;
        assert_eq!(b.kept_layers_within(&s, share("h100")), 0);
        let k = b.kept_layers_within(&s, share("h200"));
        eprintln!("Qwen3-4B, 4,096 tokens, 70% of an H200: the last {k} of {layers} layers kept");
        assert!(k > 0 && k < layers, "{k}");
        let without = TrainSettings {
            recompute: false,
            ..s.clone()
        };
        assert_eq!(b.kept_layers_within(&without, u64::MAX), 0);
    }

    #[test]
    fn gpus_are_named_or_sized() {
        assert_eq!(parse_gpu("H200").unwrap().memory, 141 * GB);
        assert_eq!(parse_gpu("80GB").unwrap().memory, 80 * GB);
        assert!(parse_gpu("h1000").unwrap_err().to_string().contains("h100"));
        let g = gpu_by_device_name("NVIDIA H100 80GB HBM3").unwrap();
        assert_eq!(g.bf16_flops, 989e12);
        assert!(gpu_by_device_name("NVIDIA GeForce RTX 4090").is_none());
    }
}

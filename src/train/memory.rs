//! The training memory budget, printed before step 1 and checked by `pipeline preflight`, for
//! the device the run trains on (host RAM on the CPU, GPU memory on a GPU): the f32 master
//! weights and the compute dtype's working copy, AdamW's moments, the f32 gradient sums and a
//! micro-batch's fresh gradients, the activations with and without recompute, the LM head's
//! chunk, and the optimizer update's temporaries.
//!
//! Activations are counted from what the differentiable forward keeps per token and layer (norm
//! intermediates, projections, RoPE, the attention's output and per-row log-sum-exp, the SwiGLU
//! intermediates) in the compute dtype; attention keeps no `(heads, L, L)` tensor on any path
//! (the fused CPU op, or the query-blocked one of `model::block_attention`), only one block's
//! f32 scores while a layer runs. The peak is the larger of the backward's (activations, the
//! head's chunk and the fresh gradients) and the update's. Also here: the GPUs a plan can name
//! and their peak rates, for MFU. Knows nothing of the training loop.

use candle_core::{DType, Device};

use super::settings::{OptimizerState, TrainSettings};
use crate::model::{LayerKind, ModelConfig};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// f32 master weights.
    pub master: u64,
    /// The compute dtype's working copy (0 when computing in f32: the master is the model).
    pub working: u64,
    /// AdamW's two moments.
    pub optimizer: u64,
    /// The step's f32 gradient sums.
    pub grad_sums: u64,
    /// A micro-batch's gradients in the compute dtype before they are summed: every parameter's
    /// without recompute, one layer's (or the embedding's) with it.
    pub grads_fresh: u64,
    pub grads_fresh_recompute: u64,
    pub activations: u64,
    pub activations_recompute: u64,
    pub logits: u64,
    pub logits_chunked: u64,
    /// The optimizer update's temporaries (candle ops over slices of the largest tensor).
    pub update: u64,
    /// The largest tensor in f32: what a checkpoint or export holds on the host at a time.
    pub largest_tensor: u64,
}

impl Budget {
    /// What the configured run holds at its peak.
    pub fn total(&self, s: &TrainSettings) -> u64 {
        self.resident() + self.transient(s)
    }

    /// What lives through the whole run: weights, moments, gradient sums.
    pub fn resident(&self) -> u64 {
        self.master + self.working + self.optimizer + self.grad_sums
    }

    /// The step's transient peak: the backward's or the update's, whichever is larger.
    pub fn transient(&self, s: &TrainSettings) -> u64 {
        let (act, fresh) = if s.recompute {
            (self.activations_recompute, self.grads_fresh_recompute)
        } else {
            (self.activations, self.grads_fresh)
        };
        let logits = if s.loss_chunk_tokens > 0 {
            self.logits_chunked
        } else {
            self.logits
        };
        (act + logits + fresh).max(self.update)
    }

    pub fn lines(&self, s: &TrainSettings) -> Vec<String> {
        use crate::bytes::format_bytes as f;
        let mark = |on: bool| if on { "  <- this run" } else { "" };
        let chunked = s.loss_chunk_tokens > 0;
        let (fresh, act) = if s.recompute {
            (self.grads_fresh_recompute, self.activations_recompute)
        } else {
            (self.grads_fresh, self.activations)
        };
        let _ = act;
        let mut out = vec![format!("  master weights (f32)          {}", f(self.master))];
        if self.working > 0 {
            out.push(format!(
                "  working copy ({:?})           {}",
                s.compute(),
                f(self.working)
            ));
        }
        out.extend([
            format!("  optimizer state (m, v)        {}", f(self.optimizer)),
            format!("  gradient sums (f32)           {}", f(self.grad_sums)),
            format!("  micro-batch gradients         {}", f(fresh)),
            format!(
                "  activations                   {}{}",
                f(self.activations),
                mark(!s.recompute)
            ),
            format!(
                "  activations with recompute    {}{}",
                f(self.activations_recompute),
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
            format!("  total at the peak             {}", f(self.total(s))),
        ]);
        out
    }
}

/// The budget of training `cfg` (with `params` parameters) under `s`, in its compute dtype.
pub fn budget(cfg: &ModelConfig, params: u64, s: &TrainSettings) -> Budget {
    let cb = s.compute().size_in_bytes() as u64; // bytes per computed value
    let tokens = s.micro_batch_tokens as u64;
    let seq = s.max_seq_len as u64;
    let (h, i) = (cfg.hidden_size as u64, cfg.intermediate_size as u64);
    let (hq, hkv, d) = (
        cfg.num_heads as u64,
        cfg.num_kv_heads as u64,
        cfg.head_dim as u64,
    );
    let v = cfg.vocab_size as u64;
    // Values the differentiable forward keeps per token in a layer of `kind`: two RMS norms
    // (3h each), o_proj and residuals (4h), SwiGLU (4i), and the mixer's own.
    let per_token_layer = |kind: LayerKind| {
        let mixer = match kind {
            // q/k/v, their norms (3 each) and RoPE (4 each), the heads-first copies, GQA
            // expansion, output and its transpose (6 hq d), the log-sum-exp
            LayerKind::Attention => {
                let gate = if cfg.attention_gate { 3 * hq * d } else { 0 };
                (hq + 2 * hkv) * d + 7 * (hq + hkv) * d + 6 * hq * d + hq + gate
            }
            // Gated DeltaNet (an estimate): the projections, conv and SiLU (4 conv_dim), the
            // heads' normalised, repeated and chunked copies (6 Hv (dk + dv)), the chunk's
            // decay, L and T matrices and the substitution's rows (4 Hv C), the gated norm
            // (6 value_dim)
            LayerKind::GatedDeltaNet => cfg.linear.map_or(0, |l| {
                let (nv, dk, dv) = (
                    l.num_value_heads as u64,
                    l.key_head_dim as u64,
                    l.value_head_dim as u64,
                );
                let c = crate::model::layers::gated_deltanet::CHUNK as u64;
                4 * l.conv_dim() as u64 + 6 * nv * (dk + dv) + 4 * nv * c + 6 * l.value_dim() as u64
            }),
        };
        10 * h + 4 * i + mixer
    };
    // one attention block's f32 scores, exponentials, probabilities and their gradient while a
    // layer runs (the CPU's fused op keeps less)
    let block = crate::model::block_attention::BLOCK as u64;
    let attn_block = 4 * hq * block.min(seq) * seq * 4;
    let has_attention = cfg.layer_kinds.contains(&LayerKind::Attention);
    let layer_bytes = |kind| per_token_layer(kind) * tokens * cb;
    let all_layers: u64 = cfg.layer_kinds.iter().map(|k| layer_bytes(*k)).sum();
    let largest_layer = cfg
        .layer_kinds
        .iter()
        .map(|k| layer_bytes(*k))
        .max()
        .unwrap_or(0)
        + if has_attention { attn_block } else { 0 };
    let layers = cfg.num_layers() as u64;
    let state = match s.optimizer_state {
        OptimizerState::F32 => 8,
        OptimizerState::Bf16 => 4,
    };
    let chunk = if s.loss_chunk_tokens == 0 {
        tokens
    } else {
        (s.loss_chunk_tokens as u64).min(tokens)
    };
    // The head over `rows` positions: through candle ops, the logits in the compute dtype and
    // in f32, the exponentials, probabilities and gradient in f32 and the gradient in the compute
    // dtype; on the CPU's packed gemm (f32), the logits (the gradient overwrites them) and the
    // head weight packed twice. Whichever is more. Plus the hidden states' gradient.
    let head = |rows: u64| {
        (rows * v * (3 * 4 + 2 * cb)).max(rows * v * 4 + 2 * v * h * 4) + tokens * h * cb
    };
    let embed = v * h;
    let largest_tensor = embed.max(i * h);
    let largest_layer_params = (0..cfg.num_layers())
        .map(|l| cfg.layer_params(l) as u64)
        .max()
        .unwrap_or(0);
    Budget {
        master: params * 4,
        working: if cb < 4 { params * cb } else { 0 },
        optimizer: params * state,
        grad_sums: params * 4,
        grads_fresh: params * cb,
        grads_fresh_recompute: largest_layer_params.max(embed) * cb,
        activations: all_layers + 2 * h * tokens * cb + if has_attention { attn_block } else { 0 },
        activations_recompute: (layers + 1) * h * tokens * cb + largest_layer,
        logits: head(tokens),
        logits_chunked: head(chunk),
        // some ten f32 temporaries of one slice (see train::adamw::SLICE)
        update: 10 * largest_tensor.min(super::adamw::SLICE as u64) * 4,
        largest_tensor: largest_tensor * 4,
    }
}

/// Disk a run writes: the export in `dtype_bytes`, and `keep` checkpoints of master weights and
/// moments.
pub fn disk_bytes(params: u64, dtype_bytes: u64, s: &TrainSettings) -> u64 {
    let state = match s.optimizer_state {
        OptimizerState::F32 => 8,
        OptimizerState::Bf16 => 4,
    };
    params * dtype_bytes + (s.keep_checkpoints as u64 + 1) * params * (4 + state)
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
        },
    ),
    (
        "h200",
        Gpu {
            name: "NVIDIA H200 141GB",
            memory: 141 * GB,
            bf16_flops: 989e12,
            f32_flops: 67e12,
        },
    ),
    (
        "b200",
        Gpu {
            name: "NVIDIA B200 180GB",
            memory: 180 * GB,
            bf16_flops: 2250e12,
            f32_flops: 75e12,
        },
    ),
    (
        "a100",
        Gpu {
            name: "NVIDIA A100 80GB",
            memory: 80 * GB,
            bf16_flops: 312e12,
            f32_flops: 19.5e12,
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
        }),
        Err(_) => anyhow::bail!(
            "--gpu `{s}`: use {} or a memory size (80GB, 74.5GiB)",
            GPUS.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// The table's entry for a CUDA device name (`NVIDIA H100 80GB HBM3`, ...).
pub fn gpu_by_device_name(name: &str) -> Option<Gpu> {
    let n = name.to_ascii_lowercase();
    GPUS.iter()
        .find(|(k, _)| n.contains(&format!(" {k}")))
        .map(|(_, g)| *g)
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
        None => anyhow::bail!(
            "no peak rate is known for {name}: set train.peak_tflops (for MFU)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The target: Qwen3-4B full fine-tuning at 4,096 tokens per micro-batch, bf16
    /// compute over fp32 master weights and moments, fits an 80 GB H100 with recompute and the
    /// chunked loss; without recompute it does not, and the budget says so.
    #[test]
    fn qwen3_4b_fits_an_h100_with_recompute() {
        let cfg = crate::model::cards::card("Qwen/Qwen3-4B").unwrap().unwrap();
        let params = cfg.num_params() as u64;
        let s: TrainSettings = toml::from_str(
            "device = \"cuda\"\nmicro_batch_tokens = 4096\nmax_seq_len = 4096\nrecompute = true",
        )
        .unwrap();
        let b = budget(&cfg, params, &s);
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
        assert!(budget(&cfg, params, &no_recompute).total(&no_recompute) > h100);
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

//! The decoder-only transformer shared by Qwen3 and Llama: one forward for prefill, decode and
//! training, parameterised by an attention backend. The model owns no cache.
//!
//! Built from differentiable candle ops (RMS norm, RoPE and softmax written out rather than the
//! fused kernels, which record no backward pass). Tensor names mirror the Hugging Face checkpoint
//! (`model.layers.N.self_attn.q_proj.weight`, ...). Knows nothing of scheduling or configs files.

use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_nn::{Embedding, Linear, VarBuilder};

use super::attention::AttentionBackend;
use super::config::{Family, ModelConfig};

/// RMS norm: `x / sqrt(mean(x^2) + eps) * w`, over the last dim.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    fn new(size: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
        Ok(RmsNorm {
            weight: vb.get(size, "weight")?,
            eps,
        })
    }

    /// `fused`: candle's fused kernel, which records no backward pass (sampling only).
    pub fn forward_with(&self, x: &Tensor, fused: bool) -> Result<Tensor> {
        if fused {
            return candle_nn::ops::rms_norm(x, &self.weight, self.eps as f32);
        }
        self.forward(x)
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
        let x = x.broadcast_div(&(ms + self.eps)?.sqrt()?)?;
        x.broadcast_mul(&self.weight)
    }
}

/// RoPE tables, (max_positions, D/2) each, gathered by position per token.
#[derive(Debug, Clone)]
struct Rope {
    cos: Tensor,
    sin: Tensor,
}

impl Rope {
    fn new(cfg: &ModelConfig, device: &Device) -> Result<Self> {
        let d = cfg.head_dim;
        let inv_freq: Vec<f32> = (0..d / 2)
            .map(|i| {
                let f = 1.0 / cfg.rope_theta.powf(2.0 * i as f64 / d as f64);
                scale_frequency(f, cfg) as f32
            })
            .collect();
        let n = cfg.max_position_embeddings;
        let inv = Tensor::from_vec(inv_freq, (1, d / 2), device)?;
        let t = Tensor::arange(0u32, n as u32, device)?
            .to_dtype(DType::F32)?
            .reshape((n, 1))?;
        let freqs = t.matmul(&inv)?; // (n, D/2)
        Ok(Rope {
            cos: freqs.cos()?,
            sin: freqs.sin()?,
        })
    }

    /// The cos and sin rows of each token's position: (T, D/2) each.
    fn rows(&self, positions: &Tensor) -> Result<(Tensor, Tensor)> {
        Ok((
            self.cos.index_select(positions, 0)?,
            self.sin.index_select(positions, 0)?,
        ))
    }
}

/// Per-step RoPE tables, gathered once and shared by every layer.
struct RopeRows {
    /// (T, D/2), for the fused kernel.
    cos: Tensor,
    sin: Tensor,
    /// (T, 1, D) = [cos, cos], for the differentiable path.
    cos_full: Tensor,
    sin_full: Tensor,
}

impl RopeRows {
    fn new(rope: &Rope, positions: &Tensor) -> Result<Self> {
        let (cos, sin) = rope.rows(positions)?;
        let cos_full = Tensor::cat(&[&cos, &cos], D::Minus1)?.unsqueeze(1)?;
        let sin_full = Tensor::cat(&[&sin, &sin], D::Minus1)?.unsqueeze(1)?;
        Ok(RopeRows {
            cos,
            sin,
            cos_full,
            sin_full,
        })
    }

    /// x: (T, H, D) -> rotated x (the Hugging Face `rotate_half` layout).
    fn apply(&self, x: &Tensor, fused: bool) -> Result<Tensor> {
        if fused {
            // (T, H, D) -> (1, T, H, D) for the fused kernel.
            let x = x.contiguous()?.unsqueeze(0)?;
            return candle_nn::rotary_emb::rope_thd(&x, &self.cos, &self.sin)?.squeeze(0);
        }
        let half = x.dim(D::Minus1)? / 2;
        let x1 = x.narrow(D::Minus1, 0, half)?;
        let x2 = x.narrow(D::Minus1, half, half)?;
        let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
        x.broadcast_mul(&self.cos_full)? + rotated.broadcast_mul(&self.sin_full)?
    }
}

/// Llama 3.1 frequency scaling (identity without it).
fn scale_frequency(freq: f64, cfg: &ModelConfig) -> f64 {
    let Some(s) = cfg.rope_scaling else {
        return freq;
    };
    let wavelen = 2.0 * std::f64::consts::PI / freq;
    let low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
    let high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
    if wavelen < high_wavelen {
        freq
    } else if wavelen > low_wavelen {
        freq / s.factor
    } else {
        let smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor)
            / (s.high_freq_factor - s.low_freq_factor);
        (1.0 - smooth) * freq / s.factor + smooth * freq
    }
}

#[derive(Debug, Clone)]
struct Layer {
    input_norm: RmsNorm,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    /// Qwen3's per-head RMS norms on queries and keys.
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    post_norm: RmsNorm,
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

/// `x @ w.t() + b` for `x` (T, in). On CPU with a few rows (decode steps) it is computed as
/// `(w @ x.t()).t()`: candle's gemm then takes the weight as its left operand and skips the
/// strided gather that packing `w.t()` as the right operand costs on every call. Measured on the
/// 2-core dev machine for a 3072x1024 weight: 1.5-4x faster at 2..=64 rows, slower from ~256
/// rows and at 1 row (gemv). Both are plain differentiable ops; only the summation order differs.
fn linear_fwd(l: &Linear, x: &Tensor) -> Result<Tensor> {
    let rows = x.dim(0)?;
    if x.rank() != 2 || !x.device().is_cpu() || !(2..=SMALL_BATCH_ROWS).contains(&rows) {
        return l.forward(x);
    }
    let y = l.weight().matmul(&x.t()?)?.t()?.contiguous()?;
    match l.bias() {
        Some(b) => y.broadcast_add(b),
        None => Ok(y),
    }
}

/// Up to this many rows [`linear_fwd`] takes the weight-as-left-operand form.
const SMALL_BATCH_ROWS: usize = 128;

fn linear(i: usize, o: usize, bias: bool, vb: VarBuilder) -> Result<Linear> {
    if bias {
        candle_nn::linear(i, o, vb)
    } else {
        candle_nn::linear_no_bias(i, o, vb)
    }
}

impl Layer {
    fn new(cfg: &ModelConfig, vb: VarBuilder) -> Result<Self> {
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        let attn = vb.pp("self_attn");
        let mlp = vb.pp("mlp");
        let qk_norm = cfg.family == Family::Qwen3;
        let b = cfg.attention_bias;
        Ok(Layer {
            input_norm: RmsNorm::new(h, cfg.rms_norm_eps, vb.pp("input_layernorm"))?,
            q_proj: linear(h, cfg.num_heads * d, b, attn.pp("q_proj"))?,
            k_proj: linear(h, cfg.num_kv_heads * d, b, attn.pp("k_proj"))?,
            v_proj: linear(h, cfg.num_kv_heads * d, b, attn.pp("v_proj"))?,
            o_proj: linear(cfg.num_heads * d, h, false, attn.pp("o_proj"))?,
            q_norm: qk_norm
                .then(|| RmsNorm::new(d, cfg.rms_norm_eps, attn.pp("q_norm")))
                .transpose()?,
            k_norm: qk_norm
                .then(|| RmsNorm::new(d, cfg.rms_norm_eps, attn.pp("k_norm")))
                .transpose()?,
            post_norm: RmsNorm::new(h, cfg.rms_norm_eps, vb.pp("post_attention_layernorm"))?,
            gate_proj: candle_nn::linear_no_bias(h, cfg.intermediate_size, mlp.pp("gate_proj"))?,
            up_proj: candle_nn::linear_no_bias(h, cfg.intermediate_size, mlp.pp("up_proj"))?,
            down_proj: candle_nn::linear_no_bias(cfg.intermediate_size, h, mlp.pp("down_proj"))?,
        })
    }
}

/// Qwen3 / Llama decoder.
#[derive(Debug, Clone)]
pub struct Transformer {
    cfg: ModelConfig,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Linear,
    rope: Rope,
    /// Fused RMS norm and RoPE kernels (no backward pass): set for sampling, never for training.
    fused: bool,
}

impl Transformer {
    /// Builds the model from a var builder rooted at the checkpoint's top level.
    pub fn new(cfg: &ModelConfig, vb: VarBuilder) -> Result<Self> {
        let m = vb.pp("model");
        let embed = candle_nn::embedding(cfg.vocab_size, cfg.hidden_size, m.pp("embed_tokens"))?;
        let layers = (0..cfg.num_layers)
            .map(|i| Layer::new(cfg, m.pp("layers").pp(i)))
            .collect::<Result<Vec<_>>>()?;
        let lm_head = if cfg.tie_word_embeddings {
            Linear::new(embed.embeddings().clone(), None)
        } else {
            candle_nn::linear_no_bias(cfg.hidden_size, cfg.vocab_size, vb.pp("lm_head"))?
        };
        Ok(Transformer {
            cfg: cfg.clone(),
            embed,
            layers,
            norm: RmsNorm::new(cfg.hidden_size, cfg.rms_norm_eps, m.pp("norm"))?,
            lm_head,
            rope: Rope::new(cfg, vb.device())?,
            fused: false,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Use candle's fused RMS norm and RoPE kernels: faster, but they record no backward pass,
    /// so a model trained with this on would get zero gradients upstream of them. For sampling.
    pub fn set_fused_inference(&mut self, on: bool) {
        self.fused = on;
    }

    /// Final hidden states (T, hidden) for `tokens` (T,) u32 at `positions` (T,) u32.
    pub fn forward_hidden(
        &self,
        tokens: &Tensor,
        positions: &Tensor,
        attn: &mut dyn AttentionBackend,
    ) -> Result<Tensor> {
        let (hq, hkv, d) = (self.cfg.num_heads, self.cfg.num_kv_heads, self.cfg.head_dim);
        let t = tokens.dim(0)?;
        let fused = self.fused;
        let rope = RopeRows::new(&self.rope, positions)?;
        let mut x = self.embed.forward(tokens)?; // (T, hidden)
        for (i, l) in self.layers.iter().enumerate() {
            // 1. attention block
            let h = l.input_norm.forward_with(&x, fused)?;
            let mut q = linear_fwd(&l.q_proj, &h)?.reshape((t, hq, d))?; // (T, Hq, D)
            let mut k = linear_fwd(&l.k_proj, &h)?.reshape((t, hkv, d))?; // (T, Hkv, D)
            let v = linear_fwd(&l.v_proj, &h)?.reshape((t, hkv, d))?;
            if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
                q = qn.forward_with(&q, fused)?;
                k = kn.forward_with(&k, fused)?;
            }
            let q = rope.apply(&q, fused)?;
            let k = rope.apply(&k, fused)?;
            let a = attn.attend(i, &q, &k, &v)?.reshape((t, hq * d))?;
            x = (x + linear_fwd(&l.o_proj, &a)?)?;
            // 2. MLP block (SwiGLU)
            let h = l.post_norm.forward_with(&x, fused)?;
            let g = candle_nn::ops::silu(&linear_fwd(&l.gate_proj, &h)?)?;
            let u = linear_fwd(&l.up_proj, &h)?;
            x = (x + linear_fwd(&l.down_proj, &(g * u)?)?)?;
        }
        self.norm.forward_with(&x, fused)
    }

    /// Logits (N, vocab) for hidden rows (N, hidden).
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        linear_fwd(&self.lm_head, hidden)
    }

    /// Logits for every token: (T, vocab).
    pub fn forward(
        &self,
        tokens: &Tensor,
        positions: &Tensor,
        attn: &mut dyn AttentionBackend,
    ) -> Result<Tensor> {
        self.logits(&self.forward_hidden(tokens, positions, attn)?)
    }
}

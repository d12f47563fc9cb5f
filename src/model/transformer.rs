//! The decoder-only transformer shared by Qwen3 and Llama: one forward for prefill, decode and
//! training, parameterised by an attention backend. The model owns no cache.
//!
//! Built from differentiable ops: RMS norm, RoPE and the SwiGLU product are the single ops of
//! [`super::diff_ops`] (f32 on the CPU) or written out in candle ops (elsewhere), never candle's
//! fused kernels, which record no backward pass (those run only for sampling). For sampling on
//! the CPU the weights are packed and each layer runs on host slices (`model::packed`); the
//! model is then inference-only. Tensor names mirror the Hugging Face checkpoint
//! (`model.layers.N.self_attn.q_proj.weight`, ...). Knows nothing of scheduling or config files.

use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_nn::{Embedding, Linear, VarBuilder};

use super::attention::AttentionBackend;
use super::config::{Family, ModelConfig};
use super::packed::{dropped, PackedLayer, PackedLinear};

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
        if super::diff_ops::supported(x) {
            return super::diff_ops::rms_norm(x, &self.weight, self.eps);
        }
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
    /// The tables in `dtype` (the model's), computed in f32 as Hugging Face does.
    fn new(cfg: &ModelConfig, device: &Device, dtype: DType) -> Result<Self> {
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
            cos: freqs.cos()?.to_dtype(dtype)?,
            sin: freqs.sin()?.to_dtype(dtype)?,
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
pub struct RopeRows {
    /// (T, D/2), for the fused kernel.
    cos: Tensor,
    sin: Tensor,
    /// (T, 1, D) = [cos, cos], for the differentiable path.
    cos_full: Tensor,
    sin_full: Tensor,
    /// `cos`, `sin` as host values, for the packed CPU layers (f32 on the CPU only).
    host: Option<(Vec<f32>, Vec<f32>)>,
}

impl RopeRows {
    fn new(rope: &Rope, positions: &Tensor) -> Result<Self> {
        let (cos, sin) = rope.rows(positions)?;
        let cos_full = Tensor::cat(&[&cos, &cos], D::Minus1)?.unsqueeze(1)?;
        let sin_full = Tensor::cat(&[&sin, &sin], D::Minus1)?.unsqueeze(1)?;
        let host = if cos.device().is_cpu() && cos.dtype() == DType::F32 {
            Some((cos.flatten_all()?.to_vec1()?, sin.flatten_all()?.to_vec1()?))
        } else {
            None
        };
        Ok(RopeRows {
            host,
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
        if super::diff_ops::supported(x) {
            return super::diff_ops::rope(x, &self.cos, &self.sin);
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
    /// For sampling: q, k and v (then gate and up) as one matrix each, so that a step runs one
    /// matmul where it ran three (two); the separate projections above become views of them.
    qkv: Option<Linear>,
    gate_up: Option<Linear>,
    /// For sampling on the CPU: the projections packed (the candle weights are then dropped).
    packed: Option<PackedLayer>,
}

/// One matrix from projections that read the same input: the weights (and biases, if all have
/// them) stacked by output rows. Returns it and the parts as views into it.
fn stack_linears(parts: &[&Linear]) -> Result<(Linear, Vec<Linear>)> {
    let weights: Vec<&Tensor> = parts.iter().map(|l| l.weight()).collect();
    let w = Tensor::cat(&weights, 0)?;
    let b = match parts.iter().map(|l| l.bias()).collect::<Option<Vec<_>>>() {
        Some(bs) if !bs.is_empty() => Some(Tensor::cat(&bs, 0)?),
        _ => None,
    };
    let mut views = Vec::with_capacity(parts.len());
    let mut start = 0;
    for l in parts {
        let n = l.weight().dim(0)?;
        let bias = b.as_ref().map(|b| b.narrow(0, start, n)).transpose()?;
        views.push(Linear::new(w.narrow(0, start, n)?, bias));
        start += n;
    }
    Ok((Linear::new(w, b), views))
}

/// `l(x)`, on the packed CPU gemm (with its backward) for f32 on the CPU, else candle's.
fn project(l: &Linear, x: &Tensor) -> Result<Tensor> {
    if !super::host_linear::supported(x) {
        return l.forward(x);
    }
    let y = super::host_linear::linear(x, l.weight())?;
    match l.bias() {
        Some(b) => y.broadcast_add(b),
        None => Ok(y),
    }
}

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
            qkv: None,
            gate_up: None,
            packed: None,
        })
    }

    /// Stacks q/k/v and gate/up into one matrix each (the separate ones become views of them).
    fn stack_projections(&mut self) -> Result<()> {
        if self.qkv.is_some() {
            return Ok(());
        }
        let (qkv, v) = stack_linears(&[&self.q_proj, &self.k_proj, &self.v_proj])?;
        (self.q_proj, self.k_proj, self.v_proj) = (v[0].clone(), v[1].clone(), v[2].clone());
        let (gate_up, v) = stack_linears(&[&self.gate_proj, &self.up_proj])?;
        (self.gate_proj, self.up_proj) = (v[0].clone(), v[1].clone());
        (self.qkv, self.gate_up) = (Some(qkv), Some(gate_up));
        Ok(())
    }

    /// Packs the stacked projections for the CPU matmul and drops the candle weights.
    fn pack(&mut self) -> Result<()> {
        self.stack_projections()?;
        let (Some(qkv), Some(gate_up)) = (&self.qkv, &self.gate_up) else {
            candle_core::bail!("pack: projections not stacked")
        };
        self.packed = Some(PackedLayer {
            qkv: PackedLinear::new(qkv)?,
            o: PackedLinear::new(&self.o_proj)?,
            gate_up: PackedLinear::new(gate_up)?,
            down: PackedLinear::new(&self.down_proj)?,
            input_norm: self.input_norm.weight.to_vec1()?,
            post_norm: self.post_norm.weight.to_vec1()?,
            qk_norms: match (&self.q_norm, &self.k_norm) {
                (Some(q), Some(k)) => Some((q.weight.to_vec1()?, k.weight.to_vec1()?)),
                _ => None,
            },
            eps: self.input_norm.eps as f32,
        });
        for l in [
            &mut self.q_proj,
            &mut self.k_proj,
            &mut self.v_proj,
            &mut self.o_proj,
            &mut self.gate_proj,
            &mut self.up_proj,
            &mut self.down_proj,
        ] {
            *l = dropped(l)?;
        }
        (self.qkv, self.gate_up) = (None, None);
        Ok(())
    }

    /// (q, k, v) as (T, H, D) each.
    fn project_qkv(
        &self,
        h: &Tensor,
        (t, hq, hkv, d): (usize, usize, usize, usize),
        fused: bool,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        if let (Some(qkv), true) = (&self.qkv, fused) {
            let y = qkv.forward(h)?;
            let (nq, nkv) = (hq * d, hkv * d);
            return Ok((
                y.narrow(1, 0, nq)?.reshape((t, hq, d))?,
                y.narrow(1, nq, nkv)?.reshape((t, hkv, d))?,
                y.narrow(1, nq + nkv, nkv)?.reshape((t, hkv, d))?,
            ));
        }
        Ok((
            project(&self.q_proj, h)?.reshape((t, hq, d))?,
            project(&self.k_proj, h)?.reshape((t, hkv, d))?,
            project(&self.v_proj, h)?.reshape((t, hkv, d))?,
        ))
    }

    /// SwiGLU: down(silu(gate(h)) * up(h)).
    fn mlp(&self, h: &Tensor, fused: bool) -> Result<Tensor> {
        let (g, u) = match (&self.gate_up, fused) {
            (Some(gu), true) => {
                let y = gu.forward(h)?;
                let i = y.dim(1)? / 2;
                (y.narrow(1, 0, i)?, y.narrow(1, i, i)?)
            }
            _ => (project(&self.gate_proj, h)?, project(&self.up_proj, h)?),
        };
        let act = if !fused && super::diff_ops::supported(&g) {
            super::diff_ops::swiglu(&g, &u)?
        } else {
            (candle_nn::ops::silu(&g)? * u)?
        };
        project(&self.down_proj, &act)
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
    /// For sampling on the CPU: the LM head packed; when tied, embeddings are looked up in it.
    packed_head: Option<PackedLinear>,
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
            rope: Rope::new(cfg, vb.device(), vb.dtype())?,
            fused: false,
            packed_head: None,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Where the weights live.
    pub fn device(&self) -> &Device {
        self.embed.embeddings().device()
    }

    /// The weights' dtype.
    pub fn dtype(&self) -> DType {
        self.embed.embeddings().dtype()
    }

    /// Use candle's fused RMS norm and RoPE kernels: faster, but they record no backward pass,
    /// so a model trained with this on would get zero gradients upstream of them. For sampling.
    ///
    /// On, it also stacks each layer's q/k/v and gate/up weights into one matrix each (once; the
    /// separate projections become views of it, so no memory is added). With f32 weights on the
    /// CPU it then packs every projection and the LM head for [`crate::gemm`] and drops the
    /// candle weights (the embedding table too when tied: lookups read the packed head), so the
    /// model is for inference from then on and cannot be switched back.
    pub fn set_fused_inference(&mut self, on: bool) -> Result<()> {
        if !on && self.packed_head.is_some() {
            candle_core::bail!(
                "the model's weights are packed for inference; load it again to train"
            )
        }
        self.fused = on;
        if !on {
            return Ok(());
        }
        let pack = self.device().is_cpu() && self.dtype() == DType::F32;
        for l in &mut self.layers {
            if pack && l.packed.is_none() {
                l.pack()?;
            } else {
                l.stack_projections()?;
            }
        }
        if pack && self.packed_head.is_none() {
            self.packed_head = Some(PackedLinear::new(&self.lm_head)?);
            self.lm_head = dropped(&self.lm_head)?;
            if self.cfg.tie_word_embeddings {
                let (v, h) = (self.cfg.vocab_size, self.cfg.hidden_size);
                let e = Tensor::zeros((0, h), DType::F32, &Device::Cpu)?;
                self.embed = Embedding::new(e, h);
                debug_assert_eq!(self.packed_head.as_ref().map(|p| p.w.rows()), Some(v));
            }
        }
        Ok(())
    }

    /// Final hidden states (T, hidden) for `tokens` (T,) u32 at `positions` (T,) u32.
    pub fn forward_hidden(
        &self,
        tokens: &Tensor,
        positions: &Tensor,
        attn: &mut dyn AttentionBackend,
    ) -> Result<Tensor> {
        let rope = self.rope_rows(positions)?;
        let mut x = self.embed(tokens)?; // (T, hidden)
        let packed: Option<Vec<&PackedLayer>> =
            self.layers.iter().map(|l| l.packed.as_ref()).collect();
        match (packed, &rope.host) {
            // packed for the CPU: the residual stream stays one host vector through the layers
            (Some(layers), Some((cos, sin))) => {
                let (t, hidden) = x.dims2()?;
                let mut xs = x.flatten_all()?.to_vec1::<f32>()?;
                let heads = (self.cfg.num_heads, self.cfg.num_kv_heads, self.cfg.head_dim);
                for (i, l) in layers.iter().enumerate() {
                    l.forward_host(i, &mut xs, t, (cos, sin), heads, attn)?;
                }
                x = Tensor::from_vec(xs, (t, hidden), x.device())?;
            }
            _ => {
                for i in 0..self.layers.len() {
                    x = self.layer_forward(i, &x, &rope, attn)?;
                }
            }
        }
        self.final_norm(&x)
    }

    /// The RoPE rows of this step's positions (T,) u32, shared by every layer.
    pub fn rope_rows(&self, positions: &Tensor) -> Result<RopeRows> {
        RopeRows::new(&self.rope, positions)
    }

    /// Token embeddings (T, hidden).
    pub fn embed(&self, tokens: &Tensor) -> Result<Tensor> {
        match &self.packed_head {
            Some(p) if self.cfg.tie_word_embeddings => {
                let ids = tokens.to_vec1::<u32>()?;
                let mut rows = Vec::with_capacity(ids.len() * p.w.cols());
                for &id in &ids {
                    if id as usize >= p.w.rows() {
                        candle_core::bail!("token id {id} outside the vocabulary ({})", p.w.rows())
                    }
                    rows.extend(p.w.row(id as usize));
                }
                Tensor::from_vec(rows, (ids.len(), p.w.cols()), tokens.device())
            }
            _ => self.embed.forward(tokens),
        }
    }

    /// Decoder layer `i` on the residual stream `x` (T, hidden). Training with activation
    /// recompute runs the layers one at a time through this.
    pub fn layer_forward(
        &self,
        i: usize,
        x: &Tensor,
        rope: &RopeRows,
        attn: &mut dyn AttentionBackend,
    ) -> Result<Tensor> {
        let (hq, hkv, d) = (self.cfg.num_heads, self.cfg.num_kv_heads, self.cfg.head_dim);
        let t = x.dim(0)?;
        let fused = self.fused;
        let l = &self.layers[i];
        if let Some(p) = &l.packed {
            let Some((cos, sin)) = &rope.host else {
                candle_core::bail!("packed layer {i}: RoPE rows not on the host")
            };
            return p.forward(i, x, (cos, sin), (hq, hkv, d), attn);
        }
        // 1. attention block
        let h = l.input_norm.forward_with(x, fused)?;
        // (T, Hq, D), (T, Hkv, D), (T, Hkv, D)
        let (mut q, mut k, v) = l.project_qkv(&h, (t, hq, hkv, d), fused)?;
        if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
            q = qn.forward_with(&q, fused)?;
            k = kn.forward_with(&k, fused)?;
        }
        let q = rope.apply(&q, fused)?;
        let k = rope.apply(&k, fused)?;
        let a = attn.attend(i, &q, &k, &v)?.reshape((t, hq * d))?;
        let x = (x + project(&l.o_proj, &a)?)?;
        // 2. MLP block (SwiGLU)
        let h = l.post_norm.forward_with(&x, fused)?;
        x + l.mlp(&h, fused)?
    }

    /// The final RMS norm.
    pub fn final_norm(&self, x: &Tensor) -> Result<Tensor> {
        self.norm.forward_with(x, self.fused)
    }

    /// The LM head's weight (vocab, hidden): the embedding matrix when tied. Empty once packed
    /// for inference (see [`Self::set_fused_inference`]).
    pub fn lm_head_weight(&self) -> &Tensor {
        self.lm_head.weight()
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Logits (N, vocab) for hidden rows (N, hidden).
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        match &self.packed_head {
            Some(p) => p.forward(hidden),
            None => self.lm_head.forward(hidden),
        }
    }

    /// [`Self::logits`] as host values, row-major (no tensor round trip when the head is packed).
    pub fn logits_host(&self, hidden: &Tensor) -> Result<Vec<f32>> {
        let mut rows = Vec::new();
        self.logits_host_into(hidden, &mut rows)?;
        Ok(rows)
    }

    /// [`Self::logits_host`] into `rows`, whose allocation is reused (the packed head writes
    /// every value, so a buffer of the right size is neither zeroed nor faulted in again).
    pub fn logits_host_into(&self, hidden: &Tensor, rows: &mut Vec<f32>) -> Result<()> {
        match &self.packed_head {
            Some(p) => {
                let m = hidden.dim(0)?;
                rows.resize(m * p.w.rows(), 0.0);
                p.apply_into(&hidden.flatten_all()?.to_vec1::<f32>()?, m, rows);
            }
            None => {
                *rows = self
                    .logits(hidden)?
                    .flatten_all()?
                    .to_dtype(DType::F32)?
                    .to_vec1()?
            }
        }
        Ok(())
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

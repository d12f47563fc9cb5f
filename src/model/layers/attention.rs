//! The attention layer kinds (Qwen3, Llama, Qwen3.5's full-attention layers, Gemma 3's full and
//! sliding-window layers): q/k/v projections, per-head q/k RMS norms (Qwen3, Qwen3.5, Gemma 3),
//! RoPE (partial for Qwen3.5), the caller's attention backend over this step's keys and values
//! (with the layer's window if it slides), Gemma's softmax scale (`query_pre_attn_scalar`, as a
//! factor on the queries), Qwen3.5's output gate (`sigmoid(gate)`, the gate
//! interleaved with the query per head in q_proj's rows) and the output projection. Written once
//! over the layer ops ([`super::super::layer_ops`]): the same forward runs candle (training,
//! references, sampling on a GPU) and the CPU host path over packed weights.
//!
//! Tensor names mirror the Hugging Face checkpoint (`model.layers.N.self_attn.q_proj.weight`,
//! ...). Knows nothing of caches (the backend owns them) or of the MLP around it.

use candle_core::Result;
use candle_nn::VarBuilder;

use super::super::attention::AttentionBackend;
use super::super::config::ModelConfig;
use super::super::layer_ops::candle_ops::{CandleOps, CandleQkv};
use super::super::layer_ops::host_ops::{pack_linear, HostOps, HostQkv};
use super::super::layer_ops::{AttnDims, LayerOps, Qkv, SameOps};
use super::super::ops::{linear, RmsNorm, RopeRows};
use super::weight_init::{norm_init, Init};

/// Every weight of the layer's attention under `prefix` (`model.layers.N`): (name, shape, its
/// initial value); biases (Qwen2) start at zero.
pub fn weight_shapes(cfg: &ModelConfig, prefix: &str) -> Vec<(String, Vec<usize>, Init)> {
    let norm = norm_init(cfg);
    let (h, d) = (cfg.hidden_size, cfg.head_dim);
    let (q, kv) = (cfg.num_heads * d, cfg.num_kv_heads * d);
    let q_rows = if cfg.attention_gate { 2 * q } else { q };
    let mut out = Vec::new();
    if cfg.qk_norm {
        out.push((format!("{prefix}.self_attn.q_norm.weight"), vec![d], norm));
        out.push((format!("{prefix}.self_attn.k_norm.weight"), vec![d], norm));
    }
    out.push((
        format!("{prefix}.self_attn.q_proj.weight"),
        vec![q_rows, h],
        Init::Normal,
    ));
    out.push((
        format!("{prefix}.self_attn.k_proj.weight"),
        vec![kv, h],
        Init::Normal,
    ));
    out.push((
        format!("{prefix}.self_attn.v_proj.weight"),
        vec![kv, h],
        Init::Normal,
    ));
    if cfg.attention_bias {
        for (name, rows) in [("q_proj", q_rows), ("k_proj", kv), ("v_proj", kv)] {
            out.push((
                format!("{prefix}.self_attn.{name}.bias"),
                vec![rows],
                Init::Const(0.0),
            ));
        }
    }
    out.push((
        format!("{prefix}.self_attn.o_proj.weight"),
        vec![h, q],
        Init::Normal,
    ));
    out
}

/// A layer's attention: its weights in an implementation's form, its shape and its window.
pub struct Attention<O: LayerOps> {
    qkv: O::Qkv,
    o_proj: O::Linear,
    dims: AttnDims,
    /// A sliding-window layer's window.
    window: Option<usize>,
}

impl<O: LayerOps> Clone for Attention<O>
where
    O::Qkv: Clone,
    O::Linear: Clone,
{
    fn clone(&self) -> Self {
        Attention {
            qkv: self.qkv.clone(),
            o_proj: self.o_proj.clone(),
            dims: self.dims,
            window: self.window,
        }
    }
}

/// The factor on the queries that turns the backends' softmax scale `1 / sqrt(head_dim)` into
/// `1 / sqrt(query_pre_attn_scalar)`.
fn query_scale(cfg: &ModelConfig) -> f64 {
    cfg.query_pre_attn_scalar
        .map_or(1.0, |s| (cfg.head_dim as f64 / s).sqrt())
}

impl Attention<CandleOps> {
    /// From the layer's var builder (`model.layers.N`), with the layer's `window` if it slides.
    pub fn new(cfg: &ModelConfig, window: Option<usize>, vb: VarBuilder) -> Result<Self> {
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        let attn = vb.pp("self_attn");
        let b = cfg.attention_bias;
        let norm = |name| RmsNorm::new(d, cfg.rms_norm_eps, cfg.norm_offset, attn.pp(name));
        let gate = cfg.attention_gate;
        let q_rows = cfg.num_heads * d * if gate { 2 } else { 1 };
        Ok(Attention {
            qkv: CandleQkv {
                q_proj: linear(h, q_rows, b, attn.pp("q_proj"))?,
                k_proj: linear(h, cfg.num_kv_heads * d, b, attn.pp("k_proj"))?,
                v_proj: linear(h, cfg.num_kv_heads * d, b, attn.pp("v_proj"))?,
                stacked: None,
                q_norm: cfg.qk_norm.then(|| norm("q_norm")).transpose()?,
                k_norm: cfg.qk_norm.then(|| norm("k_norm")).transpose()?,
            },
            o_proj: linear(cfg.num_heads * d, h, false, attn.pp("o_proj"))?,
            dims: AttnDims {
                heads: cfg.num_heads,
                kv_heads: cfg.num_kv_heads,
                head_dim: d,
                gate,
                q_scale: query_scale(cfg),
            },
            window,
        })
    }

    /// Stacks q/k/v into one matrix (the separate ones become views of it).
    pub fn stack_projections(&mut self) -> Result<()> {
        self.qkv.stack()
    }

    /// The host path's packed weights; the candle weights are dropped.
    pub fn pack(&mut self) -> Result<Attention<HostOps>> {
        Ok(Attention {
            qkv: HostQkv::pack(&mut self.qkv)?,
            o_proj: pack_linear(&mut self.o_proj)?,
            dims: self.dims,
            window: self.window,
        })
    }
}

impl<O: LayerOps> Attention<O> {
    /// The attention block's output (T, hidden) for the normed input `h` (T, hidden): layer
    /// `index` of the backend.
    pub fn forward<P: SameOps<O>>(
        &self,
        o: &mut P,
        index: usize,
        h: O::Act,
        rope: &RopeRows,
        backend: &mut dyn AttentionBackend,
    ) -> Result<O::Act> {
        let Qkv { q, k, v, gate } = o.qkv_rope(h, &self.qkv, self.dims, rope)?;
        let mut a = o.attend(index, q, k, v, self.dims, self.window, backend)?;
        if let Some(g) = gate {
            a = o.gate_mul(a, g)?;
        }
        o.linear(a, &self.o_proj)
    }
}

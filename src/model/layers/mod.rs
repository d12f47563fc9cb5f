//! A decoder layer: an RMS norm, the layer's token mixer (its kind: see
//! [`crate::model::config::LayerKind`]), the residual add, an RMS norm, the gated MLP (SwiGLU,
//! or Gemma's gelu-tanh GeGLU) and the residual add; with Gemma's sandwich norms the mixer's and
//! the MLP's outputs are normed too before their adds. The mixers are one file per kind; the
//! MLP and the residual stream are here.
//!
//! Written once over the layer ops ([`super::layer_ops`]): [`Layer::forward`] runs candle
//! (training, references, sampling on a GPU) and the CPU host path over packed weights, which
//! sampling on the CPU switches to ([`Layer::pack`]). A new kind is a file here, a variant of
//! [`Mixer`], and its ops. Knows nothing of caches: attention goes through the caller's backend.

pub mod attention;
pub mod gated_deltanet;
pub mod weight_init;

use candle_core::Result;
use candle_nn::VarBuilder;

use super::attention::AttentionBackend;
use super::config::{Activation, LayerKind, ModelConfig};
use super::layer_ops::candle_ops::{CandleGateUp, CandleOps};
use super::layer_ops::host_ops::{pack_gate_up, pack_linear, HostNorm, HostOps};
use super::layer_ops::{LayerOps, SameOps};
use super::ops::{RmsNorm, RopeRows};
pub use weight_init::{norm_init, Init};

/// Every weight of layer `i` under `prefix` (`model.layers.N`): (name, shape, initial value),
/// in checkpoint order.
pub fn weight_shapes(cfg: &ModelConfig, i: usize, prefix: &str) -> Vec<(String, Vec<usize>, Init)> {
    let (h, inter) = (cfg.hidden_size, cfg.intermediate_size);
    let norm = norm_init(cfg);
    let norms: &[&str] = if cfg.sandwich_norms {
        &[
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ]
    } else {
        &["input_layernorm", "post_attention_layernorm"]
    };
    let mut out: Vec<_> = norms
        .iter()
        .map(|n| (format!("{prefix}.{n}.weight"), vec![h], norm))
        .collect();
    out.extend(match cfg.layer_kinds[i] {
        LayerKind::Attention | LayerKind::SlidingAttention => attention::weight_shapes(cfg, prefix),
        LayerKind::GatedDeltaNet => gated_deltanet::weight_shapes(cfg, prefix),
    });
    for (name, shape) in [
        ("gate_proj", [inter, h]),
        ("up_proj", [inter, h]),
        ("down_proj", [h, inter]),
    ] {
        out.push((
            format!("{prefix}.mlp.{name}.weight"),
            shape.to_vec(),
            Init::Normal,
        ));
    }
    out
}

/// A layer's token mixer.
pub enum Mixer<O: LayerOps> {
    Attention(attention::Attention<O>),
    GatedDeltaNet(gated_deltanet::GatedDeltaNet<O>),
}

/// A decoder layer, its weights in implementation `O`'s form.
pub struct Layer<O: LayerOps> {
    input_norm: O::Norm,
    mixer: Mixer<O>,
    /// Sandwich norms (Gemma): the mixer's output normed before its residual add.
    mixer_out_norm: Option<O::Norm>,
    /// The MLP's input norm.
    post_norm: O::Norm,
    /// Sandwich norms: the MLP's output normed before its residual add.
    mlp_out_norm: Option<O::Norm>,
    /// The gated MLP: `down(act(gate(h)) * up(h))`.
    gate_up: O::GateUp,
    down: O::Linear,
    act: Activation,
}

impl Layer<CandleOps> {
    /// Layer `i` of `cfg` from its var builder (`model.layers.N`).
    pub fn new(cfg: &ModelConfig, i: usize, vb: VarBuilder) -> Result<Self> {
        let (h, inter, eps, offset) = (
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.rms_norm_eps,
            cfg.norm_offset,
        );
        let norm = |name: &str| RmsNorm::new(h, eps, offset, vb.pp(name));
        let sandwich = cfg.sandwich_norms;
        let mlp = vb.pp("mlp");
        let lin = |i, o, name| candle_nn::linear_no_bias(i, o, mlp.pp(name));
        Ok(Layer {
            input_norm: norm("input_layernorm")?,
            mixer: match cfg.layer_kinds[i] {
                LayerKind::Attention | LayerKind::SlidingAttention => {
                    Mixer::Attention(attention::Attention::new(cfg, cfg.window(i), vb.clone())?)
                }
                LayerKind::GatedDeltaNet => {
                    Mixer::GatedDeltaNet(gated_deltanet::GatedDeltaNet::new(cfg, vb.clone())?)
                }
            },
            mixer_out_norm: sandwich
                .then(|| norm("post_attention_layernorm"))
                .transpose()?,
            post_norm: norm(if sandwich {
                "pre_feedforward_layernorm"
            } else {
                "post_attention_layernorm"
            })?,
            mlp_out_norm: sandwich
                .then(|| norm("post_feedforward_layernorm"))
                .transpose()?,
            gate_up: CandleGateUp {
                gate: lin(h, inter, "gate_proj")?,
                up: lin(h, inter, "up_proj")?,
                stacked: None,
            },
            down: lin(inter, h, "down_proj")?,
            act: cfg.activation,
        })
    }

    /// Stacks the projections that read the same input into one matrix each (no memory added:
    /// the separate ones become views) and fixes the norms' scales, for sampling.
    pub fn stack_projections(&mut self) -> Result<()> {
        let norms = [&mut self.mixer_out_norm, &mut self.mlp_out_norm];
        for n in norms.into_iter().flatten() {
            n.freeze_scale()?;
        }
        self.input_norm.freeze_scale()?;
        self.post_norm.freeze_scale()?;
        match &mut self.mixer {
            Mixer::Attention(a) => a.stack_projections()?,
            Mixer::GatedDeltaNet(g) => g.stack_projections()?,
        }
        self.gate_up.stack()
    }

    /// The layer packed for the CPU host path; its candle weights are dropped.
    pub fn pack(&mut self) -> Result<Layer<HostOps>> {
        let norm = |n: &Option<RmsNorm>| n.as_ref().map(HostNorm::pack).transpose();
        Ok(Layer {
            mixer: match &mut self.mixer {
                Mixer::Attention(a) => Mixer::Attention(a.pack()?),
                Mixer::GatedDeltaNet(g) => Mixer::GatedDeltaNet(g.pack()?),
            },
            gate_up: pack_gate_up(&mut self.gate_up)?,
            down: pack_linear(&mut self.down)?,
            input_norm: HostNorm::pack(&self.input_norm)?,
            mixer_out_norm: norm(&self.mixer_out_norm)?,
            post_norm: HostNorm::pack(&self.post_norm)?,
            mlp_out_norm: norm(&self.mlp_out_norm)?,
            act: self.act,
        })
    }
}

/// A layer's last residual add, left open for the next layer to fuse with its input norm: the
/// MLP's output and the sandwich norm it takes before the add (Gemma).
pub struct OpenAdd<'a, O: LayerOps> {
    pub y: O::Act,
    pub norm: Option<&'a O::Norm>,
}

impl<O: LayerOps> Layer<O> {
    /// The layer on the residual stream `x` (T, hidden): layer `index` of the backend, through
    /// the ops `o`.
    pub fn forward<P: SameOps<O>>(
        &self,
        o: &mut P,
        index: usize,
        x: O::Act,
        rope: &RopeRows,
        backend: &mut dyn AttentionBackend,
    ) -> Result<O::Act> {
        let (x, last) = self.forward_open(o, index, (x, None), rope, backend)?;
        o.add(x, last.y, last.norm)
    }

    /// [`Self::forward`] with the residual adds at the layer's edges fused with the norms
    /// beside them: `open` is the previous layer's open add (`x` is then the residual stream
    /// before it), done here with this layer's input norm in one `add_rms_norm`; and this
    /// layer's last add is returned open, for the next layer (or the caller) to do.
    pub fn forward_open<'a, P: SameOps<O>>(
        &'a self,
        o: &mut P,
        index: usize,
        (x, open): (O::Act, Option<OpenAdd<'_, O>>),
        rope: &RopeRows,
        backend: &mut dyn AttentionBackend,
    ) -> Result<(O::Act, OpenAdd<'a, O>)> {
        let (x, h) = match open {
            None => {
                let h = o.rms_norm(&x, &self.input_norm)?;
                (x, h)
            }
            Some(prev) => o.add_rms_norm(x, prev.y, prev.norm, &self.input_norm)?,
        };
        let mixed = match &self.mixer {
            Mixer::Attention(a) => a.forward(o, index, h, rope, backend)?,
            Mixer::GatedDeltaNet(g) => g.forward(o, index, h, backend)?,
        };
        let (x, h) = o.add_rms_norm(x, mixed, self.mixer_out_norm.as_ref(), &self.post_norm)?;
        let a = o.gate_up_act(h, &self.gate_up, self.act)?;
        let y = o.linear(a, &self.down)?;
        let norm = self.mlp_out_norm.as_ref();
        Ok((x, OpenAdd { y, norm }))
    }
}

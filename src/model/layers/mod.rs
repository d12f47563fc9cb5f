//! A decoder layer: an RMS norm, the layer's token mixer (its kind: see
//! [`crate::model::config::LayerKind`]), the residual add, an RMS norm, the gated MLP (SwiGLU,
//! or Gemma's gelu-tanh GeGLU) and the residual add; with Gemma's sandwich norms the mixer's and
//! the MLP's outputs are normed too before their adds. The mixers are one file per kind; the
//! MLP and the residual stream are here.
//!
//! Two execution paths, as in [`super::ops`]: the candle path ([`Layer::forward`]), and the CPU
//! host path over packed weights ([`HostLayer`]) that sampling on the CPU switches to. A new
//! kind is a file here and a variant of [`Mixer`] (and of [`HostMixer`] for its host path).
//! Knows nothing of caches: attention goes through the caller's backend.

pub mod attention;
pub mod gated_deltanet;
pub mod weight_init;

use candle_core::{Result, Tensor};
use candle_nn::{Linear, VarBuilder};
use rayon::prelude::*;

use super::attention::AttentionBackend;
use super::config::{Activation, LayerKind, ModelConfig};
use super::ops::{gated, project, stack_linears, Exec, RmsNorm, RopeRows};
use super::packed::{
    add_into, dropped, min_rows, norm_in_place, norm_row, rms_rows, sized, Buffers, PackedLinear,
};
use crate::simd::exp_sub_sum;
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

/// A layer's token mixer on the candle path.
#[derive(Debug, Clone)]
pub enum Mixer {
    Attention(attention::Attention),
    GatedDeltaNet(gated_deltanet::GatedDeltaNet),
}

/// A layer's token mixer on the host path.
#[derive(Debug, Clone)]
pub enum HostMixer {
    Attention(attention::HostAttention),
    GatedDeltaNet(gated_deltanet::HostGatedDeltaNet),
}

/// The gated MLP: `down(act(gate(h)) * up(h))`.
#[derive(Debug, Clone)]
struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    /// For sampling: gate and up as one matrix (the two above become views of it).
    gate_up: Option<Linear>,
    act: Activation,
}

impl Mlp {
    fn new(cfg: &ModelConfig, vb: VarBuilder) -> Result<Self> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        Ok(Mlp {
            gate_proj: candle_nn::linear_no_bias(h, i, vb.pp("gate_proj"))?,
            up_proj: candle_nn::linear_no_bias(h, i, vb.pp("up_proj"))?,
            down_proj: candle_nn::linear_no_bias(i, h, vb.pp("down_proj"))?,
            gate_up: None,
            act: cfg.activation,
        })
    }

    fn stack_projections(&mut self) -> Result<()> {
        if self.gate_up.is_none() {
            let (gate_up, v) = stack_linears(&[&self.gate_proj, &self.up_proj])?;
            (self.gate_proj, self.up_proj) = (v[0].clone(), v[1].clone());
            self.gate_up = Some(gate_up);
        }
        Ok(())
    }

    fn forward(&self, h: &Tensor, exec: Exec) -> Result<Tensor> {
        let (g, u) = match (&self.gate_up, exec) {
            (Some(gu), Exec::Sampling) => {
                let y = candle_core::Module::forward(gu, h)?;
                let i = y.dim(1)? / 2;
                (y.narrow(1, 0, i)?, y.narrow(1, i, i)?)
            }
            _ => (
                project(&self.gate_proj, h, exec)?,
                project(&self.up_proj, h, exec)?,
            ),
        };
        project(&self.down_proj, &gated(&g, &u, self.act, exec)?, exec)
    }
}

/// A decoder layer on the candle path.
#[derive(Debug, Clone)]
pub struct Layer {
    input_norm: RmsNorm,
    mixer: Mixer,
    /// Sandwich norms (Gemma): the mixer's output normed before its residual add.
    mixer_out_norm: Option<RmsNorm>,
    /// The MLP's input norm.
    post_norm: RmsNorm,
    /// Sandwich norms: the MLP's output normed before its residual add.
    mlp_out_norm: Option<RmsNorm>,
    mlp: Mlp,
}

impl Layer {
    /// Layer `i` of `cfg` from its var builder (`model.layers.N`).
    pub fn new(cfg: &ModelConfig, i: usize, vb: VarBuilder) -> Result<Self> {
        let (h, eps, offset) = (cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_offset);
        let norm = |name: &str| RmsNorm::new(h, eps, offset, vb.pp(name));
        let sandwich = cfg.sandwich_norms;
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
            mlp: Mlp::new(cfg, vb.pp("mlp"))?,
        })
    }

    /// Stacks the projections that read the same input into one matrix each, for sampling (no
    /// memory added: the separate ones become views).
    pub fn stack_projections(&mut self) -> Result<()> {
        match &mut self.mixer {
            Mixer::Attention(a) => a.stack_projections()?,
            Mixer::GatedDeltaNet(_) => {}
        }
        self.mlp.stack_projections()
    }

    /// The layer packed for the host path; its candle weights are dropped.
    pub fn pack(&mut self) -> Result<HostLayer> {
        let mixer = match &mut self.mixer {
            Mixer::Attention(a) => HostMixer::Attention(a.pack()?),
            Mixer::GatedDeltaNet(g) => HostMixer::GatedDeltaNet(g.pack()?),
        };
        self.mlp.stack_projections()?;
        let Some(gate_up) = self.mlp.gate_up.take() else {
            candle_core::bail!("pack: gate/up not stacked")
        };
        let host = HostLayer {
            mixer,
            gate_up: PackedLinear::new(&gate_up)?,
            down: PackedLinear::new(&self.mlp.down_proj)?,
            input_norm: self.input_norm.scale()?.to_vec1()?,
            mixer_out_norm: host_scale(&self.mixer_out_norm)?,
            post_norm: self.post_norm.scale()?.to_vec1()?,
            mlp_out_norm: host_scale(&self.mlp_out_norm)?,
            act: self.mlp.act,
            eps: self.input_norm.eps as f32,
        };
        for l in [
            &mut self.mlp.gate_proj,
            &mut self.mlp.up_proj,
            &mut self.mlp.down_proj,
        ] {
            *l = dropped(l)?;
        }
        Ok(host)
    }

    /// The layer on the residual stream `x` (T, hidden): layer `index` of the backend.
    pub fn forward(
        &self,
        index: usize,
        x: &Tensor,
        rope: &RopeRows,
        exec: Exec,
        attn: &mut dyn AttentionBackend,
    ) -> Result<Tensor> {
        let h = self.input_norm.forward(x, exec)?;
        let mixed = match &self.mixer {
            Mixer::Attention(a) => a.forward(index, &h, rope, exec, attn)?,
            Mixer::GatedDeltaNet(g) => g.forward(index, &h, exec, attn)?,
        };
        let mixed = match &self.mixer_out_norm {
            Some(n) => n.forward(&mixed, exec)?,
            None => mixed,
        };
        let x = (x + mixed)?;
        let h = self.post_norm.forward(&x, exec)?;
        let y = self.mlp.forward(&h, exec)?;
        match &self.mlp_out_norm {
            Some(n) => x + n.forward(&y, exec)?,
            None => x + y,
        }
    }
}

/// A norm's scale as host values.
fn host_scale(n: &Option<RmsNorm>) -> Result<Option<Vec<f32>>> {
    n.as_ref().map(|n| n.scale()?.to_vec1()).transpose()
}

/// GELU's tanh approximation (`gelu_pytorch_tanh`), as candle's `gelu` computes it.
fn gelu_tanh(x: f32) -> f32 {
    const SQRT_TWO_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_TWO_OVER_PI * x * (1.0 + 0.044_715 * x * x)).tanh())
}

/// A decoder layer packed for the CPU host path: its mixer, gate/up stacked, down, the norms.
/// Every op is per row, so a row's values do not depend on the other rows of the step (the
/// sampler's batch-invariance promise). Inference only.
#[derive(Debug, Clone)]
pub struct HostLayer {
    mixer: HostMixer,
    gate_up: PackedLinear,
    down: PackedLinear,
    input_norm: Vec<f32>,
    mixer_out_norm: Option<Vec<f32>>,
    post_norm: Vec<f32>,
    mlp_out_norm: Option<Vec<f32>>,
    act: Activation,
    eps: f32,
}

impl HostLayer {
    /// The layer on the residual stream `x` (T, hidden) as a tensor; `rope` holds the step's
    /// RoPE rows (T, D/2 each, row-major).
    pub fn forward(
        &self,
        index: usize,
        x: &Tensor,
        rope: (&[f32], &[f32]),
        attn: &mut dyn AttentionBackend,
    ) -> Result<Tensor> {
        let (t, hidden) = x.dims2()?;
        let mut xs = x.flatten_all()?.to_vec1::<f32>()?;
        self.forward_host(index, &mut xs, t, rope, attn)?;
        Tensor::from_vec(xs, (t, hidden), x.device())
    }

    /// [`Self::forward`] in place on host values: `xs` is the residual stream, `t` rows.
    pub fn forward_host(
        &self,
        index: usize,
        xs: &mut [f32],
        t: usize,
        rope: (&[f32], &[f32]),
        attn: &mut dyn AttentionBackend,
    ) -> Result<()> {
        // this thread's buffers; fresh ones if they are in use (a step of another engine that
        // this thread picked up while waiting inside a step)
        Buffers::with(|b| self.forward_in(b, index, xs, t, rope, attn))
    }

    fn forward_in(
        &self,
        b: &mut Buffers,
        index: usize,
        xs: &mut [f32],
        t: usize,
        rope: (&[f32], &[f32]),
        attn: &mut dyn AttentionBackend,
    ) -> Result<()> {
        let hidden = xs.len() / t.max(1);
        // Every op between the matmuls works row by row, in parallel once the step has a few
        // rows: run on one thread, it would leave the other workers to fall asleep until the
        // next matmul wakes them.
        let min = min_rows(xs.len());
        // the mixer's block: its output in b.out
        rms_rows(
            xs,
            hidden,
            &self.input_norm,
            self.eps,
            sized(&mut b.h, xs.len()),
        );
        match &self.mixer {
            HostMixer::Attention(a) => a.forward(b, index, t, rope, attn)?,
            HostMixer::GatedDeltaNet(g) => g.forward(b, index, t, attn)?,
        }
        let Buffers { h, qkv, a, out, .. } = &mut *b;
        let (h, o) = (&mut h[..xs.len()], &mut out[..xs.len()]);
        // (sandwich norms: the output's norm), the residual add, then the MLP's norm of the sum
        let add_norm = |((x, o), h): ((&mut [f32], &mut [f32]), &mut [f32])| {
            if let Some(w) = &self.mixer_out_norm {
                norm_in_place(o, w, self.eps);
            }
            add_into(x, o);
            norm_row(x, &self.post_norm, self.eps, h);
        };
        xs.par_chunks_mut(hidden)
            .zip(o.par_chunks_mut(hidden))
            .zip(h.par_chunks_mut(hidden))
            .with_min_len(min)
            .for_each(add_norm);
        // MLP block (SwiGLU or GeGLU)
        let inter = self.gate_up.w.rows() / 2;
        let gu = sized(qkv, t * 2 * inter);
        self.gate_up.apply_into(h, t, gu);
        let act = sized(a, t * inter);
        let swiglu = |(a, g): (&mut [f32], &[f32])| {
            let (g, u) = g.split_at(inter);
            // a = exp(-g), then g * sigmoid(g) * u
            for (a, g) in a.iter_mut().zip(g) {
                *a = -g;
            }
            exp_sub_sum(a, 0.0);
            for ((a, g), u) in a.iter_mut().zip(g).zip(u) {
                *a = g / (1.0 + *a) * u;
            }
        };
        let geglu = |(a, g): (&mut [f32], &[f32])| {
            let (g, u) = g.split_at(inter);
            for ((a, g), u) in a.iter_mut().zip(g).zip(u) {
                *a = gelu_tanh(*g) * u;
            }
        };
        let rows = act
            .par_chunks_mut(inter)
            .zip(gu.par_chunks(2 * inter))
            .with_min_len(min);
        match self.act {
            Activation::Silu => rows.for_each(swiglu),
            Activation::GeluTanh => rows.for_each(geglu),
        }
        let down = sized(out, xs.len());
        self.down.apply_into(act, t, down);
        xs.par_chunks_mut(hidden)
            .zip(down.par_chunks_mut(hidden))
            .with_min_len(min)
            .for_each(|(x, o)| {
                if let Some(w) = &self.mlp_out_norm {
                    norm_in_place(o, w, self.eps);
                }
                add_into(x, o)
            });
        b.release_large();
        Ok(())
    }
}

//! The attention layer kinds (Qwen3, Llama, Qwen3.5's full-attention layers, Gemma 3's full and
//! sliding-window layers): q/k/v projections, per-head q/k RMS norms (Qwen3, Qwen3.5, Gemma 3),
//! RoPE (partial for Qwen3.5), the caller's attention backend over this step's keys and values
//! (with the layer's window if it slides), Gemma's softmax scale (`query_pre_attn_scalar`, as a
//! factor on the queries), Qwen3.5's output gate (`sigmoid(gate)`, the gate
//! interleaved with the query per head in q_proj's rows) and the output projection. Two
//! execution paths: the candle path ([`Attention`], differentiable or fused for sampling) and
//! the CPU host path over packed weights ([`HostAttention`], ungated full-RoPE layers only).
//!
//! Tensor names mirror the Hugging Face checkpoint (`model.layers.N.self_attn.q_proj.weight`,
//! ...). Knows nothing of caches (the backend owns them) or of the MLP around it.

use candle_core::{Result, Tensor};
use candle_nn::{Linear, VarBuilder};
use rayon::prelude::*;

use super::super::attention::AttentionBackend;
use super::super::config::ModelConfig;
use super::super::ops::{linear, project, stack_linears, Exec, RmsNorm, RopeRows};
use super::super::packed::{dropped, inv_rms, min_rows, sized, Buffers, PackedLinear};
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

/// A layer's attention on the candle path.
#[derive(Debug, Clone)]
pub struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    /// Qwen3's per-head RMS norms on queries and keys.
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    /// For sampling: q, k and v as one matrix, so that a step runs one matmul where it ran
    /// three; the separate projections above become views of it.
    qkv: Option<Linear>,
    /// (query heads, KV heads, head_dim).
    heads: (usize, usize, usize),
    /// q_proj gives a query and an output gate per head (Qwen3.5).
    gate: bool,
    /// The leading dims of a head that RoPE rotates.
    rotary: usize,
    /// A sliding-window layer's window.
    window: Option<usize>,
    /// The factor on the rotated queries that makes the backends' `1 / sqrt(head_dim)` the
    /// model's softmax scale (1 but for Gemma's `query_pre_attn_scalar`).
    q_scale: f64,
}

/// The factor on the queries that turns the backends' softmax scale `1 / sqrt(head_dim)` into
/// `1 / sqrt(query_pre_attn_scalar)`.
fn query_scale(cfg: &ModelConfig) -> f64 {
    cfg.query_pre_attn_scalar
        .map_or(1.0, |s| (cfg.head_dim as f64 / s).sqrt())
}

impl Attention {
    /// From the layer's var builder (`model.layers.N`), with the layer's `window` if it slides.
    pub fn new(cfg: &ModelConfig, window: Option<usize>, vb: VarBuilder) -> Result<Self> {
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        let attn = vb.pp("self_attn");
        let b = cfg.attention_bias;
        let norm = |name| RmsNorm::new(d, cfg.rms_norm_eps, cfg.norm_offset, attn.pp(name));
        let gate = cfg.attention_gate;
        let q_rows = cfg.num_heads * d * if gate { 2 } else { 1 };
        Ok(Attention {
            q_proj: linear(h, q_rows, b, attn.pp("q_proj"))?,
            k_proj: linear(h, cfg.num_kv_heads * d, b, attn.pp("k_proj"))?,
            v_proj: linear(h, cfg.num_kv_heads * d, b, attn.pp("v_proj"))?,
            o_proj: linear(cfg.num_heads * d, h, false, attn.pp("o_proj"))?,
            q_norm: cfg.qk_norm.then(|| norm("q_norm")).transpose()?,
            k_norm: cfg.qk_norm.then(|| norm("k_norm")).transpose()?,
            qkv: None,
            heads: (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim),
            gate,
            rotary: cfg.rotary_dim,
            window,
            q_scale: query_scale(cfg),
        })
    }

    /// Stacks q/k/v into one matrix (the separate ones become views of it).
    pub fn stack_projections(&mut self) -> Result<()> {
        if self.qkv.is_some() {
            return Ok(());
        }
        let (qkv, v) = stack_linears(&[&self.q_proj, &self.k_proj, &self.v_proj])?;
        (self.q_proj, self.k_proj, self.v_proj) = (v[0].clone(), v[1].clone(), v[2].clone());
        self.qkv = Some(qkv);
        Ok(())
    }

    /// The host path's packed weights; the candle weights are dropped.
    pub fn pack(&mut self) -> Result<HostAttention> {
        self.stack_projections()?;
        let Some(qkv) = self.qkv.take() else {
            candle_core::bail!("pack: projections not stacked")
        };
        let packed = HostAttention {
            qkv: PackedLinear::new(&qkv)?,
            o: PackedLinear::new(&self.o_proj)?,
            qk_norms: match (&self.q_norm, &self.k_norm) {
                (Some(q), Some(k)) => Some((q.scale()?.to_vec1()?, k.scale()?.to_vec1()?)),
                _ => None,
            },
            eps: self.q_norm.as_ref().map_or(0.0, |n| n.eps as f32),
            heads: self.heads,
            gate: self.gate,
            rotary: self.rotary,
            window: self.window,
            q_scale: self.q_scale as f32,
        };
        for l in [
            &mut self.q_proj,
            &mut self.k_proj,
            &mut self.v_proj,
            &mut self.o_proj,
        ] {
            *l = dropped(l)?;
        }
        Ok(packed)
    }

    /// (q, k, v) as (T, H, D) each, and the output gate (T, H * D) when the layer has one.
    fn project_qkv(
        &self,
        h: &Tensor,
        exec: Exec,
    ) -> Result<(Tensor, Tensor, Tensor, Option<Tensor>)> {
        let (hq, hkv, d) = self.heads;
        let t = h.dim(0)?;
        let nq = hq * d * if self.gate { 2 } else { 1 };
        let (q, k, v) = match (&self.qkv, exec) {
            (Some(qkv), Exec::Sampling) => {
                let y = candle_core::Module::forward(qkv, h)?;
                let nkv = hkv * d;
                (
                    y.narrow(1, 0, nq)?,
                    y.narrow(1, nq, nkv)?,
                    y.narrow(1, nq + nkv, nkv)?,
                )
            }
            _ => (
                project(&self.q_proj, h, exec)?,
                project(&self.k_proj, h, exec)?,
                project(&self.v_proj, h, exec)?,
            ),
        };
        let k = k.reshape((t, hkv, d))?;
        let v = v.reshape((t, hkv, d))?;
        if !self.gate {
            return Ok((q.reshape((t, hq, d))?, k, v, None));
        }
        // each head's rows: its query, then its gate
        let qg = q.reshape((t, hq, 2 * d))?;
        let gate = qg.narrow(2, d, d)?.reshape((t, hq * d))?;
        Ok((qg.narrow(2, 0, d)?.contiguous()?, k, v, Some(gate)))
    }

    /// The attention block's output (T, hidden) for the normed input `h` (T, hidden): layer
    /// `index` of the backend.
    pub fn forward(
        &self,
        index: usize,
        h: &Tensor,
        rope: &RopeRows,
        exec: Exec,
        attn: &mut dyn AttentionBackend,
    ) -> Result<Tensor> {
        let (hq, _, d) = self.heads;
        let t = h.dim(0)?;
        // (T, Hq, D), (T, Hkv, D), (T, Hkv, D)
        let (mut q, mut k, v, gate) = self.project_qkv(h, exec)?;
        if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            q = qn.forward(&q, exec)?;
            k = kn.forward(&k, exec)?;
        }
        let mut q = rope.apply(&q, exec)?;
        if self.q_scale != 1.0 {
            q = q.affine(self.q_scale, 0.0)?;
        }
        let k = rope.apply(&k, exec)?;
        let mut a = attn
            .attend(index, &q, &k, &v, self.window)?
            .reshape((t, hq * d))?;
        if let Some(g) = gate {
            a = (a * candle_nn::ops::sigmoid(&g)?)?;
        }
        project(&self.o_proj, &a, exec)
    }
}

/// A layer's attention on the CPU host path: q/k/v stacked and packed, the output projection
/// packed, the q/k norms as host values.
#[derive(Debug, Clone)]
pub struct HostAttention {
    qkv: PackedLinear,
    o: PackedLinear,
    /// The per-head norms' scales of queries and keys (Qwen3, Qwen3.5).
    qk_norms: Option<(Vec<f32>, Vec<f32>)>,
    eps: f32,
    heads: (usize, usize, usize),
    /// Each head's query rows are followed by its gate's (Qwen3.5).
    gate: bool,
    /// The leading dims of a head that RoPE rotates.
    rotary: usize,
    window: Option<usize>,
    /// See [`Attention`]'s.
    q_scale: f32,
}

impl HostAttention {
    /// The attention block's output for the normed rows `b.h` (T, hidden) into `b.out`; `cos`,
    /// `sin` are the step's RoPE rows (T, rotary/2 each, row-major). Attention is the caller's
    /// backend, layer `index`.
    pub fn forward(
        &self,
        b: &mut Buffers,
        index: usize,
        t: usize,
        (cos, sin): (&[f32], &[f32]),
        attn: &mut dyn AttentionBackend,
    ) -> Result<()> {
        let Buffers {
            h,
            qkv,
            q,
            k,
            v,
            a,
            out,
            gate,
            ..
        } = b;
        let (hq, hkv, d) = self.heads;
        let min = min_rows(h.len());
        let (nq, nkv) = (hq * d, hkv * d);
        // a head's query rows, then (gated) its gate's
        let q_rows = if self.gate { 2 * d } else { d };
        let width = hq * q_rows + 2 * nkv;
        let rows = sized(qkv, t * width);
        self.qkv.apply_into(h, t, rows);
        let half = self.rotary / 2;
        let (q, k, v) = (sized(q, t * nq), sized(k, t * nkv), sized(v, t * nkv));
        // (ungated: one unused value per row, so that every row has its chunk)
        let gw = if self.gate { nq } else { 1 };
        let gate = sized(gate, t * gw);
        // the per-head norms and RoPE on one head's vector
        let rotate = |x: &mut [f32], w: Option<&Vec<f32>>, c: &[f32], s: &[f32]| {
            if let Some(w) = w {
                let r = inv_rms(x, self.eps);
                for (x, w) in x.iter_mut().zip(w) {
                    *x = *x * r * w;
                }
            }
            let (x1, x2) = x[..2 * half].split_at_mut(half);
            for i in 0..half {
                let (a, b) = (x1[i], x2[i]);
                x1[i] = a * c[i] - b * s[i];
                x2[i] = b * c[i] + a * s[i];
            }
        };
        let row_job = |(ti, ((((row, q), k), v), g)): (usize, RowParts)| {
            let (c, s) = (&cos[ti * half..][..half], &sin[ti * half..][..half]);
            let norms = self.qk_norms.as_ref();
            for (hd, qh) in q.chunks_mut(d).enumerate() {
                qh.copy_from_slice(&row[hd * q_rows..][..d]);
                rotate(qh, norms.map(|n| &n.0), c, s);
                if self.q_scale != 1.0 {
                    qh.iter_mut().for_each(|x| *x *= self.q_scale);
                }
                if self.gate {
                    g[hd * d..][..d].copy_from_slice(&row[hd * q_rows + d..][..d]);
                }
            }
            let keys = &row[hq * q_rows..];
            k.copy_from_slice(&keys[..nkv]);
            for kh in k.chunks_mut(d) {
                rotate(kh, norms.map(|n| &n.1), c, s);
            }
            v.copy_from_slice(&keys[nkv..]);
        };
        rows.par_chunks_mut(width)
            .zip(q.par_chunks_mut(nq))
            .zip(k.par_chunks_mut(nkv))
            .zip(v.par_chunks_mut(nkv))
            .zip(gate.par_chunks_mut(gw))
            .enumerate()
            .with_min_len(min)
            .for_each(row_job);
        let att = sized(a, t * nq);
        att.fill(0.0);
        attn.attend_host(index, q, k, v, (t, hq, hkv, d), self.window, att)?;
        if self.gate {
            // out * sigmoid(gate), before o_proj
            att.par_chunks_mut(nq)
                .zip(gate.par_chunks(nq))
                .with_min_len(min)
                .for_each(|(o, g)| {
                    for (o, g) in o.iter_mut().zip(g) {
                        *o /= 1.0 + (-g).exp();
                    }
                });
        }
        let o = sized(out, h.len());
        self.o.apply_into(att, t, o);
        Ok(())
    }
}

/// A row of the stacked projections, the rows of `q`, `k` and `v` it is split into, and the
/// row of gates (empty when ungated).
type RowParts<'a> = (
    (
        ((&'a mut [f32], &'a mut [f32]), &'a mut [f32]),
        &'a mut [f32],
    ),
    &'a mut [f32],
);

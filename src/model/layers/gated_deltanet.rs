//! The Gated DeltaNet layer kind (Qwen3.5's `linear_attention`): a linear-attention mixer whose
//! memory of a sequence is a fixed state instead of keys and values.
//!
//! ```text
//! c = in_proj_qkv(x)                      conv_dim = 2 * key_dim + value_dim channels
//! u = silu(causal depthwise conv_K(c))    the conv sees the last K-1 inputs of the state
//! q, k, v = split(u)                      q, k: (Hk, dk) l2-normalised, q / sqrt(dk), repeated
//!                                         to the Hv value heads (head h reads key head h / (Hv/Hk))
//! beta = sigmoid(in_proj_b(x))            g = -exp(A_log) * softplus(in_proj_a(x) + dt_bias)
//! S = S * exp(g);  S += k ⊗ beta (v - Sᵀk);  o = Sᵀq          per value head, S: (dk, dv)
//! y = out_proj(rmsnorm(o) * w * silu(in_proj_z(x)))            the norm per head over dv
//! ```
//! Written once over the layer ops ([`super::super::layer_ops`]): the input projection, the
//! step's states from the backend, the conv update, the delta rule with its gated norm, the
//! states back, the output projection. Each device's implementation of those steps is in
//! `layer_ops` (`candle_deltanet`: both forms of the delta rule, differentiable, and the GPU's
//! decode kernels; `host_deltanet`: the CPU sampler's packed path). A sequence's state (the conv
//! inputs, then S) comes from and goes back to the caller's backend, so a step may continue
//! sequences. Knows nothing of where states are kept.

use candle_core::Result;
use candle_nn::VarBuilder;

use super::super::attention::AttentionBackend;
use super::super::config::ModelConfig;
use super::super::layer_ops::candle_deltanet::{kernel_shape, CandleDeltaIn, CandleDeltaNet};
use super::super::layer_ops::candle_ops::CandleOps;
use super::super::layer_ops::host_deltanet::HostDeltaNet;
use super::super::layer_ops::host_ops::{pack_linear, HostOps};
use super::super::layer_ops::{LayerOps, SameOps};
use super::super::ops::{stack_linears, RmsNorm};
use super::super::packed::{dropped, PackedLinear};
use super::weight_init::Init;

/// Every weight of the layer under `prefix` (`model.layers.N`): (name, shape, initial value).
pub fn weight_shapes(cfg: &ModelConfig, prefix: &str) -> Vec<(String, Vec<usize>, Init)> {
    let Some(l) = cfg.linear else {
        return Vec::new();
    };
    let (h, nv) = (cfg.hidden_size, l.num_value_heads);
    let p = |n: &str| format!("{prefix}.linear_attn.{n}");
    vec![
        (p("in_proj_qkv.weight"), vec![l.conv_dim(), h], Init::Normal),
        (p("in_proj_z.weight"), vec![l.value_dim(), h], Init::Normal),
        (p("in_proj_b.weight"), vec![nv, h], Init::Normal),
        (p("in_proj_a.weight"), vec![nv, h], Init::Normal),
        (
            p("conv1d.weight"),
            vec![l.conv_dim(), 1, l.conv_kernel],
            Init::Normal,
        ),
        // A = 4: a decay rate inside transformers' init range (0.01, 16)
        (p("A_log"), vec![nv], Init::Const(4f32.ln())),
        (p("dt_bias"), vec![nv], Init::Const(1.0)),
        (p("norm.weight"), vec![l.value_head_dim], Init::Const(1.0)),
        (p("out_proj.weight"), vec![h, l.value_dim()], Init::Normal),
    ]
}

/// A layer's Gated DeltaNet, its weights in an implementation's form.
pub struct GatedDeltaNet<O: LayerOps> {
    /// in_proj_qkv, in_proj_z, in_proj_b, in_proj_a.
    in_proj: O::DeltaIn,
    /// The conv, the decay and its bias, the gated norm.
    weights: O::DeltaNet,
    out_proj: O::Linear,
}

impl GatedDeltaNet<CandleOps> {
    /// From the layer's var builder (`model.layers.N`).
    pub fn new(cfg: &ModelConfig, vb: VarBuilder) -> Result<Self> {
        let Some(l) = cfg.linear else {
            candle_core::bail!("a Gated DeltaNet layer in a config without its linear_* shape")
        };
        let vb = vb.pp("linear_attn");
        let (h, nv) = (cfg.hidden_size, l.num_value_heads);
        let lin = |i, o, name| candle_nn::linear_no_bias(i, o, vb.pp(name));
        Ok(GatedDeltaNet {
            in_proj: CandleDeltaIn {
                qkv: lin(h, l.conv_dim(), "in_proj_qkv")?,
                z: lin(h, l.value_dim(), "in_proj_z")?,
                b: lin(h, nv, "in_proj_b")?,
                a: lin(h, nv, "in_proj_a")?,
                stacked: None,
            },
            weights: CandleDeltaNet {
                conv: vb.get((l.conv_dim(), 1, l.conv_kernel), "conv1d.weight")?,
                a_log: vb.get(nv, "A_log")?,
                dt_bias: vb.get(nv, "dt_bias")?,
                norm: RmsNorm::new(l.value_head_dim, cfg.rms_norm_eps, false, vb.pp("norm"))?,
                shape: l,
            },
            out_proj: lin(l.value_dim(), h, "out_proj")?,
        })
    }

    /// Stacks the four input projections into one matrix for sampling, where the GPU kernels
    /// take the layer's shape and read the parts of its rows in place (the separate
    /// projections become views of it).
    pub fn stack_projections(&mut self) -> Result<()> {
        if kernel_shape(&self.weights).is_some() {
            self.in_proj.stack()?;
        }
        Ok(())
    }

    /// The host path's packed weights (the four input projections stacked into one); the candle
    /// projections are dropped.
    pub fn pack(&mut self) -> Result<GatedDeltaNet<HostOps>> {
        let p = &mut self.in_proj;
        let (stacked, _) = stack_linears(&[&p.qkv, &p.z, &p.b, &p.a])?;
        let w = &self.weights;
        let host = GatedDeltaNet {
            in_proj: PackedLinear::new(&stacked)?,
            weights: HostDeltaNet {
                conv: w.conv.squeeze(1)?.flatten_all()?.to_vec1()?,
                rate: w.a_log.exp()?.neg()?.to_vec1()?,
                dt_bias: w.dt_bias.to_vec1()?,
                norm: w.norm.scale()?.to_vec1()?,
                eps: w.norm.eps as f32,
                shape: w.shape,
            },
            out_proj: pack_linear(&mut self.out_proj)?,
        };
        for l in [&mut p.qkv, &mut p.z, &mut p.b, &mut p.a] {
            *l = dropped(l)?;
        }
        Ok(host)
    }
}

impl<O: LayerOps> GatedDeltaNet<O> {
    /// The block's output (T, hidden) for the normed input `h` (T, hidden): layer `index`,
    /// whose sequences and states the backend gives.
    pub fn forward<P: SameOps<O>>(
        &self,
        o: &mut P,
        index: usize,
        h: O::Act,
        backend: &mut dyn AttentionBackend,
    ) -> Result<O::Act> {
        let x = o.deltanet_in(h, &self.in_proj)?;
        let mut state = o.deltanet_state(index, &x, &self.weights, backend)?;
        let u = o.conv_update(&x, &self.weights, &mut state)?;
        let y = o.delta_rule(u, x, &self.weights, &mut state)?;
        o.store_deltanet_state(state)?;
        o.linear(y, &self.out_proj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::attention::RecurrentStep;
    use crate::model::layer_ops::host_ops::HostAct;
    use crate::model::ops::Exec;
    use crate::model::tests::{fixture_named, max_abs_diff};
    use candle_core::{DType, Device, Tensor};

    /// A backend with a step's sequences whose states it keeps between steps.
    struct Keep {
        lens: Vec<usize>,
        state: Option<Tensor>,
    }

    impl AttentionBackend for Keep {
        fn attend(
            &mut self,
            _: usize,
            _: &Tensor,
            _: &Tensor,
            _: &Tensor,
            _: Option<usize>,
        ) -> Result<Tensor> {
            unreachable!("no attention layer here")
        }
        fn recurrent_state(&mut self, _: usize, values: usize) -> Result<RecurrentStep> {
            if let Some(s) = &self.state {
                assert_eq!(s.dims(), &[self.lens.len(), values]);
            }
            Ok(RecurrentStep {
                seq_lens: self.lens.clone(),
                state: self.state.clone(),
            })
        }
        fn store_recurrent_state(&mut self, _: usize, state: Tensor) -> Result<()> {
            self.state = Some(state);
            Ok(())
        }
    }

    /// Each sequence's tokens and its state, the layer run on two sequences by steps in which
    /// they bring the given lengths, on either path, against each sequence run alone in one step
    /// on the candle path: a step continues where the last ended, and a sequence's values do not
    /// depend on the other sequence of its steps.
    #[test]
    fn a_step_continues_where_the_last_ended() {
        let Some(dir) = fixture_named("tiny-qwen3_5") else {
            return;
        };
        let ck = crate::model::Checkpoint::open(dir.to_str().unwrap()).unwrap();
        // SAFETY: the fixture is read-only for the test's life.
        let vb = unsafe {
            VarBuilder::from_mmaped_safetensors(&ck.weights, DType::F32, &Device::Cpu).unwrap()
        };
        let vb = vb.pp("model.language_model.layers.0");
        let layer = GatedDeltaNet::new(&ck.config, vb.clone()).unwrap();
        let host = GatedDeltaNet::new(&ck.config, vb).unwrap().pack().unwrap();
        let hidden = ck.config.hidden_size;
        let xs = [0, 1].map(|_| Tensor::randn(0f32, 1.0, (20, hidden), &Device::Cpu).unwrap());
        // the sequences `seqs` of `xs` by steps of the given lengths: the candle path, or the
        // host path's packed layer (through the tensors of a backend that lends no host state);
        // each sequence's outputs and the final states (sequences, values)
        let run = |seqs: &[usize], steps: &[Vec<usize>], packed: bool| {
            let mut b = Keep {
                lens: Vec::new(),
                state: None,
            };
            let mut outs = vec![Vec::new(); seqs.len()];
            let mut at = vec![0; seqs.len()];
            for lens in steps {
                b.lens = lens.clone();
                let parts: Vec<Tensor> = (0..seqs.len())
                    .map(|i| xs[seqs[i]].narrow(0, at[i], lens[i]).unwrap())
                    .collect();
                let x = Tensor::cat(&parts, 0).unwrap();
                let y = if packed {
                    let x = HostAct::from_tensor(&x).unwrap();
                    let y = host.forward(&mut HostOps::new(), 0, x, &mut b).unwrap();
                    y.into_tensor().unwrap()
                } else {
                    let mut o = CandleOps::new(Exec::Differentiable);
                    layer.forward(&mut o, 0, x, &mut b).unwrap()
                };
                let mut from = 0;
                for i in 0..seqs.len() {
                    outs[i].push(y.narrow(0, from, lens[i]).unwrap());
                    (from, at[i]) = (from + lens[i], at[i] + lens[i]);
                }
            }
            let outs: Vec<Tensor> = outs.iter().map(|o| Tensor::cat(o, 0).unwrap()).collect();
            (outs, b.state.unwrap())
        };
        let alone: Vec<(Tensor, Tensor)> = (0..2)
            .map(|i| {
                let (y, s) = run(&[i], &[vec![20]], false);
                (y[0].clone(), s)
            })
            .collect();
        let steps = |lens: &[(usize, usize)]| -> Vec<Vec<usize>> {
            lens.iter().map(|&(a, b)| vec![a, b]).collect()
        };
        let mut cases: Vec<(Vec<usize>, Vec<Vec<usize>>)> = vec![
            // one sequence: a prefill in two chunks, a prefill then decode steps, token by token
            (vec![0], vec![vec![13], vec![7]]),
            (vec![0], [16, 1, 1, 1, 1].map(|n| vec![n]).to_vec()),
            (vec![1], vec![vec![1]; 20]),
            // two: of one length at each step (decode steps too), and of two lengths
            (vec![0, 1], steps(&[(20, 20)])),
            (vec![0, 1], steps(&[(13, 13), (7, 7)])),
            (
                vec![0, 1],
                steps(&[(16, 16), (1, 1), (1, 1), (1, 1), (1, 1)]),
            ),
            (vec![0, 1], steps(&[(13, 16), (6, 3), (1, 1)])),
        ];
        cases.push((vec![1, 0], steps(&[(19, 18), (1, 2)])));
        for (seqs, steps) in &cases {
            for packed in [false, true] {
                let (ys, states) = run(seqs, steps, packed);
                for (i, &seq) in seqs.iter().enumerate() {
                    let (y, s) = &alone[seq];
                    let (d_y, d_s) = (
                        max_abs_diff(y, &ys[i]),
                        max_abs_diff(s, &states.get(i).unwrap().unsqueeze(0).unwrap()),
                    );
                    assert!(
                        d_y < 1e-5 && d_s < 1e-5,
                        "sequences {seqs:?} by {steps:?}, packed {packed}: sequence {seq}'s \
                         outputs {d_y}, states {d_s}"
                    );
                }
            }
        }
    }
}

//! The decoder shared by every family: token embeddings, a list of decoder layers of the
//! config's kinds ([`super::layers`]), the final RMS norm and the LM head; one forward for
//! prefill, decode and training, parameterised by an attention backend. The model owns no cache.
//!
//! Trains through differentiable ops ([`super::ops`]); candle's fused kernels, which record no
//! backward pass, run only once [`Transformer::set_fused_inference`] is on. For sampling on the
//! CPU the weights are then packed and each layer runs on host slices (the host path); the model
//! is inference-only from then on. Knows nothing of scheduling or config files.

use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::{Embedding, Linear, VarBuilder};

use super::attention::AttentionBackend;
use super::config::{LayerKind, ModelConfig};
use super::cost::CountMode;
use super::layer_ops::candle_ops::CandleOps;
use super::layer_ops::host_ops::{HostAct, HostOps};
use super::layer_ops::{Cost, Counting, Counts, LayerOps, Place, SameOps};
use super::layers::{Layer, OpenAdd};
use super::ops::{Exec, RmsNorm, Ropes, StepRope};
use super::packed::{dropped, PackedLinear};

/// Where a counted forward adds its counts, and whether it counts a GPU's step on a machine
/// without one (see [`CountMode::AsCuda`]).
pub struct CountInto<'a> {
    pub counts: &'a mut Counts,
    pub as_cuda: bool,
}

/// A decoder of any family we read.
pub struct Transformer {
    cfg: ModelConfig,
    embed: Embedding,
    layers: Vec<Layer<CandleOps>>,
    /// For sampling on the CPU: every layer packed for the host path (then `layers` hold no
    /// weights).
    host_layers: Option<Vec<Layer<HostOps>>>,
    norm: RmsNorm,
    lm_head: Linear,
    rope: Ropes,
    /// Gemma: embeddings times `sqrt(hidden)` (rounded to the loaded dtype), else 1.
    embed_scale: f64,
    /// Fused RMS norm and RoPE kernels (no backward pass) for sampling; never for training.
    exec: Exec,
    /// For sampling on the CPU: the LM head packed; when tied, embeddings are looked up in it.
    packed_head: Option<PackedLinear>,
}

impl Transformer {
    /// Builds the model from a var builder rooted at the checkpoint's top level.
    pub fn new(cfg: &ModelConfig, vb: VarBuilder) -> Result<Self> {
        let m = vb.pp(&cfg.weights_prefix);
        let embed = candle_nn::embedding(cfg.vocab_size, cfg.hidden_size, m.pp("embed_tokens"))?;
        let layers = (0..cfg.num_layers())
            .map(|i| Layer::new(cfg, i, m.pp("layers").pp(i)))
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
            host_layers: None,
            norm: RmsNorm::new(
                cfg.hidden_size,
                cfg.rms_norm_eps,
                cfg.norm_offset,
                m.pp("norm"),
            )?,
            lm_head,
            rope: Ropes::new(cfg, vb.device(), vb.dtype())?,
            embed_scale: embed_scale(cfg, vb.dtype()),
            exec: Exec::Differentiable,
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
        if !on {
            self.exec = Exec::Differentiable;
            return Ok(());
        }
        self.exec = Exec::Sampling;
        let pack = self.device().is_cpu() && self.dtype() == DType::F32;
        if pack && self.host_layers.is_none() {
            let host = self.layers.iter_mut().map(Layer::pack);
            self.host_layers = Some(host.collect::<Result<_>>()?);
        } else if !pack {
            for l in &mut self.layers {
                l.stack_projections()?;
            }
            self.norm.freeze_scale()?;
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

    /// Sampling through candle's fused kernels and stacked projections on any device, the CPU
    /// in f32 too (no packing): the path a GPU runs, so that its operations are counted on a
    /// CPU (`pipeline bench sample --count`). Inference only from then on.
    pub fn set_candle_sampling(&mut self) -> Result<()> {
        if self.host_layers.is_some() {
            candle_core::bail!("the model's weights are packed for the CPU host path")
        }
        self.exec = Exec::Sampling;
        for l in &mut self.layers {
            l.stack_projections()?;
        }
        self.norm.freeze_scale()
    }

    /// Trains through elementary candle ops on every device ([`Exec::Composed`]), the CPU too:
    /// the device-generic path a GPU runs, which the CPU tests check against PyTorch. Off, f32 on
    /// the CPU uses our ops with hand-written backward passes.
    pub fn set_composed(&mut self, on: bool) -> Result<()> {
        if self.exec == Exec::Sampling {
            candle_core::bail!("the model is set up for sampling; load it again to train")
        }
        self.exec = if on {
            Exec::Composed
        } else {
            Exec::Differentiable
        };
        Ok(())
    }

    /// Whether the model computes through [`Exec::Composed`].
    pub fn composed(&self) -> bool {
        self.exec == Exec::Composed
    }

    /// Final hidden states (T, hidden) for `tokens` (T,) u32 at `positions` (T,) u32.
    pub fn forward_hidden(
        &self,
        tokens: &Tensor,
        positions: &Tensor,
        attn: &mut dyn AttentionBackend,
    ) -> Result<Tensor> {
        self.forward_hidden_counted(tokens, positions, attn, None)
    }

    /// [`Self::forward_hidden`], with what each op, each layer and the work outside the layers
    /// issued added to the counts when given.
    pub fn forward_hidden_counted(
        &self,
        tokens: &Tensor,
        positions: &Tensor,
        attn: &mut dyn AttentionBackend,
        mut count: Option<CountInto<'_>>,
    ) -> Result<Tensor> {
        let (mut rope_cost, mut embed_cost) = (Cost::default(), Cost::default());
        let rope = StepRope::new(&self.rope, positions, self.exec, &mut rope_cost)?;
        if let Some(c) = count.as_mut() {
            c.counts.add(Place::Outside, "rope_rows", rope_cost);
        }
        let x = self.embed_counted(tokens, &mut embed_cost)?; // (T, hidden)
        let mode = match &count {
            None => CountMode::Off,
            Some(c) if c.counts.timing => CountMode::Off,
            Some(c) if c.as_cuda => CountMode::AsCuda,
            Some(_) => CountMode::On,
        };
        let mut counts = count.as_mut().map(|c| &mut *c.counts);
        if let Some(c) = counts.as_deref_mut() {
            c.add(Place::Outside, "embedding", embed_cost);
        }
        let x = match &self.host_layers {
            // packed for the CPU: the residual stream stays one host buffer through the layers
            Some(layers) => {
                let x = HostAct::from_tensor(&x)?;
                self.run_layers(layers, HostOps::new(), x, &rope, attn, counts)?
                    .into_tensor()?
            }
            None => {
                let mut ops = CandleOps::new(self.exec);
                ops.count = mode;
                self.run_layers(&self.layers, ops, x, &rope, attn, counts)?
            }
        };
        let mut norm_cost = Cost::default();
        let h = self.norm.forward_counted(&x, self.exec, &mut norm_cost)?;
        if let Some(c) = count {
            c.counts.add(Place::Outside, "final_norm", norm_cost);
        }
        Ok(h)
    }

    /// Every layer on the residual stream `x` through the ops `o`, counted into `counts` when
    /// given.
    fn run_layers<O: LayerOps>(
        &self,
        layers: &[Layer<O>],
        mut o: O,
        x: O::Act,
        rope: &StepRope,
        attn: &mut dyn AttentionBackend,
        counts: Option<&mut Counts>,
    ) -> Result<O::Act> {
        let kinds = &self.cfg.layer_kinds;
        // sampling (no gradient, nothing kept per layer) fuses each layer's last residual add
        // with the next layer's input norm; the differentiable paths keep each layer whole
        // (training's recompute starts a layer from its input)
        let fold = self.exec == Exec::Sampling;
        let layers = (layers, kinds.as_slice(), rope);
        match counts {
            None => each_layer(layers, &mut o, x, fold, attn, |_, _| ()),
            Some(c) => {
                let mut o = Counting::new(o, c);
                each_layer(layers, &mut o, x, fold, attn, |o, place| o.at(place))
            }
        }
    }

    /// The RoPE rows of this step's positions (T,) u32, shared by every layer.
    pub fn rope_rows(&self, positions: &Tensor) -> Result<StepRope> {
        self.rope_rows_counted(positions, &mut Cost::default())
    }

    /// [`Self::rope_rows`], what it issued added to `spent`.
    pub fn rope_rows_counted(&self, positions: &Tensor, spent: &mut Cost) -> Result<StepRope> {
        StepRope::new(&self.rope, positions, self.exec, spent)
    }

    /// Token embeddings (T, hidden), scaled for Gemma.
    pub fn embed(&self, tokens: &Tensor) -> Result<Tensor> {
        self.embed_counted(tokens, &mut Cost::default())
    }

    /// [`Self::embed`], the candle operations it issues added to `spent` (a lookup in the
    /// packed head is host work: none).
    pub fn embed_counted(&self, tokens: &Tensor, spent: &mut Cost) -> Result<Tensor> {
        let packed = self.packed_head.is_some() && self.cfg.tie_word_embeddings;
        *spent += Cost::kernels(u64::from(!packed) + u64::from(self.embed_scale != 1.0));
        let x = self.embed_unscaled(tokens)?;
        if self.embed_scale == 1.0 {
            return Ok(x);
        }
        x.affine(self.embed_scale, 0.0)
    }

    fn embed_unscaled(&self, tokens: &Tensor) -> Result<Tensor> {
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
            _ if tokens.rank() == 1 => {
                super::ops::pick_rows(self.embed.embeddings(), tokens, self.exec)
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
        rope: &StepRope,
        attn: &mut dyn AttentionBackend,
    ) -> Result<Tensor> {
        self.layer_forward_counted(i, x, rope, attn, None)
    }

    /// [`Self::layer_forward`], with what each op issued added to `counts` (at the layer's
    /// place) when given.
    pub fn layer_forward_counted(
        &self,
        i: usize,
        x: &Tensor,
        rope: &StepRope,
        attn: &mut dyn AttentionBackend,
        counts: Option<&mut Counts>,
    ) -> Result<Tensor> {
        let kind = self.cfg.layer_kinds[i];
        let rows = rope.of(kind);
        if let Some(layers) = &self.host_layers {
            let x = HostAct::from_tensor(x)?;
            let y = match counts {
                None => layers[i].forward(&mut HostOps::new(), i, x, rows, attn)?,
                Some(c) => {
                    let mut o = Counting::new(HostOps::new(), c);
                    o.at(Place::Layer(i, kind));
                    layers[i].forward(&mut o, i, x, rows, attn)?
                }
            };
            return y.into_tensor();
        }
        let mut o = CandleOps::new(self.exec);
        match counts {
            None => self.layers[i].forward(&mut o, i, x.clone(), rows, attn),
            Some(c) => {
                if !c.timing {
                    o.count = CountMode::On;
                }
                let mut o = Counting::new(o, c);
                o.at(Place::Layer(i, kind));
                self.layers[i].forward(&mut o, i, x.clone(), rows, attn)
            }
        }
    }

    /// The final RMS norm.
    pub fn final_norm(&self, x: &Tensor) -> Result<Tensor> {
        self.final_norm_counted(x, &mut Cost::default())
    }

    /// [`Self::final_norm`], what it issued added to `spent`.
    pub fn final_norm_counted(&self, x: &Tensor, spent: &mut Cost) -> Result<Tensor> {
        self.norm.forward_counted(x, self.exec, spent)
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

/// Every layer on the residual stream `x` through `o`, `at` told each layer's place first;
/// with `fold`, each layer's edges' residual adds fused with the norms beside them
/// ([`Layer::forward_open`]), the step's last add done after the last layer.
fn each_layer<O: LayerOps, P: SameOps<O>>(
    (layers, kinds, rope): (&[Layer<O>], &[LayerKind], &StepRope),
    o: &mut P,
    mut x: O::Act,
    fold: bool,
    attn: &mut dyn AttentionBackend,
    mut at: impl FnMut(&mut P, Place),
) -> Result<O::Act> {
    let mut open: Option<OpenAdd<'_, O>> = None;
    for (i, l) in layers.iter().enumerate() {
        at(o, Place::Layer(i, kinds[i]));
        let rope = rope.of(kinds[i]);
        if fold {
            let (y, last) = l.forward_open(o, i, (x, open.take()), rope, attn)?;
            (x, open) = (y, Some(last));
        } else {
            x = l.forward(o, i, x, rope, attn)?;
        }
    }
    match open {
        Some(last) => o.add(x, last.y, last.norm),
        None => Ok(x),
    }
}

/// Gemma's embedding scale: `sqrt(hidden)` rounded to the dtype the weights are loaded in, as
/// transformers multiplies by it (`embed_scale.to(weight.dtype)`); 1 for other families.
fn embed_scale(cfg: &ModelConfig, dtype: DType) -> f64 {
    if !cfg.embed_scale {
        return 1.0;
    }
    let s = (cfg.hidden_size as f64).sqrt();
    match dtype {
        DType::BF16 => f64::from(half::bf16::from_f64(s).to_f32()),
        DType::F16 => f64::from(half::f16::from_f64(s).to_f32()),
        _ => f64::from(s as f32),
    }
}

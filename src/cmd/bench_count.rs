//! `pipeline bench sample --count`: what one sampling step of a benchmark shape issues, by layer
//! kind and outside the layers: kernel launches, device allocations, copies each way and waits
//! for the device. For `--device cuda` the step as a GPU runs it in this build, counted on any
//! machine (no GPU needed): the model's layers through their candle ops (the path a GPU runs),
//! with the GPU's own kernels where it has them (the Gated DeltaNet decode step), and the paged
//! attention and the step's work outside the layers as `sampler::gpu_plan` declares them. For
//! `--device cpu` the CPU host path, which launches nothing and allocates only while its buffers
//! grow.
//!
//! Counts do not depend on the widths, so the shape runs narrowed (its layers, heads and every
//! flag kept; hidden, MLP, head and vocabulary sizes small): a 4B shape counts in a second. The
//! values computed are meaningless (attention returns zeros): counts only.
//!
//! `pipeline bench train --count`: the same for a training micro-batch and an optimizer step
//! ([`run_train`]).
//!
//! Knows nothing of scheduling or timing.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use serde_json::json;

use crate::device::DeviceSpec;
use crate::model::attention::{seq_starts, AttentionBackend, PoolStep, RecurrentStep};
use crate::model::config::{LayerKind, ModelConfig};
use crate::model::cost::KEEP_BACKWARD_GRAPH;
use crate::model::init::random_model;
use crate::model::layer_ops::{Cost, Counts, Place};
use crate::model::ops::READ_BACK;
use crate::model::transformer::CountInto;
use crate::sampler::gpu_plan::{partitions, StepCosts};
use crate::train::adamw::{fused_norm_cost, norm_cost, AdamW, AdamWConfig};
use crate::train::grads::{GradOptions, GradSums};
use crate::train::loss::PackedBatch;
use crate::train::settings::{ComputeDtype, TrainOps, TrainSettings};
use crate::train::Trainable;

/// The SMs of the GPU a count plans its attention split for (an H100 SXM).
const COUNT_SMS: usize = 132;

/// The KV cache's block size in the sampler's benchmarks.
const BLOCK_SIZE: usize = 16;

/// `cfg` with its structure kept and its widths small.
fn narrowed(cfg: &ModelConfig) -> ModelConfig {
    let mut c = cfg.clone();
    // a head_dim the GPU's fused q/k/v kernel takes (a multiple of 32) stays one it takes
    let d = if cfg.head_dim.is_multiple_of(32) && cfg.head_dim <= 512 {
        32
    } else {
        16
    };
    c.rotary_dim = (d * cfg.rotary_dim / cfg.head_dim.max(1)).max(2) & !1;
    c.head_dim = d;
    c.hidden_size = 64;
    c.intermediate_size = 64;
    c.vocab_size = 256;
    if let Some(l) = &mut c.linear {
        l.key_head_dim = 16;
        l.value_head_dim = 16;
    }
    c
}

/// The attention backend of a counted step: zeros for attention, zero states for recurrent
/// layers, and (counting a GPU) the paged attention's and the state slots' declared costs.
struct CountBackend {
    seq_lens: Vec<usize>,
    cuda: bool,
    split: bool,
    spent: Cost,
}

impl AttentionBackend for CountBackend {
    fn attend(
        &mut self,
        _layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _window: Option<usize>,
    ) -> candle_core::Result<Tensor> {
        if self.cuda {
            let strided = [q, k, v].iter().filter(|x| !x.is_contiguous()).count() as u64;
            self.spent += StepCosts::paged_attend(strided, self.split);
        }
        q.zeros_like()
    }

    fn recurrent_state(
        &mut self,
        _layer: usize,
        values: usize,
    ) -> candle_core::Result<RecurrentStep> {
        if self.cuda {
            self.spent += StepCosts::STATE_GATHER;
        }
        let n = self.seq_lens.len();
        Ok(RecurrentStep {
            seq_lens: self.seq_lens.clone(),
            state: Some(Tensor::zeros((n, values), DType::F32, &Device::Cpu)?),
        })
    }

    /// Counting a GPU: the pool of state slots the GPU's backend hands the kernels (zeros).
    fn recurrent_pool(
        &mut self,
        _layer: usize,
        values: usize,
    ) -> candle_core::Result<Option<PoolStep>> {
        if !self.cuda {
            return Ok(None);
        }
        // the slot ids and sequence starts are in the step's upload
        let starts = seq_starts(&self.seq_lens);
        let n = self.seq_lens.len();
        let dev = Device::Cpu;
        Ok(Some(PoolStep {
            seq_lens: self.seq_lens.clone(),
            pool: Tensor::zeros((n, values), DType::F32, &dev)?,
            ids: Tensor::arange(0u32, n as u32, &dev)?,
            starts: starts
                .map(|s| Tensor::new(s.as_slice(), &dev))
                .transpose()?,
        }))
    }

    fn store_recurrent_state(&mut self, _layer: usize, _state: Tensor) -> candle_core::Result<()> {
        if self.cuda {
            self.spent += StepCosts::STATE_SCATTER;
        }
        Ok(())
    }

    fn take_cost(&mut self) -> Cost {
        std::mem::take(&mut self.spent)
    }
}

/// One counted phase: its name, batch, tokens and counts.
struct Phase {
    name: &'static str,
    batch: usize,
    tokens: usize,
    counts: Counts,
}

/// Counts one step of `batch` sequences bringing `new` tokens each after `context` tokens.
fn count_step(
    model: &crate::model::Transformer,
    cfg: &ModelConfig,
    cuda: bool,
    (batch, new, context): (usize, usize, usize),
) -> Result<Counts> {
    let tokens: Vec<u32> = (0..batch * new).map(|i| (i % 200) as u32 + 1).collect();
    let positions: Vec<u32> = (0..batch)
        .flat_map(|_| (context..context + new).map(|p| p as u32))
        .collect();
    let t = tokens.len();
    let max_len = context + new;
    let (_, parts) = partitions(t, cfg.num_kv_heads, max_len, BLOCK_SIZE, COUNT_SMS);
    let mut backend = CountBackend {
        seq_lens: vec![new; batch],
        cuda,
        split: parts > 1,
        spent: Cost::default(),
    };
    let mut counts = Counts::default();
    let tokens = Tensor::new(tokens.as_slice(), &Device::Cpu)?;
    let positions = Tensor::new(positions.as_slice(), &Device::Cpu)?;
    model.forward_hidden_counted(
        &tokens,
        &positions,
        &mut backend,
        Some(CountInto {
            counts: &mut counts,
            as_cuda: cuda,
        }),
    )?;
    if cuda {
        let outside = [
            ("step_upload", StepCosts::STEP_UPLOAD),
            ("logits", StepCosts::LOGITS),
            ("candidates", StepCosts::CANDIDATES),
        ];
        for (what, c) in outside {
            counts.add(Place::Outside, what, c);
        }
    }
    Ok(counts)
}

/// A cost's fields as JSON.
fn cost_json(c: Cost) -> serde_json::Value {
    json!({
        "launches": c.launches,
        "allocations": c.allocations,
        "host_to_device": c.host_to_device,
        "device_to_host": c.device_to_host,
        "syncs": c.syncs,
    })
}

/// A layer kind's name in the tables.
fn kind_name(k: LayerKind) -> &'static str {
    match k {
        LayerKind::Attention => "attention",
        LayerKind::SlidingAttention => "sliding_attention",
        LayerKind::GatedDeltaNet => "gated_deltanet",
    }
}

/// Prints the counts of a decode step at each of `batches` and of a prefill of `prompt_len`
/// tokens per sequence at the first, for `shape` on `device` (`cpu`, `cuda`, `cuda:N`).
pub fn run(
    shape: &str,
    cfg: &ModelConfig,
    device: DeviceSpec,
    batches: &[usize],
    prompt_len: usize,
    json_out: bool,
) -> Result<()> {
    let cuda = device.is_cuda();
    let small = narrowed(cfg);
    let mut model = random_model(&small)?;
    if cuda {
        model.set_candle_sampling()?;
    } else {
        model.set_fused_inference(true)?;
    }
    let mut phases = Vec::new();
    for &b in batches {
        if !cuda {
            // the host path's buffers grow on a first step of each size; count a warm one
            count_step(&model, &small, cuda, (b, 1, prompt_len))?;
        }
        let counts = count_step(&model, &small, cuda, (b, 1, prompt_len))?;
        phases.push(Phase {
            name: "decode",
            batch: b,
            tokens: b,
            counts,
        });
        if cuda {
            // the same step replayed from its CUDA graph (`sampler/gpu/graphs.rs`): the layers
            // and the LM head inside one launch, the upload before it, the candidates after
            let mut counts = Counts::default();
            for (what, c) in [
                ("step_upload", StepCosts::STEP_UPLOAD),
                ("graph_replay", StepCosts::GRAPH_REPLAY),
                ("candidates", StepCosts::CANDIDATES),
            ] {
                counts.add(Place::Outside, what, c);
            }
            phases.push(Phase {
                name: "decode graph",
                batch: b,
                tokens: b,
                counts,
            });
        }
    }
    let b = batches.first().copied().unwrap_or(1);
    let counts = count_step(&model, &small, cuda, (b, prompt_len, 0))?;
    phases.push(Phase {
        name: "prefill",
        batch: b,
        tokens: b * prompt_len,
        counts,
    });
    let header = format!(
        "what one step of {shape} issues on {device} in this build ({} layers; counted at narrow \
         widths, which counts do not depend on{}): the layers of each kind together, outside the \
         layers, and the whole step",
        cfg.num_layers(),
        if cuda {
            format!(
                "; the layers' candle ops as a GPU runs them, the paged attention and the \
                 step's uploads, logits and candidates as sampler/gpu_plan.rs declares them, \
                 contexts split for {COUNT_SMS} SMs"
            )
        } else {
            "; the CPU host path, a warm step".to_string()
        }
    );
    report(shape, device, &phases, json_out, &header);
    Ok(())
}

/// The phases' counts: one JSON object each (`json_out`), or `header` and a table of each layer
/// kind, outside the layers and the whole phase.
fn report(shape: &str, device: DeviceSpec, phases: &[Phase], json_out: bool, header: &str) {
    if json_out {
        for p in phases {
            let (kinds, _) = p.counts.by_kind();
            let layers: Vec<_> = kinds
                .iter()
                .map(|&(k, n, c)| {
                    let mut v = cost_json(c);
                    v["kind"] = json!(kind_name(k));
                    v["layers"] = json!(n);
                    v
                })
                .collect();
            let line = json!({
                "shape": shape,
                "device": device.to_string(),
                "batch": p.batch,
                "phase": p.name,
                "tokens": p.tokens,
                "step": cost_json(p.counts.total()),
                "layers": layers,
            });
            crate::outln!("{line}");
        }
        return;
    }
    crate::outln!("{header}");
    crate::outln!(
        "{:<14} {:>6} {:>7}  {:<42} {:>9} {:>11} {:>5} {:>5} {:>6}",
        "phase",
        "batch",
        "tokens",
        "where",
        "launches",
        "allocations",
        "h2d",
        "d2h",
        "syncs"
    );
    let row = |p: &Phase, place: String, c: Cost| {
        crate::outln!(
            "{:<14} {:>6} {:>7}  {:<42} {:>9} {:>11} {:>5} {:>5} {:>6}",
            p.name,
            p.batch,
            p.tokens,
            place,
            c.launches,
            c.allocations,
            c.host_to_device,
            c.device_to_host,
            c.syncs
        );
    };
    for p in phases {
        let (kinds, outside) = p.counts.by_kind();
        for (k, n, c) in kinds {
            row(p, format!("{} ({n} layers)", kind_name(k)), c);
        }
        row(p, "outside the layers".into(), outside);
        row(p, "whole".into(), p.counts.total());
    }
    // where each kind's first layer and the work outside the layers spend it, op by op
    for p in phases {
        for (k, i) in p.counts.first_of_each_kind() {
            for (op, calls, c) in p.counts.layer(i) {
                row(p, format!("  {} {i}: {op} x{calls}", kind_name(k)), c);
            }
        }
        for (what, calls, c) in p.counts.outside() {
            row(p, format!("  outside: {what} x{calls}"), c);
        }
    }
}

/// What `bench train --count` counts: its flags.
pub struct TrainCount<'a> {
    pub shape: &'a str,
    pub device: DeviceSpec,
    pub ops: TrainOps,
    pub compute_dtype: ComputeDtype,
    pub rows: usize,
    pub seq_len: usize,
    pub loss_chunk_tokens: usize,
    pub json: bool,
}

/// `pipeline bench train --count`: what one micro-batch (forward and backward with activation
/// recompute, the gradients summed) and one optimizer step (the gradients' norm, the update)
/// issue, by layer kind. `--device cuda` counts the GPU's path on this machine: the
/// device-generic ops in f16, which converts to and from f32 where a GPU's bf16 does (the CPU
/// has no bf16 product). Counted at narrow widths and fewer heads (the query heads per KV head
/// and the Gated DeltaNet's value heads per key head kept, and more than one of each). The layers' forward ops are counted as they declare them,
/// candle's backward passes by walking the graph they keep
/// ([`crate::model::cost::backward_counted`]: it needs
/// [`KEEP_BACKWARD_GRAPH`] set before the counting thread's first backward pass, which this
/// sets), the block attention, the head and loss and the optimizer as their code declares.
pub fn run_train(a: &TrainCount, cfg: &ModelConfig) -> Result<()> {
    let cuda = a.device.is_cuda();
    if !cuda && a.ops != TrainOps::Generic {
        anyhow::bail!(
            "--count --device cpu counts the device-generic ops (add --ops generic): the CPU's \
             own training ops are host passes with hand-written backward passes, not kernels"
        );
    }
    if a.rows == 0 || a.seq_len < 2 {
        anyhow::bail!("--rows must be at least 1 and --seq-len at least 2");
    }
    // Set before any thread of this process runs a backward pass: candle reads it once per
    // thread, and the counting runs on a thread of its own, started after this.
    std::env::set_var(KEEP_BACKWARD_GRAPH, "1");
    let phases = std::thread::scope(|s| {
        s.spawn(|| count_train(a, cfg, cuda))
            .join()
            .map_err(|_| anyhow::anyhow!("the counting thread panicked"))
    })??;
    let header = format!(
        "what one training micro-batch ({} rows x {} tokens, forward and backward with \
         recompute, loss chunks of {} tokens) and one AdamW step of {} issue on {} in this build \
         ({} layers; counted at narrow widths and fewer heads, which counts do not depend on, \
         the optimizer's at the real sizes{})",
        a.rows,
        a.seq_len,
        a.loss_chunk_tokens,
        a.shape,
        a.device,
        cfg.num_layers(),
        if cuda {
            "; the device-generic candle ops a GPU runs, in 16 bits"
        } else {
            "; the device-generic candle ops"
        }
    );
    report(a.shape, a.device, &phases, a.json, &header);
    Ok(())
}

/// The layer a parameter belongs to, from its checkpoint name (`...layers.N....`).
fn layer_of(name: &str) -> Option<usize> {
    let rest = &name[name.find("layers.")? + "layers.".len()..];
    rest.split('.').next()?.parse().ok()
}

/// The counts of one micro-batch and one optimizer step.
fn count_train(a: &TrainCount, cfg: &ModelConfig, cuda: bool) -> Result<Vec<Phase>> {
    let mut small = narrowed(cfg);
    // a transpose of one head is a view, of more a copy: keep two KV heads at least
    let n_rep = (cfg.num_heads / cfg.num_kv_heads.max(1)).max(1);
    small.num_kv_heads = cfg.num_kv_heads.min(2);
    small.num_heads = small.num_kv_heads * n_rep;
    if let Some(l) = &mut small.linear {
        let per_key = (l.num_value_heads / l.num_key_heads.max(1)).max(1);
        l.num_key_heads = l.num_key_heads.min(2);
        l.num_value_heads = l.num_key_heads * per_key;
    }
    let dtype = if cuda {
        DType::F16
    } else {
        let s = TrainSettings {
            device: a.device,
            compute_dtype: a.compute_dtype,
            ..TrainSettings::default()
        };
        s.compute()
    };
    let weights = crate::model::init::random_weights(&small)?;
    let mut t = Trainable::from_tensors(&small, &weights, &Device::Cpu, dtype)?;
    drop(weights);
    t.model.set_composed(true)?;
    let batch = PackedBatch::synthetic(a.rows, a.seq_len, small.vocab_size);
    let g = GradOptions {
        loss_chunk_tokens: a.loss_chunk_tokens,
        recompute: true,
        kept_layers: 0,
    };
    let mut counts = Counts::default();
    let mut sums = GradSums::new(t.named_vars().len());
    let scale = 1.0 / batch.loss_tokens().max(1) as f64;
    t.accumulate_counted(&batch, scale, g, &mut sums, Some(&mut counts))?;
    let micro = Phase {
        name: "micro_batch",
        batch: a.rows,
        tokens: batch.tokens.len(),
        counts,
    };
    // the optimizer step at the model's real sizes (its slices and sums follow the element
    // counts), each parameter's work at its layer: what this optimizer, set up as the trainer
    // sets it up on a GPU, declares
    let mut opt = AdamW::new(t.masters().to_vec(), AdamWConfig::default(), |_| true)?;
    opt.set_working(t.named_vars())?;
    opt.set_host(false);
    let real: std::collections::HashMap<String, usize> = crate::model::init::weight_shapes(cfg)
        .into_iter()
        .map(|(name, shape, _)| (name, shape.iter().product()))
        .collect();
    // a GPU runs each gradient's share of the norm and each parameter's update as one kernel,
    // but for the device-generic ops (this count's optimizer keeps f32 state on the device, the
    // trainer's default; bf16 state or offloaded moments would take candle's slices)
    let fused = cuda && a.ops != TrainOps::Generic;
    let mut counts = Counts::default();
    let kinds = &small.layer_kinds;
    for (i, (name, _)) in t.masters().iter().enumerate() {
        let numel = *real
            .get(name)
            .ok_or_else(|| anyhow::anyhow!("{name}: not a weight of {}", a.shape))?;
        let place = layer_of(name).map_or(Place::Outside, |l| Place::Layer(l, kinds[l]));
        let norm = if fused {
            fused_norm_cost()
        } else {
            norm_cost(numel, DType::F32)
        };
        counts.add(place, "grad_norm", norm);
        let update = if fused {
            AdamW::fused_update_cost()
        } else {
            opt.update_cost(i, numel, DType::F32, true)
        };
        counts.add(place, "update", update);
    }
    // the norm's sums and the update's statistics, each read back once
    counts.add(Place::Outside, "grad_norm", READ_BACK);
    counts.add(Place::Outside, "update", READ_BACK);
    let step = Phase {
        name: "optimizer_step",
        batch: a.rows,
        tokens: batch.tokens.len(),
        counts,
    };
    Ok(vec![micro, step])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Qwen3.5-4B decode step on a GPU: the Gated DeltaNet layers take the decode kernels
    /// (a few launches per layer, not a pass per sequence), and a step waits for the device only
    /// for its candidates.
    /// An optimizer's parameter is counted at its layer, whatever the family's prefix.
    #[test]
    fn parameters_belong_to_their_layer() {
        assert_eq!(layer_of("model.layers.12.mlp.up_proj.weight"), Some(12));
        assert_eq!(
            layer_of("model.language_model.layers.3.linear_attn.A_log"),
            Some(3)
        );
        assert_eq!(layer_of("model.embed_tokens.weight"), None);
        assert_eq!(layer_of("model.norm.weight"), None);
    }

    /// A GPU's optimizer step waits for the device twice, whatever the model's size: once for
    /// the gradients' norm (the trainer checks it before the update), once for the update's
    /// statistics; each was a wait per 16M-element slice (2,128 a Qwen3-4B step on an H100,
    /// with the head's). A micro-batch waits once, for its loss (was once per loss chunk).
    #[test]
    fn training_waits_for_the_device_once_a_micro_batch_and_twice_a_step() {
        let cfg = crate::model::init::shape("qwen3-0.6b").unwrap();
        let c = TrainCount {
            shape: "qwen3-0.6b",
            device: DeviceSpec::Cpu,
            ops: TrainOps::Generic,
            compute_dtype: ComputeDtype::Auto,
            rows: 1,
            seq_len: 64,
            loss_chunk_tokens: 16,
            json: false,
        };
        let phases = count_train(&c, &cfg, true).unwrap();
        let micro = phases.iter().find(|p| p.name == "micro_batch").unwrap();
        let total = micro.counts.total();
        assert_eq!((total.syncs, total.device_to_host), (1, 1), "{total:?}");
        let step = phases.iter().find(|p| p.name == "optimizer_step").unwrap();
        let total = step.counts.total();
        assert_eq!((total.syncs, total.device_to_host), (2, 2), "{total:?}");
        assert!(
            total.launches > 1_000,
            "the slices' kernels are still counted: {total:?}"
        );
    }

    /// Counting a training step on the CPU's own ops is refused, not miscounted.
    #[test]
    fn training_counts_refuse_the_host_ops() {
        let cfg = crate::model::init::shape("tiny").unwrap();
        let c = TrainCount {
            shape: "tiny",
            device: DeviceSpec::Cpu,
            ops: TrainOps::Auto,
            compute_dtype: ComputeDtype::Auto,
            rows: 1,
            seq_len: 8,
            loss_chunk_tokens: 0,
            json: false,
        };
        let e = run_train(&c, &cfg).unwrap_err().to_string();
        assert!(e.contains("--ops generic"), "{e}");
    }

    #[test]
    fn a_qwen35_step_counts_as_a_gpu_runs_it() {
        let cfg = crate::model::init::shape("qwen3.5-4b").unwrap();
        let small = narrowed(&cfg);
        let mut model = random_model(&small).unwrap();
        model.set_candle_sampling().unwrap();
        let one = count_step(&model, &small, true, (1, 1, 64)).unwrap();
        let many = count_step(&model, &small, true, (64, 1, 64)).unwrap();
        let prompt = count_step(&model, &small, true, (1, 64, 0)).unwrap();
        let prompts = count_step(&model, &small, true, (8, 64, 0)).unwrap();
        // the mixer of a GDN layer, its five ops: the stacked input projection, the states in
        // the pool (nothing copied, nothing kept after), the two kernels (the out projection
        // is a `linear`); the same at any batch, decode or prompt
        let gdn: Vec<usize> = (0..small.num_layers())
            .filter(|&i| small.layer_kinds[i] == LayerKind::GatedDeltaNet)
            .collect();
        let (first, layer) = (gdn[0], gdn[1]);
        let mixer = |c: &Counts| {
            let gdn = [
                "deltanet_in",
                "deltanet_state",
                "conv_update",
                "delta_rule",
                "store_deltanet_state",
            ];
            let ops = c.layer(layer).into_iter();
            ops.filter(|o| gdn.contains(&o.0))
                .fold(Cost::default(), |a, o| a + o.2)
        };
        let want = Cost {
            launches: 3,
            allocations: 3,
            ..Cost::default()
        };
        for c in [&one, &many, &prompt, &prompts] {
            assert_eq!(mixer(c), want, "a GDN mixer");
        }
        // the slot ids and a prompt's sequence starts are in the step's one upload: no layer
        // uploads; the step uploads once, downloads once and waits once
        let uploads = |c: &Counts, i: usize| c.layer(i).iter().map(|o| o.2.host_to_device).sum();
        let up: [u64; 4] = [
            uploads(&one, first),
            uploads(&one, layer),
            uploads(&prompt, first),
            uploads(&prompt, layer),
        ];
        assert_eq!(up, [0, 0, 0, 0]);
        for c in [&one, &many, &prompt, &prompts] {
            let t = c.total();
            assert_eq!(
                (t.host_to_device, t.device_to_host, t.syncs),
                (1, 1, StepCosts::CANDIDATES.syncs)
            );
        }
    }

    /// Today's counts of a GPU's step of the two 4B shapes (`docs/layer-ops.md`), pinned as
    /// upper bounds that the GPU work lowers: per layer kind (launches, allocations, uploads)
    /// and the whole step (launches, allocations, uploads, downloads, syncs).
    #[test]
    fn a_gpu_step_keeps_within_its_budget() {
        type Kind = (LayerKind, u64, u64, u64);
        type Step = (u64, u64, u64, u64, u64);
        /// A shape, its step (batch, new tokens each, context), its kinds' and step's budgets.
        type Case<'a> = (&'a str, (usize, usize, usize), &'a [Kind], Step);
        let attn = LayerKind::Attention;
        let gdn = LayerKind::GatedDeltaNet;
        // A layer's last residual add is fused with the next layer's input norm: the step's
        // last add stays with the last layer (Qwen3.5's is an attention layer: its kind's
        // buffers 128 -> 129, the Gated DeltaNet layers' 264 -> 263).
        let cases: [Case<'_>; 6] = [
            (
                "qwen3-4b",
                (1, 1, 64),
                &[(attn, 361, 468, 0)],
                (368, 474, 1, 1, 1),
            ),
            (
                "qwen3-4b",
                (256, 1, 64),
                &[(attn, 361, 468, 0)],
                (368, 474, 1, 1, 1),
            ),
            (
                "qwen3-4b",
                (1, 64, 0),
                &[(attn, 361, 468, 0)],
                (368, 474, 1, 1, 1),
            ),
            (
                "qwen3.5-4b",
                (1, 1, 64),
                &[(attn, 97, 129, 0), (gdn, 216, 263, 0)],
                (320, 398, 1, 1, 1),
            ),
            (
                "qwen3.5-4b",
                (256, 1, 64),
                &[(attn, 97, 129, 0), (gdn, 216, 263, 0)],
                (320, 398, 1, 1, 1),
            ),
            // a prompt runs the Gated DeltaNet kernels too, its sequence starts in the upload
            (
                "qwen3.5-4b",
                (1, 64, 0),
                &[(attn, 97, 129, 0), (gdn, 216, 263, 0)],
                (320, 398, 1, 1, 1),
            ),
        ];
        for (name, step, kinds, total) in cases {
            let cfg = narrowed(&crate::model::init::shape(name).unwrap());
            let mut model = random_model(&cfg).unwrap();
            model.set_candle_sampling().unwrap();
            let counts = count_step(&model, &cfg, true, step).unwrap();
            let (got, _) = counts.by_kind();
            for &(kind, launches, allocations, uploads) in kinds {
                let c = got.iter().find(|g| g.0 == kind).unwrap().2;
                assert!(
                    c.launches <= launches
                        && c.allocations <= allocations
                        && c.host_to_device <= uploads,
                    "{name} {step:?}: the {kind:?} layers cost {c:?}, over their budget of \
                     {launches} launches, {allocations} allocations, {uploads} uploads"
                );
                assert_eq!(
                    (c.device_to_host, c.syncs),
                    (0, 0),
                    "{name} {step:?} {kind:?}"
                );
            }
            let t = counts.total();
            let (launches, allocations, h2d, d2h, syncs) = total;
            assert!(
                t.launches <= launches
                    && t.allocations <= allocations
                    && t.host_to_device <= h2d
                    && t.device_to_host <= d2h
                    && t.syncs <= syncs,
                "{name} {step:?}: the step costs {t:?}, over its budget of {total:?}"
            );
        }
    }
}

//! The layer ops' declared costs against what candle records, and the budgets of a step's counts
//! that the GPU work lowers (upper bounds: a change that adds a launch, an allocation or a copy
//! to a layer fails here).

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};

use super::candle_ops::{CandleGateUp, CandleOps, CandleQkv};
use super::{graph_cost, AttnDims, Cost, Counts, LayerOps, Qkv};
use crate::model::attention::CausalAttention;
use crate::model::config::{Activation, LayerKind};
use crate::model::init::{random_model, shape};
use crate::model::ops::{Exec, RmsNorm, Ropes, StepRope};
use crate::model::transformer::CountInto;

fn var(shape: &[usize], dtype: DType) -> Tensor {
    let v = Var::randn(0f32, 1.0, shape, &Device::Cpu).unwrap();
    let t = v.as_tensor().to_dtype(dtype).unwrap();
    // a variable of the dtype asked for
    Var::from_tensor(&t).unwrap().as_tensor().clone()
}

/// On the differentiable paths (our CPU ops in f32, and candle's elementary ops in f32 and
/// bf16), each op's declared buffers are the buffers of the graph candle records for it.
#[test]
fn declared_costs_are_the_graph_candle_records() {
    for (exec, dtype) in [
        (Exec::Differentiable, DType::F32),
        (Exec::Composed, DType::F32),
        (Exec::Composed, DType::BF16),
    ] {
        for name in ["tiny", "hybrid-20m"] {
            let cfg = shape(name).unwrap();
            let vm = VarMap::new();
            let vb = VarBuilder::from_varmap(&vm, dtype, &Device::Cpu);
            let (h, d, t) = (cfg.hidden_size, cfg.head_dim, 5);
            let norm = |n: &str| RmsNorm::new(h, 1e-6, cfg.norm_offset, vb.pp(n)).unwrap();
            let head_norm = |n: &str| RmsNorm::new(d, 1e-6, cfg.norm_offset, vb.pp(n)).unwrap();
            let lin = |i, o, n: &str| candle_nn::linear(i, o, vb.pp(n)).unwrap();
            let q_rows = cfg.num_heads * d * if cfg.attention_gate { 2 } else { 1 };
            let qkv = CandleQkv {
                q_proj: lin(h, q_rows, "q"),
                k_proj: lin(h, cfg.num_kv_heads * d, "k"),
                v_proj: lin(h, cfg.num_kv_heads * d, "v"),
                stacked: None,
                q_norm: Some(head_norm("qn")),
                k_norm: Some(head_norm("kn")),
            };
            let gate_up = CandleGateUp {
                gate: lin(h, 3 * h, "g"),
                up: lin(h, 3 * h, "u"),
                stacked: None,
            };
            let dims = AttnDims {
                heads: cfg.num_heads,
                kv_heads: cfg.num_kv_heads,
                head_dim: d,
                gate: cfg.attention_gate,
                q_scale: 0.5,
            };
            let ropes = Ropes::new(&cfg, &Device::Cpu, dtype).unwrap();
            let positions = Tensor::arange(0u32, t as u32, &Device::Cpu).unwrap();
            let rope = StepRope::new(&ropes, &positions, exec, &mut Cost::default()).unwrap();
            let rope = rope.of(LayerKind::Attention);
            let mut o = CandleOps::new(exec);
            let check = |what: &str, o: &mut CandleOps, outs: &[&Tensor]| {
                let declared = o.take_cost();
                let recorded = graph_cost(outs);
                assert_eq!(
                    declared.allocations, recorded.allocations,
                    "{name} {exec:?} {dtype:?} {what}: declared {declared:?}, candle recorded \
                     {recorded:?}"
                );
            };
            let x = var(&[t, h], dtype);
            let y = o.rms_norm(&x, &norm("n1")).unwrap();
            check("rms_norm", &mut o, &[&y]);
            let (s, y) = o
                .add_rms_norm(
                    var(&[t, h], dtype),
                    var(&[t, h], dtype),
                    Some(&norm("n2")),
                    &norm("n3"),
                )
                .unwrap();
            check("add_rms_norm", &mut o, &[&s, &y]);
            let y = o
                .add(var(&[t, h], dtype), var(&[t, h], dtype), None)
                .unwrap();
            check("add", &mut o, &[&y]);
            let Qkv { q, k, v, gate } = o.qkv_rope(var(&[t, h], dtype), &qkv, dims, rope).unwrap();
            let mut outs = vec![&q, &k, &v];
            outs.extend(gate.as_ref());
            check("qkv_rope", &mut o, &outs);
            let y = o
                .gate_mul(var(&[t, h], dtype), var(&[t, h], dtype))
                .unwrap();
            check("gate_mul", &mut o, &[&y]);
            let y = o.linear(var(&[t, h], dtype), &qkv.k_proj).unwrap();
            check("linear", &mut o, &[&y]);
            for act in [Activation::Silu, Activation::GeluTanh] {
                let y = o.gate_up_act(var(&[t, h], dtype), &gate_up, act).unwrap();
                check("gate_up_act", &mut o, &[&y]);
            }
        }
    }
}

/// The counts of one decode step of 8 sequences (a token each) of `model`, through a backend
/// that keeps nothing.
fn decode_step_counts(model: &crate::model::Transformer) -> Counts {
    let b = 8;
    let tokens = Tensor::new(vec![3u32; b].as_slice(), &Device::Cpu).unwrap();
    let positions = Tensor::new(vec![0u32; b].as_slice(), &Device::Cpu).unwrap();
    let mut attn = CausalAttention::new(vec![1; b]);
    let mut counts = Counts::default();
    let into = CountInto {
        counts: &mut counts,
        as_cuda: false,
    };
    model
        .forward_hidden_counted(&tokens, &positions, &mut attn, Some(into))
        .unwrap();
    counts
}

/// The counts of one decode step (8 sequences, a token each) of `shape` on the candle sampling
/// path (the path a GPU runs: stacked projections and candle's fused kernels), by layer kind:
/// (kind, layers, the cost of one layer).
fn decode_counts(name: &str) -> Vec<(LayerKind, usize, Cost)> {
    let mut model = random_model(&shape(name).unwrap()).unwrap();
    model.set_candle_sampling().unwrap();
    let (kinds, _) = decode_step_counts(&model).by_kind();
    kinds
        .into_iter()
        .map(|(k, n, c)| {
            let n = n as u64;
            let per = Cost {
                launches: c.launches / n,
                allocations: c.allocations / n,
                host_to_device: c.host_to_device / n,
                device_to_host: c.device_to_host / n,
                syncs: c.syncs / n,
            };
            (k, n as usize, per)
        })
        .collect()
}

/// Today's counts per layer of a decode step at batch 8 on the candle path (what a GPU runs but
/// for its own kernels), pinned as upper bounds that the GPU work lowers (its target: at most 10
/// launches per attention layer and per MLP, no allocation inside a step). Not in these: the
/// attention backend's own kernels (the contiguous backend here launches none), and the GPU's
/// Gated DeltaNet decode kernels (a CPU runs candle's ops: the conv once for the step, then the
/// delta rule a sequence at a time, which the GPU replaces with two kernels for the whole
/// batch).
#[test]
fn a_decode_step_keeps_within_its_budget() {
    // (shape, kind): launches and allocations per layer; no copies, no syncs inside a layer
    let budget = |name, kind| match (name, kind) {
        // norm, QKV, 3 reshape copies, q/k norms, 2 RoPE, o_proj, add, norm, gate/up, SiLU,
        // multiply, down, add
        ("tiny", LayerKind::Attention) => (17, 17),
        // and Qwen3.5's gate (its copies, sigmoid, product) and partial RoPE (copies, joins)
        ("hybrid-20m", LayerKind::Attention) => (27, 25),
        // the conv for the whole step, then a pass of ~30 candle ops per sequence
        ("hybrid-20m", LayerKind::GatedDeltaNet) => (268, 245),
        other => panic!("no budget for {other:?}"),
    };
    for name in ["tiny", "hybrid-20m"] {
        let counts = decode_counts(name);
        for (kind, layers, c) in &counts {
            eprintln!("{name} {kind:?} x{layers}: {c:?}");
        }
        for (kind, _, c) in counts {
            let (launches, allocations) = budget(name, kind);
            assert!(
                c.launches <= launches && c.allocations <= allocations,
                "{name}: a {kind:?} layer of a decode step costs {c:?}, over its budget of \
                 {launches} launches and {allocations} allocations"
            );
            assert_eq!(
                (c.host_to_device, c.device_to_host, c.syncs),
                (0, 0, 0),
                "{name}: a {kind:?} layer copies or waits: {c:?}"
            );
        }
    }
}

/// The CPU host path's layers allocate nothing in a decode step once their buffers have grown
/// to the step's sizes (the first step grows them).
#[test]
fn the_host_path_allocates_nothing_once_warm() {
    for name in ["tiny", "hybrid-20m"] {
        let cfg = shape(name).unwrap();
        let mut model = random_model(&cfg).unwrap();
        model.set_fused_inference(true).unwrap();
        let steps: Vec<Cost> = (0..3)
            .map(|_| {
                let (kinds, _) = decode_step_counts(&model).by_kind();
                kinds.into_iter().fold(Cost::default(), |a, k| a + k.2)
            })
            .collect();
        assert!(
            steps[0].allocations > 0,
            "{name}: the first step grew nothing"
        );
        assert_eq!(
            steps[2],
            Cost::default(),
            "{name}: a warm step spent {:?}",
            steps[2]
        );
    }
}

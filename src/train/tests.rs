//! The trainer's numbers against PyTorch on the tiny fixture (`../shared/fixtures/tiny-qwen3`):
//! the loss and every parameter's gradient at step 0, then 8 AdamW steps (loss and grad norm at
//! every step, every parameter at the end). Skipped without `../shared` unless
//! `SELFDISTILL_REQUIRE_SHARED` is set.

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use serde_json::Value;

use super::adamw::{AdamW, AdamWConfig};
use super::loss::{weighted_ce_sum, PackedBatch};
use super::Trainable;
use crate::model::attention::CausalAttention;
use crate::model::tests::{fixture, ids};
use crate::model::Checkpoint;

struct Reference {
    rows: Vec<(Vec<u32>, Vec<u32>)>,
    json: Value,
}

fn reference(dir: &std::path::Path) -> Reference {
    let json: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("expected/sft_reference.json")).unwrap(),
    )
    .unwrap();
    let rows = json["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (ids(&r["prompt_ids"]), ids(&r["completion_ids"])))
        .collect();
    Reference { rows, json }
}

/// Mean completion-token loss of the whole batch, packed into one step.
fn loss(t: &Trainable, rows: &[(Vec<u32>, Vec<u32>)]) -> Tensor {
    let refs: Vec<(&[u32], &[u32])> = rows
        .iter()
        .map(|(p, c)| (p.as_slice(), c.as_slice()))
        .collect();
    let b = PackedBatch::pack(&refs);
    let dev = Device::Cpu;
    let mut attn = CausalAttention::new(b.seq_lens.clone());
    let logits = t
        .model
        .forward(
            &Tensor::new(b.tokens.as_slice(), &dev).unwrap(),
            &Tensor::new(b.positions.as_slice(), &dev).unwrap(),
            &mut attn,
        )
        .unwrap();
    let sum = weighted_ce_sum(&logits, &b.targets, &b.weights).unwrap();
    (sum / b.loss_tokens() as f64).unwrap()
}

/// `|got - want| / |want|` (L2 over the whole tensor).
fn rel_err(got: &Tensor, want: &Tensor) -> f64 {
    let diff = (got - want).unwrap().sqr().unwrap().sum_all().unwrap();
    let norm = want.sqr().unwrap().sum_all().unwrap();
    let (d, n) = (
        diff.to_scalar::<f32>().unwrap() as f64,
        norm.to_scalar::<f32>().unwrap() as f64,
    );
    (d / n.max(1e-30)).sqrt()
}

#[test]
fn every_gradient_matches_pytorch_at_step_0() {
    let Some(dir) = fixture() else { return };
    let r = reference(&dir);
    let ck = Checkpoint::open(dir.to_str().unwrap()).unwrap();
    let t = Trainable::load(&ck, &Device::Cpu).unwrap();
    let l = loss(&t, &r.rows);
    let want_loss = r.json["initial_loss"].as_f64().unwrap();
    let got_loss = l.to_scalar::<f32>().unwrap() as f64;
    assert!(
        (got_loss - want_loss).abs() < 1e-5,
        "{got_loss} vs {want_loss}"
    );
    let grads = l.backward().unwrap();
    let want: HashMap<String, Tensor> =
        candle_core::safetensors::load(dir.join("expected/grads_step0.safetensors"), &Device::Cpu)
            .unwrap();
    let vars = t.named_vars();
    assert_eq!(vars.len(), want.len(), "parameters vs reference gradients");
    for (name, var) in &vars {
        let g = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("{name} has no gradient"));
        let w = &want[name];
        let err = rel_err(g, w);
        assert!(err <= 1e-4, "{name}: relative gradient error {err}");
        let norm = w
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(norm > 0.0, "{name}: the reference gradient is zero");
    }
}

#[test]
fn eight_adamw_steps_match_pytorch() {
    let Some(dir) = fixture() else { return };
    let r = reference(&dir);
    let hp = &r.json["hyperparameters"];
    let ck = Checkpoint::open(dir.to_str().unwrap()).unwrap();
    let t = Trainable::load(&ck, &Device::Cpu).unwrap();
    let betas = hp["betas"].as_array().unwrap();
    let cfg = AdamWConfig {
        beta1: betas[0].as_f64().unwrap(),
        beta2: betas[1].as_f64().unwrap(),
        eps: hp["eps"].as_f64().unwrap(),
        weight_decay: hp["weight_decay"].as_f64().unwrap(),
    };
    let lr = hp["lr"].as_f64().unwrap();
    let clip = hp["clip_grad_norm"].as_f64().unwrap();
    let mut opt = AdamW::new(t.named_vars(), cfg, |_| true).unwrap();
    for want in r.json["trajectory"].as_array().unwrap() {
        let step = want["step"].as_u64().unwrap();
        let l = loss(&t, &r.rows);
        let got = l.to_scalar::<f32>().unwrap() as f64;
        let expect = want["loss"].as_f64().unwrap();
        assert!(
            (got - expect).abs() < 1e-4,
            "step {step}: loss {got} vs {expect}"
        );
        let grads = l.backward().unwrap();
        let stats = opt.step(&grads, lr, Some(clip)).unwrap();
        let gn = want["grad_norm_before_clip"].as_f64().unwrap();
        assert!(
            (stats.grad_norm - gn).abs() < 1e-4 * gn,
            "step {step}: grad norm {} vs {gn}",
            stats.grad_norm
        );
    }
    let want: HashMap<String, Tensor> = candle_core::safetensors::load(
        dir.join("expected/params_after_adamw.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    let got = t.tensors();
    assert_eq!(got.len(), want.len());
    for (name, w) in &want {
        let err = rel_err(&got[name], w);
        assert!(err <= 1e-4, "{name}: relative error after 8 steps {err}");
    }
}

#[test]
fn packing_marks_only_completion_targets() {
    let b = PackedBatch::pack(&[(&[1, 2], &[3, 4]), (&[5], &[6])]);
    assert_eq!(b.tokens, vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(b.positions, vec![0, 1, 2, 3, 0, 1]);
    assert_eq!(b.seq_lens, vec![4, 2]);
    // targets: 2 (prompt), 3, 4, none | 6, none
    assert_eq!(b.targets, vec![2, 3, 4, 0, 6, 0]);
    assert_eq!(b.weights, vec![0.0, 1.0, 1.0, 0.0, 1.0, 0.0]);
    assert_eq!(b.loss_tokens(), 3);
}

//! Time and cost of the stages still to run, before the first GPU hour: each stage's work
//! (tokens to generate or to train on, from [`super::Work`]) over an assumed throughput, as
//! wall time, GPU hours and, with `run.gpu_hour_price`, money.
//!
//! Throughput, best source first:
//! - generation on a device `pipeline bench sample` has measured (the records in
//!   `~/.cache/selfdistill/bench-sample.jsonl`, same device, a model within 25% of the size):
//!   the measured decode rate at the batch nearest the stage's `max_num_seqs`;
//! - generation on a GPU: the rate measured on an H200 at Qwen3-4B shapes (4,331 tok/s at batch
//!   128, `kernels/NOTES.md`), scaled by the GPU's memory bandwidth and the model's size
//!   (decoding reads every weight per step);
//! - generation on the CPU: 10 GFLOP/s per core at 2 FLOPs per parameter and token;
//! - training: 6 FLOPs per parameter and token at 35% of the GPU's bf16 peak (an assumption
//!   until `bench train --device cuda` measures it) or, on the CPU, 10 GFLOP/s per core.
//!
//! The table says which source each row used. Knows the stages only through their estimates.

use serde::{Deserialize, Serialize};

use super::{Plan, Work};
use crate::train::memory::Gpu;

/// One stage's estimate.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StageCost {
    pub stage: String,
    /// `cpu`, or the GPU the estimate is for.
    pub device: String,
    pub tokens: u64,
    pub basis: String,
    pub tokens_per_second: f64,
    /// Where the throughput comes from.
    pub rate_source: String,
    pub seconds: f64,
    /// 0 for a CPU stage.
    pub gpu_hours: f64,
    pub cost: Option<f64>,
}

/// Decode tokens/s measured on an H200 for Qwen3-4B shapes at batch 128 (bf16, random weights).
const H200_QWEN3_4B_TOKENS_PER_SECOND: f64 = 4331.0;
const H200_BANDWIDTH: f64 = 4.8e12;
const QWEN3_4B_PARAMS: f64 = 4.02e9;
/// FLOP/s per CPU core assumed without a measurement.
const CPU_FLOPS_PER_CORE: f64 = 10e9;
/// Training MFU assumed on a GPU.
const GPU_TRAIN_MFU: f64 = 0.35;

/// Estimates every stage with work that is not done yet. `gpu`: the GPU that cuda stages run
/// on (named with `--gpu`, or this machine's); without one an H100 is assumed and said.
pub fn estimate(plan: &Plan, gpu: Option<Gpu>, price: Option<f64>) -> Vec<StageCost> {
    let records = crate::machine::bench_records();
    let mut out = Vec::new();
    for s in &plan.stages {
        let Some(w) = &s.estimate.work else {
            continue;
        };
        if matches!(super::stage_state(&s.dir), Ok(super::StageState::Done(_))) {
            continue;
        }
        out.push(stage_cost(&s.name, w, gpu, price, &records));
    }
    out
}

fn cores() -> f64 {
    std::thread::available_parallelism()
        .map(|n| n.get() as f64)
        .unwrap_or(1.0)
}

fn stage_cost(
    name: &str,
    w: &Work,
    gpu: Option<Gpu>,
    price: Option<f64>,
    records: &[crate::machine::BenchRecord],
) -> StageCost {
    let on_gpu = w.device != "cpu";
    let (g, assumed_gpu) = match gpu {
        Some(g) if g.bandwidth > 0.0 => (Some(g), false),
        _ if on_gpu => (crate::train::memory::parse_gpu("h100").ok(), true),
        _ => (None, false),
    };
    let device = match (&g, on_gpu) {
        (Some(g), true) if assumed_gpu => format!("{} (assumed)", g.name),
        (Some(g), true) => g.name.to_string(),
        _ => "cpu".to_string(),
    };
    let params = w.params.max(1) as f64;
    let (rate, source) = if w.train {
        match g.filter(|_| on_gpu) {
            Some(g) => (
                GPU_TRAIN_MFU * g.bf16_flops / (6.0 * params),
                format!(
                    "{:.0}% MFU of {:.0} TFLOP/s (assumed)",
                    100.0 * GPU_TRAIN_MFU,
                    g.bf16_flops / 1e12
                ),
            ),
            None => (
                CPU_FLOPS_PER_CORE * cores() / (6.0 * params),
                format!(
                    "{:.0} GFLOP/s (assumed)",
                    CPU_FLOPS_PER_CORE * cores() / 1e9
                ),
            ),
        }
    } else {
        let bench_device = match (&g, on_gpu) {
            (Some(g), true) => g.name.to_string(),
            _ => "cpu".into(),
        };
        let measured = records
            .iter()
            .filter(|r| {
                let same = if on_gpu {
                    crate::train::memory::gpu_by_device_name(&r.device)
                        .is_some_and(|d| d.name == bench_device)
                } else {
                    r.device == "cpu"
                };
                same && (r.params as f64 / params - 1.0).abs() <= 0.25
            })
            .min_by_key(|r| (r.batch.abs_diff(w.batch), u64::MAX - r.unix));
        match (measured, &g) {
            (Some(r), _) => (
                // decoding reads every weight per step: a bigger model is slower
                r.decode_tokens_per_second * r.params as f64 / params,
                format!("bench sample at batch {} on this machine", r.batch),
            ),
            (None, Some(g)) if on_gpu => (
                H200_QWEN3_4B_TOKENS_PER_SECOND
                    * (g.bandwidth / H200_BANDWIDTH)
                    * (QWEN3_4B_PARAMS / params),
                "H200 Qwen3-4B batch 128 measured, scaled by bandwidth and size".into(),
            ),
            _ => (
                CPU_FLOPS_PER_CORE * cores() / (2.0 * params),
                format!(
                    "{:.0} GFLOP/s (assumed; `pipeline bench sample` measures it)",
                    CPU_FLOPS_PER_CORE * cores() / 1e9
                ),
            ),
        }
    };
    let seconds = w.tokens as f64 / rate.max(1e-9);
    let gpu_hours = if on_gpu { seconds / 3600.0 } else { 0.0 };
    StageCost {
        stage: name.to_string(),
        device,
        tokens: w.tokens,
        basis: w.basis.clone(),
        tokens_per_second: rate,
        rate_source: source,
        seconds,
        gpu_hours,
        cost: price.filter(|_| on_gpu).map(|p| p * gpu_hours),
    }
}

/// The table preflight and `pipeline run` print.
pub fn table(costs: &[StageCost], price: Option<f64>) -> Vec<String> {
    let mut lines = vec![format!(
        "{:<11} {:>14} {:>12} {:>10} {:>10} {:>10}  {}",
        "stage", "tokens", "tok/s", "time", "GPU hours", "cost", "device; throughput from; tokens"
    )];
    for c in costs {
        lines.push(format!(
            "{:<11} {:>14} {:>12.0} {:>10} {:>10} {:>10}  {}; {}; {}",
            c.stage,
            c.tokens,
            c.tokens_per_second,
            crate::progress::fmt_secs(c.seconds),
            if c.gpu_hours > 0.0 {
                format!("{:.2}", c.gpu_hours)
            } else {
                "-".into()
            },
            c.cost.map(|x| format!("{x:.2}")).unwrap_or("-".into()),
            c.device,
            c.rate_source,
            c.basis
        ));
    }
    let hours: f64 = costs.iter().map(|c| c.gpu_hours).sum();
    let secs: f64 = costs.iter().map(|c| c.seconds).sum();
    lines.push(format!(
        "total: {} of compute, {hours:.2} GPU hours{}",
        crate::progress::fmt_secs(secs),
        match price {
            Some(p) => format!(", cost {:.2} at {p} per GPU-hour", p * hours),
            None => " (set run.gpu_hour_price for the cost)".into(),
        }
    ));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(tokens: u64, train: bool, device: &str) -> Work {
        Work {
            tokens,
            train,
            params: 4_020_000_000,
            device: device.into(),
            batch: 128,
            basis: String::new(),
        }
    }

    #[test]
    fn gpu_rates_scale_with_bandwidth_and_training_with_the_peak() {
        let h200 = crate::train::memory::parse_gpu("h200").ok();
        let b200 = crate::train::memory::parse_gpu("b200").ok();
        let c = stage_cost(
            "sample",
            &work(4_331 * 3600, false, "cuda"),
            h200,
            Some(2.0),
            &[],
        );
        assert!((c.seconds - 3600.0).abs() < 40.0, "{c:?}");
        assert!((c.gpu_hours - 1.0).abs() < 0.02 && (c.cost.unwrap() - 2.0).abs() < 0.05);
        let fast = stage_cost(
            "sample",
            &work(4_331 * 3600, false, "cuda"),
            b200,
            None,
            &[],
        );
        assert!(
            (c.seconds / fast.seconds - 8.0 / 4.8).abs() < 0.01,
            "{fast:?}"
        );
        // no GPU named: an H100, said
        let h = stage_cost("sample", &work(1000, false, "cuda"), None, None, &[]);
        assert!(
            h.device.contains("H100") && h.device.contains("assumed"),
            "{h:?}"
        );
        let t = stage_cost("train", &work(1_000_000, true, "cuda"), h200, None, &[]);
        let expect = 6.0 * 4.02e9 * 1e6 / (0.35 * 989e12);
        assert!((t.seconds - expect).abs() / expect < 1e-6, "{t:?}");
        // CPU stages cost no GPU hours
        let cpu = stage_cost("sample", &work(1000, false, "cpu"), h200, Some(2.0), &[]);
        assert_eq!((cpu.gpu_hours, cpu.cost), (0.0, None));
    }

    #[test]
    fn a_bench_record_of_the_same_device_and_size_is_preferred() {
        let rec = crate::machine::BenchRecord {
            device: "NVIDIA H100 80GB HBM3".into(),
            params: 4_000_000_000,
            batch: 64,
            decode_tokens_per_second: 2000.0,
            prompt_len: 128,
            new_tokens: 512,
            unix: 1,
        };
        let h100 = crate::train::memory::parse_gpu("h100").ok();
        let c = stage_cost("sample", &work(1000, false, "cuda"), h100, None, &[rec]);
        assert!(c.rate_source.contains("bench sample at batch 64"), "{c:?}");
        assert!(
            (c.tokens_per_second - 2000.0 * 4.0 / 4.02).abs() < 1.0,
            "{c:?}"
        );
    }
}

//! Time and cost of the stages still to run, before the first GPU hour: each stage's work
//! (tokens to generate or to train on, from [`super::Work`]) over an assumed throughput, as
//! wall time, GPU hours and, with `run.gpu_hour_price`, money.
//!
//! Throughput, best source first:
//! - generation on a device `pipeline bench sample` has measured (the records in
//!   `~/.cache/selfdistill/bench-sample.jsonl`, same device, a model within 25% of the size):
//!   the measured decode rate at the batch nearest the stage's `max_num_seqs`;
//! - generation on a GPU: the decode rates measured on an H200 at Qwen3-4B shapes (182, 3,871,
//!   12,622 and 16,683 tok/s at batch 1, 32, 128 and 256; `docs/gpu.md`, 2026-11-28), at the
//!   batch nearest the stage's `max_num_seqs`, scaled by the GPU's memory bandwidth and the
//!   model's size (decoding reads every weight per step);
//! - generation on the CPU: 10 GFLOP/s per core at 2 FLOPs per parameter and token;
//! - training on a device where a training run has finished before (the records in
//!   `~/.cache/selfdistill/train-rates.jsonl`, a model within a factor of 4 of the size): its
//!   measured tokens/s, scaled by size;
//! - training on a GPU: 6 FLOPs per parameter and token at the MFU our trainer measured on an
//!   H200 at Qwen3-4B shapes (1,415 tok/s with the flash attention kernels, 3.45% of the bf16
//!   peak; `docs/gpu.md`, 2026-11-28), scaled by the GPU's bf16 peak; on the CPU, 10 GFLOP/s
//!   per core.
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

/// Decode tokens/s measured on an H200 for Qwen3-4B shapes by batch (bf16, random weights,
/// prompt 128, 512 new tokens; `bench sample`, 2026-11-28, paged attention v5).
const H200_QWEN3_4B_DECODE: [(usize, f64); 4] =
    [(1, 182.0), (32, 3871.0), (128, 12622.0), (256, 16683.0)];
const H200_BANDWIDTH: f64 = 4.8e12;
const QWEN3_4B_PARAMS: f64 = 4.02e9;
/// FLOP/s per CPU core assumed without a measurement.
const CPU_FLOPS_PER_CORE: f64 = 10e9;
/// Training MFU measured on an H200 at Qwen3-4B shapes (`bench train`, 4,096-token rows with
/// recompute, the flash attention kernels: 1,415 tok/s, 6 x 4.02e9 x 1,415 / 989e12).
const GPU_TRAIN_MFU: f64 = 0.0345;

/// The price of an hour of `gpu` (of the H100 the estimates assume when there is none) from
/// `run.gpu_hour_price`.
pub fn price_for(price: Option<&crate::config::GpuPrice>, gpu: Option<Gpu>) -> Option<f64> {
    let key = match gpu {
        Some(g) => crate::train::memory::gpu_key(&g)?,
        None => "h100",
    };
    price?.for_gpu(key)
}

/// Estimates every stage with work that is not done yet. `gpu`: the GPU that cuda stages run
/// on (named with `--gpu`, or this machine's); without one an H100 is assumed and said.
pub fn estimate(plan: &Plan, gpu: Option<Gpu>, price: Option<f64>) -> Vec<StageCost> {
    let records = Records {
        sample: crate::machine::bench_records(),
        train: crate::machine::train_records(),
    };
    let mut out = Vec::new();
    for s in &plan.stages {
        let Some(w) = &s.estimate.work else {
            continue;
        };
        if matches!(super::stage_state(&s.dir), Ok(super::StageState::Done(_))) {
            continue;
        }
        let mut c = stage_cost(&s.name, w, gpu, price, &records);
        if !s.estimate.cards.is_empty() {
            let mut cards = s.estimate.cards.clone();
            cards.dedup();
            c.basis = format!(
                "{}; rows from built-in cards: {}",
                c.basis,
                cards.join(", ")
            );
        }
        out.push(c);
    }
    out
}

fn cores() -> f64 {
    std::thread::available_parallelism()
        .map(|n| n.get() as f64)
        .unwrap_or(1.0)
}

/// The rates measured on this machine: `bench sample`'s decode rates, finished training runs'
/// throughputs.
#[derive(Debug, Default)]
struct Records {
    sample: Vec<crate::machine::BenchRecord>,
    train: Vec<crate::machine::TrainRecord>,
}

/// Whether a record's device is the one a stage runs on: `cpu`, or the GPU named `gpu_name`.
fn same_device(record_device: &str, on_gpu: bool, gpu_name: &str) -> bool {
    if on_gpu {
        crate::train::memory::gpu_by_device_name(record_device).is_some_and(|d| d.name == gpu_name)
    } else {
        record_device == "cpu"
    }
}

/// A sample stage's decode rate (tokens/s) and where it comes from: `bench sample` on this
/// device at the nearest batch for a model within 25% of the size, else the H200's measured
/// Qwen3-4B rates scaled by bandwidth and size, else an assumed CPU rate.
fn sample_rate(
    w: &Work,
    g: Option<Gpu>,
    on_gpu: bool,
    bench_device: &str,
    params: f64,
    records: &Records,
) -> (f64, String) {
    let measured = records
        .sample
        .iter()
        .filter(|r| {
            same_device(&r.device, on_gpu, bench_device)
                && (r.params as f64 / params - 1.0).abs() <= 0.25
        })
        .min_by_key(|r| (r.batch.abs_diff(w.batch), u64::MAX - r.unix));
    match (measured, &g) {
        (Some(r), _) => (
            // decoding reads every weight per step: a bigger model is slower
            r.decode_tokens_per_second * r.params as f64 / params,
            format!("bench sample at batch {} on this machine", r.batch),
        ),
        (None, Some(g)) if on_gpu => {
            let (batch, rate) = H200_QWEN3_4B_DECODE
                .iter()
                .copied()
                .min_by_key(|(b, _)| b.abs_diff(w.batch))
                .expect("measured rates");
            (
                rate * (g.bandwidth / H200_BANDWIDTH) * (QWEN3_4B_PARAMS / params),
                format!("H200 Qwen3-4B batch {batch} measured, scaled by bandwidth and size"),
            )
        }
        _ => (
            CPU_FLOPS_PER_CORE * cores() / (2.0 * params),
            format!(
                "{:.0} GFLOP/s (assumed; `pipeline bench sample` measures it)",
                CPU_FLOPS_PER_CORE * cores() / 1e9
            ),
        ),
    }
}

fn stage_cost(
    name: &str,
    w: &Work,
    gpu: Option<Gpu>,
    price: Option<f64>,
    records: &Records,
) -> StageCost {
    let on_gpu = w.device.is_cuda();
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
    let bench_device = match (&g, on_gpu) {
        (Some(g), true) => g.name.to_string(),
        _ => "cpu".into(),
    };
    // a training run on this device of a model within a factor of 4 of the size, the nearest
    // in size and then the newest: its rate scaled by size (6 FLOPs per parameter and token)
    let trained = records
        .train
        .iter()
        .filter(|r| same_device(&r.device, on_gpu, &bench_device))
        .filter(|r| (r.params as f64 / params).log2().abs() <= 2.0)
        .min_by_key(|r| {
            let off = ((r.params as f64 / params).log2().abs() * 1e6) as u64;
            (off, u64::MAX - r.unix)
        });
    let (rate, source) = if let (true, Some(r)) = (w.train, trained) {
        (
            r.tokens_per_second * r.params as f64 / params,
            format!(
                "a training run on this machine ({:.1}M parameters, {:.0} tok/s)",
                r.params as f64 / 1e6,
                r.tokens_per_second
            ),
        )
    } else if w.train {
        match g.filter(|_| on_gpu) {
            Some(g) => (
                GPU_TRAIN_MFU * g.bf16_flops / (6.0 * params),
                format!(
                    "{:.2}% MFU of {:.0} TFLOP/s (measured on an H200)",
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
        sample_rate(w, g, on_gpu, &bench_device, params, records)
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

/// The whole job on one GPU, for the comparison `preflight --gpu h100,h200,b200` prints.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuRow {
    pub gpu: String,
    pub seconds: f64,
    pub gpu_hours: f64,
    pub price: Option<f64>,
    pub cost: Option<f64>,
    /// Why the GPU stages do not fit its memory, when they do not.
    pub does_not_fit: Option<String>,
}

impl GpuRow {
    pub fn of(
        g: &Gpu,
        costs: &[StageCost],
        price: Option<f64>,
        does_not_fit: Option<String>,
    ) -> GpuRow {
        let gpu_hours: f64 = costs.iter().map(|c| c.gpu_hours).sum();
        GpuRow {
            gpu: g.name.to_string(),
            seconds: costs.iter().map(|c| c.seconds).sum(),
            gpu_hours,
            price,
            cost: price.map(|p| p * gpu_hours),
            does_not_fit,
        }
    }
}

/// One line per GPU: time, GPU hours, price, cost and whether the job fits, with the cheapest
/// and the fastest that fit marked.
pub fn gpu_table(rows: &[GpuRow]) -> Vec<String> {
    let fitting = || rows.iter().filter(|r| r.does_not_fit.is_none());
    let fastest = fitting().map(|r| r.seconds).fold(f64::INFINITY, f64::min);
    let cheapest = fitting()
        .filter_map(|r| r.cost)
        .fold(f64::INFINITY, f64::min);
    let mut lines = vec![format!(
        "{:<18} {:>10} {:>10} {:>12} {:>10}  {}",
        "gpu", "time", "GPU hours", "price/hour", "cost", "note"
    )];
    for r in rows {
        let mut notes = Vec::new();
        if let Some(why) = &r.does_not_fit {
            notes.push(format!("does not fit: {why}"));
        } else {
            if r.seconds <= fastest {
                notes.push("fastest".to_string());
            }
            if r.cost.is_some_and(|c| c <= cheapest) {
                notes.push("cheapest".to_string());
            }
        }
        if r.price.is_none() {
            notes.push("no price (run.gpu_hour_price)".to_string());
        }
        lines.push(format!(
            "{:<18} {:>10} {:>10.2} {:>12} {:>10}  {}",
            r.gpu,
            crate::progress::fmt_secs(r.seconds),
            r.gpu_hours,
            r.price.map_or("-".to_string(), |p| format!("{p:.2}")),
            r.cost.map_or("-".to_string(), |c| format!("{c:.2}")),
            notes.join("; ")
        ));
    }
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
            device: device.parse().unwrap(),
            batch: 128,
            basis: String::new(),
        }
    }

    #[test]
    fn gpu_rates_scale_with_bandwidth_and_training_with_the_peak() {
        let h200 = crate::train::memory::parse_gpu("h200").ok();
        let b200 = crate::train::memory::parse_gpu("b200").ok();
        let h100 = crate::train::memory::parse_gpu("h100").ok();
        let none = Records::default();
        let c = stage_cost(
            "sample",
            &work(12_622 * 3600, false, "cuda"),
            h200,
            Some(2.0),
            &none,
        );
        // at batch 128: the measured rate, less 0.5% for the 4.02B parameters
        assert!((c.seconds - 3600.0).abs() < 40.0, "{c:?}");
        assert!((c.gpu_hours - 1.0).abs() < 0.02 && (c.cost.unwrap() - 2.0).abs() < 0.05);
        assert!(c.rate_source.contains("batch 128"), "{c:?}");
        let fast = stage_cost(
            "sample",
            &work(12_622 * 3600, false, "cuda"),
            b200,
            None,
            &none,
        );
        assert!(
            (c.seconds / fast.seconds - 8.0 / 4.8).abs() < 0.01,
            "{fast:?}"
        );
        let slow = stage_cost("sample", &work(1000, false, "cuda"), h100, None, &none);
        let same = stage_cost("sample", &work(1000, false, "cuda"), h200, None, &none);
        assert!(
            (slow.seconds / same.seconds - 4.8 / 3.35).abs() < 0.01,
            "{slow:?}"
        );
        let mut small = work(1000, false, "cuda");
        small.batch = 20;
        let s = stage_cost("sample", &small, h100, None, &none);
        assert!(s.rate_source.contains("batch 32"), "{s:?}");
        // no GPU named: an H100, said
        let h = stage_cost("sample", &work(1000, false, "cuda"), None, None, &none);
        assert!(
            h.device.contains("H100") && h.device.contains("assumed"),
            "{h:?}"
        );
        let t = stage_cost("train", &work(1_000_000, true, "cuda"), h200, None, &none);
        let expect = 6.0 * 4.02e9 * 1e6 / (0.0345 * 989e12);
        assert!((t.seconds - expect).abs() / expect < 1e-6, "{t:?}");
        // CPU stages cost no GPU hours
        let cpu = stage_cost("sample", &work(1000, false, "cpu"), h200, Some(2.0), &none);
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
        let recs = Records {
            sample: vec![rec],
            ..Records::default()
        };
        let c = stage_cost("sample", &work(1000, false, "cuda"), h100, None, &recs);
        assert!(c.rate_source.contains("bench sample at batch 64"), "{c:?}");
        assert!(
            (c.tokens_per_second - 2000.0 * 4.0 / 4.02).abs() < 1.0,
            "{c:?}"
        );
    }

    /// A finished training run's rate on this machine replaces the assumed CPU rate, scaled by
    /// the model's size; one of another device, or a model far from the size, does not.
    #[test]
    fn a_training_run_of_this_machine_sets_the_training_rate() {
        let rec = |device: &str, params: u64, unix: u64| crate::machine::TrainRecord {
            device: device.into(),
            params,
            tokens_per_second: 8000.0,
            unix,
        };
        let mut w = work(800_000, true, "cpu");
        w.params = 2_000_000;
        let recs = Records {
            train: vec![
                rec("cpu", 1_000_000, 1),
                rec("NVIDIA H100 80GB HBM3", 2_000_000, 2),
                rec("cpu", 100_000_000, 3),
            ],
            ..Records::default()
        };
        let c = stage_cost("train", &w, None, None, &recs);
        assert!(
            c.rate_source.contains("a training run on this machine"),
            "{c:?}"
        );
        // 8,000 tok/s at 1M parameters is 4,000 at 2M: 200 s
        assert!((c.seconds - 200.0).abs() < 1e-6, "{c:?}");
        let far = Records {
            train: vec![rec("cpu", 100_000_000, 3)],
            ..Records::default()
        };
        let a = stage_cost("train", &w, None, None, &far);
        assert!(a.rate_source.contains("assumed"), "{a:?}");
    }
}

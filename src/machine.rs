//! Facts about this machine that planning and reports need: free disk, available memory, and
//! measured rates (memory read bandwidth, multiply-add peak, matmul rates) for rooflines and MFU.
//!
//! Measures; knows nothing of models, stages or configs.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Result};
use candle_core::{Device, Tensor};

/// Free bytes on the filesystem that holds `path` (or its nearest existing ancestor).
pub fn free_disk_bytes(path: &Path) -> Result<u64> {
    let mut p = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    };
    while !p.exists() {
        if !p.pop() {
            bail!("no existing folder above {}", path.display());
        }
    }
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes())?;
    // SAFETY: statvfs is plain old data, zero-initialised is a valid value, and `c` is a valid
    // NUL-terminated path that outlives the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the duration of the call.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        bail!(
            "statvfs({}) failed: {}",
            p.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// This machine's host name (`/proc/sys/kernel/hostname`, `$HOSTNAME`, else `localhost`).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Whether process `pid` exists on this machine (it may belong to another user).
pub fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 only checks that the process exists; it sends nothing.
    let rc = unsafe { libc::kill(pid, 0) };
    let exists = rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    // a zombie (killed, not yet reaped by its parent) is gone too
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false);
    exists && !zombie
}

/// `MemAvailable` from /proc/meminfo (Linux); `None` elsewhere.
pub fn available_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The side of the square products the matmul ceilings time.
pub const CEILING_N: usize = 1024;

/// The machine's memory read bandwidth in bytes/s: every thread of rayon's pool sums its share
/// of a 256 MiB buffer (far larger than any cache), the best of 5 passes after a warm-up.
pub fn read_bandwidth() -> f64 {
    use rayon::prelude::*;
    let buf = vec![1f32; 64 << 20];
    let threads = rayon::current_num_threads().max(1);
    let per = buf.len().div_ceil(threads);
    let pass = || -> f64 {
        let t = Instant::now();
        let s: f32 = buf
            .par_chunks(per)
            .map(|c| crate::simd::sum(std::hint::black_box(c)))
            .sum();
        std::hint::black_box(s);
        t.elapsed().as_secs_f64()
    };
    pass();
    let best = (0..5).map(|_| pass()).fold(f64::INFINITY, f64::min);
    (buf.len() * std::mem::size_of::<f32>()) as f64 / best
}

/// The machine's multiply-add peak in FLOP/s: every thread of rayon's pool runs independent
/// chains of 8-lane fused multiply-adds held in registers (AVX2; the portable build's vectors
/// otherwise), the best of 3 runs.
pub fn fma_peak() -> f64 {
    use rayon::prelude::*;
    let threads = rayon::current_num_threads().max(1);
    let iters = 20_000_000usize;
    let best = (0..3)
        .map(|_| {
            let t = Instant::now();
            let s: f32 = (0..threads)
                .into_par_iter()
                .map(|i| crate::simd::fma_chains(iters, i as f32))
                .sum();
            std::hint::black_box(s);
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    (threads * iters * crate::simd::FMA_CHAINS * 16) as f64 / best
}

/// The machine's f32 matmul rate through candle (the gemm every Linear runs on): FLOP/s of the
/// best of several square products.
pub fn matmul_ceiling() -> Result<f64> {
    let n = CEILING_N;
    let a = Tensor::randn(0f32, 1.0, (n, n), &Device::Cpu)?;
    let b = Tensor::randn(0f32, 1.0, (n, n), &Device::Cpu)?;
    let _ = a.matmul(&b)?; // warm-up
    let mut best = f64::INFINITY;
    for _ in 0..10 {
        let t = Instant::now();
        let c = a.matmul(&b)?;
        std::hint::black_box(&c);
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(2.0 * (n * n * n) as f64 / best)
}

/// The same square product through the sampler's packed, batch-invariant gemm
/// ([`crate::gemm`]).
pub fn packed_matmul_ceiling() -> f64 {
    packed_matmul_rate(CEILING_N, CEILING_N, CEILING_N)
}

/// The CPU's f32 matmul rate for MFU: the faster of candle's gemm and the packed one (training's
/// linear layers and LM head run on the packed gemm, other products on candle's).
pub fn cpu_matmul_ceiling() -> Result<f64> {
    Ok(matmul_ceiling()?.max(packed_matmul_ceiling()))
}

/// FLOP/s of the packed gemm `(m x k) @ (n x k)^T`: the best of repeated products (at least 10,
/// and at least ~50 ms in all) after a warm-up.
pub fn packed_matmul_rate(m: usize, n: usize, k: usize) -> f64 {
    let x: Vec<f32> = (0..m * k)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0)
        .collect();
    let w = crate::gemm::PackedMatrix::pack(&w, n, k);
    let mut y = vec![0f32; m * n];
    crate::gemm::matmul(&x, m, &w, &mut y); // warm-up
    let (mut best, start, mut runs) = (f64::INFINITY, Instant::now(), 0);
    while runs < 10 || (start.elapsed().as_secs_f64() < 0.3 && runs < 10_000) {
        let t = Instant::now();
        crate::gemm::matmul(&x, m, &w, &mut y);
        std::hint::black_box(&y);
        best = best.min(t.elapsed().as_secs_f64());
        runs += 1;
    }
    2.0 * (m * n * k) as f64 / best
}

/// One decode rate `pipeline bench sample` measured on this machine, remembered in the cache
/// (`~/.cache/selfdistill/bench-sample.jsonl`) so that preflight can estimate a run's time from
/// it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BenchRecord {
    /// `cpu`, or the CUDA device's name.
    pub device: String,
    pub params: u64,
    pub batch: usize,
    pub decode_tokens_per_second: f64,
    pub prompt_len: usize,
    pub new_tokens: usize,
    pub unix: u64,
}

/// A training throughput measured on this machine: by a finished training run (the train and
/// pretrain stages, `pipeline train`) or `pipeline bench train`; preflight's training
/// estimates prefer it to an assumed rate.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct TrainRecord {
    /// `cpu, N threads`, or the CUDA device's name.
    pub device: String,
    pub params: u64,
    pub tokens_per_second: f64,
    pub unix: u64,
}

/// The records' folder: `$SELFDISTILL_CACHE_DIR`, else `$XDG_CACHE_HOME/selfdistill`, else
/// `~/.cache/selfdistill`.
fn records_dir() -> Option<std::path::PathBuf> {
    let non_empty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    Some(match non_empty("SELFDISTILL_CACHE_DIR") {
        Some(d) => std::path::PathBuf::from(d),
        None => non_empty("XDG_CACHE_HOME")
            .map(std::path::PathBuf::from)
            .or_else(|| non_empty("HOME").map(|h| std::path::PathBuf::from(h).join(".cache")))?
            .join("selfdistill"),
    })
}

/// The bench records file, `bench-sample.jsonl` in the records' folder.
pub fn bench_records_path() -> Option<std::path::PathBuf> {
    Some(records_dir()?.join("bench-sample.jsonl"))
}

/// The training records file, `train-rates.jsonl` beside it.
pub fn train_records_path() -> Option<std::path::PathBuf> {
    Some(records_dir()?.join("train-rates.jsonl"))
}

/// Appends `r` as a JSON line to `path` (a record that cannot be written only loses an
/// estimate).
fn append_record<T: serde::Serialize>(path: Option<std::path::PathBuf>, r: &T) {
    use std::io::Write;
    let Some(path) = path else {
        return;
    };
    let write = || -> std::io::Result<()> {
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d)?;
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?;
        writeln!(f, "{}", serde_json::to_string(r).unwrap_or_default())
    };
    let _ = write();
}

/// Every record of `path` that parses (none when it cannot be read).
fn read_records<T: serde::de::DeserializeOwned>(path: Option<std::path::PathBuf>) -> Vec<T> {
    let Some(text) = path.and_then(|p| std::fs::read_to_string(p).ok()) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Appends `r` to the bench records.
pub fn record_bench(r: &BenchRecord) {
    append_record(bench_records_path(), r);
}

/// Appends `r` to the training records.
pub fn record_train(r: &TrainRecord) {
    append_record(train_records_path(), r);
}

/// The training records of this machine.
pub fn train_records() -> Vec<TrainRecord> {
    read_records(train_records_path())
}

/// Every remembered bench record, oldest first (unreadable lines skipped).
pub fn bench_records() -> Vec<BenchRecord> {
    read_records(bench_records_path())
}

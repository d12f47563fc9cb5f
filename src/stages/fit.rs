//! Whether the stages still to run fit the machine: what they need (disk, the report's included;
//! the largest memory of one stage; each GPU stage's GPU memory, from each stage's estimate) and
//! what the machine has (free disk at the work dir, available memory, a writable work dir, the
//! GPU's memory), as a list of problems, each a sentence that says what to change.
//!
//! `pipeline preflight` prints the figures and these problems; `pipeline run` refuses to start
//! on them, before its first stage (a run that would fill the disk or run out of memory hours
//! in fails now instead). Knows nothing of how a stage computes its estimate.

use std::path::Path;

use anyhow::Result;

use super::{stage_state, Plan, PlannedStage, StageKind, StageState};
use crate::bytes::format_bytes;
use crate::config::Config;

/// Disk planned for the report (report.md and its PNG charts: ~600 KiB for the shipped configs).
pub const REPORT_BYTES: u64 = 768 << 10;

/// One stage's share of [`Needs`] (zero when it is cached).
#[derive(Debug, Clone)]
pub struct StageNeed {
    pub name: String,
    pub key: String,
    pub to_run: bool,
    pub disk: u64,
    pub memory: u64,
    pub gpu: u64,
    pub kind: StageKind,
}

/// What the stages to run need together.
#[derive(Debug, Clone, Default)]
pub struct Needs {
    pub stages: Vec<StageNeed>,
    /// Their disk, and the report's when any stage runs.
    pub disk: u64,
    /// The most memory one of them needs (stages run one at a time).
    pub memory: u64,
}

impl Needs {
    /// The needs of the plan's stages that `to_run` says will run (by their index).
    pub fn of(plan: &Plan, to_run: impl Fn(usize, &PlannedStage) -> bool) -> Needs {
        let mut n = Needs::default();
        for (i, s) in plan.stages.iter().enumerate() {
            let run = to_run(i, s);
            let e = &s.estimate;
            let (disk, memory, gpu) = if run {
                (e.disk_bytes, e.memory_bytes, e.gpu_bytes)
            } else {
                (0, 0, 0)
            };
            n.disk += disk;
            n.memory = n.memory.max(memory);
            n.stages.push(StageNeed {
                name: s.name.clone(),
                key: s.key.clone(),
                to_run: run,
                disk,
                memory,
                gpu,
                kind: s.kind,
            });
        }
        if n.stages.iter().any(|s| s.to_run) {
            n.disk += REPORT_BYTES;
        }
        n
    }

    /// The plan's stages that are not done.
    pub fn not_done(plan: &Plan) -> Needs {
        Needs::of(plan, |_, s| {
            !matches!(stage_state(&s.dir), Ok(StageState::Done(_)))
        })
    }

    /// The stages to run that use a GPU, with their GPU memory.
    pub fn gpu_stages(&self) -> impl Iterator<Item = &StageNeed> {
        self.stages.iter().filter(|s| s.gpu > 0)
    }
}

/// What this machine lacks for `needs`: a writable work dir, the free disk there, the
/// available memory; and, on any machine, `run.disk_budget`. `plan_only` (planning for another
/// machine) checks the budget only.
pub fn machine_problems(cfg: &Config, needs: &Needs, plan_only: bool) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    if !plan_only {
        problems.extend(check_writable(&cfg.workdir));
        let free = crate::machine::free_disk_bytes(&cfg.workdir)?;
        if needs.disk > free {
            problems.push(format!(
                "the run needs about {} of disk but {} has {} free",
                format_bytes(needs.disk),
                cfg.workdir.display(),
                format_bytes(free)
            ));
        }
        if let Some(avail) = crate::machine::available_memory_bytes() {
            if needs.memory > avail {
                problems.push(format!(
                    "a stage needs about {} of memory but {} is available",
                    format_bytes(needs.memory),
                    format_bytes(avail)
                ));
            }
        }
    }
    if let Some(budget) = cfg.disk_budget_bytes {
        if needs.disk > budget {
            problems.push(format!(
                "the run needs about {} of disk, over run.disk_budget = {}",
                format_bytes(needs.disk),
                format_bytes(budget)
            ));
        }
    }
    Ok(problems)
}

/// The GPU stages of `needs` that do not fit `have` bytes of GPU memory (on the GPU `what`),
/// each with what would make it fit.
pub fn gpu_problems(needs: &Needs, what: &str, have: u64) -> Vec<String> {
    needs
        .gpu_stages()
        .filter(|s| s.gpu > have)
        .map(|s| {
            let hint = match s.kind {
                StageKind::Train | StageKind::Pretrain => {
                    "see its budget: `pipeline train` prints it line by line; recompute = true \
                     (with a smaller kept_layers, or none set), a smaller micro_batch_tokens or \
                     loss_chunk_tokens, optimizer_offload = true, or a larger GPU"
                }
                _ => {
                    "the weights in bf16, the CUDA context and the least KV cache that runs \
                     max_num_seqs sequences of max_new_tokens; lower max_num_seqs or \
                     max_new_tokens, kv_cache_dtype = \"fp8\", or a larger GPU"
                }
            };
            format!(
                "the {} stage needs about {} of GPU memory but {what} has {} ({hint})",
                s.name,
                format_bytes(s.gpu),
                format_bytes(have)
            )
        })
        .collect()
}

/// This machine's first GPU and its total memory, when this binary opens one.
pub fn local_gpu_memory() -> Result<Option<(String, u64)>> {
    #[cfg(feature = "cuda")]
    {
        if let Ok(dev) = crate::cuda::sampler_device(0) {
            let (_, total) = crate::cuda::memory_info(&dev)?;
            return Ok(Some((crate::train::memory::device_name(&dev), total)));
        }
    }
    Ok(None)
}

/// Refuses a run whose stages to run (`to_run`, by index) do not fit this machine, before any
/// of them starts: the checks of `pipeline preflight`, one error with every problem.
pub fn check_run(
    cfg: &Config,
    plan: &Plan,
    to_run: impl Fn(usize, &PlannedStage) -> bool,
) -> Result<()> {
    let needs = Needs::of(plan, to_run);
    if !needs.stages.iter().any(|s| s.to_run) {
        return Ok(());
    }
    let mut problems = machine_problems(cfg, &needs, false)?;
    if needs.gpu_stages().next().is_some() {
        if let Some((what, have)) = local_gpu_memory()? {
            problems.extend(gpu_problems(&needs, &what, have));
        }
    }
    if !problems.is_empty() {
        anyhow::bail!(
            "this run would not fit, so no stage was started (`pipeline preflight` prints every \
             estimate):\n  - {}",
            problems.join("\n  - ")
        );
    }
    Ok(())
}

/// A test write where the work dir is (or, not yet made, in its nearest existing folder): a
/// read-only file system or an unwritable parent fails here rather than at the first stage.
fn check_writable(workdir: &Path) -> Option<String> {
    let mut at = workdir;
    while !at.exists() {
        at = at.parent()?;
    }
    let probe = at.join(format!(".preflight-write-{}", std::process::id()));
    match std::fs::write(&probe, b"x") {
        Ok(()) => {
            let _ = std::fs::remove_file(&probe);
            None
        }
        Err(e) => Some(format!(
            "the work dir {} cannot be written (a test file in {}: {e})",
            workdir.display(),
            at.display()
        )),
    }
}

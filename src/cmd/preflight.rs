//! `pipeline preflight`: validates a config, resolves every input, estimates each stage's disk and
//! memory, and checks them against free disk, available RAM and `run.disk_budget`, exiting
//! non-zero with the reason when a run would not fit.
//!
//! The checks themselves are `stages::fit`'s, which `pipeline run` makes too before its first
//! stage. Prints each stage's time and cost estimate (`stages::cost`). Cached stages need nothing new. Estimates come from input sizes (see each stage's `plan`), so
//! they are coarse; the check exists to catch the run that cannot fit, hours before it fails.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use crate::bytes::format_bytes;
use crate::config::Config;
use crate::machine::{available_memory_bytes, free_disk_bytes};
use crate::model::Checkpoint;
use crate::stages::fit::{self, Needs};
use crate::stages::{Plan, Resolve};

#[derive(Debug, clap::Args)]
pub struct PreflightArgs {
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Override a config key, validated like the file: `--set train.lr=2e-5 --set sample.n=16`
    /// (dotted keys; `data.sources.0.limit` for an entry of a list). Without `--workdir` the
    /// run gets a work dir named with its overrides.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Plan for another machine (a GPU box): validate and estimate, but do not compare the
    /// estimates with this machine's free disk and memory (`run.disk_budget` still applies).
    #[arg(long)]
    pub plan_only: bool,
    /// With --plan-only: the GPU the GPU stages are planned for (h100, h200, b200, a100,
    /// or its memory, e.g. 80GB); their memory is checked against it. Several, comma-separated
    /// (h100,h200,b200), compare the job's time, GPU hours and cost on each.
    #[arg(long, requires = "plan_only")]
    pub gpu: Option<String>,
}

pub fn run(a: &PreflightArgs) -> Result<()> {
    let cfg = super::load_config(a.config.clone(), a.workdir.clone(), &a.set)?;
    check(&cfg, a.plan_only, a.gpu.as_deref())
}

/// `plan_only`: skip the comparison with this machine's free disk and memory; `gpu` (with it):
/// the GPU the GPU stages are checked against (a name of `train::memory::GPUS` or a size).
/// Without `plan_only`, a GPU stage is checked against its device's memory when this binary
/// can open it.
pub fn check(cfg: &Config, plan_only: bool, gpu: Option<&str>) -> Result<()> {
    let gpus: Vec<crate::train::memory::Gpu> = gpu
        .map(|g| {
            g.split(',')
                .map(|x| crate::train::memory::parse_gpu(x.trim()))
                .collect::<Result<Vec<_>>>()
        })
        .transpose()?
        .unwrap_or_default();
    let gpu = gpus.first().copied();
    crate::outln!("config {}: valid", cfg.origin);
    // a hub model that is not downloaded is planned from its built-in card (config only)
    let plan = Plan::build_with(cfg, &cfg.workdir, Resolve { preflight: true })?;
    note_provisional_inputs(&plan);
    crate::outln!(
        "inputs: all {} resolved",
        plan.stages.iter().map(|s| s.inputs.len()).sum::<usize>()
    );
    let needs = Needs::not_done(&plan);
    print_needs(&needs);
    let free_disk = free_disk_bytes(&cfg.workdir)?;
    let avail_mem = available_memory_bytes();
    crate::outln!(
        "needs {} of disk (free at {}: {}) and {} of memory (available: {})",
        format_bytes(needs.disk),
        cfg.workdir.display(),
        format_bytes(free_disk),
        format_bytes(needs.memory),
        avail_mem.map(format_bytes).unwrap_or("unknown".into())
    );
    let mut problems = check_models(cfg, &plan);
    problems.extend(fit::machine_problems(cfg, &needs, plan_only)?);
    // several GPUs named: which of them the GPU stages fit on (the comparison says), failing
    // only when none does
    let gpu_stages = needs.gpu_stages().count() > 0;
    let mut fits: Vec<Option<String>> = Vec::new();
    if gpus.len() > 1 && gpu_stages {
        fits = fit_each_gpu(&needs, &gpus, &mut problems);
    } else if gpu_stages {
        match gpu_memory(plan_only, gpu)? {
            Some((what, have)) => {
                crate::outln!("GPU memory: {what}: {}", format_bytes(have));
                problems.extend(fit::gpu_problems(&needs, &what, have));
            }
            None => crate::outln!(
                "GPU memory: not checked (name the GPU with --plan-only --gpu h100|h200|b200, \
                 or run preflight on the GPU machine)"
            ),
        }
    }
    use crate::stages::cost;
    let price = cost::price_for(cfg.gpu_hour_price.as_ref(), cost_gpu(gpu));
    let costs = cost::estimate(&plan, cost_gpu(gpu), price);
    if !costs.is_empty() {
        crate::outln!("time and cost of the stages to run:");
        for l in cost::table(&costs, price) {
            crate::outln!("  {l}");
        }
    }
    if gpus.len() > 1 && !costs.is_empty() {
        print_cost_on_each_gpu(cfg, &plan, &gpus, &fits);
    }
    if !problems.is_empty() {
        bail!("preflight failed:\n  - {}", problems.join("\n  - "));
    }
    if plan_only {
        crate::outln!(
            "preflight ok (plan only: not checked against this machine's disk and memory)"
        );
    } else {
        crate::outln!("preflight ok");
    }
    Ok(())
}

/// Notes the inputs whose stage keys are provisional: hub models not downloaded, planned from
/// their built-in cards.
fn note_provisional_inputs(plan: &Plan) {
    for s in &plan.stages {
        for i in s.inputs.iter().filter(|i| {
            i.location.ends_with("(built-in card: not downloaded)")
                || i.location.ends_with(crate::stages::NOT_DOWNLOADED)
        }) {
            crate::outln!(
                "note: {} of {}: {}; its stage keys are provisional",
                i.name,
                s.name,
                i.location
            );
        }
    }
}

/// Each stage's needs: its state, disk, memory and GPU memory.
fn print_needs(needs: &Needs) {
    crate::outln!(
        "{:<11} {:<12} {:<12} {:>12} {:>12} {:>12}",
        "stage",
        "key",
        "state",
        "disk",
        "memory",
        "GPU memory"
    );
    for s in &needs.stages {
        crate::outln!(
            "{:<11} {:<12} {:<12} {:>12} {:>12} {:>12}",
            s.name,
            s.key.get(..12).unwrap_or(&s.key),
            if s.to_run { "to run" } else { "cached" },
            format_bytes(s.disk),
            format_bytes(s.memory),
            if s.gpu > 0 {
                format_bytes(s.gpu)
            } else {
                "-".into()
            }
        );
    }
}

/// Which of several GPUs the GPU stages fit on (said per GPU): per GPU, what does not fit; a
/// problem when none fits.
fn fit_each_gpu(
    needs: &Needs,
    gpus: &[crate::train::memory::Gpu],
    problems: &mut Vec<String>,
) -> Vec<Option<String>> {
    let mut fits = Vec::new();
    for g in gpus {
        let over: Vec<String> = needs
            .gpu_stages()
            .filter(|s| s.gpu > g.memory)
            .map(|s| format!("{} needs {}", s.name, format_bytes(s.gpu)))
            .collect();
        crate::outln!(
            "GPU memory: {}: {}: {}",
            g.name,
            format_bytes(g.memory),
            if over.is_empty() {
                "every GPU stage fits".to_string()
            } else {
                format!("does not fit ({})", over.join(", "))
            }
        );
        fits.push((!over.is_empty()).then(|| over.join(", ")));
    }
    if fits.iter().all(Option::is_some) {
        problems.push(format!(
            "the GPU stages fit on none of {}: see the lines above",
            gpus.iter().map(|g| g.name).collect::<Vec<_>>().join(", ")
        ));
    }
    fits
}

/// The job's time and cost on each of several GPUs, at each GPU's rates (`fits`: what does not
/// fit on each).
fn print_cost_on_each_gpu(
    cfg: &Config,
    plan: &Plan,
    gpus: &[crate::train::memory::Gpu],
    fits: &[Option<String>],
) {
    use crate::stages::cost;
    let rows: Vec<cost::GpuRow> = gpus
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let price = cost::price_for(cfg.gpu_hour_price.as_ref(), Some(*g));
            cost::GpuRow::of(
                g,
                &cost::estimate(plan, Some(*g), price),
                price,
                fits.get(i).cloned().flatten(),
            )
        })
        .collect();
    crate::outln!("the job on each GPU (GPU stages at that GPU's rates):");
    for l in cost::gpu_table(&rows) {
        crate::outln!("  {l}");
    }
}

/// What would make loading each input model fail at a stage's start ([`Checkpoint::verify`]:
/// whole weight files, tensors of the config's shapes, a tokenizer that parses) and, where the
/// config samples with `chat`, a chat template that parses. Models that are a stage's output,
/// or a built-in card standing for one not downloaded, are not there to check.
fn check_models(cfg: &Config, plan: &Plan) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let uses_chat = cfg
        .sample
        .as_ref()
        .is_some_and(|s| s.prompt_template == "chat")
        || cfg.eval.is_some();
    let mut problems = Vec::new();
    for i in plan.stages.iter().flat_map(|s| &s.inputs) {
        if i.name != "model" || !Path::new(&i.location).is_dir() || !seen.insert(&i.location) {
            continue;
        }
        let checked = Checkpoint::open(&i.location).and_then(|c| {
            c.verify()?;
            if uses_chat {
                if let Ok(t) = c.chat_template() {
                    t.check_syntax()?;
                }
            }
            Ok(())
        });
        if let Err(e) = checked {
            problems.push(format!("model {}: {e:#}", i.location));
        }
    }
    problems
}

/// The GPU memory GPU stages are checked against, and what it is: the named GPU, or (not
/// planning for another machine) the first device's total memory when this binary opens it.
fn gpu_memory(
    plan_only: bool,
    gpu: Option<crate::train::memory::Gpu>,
) -> Result<Option<(String, u64)>> {
    if let Some(g) = gpu {
        return Ok(Some((g.name.to_string(), g.memory)));
    }
    if plan_only {
        return Ok(None);
    }
    fit::local_gpu_memory()
}

/// The GPU the time estimate is for: the named one, else this machine's first device when this
/// binary opens it (an H100 is assumed otherwise, and said).
pub fn cost_gpu(named: Option<crate::train::memory::Gpu>) -> Option<crate::train::memory::Gpu> {
    named.or_else(crate::train::memory::local_gpu)
}

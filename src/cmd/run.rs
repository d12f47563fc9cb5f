//! `pipeline run [STAGE]`: builds the plan of a config (the embedded default without one), runs
//! the stages that are not cached, then writes the report. A shard's run (`--shard`, Slurm or
//! Kubernetes indexed jobs) samples its shard and stops.
//!
//! Knows nothing of what the stages do: the plan and runner are `stages`.

use std::path::PathBuf;

use anyhow::Result;

use crate::jobs::sample::shard::resolve_shard;
use crate::stages::{self, Target};

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// `all`, or one stage (it runs with the stages before it).
    #[arg(default_value = "all")]
    pub stage: String,
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Overrides `run.workdir`.
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Override a config key, validated like the file: `--set train.lr=2e-5 --set sample.n=16`
    /// (dotted keys; `data.sources.0.limit` for an entry of a list). Without `--workdir` the
    /// run gets a work dir named with its overrides.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Re-run this stage and every stage after it, even if cached (repeatable).
    #[arg(long)]
    pub force: Vec<String>,
    /// Run one shard of the sample stage, I/N, and stop (also from SLURM_ARRAY_TASK_ID /
    /// SLURM_ARRAY_TASK_COUNT, or JOB_COMPLETION_INDEX with --num-shards or
    /// SELFDISTILL_NUM_SHARDS); a later run without a shard joins the shards and goes on.
    #[arg(long)]
    pub shard: Option<String>,
    /// Shard count with JOB_COMPLETION_INDEX (Kubernetes indexed Jobs).
    #[arg(long)]
    pub num_shards: Option<usize>,
}

pub fn run(a: &RunArgs) -> Result<()> {
    let cfg = super::load_config(a.config.clone(), a.workdir.clone(), &a.set)?;
    let target = if a.stage == "all" {
        Target::All
    } else {
        Target::Stage(a.stage.clone())
    };
    let shard = resolve_shard(a.shard.as_deref(), a.num_shards)?;
    if !stages::run(&cfg, &target, &a.force, shard)? {
        return Ok(());
    }
    // the stages are done and stay done whatever happens here; the run promised a report, so a
    // report that cannot be written fails the command (`pipeline report` writes it again)
    let p = crate::report::write(&cfg.workdir).map_err(|e| {
        e.context(format!(
            "every stage is done, but the report could not be written (`pipeline report \
             --workdir {}` writes it again)",
            cfg.workdir.display()
        ))
    })?;
    crate::outln!("report: {}", p.display());
    Ok(())
}

//! `pipeline`: the one binary. Parses arguments with clap, dispatches to the stage runner or a
//! command in `cmd`, and prints an error chain once with a non-zero exit.
//!
//! Knows nothing beyond argument shapes; every behaviour lives in the library.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

use selfdistill::cmd;
use selfdistill::config::Config;
use selfdistill::stages::{self, Target};

#[derive(Parser)]
#[command(
    name = "pipeline",
    version,
    about = "Math self-distillation: sample, verify, filter, train, evaluate"
)]
struct Cli {
    /// More log detail (-v debug, -vv trace); RUST_LOG, when set, decides instead.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Less: -q warnings and errors only (and no progress bars), -qq errors only.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    quiet: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build the plan from a config, print it, and run the stages that are not cached.
    Run {
        /// `all`, or one stage (it runs with the stages before it).
        #[arg(default_value = "all")]
        stage: String,
        #[arg(long)]
        config: Option<PathBuf>,
        /// Overrides `run.workdir`.
        #[arg(long)]
        workdir: Option<PathBuf>,
        /// Re-run this stage and every stage after it, even if cached (repeatable).
        #[arg(long)]
        force: Vec<String>,
        /// Run one shard of the sample stage, I/N, and stop (also from SLURM_ARRAY_TASK_ID /
        /// SLURM_ARRAY_TASK_COUNT, or JOB_COMPLETION_INDEX with --num-shards or
        /// SELFDISTILL_NUM_SHARDS); a later run without a shard joins the shards and goes on.
        #[arg(long)]
        shard: Option<String>,
        /// Shard count with JOB_COMPLETION_INDEX (Kubernetes indexed Jobs).
        #[arg(long)]
        num_shards: Option<usize>,
    },
    /// Show each stage of a work dir: done / running / stalled / stopped / not started, with its
    /// progress, rate and ETA, rows, bytes and time (--watch, --json).
    Status(cmd::status::StatusArgs),
    /// Rebuild a work dir's report (report/report.md and its charts) from its stages.
    Report {
        #[arg(long)]
        workdir: Option<PathBuf>,
        /// Take the work dir from this config (`run.workdir`, or `runs/<name>`).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Validate a config, resolve its inputs, and check disk and memory before a run.
    Preflight {
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long)]
        workdir: Option<PathBuf>,
        /// Plan for another machine (a GPU box): validate and estimate, but do not compare the
        /// estimates with this machine's free disk and memory (`run.disk_budget` still applies).
        #[arg(long)]
        plan_only: bool,
        /// With --plan-only: the GPU the GPU stages are planned for (h100, h200, b200, a100,
        /// or its memory, e.g. 80GB); their memory is checked against it.
        #[arg(long, requires = "plan_only")]
        gpu: Option<String>,
    },
    /// Sample completions for the problems of a file and write the completions Parquet.
    Sample(Box<cmd::sample::SampleArgs>),
    /// Evaluate models on eval sets (evals/*.toml): pass@1 with 95% intervals, maj@n, pass@k.
    Eval(Box<cmd::eval::EvalArgs>),
    /// Fine-tune every weight of a model on SFT rows and write it in Hugging Face layout.
    Train(Box<cmd::train::TrainArgs>),
    /// Join the outputs of a sharded `pipeline sample` run; refuses incomplete sets.
    Merge {
        #[arg(long)]
        output: PathBuf,
        /// The shard outputs (all N of them).
        inputs: Vec<PathBuf>,
    },
    /// Grade any completions file (JSONL or Parquet) against gold answers with our verifier.
    Grade(cmd::grade::GradeArgs),
    /// Work with data files.
    Data {
        #[command(subcommand)]
        command: DataCommand,
    },
    /// Benchmarks that print figures.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
}

#[derive(Subcommand)]
enum DataCommand {
    /// Schema, row count and the first rows of a JSONL or Parquet file.
    Inspect {
        file: PathBuf,
        /// How many rows to show.
        #[arg(long, default_value_t = 3)]
        rows: usize,
    },
    /// Generate the arithmetic word problems of a spec (levels, splits, seed) as
    /// `<output>/<split>.jsonl`: the embedded default's data (data/arith/spec.toml).
    Arith {
        /// The spec: `seed`, `[[levels]]` and `[[splits]]`.
        #[arg(long, default_value = "data/arith/spec.toml")]
        spec: PathBuf,
        /// Where the splits go; default: the spec's folder.
        #[arg(long)]
        output: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Verifier accuracy on reference solutions, false-accept rate, and checks per second.
    Verify(cmd::bench::VerifyBenchArgs),
    /// Sampler prefill and decode tokens/s on a random model of a given shape.
    Sample(cmd::bench_sample::SampleBenchArgs),
    /// Training tokens/s and step peak memory on a random model, with and without recompute and
    /// the chunked loss.
    Train(cmd::bench_train::TrainBenchArgs),
    /// Decode attention over the paged KV cache alone, against the machine's bandwidth (the CPU
    /// backend over every layer, or each GPU kernel variant with `--device cuda`).
    Attention(cmd::bench_attention::AttentionBenchArgs),
}

fn load_config(path: Option<PathBuf>, workdir: Option<PathBuf>) -> Result<Config> {
    let mut cfg = match path {
        Some(path) => Config::load(&path)?,
        None => Config::embedded_default()?,
    };
    if let Some(w) = workdir {
        cfg.workdir = w;
    }
    Ok(cfg)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    selfdistill::logging::init(cli.verbose.min(2) as i8 - cli.quiet.min(2) as i8);
    let result = match cli.command {
        Command::Run {
            stage,
            config,
            workdir,
            force,
            shard,
            num_shards,
        } => load_config(config, workdir).and_then(|cfg| {
            let target = if stage == "all" {
                Target::All
            } else {
                Target::Stage(stage)
            };
            let shard = selfdistill::jobs::sample::resolve_shard(shard.as_deref(), num_shards)?;
            if !stages::run(&cfg, &target, &force, shard)? {
                return Ok(());
            }
            // the stages are done whatever happens here: a report that cannot be drawn is a
            // warning
            match selfdistill::report::write(&cfg.workdir) {
                Ok(p) => println!("report: {}", p.display()),
                Err(e) => eprintln!("warning: no report: {e:#}"),
            }
            Ok(())
        }),
        Command::Status(args) => {
            let cfg = match (&args.config, &args.workdir) {
                (Some(p), w) => load_config(Some(p.clone()), w.clone()).map(Some),
                (None, Some(_)) => Ok(None),
                // the embedded default's work dir, as `run all` with no config
                (None, None) => load_config(None, None).map(Some),
            };
            cfg.and_then(|cfg| cmd::status::run(&args, cfg.as_ref()))
        }
        Command::Report { workdir, config } => {
            let dir = match (workdir, config) {
                (Some(w), None) => Ok(w),
                (w, Some(c)) => load_config(Some(c), w).map(|cfg| cfg.workdir),
                // the embedded default's, as `run all` with no config
                (None, None) => load_config(None, None).map(|cfg| cfg.workdir),
            };
            dir.and_then(|d| selfdistill::report::write(&d))
                .map(|p| println!("wrote {}", p.display()))
        }
        Command::Preflight {
            config,
            workdir,
            plan_only,
            gpu,
        } => load_config(config, workdir)
            .and_then(|cfg| cmd::preflight::run(&cfg, plan_only, gpu.as_deref())),
        Command::Grade(args) => cmd::grade::run(&args),
        Command::Sample(args) => cmd::sample::run(&args),
        Command::Eval(args) => cmd::eval::run(&args),
        Command::Train(args) => cmd::train::run(&args),
        Command::Merge { output, inputs } => selfdistill::jobs::sample::merge(&inputs, &output)
            .map(|n| {
                println!(
                    "merged {} shards, {n} rows -> {}",
                    inputs.len(),
                    output.display()
                );
            }),
        Command::Data {
            command: DataCommand::Inspect { file, rows },
        } => cmd::inspect::run(&file, rows),
        Command::Data {
            command: DataCommand::Arith { spec, output },
        } => selfdistill::arith::ArithSpec::load(&spec).and_then(|s| {
            let dir = output.unwrap_or_else(|| spec.parent().unwrap_or(Path::new(".")).into());
            for (path, rows) in s.write(&dir)? {
                println!("{rows:>6} problems -> {}", path.display());
            }
            Ok(())
        }),
        Command::Bench {
            command: BenchCommand::Verify(args),
        } => cmd::bench::verify(&args),
        Command::Bench {
            command: BenchCommand::Sample(args),
        } => cmd::bench_sample::run(&args),
        Command::Bench {
            command: BenchCommand::Train(args),
        } => cmd::bench_train::run(&args),
        Command::Bench {
            command: BenchCommand::Attention(args),
        } => cmd::bench_attention::run_attention(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

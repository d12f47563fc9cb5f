//! `pipeline`: the one binary. Parses arguments with clap, dispatches to a command in `cmd`, and
//! prints an error chain once with a non-zero exit.
//!
//! Knows nothing beyond argument shapes; every behaviour, the commands included, lives in the
//! library.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use selfdistill::cmd;

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
    Run(cmd::run::RunArgs),
    /// Show each stage of a work dir: done / running / stalled / stopped / not started, with its
    /// progress, rate and ETA, rows, bytes and time (--watch, --json).
    Status(cmd::status::StatusArgs),
    /// Rebuild a work dir's report (report/report.md and its charts) from its stages.
    Report(cmd::report::ReportArgs),
    /// Runs side by side: each eval set's pass@1 with intervals for every run, the config keys
    /// in which they differ, and their cost (Markdown and a PNG chart).
    Compare(cmd::compare::CompareArgs),
    /// Validate a config, resolve its inputs, and check disk and memory before a run.
    Preflight(cmd::preflight::PreflightArgs),
    /// Sample completions for the problems of a file and write the completions Parquet.
    Sample(Box<cmd::sample::SampleArgs>),
    /// Evaluate models on eval sets (evals/*.toml): pass@1 with 95% intervals, maj@n, pass@k.
    Eval(Box<cmd::eval::EvalArgs>),
    /// Fine-tune every weight of a model on SFT rows and write it in Hugging Face layout.
    Train(Box<cmd::train::TrainArgs>),
    /// Join the outputs of a sharded `pipeline sample` run; refuses incomplete sets.
    Merge(cmd::merge::MergeArgs),
    /// Grade any completions file (JSONL or Parquet) against gold answers with our verifier.
    Grade(cmd::grade::GradeArgs),
    /// Work with data files.
    Data {
        #[command(subcommand)]
        command: cmd::data::DataCommand,
    },
    /// Benchmarks that print figures.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
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
    /// Write a random-weight model of a benchmark shape as a Hugging Face folder (the input of
    /// whole jobs that measure speed and memory at real shapes).
    Checkpoint(cmd::bench_checkpoint::CheckpointArgs),
    /// Decontamination: the n-gram index of the eval sets, and training problems checked per
    /// second.
    Decontaminate(cmd::decontaminate::DecontaminateBenchArgs),
}

fn main() -> ExitCode {
    // the matches too: `pipeline eval` and `pipeline train` ask which of their flags were typed
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    selfdistill::logging::init(cli.verbose.min(2) as i8 - cli.quiet.min(2) as i8);
    let result = match &cli.command {
        Command::Run(a) => cmd::run::run(a),
        Command::Status(a) => cmd::status::run(a),
        Command::Report(a) => cmd::report::run(a),
        Command::Compare(a) => cmd::compare::run(a),
        Command::Preflight(a) => cmd::preflight::run(a),
        Command::Sample(a) => cmd::sample::run(a),
        Command::Eval(a) => {
            cmd::eval::run(a, matches.subcommand_matches("eval").unwrap_or(&matches))
        }
        Command::Train(a) => {
            cmd::train::run(a, matches.subcommand_matches("train").unwrap_or(&matches))
        }
        Command::Merge(a) => cmd::merge::run(a),
        Command::Grade(a) => cmd::grade::run(a),
        Command::Data { command } => cmd::data::run(command),
        Command::Bench { command } => match command {
            BenchCommand::Verify(a) => cmd::bench::verify(a),
            BenchCommand::Sample(a) => cmd::bench_sample::run(a),
            BenchCommand::Train(a) => cmd::bench_train::run(a),
            BenchCommand::Attention(a) => cmd::bench_attention::run_attention(a),
            BenchCommand::Checkpoint(a) => cmd::bench_checkpoint::run(a),
            BenchCommand::Decontaminate(a) => cmd::decontaminate::bench(a),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", selfdistill::logging::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

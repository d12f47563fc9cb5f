//! The commands of the `pipeline` binary, one file each: `run`, `status`, `report`,
//! `preflight`, `sample`, `eval`, `train`, `merge`, `grade`, `data`, `bench`, `compare`. Each takes its
//! parsed arguments (an `*Args` struct that `main.rs` flattens into its subcommands), does its
//! work through the library, and prints.
//!
//! Only `run` writes stages (through [`crate::stages`]); the others read files or the work dir,
//! or write the files they are asked for.

pub mod bench;
pub mod bench_attention;
pub mod bench_checkpoint;
pub mod bench_count;
pub mod bench_sample;
pub mod bench_train;
pub mod compare;
pub mod data;
pub mod decontaminate;
pub mod eval;
pub mod grade;
pub mod inspect;
pub mod merge;
pub mod preflight;
pub mod report;
pub mod run;
pub mod sample;
pub mod status;
pub mod train;

use std::path::PathBuf;

use anyhow::Result;

use crate::config::Config;

/// Whether the flag with this id was typed (not its default): what a command lays over the
/// settings of a file, or of each eval set.
pub fn typed(matches: &clap::ArgMatches, id: &str) -> bool {
    matches.try_get_raw(id).is_ok_and(|v| v.is_some())
        && matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
}

/// A count flag that must be 1 or more (`--limit`, `--stop-after`): 0 would do nothing, or
/// (read as "no limit") everything, and neither is what was asked.
pub fn at_least_one<T: std::str::FromStr + PartialOrd + From<u8>>(s: &str) -> Result<T, String> {
    let v: T = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a whole number"))?;
    if v < T::from(1) {
        return Err(format!("`{s}`: give 1 or more"));
    }
    Ok(v)
}

/// The config at `path`, or the embedded default without one, with the `--set` overrides;
/// `workdir` overrides its `run.workdir` (without it, a run with overrides gets a work dir of
/// its own: see [`crate::config::overrides::workdir_with`]).
pub fn load_config(
    path: Option<PathBuf>,
    workdir: Option<PathBuf>,
    sets: &[String],
) -> Result<Config> {
    let mut cfg = match path {
        Some(path) => Config::load_with(&path, sets)?,
        None => Config::embedded_default_with(sets)?,
    };
    match workdir {
        Some(w) => cfg.workdir = w,
        None => cfg.workdir = crate::config::overrides::workdir_with(&cfg.workdir, sets),
    }
    // Stage records, plans and model inputs name their folders as text: a path that is not
    // UTF-8 would come back as another path ("no checkpoint folder") stages later.
    if cfg.workdir.to_str().is_none() {
        anyhow::bail!(
            "work dir {}: the path is not valid UTF-8, which the stage records cannot name; \
             choose a UTF-8 path (--workdir or run.workdir)",
            cfg.workdir.display()
        );
    }
    Ok(cfg)
}

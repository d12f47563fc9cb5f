//! `pipeline data`: work with data files: `inspect` (schema, rows; see [`super::inspect`]) and
//! `arith` (the embedded default's generated problems, see `arith`) and `decontaminate` (training
//! rows that match eval problems, see [`super::decontaminate`]).

use std::path::{Path, PathBuf};

use anyhow::Result;

#[derive(Debug, clap::Subcommand)]
pub enum DataCommand {
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
    /// Check a training file against eval sets or files by word n-grams and exact normalised
    /// match (the filter stage's decontamination): prints the overlap per set, writes the rows
    /// that match nothing to --output and the matches to --matches.
    Decontaminate(super::decontaminate::DecontaminateArgs),
}

pub fn run(c: &DataCommand) -> Result<()> {
    match c {
        DataCommand::Inspect { file, rows } => super::inspect::run(file, *rows),
        DataCommand::Decontaminate(a) => super::decontaminate::run(a),
        DataCommand::Arith { spec, output } => {
            let s = crate::arith::ArithSpec::load(spec)?;
            let dir = output
                .clone()
                .unwrap_or_else(|| spec.parent().unwrap_or(Path::new(".")).into());
            for (path, rows) in s.write(&dir)? {
                crate::outln!("{rows:>6} problems -> {}", path.display());
            }
            Ok(())
        }
    }
}

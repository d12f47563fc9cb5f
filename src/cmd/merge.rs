//! `pipeline merge`: joins the outputs of a sharded `pipeline sample` run into one completions
//! file; refuses incomplete sets (the join is `jobs::sample::shard::merge`).

use std::path::PathBuf;

use anyhow::Result;

#[derive(Debug, clap::Args)]
pub struct MergeArgs {
    #[arg(long)]
    pub output: PathBuf,
    /// The shard outputs (all N of them).
    pub inputs: Vec<PathBuf>,
}

pub fn run(a: &MergeArgs) -> Result<()> {
    let inputs: Vec<&std::path::Path> = a.inputs.iter().map(PathBuf::as_path).collect();
    crate::store::check_output_file(&a.output, &inputs, "--output")?;
    let n = crate::jobs::sample::shard::merge(&a.inputs, &a.output)?;
    crate::outln!(
        "merged {} shards, {n} rows -> {}",
        a.inputs.len(),
        a.output.display()
    );
    Ok(())
}

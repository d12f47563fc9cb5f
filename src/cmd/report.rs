//! `pipeline report`: rebuilds a work dir's report (`report/report.md` and its charts) from its
//! stages. The drawing is `report`; this only finds the work dir.

use std::path::PathBuf;

use anyhow::Result;

#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Override a config key, validated like the file: `--set train.lr=2e-5 --set sample.n=16`
    /// (dotted keys; `data.sources.0.limit` for an entry of a list). Without `--workdir` the
    /// run gets a work dir named with its overrides.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Take the work dir from this config (`run.workdir`, or `runs/<name>`).
    #[arg(long)]
    pub config: Option<PathBuf>,
}

pub fn run(a: &ReportArgs) -> Result<()> {
    let dir = match (&a.workdir, &a.config) {
        (Some(w), None) => w.clone(),
        (w, Some(c)) => super::load_config(Some(c.clone()), w.clone(), &a.set)?.workdir,
        // the embedded default's, as `run all` with no config
        (None, None) => super::load_config(None, None, &a.set)?.workdir,
    };
    let p = crate::report::write(&dir)?;
    crate::outln!("wrote {}", p.display());
    Ok(())
}

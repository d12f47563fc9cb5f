//! `pipeline report`: rebuilds a work dir's report (`report/report.md` and its charts) from its
//! stages. The drawing is `report`; this only finds the work dir.

use std::path::PathBuf;

use anyhow::Result;

#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Take the work dir from this config (`run.workdir`, or `runs/<name>`).
    #[arg(long)]
    pub config: Option<PathBuf>,
}

pub fn run(a: &ReportArgs) -> Result<()> {
    let dir = match (&a.workdir, &a.config) {
        (Some(w), None) => w.clone(),
        (w, Some(c)) => super::load_config(Some(c.clone()), w.clone())?.workdir,
        // the embedded default's, as `run all` with no config
        (None, None) => super::load_config(None, None)?.workdir,
    };
    let p = crate::report::write(&dir)?;
    crate::outln!("wrote {}", p.display());
    Ok(())
}

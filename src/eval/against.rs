//! What decontamination checks training problems against: eval sets (by name, group or
//! definition file) and data files (their problem texts), named as the user wrote them.
//!
//! Resolution of one entry: a group name ([`super::GROUPS`]) is its sets; a path ending in
//! `.toml` is a set definition; a path with a data extension (`.jsonl`, `.json`, `.parquet`, ...)
//! is a data file whose problem field is found by [`decontaminate::read_problem_texts`]; anything
//! else is a set name ([`EvalSet::find`]). Paths resolve against `base`. Knows nothing of stages;
//! the matching itself is [`crate::data::decontaminate`].

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::{EvalSet, GROUPS};
use crate::data::decontaminate::{self, Reference};

/// One thing to check training problems against.
#[derive(Debug, Clone)]
pub enum Against {
    Set(Box<EvalSet>),
    File { name: String, path: PathBuf },
}

const DATA_EXTENSIONS: &[&str] = &["jsonl", "ndjson", "json", "parquet", "pq"];

impl Against {
    /// The entries, resolved; the same set or file named twice is kept once.
    pub fn resolve(entries: &[String], base: &Path) -> Result<Vec<Against>> {
        let mut out: Vec<Against> = Vec::new();
        for e in entries {
            let ext = Path::new(e)
                .extension()
                .map(|x| x.to_string_lossy().to_ascii_lowercase());
            let found = if let Some((_, members)) = GROUPS.iter().find(|(g, _)| g == e) {
                members
                    .iter()
                    .map(|m| Ok(Against::Set(Box::new(EvalSet::find(m)?))))
                    .collect::<Result<Vec<_>>>()?
            } else if ext.as_deref() == Some("toml") {
                vec![Against::Set(Box::new(EvalSet::load(
                    &crate::data::source::resolve(base, e),
                )?))]
            } else if ext.as_deref().is_some_and(|x| DATA_EXTENSIONS.contains(&x)) {
                let path = crate::data::source::resolve(base, e);
                if !path.is_file() {
                    bail!("`{e}`: no such file ({})", path.display());
                }
                vec![Against::File {
                    name: e.clone(),
                    path,
                }]
            } else {
                vec![Against::Set(Box::new(EvalSet::find(e)?))]
            };
            for a in found {
                if !out.iter().any(|o| o.name() == a.name()) {
                    out.push(a);
                }
            }
        }
        Ok(out)
    }

    /// The name counts and reports use: the set's name, or the file as written.
    pub fn name(&self) -> &str {
        match self {
            Against::Set(s) => &s.name,
            Against::File { name, .. } => name,
        }
    }

    /// Every problem's id and text (a set's whole source, whatever an eval `limit` keeps).
    pub fn load(&self) -> Result<Reference> {
        let problems = match self {
            Against::Set(s) => s
                .problems(None)?
                .into_iter()
                .map(|p| (p.problem_id, p.problem))
                .collect(),
            Against::File { path, .. } => decontaminate::read_problem_texts(path, None)
                .with_context(|| format!("decontaminating against {}", self.name()))?
                .1
                .into_iter()
                .map(|r| (r.id, r.text))
                .collect(),
        };
        Ok(Reference {
            name: self.name().to_string(),
            problems,
        })
    }
}

//! How planning finds and fingerprints a stage's inputs: files by content hash, checkpoints by
//! their digest, hub files (downloaded when online; named but not fetched by preflight), models
//! by their built-in card when not downloaded, and the verifier by its compiled-in source.
//!
//! Knows nothing of stages beyond the [`InputRef`]s it hands them.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::store::{self, InputRef};

/// The verifier's source, compiled in: stages whose output depends on it take this as an input,
/// so any change to the verifier re-runs them. Every file of `verify/` but its tests (a test
/// checks it: units, exact evaluation and the arithmetic-step rule decide verdicts too).
const VERIFIER_SOURCES: [&str; 9] = [
    include_str!("../verify/mod.rs"),
    include_str!("../verify/extract.rs"),
    include_str!("../verify/normalize.rs"),
    include_str!("../verify/equiv.rs"),
    include_str!("../verify/expr.rs"),
    include_str!("../verify/eval.rs"),
    include_str!("../verify/units.rs"),
    include_str!("../verify/types.rs"),
    include_str!("../verify/steps.rs"),
];

/// The verifier as a stage input.
pub fn verifier_input() -> InputRef {
    InputRef {
        name: "verifier".into(),
        location: "built in".into(),
        hash: store::hash_json(&serde_json::json!(VERIFIER_SOURCES)),
    }
}

/// How planning finds its inputs. A model: its checkpoint (a hub id is downloaded when online),
/// or, in a `preflight` plan when the checkpoint cannot be had, the built-in card of a
/// well-known hub id ([`crate::model::cards`]): its config, and weights of its dtype's size. A
/// data file: its local path or hub file (downloaded when online), or, in a `preflight` plan
/// when a hub file cannot be had, a provisional input named by its location. Provisional stage
/// keys change once the real files are fingerprinted; a run never plans with them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Resolve {
    pub preflight: bool,
}

/// The end of a provisional input's location (see [`Resolve`]).
pub const NOT_DOWNLOADED: &str = "(not downloaded: planned)";

/// A data location's files as stage inputs named `<name>#i`, each with its path and size;
/// `None` for the path of a provisional hub input (see [`Resolve`]).
pub type LocationInputs = Vec<(InputRef, Option<PathBuf>, u64)>;

/// What planning needs of a model.
#[derive(Debug, Clone)]
pub struct ModelFacts {
    pub config: crate::model::ModelConfig,
    pub weight_bytes: u64,
    pub input: InputRef,
}

impl Resolve {
    /// The files of `location` as inputs named `<name>#i`; `what` names it in errors.
    pub fn location(
        &self,
        name: &str,
        what: &str,
        location: &crate::data::source::Location,
    ) -> Result<LocationInputs> {
        use crate::data::source::Location;
        match crate::data::hub::resolve(location) {
            Ok(files) => files
                .into_iter()
                .enumerate()
                .map(|(i, path)| {
                    let (input, bytes) = file_input(&format!("{name}#{i}"), &path)?;
                    Ok((input, Some(path), bytes))
                })
                .collect(),
            Err(_) if self.preflight && matches!(location, Location::Hub { .. }) => {
                let at = location.describe();
                Ok(vec![(
                    InputRef {
                        name: format!("{name}#0"),
                        location: format!("{at} {NOT_DOWNLOADED}"),
                        hash: store::hash_json(&serde_json::json!(["hub", at])),
                    },
                    None,
                    0,
                )])
            }
            Err(e) => Err(e.context(what.to_string())),
        }
    }

    pub fn facts(&self, model: &str) -> Result<ModelFacts> {
        let err = match crate::model::Checkpoint::open(model) {
            Ok(ck) => {
                let weight_bytes = ck
                    .weights
                    .iter()
                    .filter_map(|w| std::fs::metadata(w).ok())
                    .map(|m| m.len())
                    .sum();
                return Ok(ModelFacts {
                    input: checkpoint_input(&ck)?,
                    config: ck.config,
                    weight_bytes,
                });
            }
            Err(e) => e,
        };
        match (self.preflight, crate::model::cards::card(model)) {
            (true, Some(config)) => {
                let config = config?;
                let bytes = crate::train::checkpoint::config_dtype(&config).size_in_bytes() as u64;
                Ok(ModelFacts {
                    weight_bytes: config.num_params() as u64 * bytes,
                    config,
                    input: InputRef {
                        name: "model".into(),
                        location: format!("{model} (built-in card: not downloaded)"),
                        hash: store::hash_json(&serde_json::json!(["card", model])),
                    },
                })
            }
            _ => Err(err),
        }
    }
}

/// A checkpoint folder as a stage input: the content digest of every file that defines it
/// (weights included; memoised, so an unchanged folder is not read again).
pub fn model_input(model: &str) -> Result<InputRef> {
    checkpoint_input(&crate::model::Checkpoint::open(model)?)
}

fn checkpoint_input(ck: &crate::model::Checkpoint) -> Result<InputRef> {
    Ok(InputRef {
        name: "model".into(),
        location: ck.dir.display().to_string(),
        hash: ck.digest()?.hex,
    })
}

/// A file input: its content hash and size.
pub fn file_input(name: &str, path: &Path) -> Result<(InputRef, u64)> {
    // a FIFO or device would block the hash (and the read) forever
    let bytes = crate::bytes::regular_file(path)?;
    let hash = store::hash_file(path)?;
    Ok((
        InputRef {
            name: name.to_string(),
            location: path.display().to_string(),
            hash,
        },
        bytes,
    ))
}

/// The content of an eval set as a stage input: its definition and its data files.
pub fn eval_set_input(set: &crate::eval::EvalSet, resolve: &Resolve) -> Result<InputRef> {
    let what = format!("eval set `{}`", set.name);
    let files = resolve.location(&set.name, &what, &set.source.location)?;
    let mut parts = vec![store::hash_file(&set.file)?];
    let planned = files.iter().any(|(_, path, _)| path.is_none());
    parts.extend(files.into_iter().map(|(input, _, _)| input.hash));
    let mut location = set.file.display().to_string();
    if planned {
        location = format!(
            "{location}: {} {}",
            set.source.location.describe(),
            NOT_DOWNLOADED
        );
    }
    Ok(InputRef {
        name: format!("set:{}", set.name),
        location,
        hash: store::hash_json(&serde_json::json!(parts)),
    })
}

#[cfg(test)]
mod tests {
    /// Every source file of the verifier is part of its stage input: a verdict decided by a
    /// file left out would not re-run the stages it changes.
    #[test]
    fn the_verifier_input_covers_every_verifier_file() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/verify");
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            // the tests, a file or a folder of them
            if p.file_name()
                .is_some_and(|n| n == "tests.rs" || n == "tests")
            {
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            assert!(
                super::VERIFIER_SOURCES.contains(&text.as_str()),
                "{} is not in VERIFIER_SOURCES",
                p.display()
            );
        }
    }
}

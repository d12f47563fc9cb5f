//! The committed parts of a sampling run (`<output>.parts/part-NNNNNN.parquet`): every finished
//! problem's samples in one part, each part written whole, so a killed run resumes without
//! duplicates or gaps; at the end the parts are joined, in input order, into the output with
//! the file metadata [`super::shard::merge`] reads. `run.json` beside the parts records what
//! defines their samples ([`PartsKey`]): a rerun with other settings, problems or model is
//! refused, never resumed into a mix.
//!
//! Knows nothing of engines; of settings, only the key it is handed.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::data::schema::{
    completions_batch, completions_schema, has_logprobs, read_completions, write_parquet_atomic,
    write_parquet_atomic_kv, Completion, Problem,
};

/// Metadata keys of a completions file, read by `pipeline merge`.
pub const META_SHARD: &str = "selfdistill.shard";
pub const META_SAMPLING_HASH: &str = "selfdistill.sampling_hash";
pub const META_PROBLEMS: &str = "selfdistill.problems";
/// The digest of the problem set a file's shard was cut from (absent in files of older
/// versions).
pub const META_PROBLEM_SET: &str = "selfdistill.problem_set";

/// What defines the samples of a run's parts, as `run.json` beside them: the model (as named,
/// and its files' digest), the problems (a digest of their ids, texts and gold answers, in
/// order), the prompt template, the engine, the thinking budget, the grading, the shard and
/// every sampling parameter.
#[derive(Debug, Clone, Serialize)]
pub struct PartsKey {
    pub model: String,
    pub model_digest: String,
    pub problems: String,
    pub prompt_template: String,
    pub engine: String,
    pub thinking: String,
    pub grading: String,
    pub shard: String,
    #[serde(flatten)]
    pub params: crate::sampler::params::SamplingParams,
}

/// The file of the [`PartsKey`] in the parts folder.
pub const PARTS_KEY: &str = "run.json";

/// A digest of the problems a run samples: their ids, texts and gold answers, in order.
pub fn problems_digest(problems: &[Problem]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for p in problems {
        for field in [&p.problem_id, &p.problem, &p.gold_answer] {
            h.update((field.len() as u64).to_le_bytes());
            h.update(field.as_bytes());
        }
    }
    hex::encode(h.finalize())
}

/// Makes sure the parts in `parts` were committed under `key`: writes `run.json` for a new
/// run; for a resumed one, refuses a key that differs and names the fields. A `run.json` with no
/// part beside it (a run that stopped before committing any: a failed check, a kill during its
/// first problems) holds nothing to mix with, and is replaced. Parts of an older version (no
/// `run.json`) are kept when their rows carry `sampling_hash`.
pub(super) fn check_key(parts: &Path, key: &PartsKey, sampling_hash: &str) -> Result<()> {
    let file = parts.join(PARTS_KEY);
    let new = serde_json::to_value(key)?;
    if part_files(parts)?.is_empty() {
        crate::store::write_json_atomic(&file, &new)?;
        return Ok(());
    }
    let old: serde_json::Value = match std::fs::read(&file) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .with_context(|| format!("{} is not a run record", file.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            for part in part_files(parts)? {
                if let Some(r) = read_completions(&part)?
                    .iter()
                    .find(|r| r.sampling_hash.as_deref() != Some(sampling_hash))
                {
                    bail!(
                        "{} holds samples of other settings (sampling hash {}, not \
                         {sampling_hash}); {}",
                        parts.display(),
                        r.sampling_hash.as_deref().unwrap_or("none"),
                        start_over(parts)
                    );
                }
            }
            crate::store::write_json_atomic(&file, &new)?;
            return Ok(());
        }
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", file.display())),
    };
    let differs: Vec<String> = new
        .as_object()
        .into_iter()
        .flatten()
        .chain(old.as_object().into_iter().flatten())
        .map(|(k, _)| k)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|k| old.get(k.as_str()) != new.get(k.as_str()))
        .map(|k| {
            let show = |v: Option<&serde_json::Value>| {
                let t = match v {
                    None => "unset".to_string(),
                    // an f32 field, as it was written (0.7, not 0.699999988079071)
                    Some(serde_json::Value::Number(n))
                        if n.as_f64()
                            .is_some_and(|f| f64::from(f as f32) == f && !n.is_i64()) =>
                    {
                        (n.as_f64().unwrap_or_default() as f32).to_string()
                    }
                    Some(v) => v.to_string(),
                };
                match t.char_indices().nth(48) {
                    Some((i, _)) => format!("{}...", &t[..i]),
                    None => t,
                }
            };
            format!(
                "{k}: {} -> {}",
                show(old.get(k.as_str())),
                show(new.get(k.as_str()))
            )
        })
        .collect();
    if differs.is_empty() {
        return Ok(());
    }
    bail!(
        "{} holds samples committed with other settings; resuming would mix them ({}); {}",
        parts.display(),
        differs.join("; "),
        start_over(parts)
    )
}

fn start_over(parts: &Path) -> String {
    format!(
        "to start over, delete {} (`pipeline sample --overwrite` does), or write to another \
         output",
        parts.display()
    )
}

/// Where the parts of `output` are committed.
pub fn parts_dir(output: &Path) -> PathBuf {
    let mut s = output.as_os_str().to_owned();
    s.push(".parts");
    PathBuf::from(s)
}

/// What a joined output holds: every committed part's rows, resumed ones included.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OutputCounts {
    pub rows: u64,
    pub correct: u64,
    /// The prompt tokens of its problems, each problem's prompt once (its samples share it).
    pub prompt_tokens: u64,
    /// The tokens of its completions.
    pub generated_tokens: u64,
}

impl OutputCounts {
    /// The counts of `rows`.
    pub fn of(rows: &[Completion]) -> OutputCounts {
        let mut problems = HashSet::new();
        let mut c = OutputCounts::default();
        for r in rows {
            c.rows += 1;
            c.correct += r.grade.as_ref().is_some_and(|g| g.correct) as u64;
            c.generated_tokens += match (&r.completion_token_ids, r.num_completion_tokens) {
                (Some(ids), _) => ids.len() as u64,
                (None, Some(n)) => n.max(0) as u64,
                (None, None) => 0,
            };
            if problems.insert(r.problem_id.as_str()) {
                c.prompt_tokens += r.prompt_token_ids.as_ref().map_or(0, |p| p.len() as u64);
            }
        }
        c
    }
}

/// Joins the committed parts into `output` (atomically) in the problems' order (then sample
/// index), with the shard, sampling hash, problem count and problem set as file metadata;
/// returns what the output holds.
pub(super) fn join_parts(
    parts: &Path,
    problems: &[Problem],
    (shard, set): ((usize, usize), &str),
    logprobs: bool,
    shash: &str,
    output: &Path,
) -> Result<OutputCounts> {
    let order: HashMap<&str, usize> = problems
        .iter()
        .enumerate()
        .map(|(i, p)| (p.problem_id.as_str(), i))
        .collect();
    let mut rows = Vec::new();
    for part in part_files(parts)? {
        rows.extend(read_completions(&part)?);
    }
    rows.sort_by_key(|r| (order.get(r.problem_id.as_str()).copied(), r.sample_index));
    let graded = rows.iter().all(|r| r.grade.is_some());
    let batches = rows
        .chunks(crate::data::schema::ROW_GROUP_ROWS)
        .map(|c| completions_batch(c, graded, logprobs))
        .collect::<Result<Vec<_>>>()?;
    let kv = vec![
        (META_SHARD.to_string(), format!("{}/{}", shard.0, shard.1)),
        (META_SAMPLING_HASH.to_string(), shash.to_string()),
        (META_PROBLEMS.to_string(), problems.len().to_string()),
        (META_PROBLEM_SET.to_string(), set.to_string()),
    ];
    write_parquet_atomic_kv(output, completions_schema(graded, logprobs), &batches, &kv)?;
    Ok(OutputCounts::of(&rows))
}

pub(super) fn part_files(parts: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(parts)
        .with_context(|| format!("cannot read {}", parts.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("part-"))
        })
        .collect();
    files.sort();
    Ok(files)
}

pub(super) fn next_part_index(parts: &Path) -> Result<usize> {
    Ok(part_files(parts)?.len())
}

/// Problem ids whose samples are already committed.
pub(super) fn committed_problems(parts: &Path) -> Result<HashSet<String>> {
    let mut done = HashSet::new();
    for p in part_files(parts)? {
        for r in read_completions(&p)? {
            done.insert(r.problem_id);
        }
    }
    Ok(done)
}

pub(super) fn commit_part(
    parts: &Path,
    next: &mut usize,
    finished: &mut Vec<usize>,
    pending: &mut HashMap<usize, Vec<Completion>>,
) -> Result<()> {
    if finished.is_empty() {
        return Ok(());
    }
    let mut rows = Vec::new();
    for r in finished.drain(..) {
        rows.extend(pending.remove(&r).unwrap_or_default());
    }
    if rows.is_empty() {
        return Ok(());
    }
    let graded = rows.iter().all(|r| r.grade.is_some());
    let logprobs = has_logprobs(&rows);
    let batch = completions_batch(&rows, graded, logprobs)?;
    let path = parts.join(format!("part-{:06}.parquet", *next));
    write_parquet_atomic(&path, completions_schema(graded, logprobs), &[batch])?;
    *next += 1;
    crate::fault::point("sample.part");
    Ok(())
}

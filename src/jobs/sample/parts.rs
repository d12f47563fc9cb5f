//! The committed parts of a sampling run (`<output>.parts/part-NNNNNN.parquet`): every finished
//! problem's samples in one part, each part written whole, so a killed run resumes without
//! duplicates or gaps; at the end the parts are joined, in input order, into the output with
//! the file metadata [`super::shard::merge`] reads.
//!
//! Knows nothing of engines or settings.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::data::schema::{
    completions_batch, completions_schema, has_logprobs, read_completions, write_parquet_atomic,
    write_parquet_atomic_kv, Completion, Problem,
};

/// Metadata keys of a completions file, read by `pipeline merge`.
pub const META_SHARD: &str = "selfdistill.shard";
pub const META_SAMPLING_HASH: &str = "selfdistill.sampling_hash";
pub const META_PROBLEMS: &str = "selfdistill.problems";

pub(super) fn parts_dir(output: &Path) -> PathBuf {
    let mut s = output.as_os_str().to_owned();
    s.push(".parts");
    PathBuf::from(s)
}

/// Joins the committed parts, in input order (then sample index), into `output` (atomically),
/// with the shard, sampling hash and problem count as file metadata.
pub(super) fn join_parts(
    parts: &Path,
    problems: &[Problem],
    shard: (usize, usize),
    logprobs: bool,
    shash: &str,
    output: &Path,
) -> Result<()> {
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
    ];
    write_parquet_atomic_kv(output, completions_schema(graded, logprobs), &batches, &kv)?;
    Ok(())
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

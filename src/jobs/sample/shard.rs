//! Sharded sampling: which shard this process is (flags, Slurm arrays, Kubernetes indexed
//! Jobs), which problems are its own, and the join of all shards' outputs into one file.
//!
//! Knows nothing of engines: each shard is an ordinary run over its problems.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use super::parts::{META_PROBLEMS, META_PROBLEM_SET, META_SAMPLING_HASH, META_SHARD};
use crate::data::schema::{
    completions_batch, completions_schema, has_logprobs, read_completions, write_parquet_atomic_kv,
    Completion,
};

/// Which shard this process is: `--shard I/N`, else `SLURM_ARRAY_TASK_ID`/`SLURM_ARRAY_TASK_COUNT`,
/// else `JOB_COMPLETION_INDEX` with `num_shards` (or `SELFDISTILL_NUM_SHARDS`).
pub fn resolve_shard(
    flag: Option<&str>,
    num_shards: Option<usize>,
) -> Result<Option<(usize, usize)>> {
    let parse = |i: &str, n: &str, what: &str| -> Result<(usize, usize)> {
        let i: usize = i
            .trim()
            .parse()
            .with_context(|| format!("{what}: `{i}` is not a number"))?;
        let n: usize = n
            .trim()
            .parse()
            .with_context(|| format!("{what}: `{n}` is not a number"))?;
        if n == 0 || i >= n {
            bail!("{what}: shard {i} of {n} does not exist (shards are 0..{n})");
        }
        Ok((i, n))
    };
    if let Some(f) = flag {
        let (i, n) = f.split_once('/').context("--shard takes I/N, e.g. 0/4")?;
        return parse(i, n, "--shard").map(Some);
    }
    if let (Ok(_), Ok(n)) = (
        std::env::var("SLURM_ARRAY_TASK_ID"),
        std::env::var("SLURM_ARRAY_TASK_COUNT"),
    ) {
        // an array of any range and step (`--array=1-8`, `0-14:2`): the task's place in it
        let num = |k: &str, default: i64| -> Result<i64> {
            match std::env::var(k) {
                Ok(v) => v
                    .trim()
                    .parse()
                    .with_context(|| format!("{k}: `{v}` is not a number")),
                Err(_) => Ok(default),
            }
        };
        let id = num("SLURM_ARRAY_TASK_ID", 0)?;
        let (min, step) = (
            num("SLURM_ARRAY_TASK_MIN", 0)?,
            num("SLURM_ARRAY_TASK_STEP", 1)?.max(1),
        );
        let place = (id - min) / step;
        return parse(
            &place.to_string(),
            &n,
            "SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT (from SLURM_ARRAY_TASK_MIN, _STEP)",
        )
        .map(Some);
    }
    if let Ok(i) = std::env::var("JOB_COMPLETION_INDEX") {
        let from_env = std::env::var("SELFDISTILL_NUM_SHARDS").ok();
        let n = match (num_shards, from_env) {
            (Some(n), _) => n,
            (None, Some(n)) => n
                .trim()
                .parse()
                .with_context(|| format!("SELFDISTILL_NUM_SHARDS: `{n}` is not a number"))?,
            (None, None) => bail!(
                "JOB_COMPLETION_INDEX is set: give --num-shards or SELFDISTILL_NUM_SHARDS (the \
                 Job's completions)"
            ),
        };
        return parse(&i, &n.to_string(), "JOB_COMPLETION_INDEX").map(Some);
    }
    Ok(None)
}

/// Whether `problem_id` belongs to shard `i` of `n` (by a stable hash of the id).
pub fn in_shard(problem_id: &str, shard: (usize, usize)) -> bool {
    let h = Sha256::digest(problem_id.as_bytes());
    let first: [u8; 8] = h.get(..8).and_then(|b| b.try_into().ok()).unwrap_or([0; 8]);
    let v = u64::from_le_bytes(first);
    (v % shard.1 as u64) as usize == shard.0
}

/// Joins the outputs of a sharded run (all N shards of one sampling hash, each once) into one
/// completions file, rows ordered by problem id then sample index. Refuses incomplete sets.
pub fn merge(inputs: &[PathBuf], output: &Path) -> Result<usize> {
    merge_ordered(inputs, output, None)
}

/// Shard `i` of `n` (from file `p`) among those `seen` so far (sized by the first).
fn check_shard(seen: &mut Vec<Option<PathBuf>>, i: usize, n: usize, p: &Path) -> Result<()> {
    if seen.is_empty() {
        *seen = vec![None; n];
    }
    if n != seen.len() || i >= n {
        bail!(
            "{}: shard {i}/{n} does not belong to a set of {} shards",
            p.display(),
            seen.len()
        );
    }
    if let Some(prev) = &seen[i] {
        bail!(
            "shard {i}/{n} given twice: {} and {}",
            prev.display(),
            p.display()
        );
    }
    Ok(())
}

/// The rows in the order of `problem_ids` (then sample index), or by problem id then sample
/// index; a row of a problem not among `problem_ids` is an error.
fn order_rows(rows: &mut [Completion], problem_ids: Option<&[String]>) -> Result<()> {
    match problem_ids {
        Some(ids) => {
            let order: HashMap<&str, usize> = ids
                .iter()
                .enumerate()
                .map(|(i, p)| (p.as_str(), i))
                .collect();
            if let Some(r) = rows
                .iter()
                .find(|r| !order.contains_key(r.problem_id.as_str()))
            {
                bail!(
                    "the shards hold problem `{}`, which is not among the problems",
                    r.problem_id
                );
            }
            rows.sort_by_key(|r| (order.get(r.problem_id.as_str()).copied(), r.sample_index));
        }
        None => rows
            .sort_by(|a, b| (&a.problem_id, a.sample_index).cmp(&(&b.problem_id, b.sample_index))),
    }
    Ok(())
}

/// [`merge`], with the rows in the order of `problem_ids` (then sample index) when given: the
/// order an unsharded run of those problems writes.
pub fn merge_ordered(
    inputs: &[PathBuf],
    output: &Path,
    problem_ids: Option<&[String]>,
) -> Result<usize> {
    let mut seen: Vec<Option<PathBuf>> = Vec::new();
    let mut hash: Option<String> = None;
    let mut set: Option<(String, &Path)> = None;
    let mut rows = Vec::new();
    let mut problems = 0usize;
    for p in inputs {
        let kv: HashMap<String, String> = crate::data::schema::read_kv_metadata(p)?
            .into_iter()
            .collect();
        let shard = kv
            .get(META_SHARD)
            .with_context(|| format!("{} was not written by `pipeline sample`", p.display()))?;
        let (i, n) = shard
            .split_once('/')
            .and_then(|(i, n)| Some((i.parse::<usize>().ok()?, n.parse::<usize>().ok()?)))
            .with_context(|| format!("{}: bad shard `{shard}`", p.display()))?;
        let h = kv.get(META_SAMPLING_HASH).cloned().unwrap_or_default();
        match &hash {
            None => hash = Some(h),
            Some(x) if *x != h => bail!(
                "{} was sampled with other settings (sampling hash {h}, not {x})",
                p.display()
            ),
            _ => {}
        }
        // shards of other problems (another input file, or another `--limit`) are another set,
        // whatever their settings; files of older versions do not say, and pass
        if let Some(s) = kv.get(META_PROBLEM_SET) {
            match &set {
                None => set = Some((s.clone(), p)),
                Some((x, first)) if x != s => bail!(
                    "{} was sampled from other problems than {} (problem set {}, not {}): the \
                     shards of one run sample one input file with the same --limit",
                    p.display(),
                    first.display(),
                    s.get(..12).unwrap_or(s),
                    x.get(..12).unwrap_or(x)
                ),
                _ => {}
            }
        }
        check_shard(&mut seen, i, n, p)?;
        seen[i] = Some(p.clone());
        problems += kv
            .get(META_PROBLEMS)
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        rows.extend(read_completions(p)?);
    }
    let missing: Vec<String> = seen
        .iter()
        .enumerate()
        .filter(|(_, s)| s.is_none())
        .map(|(i, _)| i.to_string())
        .collect();
    if seen.is_empty() || !missing.is_empty() {
        bail!(
            "incomplete shard set: missing shard(s) {} of {}",
            missing.join(", "),
            seen.len()
        );
    }
    order_rows(&mut rows, problem_ids)?;
    let graded = rows.iter().all(|r| r.grade.is_some());
    let logprobs = has_logprobs(&rows);
    let batches = rows
        .chunks(crate::data::schema::ROW_GROUP_ROWS)
        .map(|c| completions_batch(c, graded, logprobs))
        .collect::<Result<Vec<_>>>()?;
    let kv = vec![
        (META_SHARD.to_string(), "0/1".to_string()),
        (META_SAMPLING_HASH.to_string(), hash.unwrap_or_default()),
        (META_PROBLEMS.to_string(), problems.to_string()),
    ];
    let kv = kv
        .into_iter()
        .chain(set.map(|(s, _)| (META_PROBLEM_SET.to_string(), s)))
        .collect::<Vec<_>>();
    write_parquet_atomic_kv(output, completions_schema(graded, logprobs), &batches, &kv)?;
    Ok(rows.len())
}

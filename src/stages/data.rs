//! The data stage: loads every configured source, gives each problem a stable id and writes
//! `problems.parquet` (schema `data::schema::problems_schema`).
//!
//! One atomic file write, so it has no partial state to resume: an interrupted run redoes it.
//! Knows nothing of sampling or grading.

use std::path::Path;

use anyhow::Result;

use super::{output_file, Estimate, PlannedStage, StageOutput};
use crate::config::DataConfig;
use crate::data::schema::{problems_batch, problems_schema, write_parquet_atomic, ROW_GROUP_ROWS};
use crate::data::{load_source, BadRows};

/// Bump when the output for the same inputs changes.
pub const CODE_VERSION: u32 = 1;

pub fn plan(cfg: &DataConfig, workdir: &Path, resolve: &super::Resolve) -> Result<PlannedStage> {
    let mut inputs = Vec::new();
    let mut files = Vec::new();
    let mut bytes = 0;
    // problems: counted from the files where that is cheap (lines, Parquet metadata)
    let mut rows = Some(0u64);
    // problem tokens, summed over the rows, where every source has a card
    let mut tokens = Some(0.0f64);
    let mut cards = Vec::new();
    for s in &cfg.sources {
        let what = format!("data source `{}`", s.name);
        let mut source_rows = Some(0u64);
        let mut source_bytes = 0;
        let card = crate::data::cards::card(&s.location);
        for (input, path, n) in resolve.location(&s.name, &what, &s.location)? {
            source_bytes += n;
            let counted = match (&path, card) {
                (Some(p), _) => crate::data::count_rows(p),
                // not downloaded (preflight): the card's count and size
                (None, Some(c)) => {
                    cards.push(s.location.describe());
                    source_bytes += c.rows
                        * 4
                        * (c.problem_tokens + c.solution_tokens.unwrap_or(0.0) + 16.0) as u64;
                    Some(c.rows)
                }
                (None, None) => None,
            };
            source_rows = source_rows.zip(counted).map(|(a, b)| a + b);
            if let Some(path) = path {
                files.push((input.name.clone(), path));
            }
            inputs.push(input);
        }
        // a limit keeps that share of the source's bytes
        bytes += match (s.limit, source_rows) {
            (Some(l), Some(r)) if r > 0 => source_bytes * (l as u64).min(r) / r,
            _ => source_bytes,
        };
        let source_rows = source_rows.map(|r| match s.limit {
            Some(l) => r.min(l as u64),
            None => r,
        });
        rows = rows.zip(source_rows).map(|(a, b)| a + b);
        tokens = tokens
            .zip(card.zip(source_rows))
            .map(|(t, (c, r))| t + c.problem_tokens * r as f64);
    }
    // Gold answers of `boxed` sources are extracted by the verifier.
    inputs.push(super::verifier_input());
    let config = serde_json::to_value(cfg)?;
    let mut st = PlannedStage::new(
        super::StageKind::Data,
        workdir,
        CODE_VERSION,
        config,
        inputs,
    );
    st.files = files;
    // JSONL shrinks under zstd; a mapped Parquet stays about the same size.
    st.estimate = Estimate {
        disk_bytes: bytes,
        memory_bytes: bytes * 3,
        rows,
        // a problem's mean tokens, known from the cards of hub sets
        row_tokens: tokens
            .zip(rows)
            .filter(|(_, r)| *r > 0)
            .map(|(t, r)| (t / r as f64).round() as u64),
        cards,
        ..Estimate::default()
    };
    Ok(st)
}

pub fn run(cfg: &DataConfig, stage: &PlannedStage) -> Result<StageOutput> {
    let mut all = Vec::new();
    let mut counts = Vec::new();
    for s in &cfg.sources {
        let files: Vec<_> = stage
            .files
            .iter()
            .filter(|(n, _)| n.rsplit_once('#').map(|(a, _)| a) == Some(s.name.as_str()))
            .map(|(_, p)| p.clone())
            .collect();
        let (rows, rep) = load_source(s, &files, BadRows::config(cfg.skip_bad_rows))?;
        tracing::info!(
            "    {:<12} {} problems from {} rows ({} bad rows skipped, {} duplicate ids) <- {}",
            s.name,
            rep.problems,
            rep.rows_read,
            rep.bad_rows,
            rep.duplicates,
            s.location.describe()
        );
        for ex in &rep.bad_examples {
            tracing::info!("      skipped: {ex}");
        }
        counts.push((format!("{}.problems", s.name), rep.problems));
        counts.push((format!("{}.bad_rows", s.name), rep.bad_rows));
        counts.push((format!("{}.duplicate_ids", s.name), rep.duplicates));
        all.extend(rows);
    }
    let batches = all
        .chunks(ROW_GROUP_ROWS)
        .map(problems_batch)
        .collect::<Result<Vec<_>>>()?;
    let out = stage.dir.join(super::PROBLEMS);
    write_parquet_atomic(&out, problems_schema(), &batches)?;
    let rows = all.len() as u64;
    Ok(StageOutput {
        outputs: vec![output_file(&stage.dir, &out, rows)?],
        counts,
        rows,
    })
}

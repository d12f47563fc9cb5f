//! Datasets: loaders for the published math sets and any mapped JSONL/Parquet, and the Parquet
//! schemas of everything the project writes.
//!
//! `load_source` turns the records of one configured source into [`schema::Problem`]s with stable
//! ids, counting (or failing on) bad rows. It knows nothing of stages or the work dir.

pub mod cards;
pub mod decontaminate;
pub mod hub;
pub mod records;
pub mod schema;
pub mod source;

use std::collections::HashSet;
use std::path::PathBuf;

use anyhow::{bail, Result};
use sha2::{Digest, Sha256};

use crate::verify::{extract_answer, ExtractMethod, GradeOptions};
use records::{field_text, read_records, Record};
use schema::Problem;
use source::{AnswerExtract, SourceFormat, SourceSpec};

/// What loading one source did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct LoadReport {
    pub rows_read: u64,
    pub problems: u64,
    /// Rows skipped as malformed (only with `skip_bad_rows`).
    pub bad_rows: u64,
    /// The first few bad-row messages, for the console.
    pub bad_examples: Vec<String>,
    /// Rows whose id was already seen (the first one is kept).
    pub duplicates: u64,
}

/// Loads the problems of `spec` from its resolved local `files`.
/// What a malformed row does: an error (saying how the caller's user skips such rows, where
/// they can), or skipped and counted.
#[derive(Debug, Clone, Copy)]
pub struct BadRows {
    pub skip: bool,
    /// `set data.skip_bad_rows = true`, `pass --skip-bad-rows`; `None` where rows cannot be
    /// skipped (an eval set: every problem counts).
    pub how_to_skip: Option<&'static str>,
}

impl BadRows {
    /// Every row must parse, with no way to skip (eval sets, pretraining sources).
    pub const STRICT: BadRows = BadRows {
        skip: false,
        how_to_skip: None,
    };

    /// A config's `data.skip_bad_rows`.
    pub fn config(skip: bool) -> BadRows {
        BadRows {
            skip,
            how_to_skip: Some("set data.skip_bad_rows = true"),
        }
    }
}

pub fn load_source(
    spec: &SourceSpec,
    files: &[PathBuf],
    bad_rows: BadRows,
) -> Result<(Vec<Problem>, LoadReport)> {
    let (rows, rep) = load_source_with(spec, files, bad_rows, None)?;
    Ok((rows.into_iter().map(|(p, _)| p).collect(), rep))
}

/// Problems, each with the text of an extra field (see [`load_source_with`]).
pub type ProblemsWithField = Vec<(Problem, Option<String>)>;

/// Like [`load_source`], also returning each row's `extra` field (e.g. a reference solution to
/// grade as a completion).
pub fn load_source_with(
    spec: &SourceSpec,
    files: &[PathBuf],
    bad_rows: BadRows,
    extra: Option<&str>,
) -> Result<(ProblemsWithField, LoadReport)> {
    let mut out = Vec::new();
    let mut rep = LoadReport::default();
    let mut seen = HashSet::new();
    'files: for file in files {
        for rec in read_records(file)? {
            if spec.limit.is_some_and(|l| out.len() >= l) {
                break 'files;
            }
            rep.rows_read += 1;
            let parsed = rec.map_err(|e| (e.fatal, e.to_string())).and_then(|r| {
                problem_from_record(spec, &r)
                    .map(|p| (p, extra.and_then(|k| field_text(&r.fields, k))))
                    .map_err(|m| (false, format!("{}:{}: {m}", file.display(), r.row)))
            });
            match parsed {
                Ok((p, text)) => {
                    if seen.insert(p.problem_id.clone()) {
                        out.push((p, text));
                    } else {
                        rep.duplicates += 1;
                    }
                }
                Err((fatal, msg)) => {
                    if fatal || !bad_rows.skip {
                        let hint = match bad_rows.how_to_skip {
                            Some(how) if !fatal => format!(" ({how} to skip and count such rows)"),
                            _ => String::new(),
                        };
                        bail!("source `{}`: {msg}{hint}", spec.name);
                    }
                    rep.bad_rows += 1;
                    if rep.bad_examples.len() < 5 {
                        rep.bad_examples.push(msg);
                    }
                }
            }
        }
    }
    rep.problems = out.len() as u64;
    if out.is_empty() && !spec.allow_empty {
        let what = match (rep.rows_read, rep.bad_rows) {
            (0, _) => "has no rows".to_string(),
            (n, b) if b == n => format!("has {n} rows, every one skipped as bad"),
            (n, _) => format!("gives no problems from {n} rows"),
        };
        bail!(
            "source `{}` ({}) {what}: an empty source is almost always a wrong file; set \
             allow_empty = true in the source if it may be empty",
            spec.name,
            files
                .iter()
                .map(|f| f.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok((out, rep))
}

fn problem_from_record(spec: &SourceSpec, rec: &Record) -> Result<Problem, String> {
    let f = &spec.fields;
    let problem = f
        .problem
        .iter()
        .find_map(|k| field_text(&rec.fields, k).filter(|s| !s.trim().is_empty()))
        .ok_or_else(|| format!("no problem text (field `{}`)", f.problem.join("` or `")))?;
    let solution = f.solution.as_ref().and_then(|k| field_text(&rec.fields, k));
    let answer_raw = f.answer.as_ref().and_then(|k| field_text(&rec.fields, k));
    let gold_answer = match (answer_raw, f.answer_extract) {
        (Some(a), AnswerExtract::Field) => a.trim().to_string(),
        (Some(a), AnswerExtract::Hash) => a
            .rsplit_once("####")
            .map(|(_, x)| x.trim().to_string())
            .ok_or("the answer field has no `#### <answer>` line")?,
        (Some(a), AnswerExtract::Boxed) => boxed(&a).ok_or("the answer field has no \\boxed{}")?,
        // Hendrycks MATH has no `answer` field: the last \boxed{} of the solution is the answer.
        (None, _) if spec.format == SourceFormat::Math => solution
            .as_deref()
            .and_then(boxed)
            .ok_or("no `answer` field and no \\boxed{} in the solution")?,
        (None, _) => {
            return Err(format!(
                "no answer (field `{}`)",
                f.answer.as_deref().unwrap_or("answer")
            ))
        }
    };
    if gold_answer.is_empty() {
        return Err("the answer is empty".into());
    }
    let native = f.id.as_ref().and_then(|k| field_text(&rec.fields, k));
    let id = match native {
        Some(id) => id,
        None => hex::encode(Sha256::digest(problem.as_bytes()))
            .get(..16)
            .unwrap_or_default()
            .to_string(),
    };
    Ok(Problem {
        problem_id: format!("{}/{id}", spec.name),
        source: spec.name.clone(),
        source_row: rec.row as i64,
        problem,
        gold_answer,
        solution,
        subject: f.subject.as_ref().and_then(|k| field_text(&rec.fields, k)),
        level: f.level.as_ref().and_then(|k| field_text(&rec.fields, k)),
    })
}

fn boxed(text: &str) -> Option<String> {
    extract_answer(text, &GradeOptions::default())
        .ok()
        .filter(|e| e.method == ExtractMethod::Boxed)
        .map(|e| e.answer)
}

/// Rows of a data file, where counting is cheap: non-empty lines of JSONL, the row count in a
/// Parquet file's footer; `None` for other formats or an unreadable file.
pub fn count_rows(path: &std::path::Path) -> Option<u64> {
    let name = path.file_name()?.to_string_lossy().to_ascii_lowercase();
    if name.ends_with(".parquet") {
        use parquet::file::reader::FileReader;
        let f = std::fs::File::open(path).ok()?;
        let r = parquet::file::reader::SerializedFileReader::new(f).ok()?;
        return u64::try_from(r.metadata().file_metadata().num_rows()).ok();
    }
    if name.ends_with(".jsonl") {
        let text = std::fs::read(path).ok()?;
        return Some(
            text.split(|&b| b == b'\n')
                .filter(|l| l.iter().any(|b| !b.is_ascii_whitespace()))
                .count() as u64,
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use source::{FieldMap, Location};
    use std::path::Path;

    fn shared(name: &str) -> Option<PathBuf> {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/data")
            .join(name);
        if !p.exists() && std::env::var("SELFDISTILL_REQUIRE_SHARED").is_ok_and(|v| v == "1") {
            panic!(
                "{} is missing and SELFDISTILL_REQUIRE_SHARED=1",
                p.display()
            );
        }
        p.exists().then_some(p)
    }

    fn spec(name: &str, format: SourceFormat, path: &Path) -> SourceSpec {
        SourceSpec {
            name: name.into(),
            format,
            location: Location::Local(path.to_path_buf()),
            fields: FieldMap::preset(format),
            limit: None,
            allow_empty: false,
        }
    }

    fn load(name: &str, format: SourceFormat, file: &str) -> Option<Vec<Problem>> {
        let p = shared(file)?;
        let (rows, rep) =
            load_source(&spec(name, format, &p), &[p], BadRows::config(false)).unwrap();
        assert_eq!(rep.bad_rows, 0);
        Some(rows)
    }

    #[test]
    fn gsm8k_answers_follow_the_hashes() {
        let Some(rows) = load("gsm8k", SourceFormat::Gsm8k, "gsm8k_test.jsonl") else {
            return;
        };
        assert_eq!(rows.len(), 1319);
        assert_eq!(rows[0].gold_answer, "18");
        assert!(rows[0].problem_id.starts_with("gsm8k/"));
        assert!(rows[0]
            .solution
            .as_deref()
            .unwrap()
            .contains("<<16-3-4=9>>"));
    }

    #[test]
    fn math500_aime_amc_load_with_native_ids() {
        if let Some(rows) = load("math500", SourceFormat::Math, "math500.jsonl") {
            assert_eq!(rows.len(), 500);
            assert_eq!(rows[0].problem_id, "math500/test/precalculus/807.json");
            assert_eq!(rows[0].gold_answer, "\\left( 3, \\frac{\\pi}{2} \\right)");
            assert_eq!(rows[0].level.as_deref(), Some("2"));
        }
        if let Some(rows) = load("aime24", SourceFormat::Aime, "aime24.jsonl") {
            assert_eq!(rows.len(), 30);
            assert_eq!(rows[0].gold_answer, "204");
            assert_eq!(rows[0].problem_id, "aime24/60");
        }
        if let Some(rows) = load("amc23", SourceFormat::Amc, "amc23.jsonl") {
            assert_eq!(rows.len(), 40);
            assert_eq!(rows[0].gold_answer, "27.0");
        }
    }

    #[test]
    fn mapped_parquet_from_pyarrow() {
        let Some(p) = shared("math500_rl.parquet") else {
            return;
        };
        let mut s = spec("rl", SourceFormat::Mapped, &p);
        s.fields.problem = vec!["problem".into()];
        s.fields.answer = Some("answer".into());
        s.limit = Some(10);
        let (rows, _) = load_source(&s, &[p], BadRows::config(false)).unwrap();
        assert_eq!(rows.len(), 10);
        assert_eq!(rows[1].gold_answer, "p - q");
    }

    #[test]
    fn bad_rows_fail_naming_the_line_or_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("g.jsonl");
        std::fs::write(
            &p,
            "{\"question\": \"a\", \"answer\": \"x\\n#### 1\"}\n{\"question\": \"b\"\n\
             {\"question\": \"c\", \"answer\": \"no hashes\"}\n",
        )
        .unwrap();
        let s = spec("g", SourceFormat::Gsm8k, &p);
        let e = load_source(&s, std::slice::from_ref(&p), BadRows::config(false))
            .unwrap_err()
            .to_string();
        assert!(e.contains("g.jsonl:2: malformed JSON"), "{e}");
        let (rows, rep) = load_source(&s, &[p], BadRows::config(true)).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rep.bad_rows, 2);
        assert!(rep.bad_examples[1].contains(":3: the answer field has no `####"));
    }
}

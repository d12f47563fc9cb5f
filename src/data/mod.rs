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
        if records::FileKind::of(file)? == records::FileKind::Parquet {
            check_column_types(spec, file)?;
        }
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

/// A Parquet source's mapped columns hold what they are read as: text for the problem and the
/// solution; text or integers (or lists of them: OlympiadBench's several answers) for the answer,
/// an id, a subject and a level. A binary column (bytes) or a floating-point answer (0.1 read
/// back as 0.1000000000000000055...) would be coerced to text silently: refused, naming the file,
/// column and type. AMC's answers are published as floats (27.0): the `amc` format takes them.
fn check_column_types(spec: &SourceSpec, file: &std::path::Path) -> Result<()> {
    use arrow_schema::DataType as T;
    let f = std::fs::File::open(file)?;
    let builder = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
        .map_err(|e| anyhow::anyhow!("{} is not a readable Parquet file: {e}", file.display()))?;
    let schema = builder.schema().clone();
    fn text(t: &T) -> bool {
        match t {
            T::Utf8 | T::LargeUtf8 | T::Utf8View => true,
            T::Dictionary(_, v) => text(v),
            _ => false,
        }
    }
    fn integer(t: &T) -> bool {
        t.is_integer() || matches!(t, T::Dictionary(_, v) if v.is_integer())
    }
    let f = &spec.fields;
    let float_answer = spec.format == SourceFormat::Amc;
    type Check = Box<dyn Fn(&T) -> bool>;
    let mut wanted: Vec<(&str, &str, Check)> = Vec::new();
    for p in &f.problem {
        wanted.push((p, "text", Box::new(text)));
    }
    if let Some(s) = &f.solution {
        wanted.push((s, "text", Box::new(text)));
    }
    let scalar = move |t: &T| text(t) || integer(t) || (float_answer && t.is_floating());
    let answer_ok = move |t: &T| match t {
        T::List(item) | T::LargeList(item) => scalar(item.data_type()),
        t => scalar(t),
    };
    if let Some(a) = &f.answer {
        let what = if float_answer {
            "text or numbers"
        } else {
            "text or integers"
        };
        wanted.push((a, what, Box::new(answer_ok)));
    }
    for k in [&f.id, &f.subject, &f.level].into_iter().flatten() {
        wanted.push((
            k,
            "text or integers",
            Box::new(|t: &T| text(t) || integer(t)),
        ));
    }
    for (name, what, ok) in wanted {
        let Ok(field) = schema.field_with_name(name) else {
            continue;
        };
        if !ok(field.data_type()) {
            bail!(
                "source `{}`: {}: column `{name}` is {}, not {what}; convert the column (a \
                 number as text keeps its exact digits)",
                spec.name,
                file.display(),
                field.data_type()
            );
        }
    }
    Ok(())
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

    /// A Parquet column of the wrong type (a binary solution, a float answer) is refused naming
    /// the file, column and type; integers and AMC's float answers are read.
    #[test]
    fn parquet_columns_of_the_wrong_type_are_refused() {
        use arrow_array::{ArrayRef, BinaryArray, Float64Array, Int64Array, StringArray};
        use std::sync::Arc;
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, answer: ArrayRef, solution: ArrayRef| {
            let p = dir.path().join(name);
            let problem: ArrayRef = Arc::new(StringArray::from(vec!["What is 1+1?"]));
            let batch = arrow_array::RecordBatch::try_from_iter([
                ("problem", problem),
                ("answer", answer),
                ("solution", solution),
            ])
            .unwrap();
            let mut w = parquet::arrow::ArrowWriter::try_new(
                std::fs::File::create(&p).unwrap(),
                batch.schema(),
                None,
            )
            .unwrap();
            w.write(&batch).unwrap();
            w.close().unwrap();
            p
        };
        let text = |s: &str| -> ArrayRef { Arc::new(StringArray::from(vec![s])) };
        let load_as = |p: &PathBuf, format| {
            let mut s = spec("x", format, p);
            s.fields.solution = Some("solution".into());
            load_source(&s, std::slice::from_ref(p), BadRows::config(false))
        };
        let binary = write(
            "binary.parquet",
            text("2"),
            Arc::new(BinaryArray::from(vec![b"1+1=2".as_slice()])),
        );
        let e = load_as(&binary, SourceFormat::Math)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("binary.parquet: column `solution` is Binary, not text"),
            "{e}"
        );
        let float = write(
            "float.parquet",
            Arc::new(Float64Array::from(vec![2.0])),
            text("1+1=2"),
        );
        let e = load_as(&float, SourceFormat::Math).unwrap_err().to_string();
        assert!(
            e.contains("float.parquet: column `answer` is Float64, not text or integers"),
            "{e}"
        );
        // AMC publishes its answers as floats
        let (rows, _) = load_as(&float, SourceFormat::Amc).unwrap();
        assert_eq!(rows[0].gold_answer, "2.0");
        let int = write(
            "int.parquet",
            Arc::new(Int64Array::from(vec![2])),
            text("1+1=2"),
        );
        let (rows, _) = load_as(&int, SourceFormat::Math).unwrap();
        assert_eq!(rows[0].gold_answer, "2");
    }
}

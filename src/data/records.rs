//! Reading any JSONL or Parquet file as a stream of JSON-object records, and row-level errors that
//! name the file and line.
//!
//! Used by the dataset loaders, `grade` and `data inspect`, which must accept files of any schema
//! (ours, pyarrow's, vLLM's). Our own schemas are read column-wise in `schema`, not here. Knows
//! nothing of what the fields mean.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use arrow_array::RecordBatch;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::{Map, Value};

/// The file formats we read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Jsonl,
    Parquet,
}

impl FileKind {
    /// By extension, else by the Parquet magic bytes.
    pub fn of(path: &Path) -> Result<FileKind> {
        let ext = path
            .extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase());
        match ext.as_deref() {
            Some("jsonl" | "ndjson" | "json") => return Ok(FileKind::Jsonl),
            Some("parquet" | "pq") => return Ok(FileKind::Parquet),
            _ => {}
        }
        let mut magic = [0u8; 4];
        let mut f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        use std::io::Read;
        if f.read_exact(&mut magic).is_ok() && &magic == b"PAR1" {
            return Ok(FileKind::Parquet);
        }
        Ok(FileKind::Jsonl)
    }
}

/// One record: its 1-based line (JSONL) or row (Parquet) number and its fields.
#[derive(Debug, Clone)]
pub struct Record {
    pub row: usize,
    pub fields: Map<String, Value>,
}

/// A row that could not be read; `fatal` when the file itself is unreadable (not skippable).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{path}:{row}: {message}")]
pub struct RowError {
    pub path: PathBuf,
    pub row: usize,
    pub message: String,
    pub fatal: bool,
}

pub type Records = Box<dyn Iterator<Item = Result<Record, RowError>>>;

/// Opens `path` (a regular file: a directory or a pipe is refused) and streams its records.
pub fn read_records(path: &Path) -> Result<Records> {
    crate::bytes::regular_file(path)?;
    match FileKind::of(path)? {
        FileKind::Jsonl => jsonl_records(path),
        FileKind::Parquet => parquet_records(path),
    }
}

fn jsonl_records(path: &Path) -> Result<Records> {
    let f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let path = path.to_path_buf();
    // a read error ends the stream after it is reported (a failing read may fail forever)
    let mut failed = false;
    let lines = BufReader::new(f)
        .split(b'\n')
        .take_while(move |l| !std::mem::replace(&mut failed, l.is_err()))
        .enumerate();
    Ok(Box::new(lines.filter_map(move |(i, line)| {
        let row = i + 1;
        let err = |message: String, fatal: bool| RowError {
            path: path.clone(),
            row,
            message,
            fatal,
        };
        let bytes = match line {
            Ok(l) => l,
            Err(e) => return Some(Err(err(format!("cannot read: {e}"), true))),
        };
        let line = match std::str::from_utf8(&bytes) {
            Ok(l) => l,
            Err(e) => return Some(Err(err(format!("invalid UTF-8: {e}"), false))),
        };
        if line.trim().is_empty() {
            return None;
        }
        Some(match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(fields)) => Ok(Record { row, fields }),
            Ok(other) => Err(err(
                format!("expected a JSON object, found {}", type_name(&other)),
                false,
            )),
            Err(e) => Err(err(format!("malformed JSON: {e}"), false)),
        })
    })))
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn parquet_records(path: &Path) -> Result<Records> {
    let reader = open_parquet(path, 1024)?;
    let path = path.to_path_buf();
    let mut next_row = 1usize;
    let iter = reader.flat_map(move |batch| {
        let start = next_row;
        let rows: Vec<Result<Record, RowError>> =
            match batch.map_err(|e| e.to_string()).and_then(|b| {
                next_row += b.num_rows();
                batch_to_json_rows(&b)
            }) {
                Ok(rows) => rows
                    .into_iter()
                    .enumerate()
                    .map(|(i, fields)| {
                        Ok(Record {
                            row: start + i,
                            fields,
                        })
                    })
                    .collect(),
                Err(message) => vec![Err(RowError {
                    path: path.clone(),
                    row: start,
                    message,
                    fatal: true,
                })],
            };
        rows
    });
    Ok(Box::new(iter))
}

/// A Parquet reader of `batch_rows`-row batches.
pub fn open_parquet(
    path: &Path,
    batch_rows: usize,
) -> Result<parquet::arrow::arrow_reader::ParquetRecordBatchReader> {
    let f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    ParquetRecordBatchReaderBuilder::try_new(f)
        .with_context(|| format!("{} is not a readable Parquet file", path.display()))?
        .with_batch_size(batch_rows)
        .build()
        .with_context(|| format!("cannot read {}", path.display()))
}

/// Converts a batch to JSON objects (lists stay arrays, numbers stay numbers, nulls are kept).
pub fn batch_to_json_rows(batch: &RecordBatch) -> Result<Vec<Map<String, Value>>, String> {
    let mut buf = Vec::new();
    {
        let mut w = arrow_json::WriterBuilder::new()
            .with_explicit_nulls(true)
            .build::<_, arrow_json::writer::LineDelimited>(&mut buf);
        w.write(batch).map_err(|e| e.to_string())?;
        w.finish().map_err(|e| e.to_string())?;
    }
    let text = String::from_utf8(buf).map_err(|e| e.to_string())?;
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| match serde_json::from_str(l) {
            Ok(Value::Object(m)) => Ok(m),
            Ok(_) => Err("row is not an object".to_string()),
            Err(e) => Err(e.to_string()),
        })
        .collect()
}

/// A field's text: strings as they are, numbers and booleans printed, null or missing as `None`,
/// arrays and objects as compact JSON.
pub fn field_text(fields: &Map<String, Value>, name: &str) -> Option<String> {
    match fields.get(name)? {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        // a list of values (OlympiadBench's `final_answer`: one LaTeX string, or several when a
        // problem has several answers) reads as the values joined by commas
        Value::Array(items) if items.iter().all(|v| !v.is_object() && !v.is_array()) => Some(
            items
                .iter()
                .map(|v| match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect::<Vec<_>>()
                .join(", "),
        ),
        other => Some(other.to_string()),
    }
}

/// Reads every record, failing on the first bad row (for commands with no skip option).
pub fn read_all_records(path: &Path) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    for r in read_records(path)? {
        match r {
            Ok(rec) => out.push(rec),
            Err(e) => bail!("{e}"),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_errors_name_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.jsonl");
        std::fs::write(&p, b"{\"a\": 1}\n\n{\"a\": \n[1]\n{\"a\": \"\xff\"}\n").unwrap();
        let rows: Vec<_> = read_records(&p).unwrap().collect();
        assert_eq!(rows.len(), 4);
        let bad_utf8 = rows[3].as_ref().unwrap_err();
        assert_eq!((bad_utf8.row, bad_utf8.fatal), (5, false));
        assert_eq!(rows[0].as_ref().unwrap().row, 1);
        let e = rows[1].as_ref().unwrap_err();
        assert_eq!(e.row, 3);
        assert!(e.to_string().contains("x.jsonl:3: malformed JSON"), "{e}");
        assert!(rows[2]
            .as_ref()
            .unwrap_err()
            .message
            .contains("expected a JSON object"));
    }

    #[test]
    fn reads_the_pyarrow_parquet_file() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/math500_rl.parquet");
        if !p.exists() {
            assert!(
                !std::env::var("SELFDISTILL_REQUIRE_SHARED").is_ok_and(|v| v == "1"),
                "{} is missing and SELFDISTILL_REQUIRE_SHARED=1",
                p.display()
            );
            eprintln!("skipped: {} missing", p.display());
            return;
        }
        let rows = read_all_records(&p).unwrap();
        assert_eq!(rows.len(), 500);
        assert_eq!(rows[0].row, 1);
        assert_eq!(
            field_text(&rows[0].fields, "answer").as_deref(),
            Some("\\left( 3, \\frac{\\pi}{2} \\right)")
        );
        assert!(field_text(&rows[0].fields, "problem")
            .unwrap()
            .contains("rectangular coordinates"));
    }
}

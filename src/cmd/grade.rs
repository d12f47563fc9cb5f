//! `pipeline grade`: grades any completions file (JSONL or Parquet, ours or another tool's, e.g.
//! vLLM's) against gold answers with our verifier.
//!
//! Writes every input row plus `extracted_answer`, `correct` and `reason` (JSONL or Parquet by
//! the output's extension), and prints the accuracy and a count per reason. Also how users audit
//! the verifier. Knows nothing of stages or the work dir.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use serde_json::{Map, Value};

use crate::data::records::{field_text, open_parquet, read_records, FileKind};
use crate::data::schema::writer_properties;
use crate::names::closest;
use crate::store::commit_file;
use crate::verify::{grade, GradeOptions, Verdict};

#[derive(Debug, clap::Args)]
pub struct GradeArgs {
    /// A JSONL or Parquet file of completions.
    #[arg(long)]
    pub input: PathBuf,
    /// The field with the gold answer.
    #[arg(long)]
    pub answer_field: String,
    /// The field with the model's (or a reference) completion.
    #[arg(long)]
    pub completion_field: String,
    /// Where to write the graded rows (.jsonl or .parquet); omit to only print the figures.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// When no explicit answer is found, take the last number in the completion.
    #[arg(long)]
    pub last_number_fallback: bool,
    /// Thinking-model completions: the answer is only taken after `</think>`.
    #[arg(long)]
    pub thinking: bool,
}

/// Accuracy figures of one grading pass.
#[derive(Debug, Default)]
pub struct Tally {
    pub rows: u64,
    pub correct: u64,
    pub reasons: BTreeMap<&'static str, u64>,
}

impl Tally {
    fn add(&mut self, v: &Verdict) {
        self.rows += 1;
        self.correct += v.correct as u64;
        *self.reasons.entry(v.reason.as_str()).or_insert(0) += 1;
    }

    pub fn print(&self) {
        let pct = if self.rows == 0 {
            0.0
        } else {
            100.0 * self.correct as f64 / self.rows as f64
        };
        crate::outln!("accuracy: {}/{} = {pct:.2}%", self.correct, self.rows);
        let mut by_count: Vec<_> = self.reasons.iter().collect();
        by_count.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        for (reason, n) in by_count {
            crate::outln!("  {n:>8}  {reason}");
        }
    }
}

pub fn run(args: &GradeArgs) -> Result<()> {
    let opts = GradeOptions {
        last_number_fallback: args.last_number_fallback,
        thinking: args.thinking,
        ..GradeOptions::default()
    };
    let out_kind = args.output.as_deref().map(output_kind).transpose()?;
    if let Some(o) = &args.output {
        crate::store::check_output_file(o, &[&args.input], "--output")?;
    }
    crate::bytes::regular_file(&args.input)?;
    let tally = match FileKind::of(&args.input)? {
        FileKind::Jsonl => grade_jsonl(args, &opts, out_kind)?,
        FileKind::Parquet => grade_parquet(args, &opts, out_kind)?,
    };
    tally.print();
    if let Some(o) = &args.output {
        crate::outln!("wrote {}", o.display());
    }
    Ok(())
}

/// An input without rows is an error, not an accuracy of 0/0 (and nothing is written).
fn no_rows(input: &Path, tally: &Tally) -> Result<()> {
    if tally.rows == 0 {
        bail!("{} has no rows: nothing to grade", input.display());
    }
    Ok(())
}

fn output_kind(p: &Path) -> Result<FileKind> {
    match p.extension().and_then(|e| e.to_str()) {
        Some("jsonl" | "ndjson") => Ok(FileKind::Jsonl),
        Some("parquet") => Ok(FileKind::Parquet),
        _ => bail!(
            "--output {}: use a .jsonl or .parquet file name",
            p.display()
        ),
    }
}

fn missing_field(
    path: &Path,
    row: usize,
    field: &str,
    flag: &str,
    have: Vec<String>,
) -> anyhow::Error {
    let hint = closest(field, &have)
        .map(|c| format!("; did you mean `{c}`?"))
        .unwrap_or_default();
    anyhow::anyhow!(
        "{}:{row}: no field `{field}` ({flag}){hint} (fields: {})",
        path.display(),
        have.join(", ")
    )
}

fn grade_jsonl(args: &GradeArgs, opts: &GradeOptions, out: Option<FileKind>) -> Result<Tally> {
    let mut tally = Tally::default();
    let mut rows: Vec<Map<String, Value>> = Vec::new();
    for rec in read_records(&args.input)? {
        let mut rec = rec.map_err(anyhow::Error::from)?;
        for (field, flag) in [
            (&args.answer_field, "--answer-field"),
            (&args.completion_field, "--completion-field"),
        ] {
            if !rec.fields.contains_key(field.as_str()) {
                let have = rec.fields.keys().cloned().collect();
                return Err(missing_field(&args.input, rec.row, field, flag, have));
            }
        }
        let gold = field_text(&rec.fields, &args.answer_field).unwrap_or_default();
        let text = field_text(&rec.fields, &args.completion_field).unwrap_or_default();
        let v = grade(&text, &gold, opts);
        tally.add(&v);
        if out.is_some() {
            rec.fields.insert(
                "extracted_answer".into(),
                v.extracted.map(Value::String).unwrap_or(Value::Null),
            );
            rec.fields.insert("correct".into(), Value::Bool(v.correct));
            rec.fields
                .insert("reason".into(), Value::String(v.reason.as_str().into()));
            rows.push(rec.fields);
        }
    }
    no_rows(&args.input, &tally)?;
    match (out, &args.output) {
        (Some(FileKind::Jsonl), Some(path)) => write_jsonl(path, &rows)?,
        (Some(FileKind::Parquet), Some(path)) => write_json_rows_as_parquet(path, &rows)?,
        _ => {}
    }
    Ok(tally)
}

fn write_jsonl(path: &Path, rows: &[Map<String, Value>]) -> Result<()> {
    commit_file(path, |tmp| {
        let mut w = BufWriter::new(File::create(tmp)?);
        for r in rows {
            serde_json::to_writer(&mut w, r)?;
            w.write_all(b"\n")?;
        }
        w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        Ok(())
    })?;
    Ok(())
}

/// JSON rows to Parquet with an inferred schema (types merged over all rows). A field that holds
/// strings in some rows and numbers in others becomes a string column.
fn write_json_rows_as_parquet(path: &Path, rows: &[Map<String, Value>]) -> Result<()> {
    let mut values: Vec<Value> = rows.iter().cloned().map(Value::Object).collect();
    let schema = arrow_json::reader::infer_json_schema_from_iterator(values.iter().map(Ok))
        .context("cannot infer a Parquet schema from the JSONL rows")?;
    let text_fields: Vec<&str> = schema
        .fields()
        .iter()
        .filter(|f| f.data_type() == &DataType::Utf8)
        .map(|f| f.name().as_str())
        .collect();
    for v in values.iter_mut() {
        let Value::Object(m) = v else { continue };
        for name in &text_fields {
            if let Some(x) = m.get_mut(*name) {
                if !(x.is_string() || x.is_null()) {
                    *x = Value::String(x.to_string());
                }
            }
        }
    }
    let schema = Arc::new(schema);
    let mut decoder = arrow_json::ReaderBuilder::new(schema.clone()).build_decoder()?;
    decoder.serialize(&values)?;
    let mut batches = Vec::new();
    while let Some(b) = decoder.flush()? {
        batches.push(b);
        if decoder.is_empty() {
            break;
        }
    }
    crate::data::schema::write_parquet_atomic(path, schema, &batches)?;
    Ok(())
}

fn grade_parquet(args: &GradeArgs, opts: &GradeOptions, out: Option<FileKind>) -> Result<Tally> {
    let mut tally = Tally::default();
    let mut graded: Vec<RecordBatch> = Vec::new();
    let mut first_row = 1usize;
    for batch in open_parquet(&args.input, 4096)? {
        let batch = batch.with_context(|| format!("cannot read {}", args.input.display()))?;
        let text_col = |field: &str, flag: &str| -> Result<StringArray> {
            let have: Vec<String> = batch
                .schema()
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect();
            let col = batch
                .column_by_name(field)
                .ok_or_else(|| missing_field(&args.input, first_row, field, flag, have))?;
            let s = arrow_cast::cast(col, &DataType::Utf8)
                .with_context(|| format!("column `{field}` cannot be read as text"))?;
            Ok(s.as_string::<i32>().clone())
        };
        let gold = text_col(&args.answer_field, "--answer-field")?;
        let text = text_col(&args.completion_field, "--completion-field")?;
        let mut extracted = Vec::with_capacity(batch.num_rows());
        let mut correct = Vec::with_capacity(batch.num_rows());
        let mut reason = Vec::with_capacity(batch.num_rows());
        for i in 0..batch.num_rows() {
            let g = if gold.is_null(i) { "" } else { gold.value(i) };
            let t = if text.is_null(i) { "" } else { text.value(i) };
            let v = grade(t, g, opts);
            tally.add(&v);
            extracted.push(v.extracted);
            correct.push(v.correct);
            reason.push(v.reason.as_str());
        }
        first_row += batch.num_rows();
        if out.is_some() {
            graded.push(append_columns(
                &batch,
                vec![
                    (
                        "extracted_answer",
                        Arc::new(StringArray::from(extracted)) as ArrayRef,
                    ),
                    ("correct", Arc::new(BooleanArray::from(correct))),
                    ("reason", Arc::new(StringArray::from(reason))),
                ],
            )?);
        }
    }
    no_rows(&args.input, &tally)?;
    if let (Some(kind), Some(path)) = (out, &args.output) {
        write_batches(path, kind, &graded)?;
    }
    Ok(tally)
}

/// The batch with `extra` columns added (replacing columns of the same name).
fn append_columns(batch: &RecordBatch, extra: Vec<(&str, ArrayRef)>) -> Result<RecordBatch> {
    let schema = batch.schema();
    let mut fields: Vec<Field> = Vec::new();
    let mut cols: Vec<ArrayRef> = Vec::new();
    for (f, c) in schema.fields().iter().zip(batch.columns()) {
        if !extra.iter().any(|(n, _)| n == f.name()) {
            fields.push(f.as_ref().clone());
            cols.push(c.clone());
        }
    }
    for (name, col) in extra {
        fields.push(Field::new(name, col.data_type().clone(), true));
        cols.push(col);
    }
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone())),
        cols,
    )?)
}

fn write_batches(path: &Path, kind: FileKind, batches: &[RecordBatch]) -> Result<()> {
    let Some(first) = batches.first() else {
        bail!("the input has no rows; nothing to write");
    };
    let schema = first.schema();
    match kind {
        FileKind::Parquet => {
            commit_file(path, |tmp| {
                let mut w = ArrowWriter::try_new(
                    File::create(tmp)?,
                    schema.clone(),
                    Some(writer_properties()?),
                )?;
                for b in batches {
                    w.write(b)?;
                }
                w.into_inner()?.sync_all()?;
                Ok(())
            })?;
        }
        FileKind::Jsonl => {
            commit_file(path, |tmp| {
                let f = File::create(tmp)?;
                let mut w = arrow_json::WriterBuilder::new()
                    .with_explicit_nulls(true)
                    .build::<_, arrow_json::writer::LineDelimited>(BufWriter::new(f));
                for b in batches {
                    w.write(b)?;
                }
                w.finish()?;
                w.into_inner()
                    .into_inner()
                    .map_err(|e| e.into_error())?
                    .sync_all()?;
                Ok(())
            })?;
        }
    }
    Ok(())
}

//! Every Parquet schema the project writes, the row structs behind them, and the one Parquet
//! writer (zstd, bounded row groups, atomic commit).
//!
//! One place names the columns: stages build rows and call `*_batch`, readers call `read_*`.
//! Knows nothing about where rows come from or what a stage does with them.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use arrow_array::builder::{Int32Builder, ListBuilder};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int32Type, Int64Type};
use arrow_array::{
    Array, ArrayRef, BooleanArray, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::store::commit_file;

/// Rows per Parquet row group: small enough to resume and stream, large enough to compress.
pub const ROW_GROUP_ROWS: usize = 4096;

// ---------------------------------------------------------------------------------------------
// Problems (the data stage's output)
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// `<source>/<native id>` or `<source>/<hash of the problem text>`.
    pub problem_id: String,
    pub source: String,
    /// 1-based line or row in the source file.
    pub source_row: i64,
    pub problem: String,
    pub gold_answer: String,
    pub solution: Option<String>,
    pub subject: Option<String>,
    pub level: Option<String>,
}

pub fn problems_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("problem_id", DataType::Utf8, false),
        Field::new("source", DataType::Utf8, false),
        Field::new("source_row", DataType::Int64, false),
        Field::new("problem", DataType::Utf8, false),
        Field::new("gold_answer", DataType::Utf8, false),
        Field::new("solution", DataType::Utf8, true),
        Field::new("subject", DataType::Utf8, true),
        Field::new("level", DataType::Utf8, true),
    ]))
}

pub fn problems_batch(rows: &[Problem]) -> Result<RecordBatch> {
    let cols: Vec<ArrayRef> = vec![
        strs(rows.iter().map(|r| Some(r.problem_id.as_str()))),
        strs(rows.iter().map(|r| Some(r.source.as_str()))),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.source_row),
        )),
        strs(rows.iter().map(|r| Some(r.problem.as_str()))),
        strs(rows.iter().map(|r| Some(r.gold_answer.as_str()))),
        strs(rows.iter().map(|r| r.solution.as_deref())),
        strs(rows.iter().map(|r| r.subject.as_deref())),
        strs(rows.iter().map(|r| r.level.as_deref())),
    ];
    Ok(RecordBatch::try_new(problems_schema(), cols)?)
}

pub fn read_problems(path: &Path) -> Result<Vec<Problem>> {
    let mut out = Vec::new();
    for batch in crate::data::records::open_parquet(path, 8192)? {
        let b = batch.with_context(|| format!("cannot read {}", path.display()))?;
        let c = Cols::new(&b, path);
        let (id, src, row, prob, gold) = (
            c.str("problem_id")?,
            c.str("source")?,
            c.i64("source_row")?,
            c.str("problem")?,
            c.str("gold_answer")?,
        );
        let (sol, subj, lvl) = (
            c.opt_str("solution")?,
            c.opt_str("subject")?,
            c.opt_str("level")?,
        );
        for i in 0..b.num_rows() {
            out.push(Problem {
                problem_id: id.value(i).to_string(),
                source: src.value(i).to_string(),
                source_row: row.value(i),
                problem: prob.value(i).to_string(),
                gold_answer: gold.value(i).to_string(),
                solution: get_str(sol.as_ref(), i),
                subject: get_str(subj.as_ref(), i),
                level: get_str(lvl.as_ref(), i),
            });
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Completions (what the sampler writes; the filter adds the grade)
// ---------------------------------------------------------------------------------------------

/// A verifier's judgement of one completion.
#[derive(Debug, Clone, PartialEq)]
pub struct Grade {
    pub gold_answer: String,
    pub extracted_answer: Option<String>,
    pub correct: bool,
    /// `verify::Reason::as_str`.
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub problem_id: String,
    pub sample_index: i32,
    pub prompt: String,
    pub prompt_token_ids: Option<Vec<i32>>,
    pub completion: String,
    pub completion_token_ids: Option<Vec<i32>>,
    /// `stop`, `length` (truncated) or `None` for imported text.
    pub finish_reason: Option<String>,
    pub num_completion_tokens: Option<i32>,
    pub cumulative_logprob: Option<f64>,
    pub seed: Option<i64>,
    pub model: Option<String>,
    pub sampling_hash: Option<String>,
    pub grade: Option<Grade>,
}

fn completion_fields() -> Vec<Field> {
    vec![
        Field::new("problem_id", DataType::Utf8, false),
        Field::new("sample_index", DataType::Int32, false),
        Field::new("prompt", DataType::Utf8, false),
        Field::new("prompt_token_ids", token_list_type(), true),
        Field::new("completion", DataType::Utf8, false),
        Field::new("completion_token_ids", token_list_type(), true),
        Field::new("finish_reason", DataType::Utf8, true),
        Field::new("num_completion_tokens", DataType::Int32, true),
        Field::new("cumulative_logprob", DataType::Float64, true),
        Field::new("seed", DataType::Int64, true),
        Field::new("model", DataType::Utf8, true),
        Field::new("sampling_hash", DataType::Utf8, true),
    ]
}

fn grade_fields() -> Vec<Field> {
    vec![
        Field::new("gold_answer", DataType::Utf8, false),
        Field::new("extracted_answer", DataType::Utf8, true),
        Field::new("correct", DataType::Boolean, false),
        Field::new("reason", DataType::Utf8, false),
    ]
}

fn token_list_type() -> DataType {
    DataType::List(Arc::new(Field::new("item", DataType::Int32, true)))
}

/// The completions schema; `graded` adds `gold_answer`, `extracted_answer`, `correct`, `reason`.
pub fn completions_schema(graded: bool) -> SchemaRef {
    let mut f = completion_fields();
    if graded {
        f.extend(grade_fields());
    }
    Arc::new(Schema::new(f))
}

pub fn completions_batch(rows: &[Completion], graded: bool) -> Result<RecordBatch> {
    let mut cols: Vec<ArrayRef> = vec![
        strs(rows.iter().map(|r| Some(r.problem_id.as_str()))),
        Arc::new(Int32Array::from_iter_values(
            rows.iter().map(|r| r.sample_index),
        )),
        strs(rows.iter().map(|r| Some(r.prompt.as_str()))),
        token_lists(rows.iter().map(|r| r.prompt_token_ids.as_deref())),
        strs(rows.iter().map(|r| Some(r.completion.as_str()))),
        token_lists(rows.iter().map(|r| r.completion_token_ids.as_deref())),
        strs(rows.iter().map(|r| r.finish_reason.as_deref())),
        Arc::new(Int32Array::from_iter(
            rows.iter().map(|r| r.num_completion_tokens),
        )),
        Arc::new(Float64Array::from_iter(
            rows.iter().map(|r| r.cumulative_logprob),
        )),
        Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.seed))),
        strs(rows.iter().map(|r| r.model.as_deref())),
        strs(rows.iter().map(|r| r.sampling_hash.as_deref())),
    ];
    if graded {
        let g: Vec<&Grade> = rows
            .iter()
            .map(|r| {
                r.grade
                    .as_ref()
                    .ok_or_else(|| anyhow!("row {} has no grade", r.problem_id))
            })
            .collect::<Result<_>>()?;
        cols.push(strs(g.iter().map(|g| Some(g.gold_answer.as_str()))));
        cols.push(strs(g.iter().map(|g| g.extracted_answer.as_deref())));
        cols.push(Arc::new(BooleanArray::from(
            g.iter().map(|g| g.correct).collect::<Vec<_>>(),
        )));
        cols.push(strs(g.iter().map(|g| Some(g.reason.as_str()))));
    }
    Ok(RecordBatch::try_new(completions_schema(graded), cols)?)
}

/// Reads a completions Parquet (ours, or any file with at least `problem_id` and `completion`;
/// the other columns are optional). The grade columns are read when all four are present.
pub fn read_completions(path: &Path) -> Result<Vec<Completion>> {
    let mut out = Vec::new();
    for batch in crate::data::records::open_parquet(path, 8192)? {
        let b = batch.with_context(|| format!("cannot read {}", path.display()))?;
        let c = Cols::new(&b, path);
        let pid = c.str("problem_id")?;
        let text = c.str("completion")?;
        let sidx = c.opt_i64("sample_index")?;
        let prompt = c.opt_str("prompt")?;
        let ptok = c.opt_tokens("prompt_token_ids")?;
        let ctok = c.opt_tokens("completion_token_ids")?;
        let fin = c.opt_str("finish_reason")?;
        let ntok = c.opt_i64("num_completion_tokens")?;
        let lp = c.opt_f64("cumulative_logprob")?;
        let seed = c.opt_i64("seed")?;
        let model = c.opt_str("model")?;
        let shash = c.opt_str("sampling_hash")?;
        let gold = c.opt_str("gold_answer")?;
        let ext = c.opt_str("extracted_answer")?;
        let correct = c.opt_bool("correct")?;
        let reason = c.opt_str("reason")?;
        for i in 0..b.num_rows() {
            let grade = match (&gold, &correct, &reason) {
                (Some(g), Some(ok), Some(r)) if !g.is_null(i) && !ok.is_null(i) => Some(Grade {
                    gold_answer: g.value(i).to_string(),
                    extracted_answer: get_str(ext.as_ref(), i),
                    correct: ok.value(i),
                    reason: r.value(i).to_string(),
                }),
                _ => None,
            };
            let narrow = |v: Option<i64>, col: &str| -> Result<Option<i32>> {
                v.map(|v| {
                    i32::try_from(v)
                        .map_err(|_| anyhow!("{}: `{col}` = {v} is out of range", path.display()))
                })
                .transpose()
            };
            out.push(Completion {
                problem_id: pid.value(i).to_string(),
                sample_index: narrow(get_i64(sidx.as_ref(), i), "sample_index")?.unwrap_or(0),
                prompt: get_str(prompt.as_ref(), i).unwrap_or_default(),
                prompt_token_ids: get_tokens(ptok.as_ref(), i).map_err(|_| {
                    anyhow!(
                        "{}: row {}: `prompt_token_ids` has a null or out-of-range id",
                        path.display(),
                        out.len() + 1
                    )
                })?,
                completion: text.value(i).to_string(),
                completion_token_ids: get_tokens(ctok.as_ref(), i).map_err(|_| {
                    anyhow!(
                        "{}: row {}: `completion_token_ids` has a null or out-of-range id",
                        path.display(),
                        out.len() + 1
                    )
                })?,
                finish_reason: get_str(fin.as_ref(), i),
                num_completion_tokens: narrow(get_i64(ntok.as_ref(), i), "num_completion_tokens")?,
                cumulative_logprob: lp.as_ref().filter(|a| !a.is_null(i)).map(|a| a.value(i)),
                seed: get_i64(seed.as_ref(), i),
                model: get_str(model.as_ref(), i),
                sampling_hash: get_str(shash.as_ref(), i),
                grade,
            });
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// SFT rows (the filter's output, the trainer's input)
// ---------------------------------------------------------------------------------------------

pub fn sft_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("problem_id", DataType::Utf8, false),
        Field::new("sample_index", DataType::Int32, false),
        Field::new("prompt", DataType::Utf8, false),
        Field::new("completion", DataType::Utf8, false),
        Field::new("prompt_token_ids", token_list_type(), true),
        Field::new("completion_token_ids", token_list_type(), true),
        Field::new("num_completion_tokens", DataType::Int32, true),
        Field::new("gold_answer", DataType::Utf8, false),
        Field::new("extracted_answer", DataType::Utf8, true),
        Field::new("reason", DataType::Utf8, false),
        Field::new("model", DataType::Utf8, true),
    ]))
}

/// SFT rows are graded completions; every row must carry its grade.
pub fn sft_batch(rows: &[Completion]) -> Result<RecordBatch> {
    let g: Vec<&Grade> = rows
        .iter()
        .map(|r| {
            r.grade
                .as_ref()
                .ok_or_else(|| anyhow!("SFT row {} has no grade", r.problem_id))
        })
        .collect::<Result<_>>()?;
    let cols: Vec<ArrayRef> = vec![
        strs(rows.iter().map(|r| Some(r.problem_id.as_str()))),
        Arc::new(Int32Array::from_iter_values(
            rows.iter().map(|r| r.sample_index),
        )),
        strs(rows.iter().map(|r| Some(r.prompt.as_str()))),
        strs(rows.iter().map(|r| Some(r.completion.as_str()))),
        token_lists(rows.iter().map(|r| r.prompt_token_ids.as_deref())),
        token_lists(rows.iter().map(|r| r.completion_token_ids.as_deref())),
        Arc::new(Int32Array::from_iter(
            rows.iter().map(|r| r.num_completion_tokens),
        )),
        strs(g.iter().map(|g| Some(g.gold_answer.as_str()))),
        strs(g.iter().map(|g| g.extracted_answer.as_deref())),
        strs(g.iter().map(|g| Some(g.reason.as_str()))),
        strs(rows.iter().map(|r| r.model.as_deref())),
    ];
    Ok(RecordBatch::try_new(sft_schema(), cols)?)
}

// ---------------------------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------------------------

pub fn writer_properties() -> Result<WriterProperties> {
    Ok(WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
        .set_max_row_group_size(ROW_GROUP_ROWS)
        .set_created_by(format!("selfdistill {}", env!("CARGO_PKG_VERSION")))
        .build())
}

/// Writes `batches` to `path` atomically: a temp file in the same folder, fsync, rename.
/// A crash leaves either the old state or the whole new file, never a partial one at `path`.
pub fn write_parquet_atomic(
    path: &Path,
    schema: SchemaRef,
    batches: &[RecordBatch],
) -> Result<u64> {
    write_parquet_atomic_kv(path, schema, batches, &[])
}

/// [`write_parquet_atomic`] with file-level key/value metadata (e.g. a shard's identity).
pub fn write_parquet_atomic_kv(
    path: &Path,
    schema: SchemaRef,
    batches: &[RecordBatch],
    kv: &[(String, String)],
) -> Result<u64> {
    let mut props = writer_properties()?;
    if !kv.is_empty() {
        props = props
            .into_builder()
            .set_key_value_metadata(Some(
                kv.iter()
                    .map(|(k, v)| parquet::file::metadata::KeyValue::new(k.clone(), v.clone()))
                    .collect(),
            ))
            .build();
    }
    commit_file(path, |tmp| {
        let f = File::create(tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
        let mut w = ArrowWriter::try_new(f, schema.clone(), Some(props.clone()))?;
        for b in batches {
            w.write(b)?;
        }
        let f = w.into_inner()?;
        f.sync_all()?;
        Ok(())
    })
}

/// A Parquet file's key/value metadata.
pub fn read_kv_metadata(path: &Path) -> Result<Vec<(String, String)>> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let r = SerializedFileReader::new(f)
        .with_context(|| format!("{} is not a readable Parquet file", path.display()))?;
    Ok(r.metadata()
        .file_metadata()
        .key_value_metadata()
        .map(|kv| {
            kv.iter()
                .map(|e| (e.key.clone(), e.value.clone().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default())
}

// ---------------------------------------------------------------------------------------------
// Column helpers
// ---------------------------------------------------------------------------------------------

fn strs<'a>(it: impl Iterator<Item = Option<&'a str>>) -> ArrayRef {
    Arc::new(StringArray::from_iter(it))
}

fn token_lists<'a>(it: impl Iterator<Item = Option<&'a [i32]>>) -> ArrayRef {
    let mut b = ListBuilder::new(Int32Builder::new());
    for v in it {
        match v {
            Some(ids) => {
                b.values().append_slice(ids);
                b.append(true);
            }
            None => b.append(false),
        }
    }
    Arc::new(b.finish())
}

/// Typed column access by name with casts, so files from other writers (large strings,
/// int64 where we use int32, dictionary strings) read the same.
struct Cols<'a> {
    batch: &'a RecordBatch,
    path: &'a Path,
}

impl<'a> Cols<'a> {
    fn new(batch: &'a RecordBatch, path: &'a Path) -> Self {
        Cols { batch, path }
    }

    fn cast(&self, name: &str, to: &DataType) -> Result<Option<ArrayRef>> {
        let Some(col) = self.batch.column_by_name(name) else {
            return Ok(None);
        };
        arrow_cast::cast(col, to)
            .map(Some)
            .with_context(|| format!("{}: column `{name}` is not {to}", self.path.display()))
    }

    fn required(&self, name: &str, to: &DataType) -> Result<ArrayRef> {
        self.cast(name, to)?.ok_or_else(|| {
            anyhow!(
                "{}: missing column `{name}` (columns: {})",
                self.path.display(),
                self.batch
                    .schema()
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
    }

    fn str(&self, name: &str) -> Result<StringArray> {
        let a = self.required(name, &DataType::Utf8)?;
        if a.null_count() > 0 {
            bail!("{}: column `{name}` has nulls", self.path.display());
        }
        Ok(a.as_string::<i32>().clone())
    }

    fn opt_str(&self, name: &str) -> Result<Option<StringArray>> {
        Ok(self
            .cast(name, &DataType::Utf8)?
            .map(|a| a.as_string::<i32>().clone()))
    }

    fn i64(&self, name: &str) -> Result<Int64Array> {
        Ok(self
            .required(name, &DataType::Int64)?
            .as_primitive::<Int64Type>()
            .clone())
    }

    fn opt_i64(&self, name: &str) -> Result<Option<Int64Array>> {
        Ok(self
            .cast(name, &DataType::Int64)?
            .map(|a| a.as_primitive::<Int64Type>().clone()))
    }

    fn opt_f64(&self, name: &str) -> Result<Option<Float64Array>> {
        Ok(self
            .cast(name, &DataType::Float64)?
            .map(|a| a.as_primitive::<Float64Type>().clone()))
    }

    fn opt_bool(&self, name: &str) -> Result<Option<BooleanArray>> {
        Ok(self
            .cast(name, &DataType::Boolean)?
            .map(|a| a.as_boolean().clone()))
    }

    fn opt_tokens(&self, name: &str) -> Result<Option<arrow_array::ListArray>> {
        Ok(self
            .cast(name, &token_list_type())?
            .map(|a| a.as_list::<i32>().clone()))
    }
}

fn get_str(a: Option<&StringArray>, i: usize) -> Option<String> {
    a.filter(|a| !a.is_null(i)).map(|a| a.value(i).to_string())
}

fn get_i64(a: Option<&Int64Array>, i: usize) -> Option<i64> {
    a.filter(|a| !a.is_null(i)).map(|a| a.value(i))
}

/// A row's token ids; `Err` when an id is null (or did not fit in int32 when cast).
fn get_tokens(
    a: Option<&arrow_array::ListArray>,
    i: usize,
) -> std::result::Result<Option<Vec<i32>>, ()> {
    let Some(a) = a.filter(|a| !a.is_null(i)) else {
        return Ok(None);
    };
    let v = a.value(i);
    let ids = v.as_primitive::<Int32Type>();
    if ids.null_count() > 0 {
        return Err(());
    }
    Ok(Some(ids.values().to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(i: i32, graded: bool) -> Completion {
        Completion {
            problem_id: format!("p/{i}"),
            sample_index: i,
            prompt: "What is 1+1?".into(),
            prompt_token_ids: Some(vec![1, 2, 3]),
            completion: "2".into(),
            completion_token_ids: if i % 2 == 0 { Some(vec![7]) } else { None },
            finish_reason: Some("stop".into()),
            num_completion_tokens: Some(1),
            cumulative_logprob: Some(-0.5),
            seed: Some(42),
            model: Some("m".into()),
            sampling_hash: Some("h".into()),
            grade: graded.then(|| Grade {
                gold_answer: "2".into(),
                extracted_answer: None,
                correct: false,
                reason: "no_answer".into(),
            }),
        }
    }

    #[test]
    fn completions_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        for graded in [false, true] {
            let p = dir.path().join(format!("c{graded}.parquet"));
            let rows: Vec<_> = (0..5).map(|i| row(i, graded)).collect();
            let b = completions_batch(&rows, graded).unwrap();
            write_parquet_atomic(&p, completions_schema(graded), &[b]).unwrap();
            assert_eq!(read_completions(&p).unwrap(), rows);
        }
    }

    #[test]
    fn problems_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("p.parquet");
        let rows = vec![Problem {
            problem_id: "s/1".into(),
            source: "s".into(),
            source_row: 1,
            problem: "x".into(),
            gold_answer: "3".into(),
            solution: None,
            subject: Some("Algebra".into()),
            level: None,
        }];
        write_parquet_atomic(&p, problems_schema(), &[problems_batch(&rows).unwrap()]).unwrap();
        assert_eq!(read_problems(&p).unwrap(), rows);
    }
}

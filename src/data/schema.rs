//! Every Parquet schema the project writes, the row structs behind them, and the one Parquet
//! writer (zstd, bounded row groups, atomic commit).
//!
//! One place names the columns: stages build rows and call `*_batch`, readers call `read_*`.
//! Knows nothing about where rows come from or what a stage does with them.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use arrow_array::builder::{Float32Builder, Int32Builder, ListBuilder};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Float64Type, Int32Type, Int64Type};
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
    /// Per generated token, when the sampler was asked for logprobs.
    pub logprobs: Option<Logprobs>,
    /// Sampled with the gold answer as a hint (STaR's rationalization), stored under the
    /// original prompt: the hint is not in `prompt` or `prompt_token_ids`.
    pub rationalized: bool,
}

impl Completion {
    /// A completion given as text (a worked solution, an imported row): no tokens, grade or
    /// sampling record; `model` says where it came from.
    pub fn text(
        problem_id: String,
        prompt: String,
        completion: String,
        model: Option<String>,
    ) -> Completion {
        Completion {
            problem_id,
            sample_index: 0,
            prompt,
            prompt_token_ids: None,
            completion,
            completion_token_ids: None,
            finish_reason: None,
            num_completion_tokens: None,
            cumulative_logprob: None,
            seed: None,
            model,
            sampling_hash: None,
            grade: None,
            logprobs: None,
            rationalized: false,
        }
    }
}

/// Log-probabilities of a completion's tokens, one entry per `completion_token_ids` entry, as
/// vLLM returns them: the raw model's (`log_softmax` of the logits before penalties,
/// temperature and truncation). A token the sampler did not draw (the thinking budget's forced
/// closing text) has no log-probability and no alternatives.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Logprobs {
    /// The chosen token's log-probability; `None` for a forced token.
    pub token: Vec<Option<f32>>,
    /// The K most likely tokens at each position, most likely first (ties: lower id first).
    pub top_ids: Vec<Vec<i32>>,
    /// Their log-probabilities, in the same order.
    pub top: Vec<Vec<f32>>,
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
        Field::new("rationalized", DataType::Boolean, false),
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

/// The columns of a sampler run with `logprobs = K`.
fn logprob_fields() -> Vec<Field> {
    vec![
        Field::new("token_logprobs", float_list_type(), true),
        Field::new("top_logprob_ids", nested(token_list_type()), true),
        Field::new("top_logprobs", nested(float_list_type()), true),
    ]
}

fn token_list_type() -> DataType {
    DataType::List(Arc::new(Field::new("item", DataType::Int32, true)))
}

fn float_list_type() -> DataType {
    DataType::List(Arc::new(Field::new("item", DataType::Float32, true)))
}

fn nested(inner: DataType) -> DataType {
    DataType::List(Arc::new(Field::new("item", inner, true)))
}

/// The completions schema; `graded` adds `gold_answer`, `extracted_answer`, `correct`, `reason`;
/// `logprobs` adds `token_logprobs`, `top_logprob_ids`, `top_logprobs`.
pub fn completions_schema(graded: bool, logprobs: bool) -> SchemaRef {
    let mut f = completion_fields();
    if graded {
        f.extend(grade_fields());
    }
    if logprobs {
        f.extend(logprob_fields());
    }
    Arc::new(Schema::new(f))
}

/// Whether any row carries logprobs (the schema its file gets).
pub fn has_logprobs(rows: &[Completion]) -> bool {
    rows.iter().any(|r| r.logprobs.is_some())
}

pub fn completions_batch(rows: &[Completion], graded: bool, logprobs: bool) -> Result<RecordBatch> {
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
        rationalized_column(rows),
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
    if logprobs {
        cols.extend(logprob_columns(rows));
    }
    Ok(RecordBatch::try_new(
        completions_schema(graded, logprobs),
        cols,
    )?)
}

/// Writes `rows` as a completions Parquet at `path`, atomically, in row groups of
/// [`ROW_GROUP_ROWS`]: with the grade columns when `graded`, with the logprob columns when any
/// row has logprobs. Returns the row count.
pub fn write_completions(path: &Path, rows: &[Completion], graded: bool) -> Result<u64> {
    let logprobs = has_logprobs(rows);
    let batches = rows
        .chunks(ROW_GROUP_ROWS)
        .map(|c| completions_batch(c, graded, logprobs))
        .collect::<Result<Vec<_>>>()?;
    write_parquet_atomic(path, completions_schema(graded, logprobs), &batches)?;
    Ok(rows.len() as u64)
}

/// Per problem of graded `rows`: (graded samples, correct samples). Rationalized rows (sampled
/// with the answer as a hint) say nothing of how well the model solves a problem: not counted.
pub fn pass_rates(rows: &[Completion]) -> std::collections::HashMap<String, (u64, u64)> {
    let mut out: std::collections::HashMap<String, (u64, u64)> = std::collections::HashMap::new();
    for r in rows.iter().filter(|r| !r.rationalized) {
        if let Some(g) = &r.grade {
            let e = out.entry(r.problem_id.clone()).or_default();
            e.0 += 1;
            e.1 += g.correct as u64;
        }
    }
    out
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
        let rationalized = c.opt_bool("rationalized")?;
        let gold = c.opt_str("gold_answer")?;
        let ext = c.opt_str("extracted_answer")?;
        let correct = c.opt_bool("correct")?;
        let reason = c.opt_str("reason")?;
        let token_lp = c.opt_list("token_logprobs", float_list_type())?;
        let top_ids = c.opt_list("top_logprob_ids", nested(token_list_type()))?;
        let top_lp = c.opt_list("top_logprobs", nested(float_list_type()))?;
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
                logprobs: get_logprobs(token_lp.as_ref(), top_ids.as_ref(), top_lp.as_ref(), i)
                    .with_context(|| format!("{}: row {}", path.display(), out.len() + 1))?,
                rationalized: rationalized
                    .as_ref()
                    .is_some_and(|a| !a.is_null(i) && a.value(i)),
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
        Field::new("rationalized", DataType::Boolean, false),
    ]))
}

fn rationalized_column(rows: &[Completion]) -> ArrayRef {
    Arc::new(BooleanArray::from(
        rows.iter().map(|r| r.rationalized).collect::<Vec<_>>(),
    ))
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
        rationalized_column(rows),
    ];
    Ok(RecordBatch::try_new(sft_schema(), cols)?)
}

// ---------------------------------------------------------------------------------------------
// Contamination (the filter's and `data decontaminate`'s record of what matched an eval set)
// ---------------------------------------------------------------------------------------------

/// A training problem that matched an eval problem.
#[derive(Debug, Clone, PartialEq)]
pub struct Contamination {
    pub problem_id: String,
    pub eval_set: String,
    pub eval_problem_id: String,
    /// `exact` or `ngram`.
    pub kind: String,
    /// The shared words, normalised.
    pub text: String,
}

pub fn contamination_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("problem_id", DataType::Utf8, false),
        Field::new("eval_set", DataType::Utf8, false),
        Field::new("eval_problem_id", DataType::Utf8, false),
        Field::new("match", DataType::Utf8, false),
        Field::new("text", DataType::Utf8, false),
    ]))
}

pub fn contamination_batch(rows: &[Contamination]) -> Result<RecordBatch> {
    let cols: Vec<ArrayRef> = vec![
        strs(rows.iter().map(|r| Some(r.problem_id.as_str()))),
        strs(rows.iter().map(|r| Some(r.eval_set.as_str()))),
        strs(rows.iter().map(|r| Some(r.eval_problem_id.as_str()))),
        strs(rows.iter().map(|r| Some(r.kind.as_str()))),
        strs(rows.iter().map(|r| Some(r.text.as_str()))),
    ];
    Ok(RecordBatch::try_new(contamination_schema(), cols)?)
}

/// Writes `rows` as `path` (atomically; an empty file when there are none).
pub fn write_contamination(path: &Path, rows: &[Contamination]) -> Result<u64> {
    let batches = rows
        .chunks(ROW_GROUP_ROWS)
        .map(contamination_batch)
        .collect::<Result<Vec<_>>>()?;
    write_parquet_atomic(path, contamination_schema(), &batches)
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

/// The three logprob columns of `rows` (null where a row has none).
fn logprob_columns(rows: &[Completion]) -> [ArrayRef; 3] {
    let mut token = ListBuilder::new(Float32Builder::new());
    let mut ids = ListBuilder::new(ListBuilder::new(Int32Builder::new()));
    let mut top = ListBuilder::new(ListBuilder::new(Float32Builder::new()));
    for r in rows {
        let Some(lp) = &r.logprobs else {
            token.append(false);
            ids.append(false);
            top.append(false);
            continue;
        };
        token.values().extend(lp.token.iter().copied());
        token.append(true);
        for v in &lp.top_ids {
            ids.values().values().append_slice(v);
            ids.values().append(true);
        }
        ids.append(true);
        for v in &lp.top {
            top.values().values().append_slice(v);
            top.values().append(true);
        }
        top.append(true);
    }
    [
        Arc::new(token.finish()),
        Arc::new(ids.finish()),
        Arc::new(top.finish()),
    ]
}

/// A row's logprobs from the three columns (all present and non-null, or none).
fn get_logprobs(
    token: Option<&arrow_array::ListArray>,
    ids: Option<&arrow_array::ListArray>,
    top: Option<&arrow_array::ListArray>,
    i: usize,
) -> Result<Option<Logprobs>> {
    let (Some(token), Some(ids), Some(top)) = (token, ids, top) else {
        return Ok(None);
    };
    if token.is_null(i) {
        return Ok(None);
    }
    let t = token.value(i);
    let (ids, top) = (ids.value(i), top.value(i));
    let (ids, top) = (ids.as_list::<i32>(), top.as_list::<i32>());
    let mut lp = Logprobs {
        token: t.as_primitive::<Float32Type>().iter().collect(),
        ..Logprobs::default()
    };
    for k in 0..ids.len() {
        let v = ids.value(k);
        let v = v.as_primitive::<Int32Type>();
        if v.null_count() > 0 {
            bail!("`top_logprob_ids` has a null id");
        }
        lp.top_ids.push(v.values().to_vec());
    }
    for k in 0..top.len() {
        let v = top.value(k);
        lp.top.push(
            v.as_primitive::<Float32Type>()
                .iter()
                .map(|x| x.unwrap_or(f32::NAN))
                .collect(),
        );
    }
    let n = lp.token.len();
    if lp.top_ids.len() != n || lp.top.len() != n {
        bail!(
            "the logprob columns disagree on the number of tokens ({n}, {}, {})",
            lp.top_ids.len(),
            lp.top.len()
        );
    }
    Ok(Some(lp))
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

    fn opt_list(&self, name: &str, to: DataType) -> Result<Option<arrow_array::ListArray>> {
        Ok(self.cast(name, &to)?.map(|a| a.as_list::<i32>().clone()))
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
            logprobs: None,
            rationalized: i == 3,
        }
    }

    #[test]
    fn completions_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        for graded in [false, true] {
            for logprobs in [false, true] {
                let p = dir.path().join(format!("c{graded}{logprobs}.parquet"));
                let mut rows: Vec<_> = (0..5).map(|i| row(i, graded)).collect();
                if logprobs {
                    for r in rows.iter_mut().skip(1) {
                        r.logprobs = Some(Logprobs {
                            token: vec![Some(-0.25), None, Some(-1.5)],
                            top_ids: vec![vec![7, 3], vec![], vec![1, 2]],
                            top: vec![vec![-0.25, -2.0], vec![], vec![-1.0, -1.5]],
                        });
                    }
                }
                let b = completions_batch(&rows, graded, logprobs).unwrap();
                write_parquet_atomic(&p, completions_schema(graded, logprobs), &[b]).unwrap();
                assert_eq!(read_completions(&p).unwrap(), rows);
            }
        }
    }

    /// docs/parquet.md's table of each file's columns names every column, in schema order.
    #[test]
    fn readme_documents_every_column() {
        let readme = include_str!("../../docs/parquet.md");
        let documented = |heading: &str| -> Vec<String> {
            let at = readme
                .find(heading)
                .unwrap_or_else(|| panic!("{heading} missing"));
            readme[at..]
                .lines()
                .skip_while(|l| !l.starts_with("| column"))
                .skip(2)
                .take_while(|l| l.starts_with("| `"))
                .filter_map(|l| l.split('`').nth(1).map(str::to_string))
                .collect()
        };
        let names =
            |s: SchemaRef| -> Vec<String> { s.fields().iter().map(|f| f.name().clone()).collect() };
        assert_eq!(
            documented("**`problems.parquet`**"),
            names(problems_schema())
        );
        assert_eq!(
            documented("**Completions**"),
            names(completions_schema(true, true))
        );
        assert_eq!(documented("**`sft.parquet`**"), names(sft_schema()));
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

//! `pipeline data decontaminate` and `pipeline bench decontaminate`: the filter stage's
//! decontamination ([`crate::data::decontaminate`]) for any training file against any eval sets
//! or files, with the overlap table, the surviving rows (`--output`, same format as the input)
//! and the matches (`--matches`, the filter's `contamination.parquet` schema).
//!
//! Knows nothing of stages.

use std::collections::HashSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::data::decontaminate::{read_problem_texts, Index, MatchKind, Reference, TextRow};
use crate::data::records::FileKind;
use crate::data::schema::{write_contamination, Contamination};
use crate::eval::against::Against;

#[derive(Debug, clap::Args)]
pub struct DecontaminateArgs {
    /// The training file (JSONL or Parquet).
    #[arg(long)]
    pub train: PathBuf,
    /// The field holding the problem text; default: the first of problem, question, Problem,
    /// Question, prompt that the file has.
    #[arg(long)]
    pub field: Option<String>,
    /// Eval set names, groups (math-core, math-hard), set definitions (.toml) or data files,
    /// comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub against: Vec<String>,
    /// Words per n-gram.
    #[arg(long, default_value_t = crate::data::decontaminate::DEFAULT_NGRAM)]
    pub ngram: usize,
    /// Where the training rows that match nothing go, in the input's format.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Where the matches go (Parquet: problem_id, eval_set, eval_problem_id, match, text).
    #[arg(long)]
    pub matches: Option<PathBuf>,
}

pub fn run(a: &DecontaminateArgs) -> Result<()> {
    for (o, flag) in [(&a.output, "--output"), (&a.matches, "--matches")] {
        if let Some(o) = o {
            crate::store::check_output_file(o, &[&a.train], flag)?;
        }
    }
    let against = Against::resolve(&a.against, Path::new("."))?;
    let t = Instant::now();
    let refs = against
        .iter()
        .map(Against::load)
        .collect::<Result<Vec<_>>>()?;
    let loaded = t.elapsed().as_secs_f64();
    let (field, rows) = read_problem_texts(&a.train, a.field.as_deref())?;
    let t = Instant::now();
    let index = Index::new(a.ngram, &refs)?;
    let indexed = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let (matches, per_set) = check(&index, &rows);
    let checked = t.elapsed().as_secs_f64();

    crate::outln!(
        "{}: {} training problems (field `{field}`) against {} set(s), {}-grams",
        a.train.display(),
        rows.len(),
        refs.len(),
        a.ngram
    );
    crate::outln!("| against | problems | training problems matched | exact | n-gram |");
    crate::outln!("| --- | --- | --- | --- | --- |");
    for (r, (exact, ngram)) in refs.iter().zip(&per_set) {
        crate::outln!(
            "| {} | {} | {} | {exact} | {ngram} |",
            r.name,
            r.problems.len(),
            exact + ngram
        );
    }
    let hit: HashSet<usize> = matches.iter().map(|(row, _)| *row).collect();
    crate::outln!(
        "{} of {} training problems ({:.2}%) match an eval problem",
        hit.len(),
        rows.len(),
        100.0 * hit.len() as f64 / rows.len().max(1) as f64
    );
    let (problems, grams) = index.size();
    crate::outln!(
        "time: load {loaded:.2} s, index {indexed:.3} s ({problems} problems, {grams} n-grams), \
         check {checked:.3} s ({:.0} problems/s)",
        rows.len() as f64 / checked.max(1e-9)
    );
    if let Some(out) = &a.output {
        let kept = write_kept(&a.train, out, &hit)?;
        crate::outln!("kept {kept} rows -> {}", out.display());
    }
    if let Some(path) = &a.matches {
        let rows: Vec<Contamination> = matches.into_iter().map(|(_, c)| c).collect();
        write_contamination(path, &rows)?;
        crate::outln!("{} matches -> {}", rows.len(), path.display());
    }
    Ok(())
}

/// The matches of every row, by row number.
type RowMatches = Vec<(usize, Contamination)>;

/// The matches of every row and, per reference, (exact, n-gram) counts.
fn check(index: &Index, rows: &[TextRow]) -> (RowMatches, Vec<(u64, u64)>) {
    let mut per_set = vec![(0u64, 0u64); index.names().len()];
    let mut out = Vec::new();
    for r in rows {
        for (set, c) in index.contamination(&r.id, &r.text) {
            let n = &mut per_set[set];
            if c.kind == MatchKind::Exact.as_str() {
                n.0 += 1;
            } else {
                n.1 += 1;
            }
            out.push((r.row, c));
        }
    }
    (out, per_set)
}

/// Copies the rows of `input` whose row number is not in `drop` to `output` (JSONL lines
/// verbatim; Parquet batches filtered, schema kept), atomically. Returns the rows written.
fn write_kept(input: &Path, output: &Path, drop: &HashSet<usize>) -> Result<u64> {
    let kind = FileKind::of(input)?;
    let out_kind = match output
        .extension()
        .map(|e| e.to_string_lossy().to_lowercase())
    {
        Some(e) if ["parquet", "pq"].contains(&e.as_str()) => FileKind::Parquet,
        Some(e) if ["jsonl", "ndjson", "json"].contains(&e.as_str()) => FileKind::Jsonl,
        _ => kind,
    };
    if out_kind != kind {
        bail!(
            "--output {}: the kept rows are written in the input's format ({:?}); give a path \
             with its extension",
            output.display(),
            kind
        );
    }
    let mut kept = 0u64;
    match kind {
        FileKind::Jsonl => {
            let text =
                std::fs::read(input).with_context(|| format!("cannot read {}", input.display()))?;
            crate::store::commit_file(output, |tmp| {
                let mut f = std::io::BufWriter::new(std::fs::File::create(tmp)?);
                for (i, line) in text.split(|b| *b == b'\n').enumerate() {
                    let blank = line.iter().all(u8::is_ascii_whitespace);
                    if blank || drop.contains(&(i + 1)) {
                        continue;
                    }
                    f.write_all(line)?;
                    f.write_all(b"\n")?;
                    kept += 1;
                }
                f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
                Ok(())
            })?;
        }
        FileKind::Parquet => {
            let reader = crate::data::records::open_parquet(input, 4096)?;
            let schema = arrow_array::RecordBatchReader::schema(&reader);
            let mut batches = Vec::new();
            let mut row = 0usize;
            for b in reader {
                let b = b.with_context(|| format!("cannot read {}", input.display()))?;
                let mask: arrow_array::BooleanArray = (0..b.num_rows())
                    .map(|i| Some(!drop.contains(&(row + i + 1))))
                    .collect();
                row += b.num_rows();
                let b = arrow_select::filter::filter_record_batch(&b, &mask)?;
                kept += b.num_rows() as u64;
                batches.push(b);
            }
            crate::data::schema::write_parquet_atomic(output, schema, &batches)?;
        }
    }
    Ok(kept)
}

#[derive(Debug, clap::Args)]
pub struct DecontaminateBenchArgs {
    /// Training problems to check: the rows of --train repeated (each copy told apart by a
    /// suffix) up to this many.
    #[arg(long, default_value_t = 100_000)]
    pub rows: usize,
    #[arg(long, default_value = "../shared/data/gsm8k_train.jsonl")]
    pub train: PathBuf,
    /// What to index (names, groups, definitions or data files); default: every eval file of
    /// ../shared/data.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "../shared/data/gsm8k_test.jsonl,../shared/data/math500.jsonl,\
../shared/data/aime24.jsonl,../shared/data/aime25.jsonl,../shared/data/amc23.jsonl,\
../shared/data/hmmt_feb25.jsonl,../shared/data/minerva_math.jsonl,\
../shared/data/olympiadbench_math_en.jsonl"
    )]
    pub against: Vec<String>,
    #[arg(long, default_value_t = crate::data::decontaminate::DEFAULT_NGRAM)]
    pub ngram: usize,
}

/// Index build and check throughput on `rows` training problems.
pub fn bench(a: &DecontaminateBenchArgs) -> Result<()> {
    let refs: Vec<Reference> = Against::resolve(&a.against, Path::new("."))?
        .iter()
        .map(Against::load)
        .collect::<Result<_>>()?;
    let (_, base) = read_problem_texts(&a.train, None)?;
    if base.is_empty() {
        bail!("{}: no rows", a.train.display());
    }
    let rows: Vec<TextRow> = (0..a.rows)
        .map(|i| {
            let b = &base[i % base.len()];
            TextRow {
                row: i + 1,
                id: i.to_string(),
                text: format!("{} (copy {})", b.text, i / base.len()),
            }
        })
        .collect();
    let words: usize = rows
        .iter()
        .map(|r| crate::data::decontaminate::words(&r.text).len())
        .sum();
    let t = Instant::now();
    let index = Index::new(a.ngram, &refs)?;
    let indexed = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let (matches, _) = check(&index, &rows);
    let checked = t.elapsed().as_secs_f64();
    let (problems, grams) = index.size();
    crate::outln!(
        "index: {problems} eval problems in {} set(s), {grams} distinct {}-grams, built in \
         {indexed:.3} s",
        refs.len(),
        a.ngram
    );
    crate::outln!(
        "check: {} training problems ({words} words) in {checked:.3} s = {:.0} problems/s, \
         {:.1} M words/s; {} matches",
        rows.len(),
        rows.len() as f64 / checked.max(1e-9),
        words as f64 / checked.max(1e-9) / 1e6,
        matches.len()
    );
    Ok(())
}

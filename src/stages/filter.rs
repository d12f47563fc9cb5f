//! The filter stage: grades every completion against its problem's gold answer, then keeps the
//! correct ones, deduplicated and capped per problem, as `sft.parquet`.
//!
//! 1) Grade in chunks of `chunk_rows` input rows; chunk k is committed whole as
//!    `graded/part-<k>.parquet` (every input row with `gold_answer`, `extracted_answer`,
//!    `correct`, `reason`), so a killed run resumes at the first missing chunk.
//! 2) Decontaminate: every training problem is checked against the problems of the config's eval
//!    sets and of `decontaminate_against` (`data::decontaminate`: word n-grams and exact
//!    normalised match); the matches go to `contamination.parquet`, counted per set.
//! 3) Read the graded parts back in input order and apply the rules (contaminated, truncated, no
//!    answer, incorrect, length bounds, duplicates, per-problem cap), counting what each removed.
//! 4) Write `sft.parquet` atomically; the runner writes the manifest after it.
//!
//! Knows nothing of how the completions were produced.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use anyhow::{bail, Context, Result};
use regex::Regex;

use super::{output_file, Counts, Estimate, Plan, PlannedStage, StageOutput};
use crate::config::{CompletionsFormat, Config, Dedup, FilterConfig};
use crate::data::decontaminate::Index;
use crate::data::load_source_with;
use crate::data::schema::{
    read_completions, read_problems, sft_batch, sft_schema, write_completions, write_contamination,
    write_parquet_atomic, Completion, Contamination, Grade, Problem, ROW_GROUP_ROWS,
};
use crate::eval::against::Against;
use crate::eval::EvalSet;
use crate::store::{self, InputRef};
use crate::verify::{grade, GradeOptions};

/// Bump when the output for the same inputs changes. Verifier changes need no bump: its source
/// text is an input of the key (see [`super::verifier_input`]).
pub const CODE_VERSION: u32 = 1;
pub const GRADED_DIR: &str = "graded";
/// The reason written for a completion whose problem is not among the data stage's problems.
pub const UNKNOWN_PROBLEM: &str = "unknown_problem";
/// The training problems that matched an eval problem, beside `sft.parquet`.
pub const CONTAMINATION: &str = "contamination.parquet";
/// Count prefixes of the manifest: training problems that matched each reference.
pub const CONTAMINATED: &str = "contaminated.";
/// The role of the sample stage's rationalized rows among the stage's files (STaR).
pub const RATIONALIZED: &str = "rationalized";

/// What the filter decontaminates against: the config's eval sets, then
/// `decontaminate_against`, each once; nothing when decontamination is off.
pub fn references(cfg: &FilterConfig, eval_sets: &[EvalSet]) -> Vec<Against> {
    if !cfg.decontaminate {
        return Vec::new();
    }
    let mut out: Vec<Against> = eval_sets
        .iter()
        .map(|s| Against::Set(Box::new(s.clone())))
        .collect();
    for a in &cfg.against {
        if !out.iter().any(|o| o.name() == a.name()) {
            out.push(a.clone());
        }
    }
    out
}

pub fn plan(
    cfg: &FilterConfig,
    data: &PlannedStage,
    sampled: Option<&PlannedStage>,
    eval_sets: &[EvalSet],
    workdir: &Path,
    resolve: &super::Resolve,
) -> Result<PlannedStage> {
    let upstream = |name: &str, s: &PlannedStage| InputRef {
        name: name.into(),
        location: s.dir.display().to_string(),
        hash: s.key.clone(),
    };
    let (completions, path, bytes) = match (&cfg.completions, sampled) {
        (Some(c), _) => {
            let files = resolve.location("completions", "filter.completions", &c.location)?;
            let [(input, path, bytes)] = files.as_slice() else {
                bail!("filter.completions must name a single file");
            };
            let input = InputRef {
                name: "completions".into(),
                ..input.clone()
            };
            // a provisional hub file (preflight) has no path yet
            (input, path.clone(), *bytes)
        }
        (None, Some(s)) => (
            upstream("completions", s),
            Some(s.dir.join(super::COMPLETIONS)),
            // the sample stage's estimate holds its parts and its output side by side (at the
            // join); the output alone is half
            s.estimate.disk_bytes / 2,
        ),
        (None, None) => bail!("the filter needs [filter.completions] or a [sample] section"),
    };
    let mut inputs = vec![
        upstream("problems", data),
        completions,
        super::verifier_input(),
    ];
    for a in references(cfg, eval_sets) {
        let input = match &a {
            Against::Set(set) => super::eval_set_input(set, resolve)?,
            Against::File { path, .. } => super::file_input("", path)?.0,
        };
        inputs.push(InputRef {
            name: format!("against:{}", a.name()),
            ..input
        });
    }
    let config = serde_json::to_value(cfg)?;
    let mut st = PlannedStage::new(
        super::StageKind::Filter,
        workdir,
        CODE_VERSION,
        config,
        inputs,
    );
    st.files = path
        .map(|p| ("completions".into(), p))
        .into_iter()
        .collect();
    // Graded parts plus the SFT file, each about the size of the input; all rows in memory.
    // Rows: at most the samples, and max_per_problem per problem.
    let rows = sampled.and_then(|s| s.estimate.rows).map(|r| {
        match (cfg.max_per_problem, data.estimate.rows) {
            (Some(m), Some(p)) => r.min(p * m as u64),
            _ => r,
        }
    });
    st.estimate = Estimate {
        // the graded rows and the SFT file: what is kept of the input, and its verdicts
        disk_bytes: bytes * 3 / 2,
        memory_bytes: bytes * 4,
        rows,
        row_tokens: sampled.and_then(|s| s.estimate.row_tokens),
        cards: sampled
            .map(|s| s.estimate.cards.clone())
            .unwrap_or_default(),
        ..Estimate::default()
    };
    Ok(st)
}

pub fn run(
    cfg: &FilterConfig,
    config: &Config,
    plan: &Plan,
    stage: &PlannedStage,
) -> Result<StageOutput> {
    let data = plan.dep(stage, "data")?;
    let problems = read_problems(&data.dir.join(super::PROBLEMS))?;
    let gold: HashMap<&str, &str> = problems
        .iter()
        .map(|p| (p.problem_id.as_str(), p.gold_answer.as_str()))
        .collect();
    let path = &stage
        .files
        .first()
        .context("the filter has no completions file")?
        .1;
    let (mut rows, load_counts) = load_completions(cfg, config, path)?;
    // STaR: the rows sampled with the answer as a hint, under their original prompts
    for (_, f) in stage.files.iter().filter(|(role, _)| role == RATIONALIZED) {
        rows.extend(read_completions(f)?);
    }
    check_token_bounds(cfg, &rows, path)?;
    let opts = GradeOptions {
        last_number_fallback: cfg.last_number_fallback,
        thinking: cfg.thinking,
        ..GradeOptions::default()
    };

    // 1) grade, chunk by chunk, committing each chunk whole; 2) read back in input order
    let graded_dir = stage.dir.join(GRADED_DIR);
    let chunks: Vec<&[Completion]> = rows.chunks(cfg.chunk_rows).collect();
    let graded = grade_chunks(&chunks, &graded_dir, &stage.dir, &gold, &opts)?;
    // 3) decontaminate, then apply the rules
    let eval_sets = config.eval.as_ref().map_or(&[][..], |e| e.sets.as_slice());
    let refs = references(cfg, eval_sets);
    let (matches, contamination_counts) = decontaminate(cfg, &refs, &problems)?;
    let contaminated: HashSet<&str> = matches.iter().map(|m| m.problem_id.as_str()).collect();
    let (kept, mut counts) = apply_rules(cfg, graded, &contaminated);
    print_counts(&counts);
    let dropped = counts
        .iter()
        .find(|c| c.0 == "removed.contaminated")
        .map_or(0, |c| c.1);
    if kept.is_empty() && dropped > 0 {
        bail!(
            "decontamination dropped every row that would have been kept ({dropped} rows of {} \
             training problems that match {}): the training data are the eval data. Evaluate on \
             other sets, or set `filter.decontaminate = false` to train on them anyway",
            contaminated.len(),
            refs.iter()
                .map(Against::name)
                .filter(|n| matches.iter().any(|m| m.eval_set == *n))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    counts.extend(load_counts);
    counts.extend(contamination_counts);
    if stage.files.iter().any(|(role, _)| role == RATIONALIZED) {
        let n = kept.iter().filter(|r| r.rationalized).count();
        tracing::info!("    of the kept rows, {n} are rationalized (sampled with a hint)");
        counts.push(("kept_rationalized".into(), n as u64));
    }

    // 4) commit the SFT file (and what matched an eval set)
    let mut outputs = Vec::new();
    if !refs.is_empty() {
        let path = stage.dir.join(CONTAMINATION);
        write_contamination(&path, &matches)?;
        outputs.push(output_file(&stage.dir, &path, matches.len() as u64)?);
    }
    let batches = kept
        .chunks(ROW_GROUP_ROWS)
        .map(sft_batch)
        .collect::<Result<Vec<_>>>()?;
    let out = stage.dir.join(super::SFT);
    write_parquet_atomic(&out, sft_schema(), &batches)?;
    outputs.insert(0, output_file(&stage.dir, &out, kept.len() as u64)?);
    for (k, chunk) in chunks.iter().enumerate() {
        outputs.push(output_file(
            &stage.dir,
            &part_path(&graded_dir, k),
            chunk.len() as u64,
        )?);
    }
    Ok(StageOutput {
        outputs,
        counts,
        rows: kept.len() as u64,
    })
}

/// Grades `chunks` of completions against the `gold` answers, each chunk committed whole as a
/// part of `graded_dir` (a resumed run skips the parts there), then reads them back in input
/// order.
fn grade_chunks(
    chunks: &[&[Completion]],
    graded_dir: &Path,
    stage_dir: &Path,
    gold: &HashMap<&str, &str>,
    opts: &GradeOptions,
) -> Result<Vec<Completion>> {
    let resumed = (0..chunks.len())
        .filter(|&k| part_path(graded_dir, k).exists())
        .count();
    let mut tracker =
        crate::progress::Tracker::new("filter: grade", "chunks", Some(chunks.len() as u64))
            .with_file(Some(stage_dir.join(store::PROGRESS)))
            .resumed(resumed as u64);
    for (k, chunk) in chunks.iter().enumerate() {
        let part = part_path(graded_dir, k);
        if part.exists() {
            continue;
        }
        let graded: Vec<Completion> = chunk.iter().map(|c| grade_row(c, gold, opts)).collect();
        write_completions(&part, &graded, true)?;
        tracker.inc(1);
        if k + 1 < chunks.len() {
            tracker.flush();
        }
        crate::fault::point("filter.chunk");
    }
    tracker.finish();
    if resumed > 0 {
        tracing::info!(
            "    resumed: {resumed} of {} chunks were already graded",
            chunks.len()
        );
    }
    let mut graded = Vec::new();
    for k in 0..chunks.len() {
        graded.extend(read_completions(&part_path(graded_dir, k))?);
    }
    let rows: usize = chunks.iter().map(|c| c.len()).sum();
    if graded.len() != rows {
        bail!(
            "graded parts in {} hold {} rows, the input has {rows}: delete the folder and re-run",
            graded_dir.display(),
            graded.len(),
        );
    }
    Ok(graded)
}

/// The training problems that match a reference, one row per (problem, reference), and the
/// counts `contaminated.<reference>` (problems) for every reference.
fn decontaminate(
    cfg: &FilterConfig,
    refs: &[Against],
    problems: &[Problem],
) -> Result<(Vec<Contamination>, Counts)> {
    if refs.is_empty() {
        if !cfg.decontaminate {
            tracing::info!("    decontamination: off (filter.decontaminate = false)");
        } else {
            tracing::info!("    decontamination: no eval set to check against");
        }
        return Ok((Vec::new(), Vec::new()));
    }
    let t = std::time::Instant::now();
    let loaded = refs.iter().map(Against::load).collect::<Result<Vec<_>>>()?;
    let index = Index::new(cfg.decontaminate_ngram, &loaded)?;
    let mut rows = Vec::new();
    let mut per_ref = vec![0u64; refs.len()];
    for p in problems {
        for (set, c) in index.contamination(&p.problem_id, &p.problem) {
            per_ref[set] += 1;
            rows.push(c);
        }
    }
    let (eval_problems, grams) = index.size();
    let problems_hit: HashSet<&str> = rows.iter().map(|r| r.problem_id.as_str()).collect();
    tracing::info!(
        "    decontamination: {} of {} training problems match an eval problem ({} problems,          {} {}-grams in {} set(s); {:.2} s)",
        problems_hit.len(),
        problems.len(),
        eval_problems,
        grams,
        index.n(),
        refs.len(),
        t.elapsed().as_secs_f64()
    );
    let counts = index
        .names()
        .iter()
        .zip(&per_ref)
        .map(|(name, n)| {
            if *n > 0 {
                tracing::info!("      {n:>8} match {name}");
            }
            (format!("{CONTAMINATED}{name}"), *n)
        })
        .collect();
    Ok((rows, counts))
}

fn part_path(dir: &Path, k: usize) -> PathBuf {
    dir.join(format!("part-{k:05}.parquet"))
}

/// Completions from our schema, or reference solutions from a dataset file (with what loading
/// that file skipped, as counts for the manifest).
fn load_completions(
    cfg: &FilterConfig,
    config: &Config,
    path: &Path,
) -> Result<(Vec<Completion>, Counts)> {
    let Some(c) = cfg.completions.as_ref() else {
        // The sample stage's output.
        return Ok((read_completions(path)?, Vec::new()));
    };
    if c.format == CompletionsFormat::Completions {
        return Ok((read_completions(path)?, Vec::new()));
    }
    let data = config.data.as_ref().context("no [data] section")?;
    let source = match &c.source {
        Some(name) => data.sources.iter().find(|s| &s.name == name),
        None => data.sources.first(),
    }
    .context("filter.completions.source names no data source")?;
    let field = c
        .completion_field
        .as_deref()
        .context("filter.completions.completion_field is missing")?;
    check_field_present(path, field)?;
    let (rows, rep) = load_source_with(
        source,
        &[path.to_path_buf()],
        crate::data::BadRows::config(data.skip_bad_rows),
        Some(field),
    )?;
    if rep.bad_rows > 0 {
        tracing::info!("    completions: skipped {} bad rows", rep.bad_rows);
        for ex in &rep.bad_examples {
            tracing::info!("      skipped: {ex}");
        }
    }
    let counts = vec![
        ("completions.bad_rows".to_string(), rep.bad_rows),
        ("completions.duplicate_ids".to_string(), rep.duplicates),
    ];
    let rows = rows
        .into_iter()
        .map(|(p, text)| {
            Completion::text(
                p.problem_id,
                p.problem,
                text.unwrap_or_default(),
                Some(format!("import:{}", path.display())),
            )
        })
        .collect();
    Ok((rows, counts))
}

/// The completion field must exist in the file's first record: a typo would otherwise grade
/// every row as having no answer.
fn check_field_present(path: &Path, field: &str) -> Result<()> {
    let first = crate::data::records::read_records(path)?.find_map(|r| r.ok());
    if let Some(rec) = first {
        if !rec.fields.contains_key(field) {
            let have: Vec<String> = rec.fields.keys().cloned().collect();
            let hint = crate::names::closest(field, &have)
                .map(|c| format!("; did you mean `{c}`?"))
                .unwrap_or_default();
            bail!(
                "{}:{}: no field `{field}` (filter.completions.completion_field){hint} (fields: {})",
                path.display(),
                rec.row,
                have.join(", ")
            );
        }
    }
    Ok(())
}

/// Token bounds need token counts: fail up front instead of silently not applying them.
fn check_token_bounds(cfg: &FilterConfig, rows: &[Completion], path: &Path) -> Result<()> {
    if cfg.min_completion_tokens.is_none() && cfg.max_completion_tokens.is_none() {
        return Ok(());
    }
    if let Some(r) = rows.iter().find(|r| completion_tokens(r).is_none()) {
        bail!(
            "filter.min/max_completion_tokens is set, but {} has rows without token counts \
             (problem {}): use min/max_completion_chars for text without tokens",
            path.display(),
            r.problem_id
        );
    }
    Ok(())
}

/// `num_completion_tokens`, else the length of `completion_token_ids`.
fn completion_tokens(r: &Completion) -> Option<u64> {
    r.num_completion_tokens
        .map(|n| n.max(0) as u64)
        .or_else(|| r.completion_token_ids.as_ref().map(|t| t.len() as u64))
}

fn grade_row(c: &Completion, gold: &HashMap<&str, &str>, opts: &GradeOptions) -> Completion {
    let g = match gold.get(c.problem_id.as_str()) {
        Some(answer) => {
            let v = grade(&c.completion, answer, opts);
            Grade {
                gold_answer: answer.to_string(),
                extracted_answer: v.extracted,
                correct: v.correct,
                reason: v.reason.as_str().to_string(),
            }
        }
        None => Grade {
            gold_answer: String::new(),
            extracted_answer: None,
            correct: false,
            reason: UNKNOWN_PROBLEM.into(),
        },
    };
    Completion {
        grade: Some(g),
        ..c.clone()
    }
}

/// The rules, in order. Returns the kept rows (input order) and what each rule removed.
/// The rows of `contaminated` problems are removed first.
pub fn apply_rules(
    cfg: &FilterConfig,
    graded: Vec<Completion>,
    contaminated: &HashSet<&str>,
) -> (Vec<Completion>, Counts) {
    let mut removed: Vec<(&'static str, u64)> = [
        "ungraded",
        "unknown_problem",
        "contaminated",
        "truncated",
        "no_answer",
        "incorrect",
        "false_step",
        "too_short",
        "too_long",
        "duplicate",
        "over_max_per_problem",
    ]
    .iter()
    .map(|r| (*r, 0))
    .collect();
    // the difficulty window: a problem's pass rate over its graded samples (only with one)
    let rates = match cfg.keep_pass_rate {
        Some(_) => {
            removed.insert(3, ("outside_pass_rate", 0));
            crate::data::schema::pass_rates(&graded)
        }
        None => HashMap::new(),
    };
    let mut reasons: Vec<(String, u64)> = Vec::new();
    let mut seen: HashSet<(String, String)> = HashSet::new();
    let mut per_problem: HashMap<String, usize> = HashMap::new();
    let input_rows = graded.len() as u64;
    let mut kept = Vec::new();
    for row in graded {
        let Some(g) = &row.grade else {
            // Graded parts always carry a grade; count rather than lose a row silently.
            if let Some((_, n)) = removed.iter_mut().find(|(name, _)| *name == "ungraded") {
                *n += 1;
            }
            continue;
        };
        match reasons.iter_mut().find(|(r, _)| *r == g.reason) {
            Some((_, n)) => *n += 1,
            None => reasons.push((g.reason.clone(), 1)),
        }
        let outside = cfg.keep_pass_rate.is_some_and(|(lo, hi)| {
            let (n, c) = rates
                .get(row.problem_id.as_str())
                .copied()
                .unwrap_or((0, 0));
            let r = c as f64 / n.max(1) as f64;
            r < lo || r > hi
        });
        let rule = if contaminated.contains(row.problem_id.as_str()) && g.reason != UNKNOWN_PROBLEM
        {
            Some("contaminated")
        } else if outside && g.reason != UNKNOWN_PROBLEM {
            Some("outside_pass_rate")
        } else {
            drop_rule(cfg, &row, g, &mut seen, &mut per_problem)
        };
        match rule {
            Some(r) => {
                if let Some((_, n)) = removed.iter_mut().find(|(name, _)| *name == r) {
                    *n += 1;
                }
            }
            None => kept.push(row),
        }
    }
    let mut counts = vec![("input_rows".to_string(), input_rows)];
    counts.extend(removed.iter().map(|(r, n)| (format!("removed.{r}"), *n)));
    counts.push(("kept".to_string(), kept.len() as u64));
    reasons.sort();
    counts.extend(reasons.into_iter().map(|(r, n)| (format!("reason.{r}"), n)));
    (kept, counts)
}

fn drop_rule(
    cfg: &FilterConfig,
    row: &Completion,
    g: &Grade,
    seen: &mut HashSet<(String, String)>,
    per_problem: &mut HashMap<String, usize>,
) -> Option<&'static str> {
    if g.reason == UNKNOWN_PROBLEM {
        return Some("unknown_problem");
    }
    if row.finish_reason.as_deref() == Some("length") {
        return Some("truncated");
    }
    if g.extracted_answer.is_none() {
        return Some("no_answer");
    }
    if !g.correct {
        return Some("incorrect");
    }
    if cfg.check_arithmetic && crate::verify::steps::false_step(&row.completion).is_some() {
        return Some("false_step");
    }
    let chars = row.completion.chars().count() as u64;
    let tokens = completion_tokens(row);
    let below = |n: Option<u64>, lo: Option<u64>| matches!((n, lo), (Some(n), Some(lo)) if n < lo);
    let above = |n: Option<u64>, hi: Option<u64>| matches!((n, hi), (Some(n), Some(hi)) if n > hi);
    if below(tokens, cfg.min_completion_tokens) || below(Some(chars), cfg.min_completion_chars) {
        return Some("too_short");
    }
    if above(tokens, cfg.max_completion_tokens) || above(Some(chars), cfg.max_completion_chars) {
        return Some("too_long");
    }
    let dedup_key = match cfg.dedup {
        Dedup::None => None,
        Dedup::Exact => Some(row.completion.clone()),
        Dedup::Normalized => Some(normalize_for_dedup(&row.completion)),
    };
    if let Some(k) = dedup_key {
        if !seen.insert((row.problem_id.clone(), k)) {
            return Some("duplicate");
        }
    }
    let n = per_problem.entry(row.problem_id.clone()).or_insert(0);
    if cfg.max_per_problem.is_some_and(|m| *n >= m) {
        return Some("over_max_per_problem");
    }
    *n += 1;
    None
}

static THOUSANDS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(\d),(\d{3})\b").expect("valid regex"));
static TRAILING_ZEROS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(\d)\.(\d*?)0+\b").expect("valid regex"));

/// Whitespace collapsed, thousands separators dropped, trailing decimal zeros dropped:
/// "Total:  1,000.50" and "Total: 1000.5" are the same completion.
pub fn normalize_for_dedup(text: &str) -> String {
    let spaced = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut s = spaced;
    // Repeat: "1,000,000" needs two passes of the non-overlapping replacement.
    loop {
        let next = THOUSANDS.replace_all(&s, "$1$2").into_owned();
        if next == s {
            break;
        }
        s = next;
    }
    let s = TRAILING_ZEROS.replace_all(&s, |c: &regex::Captures| {
        let frac = c.get(2).map(|m| m.as_str()).unwrap_or("");
        let int = c.get(1).map(|m| m.as_str()).unwrap_or("");
        if frac.is_empty() {
            int.to_string()
        } else {
            format!("{int}.{frac}")
        }
    });
    s.into_owned()
}

fn print_counts(counts: &[(String, u64)]) {
    for (name, n) in counts {
        if let Some(rule) = name.strip_prefix("removed.") {
            if *n > 0 {
                tracing::info!("    removed {n:>8}  {rule}");
            }
        } else if let Some(reason) = name.strip_prefix("reason.") {
            tracing::info!("    verdict {n:>8}  {reason}");
        } else {
            tracing::info!("    {name:<15} {n:>8}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedup_normalisation() {
        assert_eq!(
            normalize_for_dedup("Total:  1,000.50\n so 2.0"),
            normalize_for_dedup("Total: 1000.5 so 2")
        );
        assert_eq!(normalize_for_dedup("1,234,567"), "1234567");
        assert_ne!(
            normalize_for_dedup("x = 12"),
            normalize_for_dedup("x = 1.2")
        );
        assert_eq!(normalize_for_dedup("10.05"), "10.05");
        assert_eq!(normalize_for_dedup("100"), "100");
    }

    fn cfg() -> FilterConfig {
        FilterConfig {
            completions: None,
            max_per_problem: Some(2),
            dedup: Dedup::Normalized,
            min_completion_tokens: None,
            max_completion_tokens: None,
            min_completion_chars: Some(3),
            max_completion_chars: Some(40),
            last_number_fallback: false,
            thinking: false,
            chunk_rows: 2,
            decontaminate: true,
            decontaminate_ngram: 8,
            decontaminate_against: Vec::new(),
            against: Vec::new(),
            keep_pass_rate: None,
            check_arithmetic: true,
        }
    }

    fn row(pid: &str, text: &str, reason: &str, correct: bool, fin: &str) -> Completion {
        Completion {
            problem_id: pid.into(),
            sample_index: 0,
            prompt: "p".into(),
            prompt_token_ids: None,
            completion: text.into(),
            completion_token_ids: None,
            finish_reason: Some(fin.into()),
            num_completion_tokens: None,
            cumulative_logprob: None,
            seed: None,
            model: None,
            sampling_hash: None,
            grade: Some(Grade {
                gold_answer: "4".into(),
                extracted_answer: (reason != "no_answer").then(|| "4".into()),
                correct,
                reason: reason.into(),
            }),
            logprobs: None,
            rationalized: false,
        }
    }

    #[test]
    fn the_pass_rate_window_drops_whole_problems() {
        let mut c = cfg();
        c.keep_pass_rate = Some((0.1, 0.6));
        c.max_per_problem = None;
        c.min_completion_chars = None;
        let rows = vec![
            // a: 2 of 2 right (rate 1.0: too easy)
            row("a", "so \\boxed{4}", "exact", true, "stop"),
            row("a", "so \\boxed{4} again", "exact", true, "stop"),
            // b: 1 of 2 (0.5: kept)
            row("b", "\\boxed{4}", "exact", true, "stop"),
            row("b", "\\boxed{5}", "mismatch", false, "stop"),
            // d: 0 of 1 (below)
            row("d", "\\boxed{5}", "mismatch", false, "stop"),
        ];
        let (kept, counts) = apply_rules(&c, rows, &HashSet::new());
        let get = |k: &str| counts.iter().find(|(n, _)| n == k).unwrap().1;
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].problem_id, "b");
        assert_eq!(get("removed.outside_pass_rate"), 3);
        assert_eq!(get("removed.incorrect"), 1);
        // unset, the count is not there at all
        let (_, counts) = apply_rules(&cfg(), vec![], &HashSet::new());
        assert!(counts.iter().all(|(n, _)| n != "removed.outside_pass_rate"));
    }

    #[test]
    fn every_rule_removes_what_it_names() {
        let rows = vec![
            row("a", "so \\boxed{4}", "exact", true, "stop"),
            row("a", "so  \\boxed{4}", "exact", true, "stop"),
            row("a", "hence \\boxed{4}", "exact", true, "stop"),
            row("a", "thus \\boxed{4}", "exact", true, "stop"),
            row("b", "\\boxed{5}", "mismatch", false, "stop"),
            row("b", "no idea", "no_answer", false, "stop"),
            row("b", "\\boxed{4} and on and on", "exact", true, "length"),
            row("b", "4", "exact", true, "stop"),
            row(
                "b",
                &format!("{} \\boxed{{4}}", "x".repeat(50)),
                "exact",
                true,
                "stop",
            ),
            row("c", "\\boxed{4}", UNKNOWN_PROBLEM, false, "stop"),
            row("d", "so \\boxed{4}", "exact", true, "stop"),
            row("d", "no idea", "no_answer", false, "stop"),
            row("e", "3 + 4 = 8, so \\boxed{4}", "exact", true, "stop"),
        ];
        // with the arithmetic check off, the false step is kept
        let (kept, _) = apply_rules(
            &FilterConfig {
                check_arithmetic: false,
                ..cfg()
            },
            rows.clone(),
            &HashSet::from(["d", "c"]),
        );
        assert!(kept.iter().any(|r| r.problem_id == "e"));
        let (kept, counts) = apply_rules(&cfg(), rows, &HashSet::from(["d", "c"]));
        let get = |k: &str| counts.iter().find(|(n, _)| n == k).unwrap().1;
        assert_eq!(kept.len(), 2);
        assert_eq!(get("removed.duplicate"), 1);
        assert_eq!(get("removed.over_max_per_problem"), 1);
        assert_eq!(get("removed.incorrect"), 1);
        assert_eq!(get("removed.no_answer"), 1);
        assert_eq!(get("removed.truncated"), 1);
        assert_eq!(get("removed.too_short"), 1);
        assert_eq!(get("removed.too_long"), 1);
        assert_eq!(get("removed.unknown_problem"), 1);
        assert_eq!(get("removed.contaminated"), 2);
        assert_eq!(get("removed.false_step"), 1);
        assert_eq!(get("input_rows"), 13);
        assert_eq!(get("reason.exact"), 9);
    }
}

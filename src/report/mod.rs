//! The run report: `<workdir>/report/report.md` and its PNG charts, rebuilt from the stage store
//! alone (plan, manifests and stage outputs), so `pipeline report --workdir DIR` regenerates it
//! at any time and `pipeline run` writes it after its stages.
//!
//! Sections, each present when its stage is done: evaluation (base vs trained per set with
//! deltas and 95% intervals, pass@1 by level with a chart), training (loss and learning-rate
//! curves), sampling (throughput, samples saved by `target_correct`, the completion-length
//! distribution), the filter's per-rule counts, and every stage's wall time. Knows the stages'
//! output files, not how they are computed.

mod charts;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

pub use charts::{bar_chart, category_labels, line_chart, Bars};
use charts::{commit_png, draw_loss_chart, histogram, smooth, smoothing_weight};

/// Bins of an eval set's completion-length chart, at most.
const LENGTH_BINS: u32 = 12;

use crate::stages::{self, PlanRecord, StageKind, StageState};
use crate::store;

/// The report's folder in a work dir.
pub const DIR: &str = "report";

/// One stage of the plan and its state.
pub struct Stage {
    pub name: String,
    /// `None` for a stage this build does not know (a plan from another version).
    pub kind: Option<StageKind>,
    pub dir: PathBuf,
    pub manifest: Option<store::Manifest>,
}

/// Where a done stage ran: its section's `device` (pretrain: under `train`).
pub fn stage_device(m: &store::Manifest) -> String {
    let c = &m.config;
    c.get("device")
        .and_then(|d| d.as_str())
        .or_else(|| c.get("train")?.get("device")?.as_str())
        .unwrap_or("cpu")
        .to_string()
}

/// The GPU hours of a done stage (`None` on the CPU): its wall time, or its shards' added up.
pub fn gpu_hours(m: &store::Manifest) -> Option<f64> {
    if stage_device(m) == "cpu" {
        return None;
    }
    let shard = m
        .counts
        .iter()
        .find(|c| c.0 == "shard_seconds")
        .map(|c| c.1);
    Some(shard.map_or(m.wall_seconds, |x| x as f64) / 3600.0)
}

/// A work dir's plan and its stages with their manifests (done ones).
pub fn stages_of(workdir: &Path) -> Result<(PlanRecord, Vec<Stage>)> {
    let plan_path = workdir.join(store::PLAN);
    let plan: PlanRecord =
        serde_json::from_slice(&std::fs::read(&plan_path).with_context(|| {
            format!(
                "{}: no plan (has `pipeline run` run here?)",
                plan_path.display()
            )
        })?)
        .with_context(|| format!("{}: unreadable", plan_path.display()))?;
    let mut list = Vec::new();
    for s in &plan.stages {
        let dir = workdir.join("stages").join(&s.dir);
        let manifest = match stages::stage_state(&dir)? {
            StageState::Done(m) => Some(*m),
            _ => None,
        };
        list.push(Stage {
            name: s.name.clone(),
            // older plans have no kind: their names were the kinds
            kind: StageKind::parse(if s.kind.is_empty() { &s.name } else { &s.kind }),
            dir,
            manifest,
        });
    }
    Ok((plan, list))
}

/// Writes the report of `workdir`; returns the path of `report.md`.
pub fn write(workdir: &Path) -> Result<PathBuf> {
    let (plan, list) = stages_of(workdir)?;
    let out = workdir.join(DIR);
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut md = format!("# Report: {}\n\n", plan.config);
    let done = |kind: StageKind| {
        list.iter()
            .filter(move |s| s.kind == Some(kind) && s.manifest.is_some())
    };
    let overlap = overlaps(done(StageKind::Filter));
    for s in done(StageKind::Eval) {
        eval_section(&mut md, &s.dir, &out, &overlap)?;
    }
    for s in done(StageKind::Pretrain) {
        train_section(&mut md, "Pretraining", &s.name, &s.dir, &out)?;
    }
    // each round: its sampling, filter and training
    let mut prev_rates = None;
    for s in list.iter().filter(|s| s.manifest.is_some()) {
        match s.kind {
            Some(StageKind::Sample) => sample_section(&mut md, s, &out, &mut prev_rates)?,
            Some(StageKind::Filter) => filter_section(&mut md, s),
            Some(StageKind::Train) => {
                train_section(&mut md, "Training", &s.name, &s.dir, &out)?;
                mix_line(&mut md, s.manifest.as_ref().expect("done"));
            }
            _ => {}
        }
    }
    stages_table(&mut md, &plan, &list);
    let path = out.join("report.md");
    store::commit_file(&path, |tmp| Ok(std::fs::write(tmp, &md)?))?;
    Ok(path)
}

/// Training problems that matched each eval set, by the filter stages that checked: (eval set,
/// problems, the filter stage).
fn overlaps<'a>(filters: impl Iterator<Item = &'a Stage>) -> Vec<(String, u64, String)> {
    let mut overlap: Vec<(String, u64, String)> = Vec::new();
    for s in filters {
        let m = s.manifest.as_ref().expect("done");
        for (k, n) in &m.counts {
            let Some(set) = k.strip_prefix(stages::filter::CONTAMINATED) else {
                continue;
            };
            match overlap.iter_mut().find(|o| o.0 == set) {
                Some(o) => o.1 = o.1.max(*n),
                None => overlap.push((set.to_string(), *n, s.name.clone())),
            }
        }
    }
    overlap
}

/// A done filter stage: its tables, the rows kept, and its decontamination.
fn filter_section(md: &mut String, s: &Stage) {
    let m = s.manifest.as_ref().expect("done");
    filter_tables(md, &s.name, &m.counts);
    match m.counts.iter().find(|(k, _)| k == "kept_rationalized") {
        Some((_, r)) => {
            let _ = writeln!(
                md,
                "\nKept: {} SFT rows, {r} of them rationalized (sampled with the answer as a \
                 hint, trained under the prompt without it).\n",
                m.rows
            );
        }
        None => {
            let _ = writeln!(md, "\nKept: {} SFT rows.\n", m.rows);
        }
    }
    let checked: Vec<&(String, u64)> = m
        .counts
        .iter()
        .filter(|(k, _)| k.starts_with(stages::filter::CONTAMINATED))
        .collect();
    let dropped = m
        .counts
        .iter()
        .find(|(k, _)| k == "removed.contaminated")
        .map_or(0, |c| c.1);
    let decontam = m.config.get("decontaminate").and_then(|v| v.as_bool());
    if !checked.is_empty() {
        let ngram = m.config.get("decontaminate_ngram").and_then(|v| v.as_u64());
        let _ = writeln!(
            md,
            "Decontamination ({}-word n-grams and exact match) against {}: {} training problems \
             matched, {dropped} rows dropped; the matches are in `{}`.\n",
            ngram.unwrap_or(0),
            checked
                .iter()
                .map(|(k, n)| format!("{} ({n})", &k[stages::filter::CONTAMINATED.len()..]))
                .collect::<Vec<_>>()
                .join(", "),
            checked.iter().map(|c| c.1).sum::<u64>(),
            s.dir.join(stages::filter::CONTAMINATION).display()
        );
    } else if decontam == Some(false) {
        md.push_str(
            "Decontamination: off (`filter.decontaminate = false`): training problems were not \
             checked against the eval sets.\n\n",
        );
    }
}

/// A train stage's rows by source, when it mixed them (`[mix]`).
fn mix_line(md: &mut String, m: &store::Manifest) {
    let Some(total) = m.counts.iter().find(|c| c.0 == "mix.rows") else {
        return;
    };
    let count = |k: &str| m.counts.iter().find(|c| c.0 == k).map_or(0, |c| c.1);
    let sources: Vec<String> = m
        .counts
        .iter()
        .filter_map(|(k, n)| Some(format!("{n} from {}", k.strip_prefix("mix.source.")?)))
        .collect();
    let _ = writeln!(
        md,
        "Training rows (`[mix]`): {} in all: {} kept this round, {} kept in earlier rounds{}.\n",
        total.1,
        count("mix.round_rows"),
        count("mix.earlier_rows"),
        if sources.is_empty() {
            String::new()
        } else {
            format!(", {}", sources.join(", "))
        }
    );
}

/// The table of stages: state, rows, wall time, device, GPU hours and cost, the estimate, the
/// key; and the totals.
fn stages_table(md: &mut String, plan: &PlanRecord, list: &[Stage]) {
    let price = plan.gpu_hour_price;
    md.push_str(
        "## Stages\n\n| stage | state | rows | wall time | device | GPU hours | cost | estimated \
         | key |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    let (mut total_hours, mut total_cost) = (0.0, 0.0);
    for s in list {
        let (state, rows, wall) = match &s.manifest {
            Some(m) => (
                "done",
                m.rows.to_string(),
                format!("{:.1} s", m.wall_seconds),
            ),
            None => ("not done", "-".into(), "-".into()),
        };
        let device = s.manifest.as_ref().map_or("cpu".to_string(), stage_device);
        let hours = s.manifest.as_ref().and_then(gpu_hours);
        total_hours += hours.unwrap_or(0.0);
        let cost = hours.zip(price).map(|(h, p)| h * p);
        total_cost += cost.unwrap_or(0.0);
        let estimated = plan
            .estimates
            .iter()
            .find(|e| e.stage == s.name)
            .map_or("-".to_string(), |e| crate::progress::fmt_secs(e.seconds));
        let key = s
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let _ = writeln!(
            md,
            "| {} | {state} | {rows} | {wall} | {device} | {} | {} | {estimated} | {key} |",
            s.name,
            hours.map_or("-".into(), |h| format!("{h:.3}")),
            cost.map_or("-".into(), |c| format!("{c:.2}")),
        );
    }
    let _ = writeln!(
        md,
        "\nGPU hours: {total_hours:.3}{}.",
        match price {
            Some(p) => format!(", cost {total_cost:.2} at {p} per GPU-hour"),
            None => " (set `run.gpu_hour_price` for the cost)".into(),
        }
    );
}

/// `overlap`: (eval set, training problems that matched it, the filter stage that dropped them).
fn eval_section(
    md: &mut String,
    dir: &Path,
    out: &Path,
    overlap: &[(String, u64, String)],
) -> Result<()> {
    let p = dir.join(stages::EVAL_METRICS);
    let results: Vec<crate::eval::EvalResult> = serde_json::from_slice(
        &std::fs::read(&p).with_context(|| format!("cannot read {}", p.display()))?,
    )
    .with_context(|| format!("{}: unreadable", p.display()))?;
    let mut results = results;
    // charts and tables name models shortly (base, round 1, ...); the paths go in a table
    let mut names: Vec<(String, String)> = Vec::new();
    for r in &mut results {
        let (short, path) = short_model_name(&r.model);
        if !names.iter().any(|(s, _)| *s == short) {
            names.push((short.clone(), path));
        }
        r.model = short;
    }
    let models: Vec<String> = names.iter().map(|(s, _)| s.clone()).collect();
    md.push_str("## Evaluation\n\n| model | checkpoint |\n| --- | --- |\n");
    for (short, path) in &names {
        let _ = writeln!(md, "| {short} | {path} |");
    }
    md.push('\n');
    // a set the training data overlapped says so in its own rows
    let marked: Vec<crate::eval::EvalResult> = results
        .iter()
        .cloned()
        .map(|mut r| {
            if let Some((_, n, _)) = overlap.iter().find(|o| o.0 == r.set && o.1 > 0) {
                r.set = format!("{} (overlap: {n} training problems dropped)", r.set);
            }
            r
        })
        .collect();
    md.push_str(&crate::eval::table(&marked, &models));
    md.push('\n');
    for (set, n, stage) in overlap.iter().filter(|o| o.1 > 0) {
        if results.iter().any(|r| &r.set == set) {
            let _ = writeln!(
                md,
                "**Training data overlapped {set}**: {n} training problems matched its problems; \
                 {stage} dropped their rows before training (see the filter section).\n"
            );
        }
    }
    levels_section(md, &results, out)?;
    examples_section(md, dir, out)
}

/// pass@1 by level (MATH's levels): one row per (set, level), one column per model, and a
/// chart per set.
fn levels_section(md: &mut String, results: &[crate::eval::EvalResult], out: &Path) -> Result<()> {
    let with_levels: Vec<_> = results
        .iter()
        .filter(|r| !r.metrics.by_level.is_empty())
        .collect();
    if with_levels.is_empty() {
        return Ok(());
    }
    // one row per (set, level), one column per model
    let mut sets: Vec<&str> = Vec::new();
    for r in &with_levels {
        if !sets.contains(&r.set.as_str()) {
            sets.push(&r.set);
        }
    }
    let mut cols: Vec<&str> = Vec::new();
    for r in &with_levels {
        if !cols.contains(&r.model.as_str()) {
            cols.push(&r.model);
        }
    }
    let _ = writeln!(
        md,
        "### pass@1 by level\n\n| set | level | problems | {} |\n| --- | --- | --- |{}",
        cols.join(" | "),
        " --- |".repeat(cols.len())
    );
    for set in &sets {
        let rs: Vec<_> = with_levels.iter().filter(|r| r.set == *set).collect();
        for (level, n, _) in &rs[0].metrics.by_level {
            let cells: Vec<String> = cols
                .iter()
                .map(|m| {
                    rs.iter()
                        .find(|r| r.model == *m)
                        .and_then(|r| r.metrics.by_level.iter().find(|l| &l.0 == level))
                        .map_or("-".to_string(), |l| format!("{:.1}", 100.0 * l.2))
                })
                .collect();
            let _ = writeln!(md, "| {set} | {level} | {n} | {} |", cells.join(" | "));
        }
    }
    for set in sets {
        let rs: Vec<_> = with_levels.iter().filter(|r| r.set == set).collect();
        let labels: Vec<String> = rs[0].metrics.by_level.iter().map(|l| l.0.clone()).collect();
        let series: Vec<(String, Vec<(f64, f64)>)> = rs
            .iter()
            .map(|r| {
                let pts = r
                    .metrics
                    .by_level
                    .iter()
                    .filter_map(|(l, _, p)| {
                        Some((labels.iter().position(|x| x == l)? as f64, 100.0 * p))
                    })
                    .collect();
                (r.model.clone(), pts)
            })
            .collect();
        let file = format!("levels_{set}.png");
        line_chart(
            &out.join(&file),
            &format!("{set}: pass@1 by level"),
            ("level", "pass@1 (%)"),
            &series,
            Some(&category_labels(labels.clone())),
            Some((0.0, 100.0)),
        )?;
        let _ = writeln!(md, "\n![pass@1 by level, {set}]({file})\n");
    }
    Ok(())
}

/// What the models wrote (the eval stage's `examples.json`): per set, the length table, a chart
/// of the length distributions and the examples, with their whole texts under `examples/`.
fn examples_section(md: &mut String, dir: &Path, out: &Path) -> Result<()> {
    let p = dir.join(stages::eval::EXAMPLES);
    if !p.is_file() {
        md.push_str(
            "## What the models wrote\n\nNot recorded: this eval stage ran before examples \
             were kept (delete its folder and rerun to get them).\n\n",
        );
        return Ok(());
    }
    let ex: crate::eval::examples::Examples = serde_json::from_slice(
        &std::fs::read(&p).with_context(|| format!("cannot read {}", p.display()))?,
    )
    .with_context(|| format!("{}: unreadable", p.display()))?;
    let name = |m: &str| short_model_name(m).0;
    md.push_str(
        "## What the models wrote\n\nPer set and model: completion lengths, then samples \
         chosen by a seeded rule (one correct, one wrong, one cut at `max_new_tokens`, and the \
         samples whose verdict changed from the base model), each with its first and last \
         lines; the links hold the whole texts.\n\n",
    );
    let body = crate::eval::examples::render(&ex, out, "examples", &name)?;
    // the length chart of each set goes under its heading
    let mut sets: Vec<&str> = Vec::new();
    for l in &ex.lengths {
        if !sets.contains(&l.set.as_str()) {
            sets.push(&l.set);
        }
    }
    let mut charts = Vec::new();
    for set in &sets {
        let ls: Vec<_> = ex.lengths.iter().filter(|l| l.set == *set).collect();
        let max = ls.iter().filter_map(|l| l.tokens.last()).max().copied();
        let Some(max) = max.filter(|m| *m > 0) else {
            continue;
        };
        // bins of whole tokens from the shortest completion to the longest, each labelled by
        // its range; a bar per model in each
        let min = ls.iter().filter_map(|l| l.tokens.first()).min().copied();
        let min = min.unwrap_or(0).min(max);
        let width = (max - min + 1).div_ceil(LENGTH_BINS).max(1);
        let bins = (max - min) / width + 1;
        let categories: Vec<String> = (0..bins)
            .map(|i| {
                let lo = min + i * width;
                if width == 1 {
                    lo.to_string()
                } else {
                    format!("{lo}-{}", lo + width - 1)
                }
            })
            .collect();
        let series: Vec<charts::Bars> = ls
            .iter()
            .map(|l| {
                let mut counts = vec![0u64; bins as usize];
                for &t in &l.tokens {
                    counts[((t.max(min) - min) / width) as usize] += 1;
                }
                let n = l.tokens.len().max(1) as f64;
                let pcts = counts.iter().map(|&c| (100.0 * c as f64 / n, None));
                (name(&l.model), pcts.collect())
            })
            .collect();
        let file = format!("eval_lengths_{set}.png");
        charts::bar_chart(
            &out.join(&file),
            &format!("{set}: completion length"),
            ("tokens", "% of samples"),
            &categories,
            &series,
            None,
        )?;
        charts.push((set.to_string(), file));
    }
    for (set, table, examples) in body {
        md.push_str(&table);
        if let Some((_, file)) = charts.iter().find(|(s, _)| *s == set) {
            let _ = writeln!(md, "![{set}: completion lengths]({file})\n");
        }
        md.push_str(&examples);
    }
    Ok(())
}

/// The loss and learning-rate curves of a pretrain or train stage (`name` keys the chart files).
fn train_section(md: &mut String, title: &str, name: &str, dir: &Path, out: &Path) -> Result<()> {
    let p = dir
        .join(stages::TRAIN_STATE_DIR)
        .join(crate::train::trainer::METRICS);
    let text =
        std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?;
    let steps: Vec<crate::train::trainer::Metrics> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| serde_json::from_str(l).with_context(|| format!("{}:{}", p.display(), i + 1)))
        .collect::<Result<_>>()?;
    let _ = writeln!(md, "## {title} ({name})\n");
    let (Some(first), Some(last)) = (steps.first(), steps.last()) else {
        md.push_str("No steps logged.\n\n");
        return Ok(());
    };
    let _ = writeln!(
        md,
        "{} steps; loss {:.4} at step {} -> {:.4} at step {}; final lr {:.3e}.\n\n\
         Speed at the last step: {:.0} tokens/s.\n",
        steps.len(),
        first.loss,
        first.step,
        last.loss,
        last.step,
        last.lr,
        last.tokens_per_second
    );
    let loss: Vec<(f64, f64)> = steps.iter().map(|m| (m.step as f64, m.loss)).collect();
    let lr: Vec<(f64, f64)> = steps.iter().map(|m| (m.step as f64, m.lr)).collect();
    let weight = smoothing_weight(loss.len());
    let smoothed = smooth(&loss, weight);
    let _ = writeln!(
        md,
        "Smoothed loss at the last step: {:.4} (dots: each step's loss; line: its exponential \
         moving average, weight {weight}, debiased).\n",
        smoothed.last().map_or(f64::NAN, |p| p.1)
    );
    let lr = vec![("lr".to_string(), lr)];
    let (loss_png, lr_png) = (format!("loss_{name}.png"), format!("lr_{name}.png"));
    commit_png(&out.join(&loss_png), |tmp| {
        draw_loss_chart(tmp, &format!("{name}: loss"), &loss, &smoothed)
    })?;
    line_chart(
        &out.join(&lr_png),
        &format!("{name}: learning rate"),
        ("step", "lr"),
        &lr,
        None,
        None,
    )?;
    let _ = writeln!(
        md,
        "![{name} loss]({loss_png})\n\n![{name} learning rate]({lr_png})\n"
    );
    Ok(())
}

/// The filter's counts as two tables: what each rule removed (a row counts under the first rule
/// that removes it), then the verifier's verdict on every graded row (a truncated row without an
/// answer is removed as truncated and has the verdict no_answer); and the share of the rows graded
/// correct that stated a false arithmetic step.
fn filter_tables(md: &mut String, name: &str, counts: &[(String, u64)]) {
    let _ = writeln!(
        md,
        "## Filter ({name})\n\nWhat each rule removed, in order (a row counts under the first \
         rule that removes it):\n\n| rule | rows |\n| --- | --- |"
    );
    let mut verdicts = Vec::new();
    for (k, v) in counts {
        if let Some(reason) = k.strip_prefix("reason.") {
            verdicts.push((reason, *v));
        } else if let Some(rule) = k.strip_prefix("removed.") {
            let _ = writeln!(md, "| removed: {rule} | {v} |");
        } else if !k.starts_with(stages::filter::CONTAMINATED) {
            let _ = writeln!(md, "| {k} | {v} |");
        }
    }
    if !verdicts.is_empty() {
        let _ = writeln!(
            md,
            "\nThe verifier's verdict on every graded row:\n\n| verdict | rows |\n| --- | --- |"
        );
        for (reason, v) in &verdicts {
            let _ = writeln!(md, "| {reason} | {v} |");
        }
    }
    let correct: u64 = verdicts
        .iter()
        .filter(|(r, _)| crate::verify::Reason::parse(r).is_some_and(|r| r.is_correct()))
        .map(|(_, v)| v)
        .sum();
    if let Some((_, f)) = counts.iter().find(|(k, _)| k == "removed.false_step") {
        let _ = writeln!(
            md,
            "\nThe arithmetic-step rule (`check_arithmetic`) dropped {f} rows with a right answer \
             that state a false numeric equality: {:.1}% of the {correct} rows graded correct.",
            100.0 * *f as f64 / correct.max(1) as f64
        );
    }
    let _ = writeln!(md);
}

/// The pass-rate histogram: problems never, sometimes (by quarter) and always solved.
fn pass_rate_table(md: &mut String, rates: &std::collections::HashMap<String, (u64, u64)>) {
    // the pass-rate histogram: never, sometimes (by quarter), always solved
    let mut bins = [0u64; 6];
    for (n, c) in rates.values() {
        let r = *c as f64 / (*n).max(1) as f64;
        let b = if *c == 0 {
            0
        } else if c == n {
            5
        } else {
            ((r * 4.0).ceil() as usize).clamp(1, 4)
        };
        bins[b] += 1;
    }
    let _ = writeln!(
        md,
        "Problems by pass rate (correct samples of their samples):\n\n| | 0 | (0, 25%] | \
         (25, 50%] | (50, 75%] | (75, 100%) | 100% |\n| --- | --- | --- | --- | --- | --- | \
         --- |\n| problems | {} |\n",
        bins.iter()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
            .join(" | ")
    );
}

/// What resampling (`run.resample_below`) and rationalization (`[rationalize]`) did in a sample
/// stage.
fn resample_lines(md: &mut String, s: &Stage, m: &store::Manifest) {
    let count = |k: &str| m.counts.iter().find(|c| c.0 == k).map_or(0, |c| c.1);
    let skipped = count("problems_skipped");
    if skipped > 0 {
        let n = m.config.get("n").and_then(|v| v.as_u64()).unwrap_or(1);
        let mean = count("generated_tokens") as f64 / count("samples").max(1) as f64;
        let _ = writeln!(
            md,
            "Resampling (`run.resample_below`): {skipped} problems the round before solved \
             reliably were not sampled: {} samples, about {:.0} generated tokens saved.\n",
            skipped * n,
            (skipped * n) as f64 * mean
        );
    }
    if m.counts.iter().any(|(k, _)| k == "rationalize.problems") {
        let _ = writeln!(
            md,
            "Rationalization (`[rationalize]`): the {} problems without a correct sample \
             were sampled again with the answer as a hint: {} samples, {} correct, {} \
             generated tokens (`{}`; the hinted prompts are in `{}`).\n",
            count("rationalize.problems"),
            count("rationalize.samples"),
            count("rationalize.correct"),
            count("rationalize.generated_tokens"),
            s.dir
                .join(crate::jobs::sample::rationalize::RATIONALIZED)
                .display(),
            crate::jobs::sample::rationalize::HINTED,
        );
    }
}

/// `prev`: the round before's pass rates by problem (samples, correct), replaced by this round's.
fn sample_section(
    md: &mut String,
    s: &Stage,
    out: &Path,
    prev: &mut Option<std::collections::HashMap<String, (u64, u64)>>,
) -> Result<()> {
    let m = s.manifest.as_ref().expect("done");
    let count = |k: &str| m.counts.iter().find(|c| c.0 == k).map_or(0, |c| c.1);
    let _ = writeln!(md, "## Sampling ({})\n", s.name);
    // a sharded stage: its shards' time, added up (they ran side by side)
    let (seconds, by) = match (count("shards"), count("shard_seconds")) {
        (0, _) => (m.wall_seconds, String::new()),
        (n, secs) => (secs as f64, format!(" of {n} shards' time added up")),
    };
    // what the output holds (the same after a kill and resume), then what the last process
    // (or the shards) did in its time
    let _ = writeln!(
        md,
        "{} problems, {} samples ({} correct), {} prompt and {} generated tokens.\n",
        count("problems"),
        count("samples"),
        count("correct"),
        count("prompt_tokens"),
        count("generated_tokens"),
    );
    let _ = writeln!(
        md,
        "Sampling took {:.1} s{by} ({:.0} generated tokens/s), {} preemptions, {} samples saved \
         by `target_correct`.\n",
        seconds,
        stages::sample::computed_generated_tokens(m) as f64 / seconds.max(1e-9),
        count("preemptions"),
        count("samples_saved"),
    );
    let rows = crate::data::schema::read_completions(&s.dir.join(stages::COMPLETIONS))?;
    let rates = crate::data::schema::pass_rates(&rows);
    if !rates.is_empty() {
        pass_rate_table(md, &rates);
        if let Some(p) = prev.as_ref() {
            let moved = rates
                .iter()
                .filter(|(id, (_, c))| *c > 0 && p.get(*id).is_some_and(|(_, pc)| *pc == 0))
                .count();
            let _ = writeln!(
                md,
                "{moved} problems unsolved in the round before have a correct sample now.\n"
            );
        }
        resample_lines(md, s, m);
        // a resampled round has no rates for the problems it left out: keep the older ones
        let mut merged = prev.take().unwrap_or_default();
        merged.extend(rates);
        *prev = Some(merged);
    }
    let mut lengths: Vec<u64> = rows
        .iter()
        .filter_map(|c| c.num_completion_tokens)
        .map(|n| n.max(0) as u64)
        .collect();
    if lengths.is_empty() {
        return Ok(());
    }
    lengths.sort_unstable();
    let q = |f: f64| lengths[((lengths.len() - 1) as f64 * f).round() as usize];
    let _ = writeln!(
        md,
        "Completion length (tokens): median {}, p90 {}, max {}.\n",
        q(0.5),
        q(0.9),
        q(1.0)
    );
    let png = format!("lengths_{}.png", s.name);
    histogram(
        &out.join(&png),
        &format!("{}: completion length", s.name),
        "tokens",
        &lengths,
    )?;
    let _ = writeln!(md, "![completion lengths]({png})\n");
    Ok(())
}

/// `base (path)` -> (`base`, path); `trained (path)` -> `round 1`; `trained-r2 (path)` ->
/// `round 2`; anything else stays as it is.
pub fn short_model_name(model: &str) -> (String, String) {
    let Some((label, rest)) = model.split_once(" (") else {
        return (model.to_string(), model.to_string());
    };
    let path = rest.strip_suffix(')').unwrap_or(rest).to_string();
    let short = match label {
        "trained" => "round 1".to_string(),
        l => match l.strip_prefix("trained-r") {
            Some(n) => format!("round {n}"),
            None => l.to_string(),
        },
    };
    (short, path)
}

//! The run report: `<workdir>/report/report.md` and its PNG charts, rebuilt from the stage store
//! alone (plan, manifests and stage outputs), so `pipeline report --workdir DIR` regenerates it
//! at any time and `pipeline run` writes it after its stages.
//!
//! Sections, each present when its stage is done: evaluation (base vs trained per set with
//! deltas and 95% intervals, pass@1 by level with a chart), training (loss and learning-rate
//! curves), sampling (throughput, samples saved by `target_correct`, the completion-length
//! distribution), the filter's per-rule counts, and every stage's wall time. Knows the stages'
//! output files, not how they are computed.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use plotters::prelude::*;

use crate::stages::{self, PlanRecord, StageKind, StageState};
use crate::store;

/// The report's folder in a work dir.
pub const DIR: &str = "report";

/// The font every chart's text is drawn with (no system fonts needed).
const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

fn register_font() -> Result<()> {
    static ONCE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = ONCE.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_ok()
    });
    if *ok {
        Ok(())
    } else {
        Err(anyhow!(
            "the report's font (assets/DejaVuSans.ttf) does not load"
        ))
    }
}

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
    // training problems that matched each eval set, by the filter stages that checked
    let mut overlap: Vec<(String, u64, String)> = Vec::new();
    for s in done(StageKind::Filter) {
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
            Some(StageKind::Filter) => {
                let m = s.manifest.as_ref().expect("done");
                filter_tables(&mut md, &s.name, &m.counts);
                match m.counts.iter().find(|(k, _)| k == "kept_rationalized") {
                    Some((_, r)) => {
                        let _ = writeln!(
                            md,
                            "\nKept: {} SFT rows, {r} of them rationalized (sampled with the \
                             answer as a hint, trained under the prompt without it).\n",
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
                        "Decontamination ({}-word n-grams and exact match) against {}: {} training \
                         problems matched, {dropped} rows dropped; the matches are in `{}`.\n",
                        ngram.unwrap_or(0),
                        checked
                            .iter()
                            .map(|(k, n)| format!(
                                "{} ({n})",
                                &k[stages::filter::CONTAMINATED.len()..]
                            ))
                            .collect::<Vec<_>>()
                            .join(", "),
                        checked.iter().map(|c| c.1).sum::<u64>(),
                        s.dir.join(stages::filter::CONTAMINATION).display()
                    );
                } else if decontam == Some(false) {
                    md.push_str(
                        "Decontamination: off (`filter.decontaminate = false`): training \
                         problems were not checked against the eval sets.\n\n",
                    );
                }
            }
            Some(StageKind::Train) => {
                train_section(&mut md, "Training", &s.name, &s.dir, &out)?;
                let m = s.manifest.as_ref().expect("done");
                if let Some(total) = m.counts.iter().find(|c| c.0 == "mix.rows") {
                    let count = |k: &str| m.counts.iter().find(|c| c.0 == k).map_or(0, |c| c.1);
                    let sources: Vec<String> = m
                        .counts
                        .iter()
                        .filter_map(|(k, n)| {
                            Some(format!("{n} from {}", k.strip_prefix("mix.source.")?))
                        })
                        .collect();
                    let _ = writeln!(
                        md,
                        "Training rows (`[mix]`): {} in all: {} kept this round, {} kept in earlier \
                         rounds{}.\n",
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
            }
            _ => {}
        }
    }
    let price = plan.gpu_hour_price;
    md.push_str(
        "## Stages\n\n| stage | state | rows | wall time | device | GPU hours | cost | estimated \
         | key |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    let (mut total_hours, mut total_cost) = (0.0, 0.0);
    for s in &list {
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
    let path = out.join("report.md");
    store::commit_file(&path, |tmp| Ok(std::fs::write(tmp, &md)?))?;
    Ok(path)
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
    let with_levels: Vec<_> = results
        .iter()
        .filter(|r| !r.metrics.by_level.is_empty())
        .collect();
    if !with_levels.is_empty() {
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
    }
    examples_section(md, dir, out)
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
        let bins = 20u32;
        let width = max.div_ceil(bins).max(1);
        let series: Vec<(String, Vec<(f64, f64)>)> = ls
            .iter()
            .map(|l| {
                let mut counts = vec![0u64; bins as usize];
                for &t in &l.tokens {
                    counts[((t / width) as usize).min(bins as usize - 1)] += 1;
                }
                let n = l.tokens.len().max(1) as f64;
                let pts = counts
                    .iter()
                    .enumerate()
                    .map(|(i, &c)| ((i as f64 + 0.5) * width as f64, 100.0 * c as f64 / n))
                    .collect();
                (name(&l.model), pts)
            })
            .collect();
        let file = format!("eval_lengths_{set}.png");
        line_chart(
            &out.join(&file),
            &format!("{set}: completion length"),
            ("tokens", "% of samples"),
            &series,
            None,
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

/// Line colours that read on white (Okabe and Ito's palette without its yellow).
const COLOURS: [RGBColor; 7] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
];

/// Draws a chart into a temporary file beside `path` (keeping `.png`, which the drawing
/// backend reads) and commits it ([`store::commit_file_via`]): a chart that cannot be written
/// whole (a full disk) is never left half-written under its name.
fn commit_png(path: &Path, draw: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let stem = path
        .file_stem()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    store::commit_file_via(path, &format!(".{stem}.tmp.png"), draw).map(|_| ())
}

/// An x-axis labeller for categories at x = 0, 1, 2, ...: `labels[i]` at integer `i`, nothing
/// between them.
pub fn category_labels(labels: Vec<String>) -> impl Fn(f64) -> String {
    move |x: f64| {
        let i = x.round();
        if (x - i).abs() > 0.01 || i < 0.0 {
            return String::new();
        }
        labels.get(i as usize).cloned().unwrap_or_default()
    }
}

/// [`draw_line_chart`] committed whole.
pub fn line_chart(
    path: &Path,
    title: &str,
    axes: (&str, &str),
    series: &[(String, Vec<(f64, f64)>)],
    x_label: Option<&dyn Fn(f64) -> String>,
    y_range: Option<(f64, f64)>,
) -> Result<()> {
    commit_png(path, |tmp| {
        draw_line_chart(tmp, title, axes, series, x_label, y_range)
    })
}

/// [`draw_histogram`] committed whole.
fn histogram(path: &Path, title: &str, x_desc: &str, values: &[u64]) -> Result<()> {
    commit_png(path, |tmp| draw_histogram(tmp, title, x_desc, values))
}

/// The legend's width, right of the plot (it never covers a line).
const LEGEND_WIDTH: u32 = 150;

fn chart_err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing a chart: {e}")
}

/// An 800 x 450 white PNG canvas at `path`, with the report's font registered.
fn canvas(path: &Path) -> Result<DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>> {
    register_font()?;
    let root = BitMapBackend::new(path, (800, 450)).into_drawing_area();
    root.fill(&WHITE).map_err(chart_err)?;
    Ok(root)
}

/// Every chart's title, margins and axis label areas.
fn frame<'a, 'b>(
    root: &'a DrawingArea<BitMapBackend<'b>, plotters::coord::Shift>,
    title: &str,
) -> ChartBuilder<'a, 'b, BitMapBackend<'b>> {
    let mut b = ChartBuilder::on(root);
    b.caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70);
    b
}

/// Lines over a shared x axis; `x_label` names the ticks of a categorical axis (then padded by
/// half a category each side), `y_range` fixes the y axis (accuracies: 0 to 100).
fn draw_line_chart(
    path: &Path,
    title: &str,
    (x_desc, y_desc): (&str, &str),
    series: &[(String, Vec<(f64, f64)>)],
    x_label: Option<&dyn Fn(f64) -> String>,
    y_range: Option<(f64, f64)>,
) -> Result<()> {
    let pts = series.iter().flat_map(|s| s.1.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    let pad = ((y1 - y0) * 0.05).max(1e-12);
    let (y0, y1) = y_range.unwrap_or((y0 - pad, y1 + pad));
    let (x0, x1) = match x_label {
        Some(_) => (x0 - 0.5, x1 + 0.5),
        None if x1 > x0 => (x0, x1),
        None => (x0, x0 + 1.0),
    };
    let root = canvas(path)?;
    let legend = series.len() > 1;
    let mut builder = frame(&root, title);
    if legend {
        builder.margin_right(LEGEND_WIDTH + 12);
    }
    let mut chart = builder
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(chart_err)?;
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(x_desc).y_desc(y_desc);
    let fmt = |x: &f64| x_label.map_or_else(|| format!("{x}"), |f| f(*x));
    if x_label.is_some() {
        mesh.x_labels(series.iter().map(|s| s.1.len()).max().unwrap_or(1));
    }
    mesh.x_label_formatter(&fmt).draw().map_err(chart_err)?;
    let (width, _) = root.dim_in_pixel();
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(chart_err)?;
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(chart_err)?;
        if legend {
            // in the right margin, outside the plot
            let x = (width - LEGEND_WIDTH) as i32;
            let y = 60 + 24 * i as i32;
            root.draw(&PathElement::new(
                vec![(x, y), (x + 22, y)],
                color.stroke_width(3),
            ))
            .map_err(chart_err)?;
            root.draw(&Text::new(
                name.clone(),
                (x + 28, y - 8),
                ("sans-serif", 15).into_font().color(&BLACK),
            ))
            .map_err(chart_err)?;
        }
    }
    root.present().map_err(chart_err)?;
    Ok(())
}

/// The EMA weight for a curve of `n` points: TensorBoard's 0.9 once there are enough points
/// for it to mean something, less for short runs.
fn smoothing_weight(n: usize) -> f64 {
    match n {
        0..=9 => 0.5,
        10..=49 => 0.8,
        _ => 0.9,
    }
}

/// The debiased exponential moving average of `pts` (TensorBoard's smoothing): the first point
/// is the first value, not pulled toward zero.
fn smooth(pts: &[(f64, f64)], weight: f64) -> Vec<(f64, f64)> {
    let mut avg = 0.0;
    pts.iter()
        .enumerate()
        .map(|(i, &(x, y))| {
            avg = avg * weight + (1.0 - weight) * y;
            (x, avg / (1.0 - weight.powi(i as i32 + 1)))
        })
        .collect()
}

/// The per-step loss as dots and its smoothed curve as a line over them.
fn draw_loss_chart(
    path: &Path,
    title: &str,
    raw: &[(f64, f64)],
    smoothed: &[(f64, f64)],
) -> Result<()> {
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in raw.iter().chain(smoothed).filter(|p| p.1.is_finite()) {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    let pad = ((y1 - y0) * 0.05).max(1e-12);
    let x1 = if x1 > x0 { x1 } else { x0 + 1.0 };
    let root = canvas(path)?;
    let mut builder = frame(&root, title);
    builder.margin_right(LEGEND_WIDTH + 12);
    let mut chart = builder
        .build_cartesian_2d(x0..x1, (y0 - pad)..(y1 + pad))
        .map_err(chart_err)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("loss")
        .draw()
        .map_err(chart_err)?;
    let light = RGBColor(150, 150, 150);
    chart
        .draw_series(
            raw.iter()
                .filter(|p| p.1.is_finite())
                .map(|&p| Circle::new(p, 2, light.filled())),
        )
        .map_err(chart_err)?;
    chart
        .draw_series(LineSeries::new(
            smoothed.iter().copied(),
            COLOURS[0].stroke_width(2),
        ))
        .map_err(chart_err)?;
    let (width, _) = root.dim_in_pixel();
    let x = (width - LEGEND_WIDTH) as i32;
    for (i, (label, color, dot)) in [("per step", light, true), ("smoothed", COLOURS[0], false)]
        .into_iter()
        .enumerate()
    {
        let y = 60 + 24 * i as i32;
        if dot {
            root.draw(&Circle::new((x + 11, y), 3, color.filled()))
                .map_err(chart_err)?;
        } else {
            root.draw(&PathElement::new(
                vec![(x, y), (x + 22, y)],
                color.stroke_width(3),
            ))
            .map_err(chart_err)?;
        }
        root.draw(&Text::new(
            label,
            (x + 28, y - 8),
            ("sans-serif", 15).into_font().color(&BLACK),
        ))
        .map_err(chart_err)?;
    }
    root.present().map_err(chart_err)?;
    Ok(())
}

/// A histogram of `values` (sorted) in up to 40 equal bins.
fn draw_histogram(path: &Path, title: &str, x_desc: &str, values: &[u64]) -> Result<()> {
    let (lo, hi) = (values[0] as f64, *values.last().expect("non-empty") as f64);
    let bins = 40usize;
    let width = ((hi - lo) / bins as f64).max(1.0);
    let mut counts = vec![0u64; bins];
    for &v in values {
        let b = (((v as f64 - lo) / width) as usize).min(bins - 1);
        counts[b] += 1;
    }
    let top = *counts.iter().max().unwrap_or(&1) as f64;
    let root = canvas(path)?;
    let mut chart = frame(&root, title)
        .build_cartesian_2d(lo..lo + width * bins as f64, 0.0..top * 1.05)
        .map_err(chart_err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("samples")
        .draw()
        .map_err(chart_err)?;
    chart
        .draw_series(counts.iter().enumerate().map(|(i, &c)| {
            let x = lo + i as f64 * width;
            Rectangle::new([(x, 0.0), (x + width, c as f64)], COLOURS[0].filled())
        }))
        .map_err(chart_err)?;
    root.present().map_err(chart_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_pngs() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l.png");
        let series = vec![
            ("a".to_string(), vec![(0.0, 1.0), (1.0, 0.5), (2.0, 0.25)]),
            ("b".to_string(), vec![(0.0, 0.9), (2.0, 0.1)]),
        ];
        let names = ["one".to_string(), "two".into(), "three".into()];
        let label = move |x: f64| names.get(x as usize).cloned().unwrap_or_default();
        line_chart(&p, "t", ("x", "y"), &series, Some(&label), Some((0.0, 1.0))).unwrap();
        let raw: Vec<(f64, f64)> = (0..30)
            .map(|i| (i as f64, 3.0 - 0.05 * i as f64 + (i % 3) as f64))
            .collect();
        let sm = smooth(&raw, smoothing_weight(raw.len()));
        assert_eq!(sm[0], raw[0]);
        // smoothing shrinks the step-to-step spread
        let spread = |v: &[(f64, f64)]| v.windows(2).map(|w| (w[1].1 - w[0].1).abs()).sum::<f64>();
        assert!(spread(&sm) < spread(&raw) / 3.0);
        let l = dir.path().join("loss.png");
        commit_png(&l, |tmp| draw_loss_chart(tmp, "t", &raw, &sm)).unwrap();
        assert_eq!(&std::fs::read(&l).unwrap()[..4], b"\x89PNG");
        let h = dir.path().join("h.png");
        histogram(&h, "t", "tokens", &[1, 2, 2, 3, 50, 51]).unwrap();
        histogram(&dir.path().join("one.png"), "t", "tokens", &[7]).unwrap();
        for f in [&p, &h] {
            let bytes = std::fs::read(f).unwrap();
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
            assert!(bytes.len() > 2000);
        }
        // no temporary left beside them
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.starts_with('.')), "{names:?}");
    }

    /// A chart that fails while drawn (a full disk) leaves neither a half-written PNG under its
    /// name nor its temporary.
    #[test]
    fn a_chart_that_fails_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.png");
        let e = commit_png(&p, |tmp| {
            std::fs::write(tmp, b"\x89PNG half").unwrap();
            Err(anyhow!("No space left on device"))
        })
        .unwrap_err();
        assert!(format!("{e:#}").contains("No space left"), "{e:#}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}

//! `pipeline compare DIR DIR...`: runs side by side, from their stage stores alone: each eval
//! set's pass@1 with its 95% interval for every model of every run, the config keys in which the
//! runs differ (the stages' validated sections, as their manifests hold them, flattened to
//! `stage.key` paths), and what each run cost. Prints the Markdown and writes it with one PNG
//! chart (pass@1 of each run's last model per set) to `--output`.
//!
//! Knows the stage store's files, not how the stages compute them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::eval::EvalResult;
use crate::report::{gpu_hours, short_model_name, stages_of};
use crate::stages::StageKind;

#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// The work dirs of the runs (two or more).
    #[arg(required = true, num_args = 2..)]
    pub workdirs: Vec<PathBuf>,
    /// Where compare.md and compare.png go.
    #[arg(long, default_value = "compare")]
    pub output: PathBuf,
}

/// One run, as compare reads it.
struct Run {
    label: String,
    results: Vec<EvalResult>,
    /// `stage.key` -> value, of every done stage's section.
    config: BTreeMap<String, String>,
    gpu_hours: f64,
    cost: Option<f64>,
    wall_seconds: f64,
}

fn flatten(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, String>) {
    match v {
        // an enum's variant (`{"Local": "data/x.jsonl"}`) is not a key a config writes: the
        // value stands under the key itself
        serde_json::Value::Object(m)
            if m.len() == 1
                && m.keys()
                    .all(|k| k.starts_with(|c: char| c.is_ascii_uppercase())) =>
        {
            for x in m.values() {
                flatten(prefix, x, out);
            }
        }
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                flatten(&format!("{prefix}.{k}"), x, out);
            }
        }
        // a list of tables (mix sources) by entry, as `--set` names them
        serde_json::Value::Array(items) if items.iter().all(|x| x.is_object()) => {
            for (i, x) in items.iter().enumerate() {
                flatten(&format!("{prefix}.{i}"), x, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.to_string());
        }
    }
}

/// A label per run: its folder's name, with as many parent folders as it takes to tell runs of
/// the same name apart (`a/runs/x` and `b/runs/x`).
fn labels(dirs: &[std::path::PathBuf]) -> Vec<String> {
    let parts: Vec<Vec<String>> = dirs
        .iter()
        .map(|d| {
            let d = d.canonicalize().unwrap_or_else(|_| d.clone());
            d.components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .filter(|c| c != "/")
                .collect()
        })
        .collect();
    let label = |p: &Vec<String>, k: usize| p[p.len().saturating_sub(k)..].join("/");
    let mut depth = vec![1usize; dirs.len()];
    loop {
        let now: Vec<String> = parts
            .iter()
            .zip(&depth)
            .map(|(p, &k)| label(p, k))
            .collect();
        let mut grew = false;
        for ((mine, d), p) in now.iter().zip(depth.iter_mut()).zip(&parts) {
            let same = now.iter().filter(|l| *l == mine).count() > 1;
            if same && *d < p.len() {
                *d += 1;
                grew = true;
            }
        }
        if !grew {
            return now;
        }
    }
}

fn read_run(dir: &Path) -> Result<Run> {
    let (plan, stages) = stages_of(dir)?;
    let mut run = Run {
        label: dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| dir.display().to_string()),
        results: Vec::new(),
        config: BTreeMap::new(),
        gpu_hours: 0.0,
        cost: None,
        wall_seconds: 0.0,
    };
    for s in &stages {
        let Some(m) = &s.manifest else {
            continue;
        };
        flatten(&s.name, &m.config, &mut run.config);
        run.wall_seconds += m.wall_seconds;
        run.gpu_hours += gpu_hours(m).unwrap_or(0.0);
        if s.kind == Some(StageKind::Eval) {
            let p = s.dir.join(crate::stages::EVAL_METRICS);
            let mut rs: Vec<EvalResult> = serde_json::from_slice(
                &std::fs::read(&p).with_context(|| format!("cannot read {}", p.display()))?,
            )
            .with_context(|| format!("{}: unreadable", p.display()))?;
            for r in &mut rs {
                r.model = short_model_name(&r.model).0;
            }
            run.results = rs;
        }
    }
    run.cost = plan.gpu_hour_price.map(|p| p * run.gpu_hours);
    if run.results.is_empty() {
        bail!(
            "{}: no finished eval stage to compare (run it to the end, or `pipeline run eval`)",
            dir.display()
        );
    }
    Ok(run)
}

pub fn run(a: &CompareArgs) -> Result<()> {
    let mut runs = a
        .workdirs
        .iter()
        .map(|d| read_run(d))
        .collect::<Result<Vec<_>>>()?;
    for (run, label) in runs.iter_mut().zip(labels(&a.workdirs)) {
        run.label = label;
    }
    let md = markdown(&runs);
    std::fs::create_dir_all(&a.output)
        .with_context(|| format!("cannot create {}", a.output.display()))?;
    // the chart: pass@1 of each run's last model with its 95% interval, a bar per run per set
    let mut sets: Vec<String> = Vec::new();
    for r in runs.iter().flat_map(|r| &r.results) {
        if !sets.contains(&r.set) {
            sets.push(r.set.clone());
        }
    }
    let series: Vec<crate::report::Bars> = runs
        .iter()
        .map(|run| {
            let last = run
                .results
                .last()
                .map(|r| r.model.clone())
                .unwrap_or_default();
            let bars = sets
                .iter()
                .map(|set| {
                    let r = run
                        .results
                        .iter()
                        .find(|r| &r.set == set && r.model == last);
                    // a set the run did not evaluate: no bar
                    r.map_or((f64::NAN, None), |r| {
                        let p = &r.metrics.pass_at_1;
                        (100.0 * p.value, Some((100.0 * p.lo, 100.0 * p.hi)))
                    })
                })
                .collect();
            (format!("{} ({last})", run.label), bars)
        })
        .collect();
    crate::report::bar_chart(
        &a.output.join("compare.png"),
        "pass@1 of each run's last model (95% interval)",
        ("set", "pass@1 (%)"),
        &sets,
        &series,
        Some((0.0, 100.0)),
    )?;
    let text = format!("{md}\n![pass@1 of each run's last model](compare.png)\n");
    let path = a.output.join("compare.md");
    crate::store::commit_file(&path, |tmp| Ok(std::fs::write(tmp, &text)?))?;
    crate::out!("{md}");
    crate::outln!("wrote {} and compare.png", path.display());
    Ok(())
}

fn markdown(runs: &[Run]) -> String {
    let pct = |x: f64| format!("{:.1}", 100.0 * x);
    let mut md = String::from("# Compare\n\n");
    let header = |md: &mut String, first: &str| {
        let _ = writeln!(
            md,
            "| {first} | {} |\n| --- |{}",
            runs.iter()
                .map(|r| r.label.as_str())
                .collect::<Vec<_>>()
                .join(" | "),
            " --- |".repeat(runs.len())
        );
    };
    let mut sets: Vec<&str> = Vec::new();
    for r in runs.iter().flat_map(|r| &r.results) {
        if !sets.contains(&r.set.as_str()) {
            sets.push(&r.set);
        }
    }
    for set in sets {
        let _ = writeln!(md, "## {set}: pass@1[avg-of-n] (95% CI)\n");
        header(&mut md, "model");
        let mut models: Vec<&str> = Vec::new();
        for r in runs
            .iter()
            .flat_map(|r| &r.results)
            .filter(|r| r.set == set)
        {
            if !models.contains(&r.model.as_str()) {
                models.push(&r.model);
            }
        }
        for m in models {
            let cells: Vec<String> = runs
                .iter()
                .map(|run| {
                    run.results
                        .iter()
                        .find(|r| r.set == set && r.model == m)
                        .map_or("-".to_string(), |r| {
                            let p = &r.metrics.pass_at_1;
                            format!("{} ({}-{})", pct(p.value), pct(p.lo), pct(p.hi))
                        })
                })
                .collect();
            let _ = writeln!(md, "| {m} | {} |", cells.join(" | "));
        }
        md.push('\n');
    }
    md.push_str("## Config keys that differ\n\n");
    let mut keys: Vec<&String> = runs.iter().flat_map(|r| r.config.keys()).collect();
    keys.sort();
    keys.dedup();
    let differ: Vec<&String> = keys
        .into_iter()
        .filter(|k| {
            let first = runs[0].config.get(*k);
            runs.iter().any(|r| r.config.get(*k) != first)
        })
        .collect();
    if differ.is_empty() {
        md.push_str("None: the runs' stages have the same sections.\n\n");
    } else {
        header(&mut md, "key");
        for k in differ {
            let cells: Vec<String> = runs
                .iter()
                .map(|r| r.config.get(k).cloned().unwrap_or_else(|| "-".into()))
                .map(|v| v.replace('|', "\\|"))
                .collect();
            let _ = writeln!(md, "| {k} | {} |", cells.join(" | "));
        }
        md.push('\n');
    }
    md.push_str("## Cost\n\n");
    header(&mut md, "");
    let row = |f: &dyn Fn(&Run) -> String| runs.iter().map(f).collect::<Vec<_>>().join(" | ");
    let _ = writeln!(
        md,
        "| stage wall time | {} |",
        row(&|r| crate::progress::fmt_secs(r.wall_seconds))
    );
    let _ = writeln!(
        md,
        "| GPU hours | {} |",
        row(&|r| format!("{:.3}", r.gpu_hours))
    );
    let _ = writeln!(
        md,
        "| cost | {} |",
        row(&|r| r.cost.map_or("-".into(), |c| format!("{c:.2}")))
    );
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs in folders of the same name get the parent folders that tell them apart.
    #[test]
    fn labels_tell_runs_of_the_same_name_apart() {
        let dirs: Vec<std::path::PathBuf> = ["/w/a/runs/x", "/w/b/runs/x", "/w/c/y"]
            .iter()
            .map(Into::into)
            .collect();
        assert_eq!(labels(&dirs), ["a/runs/x", "b/runs/x", "y"]);
    }

    /// A source's location reads as the key a config writes, not the enum's variant.
    #[test]
    fn enum_variants_are_not_keys() {
        let mut out = BTreeMap::new();
        let v = serde_json::json!({"sources": [{"location": {"Local": "d.jsonl"}, "limit": 3}]});
        flatten("data", &v, &mut out);
        assert_eq!(out["data.sources.0.location"], "\"d.jsonl\"");
        assert_eq!(out["data.sources.0.limit"], "3");
        assert!(out.keys().all(|k| !k.contains("Local")));
    }
}

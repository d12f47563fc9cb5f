//! `pipeline bench verify`: the verifier's figures on published data. Prints agreement on
//! reference solutions (MATH-500: last `\boxed{}` vs `answer`; GSM8K: solution vs `####`), the
//! false-accept rate on mismatched MATH-500 pairs, single-core checks per second, and the
//! filter's arithmetic-step rule ([`crate::verify::steps`]) on human-written solutions (MATH-500
//! and GSM8K train): how many it flags, each one listed (row, the step it found), to be read as a
//! real error in the reference or a false alarm.
//!
//! A benchmark that prints, never a timed test. Knows nothing of stages.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::data::records::{field_text, read_all_records};
use crate::verify::{grade, GradeOptions};

#[derive(Debug, clap::Args)]
pub struct VerifyBenchArgs {
    /// MATH-500 JSONL (`solution`, `answer`).
    #[arg(long, default_value = "../shared/data/math500.jsonl")]
    pub math: PathBuf,
    /// GSM8K JSONL (`answer` ends in `#### N`); skipped when missing.
    #[arg(long, default_value = "../shared/data/gsm8k_test.jsonl")]
    pub gsm8k: PathBuf,
    /// GSM8K train JSONL, for the arithmetic-step rule; skipped when missing.
    #[arg(long, default_value = "../shared/data/gsm8k_train.jsonl")]
    pub gsm8k_train: PathBuf,
    /// Mismatched pairs are also counted over shifts 1..SHIFTS (500: every pair).
    #[arg(long, default_value_t = 500)]
    pub shifts: usize,
    /// How long to run the throughput loops.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
}

pub fn verify(args: &VerifyBenchArgs) -> Result<()> {
    let opts = GradeOptions::default();
    let math: Vec<(String, String)> = read_all_records(&args.math)?
        .into_iter()
        .filter_map(|r| {
            Some((
                field_text(&r.fields, "solution")?,
                field_text(&r.fields, "answer")?,
            ))
        })
        .collect();
    if math.is_empty() {
        bail!(
            "{} has no rows with `solution` and `answer`",
            args.math.display()
        );
    }
    report_reference("MATH-500 reference", &math, &opts);

    if args.gsm8k.exists() {
        let gsm: Vec<(String, String)> = read_all_records(&args.gsm8k)?
            .into_iter()
            .filter_map(|r| {
                let sol = field_text(&r.fields, "answer")?;
                let gold = sol.rsplit_once("####")?.1.trim().to_string();
                Some((sol, gold))
            })
            .collect();
        report_reference("GSM8K reference", &gsm, &opts);
    } else {
        crate::outln!("GSM8K: {} missing, skipped", args.gsm8k.display());
    }

    report_steps("MATH-500 reference solutions", &math);
    if args.gsm8k_train.exists() {
        let train: Vec<(String, String)> = read_all_records(&args.gsm8k_train)?
            .into_iter()
            .filter_map(|r| Some((field_text(&r.fields, "answer")?, String::new())))
            .collect();
        report_steps("GSM8K train reference solutions", &train);
    } else {
        crate::outln!(
            "GSM8K train: {} missing, skipped",
            args.gsm8k_train.display()
        );
    }

    report_mismatched(&math, args.shifts, &opts);
    let n = math.len();

    // Throughput on one core: extract + equivalence per check, on matching pairs (the common
    // case for a good model) and on mismatched pairs (every comparison tier runs).
    let budget = Duration::from_secs_f64(args.seconds.max(0.1) / 2.0);
    let mismatched: Vec<(&str, &str)> = (0..n)
        .map(|i| (math[i].0.as_str(), math[(i + 1) % n].1.as_str()))
        .collect();
    let matching: Vec<(&str, &str)> = math.iter().map(|(s, g)| (s.as_str(), g.as_str())).collect();
    for (name, pairs) in [
        ("reference pairs", &matching),
        ("mismatched pairs", &mismatched),
    ] {
        let t0 = Instant::now();
        let mut checks = 0u64;
        while t0.elapsed() < budget {
            for (sol, gold) in pairs.iter() {
                std::hint::black_box(grade(sol, gold, &opts));
            }
            checks += pairs.len() as u64;
        }
        let secs = t0.elapsed().as_secs_f64();
        crate::outln!(
            "throughput ({name}): {checks} checks in {secs:.2}s = {:.0} checks/s on one core",
            checks as f64 / secs
        );
    }
    Ok(())
}

/// Each MATH-500 solution against another problem's (different) answer: the next one's (the
/// accepted pairs listed), then every shift up to `shifts`. A wrong answer judged correct is the
/// verifier's false-positive rate.
fn report_mismatched(math: &[(String, String)], shifts: usize, opts: &GradeOptions) {
    // Mismatched pairs: solution i against answer i+1, where the answers differ.
    let n = math.len();
    let strip = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
    let (mut pairs, mut accepted) = (0u64, Vec::new());
    for i in 0..n {
        let (sol, own) = &math[i];
        let (_, other) = &math[(i + 1) % n];
        if strip(own) == strip(other) {
            continue;
        }
        pairs += 1;
        if grade(sol, other, opts).correct {
            accepted.push(format!("{own} ~ {other}"));
        }
    }
    crate::outln!(
        "MATH-500 mismatched pairs (solution i vs answer i+1): {}/{} judged correct = {:.3}%",
        accepted.len(),
        pairs,
        100.0 * accepted.len() as f64 / pairs.max(1) as f64
    );
    for a in accepted.iter().take(10) {
        crate::outln!("  accepted: {a}");
    }
    // Every shift: each solution against every other problem's (different) answer.
    let (mut all_pairs, mut all_accepted) = (0u64, 0u64);
    for shift in 1..shifts.min(n) {
        for i in 0..n {
            let (sol, own) = &math[i];
            let (_, other) = &math[(i + shift) % n];
            if strip(own) != strip(other) {
                all_pairs += 1;
                all_accepted += grade(sol, other, opts).correct as u64;
            }
        }
    }
    if all_pairs > 0 {
        crate::outln!(
            "MATH-500 mismatched pairs over shifts 1..{}: {all_accepted}/{all_pairs} judged correct = {:.3}%",
            shifts.min(n),
            100.0 * all_accepted as f64 / all_pairs as f64
        );
    }
}

/// The arithmetic-step rule over solutions (the first of each pair): every one it flags, with
/// its 1-based row and the false step, and the time it took.
fn report_steps(name: &str, rows: &[(String, String)]) {
    let t0 = Instant::now();
    let flagged: Vec<(usize, String)> = rows
        .iter()
        .enumerate()
        .filter_map(|(i, (sol, _))| Some((i + 1, crate::verify::steps::false_step(sol)?)))
        .collect();
    let secs = t0.elapsed().as_secs_f64();
    crate::outln!(
        "{name}: the arithmetic-step rule flags {}/{} = {:.2}% ({:.0} solutions/s)",
        flagged.len(),
        rows.len(),
        100.0 * flagged.len() as f64 / rows.len().max(1) as f64,
        rows.len() as f64 / secs.max(1e-9)
    );
    for (row, step) in &flagged {
        crate::outln!("  row {row}: {step}");
    }
}

fn report_reference(name: &str, rows: &[(String, String)], opts: &GradeOptions) {
    let mut wrong = Vec::new();
    for (sol, gold) in rows {
        let v = grade(sol, gold, opts);
        if !v.correct {
            wrong.push(format!(
                "gold {gold:?} extracted {:?} ({})",
                v.extracted,
                v.reason.as_str()
            ));
        }
    }
    let ok = rows.len() - wrong.len();
    crate::outln!(
        "{name}: {ok}/{} judged correct = {:.2}%",
        rows.len(),
        100.0 * ok as f64 / rows.len().max(1) as f64
    );
    for w in wrong.iter().take(10) {
        crate::outln!("  missed: {w}");
    }
}

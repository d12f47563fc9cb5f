//! `pipeline bench verify`: the verifier's figures on published data. Prints agreement on
//! reference solutions (MATH-500: last `\boxed{}` vs `answer`; GSM8K: solution vs `####`), the
//! false-accept rate on mismatched MATH-500 pairs, and single-core checks per second.
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
    /// How long to run the throughput loop.
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
        println!("GSM8K: {} missing, skipped", args.gsm8k.display());
    }

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
        if grade(sol, other, &opts).correct {
            accepted.push(format!("{own} ~ {other}"));
        }
    }
    println!(
        "MATH-500 mismatched pairs: {}/{} judged correct = {:.2}%",
        accepted.len(),
        pairs,
        100.0 * accepted.len() as f64 / pairs.max(1) as f64
    );
    for a in accepted.iter().take(10) {
        println!("  false accept: {a}");
    }

    // Throughput on one core: extract + equivalence per check.
    let budget = Duration::from_secs_f64(args.seconds.max(0.1));
    let t0 = Instant::now();
    let mut checks = 0u64;
    while t0.elapsed() < budget {
        for (sol, gold) in &math {
            std::hint::black_box(grade(sol, gold, &opts));
        }
        checks += n as u64;
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "throughput: {checks} checks in {secs:.2}s = {:.0} checks/s on one core",
        checks as f64 / secs
    );
    Ok(())
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
    println!(
        "{name}: {ok}/{} judged correct = {:.2}%",
        rows.len(),
        100.0 * ok as f64 / rows.len().max(1) as f64
    );
    for w in wrong.iter().take(10) {
        println!("  missed: {w}");
    }
}

//! Agreement with the reference solutions of MATH-500, GSM8K and Minerva Math (skipped with a
//! note when `../shared/data` is missing).

use super::*;

/// The data directory next to the crate (`../shared/data`).
fn data_path(file: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/data")
        .join(file)
}

/// One field of a JSON line as text (numbers printed), e.g. AMC's `27.0`.
fn json_field(line: &str, key: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    match v.get(key)? {
        serde_json::Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

fn read_pairs(file: &str, completion_key: &str) -> Option<Vec<(String, String)>> {
    let path = data_path(file);
    let Ok(text) = std::fs::read_to_string(&path) else {
        if std::env::var("SELFDISTILL_REQUIRE_SHARED").is_ok_and(|v| v == "1") {
            panic!(
                "{} is missing and SELFDISTILL_REQUIRE_SHARED=1",
                path.display()
            );
        }
        println!("note: {} missing, skipping", path.display());
        return None;
    };
    Some(
        text.lines()
            .filter_map(|l| Some((json_field(l, completion_key)?, json_field(l, "answer")?)))
            .collect(),
    )
}

#[test]
fn math500_reference_agreement_and_mismatched_pairs() {
    let Some(rows) = read_pairs("math500.jsonl", "solution") else {
        return;
    };
    assert_eq!(rows.len(), 500);
    let opts = GradeOptions::default();
    let start = Instant::now();
    let wrong: Vec<_> = rows
        .iter()
        .filter(|(sol, ans)| !grade(sol, ans, &opts).correct)
        .collect();
    let secs = start.elapsed().as_secs_f64();
    println!(
        "math500 reference: {} checks/s",
        (rows.len() as f64 / secs.max(1e-9)).round()
    );
    assert!(
        wrong.is_empty(),
        "reference solutions judged wrong: {wrong:?}"
    );
    let squash = |s: &str| s.split_whitespace().collect::<String>();
    let (mut pairs, mut accepted) = (0usize, Vec::new());
    let (mut pairs_all, mut accepted_all) = (0usize, 0usize);
    for shift in 1..=10 {
        for (i, (sol, own)) in rows.iter().enumerate() {
            let Some((_, other)) = rows.get((i + shift) % rows.len()) else {
                continue;
            };
            if squash(own) == squash(other) {
                continue;
            }
            let v = grade(sol, other, &opts);
            pairs_all += 1;
            accepted_all += usize::from(v.correct);
            if shift == 1 {
                pairs += 1;
                if v.correct {
                    accepted.push((own.clone(), other.clone(), v.reason));
                }
            }
        }
    }
    println!(
        "math500 mismatched pairs (i vs i+1): {} of {pairs} accepted: {accepted:?}",
        accepted.len()
    );
    println!("math500 mismatched pairs (shifts 1..=10): {accepted_all} of {pairs_all} accepted");
    // The one accepted i+1 pair is a genuinely equal answer (`5` against `x=5`).
    assert!(
        accepted.len() <= 1,
        "too many mismatched pairs accepted: {accepted:?}"
    );
    assert!(
        accepted_all * 1000 <= pairs_all * 2,
        "{accepted_all} of {pairs_all}"
    );
}

#[test]
fn gsm8k_reference_agreement() {
    let Some(rows) = read_pairs("gsm8k_test.jsonl", "answer") else {
        return;
    };
    let opts = GradeOptions::default();
    let mut wrong = Vec::new();
    for (text, _) in &rows {
        let gold = text.rsplit("####").next().unwrap_or("").trim().to_string();
        let v = grade(text, &gold, &opts);
        if !v.correct {
            wrong.push((gold, v));
        }
    }
    println!("gsm8k reference: {} rows", rows.len());
    assert!(wrong.is_empty(), "gsm8k judged wrong: {wrong:?}");
}

/// Minerva Math's own solutions grade as correct against the answer boxed in them, units and
/// all (the house style `\boxed{1.6} \mathrm{~cm}`).
#[test]
fn minerva_solutions_grade_against_their_boxed_answers() {
    // (read_pairs says when the file is missing; Minerva has no `answer` field to pair)
    if read_pairs("minerva_math.jsonl", "solution").is_none() {
        return;
    }
    let pairs: Vec<(String, String)> = std::fs::read_to_string(data_path("minerva_math.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| {
            let sol = json_field(l, "solution")?;
            let gold = extract::last_boxed(&sol)?;
            Some((sol, gold))
        })
        .collect();
    assert_eq!(pairs.len(), 272);
    let opts = GradeOptions::default();
    let wrong: Vec<&(String, String)> = pairs
        .iter()
        .filter(|(sol, gold)| !grade(sol, gold, &opts).correct)
        .collect();
    assert!(
        wrong.is_empty(),
        "{} wrong: {:?}",
        wrong.len(),
        wrong.first()
    );
}

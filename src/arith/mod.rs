//! Arithmetic word problems with step-by-step solutions ending in `\boxed{}`, at graded
//! difficulty: the embedded default's data, generated so that it needs no download.
//!
//! A problem starts a person with a count of things and changes it `steps` times (buys, finds,
//! gives away, ...) by numbers of `digits` digits, the count staying below twice their range;
//! the solution writes one line of arithmetic per change and then the boxed answer. Harder levels have more changes and longer numbers, so a
//! model trained on the easy levels meets the hard ones one step out of its training
//! distribution: the setting in which sampling, filtering and retraining extend what a small
//! transformer can do (Lee et al., 2025).
//!
//! [`generate`] fills named splits from one seed, and no problem text appears twice in a run, so
//! splits are disjoint. Knows nothing of tokenizers, models or files beyond writing JSONL.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::rng::SplitMix;

/// One difficulty level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Level {
    /// Changes to the starting count (lines of arithmetic in the solution).
    pub steps: u32,
    /// Digits of the starting count and of each change.
    pub digits: u32,
}

/// One generated problem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArithProblem {
    /// `<split>-<level>-<index>`.
    pub id: String,
    /// 1-based index into the run's level table.
    pub level: u32,
    pub problem: String,
    pub solution: String,
    pub answer: String,
}

/// How many problems of which levels a split holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitSpec {
    pub name: String,
    /// 1-based levels; each gets `per_level` problems.
    pub levels: Vec<u32>,
    pub per_level: usize,
}

const NAMES: [&str; 12] = [
    "Ana", "Ben", "Carla", "Dev", "Emma", "Finn", "Gia", "Hugo", "Ines", "Jon", "Kim", "Leo",
];
const THINGS: [&str; 10] = [
    "apples", "stamps", "marbles", "coins", "books", "shells", "cards", "pencils", "stickers",
    "beads",
];
const GAIN: [&str; 3] = ["buys", "finds", "gets"];
const LOSS: [&str; 3] = ["gives away", "loses", "sells"];

/// A number of exactly `digits` digits (1 digit: 1..=9).
fn number(rng: &mut SplitMix, digits: u32) -> u64 {
    let lo = if digits <= 1 {
        1
    } else {
        10u64.pow(digits - 1)
    };
    let hi = 10u64.pow(digits);
    lo + rng.below((hi - lo) as usize) as u64
}

/// One problem of `level`: (problem, solution, answer).
pub fn make_problem(level: Level, rng: &mut SplitMix) -> (String, String, String) {
    let name = NAMES[rng.below(NAMES.len())];
    let things = THINGS[rng.below(THINGS.len())];
    let mut count = number(rng, level.digits);
    let mut problem = format!("{name} has {count} {things}.");
    let mut solution = String::new();
    for _ in 0..level.steps {
        let delta = number(rng, level.digits);
        // The count stays below twice the operands' range (19 for one digit), so the arithmetic
        // of a level is a small closed set and only the number of steps grows; it never goes
        // negative. Otherwise a coin decides.
        let cap = 2 * 10u64.pow(level.digits) - 1;
        let subtract = count + delta > cap || (delta <= count && rng.below(2) == 0);
        let next = if subtract {
            count - delta
        } else {
            count + delta
        };
        if subtract {
            let verb = LOSS[rng.below(LOSS.len())];
            problem.push_str(&format!(" {name} {verb} {delta}."));
            solution.push_str(&format!("{count} - {delta} = {next}\n"));
        } else {
            let verb = GAIN[rng.below(GAIN.len())];
            problem.push_str(&format!(" {name} {verb} {delta} more."));
            solution.push_str(&format!("{count} + {delta} = {next}\n"));
        }
        count = next;
    }
    problem.push_str(&format!(" How many {things} does {name} have now?"));
    solution.push_str(&format!("\\boxed{{{count}}}"));
    (problem, solution, count.to_string())
}

/// Fills every split from `seed`; no problem text appears twice across all splits.
pub fn generate(
    levels: &[Level],
    splits: &[SplitSpec],
    seed: u64,
) -> Result<Vec<(String, Vec<ArithProblem>)>> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(splits.len());
    for (si, split) in splits.iter().enumerate() {
        let mut rows = Vec::with_capacity(split.levels.len() * split.per_level);
        for &lv in &split.levels {
            let Some(&level) = levels.get((lv as usize).wrapping_sub(1)) else {
                bail!(
                    "split `{}` asks for level {lv}; the level table has levels 1..={}",
                    split.name,
                    levels.len()
                );
            };
            // One stream per (seed, split, level): adding a split leaves the others unchanged
            // except for the texts it takes first.
            let mut rng = SplitMix(
                seed ^ (si as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    ^ u64::from(lv).wrapping_mul(0xD1B5_4A32_D192_ED03),
            );
            let mut made = 0;
            let mut misses = 0usize;
            while made < split.per_level {
                if misses > 20_000 {
                    bail!(
                        "level {lv} ({} steps of {} digits) has too few distinct problems for {} more in split `{}`",
                        level.steps,
                        level.digits,
                        split.per_level - made,
                        split.name
                    );
                }
                let (problem, solution, answer) = make_problem(level, &mut rng);
                if !seen.insert(problem.clone()) {
                    misses += 1;
                    continue;
                }
                misses = 0;
                rows.push(ArithProblem {
                    id: format!("{}-{lv}-{made}", split.name),
                    level: lv,
                    problem,
                    solution,
                    answer,
                });
                made += 1;
            }
        }
        out.push((split.name.clone(), rows));
    }
    Ok(out)
}

/// Writes problems as JSONL (`id`, `level`, `problem`, `solution`, `answer`), atomically.
pub fn write_jsonl(path: &Path, rows: &[ArithProblem]) -> Result<()> {
    let tmp = path.with_extension("jsonl.tmp");
    {
        let f = std::fs::File::create(&tmp)
            .with_context(|| format!("cannot create {}", tmp.display()))?;
        let mut w = std::io::BufWriter::new(f);
        for r in rows {
            serde_json::to_writer(&mut w, r)?;
            w.write_all(b"\n")?;
        }
        w.into_inner()
            .map_err(|e| e.into_error())?
            .sync_all()
            .with_context(|| format!("cannot write {}", tmp.display()))?;
    }
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every solution's lines are correct arithmetic, chain from the start count, and end in the
    /// boxed answer the verifier extracts; levels have their step counts and digit lengths.
    #[test]
    fn solutions_are_correct_chains_with_the_level_shape() {
        let mut rng = SplitMix(7);
        for level in [
            Level {
                steps: 1,
                digits: 1,
            },
            Level {
                steps: 4,
                digits: 3,
            },
        ] {
            for _ in 0..200 {
                let (problem, solution, answer) = make_problem(level, &mut rng);
                let lines: Vec<&str> = solution.lines().collect();
                assert_eq!(lines.len(), level.steps as usize + 1, "{solution}");
                let mut prev: Option<u64> = None;
                for l in &lines[..lines.len() - 1] {
                    let parts: Vec<&str> = l.split(' ').collect();
                    let (a, op, b, r) = (
                        parts[0].parse::<u64>().unwrap(),
                        parts[1],
                        parts[2].parse::<u64>().unwrap(),
                        parts[4].parse::<u64>().unwrap(),
                    );
                    assert_eq!(b.to_string().len(), level.digits as usize);
                    assert_eq!(r, if op == "+" { a + b } else { a - b }, "{l}");
                    assert!(
                        r < 2 * 10u64.pow(level.digits),
                        "{l} leaves the level's range"
                    );
                    if let Some(p) = prev {
                        assert_eq!(a, p, "the chain breaks in {solution}");
                    } else {
                        assert!(problem.contains(&format!(" has {a} ")), "{problem}");
                    }
                    prev = Some(r);
                }
                assert_eq!(prev.unwrap().to_string(), answer);
                let v = crate::verify::grade(
                    &solution,
                    &answer,
                    &crate::verify::GradeOptions::default(),
                );
                assert!(v.correct, "{solution} vs {answer}: {v:?}");
            }
        }
    }

    #[test]
    fn splits_are_disjoint_and_reproducible() {
        let levels = [
            Level {
                steps: 1,
                digits: 1,
            },
            Level {
                steps: 2,
                digits: 2,
            },
        ];
        let splits = [
            SplitSpec {
                name: "train".into(),
                levels: vec![1, 2],
                per_level: 30,
            },
            SplitSpec {
                name: "eval".into(),
                levels: vec![2],
                per_level: 40,
            },
        ];
        let a = generate(&levels, &splits, 1).unwrap();
        assert_eq!(a, generate(&levels, &splits, 1).unwrap());
        assert_ne!(a, generate(&levels, &splits, 2).unwrap());
        let mut texts = HashSet::new();
        for (_, rows) in &a {
            for r in rows {
                assert!(texts.insert(r.problem.clone()), "{} twice", r.problem);
            }
        }
        assert_eq!(texts.len(), 100);
        // Level 1 (one change of one digit) has too few distinct texts for a huge split.
        let tiny = [SplitSpec {
            name: "x".into(),
            levels: vec![1],
            per_level: 100_000,
        }];
        let err = generate(&levels, &tiny, 1).unwrap_err().to_string();
        assert!(err.contains("too few distinct problems"), "{err}");
        let bad = [SplitSpec {
            name: "y".into(),
            levels: vec![3],
            per_level: 1,
        }];
        let err = generate(&levels, &bad, 1).unwrap_err().to_string();
        assert!(err.contains("level 3"), "{err}");
    }
}

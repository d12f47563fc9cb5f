//! Arithmetic word problems with step-by-step solutions ending in `\boxed{}`, at graded
//! difficulty: the embedded default's data, generated so that it needs no download.
//!
//! A problem starts a person with a count of things and changes it `steps` times (buys, finds,
//! gives away, ...) by 1 to `max_change`; the count stays within `min..=max`. The solution writes
//! one line of arithmetic per change (`57 + 8 = 65.`) and then the boxed answer. A level is a
//! number of steps and a range of counts, so a level table can hold out combinations: the
//! default pretrains on long chains of small counts and short chains of large counts, and
//! self-distills on long chains of large counts, whose every line and length the model has seen
//! apart, never together. That is where a small transformer starts above zero and sampling,
//! filtering and retraining lift it (the easy-to-hard setting of Lee et al., 2025).
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
    /// The starting count is drawn from `start_min..=max`.
    pub start_min: u64,
    /// The count never leaves `min..=max`: a change that would is turned the other way.
    pub min: u64,
    pub max: u64,
    /// Each change is 1..=max_change.
    pub max_change: u64,
}

impl Level {
    fn check(&self, what: &str) -> Result<()> {
        if self.steps == 0 || self.max_change == 0 {
            bail!("{what}: steps and max_change must be at least 1");
        }
        if !(self.min <= self.start_min && self.start_min <= self.max) {
            bail!("{what}: needs min <= start_min <= max");
        }
        if self.max - self.min < self.max_change {
            bail!("{what}: max - min must be at least max_change, so a change always fits");
        }
        Ok(())
    }
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

/// One problem of `level`: (problem, solution, answer).
pub fn make_problem(level: Level, rng: &mut SplitMix) -> (String, String, String) {
    let name = NAMES[rng.below(NAMES.len())];
    let things = THINGS[rng.below(THINGS.len())];
    let span = |lo: u64, hi: u64, rng: &mut SplitMix| lo + rng.below((hi - lo + 1) as usize) as u64;
    let mut count = span(level.start_min, level.max, rng);
    let mut problem = format!("{name} has {count} {things}.");
    let mut solution = String::new();
    for _ in 0..level.steps {
        let delta = span(1, level.max_change, rng);
        let subtract = if count + delta > level.max {
            true
        } else if count < level.min + delta {
            false
        } else {
            rng.below(2) == 0
        };
        let next = if subtract {
            count - delta
        } else {
            count + delta
        };
        if subtract {
            let verb = LOSS[rng.below(LOSS.len())];
            problem.push_str(&format!(" {name} {verb} {delta}."));
            solution.push_str(&format!("{count} - {delta} = {next}.\n"));
        } else {
            let verb = GAIN[rng.below(GAIN.len())];
            problem.push_str(&format!(" {name} {verb} {delta} more."));
            solution.push_str(&format!("{count} + {delta} = {next}.\n"));
        }
        count = next;
    }
    problem.push_str(&format!(" How many {things} does {name} have now?"));
    solution.push_str(&format!("\\boxed{{{count}}}"));
    (problem, solution, count.to_string())
}

/// The most problems one spec generates, over all its splits: ten times the shipped spec's
/// largest use; a bound, so that a typo is an error and not an allocation that aborts.
pub const MAX_PROBLEMS: usize = 1_000_000;

/// Split names that are file names (`<name>.jsonl` in the output folder, never outside it),
/// each once, and problem counts within [`MAX_PROBLEMS`].
fn check_splits(splits: &[SplitSpec]) -> Result<()> {
    let mut names = HashSet::new();
    let mut total = 0usize;
    for s in splits {
        let n = &s.name;
        let plain = n
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if n.is_empty() || !plain || n.starts_with('.') {
            bail!(
                "split `{n}`: a split name is a file name of letters, digits, `_`, `-` and `.` \
                 (not first): its problems go to <output>/<name>.jsonl"
            );
        }
        if !names.insert(n.as_str()) {
            bail!("split `{n}` is named twice: its second file would replace the first");
        }
        if s.levels.is_empty() {
            bail!("split `{n}`: `levels` is empty");
        }
        total = s
            .per_level
            .checked_mul(s.levels.len())
            .and_then(|k| k.checked_add(total))
            .filter(|&t| t <= MAX_PROBLEMS)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "split `{n}`: per_level = {} over {} levels makes more than {MAX_PROBLEMS} \
                     problems in the spec",
                    s.per_level,
                    s.levels.len()
                )
            })?;
    }
    Ok(())
}

/// Fills every split from `seed`; no problem text appears twice across all splits. A split's
/// rows interleave its levels.
pub fn generate(
    levels: &[Level],
    splits: &[SplitSpec],
    seed: u64,
) -> Result<Vec<(String, Vec<ArithProblem>)>> {
    for (i, l) in levels.iter().enumerate() {
        l.check(&format!("level {}", i + 1))?;
    }
    check_splits(splits)?;
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(splits.len());
    for (si, split) in splits.iter().enumerate() {
        let mut by_level: Vec<Vec<ArithProblem>> = Vec::with_capacity(split.levels.len());
        for &lv in &split.levels {
            let mut rows = Vec::with_capacity(split.per_level);
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
                        "level {lv} ({} steps, counts {}..={}) has too few distinct problems for \
                         {} more in split `{}`",
                        level.steps,
                        level.min,
                        level.max,
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
            by_level.push(rows);
        }
        // Interleaved, one problem of each level in turn: the first N rows of a split (a
        // source's `limit`) cover its levels evenly.
        let mut rows = Vec::with_capacity(split.levels.len() * split.per_level);
        for i in 0..split.per_level {
            rows.extend(by_level.iter_mut().map(|l| l[i].clone()));
        }
        out.push((split.name.clone(), rows));
    }
    Ok(out)
}

/// A generated data set: the level table, the splits and the seed (`data/arith/spec.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArithSpec {
    pub seed: u64,
    pub levels: Vec<Level>,
    pub splits: Vec<SplitSpec>,
}

impl ArithSpec {
    pub fn load(path: &Path) -> Result<ArithSpec> {
        let text = crate::bytes::read_settings_file(path, "arithmetic spec")?;
        toml::from_str(&text).with_context(|| format!("{}: not an arithmetic spec", path.display()))
    }

    /// Generates every split and writes `<dir>/<split>.jsonl`; returns (path, rows) per split.
    pub fn write(&self, dir: &Path) -> Result<Vec<(std::path::PathBuf, usize)>> {
        let splits = generate(&self.levels, &self.splits, self.seed)?;
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let mut out = Vec::new();
        for (name, rows) in splits {
            let path = dir.join(format!("{name}.jsonl"));
            write_jsonl(&path, &rows)?;
            out.push((path, rows.len()));
        }
        Ok(out)
    }
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

    fn level(steps: u32, start_min: u64, max: u64) -> Level {
        Level {
            steps,
            start_min,
            min: 10,
            max,
            max_change: 9,
        }
    }

    /// Every solution's lines are correct arithmetic, chain from the start count, stay in the
    /// level's range and end in the boxed answer the verifier extracts.
    #[test]
    fn solutions_are_correct_chains_with_the_level_shape() {
        let mut rng = SplitMix(7);
        for lv in [level(1, 10, 49), level(5, 50, 99)] {
            for _ in 0..200 {
                let (problem, solution, answer) = make_problem(lv, &mut rng);
                let lines: Vec<&str> = solution.lines().collect();
                assert_eq!(lines.len(), lv.steps as usize + 1, "{solution}");
                let mut prev: Option<u64> = None;
                for l in &lines[..lines.len() - 1] {
                    let parts: Vec<&str> = l.trim_end_matches('.').split(' ').collect();
                    let (a, op, b, r) = (
                        parts[0].parse::<u64>().unwrap(),
                        parts[1],
                        parts[2].parse::<u64>().unwrap(),
                        parts[4].parse::<u64>().unwrap(),
                    );
                    assert!((1..=lv.max_change).contains(&b), "{l}");
                    assert_eq!(r, if op == "+" { a + b } else { a - b }, "{l}");
                    assert!(
                        (lv.min..=lv.max).contains(&r),
                        "{l} leaves the level's range"
                    );
                    if let Some(p) = prev {
                        assert_eq!(a, p, "the chain breaks in {solution}");
                    } else {
                        assert!(problem.contains(&format!(" has {a} ")), "{problem}");
                        assert!((lv.start_min..=lv.max).contains(&a), "{problem}");
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
        let levels = [level(1, 10, 19), level(2, 10, 99)];
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
        // Level 1 (one change, counts 10..=19) has too few distinct texts for a huge split.
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
        let narrow = [Level {
            max: 12,
            ..level(1, 10, 12)
        }];
        let err = generate(&narrow, &bad[..0], 1).unwrap_err().to_string();
        assert!(err.contains("max - min"), "{err}");
    }

    /// A huge count is an error before anything is allocated (it aborted), and a split name is
    /// a file name in the output folder: `..`, a slash, a hidden name or a repeat are refused.
    #[test]
    fn splits_are_bounded_and_named_as_files() {
        let levels = [level(1, 10, 19), level(2, 10, 99)];
        let split = |name: &str, per_level| SplitSpec {
            name: name.into(),
            levels: vec![1, 2],
            per_level,
        };
        let err = generate(&levels, &[split("a", usize::MAX / 2)], 1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("more than 1000000 problems"), "{err}");
        let err = generate(&levels, &[split("a", 400_000), split("b", 200_000)], 1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("split `b`"), "{err}");
        for name in ["../x", "a/b", ".hidden", "", "a b"] {
            let err = generate(&levels, &[split(name, 1)], 1)
                .unwrap_err()
                .to_string();
            assert!(err.contains("a split name is a file name"), "{name}: {err}");
        }
        let err = generate(&levels, &[split("a", 1), split("a", 1)], 1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("named twice"), "{err}");
        assert!(generate(&levels, &[split("eval.v2-b_1", 1)], 1).is_ok());
    }

    /// The shipped data is what the shipped spec generates, byte for byte.
    #[test]
    fn the_shipped_splits_are_the_specs_output() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/arith");
        let spec = ArithSpec::load(&dir.join("spec.toml")).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        for (path, _) in spec.write(tmp.path()).unwrap() {
            let name = path.file_name().unwrap();
            let shipped = std::fs::read(dir.join(name)).unwrap();
            assert!(
                shipped == std::fs::read(&path).unwrap(),
                "data/arith/{} differs from what data/arith/spec.toml generates: run \
                 `pipeline data arith --spec data/arith/spec.toml`",
                name.to_string_lossy()
            );
        }
    }
}

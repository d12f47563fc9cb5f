//! What the models wrote: a few completions per eval set and model chosen by a seeded rule, the
//! problems whose verdict changed between the first model (the base) and each other model, and
//! every sample's length, so that a reader sees truncated or looping reasoning that summary
//! numbers hide.
//!
//! The rule, per set and model: one correct sample, one wrong one (an answer that is not the
//! gold), one cut at `max_new_tokens`, each drawn by [`SplitMix`] from the candidates in
//! (problem, sample) order; against the first model, up to [`CHANGED`] samples that became right
//! ("fixed") and up to [`CHANGED`] that became wrong ("broken"), the same sample index of the
//! same problem (the models share seeds). [`render`] writes the markdown with the first and last
//! lines of each completion and one file per example with the whole text.
//!
//! Knows the completions schema and nothing of stages or of how the samples were made.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::data::schema::{read_completions, Completion};
use crate::rng::SplitMix;

/// Changed verdicts shown per direction, set and model.
pub const CHANGED: usize = 2;
/// Lines shown from the start and the end of a completion.
const HEAD_LINES: usize = 6;
const TAIL_LINES: usize = 4;
/// A shown line longer than this is cut.
const LINE_CHARS: usize = 240;

/// One shown completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Example {
    pub set: String,
    pub model: String,
    /// `correct`, `wrong`, `truncated`, `fixed` or `broken`.
    pub kind: String,
    pub problem_id: String,
    pub sample_index: i32,
    /// The problem's text (the prompt when the problem is unknown).
    #[serde(default)]
    pub problem: String,
    pub prompt: String,
    pub completion: String,
    pub extracted: Option<String>,
    pub gold: String,
    pub correct: bool,
    pub tokens: Option<i32>,
    pub finish_reason: Option<String>,
    /// For `fixed` and `broken`: the first model's sample of the same problem and index.
    pub before: Option<Box<Example>>,
}

/// Every sample's completion length of one model on one set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lengths {
    pub set: String,
    pub model: String,
    /// Sorted completion token counts.
    pub tokens: Vec<u32>,
    /// Samples cut at `max_new_tokens`.
    pub truncated: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Examples {
    pub examples: Vec<Example>,
    pub lengths: Vec<Lengths>,
}

fn example(
    set: &str,
    model: &str,
    kind: &str,
    c: &Completion,
    problems: &HashMap<String, String>,
) -> Example {
    let g = c.grade.as_ref();
    Example {
        set: set.to_string(),
        model: model.to_string(),
        kind: kind.to_string(),
        problem_id: c.problem_id.clone(),
        sample_index: c.sample_index,
        problem: problems
            .get(&c.problem_id)
            .cloned()
            .unwrap_or_else(|| c.prompt.clone()),
        prompt: c.prompt.clone(),
        completion: c.completion.clone(),
        extracted: g.and_then(|g| g.extracted_answer.clone()),
        gold: g.map(|g| g.gold_answer.clone()).unwrap_or_default(),
        correct: g.is_some_and(|g| g.correct),
        tokens: c.num_completion_tokens,
        finish_reason: c.finish_reason.clone(),
        before: None,
    }
}

/// A seeded draw of up to `k` distinct items, in their order.
fn draw<'a, T>(items: &[&'a T], k: usize, seed: u64) -> Vec<&'a T> {
    let mut rng = SplitMix(seed);
    let mut idx: Vec<usize> = (0..items.len()).collect();
    let k = k.min(idx.len());
    for i in 0..k {
        let j = i + rng.below(idx.len() - i);
        idx.swap(i, j);
    }
    let mut picked = idx[..k].to_vec();
    picked.sort_unstable();
    picked.into_iter().map(|i| items[i]).collect()
}

/// A stable seed for one (set, model, kind); a model named `label (path)` counts by its label,
/// so that the same run elsewhere picks the same examples.
fn seed_of(seed: u64, parts: &[&str]) -> u64 {
    let parts: Vec<&str> = parts
        .iter()
        .map(|p| p.split_once(" (").map_or(*p, |(label, _)| label))
        .collect();
    seed ^ crate::store::hash_seed(&serde_json::json!(parts))
}

/// The examples and lengths of `samples`: (set, model, graded samples file) in model order per
/// set; the first model of a set is the one the others are compared with. `problems` maps
/// problem ids to their texts.
pub fn select(
    samples: &[(String, String, std::path::PathBuf)],
    problems: &HashMap<String, String>,
    seed: u64,
) -> Result<Examples> {
    let mut out = Examples::default();
    let mut first: Option<(String, String, Vec<Completion>)> = None;
    for (set, model, path) in samples {
        let mut rows =
            read_completions(path).with_context(|| format!("the samples of {model} on {set}"))?;
        rows.sort_by(|a, b| (&a.problem_id, a.sample_index).cmp(&(&b.problem_id, b.sample_index)));
        let truncated = |c: &Completion| c.finish_reason.as_deref() == Some("length");
        let correct = |c: &Completion| c.grade.as_ref().is_some_and(|g| g.correct);
        let mut tokens: Vec<u32> = rows
            .iter()
            .filter_map(|c| c.num_completion_tokens)
            .map(|n| n.max(0) as u32)
            .collect();
        tokens.sort_unstable();
        out.lengths.push(Lengths {
            set: set.clone(),
            model: model.clone(),
            tokens,
            truncated: rows.iter().filter(|c| truncated(c)).count() as u64,
        });
        type Rule = fn(&Completion) -> bool;
        let rules: [(&str, Rule); 3] = [
            ("correct", |c| {
                c.grade.as_ref().is_some_and(|g| g.correct)
                    && c.finish_reason.as_deref() != Some("length")
            }),
            ("wrong", |c| {
                c.grade
                    .as_ref()
                    .is_some_and(|g| !g.correct && g.extracted_answer.is_some())
                    && c.finish_reason.as_deref() != Some("length")
            }),
            ("truncated", |c| {
                c.finish_reason.as_deref() == Some("length")
            }),
        ];
        for (kind, rule) in rules {
            let cands: Vec<&Completion> = rows.iter().filter(|c| rule(c)).collect();
            for c in draw(&cands, 1, seed_of(seed, &[set, model, kind])) {
                out.examples.push(example(set, model, kind, c, problems));
            }
        }
        match &first {
            Some((fset, fmodel, base)) if fset == set => {
                let before: HashMap<(&str, i32), &Completion> = base
                    .iter()
                    .map(|c| ((c.problem_id.as_str(), c.sample_index), c))
                    .collect();
                for (kind, now_right) in [("fixed", true), ("broken", false)] {
                    let cands: Vec<&Completion> = rows
                        .iter()
                        .filter(|c| correct(c) == now_right)
                        .filter(|c| {
                            before
                                .get(&(c.problem_id.as_str(), c.sample_index))
                                .is_some_and(|b| correct(b) != now_right)
                        })
                        .collect();
                    for c in draw(&cands, CHANGED, seed_of(seed, &[set, model, kind])) {
                        let b = before[&(c.problem_id.as_str(), c.sample_index)];
                        let mut e = example(set, model, kind, c, problems);
                        e.before = Some(Box::new(example(set, fmodel, "before", b, problems)));
                        out.examples.push(e);
                    }
                }
            }
            _ => first = Some((set.clone(), model.clone(), rows)),
        }
    }
    Ok(out)
}

/// The first [`HEAD_LINES`] and last [`TAIL_LINES`] lines of `text` (all of a short one), each
/// cut at [`LINE_CHARS`], as a fenced block.
pub fn excerpt(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let cut = |l: &&str| -> String {
        let n = l.chars().count();
        if n > LINE_CHARS {
            let s: String = l.chars().take(LINE_CHARS).collect();
            format!("{s} … ({} more characters)", n - LINE_CHARS)
        } else {
            l.to_string()
        }
    };
    let shown: Vec<String> = if lines.len() <= HEAD_LINES + TAIL_LINES {
        lines.iter().map(cut).collect()
    } else {
        let mut v: Vec<String> = lines[..HEAD_LINES].iter().map(cut).collect();
        v.push(format!(
            "… ({} lines left out) …",
            lines.len() - HEAD_LINES - TAIL_LINES
        ));
        v.extend(lines[lines.len() - TAIL_LINES..].iter().map(cut));
        v
    };
    fenced(text, &shown.join("\n"))
}

/// `shown` in a fence longer than any run of backticks in `text` (which `shown` is cut from).
fn fenced(text: &str, shown: &str) -> String {
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest.max(2) + 1);
    format!("{fence}text\n{shown}\n{fence}")
}

fn verdict(e: &Example) -> String {
    let ans = e
        .extracted
        .as_deref()
        .map_or("none".to_string(), |a| format!("`{a}`"));
    let len = e.tokens.map_or(String::new(), |t| format!(", {t} tokens"));
    let cut = if e.finish_reason.as_deref() == Some("length") {
        ", cut at max_new_tokens"
    } else {
        ""
    };
    // a right answer reached through a false step is not an example of correct work
    let step = match crate::verify::steps::false_step(&e.completion) {
        Some(s) if e.correct => format!(", but it states a false step: `{s}`"),
        _ => String::new(),
    };
    format!(
        "answer {ans}, gold `{}`: {}{len}{cut}{step}",
        e.gold,
        if e.correct { "correct" } else { "wrong" }
    )
}

fn full_text(e: &Example, name: &dyn Fn(&str) -> String) -> String {
    let mut s = format!(
        "# {} on {}: {} (problem {}, sample {})\n\n{}\n\n## Problem\n\n{}\n\n## Prompt\n\n{}\n\n\
         ## Completion\n\n{}\n",
        name(&e.model),
        e.set,
        e.kind,
        e.problem_id,
        e.sample_index,
        verdict(e),
        excerpt_all(&e.problem),
        excerpt_all(&e.prompt),
        excerpt_all(&e.completion)
    );
    if let Some(b) = &e.before {
        let _ = write!(
            s,
            "\n## {} on the same problem and sample\n\n{}\n\n{}\n",
            name(&b.model),
            verdict(b),
            excerpt_all(&b.completion)
        );
    }
    s
}

/// The whole text in a fence.
fn excerpt_all(text: &str) -> String {
    fenced(text, text)
}

/// The markdown of `ex`, a part per set as (set, heading and length table, examples), writing
/// each example's whole text to `out/<dir>/<set>/<n>-<model>-<kind>.md` and linking it; `name`
/// shortens model names.
pub fn render(
    ex: &Examples,
    out: &Path,
    dir: &str,
    name: &dyn Fn(&str) -> String,
) -> Result<Vec<(String, String, String)>> {
    let mut parts = Vec::new();
    let mut sets: Vec<&str> = Vec::new();
    for l in &ex.lengths {
        if !sets.contains(&l.set.as_str()) {
            sets.push(&l.set);
        }
    }
    for set in sets {
        let mut md = String::new();
        let _ = writeln!(md, "### {set}: what the models wrote\n");
        md.push_str(
            "| model | samples | cut at max_new_tokens | p10 | median | p90 | max tokens |\n\
             | --- | --- | --- | --- | --- | --- | --- |\n",
        );
        for l in ex.lengths.iter().filter(|l| l.set == set) {
            let q = |f: f64| {
                if l.tokens.is_empty() {
                    "-".to_string()
                } else {
                    l.tokens[((l.tokens.len() - 1) as f64 * f).round() as usize].to_string()
                }
            };
            let n = l.tokens.len().max(1);
            let _ = writeln!(
                md,
                "| {} | {} | {} ({:.1}%) | {} | {} | {} | {} |",
                name(&l.model),
                l.tokens.len(),
                l.truncated,
                100.0 * l.truncated as f64 / n as f64,
                q(0.1),
                q(0.5),
                q(0.9),
                q(1.0)
            );
        }
        md.push('\n');
        let table = std::mem::take(&mut md);
        for (i, e) in ex.examples.iter().filter(|e| e.set == set).enumerate() {
            let file = format!(
                "{dir}/{}/{i:02}-{}-{}.md",
                slug(set),
                slug(&name(&e.model)),
                e.kind
            );
            let path = out.join(&file);
            if let Some(p) = path.parent() {
                std::fs::create_dir_all(p)
                    .with_context(|| format!("cannot create {}", p.display()))?;
            }
            let text = full_text(e, name);
            crate::store::commit_file(&path, |tmp| Ok(std::fs::write(tmp, &text)?))?;
            let what = match e.kind.as_str() {
                "fixed" => "became right",
                "broken" => "became wrong",
                "truncated" => "cut at max_new_tokens",
                k => k,
            };
            let _ = writeln!(
                md,
                "**{}, {what}**: problem `{}`, sample {}; {} ([whole text]({file}))\n\n{}\n\n{}\n",
                name(&e.model),
                e.problem_id,
                e.sample_index,
                verdict(e),
                quote(&e.problem),
                excerpt(&e.completion)
            );
            if let Some(b) = &e.before {
                let _ = writeln!(
                    md,
                    "{} on the same sample: {}\n\n{}\n",
                    name(&b.model),
                    verdict(b),
                    excerpt(&b.completion)
                );
            }
        }
        parts.push((set.to_string(), table, md));
    }
    Ok(parts)
}

/// The problem as a quote, its first 400 characters on one line.
fn quote(problem: &str) -> String {
    let one_line = problem.split_whitespace().collect::<Vec<_>>().join(" ");
    let n = one_line.chars().count();
    if n > 400 {
        let s: String = one_line.chars().take(400).collect();
        format!("> {s} … ({} more characters)", n - 400)
    } else {
        format!("> {one_line}")
    }
}

/// A file-name-safe form of a name.
fn slug(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::schema::{completions_batch, completions_schema, write_parquet_atomic, Grade};

    fn row(pid: &str, i: i32, answer: &str, fin: &str, tokens: i32) -> Completion {
        Completion {
            problem_id: pid.into(),
            sample_index: i,
            prompt: format!("What is {pid}?"),
            prompt_token_ids: None,
            completion: format!("step 1\nstep 2\nso \\boxed{{{answer}}}"),
            completion_token_ids: None,
            finish_reason: Some(fin.into()),
            num_completion_tokens: Some(tokens),
            cumulative_logprob: None,
            seed: None,
            model: None,
            sampling_hash: None,
            grade: Some(Grade {
                gold_answer: "4".into(),
                extracted_answer: (fin != "length").then(|| answer.to_string()),
                correct: answer == "4" && fin != "length",
                reason: "x".into(),
            }),
            logprobs: None,
            rationalized: false,
        }
    }

    fn write(dir: &Path, name: &str, rows: &[Completion]) -> std::path::PathBuf {
        let p = dir.join(name);
        let b = completions_batch(rows, true, false).unwrap();
        write_parquet_atomic(&p, completions_schema(true, false), &[b]).unwrap();
        p
    }

    /// A shown correct sample says when it reached its answer through a false step.
    #[test]
    fn a_correct_example_with_a_false_step_says_so() {
        let mut c = row("p", 0, "4", "stop", 9);
        let problems = HashMap::new();
        assert!(!verdict(&example("s", "m", "correct", &c, &problems)).contains("false step"));
        c.completion = "2 + 3 = 6, so \\boxed{4}".into();
        let v = verdict(&example("s", "m", "correct", &c, &problems));
        assert!(
            v.ends_with("but it states a false step: `2 + 3 = 6`"),
            "{v}"
        );
    }

    #[test]
    fn the_rule_picks_one_of_each_kind_and_the_changed_verdicts() {
        let dir = tempfile::tempdir().unwrap();
        let base = write(
            dir.path(),
            "b.parquet",
            &[
                row("a", 0, "4", "stop", 10),
                row("a", 1, "5", "stop", 12),
                row("b", 0, "4", "length", 64),
                row("b", 1, "3", "stop", 20),
            ],
        );
        let trained = write(
            dir.path(),
            "t.parquet",
            &[
                row("a", 0, "5", "stop", 9),
                row("a", 1, "4", "stop", 11),
                row("b", 0, "4", "stop", 30),
                row("b", 1, "4", "stop", 21),
            ],
        );
        let s = |m: &str, p: &std::path::PathBuf| ("set".to_string(), m.to_string(), p.clone());
        let problems = HashMap::from([("a".to_string(), "What is 2+2, twice?".to_string())]);
        let ex = select(&[s("base", &base), s("trained", &trained)], &problems, 7).unwrap();
        let kinds = |m: &str| -> Vec<(String, String, i32)> {
            ex.examples
                .iter()
                .filter(|e| e.model == m)
                .map(|e| (e.kind.clone(), e.problem_id.clone(), e.sample_index))
                .collect()
        };
        let b = kinds("base");
        assert_eq!(b.len(), 3, "{b:?}");
        assert_eq!(b[2], ("truncated".into(), "b".into(), 0));
        assert_eq!(b[0].0, "correct");
        assert_eq!(b[1].0, "wrong");
        let t = kinds("trained");
        // trained: no truncated sample; fixed a/1, b/0 and b/1 (two shown), broke a/0
        assert_eq!(t.iter().filter(|k| k.0 == "fixed").count(), CHANGED);
        assert_eq!(
            t.iter().filter(|k| k.0 == "broken").collect::<Vec<_>>(),
            [&("broken".to_string(), "a".to_string(), 0)]
        );
        assert!(t.iter().all(|k| k.0 != "truncated"));
        let broken = ex.examples.iter().find(|e| e.kind == "broken").unwrap();
        assert_eq!(
            broken.before.as_ref().unwrap().extracted.as_deref(),
            Some("4")
        );
        assert_eq!(ex.lengths[0].tokens, [10, 12, 20, 64]);
        assert_eq!(ex.lengths[0].truncated, 1);
        // seeded: the same seed, the same picks
        assert_eq!(
            select(&[s("base", &base), s("trained", &trained)], &problems, 7).unwrap(),
            ex
        );

        let parts = render(&ex, dir.path(), "examples", &|m: &str| m.to_uppercase()).unwrap();
        assert_eq!(parts.len(), 1);
        let md = format!("{}{}", parts[0].1, parts[0].2);
        assert!(md.contains("### set: what the models wrote"), "{md}");
        assert!(
            md.contains("| BASE | 4 | 1 (25.0%) | 10 | 20 | 64 | 64 |"),
            "{md}"
        );
        assert!(
            md.contains(
                "**TRAINED, became wrong**: problem `a`, sample 0; answer `5`, gold `4`: wrong"
            ),
            "{md}"
        );
        assert!(
            md.contains("BASE on the same sample: answer `4`, gold `4`: correct"),
            "{md}"
        );
        let link = md
            .split("([whole text](")
            .nth(1)
            .unwrap()
            .split(')')
            .next()
            .unwrap();
        let full = std::fs::read_to_string(dir.path().join(link)).unwrap();
        assert!(
            full.contains("## Prompt") && full.contains("step 2"),
            "{full}"
        );
    }

    #[test]
    fn excerpts_keep_the_start_and_the_end() {
        let long: String = (1..=30).map(|i| format!("line {i}\n")).collect();
        let e = excerpt(&long);
        assert!(
            e.contains("line 6\n… (20 lines left out) …\nline 27"),
            "{e}"
        );
        assert!(!e.contains("line 7\n"));
        let e = excerpt(&format!("```\n{}", "x".repeat(300)));
        assert!(e.starts_with("````text\n"), "{e}");
        assert!(e.contains("… (60 more characters)"), "{e}");
    }
}

//! STaR's rationalization: a second sampling pass over the problems that no sample solved, with
//! the gold answer given as a hint, whose correct samples are kept under the original prompt.
//!
//! 1) The unsolved problems: those whose graded samples in the first pass's completions are all
//!    wrong (a problem without a gold answer is never graded, so never rationalized). 2) Their
//!    text becomes `[rationalize] hint` with `{problem}` and `{answer}` filled in, and the job
//!    samples them as the first pass did (`n` may differ) into `hinted.parquet`, resumable like
//!    any job. 3) Every hinted row is written again to `rationalized.parquet` with the prompt
//!    (text and token ids) the problem has without the hint and `rationalized = true`: what the
//!    model learns is to write the rationale without being told the answer.
//!
//! Knows nothing of stages: the sample stage calls [`run`] for its problems (or a shard's).

use std::path::Path;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use super::job::JobSummary;
use super::run::{prompts_of, JobSpec, Loaded};
use super::settings::SampleSettings;
use crate::data::schema::{pass_rates, read_completions, write_completions, Problem};

/// The hinted samples as drawn (the hint in their prompts).
pub const HINTED: &str = "hinted.parquet";
/// The hinted samples under their original prompts, marked `rationalized`.
pub const RATIONALIZED: &str = "rationalized.parquet";
/// The placeholders of the hint.
pub const PROBLEM: &str = "{problem}";
pub const ANSWER: &str = "{answer}";

/// `[rationalize]`: the hint and how many samples each unsolved problem gets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rationalize {
    /// The problem text the hinted pass samples: `{problem}` (the problem) and `{answer}` (its
    /// gold answer) are filled in.
    pub hint: String,
    /// Samples per unsolved problem; default: `[sample] n`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
}

impl Rationalize {
    /// The placeholders are there and `n` is at least 1; the message names the key.
    pub fn validate(&self) -> std::result::Result<(), String> {
        for (p, what) in [(ANSWER, "the gold answer"), (PROBLEM, "the problem")] {
            if !self.hint.contains(p) {
                return Err(format!(
                    "hint: has no {p} placeholder: write {p} where {what} goes (e.g. \"{PROBLEM}\\n\\n\
                     The answer is {ANSWER}. Explain how to get it.\")"
                ));
            }
        }
        if self.n == Some(0) {
            return Err("n: must be at least 1".into());
        }
        Ok(())
    }

    /// The hinted text of a problem, filled in one pass: a `{answer}` inside the problem text
    /// stays as written.
    pub fn hinted(&self, problem: &str, answer: &str) -> String {
        let mut out = String::with_capacity(self.hint.len() + problem.len() + answer.len());
        let mut rest = self.hint.as_str();
        loop {
            let next = [(PROBLEM, problem), (ANSWER, answer)]
                .into_iter()
                .filter_map(|(p, v)| rest.find(p).map(|i| (i, p, v)))
                .min_by_key(|(i, _, _)| *i);
            match next {
                Some((i, p, v)) => {
                    out.push_str(&rest[..i]);
                    out.push_str(v);
                    rest = &rest[i + p.len()..];
                }
                None => {
                    out.push_str(rest);
                    return out;
                }
            }
        }
    }
}

/// The problems of `problems` with graded samples in `completions`, none of them correct.
pub fn unsolved(problems: &[Problem], completions: &Path) -> Result<Vec<Problem>> {
    let rates = pass_rates(&read_completions(completions)?);
    Ok(problems
        .iter()
        .filter(|p| {
            !p.gold_answer.is_empty()
                && rates
                    .get(p.problem_id.as_str())
                    .is_some_and(|(n, c)| *n > 0 && *c == 0)
        })
        .cloned()
        .collect())
}

/// What the pass did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// Problems without a correct sample, sampled with the hint.
    pub problems: u64,
    pub samples: u64,
    pub correct: u64,
    pub generated_tokens: u64,
}

impl Summary {
    /// The stage's counts.
    pub fn counts(&self) -> Vec<(String, u64)> {
        vec![
            ("rationalize.problems".into(), self.problems),
            ("rationalize.samples".into(), self.samples),
            ("rationalize.correct".into(), self.correct),
            ("rationalize.generated_tokens".into(), self.generated_tokens),
        ]
    }
}

/// Samples the problems of `problems` that `completions` (the first pass, in `dir`) left
/// unsolved with the hint into `dir`'s [`HINTED`], then writes [`RATIONALIZED`]; on the first
/// pass's model, `loaded`.
#[allow(clippy::too_many_arguments)]
pub fn run(
    loaded: &Loaded,
    s: &SampleSettings,
    r: &Rationalize,
    problems: &[Problem],
    completions: &Path,
    dir: &Path,
    shard: (usize, usize),
    progress: &crate::progress::Target,
) -> Result<Summary> {
    let unsolved = unsolved(problems, completions)?;
    let hinted: Vec<Problem> = unsolved
        .iter()
        .map(|p| Problem {
            problem: r.hinted(&p.problem, &p.gold_answer),
            ..p.clone()
        })
        .collect();
    let mut settings = s.clone();
    if let Some(n) = r.n {
        settings.params.n = n;
    }
    tracing::info!(
        "    rationalize: {} problems without a correct sample, sampled with the answer as a hint",
        unsolved.len()
    );
    if unsolved.is_empty() {
        // nothing to sample: empty files, so that the stage's outputs are the same either way
        for f in [HINTED, RATIONALIZED] {
            write_completions(&dir.join(f), &[], true)?;
        }
        return Ok(Summary::default());
    }
    let out = dir.join(HINTED);
    let spec = JobSpec {
        settings: &settings,
        problems: &hinted,
        shard,
        problem_set: None,
        output: &out,
        progress,
    };
    let summary: JobSummary = loaded.run(&[spec], progress)?.remove(0);
    // the same rows under the prompts without the hint
    let (ck, tok) = (loaded.checkpoint(), loaded.tokenizer());
    let (_, prompts) = prompts_of(s, ck, tok, &unsolved)?;
    let original: std::collections::HashMap<&str, &(String, Vec<u32>)> = unsolved
        .iter()
        .map(|p| p.problem_id.as_str())
        .zip(&prompts)
        .collect();
    let mut rows = read_completions(&dir.join(HINTED))?;
    for row in &mut rows {
        let Some((text, ids)) = original.get(row.problem_id.as_str()) else {
            bail!(
                "{}: row of problem {}, which is not among the unsolved problems: delete the \
                 file and run again",
                dir.join(HINTED).display(),
                row.problem_id
            );
        };
        row.prompt = text.clone();
        row.prompt_token_ids = Some(ids.iter().map(|&t| t as i32).collect());
        row.rationalized = true;
    }
    write_completions(&dir.join(RATIONALIZED), &rows, true)?;
    let correct = rows
        .iter()
        .filter(|r| r.grade.as_ref().is_some_and(|g| g.correct))
        .count() as u64;
    tracing::info!(
        "    rationalize: {} hinted samples, {correct} correct -> {}",
        rows.len(),
        dir.join(RATIONALIZED).display()
    );
    Ok(Summary {
        problems: unsolved.len() as u64,
        samples: rows.len() as u64,
        correct,
        generated_tokens: summary.output.generated_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(hint: &str) -> Rationalize {
        Rationalize {
            hint: hint.into(),
            n: None,
        }
    }

    #[test]
    fn the_hint_is_filled_in_one_pass() {
        let h = r("{problem}\nThe answer is {answer}; write \\boxed{{answer}}.");
        assert_eq!(
            h.hinted("What is {answer} + 1?", "7"),
            "What is {answer} + 1?\nThe answer is 7; write \\boxed{7}."
        );
        assert_eq!(
            r("A: {answer}. Q: {problem}").hinted("q", "a"),
            "A: a. Q: q"
        );
    }

    #[test]
    fn a_hint_needs_both_placeholders() {
        let e = r("{problem} Think.").validate().unwrap_err();
        assert!(e.starts_with("hint: has no {answer} placeholder"), "{e}");
        let e = r("The answer is {answer}.").validate().unwrap_err();
        assert!(e.starts_with("hint: has no {problem} placeholder"), "{e}");
        let e = Rationalize {
            n: Some(0),
            ..r("{problem} {answer}")
        }
        .validate()
        .unwrap_err();
        assert!(e.starts_with("n: must be at least 1"), "{e}");
        r("{problem} {answer}").validate().unwrap();
    }
}

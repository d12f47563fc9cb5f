//! Metrics of one eval set for one model, from its graded samples: pass@1 (the mean over the n
//! samples of each problem, then over problems), maj@n (a majority vote over extracted answers),
//! pass@k for every k <= n (the unbiased estimator of Chen et al. 2021), the share of samples
//! with no answer and the share truncated, the mean completion length, 95% confidence intervals
//! by a seeded bootstrap over problems, and pass@1 by difficulty level where the set has levels.
//!
//! Pure: knows nothing of files, models or the sampler.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::rng::SplitMix;

/// One graded sample, as the metrics need it.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub problem_id: String,
    pub sample_index: i32,
    /// The extracted answer, normalised so that equal answers compare equal; `None`: no answer.
    pub answer: Option<String>,
    pub correct: bool,
    /// Finished by `length` or `thinking_budget` rather than a stop.
    pub truncated: bool,
    pub completion_tokens: u64,
    pub level: Option<String>,
}

/// A value and its 95% bootstrap interval over problems.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    pub value: f64,
    pub lo: f64,
    pub hi: f64,
}

/// The metrics of one set for one model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SetMetrics {
    pub problems: usize,
    /// Samples per problem (the smallest count, when problems differ: pass@k needs k <= n).
    pub n: usize,
    pub samples: usize,
    pub pass_at_1: Estimate,
    pub maj_at_n: Estimate,
    /// pass@k for k = 1..=n.
    pub pass_at_k: Vec<(usize, f64)>,
    pub no_answer: f64,
    pub truncated: f64,
    pub mean_completion_tokens: f64,
    /// pass@1 by level: (level, problems, pass@1).
    pub by_level: Vec<(String, usize, f64)>,
}

/// Bootstrap resamples behind each interval.
pub const BOOTSTRAP_RESAMPLES: usize = 2000;

/// The unbiased pass@k of a problem with `c` correct out of `n` samples:
/// `1 - C(n - c, k) / C(n, k)`, as a running product (exact for any n, no overflow).
pub fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    assert!(k >= 1 && k <= n && c <= n, "pass@{k} with {c} of {n}");
    if n - c < k {
        return 1.0;
    }
    // C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    1.0 - (n - c + 1..=n)
        .map(|i| 1.0 - k as f64 / i as f64)
        .product::<f64>()
}

/// The majority answer of one problem's samples (in sample order) and whether it is correct:
/// most votes wins; a tie goes to the answer seen first (lowest sample index). Samples without
/// an answer do not vote; with no answer at all the vote is wrong.
pub fn majority(samples: &[&Outcome]) -> (Option<String>, bool) {
    // answer -> (votes, first index, correct of its first sample)
    let mut votes: BTreeMap<&str, (usize, i32, bool)> = BTreeMap::new();
    for s in samples {
        if let Some(a) = &s.answer {
            let e = votes.entry(a).or_insert((0, s.sample_index, s.correct));
            e.0 += 1;
            if s.sample_index < e.1 {
                (e.1, e.2) = (s.sample_index, s.correct);
            }
        }
    }
    votes
        .into_iter()
        .max_by(|a, b| a.1 .0.cmp(&b.1 .0).then(b.1 .1.cmp(&a.1 .1)))
        .map_or((None, false), |(a, (_, _, ok))| (Some(a.to_string()), ok))
}

/// Mean and 95% percentile interval of `values` under `resamples` bootstrap draws (seeded).
pub fn bootstrap(values: &[f64], resamples: usize, seed: u64) -> Estimate {
    let n = values.len();
    if n == 0 {
        return Estimate {
            value: 0.0,
            lo: 0.0,
            hi: 0.0,
        };
    }
    let value = values.iter().sum::<f64>() / n as f64;
    let mut rng = SplitMix(seed);
    let mut means: Vec<f64> = (0..resamples)
        .map(|_| (0..n).map(|_| values[rng.below(n)]).sum::<f64>() / n as f64)
        .collect();
    means.sort_by(f64::total_cmp);
    let at = |q: f64| means[((q * (resamples - 1) as f64).round() as usize).min(resamples - 1)];
    Estimate {
        value,
        lo: at(0.025),
        hi: at(0.975),
    }
}

/// The metrics of `outcomes` (every sample of every problem of the set). `seed` seeds the
/// bootstrap, so the same samples give the same intervals.
pub fn compute(outcomes: &[Outcome], seed: u64) -> SetMetrics {
    let mut by_problem: BTreeMap<&str, Vec<&Outcome>> = BTreeMap::new();
    for o in outcomes {
        by_problem.entry(&o.problem_id).or_default().push(o);
    }
    for v in by_problem.values_mut() {
        v.sort_by_key(|o| o.sample_index);
    }
    let n = by_problem.values().map(Vec::len).min().unwrap_or(0);
    let mut pass1 = Vec::with_capacity(by_problem.len());
    let mut maj = Vec::with_capacity(by_problem.len());
    let mut pass_k = vec![0f64; n];
    let mut levels: BTreeMap<String, (usize, f64)> = BTreeMap::new();
    for samples in by_problem.values() {
        let c = samples.iter().filter(|s| s.correct).count();
        let p1 = c as f64 / samples.len() as f64;
        pass1.push(p1);
        maj.push(if majority(samples).1 { 1.0 } else { 0.0 });
        // pass@k over the first n samples, so that every problem has the same n
        let c_n = samples[..n].iter().filter(|s| s.correct).count();
        for (k, acc) in pass_k.iter_mut().enumerate() {
            *acc += pass_at_k(n, c_n, k + 1);
        }
        if let Some(level) = &samples[0].level {
            let e = levels.entry(level.clone()).or_default();
            e.0 += 1;
            e.1 += p1;
        }
    }
    let problems = by_problem.len();
    let share = |f: &dyn Fn(&Outcome) -> bool| {
        outcomes.iter().filter(|o| f(o)).count() as f64 / outcomes.len().max(1) as f64
    };
    SetMetrics {
        problems,
        n,
        samples: outcomes.len(),
        pass_at_1: bootstrap(&pass1, BOOTSTRAP_RESAMPLES, seed),
        maj_at_n: bootstrap(&maj, BOOTSTRAP_RESAMPLES, seed ^ 0x9e37_79b9),
        pass_at_k: pass_k
            .iter()
            .enumerate()
            .map(|(k, acc)| (k + 1, acc / problems.max(1) as f64))
            .collect(),
        no_answer: share(&|o| o.answer.is_none()),
        truncated: share(&|o| o.truncated),
        mean_completion_tokens: outcomes
            .iter()
            .map(|o| o.completion_tokens as f64)
            .sum::<f64>()
            / outcomes.len().max(1) as f64,
        by_level: levels
            .into_iter()
            .map(|(l, (count, sum))| (l, count, sum / count as f64))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(p: &str, i: i32, answer: Option<&str>, correct: bool) -> Outcome {
        Outcome {
            problem_id: p.into(),
            sample_index: i,
            answer: answer.map(Into::into),
            correct,
            truncated: answer.is_none(),
            completion_tokens: 10 * (i as u64 + 1),
            level: Some(if p < "m" { "1" } else { "2" }.into()),
        }
    }

    /// pass@k by brute force: the share of k-subsets of the n samples holding a correct one.
    fn brute_pass_at_k(n: usize, c: usize, k: usize) -> f64 {
        let (mut hit, mut all) = (0u64, 0u64);
        for mask in 0u32..(1 << n) {
            if mask.count_ones() as usize == k {
                all += 1;
                hit += u64::from(mask & ((1 << c) - 1) != 0);
            }
        }
        hit as f64 / all as f64
    }

    #[test]
    fn pass_at_k_is_the_share_of_k_subsets_with_a_correct_sample() {
        for n in 1..=10 {
            for c in 0..=n {
                for k in 1..=n {
                    let (got, want) = (pass_at_k(n, c, k), brute_pass_at_k(n, c, k));
                    assert!(
                        (got - want).abs() < 1e-12,
                        "n {n} c {c} k {k}: {got} vs {want}"
                    );
                }
            }
        }
        assert_eq!(pass_at_k(4, 1, 1), 0.25);
        assert!(
            (pass_at_k(200, 3, 100) - (1.0 - 100.0 * 99.0 * 98.0 / (200.0 * 199.0 * 198.0))).abs()
                < 1e-12
        );
    }

    #[test]
    fn majority_counts_votes_and_breaks_ties_by_the_first_sample() {
        let s = [
            outcome("a", 0, Some("3"), false),
            outcome("a", 1, Some("4"), true),
            outcome("a", 2, Some("4"), true),
            outcome("a", 3, None, false),
        ];
        let refs: Vec<&Outcome> = s.iter().collect();
        assert_eq!(majority(&refs), (Some("4".into()), true));
        // 1 - 1 tie: the answer of sample 0 wins, whatever the order of the strings
        let tie = [
            outcome("a", 0, Some("9"), false),
            outcome("a", 1, Some("1"), true),
        ];
        let refs: Vec<&Outcome> = tie.iter().collect();
        assert_eq!(majority(&refs), (Some("9".into()), false));
        let none = [outcome("a", 0, None, false)];
        assert_eq!(majority(&[&none[0]]), (None, false));
    }

    #[test]
    fn set_metrics_by_hand() {
        // problem a: 2 of 4 correct, majority right; b: 0 of 4; c: 4 of 4
        let mut rows = vec![
            outcome("a", 0, Some("4"), true),
            outcome("a", 1, Some("5"), false),
            outcome("a", 2, Some("4"), true),
            outcome("a", 3, None, false),
        ];
        rows.extend((0..4).map(|i| outcome("b", i, Some("1"), false)));
        rows.extend((0..4).map(|i| outcome("z", i, Some("7"), true)));
        let m = compute(&rows, 7);
        assert_eq!((m.problems, m.n, m.samples), (3, 4, 12));
        assert!((m.pass_at_1.value - 0.5).abs() < 1e-12);
        assert!((m.maj_at_n.value - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(m.pass_at_k[0].0, 1);
        assert!((m.pass_at_k[0].1 - 0.5).abs() < 1e-12);
        // pass@4: a and z certainly, b never
        assert!((m.pass_at_k[3].1 - 2.0 / 3.0).abs() < 1e-12);
        // pass@2 of a: 1 - C(2,2)/C(4,2) = 5/6
        assert!((m.pass_at_k[1].1 - (5.0 / 6.0 + 1.0) / 3.0).abs() < 1e-12);
        assert!((m.no_answer - 1.0 / 12.0).abs() < 1e-12);
        assert!((m.truncated - 1.0 / 12.0).abs() < 1e-12);
        assert!((m.mean_completion_tokens - 25.0).abs() < 1e-12);
        assert_eq!(
            m.by_level,
            vec![("1".to_string(), 2, 0.25), ("2".to_string(), 1, 1.0)]
        );
        // the interval holds the value, stays in [0, 1], and is the same for the same seed
        assert!(m.pass_at_1.lo <= 0.5 && 0.5 <= m.pass_at_1.hi);
        assert!(m.pass_at_1.lo >= 0.0 && m.pass_at_1.hi <= 1.0 && m.pass_at_1.lo < m.pass_at_1.hi);
        assert_eq!(compute(&rows, 7), m);
    }

    #[test]
    fn bootstrap_interval_narrows_with_more_problems_and_matches_the_normal_width() {
        let values: Vec<f64> = (0..400).map(|i| f64::from(i % 2 == 0)).collect();
        let e = bootstrap(&values, BOOTSTRAP_RESAMPLES, 1);
        // a proportion of 0.5 over 400 problems: 1.96 * sqrt(0.25 / 400) = 0.049
        assert!((e.value - 0.5).abs() < 1e-12);
        assert!(((e.hi - e.lo) / 2.0 - 0.049).abs() < 0.008, "{e:?}");
        let small = bootstrap(&values[..40], BOOTSTRAP_RESAMPLES, 1);
        assert!(small.hi - small.lo > 2.5 * (e.hi - e.lo));
        let constant = bootstrap(&[1.0; 10], 100, 3);
        assert_eq!((constant.lo, constant.value, constant.hi), (1.0, 1.0, 1.0));
    }
}

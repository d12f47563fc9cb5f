//! The trainer's data: SFT rows from Parquet as token ids, the plan of optimizer steps over the
//! epochs (seeded shuffle, `rows_per_step` or `tokens_per_step`, `max_steps`), and the packing of
//! a step's rows into micro-batches of at most `micro_batch_tokens`.
//!
//! The plan is a pure function of the rows and the settings, so a resumed run finds its place by
//! step number alone. Knows nothing of models or the optimizer.

use std::path::Path;

use anyhow::{bail, Context, Result};

use super::settings::{StepSize, TrainSettings};
use crate::model::TextTokenizer;

/// One training row as token ids.
#[derive(Debug, Clone, PartialEq)]
pub struct SftRow {
    pub prompt: Vec<u32>,
    pub completion: Vec<u32>,
}

impl SftRow {
    pub fn len(&self) -> usize {
        self.prompt.len() + self.completion.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What loading did to the rows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadReport {
    pub rows: usize,
    /// Rows without token ids, tokenized from their text (prompt as is, completion + EOS).
    pub tokenized: usize,
    /// Rows cut to `max_seq_len` (completion tokens dropped from the end).
    pub truncated: usize,
    /// Rows left without a completion token to learn from (prompt at least `max_seq_len`).
    pub dropped: usize,
    pub tokens: usize,
    pub completion_tokens: usize,
}

/// Reads the SFT Parquet (`prompt_token_ids`, `completion_token_ids`; rows without them are
/// tokenized from `prompt` and `completion` with `tok`, EOS appended) and cuts rows to
/// `max_seq_len`.
pub fn read_sft(
    path: &Path,
    tok: &TextTokenizer,
    eos: Option<u32>,
    max_seq_len: usize,
) -> Result<(Vec<SftRow>, LoadReport)> {
    let rows = crate::data::schema::read_completions(path)
        .with_context(|| format!("cannot read the SFT rows of {}", path.display()))?;
    let mut rep = LoadReport::default();
    let mut out = Vec::with_capacity(rows.len());
    let ids = |v: &[i32], what: &str, i: usize| -> Result<Vec<u32>> {
        v.iter()
            .map(|&t| {
                u32::try_from(t).map_err(|_| {
                    anyhow::anyhow!(
                        "{} row {}: `{what}` has token id {t}",
                        path.display(),
                        i + 1
                    )
                })
            })
            .collect()
    };
    for (i, r) in rows.iter().enumerate() {
        let (prompt, mut completion) = match (&r.prompt_token_ids, &r.completion_token_ids) {
            (Some(p), Some(c)) => (
                ids(p, "prompt_token_ids", i)?,
                ids(c, "completion_token_ids", i)?,
            ),
            _ => {
                rep.tokenized += 1;
                let mut c = tok.encode(&r.completion)?;
                c.extend(eos);
                (tok.encode(&r.prompt)?, c)
            }
        };
        if completion.is_empty() {
            bail!(
                "{} row {} ({}): empty completion",
                path.display(),
                i + 1,
                r.problem_id
            );
        }
        if prompt.len() + completion.len() > max_seq_len {
            if prompt.len() + 1 >= max_seq_len {
                rep.dropped += 1;
                continue;
            }
            rep.truncated += 1;
            completion.truncate(max_seq_len - prompt.len());
        }
        let row = SftRow { prompt, completion };
        rep.tokens += row.len();
        rep.completion_tokens += row.completion.len();
        out.push(row);
    }
    rep.rows = out.len();
    if out.is_empty() {
        bail!(
            "{}: no row to train on ({} rows read, {} longer than max_seq_len)",
            path.display(),
            rows.len(),
            rep.dropped
        );
    }
    Ok((out, rep))
}

pub use crate::rng::SplitMix;

/// The rows of every optimizer step, in order, over all epochs (capped at `max_steps`). A step
/// never spans two epochs.
pub fn plan_steps(rows: &[SftRow], s: &TrainSettings) -> Vec<Vec<usize>> {
    let mut steps = Vec::new();
    for epoch in 0..s.epochs {
        let mut order: Vec<usize> = (0..rows.len()).collect();
        if s.shuffle {
            let mut rng = SplitMix(s.seed ^ epoch.wrapping_mul(0xA24B_AED4_963E_E407));
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i + 1));
            }
        }
        let mut cur: Vec<usize> = Vec::new();
        let mut cur_tokens = 0;
        for idx in order {
            let full = match s.step_size() {
                StepSize::Rows(r) => cur.len() == r,
                StepSize::Tokens(t) => !cur.is_empty() && cur_tokens + rows[idx].len() > t,
            };
            if full {
                steps.push(std::mem::take(&mut cur));
                cur_tokens = 0;
            }
            cur_tokens += rows[idx].len();
            cur.push(idx);
        }
        if !cur.is_empty() {
            steps.push(cur);
        }
    }
    if let Some(m) = s.max_steps {
        steps.truncate(m as usize);
    }
    steps
}

/// A step's rows as micro-batches: with packing, rows are added in order while the batch stays
/// within `micro_batch_tokens`; without, one row per micro-batch.
pub fn micro_batches(step: &[usize], rows: &[SftRow], s: &TrainSettings) -> Vec<Vec<usize>> {
    if !s.packing {
        return step.iter().map(|&i| vec![i]).collect();
    }
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut tokens = 0;
    for &i in step {
        let n = rows[i].len();
        match out.last_mut() {
            Some(b) if tokens + n <= s.micro_batch_tokens => {
                b.push(i);
                tokens += n;
            }
            _ => {
                out.push(vec![i]);
                tokens = n;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(lens: &[usize]) -> Vec<SftRow> {
        lens.iter()
            .map(|&n| SftRow {
                prompt: vec![1],
                completion: vec![2; n - 1],
            })
            .collect()
    }

    #[test]
    fn steps_cover_every_row_once_per_epoch_and_respect_the_step_size() {
        let r = rows(&[3, 5, 2, 8, 4, 6, 7]);
        let mut s = TrainSettings {
            rows_per_step: Some(3),
            epochs: 2,
            seed: 7,
            ..TrainSettings::default()
        };
        let plan = plan_steps(&r, &s);
        assert_eq!(plan.len(), 6); // 3 + 3 + 1 per epoch
        for epoch in [&plan[..3], &plan[3..]] {
            let mut all: Vec<usize> = epoch.concat();
            all.sort();
            assert_eq!(all, (0..7).collect::<Vec<_>>());
        }
        assert_ne!(plan[..3].concat(), plan[3..].concat(), "epochs reshuffle");
        assert_eq!(
            plan,
            plan_steps(&r, &s),
            "the plan is a function of the seed"
        );
        s.shuffle = false;
        assert_eq!(plan_steps(&r, &s)[0], vec![0, 1, 2]);
        s.max_steps = Some(4);
        assert_eq!(plan_steps(&r, &s).len(), 4);

        let s = TrainSettings {
            tokens_per_step: Some(10),
            shuffle: false,
            ..TrainSettings::default()
        };
        let plan = plan_steps(&r, &s);
        assert_eq!(plan, vec![vec![0, 1, 2], vec![3], vec![4, 5], vec![6]]);
    }

    #[test]
    fn micro_batches_pack_in_order_within_the_token_budget() {
        let r = rows(&[3, 5, 2, 8]);
        let mut s = TrainSettings {
            micro_batch_tokens: 10,
            max_seq_len: 8,
            ..TrainSettings::default()
        };
        assert_eq!(
            micro_batches(&[0, 1, 2, 3], &r, &s),
            vec![vec![0, 1, 2], vec![3]]
        );
        s.packing = false;
        assert_eq!(micro_batches(&[0, 1], &r, &s), vec![vec![0], vec![1]]);
    }
}

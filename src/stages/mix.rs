//! A round's training rows under `[mix]`: the round's own kept rows, the kept rows of every
//! earlier round (`accumulate`), and rows drawn from sources of worked solutions at a share of
//! those (`[[mix.sources]]`: for instance the pretraining data, against forgetting), written as
//! `mix.parquet` in the train stage's folder for the trainer.
//!
//! A source's rows are drawn without replacement by a seeded shuffle (seed: `mix.seed` and the
//! stage's name, so each round draws its own), cycling through fresh shuffles when a share asks
//! for more rows than the source has; `round(share x (own + earlier rows))` rows per source. Their
//! prompts are rendered as the sampler renders its prompts (the `[sample]` template with the
//! trained model's chat template; raw without a `[sample]` section) and their solutions are the
//! completions. The file is a pure function of the inputs, so an interrupted stage rebuilds it
//! the same. Knows nothing of training.

use std::path::PathBuf;

use anyhow::{Context, Result};

use super::{Counts, Estimate, Plan, PlannedStage};
use crate::config::MixConfig;
use crate::data::schema::{read_completions, write_completions, Completion};
use crate::jobs::sample::run::prompts_of;
use crate::jobs::sample::settings::SampleSettings;
use crate::store::InputRef;

pub const MIX: &str = "mix.parquet";
/// The dependency role of an earlier round's filter stage.
pub const EARLIER: &str = "earlier";

/// The stage inputs of the mix: earlier rounds' SFT rows and the sources' files.
pub fn inputs(
    mix: &MixConfig,
    earlier: &[&PlannedStage],
    resolve: &super::Resolve,
) -> Result<Vec<InputRef>> {
    let mut out = Vec::new();
    for e in earlier {
        out.push(InputRef {
            name: format!("{EARLIER}:{}", e.name),
            location: e.dir.display().to_string(),
            hash: e.key.clone(),
        });
    }
    for m in &mix.sources {
        let what = format!("mix source `{}`", m.source.name);
        for (input, _, _) in
            resolve.location(&format!("mix:{}", m.source.name), &what, &m.source.location)?
        {
            out.push(input);
        }
    }
    Ok(out)
}

/// The rows a round trains on, for the estimate: its own, the earlier rounds', and the shares.
pub fn planned_rows(mix: &MixConfig, own: &Estimate, earlier: &[&PlannedStage]) -> Option<u64> {
    let mut rows = own.rows?;
    for e in earlier {
        rows += e.estimate.rows?;
    }
    let shares: f64 = mix.sources.iter().map(|m| m.share).sum();
    Some(rows + (rows as f64 * shares).round() as u64)
}

/// Writes `mix.parquet` for the train stage `stage` (whose `sft` dependency is the round's own
/// rows) and returns its path and counts.
pub fn build(
    mix: &MixConfig,
    sample: Option<&SampleSettings>,
    model: &str,
    plan: &Plan,
    stage: &PlannedStage,
) -> Result<(PathBuf, Counts)> {
    let own_dir = plan.dep(stage, "sft")?;
    let mut rows = read_completions(&own_dir.dir.join(super::SFT))?;
    let own = rows.len() as u64;
    for (_, name) in stage.deps.iter().filter(|(r, _)| *r == EARLIER) {
        let e = plan
            .get(name)
            .with_context(|| format!("the mix reads {name}, which is not planned"))?;
        rows.extend(read_completions(&e.dir.join(super::SFT))?);
    }
    let earlier = rows.len() as u64 - own;
    let base = rows.len() as u64;
    let mut counts: Counts = vec![
        ("mix.round_rows".into(), own),
        ("mix.earlier_rows".into(), earlier),
    ];
    for m in &mix.sources {
        let files = crate::data::hub::resolve(&m.source.location)
            .with_context(|| format!("mix source `{}`", m.source.name))?;
        let (problems, _) =
            crate::data::load_source(&m.source, &files, crate::data::BadRows::STRICT)
                .with_context(|| format!("mix source `{}`", m.source.name))?;
        let problems: Vec<_> = problems
            .into_iter()
            .filter(|p| p.solution.as_deref().is_some_and(|s| !s.trim().is_empty()))
            .collect();
        let want = (base as f64 * m.share).round() as usize;
        if want > 0 && problems.is_empty() {
            anyhow::bail!(
                "mix source `{}` has no row with a worked solution",
                m.source.name
            );
        }
        let seed =
            mix.seed ^ crate::store::hash_seed(&serde_json::json!([stage.name, m.source.name]));
        let mut rng = crate::rng::SplitMix(seed);
        let mut picked = Vec::with_capacity(want);
        while picked.len() < want {
            let mut order: Vec<usize> = (0..problems.len()).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i + 1));
            }
            picked.extend(order.into_iter().take(want - picked.len()));
        }
        let chosen: Vec<_> = picked.iter().map(|&i| problems[i].clone()).collect();
        let prompts = render(&chosen, sample, model)?;
        rows.extend(chosen.iter().zip(prompts).map(|(p, prompt)| {
            Completion::text(
                p.problem_id.clone(),
                prompt,
                p.solution.clone().unwrap_or_default(),
                Some(format!("mix:{}", m.source.name)),
            )
        }));
        counts.push((format!("mix.source.{}", m.source.name), want as u64));
        if want > problems.len() {
            tracing::info!(
                "    mix: {} rows asked of `{}`, which has {}: rows repeat",
                want,
                m.source.name,
                problems.len()
            );
        }
    }
    tracing::info!(
        "    mix: {own} rows of this round, {earlier} of earlier rounds, {} from sources",
        rows.len() as u64 - base
    );
    // token ids the sampler recorded are kept; rows without them are tokenized by the trainer
    let path = stage.dir.join(MIX);
    write_completions(&path, &rows, false)?;
    counts.push(("mix.rows".into(), rows.len() as u64));
    Ok((path, counts))
}

/// Prompts rendered as the sampler renders them for `model`.
fn render(
    problems: &[crate::data::schema::Problem],
    sample: Option<&SampleSettings>,
    model: &str,
) -> Result<Vec<String>> {
    let Some(s) = sample.filter(|_| !problems.is_empty()) else {
        // raw: the problem text as it is
        return Ok(problems.iter().map(|p| p.problem.clone()).collect());
    };
    let ck = crate::model::Checkpoint::open(model)?;
    let tok = ck.tokenizer()?;
    let (_, prompts) = prompts_of(s, &ck, &tok, problems)?;
    Ok(prompts.into_iter().map(|(text, _)| text).collect())
}

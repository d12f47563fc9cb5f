//! Building the plan: a validated config becomes the ordered list of stages it configures
//! (sample, filter and train repeated per round), each planned by its own file and keyed.
//!
//! Knows the order of stages and which stage reads which, not what they compute, and nothing of
//! running them ([`super::runner`]).

use std::path::Path;

use anyhow::{bail, Context, Result};

use super::resolve::{ModelFacts, Resolve};
use super::stage::{Plan, PlannedStage, StageKind};
use super::{data, eval, filter, pretrain, sample, train};
use crate::config::{Config, TrainFrom, PRETRAINED};

impl Plan {
    /// Resolves every input (downloading hub files when needed) and keys every stage.
    pub fn build(cfg: &Config, workdir: &Path) -> Result<Plan> {
        Plan::build_with(cfg, workdir, Resolve::default())
    }

    /// [`Self::build`], finding inputs through `resolve`.
    pub fn build_with(cfg: &Config, workdir: &Path, resolve: Resolve) -> Result<Plan> {
        let mut stages: Vec<PlannedStage> = Vec::new();
        if let Some(d) = &cfg.data {
            stages.push(data::plan(d, workdir, &resolve)?);
        }
        let pretrained = match &cfg.pretrain {
            Some(p) => {
                let (stage, facts) = pretrain::plan(p, workdir, &resolve)?;
                stages.push(stage);
                Some(facts)
            }
            None => None,
        };
        // A model by name: the pretrain stage's, or a checkpoint / hub id.
        let facts = |name: &str| -> Result<ModelFacts> {
            if name == PRETRAINED {
                return pretrained
                    .clone()
                    .context("`@pretrain` names the pretrain stage's model: add [pretrain]");
            }
            resolve.facts(name)
        };
        let rounds = cfg.rounds.max(1);
        let named = |kind: &str, r: u32| {
            if rounds == 1 {
                kind.to_string()
            } else {
                format!("{kind}-r{r}")
            }
        };
        // The model the round before trained: (its folder, facts). Round 1 samples the [sample]
        // model and trains the [train] model (by default the same).
        let mut prev: Option<(String, ModelFacts)> = None;
        // the filter stages of the rounds before, for `[mix] accumulate`
        let mut earlier: Vec<String> = Vec::new();
        let mut prev_sample: Option<String> = None;
        for r in 1..=rounds {
            let start =
                |configured: &str, stages: &[PlannedStage]| -> Result<(String, ModelFacts)> {
                    match &prev {
                        Some(p) => Ok(p.clone()),
                        None => Ok((model_path(stages, configured), facts(configured)?)),
                    }
                };
            let mut sampled = None;
            if let Some(s) = &cfg.sample {
                let data =
                    find(&stages, StageKind::Data).context("the sample stage needs [data]")?;
                let (model, mf) = start(&s.model, &stages)?;
                // the round before's sample stage, when this round resamples
                let previous = match (cfg.resample_below, &prev_sample) {
                    (Some(below), Some(name)) => {
                        stages.iter().find(|x| &x.name == name).map(|p| (p, below))
                    }
                    _ => None,
                };
                let mut st =
                    sample::plan(s, data, workdir, &mf, previous, cfg.rationalize.as_ref())?;
                st.name = named("sample", r);
                st.deps.push(("data", data.name.clone()));
                if let Some((p, _)) = previous {
                    st.deps.push((sample::PREVIOUS, p.name.clone()));
                }
                prev_sample = Some(st.name.clone());
                st.model = Some(model);
                sampled = Some(stages.len());
                stages.push(st);
            }
            if let Some(f) = &cfg.filter {
                let data =
                    find(&stages, StageKind::Data).context("the filter needs the data stage")?;
                let from = sampled.map(|i| &stages[i]);
                let sets = cfg.eval.as_ref().map_or(&[][..], |e| e.sets.as_slice());
                let mut st = filter::plan(f, data, from, sets, workdir, &resolve)?;
                st.name = named("filter", r);
                st.deps.push(("data", data.name.clone()));
                if let Some(i) = sampled {
                    st.deps.push(("completions", stages[i].name.clone()));
                    // STaR: the rows sampled with a hint join the completions
                    if let Some(f) = sample::rationalized_file(&stages[i]) {
                        st.files.push((filter::RATIONALIZED.into(), f));
                    }
                }
                stages.push(st);
            }
            if let Some(t) = &cfg.train {
                let filter = stages.last().filter(|s| s.kind == StageKind::Filter);
                let filter = filter.context("the train stage needs the filter stage")?;
                let configured = t.model.as_deref().context("train.model is unresolved")?;
                let (model, mf) = match cfg.train_from {
                    TrainFrom::Previous => start(configured, &stages)?,
                    // ReST-EM: every round from the [train] model
                    TrainFrom::Base => (model_path(&stages, configured), facts(configured)?),
                };
                let accumulated: Vec<&PlannedStage> = match &cfg.mix {
                    Some(m) if m.accumulate => earlier
                        .iter()
                        .filter_map(|n| stages.iter().find(|s| &s.name == n))
                        .collect(),
                    _ => Vec::new(),
                };
                let mix = cfg
                    .mix
                    .as_ref()
                    .map(|m| (m, accumulated.as_slice(), &resolve));
                // refused before anything runs when both models are here to compare
                let teacher = stages
                    .iter()
                    .rev()
                    .find(|x| x.kind == StageKind::Sample)
                    .and_then(|x| x.model.clone());
                if let Some(teacher) = teacher {
                    super::student::check(&teacher, &model, cfg.sample.as_ref())?;
                }
                let mut st = train::plan(t, filter, workdir, &mf, mix)?;
                st.name = named("train", r);
                st.deps.push(("sft", filter.name.clone()));
                for e in &accumulated {
                    st.deps.push((super::mix::EARLIER, e.name.clone()));
                }
                earlier.push(filter.name.clone());
                st.model = Some(model);
                prev = Some((
                    st.model_input().location,
                    ModelFacts {
                        input: st.model_input(),
                        ..mf
                    },
                ));
                stages.push(st);
            }
        }
        if let Some(e) = &cfg.eval {
            let base = facts(&e.base_model)?;
            let trained: Vec<&PlannedStage> = stages
                .iter()
                .filter(|s| s.kind == StageKind::Train)
                .collect();
            // a teacher that is not the student: scored beside the base and trained students
            let teacher = match &cfg.sample {
                Some(s) if s.model != e.base_model && !trained.is_empty() => Some(facts(&s.model)?),
                _ => None,
            };
            let mut st = eval::plan(
                &e.settings,
                &base,
                teacher.as_ref(),
                &e.sets,
                &trained,
                workdir,
                &resolve,
            )?;
            st.model = Some(model_path(&stages, &e.base_model));
            stages.push(st);
        }
        if stages.is_empty() {
            bail!(
                "{} configures no stage: add a [data] section (see pipelines/reference.toml)",
                cfg.origin
            );
        }
        Ok(Plan {
            workdir: workdir.to_path_buf(),
            stages,
        })
    }
}

/// The first planned stage of `kind`.
fn find(stages: &[PlannedStage], kind: StageKind) -> Option<&PlannedStage> {
    stages.iter().find(|s| s.kind == kind)
}

/// Where a model named in the config lives: the pretrain stage's output folder for
/// `@pretrain`, else the name itself (a folder or hub id).
fn model_path(stages: &[PlannedStage], model: &str) -> String {
    match find(stages, StageKind::Pretrain).filter(|_| model == PRETRAINED) {
        Some(s) => s.model_input().location,
        None => model.to_string(),
    }
}

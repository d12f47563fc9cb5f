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
use crate::config::{Config, EvalPlan, FilterConfig, TrainFrom, PRETRAINED};
use crate::jobs::sample::settings::SampleSettings;
use crate::train::settings::TrainSettings;

impl Plan {
    /// Resolves every input (downloading hub files when needed) and keys every stage.
    pub fn build(cfg: &Config, workdir: &Path) -> Result<Plan> {
        Plan::build_with(cfg, workdir, Resolve::default())
    }

    /// [`Self::build`], finding inputs through `resolve`.
    pub fn build_with(cfg: &Config, workdir: &Path, resolve: Resolve) -> Result<Plan> {
        let mut b = Builder {
            cfg,
            workdir,
            resolve,
            stages: Vec::new(),
            pretrained: None,
            prev: None,
            earlier: Vec::new(),
            prev_sample: None,
        };
        if let Some(d) = &cfg.data {
            let st = data::plan(d, workdir, &b.resolve)?;
            b.stages.push(st);
        }
        if let Some(p) = &cfg.pretrain {
            let (stage, facts) = pretrain::plan(p, workdir, &b.resolve)?;
            b.stages.push(stage);
            b.pretrained = Some(facts);
        }
        for r in 1..=cfg.rounds.max(1) {
            let sampled = match &cfg.sample {
                Some(s) => Some(b.sample(s, r)?),
                None => None,
            };
            if let Some(f) = &cfg.filter {
                b.filter(f, r, sampled)?;
            }
            if let Some(t) = &cfg.train {
                b.train(t, r)?;
            }
        }
        if let Some(e) = &cfg.eval {
            b.eval(e)?;
        }
        if b.stages.is_empty() {
            bail!(
                "{} configures no stage: add a [data] section (see pipelines/reference.toml)",
                cfg.origin
            );
        }
        Ok(Plan {
            workdir: workdir.to_path_buf(),
            stages: b.stages,
        })
    }
}

/// The plan as it is built: the stages so far, and what the rounds hand on.
struct Builder<'a> {
    cfg: &'a Config,
    workdir: &'a Path,
    resolve: Resolve,
    stages: Vec<PlannedStage>,
    /// The pretrain stage's model.
    pretrained: Option<ModelFacts>,
    /// The model the round before trained: (its folder, facts). Round 1 samples the [sample]
    /// model and trains the [train] model (by default the same).
    prev: Option<(String, ModelFacts)>,
    /// The filter stages of the rounds before, for `[mix] accumulate`.
    earlier: Vec<String>,
    /// The round before's sample stage.
    prev_sample: Option<String>,
}

impl Builder<'_> {
    /// A model by name: the pretrain stage's, or a checkpoint / hub id.
    fn facts(&self, name: &str) -> Result<ModelFacts> {
        if name == PRETRAINED {
            return self
                .pretrained
                .clone()
                .context("`@pretrain` names the pretrain stage's model: add [pretrain]");
        }
        self.resolve.facts(name)
    }

    /// A stage kind's name in round `r` (no suffix in a one-round run).
    fn named(&self, kind: &str, r: u32) -> String {
        if self.cfg.rounds.max(1) == 1 {
            kind.to_string()
        } else {
            format!("{kind}-r{r}")
        }
    }

    /// The model a round starts from: the round before's, or the `configured` one.
    fn start(&self, configured: &str) -> Result<(String, ModelFacts)> {
        match &self.prev {
            Some(p) => Ok(p.clone()),
            None => Ok((
                model_path(&self.stages, configured),
                self.facts(configured)?,
            )),
        }
    }

    /// Round `r`'s sample stage; returns its index.
    fn sample(&mut self, s: &SampleSettings, r: u32) -> Result<usize> {
        let cfg = self.cfg;
        let data = find(&self.stages, StageKind::Data).context("the sample stage needs [data]")?;
        let (model, mf) = self.start(&s.model)?;
        // the round before's sample stage, when this round resamples
        let previous = match (cfg.resample_below, &self.prev_sample) {
            (Some(below), Some(name)) => self
                .stages
                .iter()
                .find(|x| &x.name == name)
                .map(|p| (p, below)),
            _ => None,
        };
        let mut st = sample::plan(
            s,
            data,
            self.workdir,
            &mf,
            previous,
            cfg.rationalize.as_ref(),
        )?;
        st.name = self.named("sample", r);
        st.deps.push(("data", data.name.clone()));
        if let Some((p, _)) = previous {
            st.deps.push((sample::PREVIOUS, p.name.clone()));
        }
        self.prev_sample = Some(st.name.clone());
        st.model = Some(model);
        self.stages.push(st);
        Ok(self.stages.len() - 1)
    }

    /// Round `r`'s filter stage, of the samples of stage `sampled`.
    fn filter(&mut self, f: &FilterConfig, r: u32, sampled: Option<usize>) -> Result<()> {
        let stages = &self.stages;
        let data = find(stages, StageKind::Data).context("the filter needs the data stage")?;
        let from = sampled.map(|i| &stages[i]);
        let sets = self
            .cfg
            .eval
            .as_ref()
            .map_or(&[][..], |e| e.sets.as_slice());
        let mut st = filter::plan(f, data, from, sets, self.workdir, &self.resolve)?;
        st.name = self.named("filter", r);
        st.deps.push(("data", data.name.clone()));
        if let Some(i) = sampled {
            st.deps.push(("completions", stages[i].name.clone()));
            // STaR: the rows sampled with a hint join the completions
            if let Some(f) = sample::rationalized_file(&stages[i]) {
                st.files.push((filter::RATIONALIZED.into(), f));
            }
        }
        self.stages.push(st);
        Ok(())
    }

    /// Round `r`'s train stage, on the last filter stage's rows.
    fn train(&mut self, t: &TrainSettings, r: u32) -> Result<()> {
        let cfg = self.cfg;
        let stages = &self.stages;
        let filter = stages.last().filter(|s| s.kind == StageKind::Filter);
        let filter = filter.context("the train stage needs the filter stage")?;
        let configured = t.model.as_deref().context("train.model is unresolved")?;
        let (model, mf) = match cfg.train_from {
            TrainFrom::Previous => self.start(configured)?,
            // ReST-EM: every round from the [train] model
            TrainFrom::Base => (model_path(stages, configured), self.facts(configured)?),
        };
        let accumulated: Vec<&PlannedStage> = match &cfg.mix {
            Some(m) if m.accumulate => self
                .earlier
                .iter()
                .filter_map(|n| stages.iter().find(|s| &s.name == n))
                .collect(),
            _ => Vec::new(),
        };
        let mix = cfg
            .mix
            .as_ref()
            .map(|m| (m, accumulated.as_slice(), &self.resolve));
        // refused before anything runs when both models are here to compare
        let teacher = stages
            .iter()
            .rev()
            .find(|x| x.kind == StageKind::Sample)
            .and_then(|x| x.model.clone());
        if let Some(teacher) = teacher {
            super::student::check(&teacher, &model, cfg.sample.as_ref())?;
        }
        let mut st = train::plan(t, filter, self.workdir, &mf, mix)?;
        st.name = self.named("train", r);
        st.deps.push(("sft", filter.name.clone()));
        for e in &accumulated {
            st.deps.push((super::mix::EARLIER, e.name.clone()));
        }
        let filter_name = filter.name.clone();
        st.model = Some(model);
        self.earlier.push(filter_name);
        self.prev = Some((
            st.model_input().location,
            ModelFacts {
                input: st.model_input(),
                ..mf
            },
        ));
        self.stages.push(st);
        Ok(())
    }

    /// The eval stage: the base model, a teacher that is not the student, the trained ones.
    fn eval(&mut self, e: &EvalPlan) -> Result<()> {
        let base = self.facts(&e.base_model)?;
        let trained: Vec<&PlannedStage> = self
            .stages
            .iter()
            .filter(|s| s.kind == StageKind::Train)
            .collect();
        // a teacher that is not the student: scored beside the base and trained students
        let teacher = match &self.cfg.sample {
            Some(s) if s.model != e.base_model && !trained.is_empty() => {
                Some(self.facts(&s.model)?)
            }
            _ => None,
        };
        let mut st = eval::plan(
            &e.settings,
            &base,
            teacher.as_ref(),
            &e.sets,
            &trained,
            self.workdir,
            &self.resolve,
        )?;
        st.model = Some(model_path(&self.stages, &e.base_model));
        self.stages.push(st);
        Ok(())
    }
}

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

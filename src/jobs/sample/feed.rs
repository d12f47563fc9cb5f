//! The loop of a run: feeds one engine the problems of one or more jobs not yet committed,
//! grades each finished sample, stops a problem at its job's `target_correct`, commits each
//! job's finished problems in its own parts ([`super::parts`]) and joins them into its output.
//!
//! Jobs that share the engine put their requests in one continuous batch, each request with its
//! job's settings; a sample's tokens depend only on (seed, problem id, sample index), so each
//! output is what its job alone writes. Knows nothing of models or settings files: a [`Job`] is
//! ready to run.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};

use super::engine::SampleEngine;
use super::job::{sampling_hash, Job, JobSummary};
use super::parts::{
    check_key, commit_part, committed_problems, join_parts, next_part_index, parts_dir,
    problems_digest, PartsKey,
};
use crate::data::schema::{Completion, Grade, Logprobs, Problem};
use crate::model::TextTokenizer;
use crate::progress::{Target, Tracker};
use crate::sampler::engine::{Request, RequestSettings, Sample};
use crate::verify::grade;

/// A request's job and its problem's index in the job.
type JobProblem = (usize, usize);

/// A job while it runs: its parts, what they hold, and its counts.
struct Open {
    parts: PathBuf,
    shash: String,
    next_part: usize,
    /// Its requests whose samples have all finished, not yet committed.
    finished: Vec<usize>,
    summary: JobSummary,
    tracker: Tracker,
    /// Problems whose samples are not all in.
    open: usize,
}

/// Runs `jobs` through `engine` and writes each job's output; `overall` reports the whole run
/// where there are several jobs (each job then reports on its own line, without a file).
pub fn run(
    engine: &mut dyn SampleEngine,
    tok: &TextTokenizer,
    jobs: &[Job],
    overall: &Target,
) -> Result<Vec<JobSummary>> {
    let t0 = Instant::now();
    let shared = jobs.len() > 1;
    let (mut open, request_of) = add_requests(engine, jobs, shared)?;
    let samples = |j: &Job, problems: usize| problems as u64 * u64::from(j.cfg.params.n);
    let total: u64 = jobs.iter().map(|j| samples(j, j.problems.len())).sum();
    let resumed: u64 = jobs
        .iter()
        .zip(&open)
        .map(|(j, o)| samples(j, o.summary.problems_resumed))
        .sum();
    let mut all = shared.then(|| overall.tracker("samples", Some(total)).resumed(resumed));
    let decode = |ids: &[u32]| tok.decode(ids).unwrap_or_default();
    let mut books = Books {
        remaining: request_of
            .iter()
            .map(|&(j, _)| jobs[j].cfg.params.n)
            .collect(),
        request_of,
        pending: HashMap::new(),
        correct: HashMap::new(),
    };
    let mut last_detail: Option<Instant> = None;
    while !engine.is_idle() {
        for s in engine.step(Some(&decode))? {
            let (j, done) = books.take(&s, jobs, &mut open, engine, tok)?;
            open[j].tracker.inc(done);
            if let Some(a) = all.as_mut() {
                a.inc(done);
            }
        }
        for (job, o) in jobs.iter().zip(&mut open) {
            // a job's last problems are committed as soon as they are in
            if o.finished.len() >= job.cfg.part_problems || (o.open == 0 && !o.finished.is_empty())
            {
                commit_part(
                    &o.parts,
                    &mut o.next_part,
                    &mut o.finished,
                    &mut books.pending,
                )?;
            }
        }
        if last_detail.is_none_or(|t| t.elapsed().as_secs_f64() > 0.5) {
            report(engine, jobs, &mut open, all.as_mut(), t0);
            last_detail = Some(Instant::now());
        }
    }
    report(engine, jobs, &mut open, all.as_mut(), t0);
    if let Some(a) = all {
        a.finish();
    }
    let seconds = t0.elapsed().as_secs_f64();
    jobs.iter()
        .zip(open)
        .map(|(job, o)| close(job, o, &mut books.pending, engine, shared, seconds))
        .collect()
}

/// Each job's problems not yet committed, added to `engine` (each request with its job's
/// settings where jobs share the engine): the jobs' open states, and each request's (job,
/// problem index).
fn add_requests(
    engine: &mut dyn SampleEngine,
    jobs: &[Job],
    shared: bool,
) -> Result<(Vec<Open>, Vec<JobProblem>)> {
    let mut open = Vec::with_capacity(jobs.len());
    let mut request_of = Vec::new();
    for (j, job) in jobs.iter().enumerate() {
        let (o, todo) = open_job(job, shared)?;
        let settings = shared.then(|| {
            Arc::new(RequestSettings {
                params: job.cfg.params.clone(),
                thinking: job.cfg.thinking.clone(),
            })
        });
        for i in todo {
            engine.add(Request {
                problem_id: job.problems[i].problem_id.clone(),
                prompt: job.prompts[i].1.clone(),
                n: job.cfg.params.n,
                settings: settings.clone(),
            })?;
            request_of.push((j, i));
        }
        open.push(o);
    }
    Ok((open, request_of))
}

/// What the loop keeps per request.
struct Books {
    request_of: Vec<JobProblem>,
    /// Finished samples' rows, until their problem is committed.
    pending: HashMap<usize, Vec<Completion>>,
    correct: HashMap<usize, u32>,
    /// Samples not yet in.
    remaining: Vec<u32>,
}

impl Books {
    /// A finished sample: graded into its row, its problem stopped at the job's
    /// `target_correct`; returns its job and how many samples it settled (itself and any
    /// cancelled).
    fn take(
        &mut self,
        s: &Sample,
        jobs: &[Job],
        open: &mut [Open],
        engine: &mut dyn SampleEngine,
        tok: &TextTokenizer,
    ) -> Result<(usize, u64)> {
        let (j, i) = self.request_of[s.request];
        let (job, o) = (&jobs[j], &mut open[j]);
        let row = to_row(s, &job.problems[i], &job.prompts[i], tok, job, &o.shash)?;
        o.summary.samples += 1;
        o.summary.generated_tokens += s.tokens.len() as u64;
        let mut done = 1;
        if row.grade.as_ref().is_some_and(|g| g.correct) {
            o.summary.correct += 1;
            let c = self.correct.entry(s.request).or_insert(0);
            *c += 1;
            if job.cfg.target_correct.is_some_and(|k| *c >= k) {
                let saved = engine.cancel(s.request);
                o.summary.samples_saved += saved;
                done += saved;
            }
        }
        self.pending.entry(s.request).or_default().push(row);
        let r = &mut self.remaining[s.request];
        *r = r.saturating_sub(done as u32);
        if *r == 0 {
            o.finished.push(s.request);
            o.open -= 1;
        }
        Ok((j, done))
    }
}

/// A job's last part committed, its parts joined into its output and removed; its summary.
fn close(
    job: &Job,
    mut o: Open,
    pending: &mut HashMap<usize, Vec<Completion>>,
    engine: &dyn SampleEngine,
    shared: bool,
    seconds: f64,
) -> Result<JobSummary> {
    commit_part(&o.parts, &mut o.next_part, &mut o.finished, pending)?;
    o.tracker.finish();
    let set = job
        .cfg
        .problem_set
        .clone()
        .unwrap_or_else(|| problems_digest(job.problems));
    o.summary.output = join_parts(
        &o.parts,
        job.problems,
        (job.cfg.shard, &set),
        job.cfg.params.logprobs.is_some(),
        &o.shash,
        &job.output,
    )?;
    std::fs::remove_dir_all(&o.parts)
        .with_context(|| format!("cannot remove {}", o.parts.display()))?;
    // a job alone has all the engine computed; jobs that share it keep their own samples'
    // tokens, and the run's prompt tokens, preemptions and time
    if !shared {
        o.summary.generated_tokens = engine.generated_tokens();
    }
    o.summary.prompt_tokens = engine.prompt_tokens();
    o.summary.preemptions = engine.preemptions();
    o.summary.seconds = seconds;
    Ok(o.summary)
}

/// A job's parts folder checked against its settings, and the indices of its problems not yet
/// committed there.
fn open_job(job: &Job, shared: bool) -> Result<(Open, Vec<usize>)> {
    let parts = parts_dir(&job.output);
    std::fs::create_dir_all(&parts)
        .with_context(|| format!("cannot create {}", parts.display()))?;
    let cfg = &job.cfg;
    let shash = sampling_hash(
        &cfg.model_name,
        &cfg.params,
        &job.template,
        cfg.engine.as_str(),
    );
    let key = PartsKey {
        model: cfg.model_name.clone(),
        model_digest: cfg.model_digest.clone(),
        problems: problems_digest(job.problems),
        prompt_template: format!("{:?}", job.template),
        engine: cfg.engine.as_str().to_string(),
        thinking: format!("{:?}", cfg.thinking),
        grading: format!("{:?}", cfg.grade),
        shard: format!("{}/{}", cfg.shard.0, cfg.shard.1),
        params: cfg.params.clone(),
    };
    check_key(&parts, &key, &shash)?;
    let done: HashSet<String> = committed_problems(&parts)?.into_iter().collect();
    let todo: Vec<usize> = (0..job.problems.len())
        .filter(|&i| !done.contains(&job.problems[i].problem_id))
        .collect();
    let resumed = job.problems.len() - todo.len();
    if resumed > 0 {
        tracing::info!(
            "resuming: {resumed} of {} problems already committed in {}",
            job.problems.len(),
            parts.display()
        );
    }
    let n = u64::from(cfg.params.n);
    let target = match shared {
        true => Target::new(cfg.progress.label.clone(), None),
        false => cfg.progress.clone(),
    };
    let tracker = target
        .tracker("samples", Some(job.problems.len() as u64 * n))
        .resumed(resumed as u64 * n);
    let o = Open {
        next_part: next_part_index(&parts)?,
        parts,
        shash,
        finished: Vec::new(),
        summary: JobSummary {
            problems: job.problems.len(),
            problems_resumed: resumed,
            ..JobSummary::default()
        },
        tracker,
        open: todo.len(),
    };
    Ok((o, todo))
}

/// Each job's progress line (problems finished, tokens/s, batch, KV use), and the overall one.
fn report(
    engine: &dyn SampleEngine,
    jobs: &[Job],
    open: &mut [Open],
    all: Option<&mut Tracker>,
    t0: Instant,
) {
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    let kv = engine
        .kv_usage()
        .map(|u| format!("  KV {:.0}%", 100.0 * u))
        .unwrap_or_default();
    let running = engine.num_running();
    let shared = all.is_some();
    for (job, o) in jobs.iter().zip(open.iter_mut()) {
        let total = job.problems.len();
        let done = total - o.open;
        let tps = match shared {
            true => o.summary.generated_tokens as f64 / secs,
            false => engine.generated_tokens() as f64 / secs,
        };
        o.tracker.detail(match shared {
            true => format!("problems {done}/{total}  {tps:.0} tok/s"),
            false => format!("problems {done}/{total}  {tps:.0} tok/s  running {running}{kv}"),
        });
    }
    if let Some(a) = all {
        let open_jobs = open.iter().filter(|o| o.open > 0).count();
        let tps = engine.generated_tokens() as f64 / secs;
        a.detail(format!(
            "sets {}/{}  {tps:.0} tok/s  running {running}{kv}",
            jobs.len() - open_jobs,
            jobs.len()
        ));
    }
}

fn to_row(
    s: &Sample,
    p: &Problem,
    prompt: &(String, Vec<u32>),
    tok: &TextTokenizer,
    job: &Job,
    shash: &str,
) -> Result<Completion> {
    let cfg = &job.cfg;
    let text = tok.decode(&s.tokens)?;
    // A stop string ends the completion where it starts.
    let text = match crate::sampler::sampling::stop_string_hit(&text, &cfg.params.stop_strings) {
        Some(i) => text.get(..i).unwrap_or(&text).to_string(),
        None => text,
    };
    let grade_row = (!p.gold_answer.is_empty()).then(|| {
        let v = grade(&text, &p.gold_answer, &cfg.grade);
        Grade {
            gold_answer: p.gold_answer.clone(),
            extracted_answer: v.extracted,
            correct: v.correct,
            reason: v.reason.as_str().to_string(),
        }
    });
    Ok(Completion {
        problem_id: s.problem_id.clone(),
        sample_index: s.sample_index as i32,
        prompt: prompt.0.clone(),
        prompt_token_ids: Some(prompt.1.iter().map(|&t| t as i32).collect()),
        completion: text,
        completion_token_ids: Some(s.tokens.iter().map(|&t| t as i32).collect()),
        finish_reason: Some(s.finish_reason.as_str().to_string()),
        num_completion_tokens: Some(s.tokens.len() as i32),
        cumulative_logprob: Some(s.cumulative_logprob),
        seed: Some(cfg.params.seed as i64),
        model: Some(cfg.model_name.clone()),
        sampling_hash: Some(shash.to_string()),
        grade: grade_row,
        logprobs: s.logprobs.as_ref().map(|lp| Logprobs {
            token: lp.iter().map(|t| t.logprob).collect(),
            top_ids: lp
                .iter()
                .map(|t| t.top.iter().map(|&(id, _)| id as i32).collect())
                .collect(),
            top: lp
                .iter()
                .map(|t| t.top.iter().map(|&(_, p)| p).collect())
                .collect(),
        }),
        rationalized: false,
    })
}

//! A teacher's rows for a student: when the model that sampled a round's rows (the teacher,
//! `[sample] model`) maps text to ids differently from the model trained on them (the student,
//! `[train] model`), or renders chat prompts with another template, its token ids mean nothing
//! to the student. Such rows are re-rendered from their text: the prompt from the problem's
//! text with the `[sample]` template and the student's chat template, the completion as the
//! teacher wrote it (without the teacher's end-of-sequence token), and no token ids, so that the
//! trainer tokenizes both with the student's tokenizer and ends the completion with the
//! student's EOS. They go to `student.parquet` in the train stage's folder.
//!
//! Rows whose writer has the student's tokenizer and template (the same model, a round's trained
//! model, a copy) keep the ids they were sampled with; rows without ids (mixed-in sources,
//! imported text) are already text. Knows nothing of training.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::data::schema::{read_completions, read_problems, write_completions};
use crate::jobs::sample::run::prompts_of;
use crate::jobs::sample::settings::SampleSettings;
use crate::model::Checkpoint;

/// The re-rendered rows, in the train stage's folder.
pub const STUDENT: &str = "student.parquet";

/// What turns a problem's text into a model's ids: the parts of `tokenizer.json` that map text
/// to ids (`model`, `added_tokens`, `normalizer`, `pre_tokenizer`; not the file's bytes) and,
/// for chat prompts, the chat template. `None` when the model cannot be opened here (not
/// downloaded yet).
fn identity(model: &str, chat: bool) -> Option<serde_json::Value> {
    let ck = Checkpoint::open(model).ok()?;
    let text = std::fs::read(ck.dir.join("tokenizer.json")).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
    let template = chat
        .then(|| ck.chat_template().ok())
        .flatten()
        .map(|t| serde_json::json!([t.source, t.bos_token, t.eos_token]));
    Some(serde_json::json!([
        v.get("model"),
        v.get("added_tokens"),
        v.get("normalizer"),
        v.get("pre_tokenizer"),
        template
    ]))
}

/// Whether the rows `teacher` sampled must be re-rendered for `student`; `None` when either
/// cannot be opened here.
pub fn needs_rerender(
    teacher: &str,
    student: &str,
    sample: Option<&SampleSettings>,
) -> Option<bool> {
    if teacher == student {
        return Some(false);
    }
    let chat = sample.is_some_and(|s| s.prompt_template == "chat");
    Some(identity(teacher, chat)? != identity(student, chat)?)
}

/// Refuses, before anything runs, a teacher whose rows cannot be made the student's: the
/// student needs a tokenizer, an end-of-sequence token to end the completions with and, for
/// chat prompts, a chat template. Models that cannot be opened here are checked when the train
/// stage runs.
pub fn check(teacher: &str, student: &str, sample: Option<&SampleSettings>) -> Result<()> {
    if needs_rerender(teacher, student, sample) != Some(true) {
        return Ok(());
    }
    let why = |what: &str| {
        format!(
            "the rows are sampled by {teacher}, whose tokenizer or chat template differs from \
             that of the trained model {student}, so they are re-rendered for it from their \
             text; {what}"
        )
    };
    let ck = Checkpoint::open(student)?;
    ck.tokenizer()
        .with_context(|| why("its tokenizer does not load"))?;
    if ck.eos_token_ids()?.is_empty() {
        bail!(
            "{}",
            why(
                "it has no end-of-sequence token (generation_config.json or config.json \
                 eos_token_id) to end the completions with"
            )
        );
    }
    if sample.is_some_and(|s| s.prompt_template == "chat") {
        ck.chat_template().with_context(|| {
            why(
                "with sample.prompt_template = \"chat\" the prompts need its chat template, \
                 which it does not have: give it one, or use a \"raw\" or Jinja file template",
            )
        })?;
    }
    Ok(())
}

/// The rows of `data` as `student` must see them: when some were written by a model that needs
/// re-rendering ([`needs_rerender`]), writes every row to [`STUDENT`] in `dir`, those re-rendered
/// from the problems of `problems` (`problems.parquet`), and returns its path and how many were
/// re-rendered; `None` when the rows are the student's as they are.
pub fn prepare(
    data: &Path,
    problems: &Path,
    sample: Option<&SampleSettings>,
    student: &str,
    dir: &Path,
) -> Result<Option<(PathBuf, u64)>> {
    let mut rows = read_completions(data)?;
    // the writers of rows with sampled ids, other than the student
    let writers: HashSet<&str> = rows
        .iter()
        .filter(|r| r.prompt_token_ids.is_some() || r.completion_token_ids.is_some())
        .filter_map(|r| r.model.as_deref())
        .filter(|m| *m != student)
        .collect();
    let mut teachers: HashMap<String, (crate::model::TextTokenizer, Vec<u32>)> = HashMap::new();
    for m in writers {
        match needs_rerender(m, student, sample) {
            Some(false) => {}
            Some(true) => {
                check(m, student, sample)?;
                let ck = Checkpoint::open(m)?;
                teachers.insert(m.to_string(), (ck.tokenizer()?, ck.eos_token_ids()?));
            }
            None => bail!(
                "{}: rows sampled by {m} train {student}: cannot open both to compare their \
                 tokenizers",
                data.display()
            ),
        }
    }
    if teachers.is_empty() {
        return Ok(None);
    }
    let sample = sample.context("re-rendering the teacher's rows needs the [sample] template")?;
    let problems_path = problems;
    let problems: HashMap<String, crate::data::schema::Problem> = read_problems(problems_path)?
        .into_iter()
        .map(|p| (p.problem_id.clone(), p))
        .collect();
    // every problem a re-rendered row needs, rendered once for the student
    let mut needed: Vec<crate::data::schema::Problem> = Vec::new();
    let mut at: HashMap<String, usize> = HashMap::new();
    for (i, r) in rows.iter().enumerate() {
        let teacher = r.model.as_deref().filter(|m| teachers.contains_key(*m));
        if teacher.is_none() || at.contains_key(&r.problem_id) {
            continue;
        }
        let p = problems.get(&r.problem_id).with_context(|| {
            format!(
                "{} row {}: problem {} is not among the problems of {}: its prompt cannot be \
                 re-rendered for {student}",
                data.display(),
                i + 1,
                r.problem_id,
                problems_path.display()
            )
        })?;
        at.insert(r.problem_id.clone(), needed.len());
        needed.push(p.clone());
    }
    let ck = Checkpoint::open(student)?;
    let tok = ck.tokenizer()?;
    let (_, prompts) = prompts_of(sample, &ck, &tok, &needed)?;
    let mut n = 0u64;
    for r in &mut rows {
        let Some((ttok, eos)) = r.model.as_deref().and_then(|m| teachers.get(m)) else {
            continue;
        };
        // the teacher's end-of-sequence token ended the text: the student's replaces it
        if let Some(&last) = r.completion_token_ids.as_ref().and_then(|ids| ids.last()) {
            if eos.contains(&(last as u32)) {
                let end = ttok.decode(&[last as u32])?;
                if !end.is_empty() {
                    if let Some(cut) = r.completion.strip_suffix(end.as_str()) {
                        r.completion = cut.to_string();
                    }
                }
            }
        }
        r.prompt = prompts[at[&r.problem_id]].0.clone();
        r.prompt_token_ids = None;
        r.completion_token_ids = None;
        r.num_completion_tokens = None;
        r.cumulative_logprob = None;
        r.logprobs = None;
        n += 1;
    }
    let graded = rows.iter().all(|r| r.grade.is_some());
    let path = dir.join(STUDENT);
    write_completions(&path, &rows, graded)?;
    tracing::info!(
        "    student: {n} of {} rows re-rendered for {student} (another tokenizer or chat \
         template wrote them) -> {}",
        rows.len(),
        path.display()
    );
    Ok(Some((path, n)))
}

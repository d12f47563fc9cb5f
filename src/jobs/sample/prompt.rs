//! How a problem becomes a prompt: the checkpoint's chat template, the raw text, or a Jinja
//! file with `{{ problem }}`, rendered and tokenized.
//!
//! Knows nothing of sampling: the job hands the token ids to an engine.

use anyhow::{Context, Result};

use super::settings::SampleSettings;
use crate::data::schema::Problem;
use crate::model::tokenizer::{bounded_env, render_error};
use crate::model::{ChatTemplate, Message, TextTokenizer};

/// How a problem becomes a prompt.
#[derive(Debug, Clone)]
pub enum PromptTemplate {
    /// The checkpoint's chat template, with an optional system message.
    Chat {
        system: Option<String>,
        enable_thinking: Option<bool>,
    },
    /// The problem text unchanged.
    Raw,
    /// A Jinja template with `{{ problem }}`.
    File(String),
}

impl PromptTemplate {
    /// `chat`, `raw`, or a Jinja file's path (read here). A file must be a template that reads
    /// `problem`: one that never does would give every problem the same prompt.
    pub fn parse(
        name: &str,
        system: Option<String>,
        enable_thinking: Option<bool>,
    ) -> Result<PromptTemplate> {
        Ok(match name {
            "chat" => PromptTemplate::Chat {
                system,
                enable_thinking,
            },
            "raw" => PromptTemplate::Raw,
            path => {
                let src =
                    crate::bytes::read_settings_file(std::path::Path::new(path), "prompt_template")
                        .with_context(|| {
                            format!("prompt_template `{path}`: not chat, raw or a readable file")
                        })?;
                let env = bounded_env();
                let template = env
                    .template_from_str(&src)
                    .with_context(|| format!("prompt_template `{path}`: not a Jinja template"))?;
                if !template.undeclared_variables(false).contains("problem") {
                    anyhow::bail!(
                        "prompt_template `{path}`: the template never reads `problem`, so every \
                         prompt would be the same text; write {{{{ problem }}}} where the problem \
                         goes"
                    );
                }
                // one rendering now, so that a template that cannot render (or runs out of
                // fuel whatever the problem) fails here, naming its file
                template
                    .render(minijinja::context! { problem => "1 + 1" })
                    .map_err(|e| render_error(&format!("prompt_template `{path}`"), e))?;
                PromptTemplate::File(src)
            }
        })
    }

    pub fn from_settings(s: &SampleSettings) -> Result<PromptTemplate> {
        PromptTemplate::parse(&s.prompt_template, s.system.clone(), s.enable_thinking)
    }
}

/// Renders and tokenizes every problem's prompt.
pub fn build_prompts(
    problems: &[Problem],
    template: &PromptTemplate,
    chat: Option<&ChatTemplate>,
    tok: &TextTokenizer,
) -> Result<Vec<(String, Vec<u32>)>> {
    problems
        .iter()
        .map(|p| {
            let text = match template {
                PromptTemplate::Raw => p.problem.clone(),
                PromptTemplate::Chat {
                    system,
                    enable_thinking,
                } => {
                    let chat = chat.context("the checkpoint has no chat template")?;
                    let mut msgs = Vec::new();
                    if let Some(s) = system {
                        msgs.push(Message::new("system", s));
                    }
                    msgs.push(Message::new("user", &p.problem));
                    chat.render(&msgs, true, *enable_thinking)?
                }
                PromptTemplate::File(src) => bounded_env()
                    .render_str(src, minijinja::context! { problem => p.problem.clone() })
                    .map_err(|e| {
                        render_error(
                            &format!("the prompt template file, for problem {}", p.problem_id),
                            e,
                        )
                    })?,
            };
            let ids = tok.encode(&text)?;
            Ok((text, ids))
        })
        .collect()
}

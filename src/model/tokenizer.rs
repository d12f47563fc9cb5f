//! Text in and out of a model: the tokenizer from `tokenizer.json` and the chat template from
//! `tokenizer_config.json` or `chat_template.jinja`, rendered with minijinja the way transformers'
//! `apply_chat_template` renders it (trim_blocks, lstrip_blocks, Python string methods through
//! minijinja-contrib's pycompat).
//!
//! Knows nothing of weights or sampling.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use serde_json::Value;

/// A `tokenizer.json` tokenizer.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
}

impl TextTokenizer {
    pub fn from_file(path: &Path) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| anyhow!("cannot load tokenizer {}: {e}", path.display()))?;
        Ok(TextTokenizer { inner })
    }

    /// Token ids of `text`; special tokens written in the text (`<|im_start|>`) become their ids,
    /// and nothing is added around it (as transformers does for Qwen and for rendered chats).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| anyhow!("cannot tokenize: {e}"))?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| anyhow!("cannot decode: {e}"))
    }

    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

/// One chat message.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// The most work one rendering of a template may do, in minijinja's fuel: about one unit per
/// instruction and one per byte a string operation allocates (charged before it allocates). A
/// chat template renders one problem in a few thousand; a template from a file or a downloaded
/// checkpoint that loops without end or doubles a string forty times stops here with an error
/// instead of hanging or aborting on a failed allocation.
pub const TEMPLATE_FUEL: u64 = 50_000_000;

/// A minijinja environment whose renders are bounded by [`TEMPLATE_FUEL`]: every template we
/// render (chat templates, prompt template files) comes from one.
pub fn bounded_env() -> minijinja::Environment<'static> {
    let mut env = minijinja::Environment::new();
    env.set_fuel(Some(TEMPLATE_FUEL));
    env
}

/// `e` as a sentence naming `what` (the template's file or origin), with what running out of
/// fuel means.
pub fn render_error(what: &str, e: minijinja::Error) -> anyhow::Error {
    if e.kind() == minijinja::ErrorKind::OutOfFuel {
        anyhow!(
            "{what}: rendering stopped after {TEMPLATE_FUEL} steps or bytes (a loop or a string \
             too large for one prompt); a prompt template renders one problem in far less"
        )
    } else {
        anyhow!("{what}: cannot render: {e}")
    }
}

/// A checkpoint's chat template with the special tokens it may refer to.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    /// Where the template was read (for errors).
    pub origin: String,
    pub source: String,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
}

impl ChatTemplate {
    /// From `chat_template.jinja` (newer layout) or `tokenizer_config.json`'s `chat_template`
    /// (a string, or a list of named templates of which `default` is used).
    pub fn from_dir(dir: &Path) -> Result<ChatTemplate> {
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: Value = match std::fs::read_to_string(&cfg_path) {
            Ok(t) => serde_json::from_str(&t)
                .with_context(|| format!("{} is not JSON", cfg_path.display()))?,
            Err(_) => Value::Null,
        };
        let jinja = dir.join("chat_template.jinja");
        let origin = if jinja.exists() { &jinja } else { &cfg_path }
            .display()
            .to_string();
        let source = if jinja.exists() {
            std::fs::read_to_string(&jinja)
                .with_context(|| format!("cannot read {}", jinja.display()))?
        } else {
            match cfg.get("chat_template") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(list)) => list
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                    .and_then(|t| t.get("template"))
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .with_context(|| {
                        format!("{}: no `default` chat template", cfg_path.display())
                    })?,
                _ => bail!(
                    "{} has no chat template (no chat_template.jinja, no `chat_template` in \
                     tokenizer_config.json): use the raw prompt template",
                    dir.display()
                ),
            }
        };
        let token = |k: &str| match cfg.get(k) {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Object(o)) => o.get("content").and_then(Value::as_str).map(str::to_string),
            _ => None,
        };
        Ok(ChatTemplate {
            origin,
            source,
            bos_token: token("bos_token"),
            eos_token: token("eos_token"),
        })
    }

    /// The environment with this template added as `chat`, set up as transformers renders.
    fn env(&self) -> Result<minijinja::Environment<'_>> {
        let mut env = bounded_env();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| anyhow!("{e}"))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_template("chat", &self.source)
            .map_err(|e| anyhow!("the chat template of {} does not parse: {e}", self.origin))?;
        Ok(env)
    }

    /// Whether the template parses (what rendering would first fail on), naming its file.
    pub fn check_syntax(&self) -> Result<()> {
        self.env().map(|_| ())
    }

    /// Renders `messages`; `enable_thinking: None` leaves the variable undefined, as transformers
    /// does when it is not passed.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        enable_thinking: Option<bool>,
    ) -> Result<String> {
        let env = self.env()?;
        let tmpl = env.get_template("chat").map_err(|e| anyhow!("{e}"))?;
        let mut ctx = serde_json::Map::new();
        ctx.insert("messages".into(), serde_json::to_value(messages)?);
        ctx.insert(
            "add_generation_prompt".into(),
            Value::Bool(add_generation_prompt),
        );
        if let Some(t) = enable_thinking {
            ctx.insert("enable_thinking".into(), Value::Bool(t));
        }
        if let Some(b) = &self.bos_token {
            ctx.insert("bos_token".into(), Value::String(b.clone()));
        }
        if let Some(e) = &self.eos_token {
            ctx.insert("eos_token".into(), Value::String(e.clone()));
        }
        tmpl.render(minijinja::value::Serde(&ctx))
            .map_err(|e| render_error(&format!("the chat template of {}", self.origin), e))
    }
}

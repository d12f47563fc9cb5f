//! Where problems come from and how their fields map: dataset formats as field-map presets,
//! local paths and `hf://` hub locations.
//!
//! Plain data plus parsing; reading files is `records`, downloading is `hub`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A dataset's published format. Each is a preset of field names over JSONL or Parquet rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceFormat {
    /// `question`, `answer` (solution ending in `#### N`, with `<<a*b=c>>` annotations).
    Gsm8k,
    /// MATH / MATH-500: `problem`, `solution` (answer in `\boxed{}`), `answer`, `unique_id`.
    Math,
    /// AIME: `id`, `problem`, `answer` (an integer string), `solution`.
    Aime,
    /// AMC: `id`, `problem` or `question`, `answer` (a JSON number such as 27.0).
    Amc,
    /// Our arithmetic generator's JSONL (`pipeline data arith`): `id`, `level`, `problem`,
    /// `solution`, `answer`.
    Arith,
    /// Any JSONL or Parquet: `problem_field` and `answer_field` are given in the config.
    Mapped,
}

/// How the gold answer is read from its field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnswerExtract {
    /// The field is the answer.
    Field,
    /// The answer follows the last `####` (GSM8K).
    Hash,
    /// The answer is the last `\boxed{}` of the field (a MATH solution).
    Boxed,
}

/// Field names of one source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldMap {
    /// A native id field; without one the id is a hash of the problem text.
    pub id: Option<String>,
    /// Problem text fields, the first present one wins.
    pub problem: Vec<String>,
    pub answer: Option<String>,
    pub answer_extract: AnswerExtract,
    pub solution: Option<String>,
    pub subject: Option<String>,
    pub level: Option<String>,
}

impl FieldMap {
    pub fn preset(format: SourceFormat) -> FieldMap {
        let s = |x: &str| Some(x.to_string());
        let v = |xs: &[&str]| xs.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let base = FieldMap {
            id: None,
            problem: vec![],
            answer: None,
            answer_extract: AnswerExtract::Field,
            solution: None,
            subject: None,
            level: None,
        };
        match format {
            SourceFormat::Gsm8k => FieldMap {
                problem: v(&["question"]),
                answer: s("answer"),
                answer_extract: AnswerExtract::Hash,
                solution: s("answer"),
                ..base
            },
            SourceFormat::Math => FieldMap {
                id: s("unique_id"),
                problem: v(&["problem"]),
                answer: s("answer"),
                solution: s("solution"),
                subject: s("subject"),
                level: s("level"),
                ..base
            },
            SourceFormat::Aime => FieldMap {
                id: s("id"),
                problem: v(&["problem", "question"]),
                answer: s("answer"),
                solution: s("solution"),
                ..base
            },
            SourceFormat::Amc => FieldMap {
                id: s("id"),
                problem: v(&["problem", "question"]),
                answer: s("answer"),
                ..base
            },
            SourceFormat::Arith => FieldMap {
                id: s("id"),
                problem: v(&["problem"]),
                answer: s("answer"),
                solution: s("solution"),
                level: s("level"),
                ..base
            },
            SourceFormat::Mapped => base,
        }
    }
}

/// A file on disk or on the Hugging Face hub.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Location {
    Local(PathBuf),
    /// `hf://owner/name[@revision][/path/in/repo]`; without a path, `split` picks the files.
    Hub {
        repo: String,
        revision: Option<String>,
        file: Option<String>,
        split: Option<String>,
    },
}

impl Location {
    /// Parses a config path: `hf://...` or a local path relative to `base`.
    pub fn parse(text: &str, base: &Path, split: Option<&str>) -> Result<Location, String> {
        let Some(rest) = text.strip_prefix("hf://") else {
            if text.trim().is_empty() {
                return Err("empty path".into());
            }
            if split.is_some() {
                return Err("`split` applies only to hf:// sources".into());
            }
            return Ok(Location::Local(resolve(base, text)));
        };
        let rest = rest.strip_prefix("datasets/").unwrap_or(rest);
        let mut parts = rest.splitn(3, '/');
        let (owner, name) = match (parts.next(), parts.next()) {
            (Some(o), Some(n)) if !o.is_empty() && !n.is_empty() => (o, n),
            _ => return Err(format!("`{text}` is not hf://owner/name[/file]")),
        };
        let (name, revision) = match name.split_once('@') {
            Some((n, r)) => (n, Some(r.to_string())),
            None => (name, None),
        };
        let file = parts.next().filter(|f| !f.is_empty()).map(str::to_string);
        if file.is_none() && split.is_none() {
            return Err(format!(
                "`{text}` names a whole repo: add the file (hf://{owner}/{name}/path/to/file.parquet) \
                 or `split = \"test\"`"
            ));
        }
        Ok(Location::Hub {
            repo: format!("{owner}/{name}"),
            revision,
            file,
            split: split.map(str::to_string),
        })
    }

    pub fn describe(&self) -> String {
        match self {
            Location::Local(p) => p.display().to_string(),
            Location::Hub {
                repo,
                revision,
                file,
                split,
            } => {
                let rev = revision
                    .as_deref()
                    .map(|r| format!("@{r}"))
                    .unwrap_or_default();
                match (file, split) {
                    (Some(f), _) => format!("hf://{repo}{rev}/{f}"),
                    (None, Some(s)) => format!("hf://{repo}{rev} (split {s})"),
                    (None, None) => format!("hf://{repo}{rev}"),
                }
            }
        }
    }
}

/// One configured source of problems.
#[derive(Debug, Clone, Serialize)]
pub struct SourceSpec {
    pub name: String,
    pub format: SourceFormat,
    pub location: Location,
    pub fields: FieldMap,
    pub limit: Option<usize>,
    /// A source that gives no problems is an error (an empty or wrong file, almost always)
    /// unless this is set. Left out of the serialised form unless set, so stage keys stand.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub allow_empty: bool,
}

/// A source table as written (`[[data.sources]]`, an eval set's `[source]`, `[pretrain.source]`),
/// before validation.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSource {
    pub name: String,
    pub format: SourceFormat,
    pub path: String,
    pub split: Option<String>,
    pub limit: Option<usize>,
    pub id_field: Option<String>,
    pub problem_field: Option<String>,
    pub answer_field: Option<String>,
    pub answer_extract: Option<AnswerExtract>,
    pub solution_field: Option<String>,
    #[serde(default)]
    pub allow_empty: bool,
}

impl RawSource {
    /// The validated source; errors name `origin` (the file) and `key` (the table).
    pub fn validate(self, key: &str, base: &Path, origin: &str) -> Result<SourceSpec, String> {
        let s = self;
        if s.name.is_empty() || s.name.contains(['/', ' ']) {
            return Err(format!(
                "{origin}: `{key}.name`: must be non-empty, without '/' or spaces"
            ));
        }
        let mut fields = FieldMap::preset(s.format);
        if let Some(f) = s.id_field {
            fields.id = Some(f);
        }
        if let Some(f) = s.problem_field {
            fields.problem = vec![f];
        }
        if let Some(f) = s.answer_field {
            fields.answer = Some(f);
        }
        if let Some(a) = s.answer_extract {
            fields.answer_extract = a;
        }
        if let Some(f) = s.solution_field {
            fields.solution = Some(f);
        }
        if s.format == SourceFormat::Mapped
            && (fields.problem.is_empty() || fields.answer.is_none())
        {
            return Err(format!(
                "{origin}: `{key}`: format = \"mapped\" needs `problem_field` and `answer_field`"
            ));
        }
        if s.limit == Some(0) {
            return Err(format!(
                "{origin}: `{key}.limit`: 0 reads no problem: give 1 or more, or leave it out for \
                 every row"
            ));
        }
        let location = Location::parse(&s.path, base, s.split.as_deref())
            .map_err(|e| format!("{origin}: `{key}.path`: {e}"))?;
        Ok(SourceSpec {
            name: s.name,
            format: s.format,
            location,
            fields,
            limit: s.limit,
            allow_empty: s.allow_empty,
        })
    }
}

/// A source table parsed from TOML (an eval set's `[source]`): the keys of `[[data.sources]]`.
pub fn source_from_toml(
    value: toml::Value,
    key: &str,
    base: &Path,
    origin: &str,
) -> Result<SourceSpec, String> {
    let raw: RawSource = value
        .try_into()
        .map_err(|e| format!("{origin}: `{key}`: {e}"))?;
    raw.validate(key, base, origin)
}

/// A path from a config: absolute as is, relative against the config file's folder.
pub fn resolve(base: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_locations_parse() {
        let b = Path::new("/x");
        assert_eq!(
            Location::parse(
                "hf://openai/gsm8k/main/test-00000-of-00001.parquet",
                b,
                None
            ),
            Ok(Location::Hub {
                repo: "openai/gsm8k".into(),
                revision: None,
                file: Some("main/test-00000-of-00001.parquet".into()),
                split: None
            })
        );
        let l = Location::parse("hf://openai/gsm8k@abc", b, Some("test")).unwrap();
        assert_eq!(l.describe(), "hf://openai/gsm8k@abc (split test)");
        assert!(Location::parse("hf://openai/gsm8k", b, None).is_err());
        assert!(Location::parse("hf://openai", b, None).is_err());
        assert!(Location::parse("a.jsonl", b, Some("test")).is_err());
    }
}

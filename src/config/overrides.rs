//! `--set KEY=VALUE`: config keys overridden from the command line, validated like the file.
//!
//! The file is validated alone first (its errors name its lines); then each override is set in
//! the file's TOML table (`train.lr`, `sample.n`, `data.sources.0.limit`: dotted, a number picks
//! an element of an array of tables; a missing table is created) and the result validated
//! again, so an unknown key or a wrong type names the `--set` that brought it. The value is read
//! as a TOML value (`2e-5`, `16`, `true`, `[1, 2]`, `"text"`), else taken as a string
//! (`--set sample.model=Qwen/Qwen3-4B`). The config that results is the one the file would give
//! with the keys written in it: stage keys are the same.
//!
//! Knows nothing of the keys' meanings; [`super::Config::from_toml`] checks them.

use std::path::{Path, PathBuf};

use super::{Config, ConfigError};

/// One parsed `--set`.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// As typed.
    pub text: String,
    pub path: Vec<String>,
    pub value: toml::Value,
}

impl Override {
    pub fn parse(text: &str) -> Result<Override, ConfigError> {
        let err = |m: &str| ConfigError(format!("--set {text}: {m}"));
        let (key, value) = text
            .split_once('=')
            .ok_or_else(|| err("expected KEY=VALUE, e.g. --set train.lr=2e-5"))?;
        let key = key.trim();
        if key.is_empty() || key.split('.').any(str::is_empty) {
            return Err(err("the key is empty or has an empty part"));
        }
        let value = value.trim();
        let value = match toml::from_str::<toml::Table>(&format!("v = {value}")) {
            Ok(mut t) => t.remove("v").expect("parsed"),
            Err(_) => toml::Value::String(value.to_string()),
        };
        Ok(Override {
            text: text.to_string(),
            path: key.split('.').map(str::to_string).collect(),
            value,
        })
    }

    /// Sets the value in `table`, creating missing tables.
    fn apply(&self, table: &mut toml::Table) -> Result<(), String> {
        let (last, parents) = self.path.split_last().expect("non-empty");
        let mut at = table;
        let mut walked = Vec::new();
        for part in parents {
            walked.push(part.as_str());
            let here = walked.join(".");
            let next = at
                .entry(part.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            at = match next {
                toml::Value::Table(t) => t,
                toml::Value::Array(items) => {
                    return Err(format!(
                        "`{here}` is a list ({} entries): name an entry by its number, e.g. \
                         `{here}.0.{last}`",
                        items.len()
                    ));
                }
                _ => return Err(format!("`{here}` is a value, not a table")),
            };
        }
        at.insert(last.clone(), self.value.clone());
        Ok(())
    }
}

/// Walks a path whose parts may index arrays of tables (`data.sources.0.limit`).
fn set(table: &mut toml::Table, o: &Override) -> Result<(), String> {
    // split the path at its first numeric part, if any
    match o.path.iter().position(|p| p.parse::<usize>().is_ok()) {
        None => o.apply(table),
        Some(i) if i == 0 || i + 1 == o.path.len() => Err(format!(
            "`{}`: a number names an entry of a list of tables, between its name and a key",
            o.path.join(".")
        )),
        Some(i) => {
            let list = o.path[..i].join(".");
            let mut at: &mut toml::Table = table;
            for part in &o.path[..i - 1] {
                at = match at.get_mut(part) {
                    Some(toml::Value::Table(t)) => t,
                    _ => return Err(format!("`{list}` is not in the config")),
                };
            }
            let n: usize = o.path[i].parse().expect("numeric");
            let entry = match at.get_mut(&o.path[i - 1]) {
                Some(toml::Value::Array(items)) => {
                    let len = items.len();
                    match items.get_mut(n) {
                        Some(toml::Value::Table(t)) => t,
                        Some(_) => return Err(format!("`{list}.{n}` is not a table")),
                        None => {
                            return Err(format!("`{list}` has {len} entries (0..{len}), not {n}"))
                        }
                    }
                }
                _ => return Err(format!("`{list}` is not a list of tables in the config")),
            };
            let rest = Override {
                path: o.path[i + 1..].to_vec(),
                ..o.clone()
            };
            rest.apply(entry)
        }
    }
}

impl Config {
    /// [`Config::embedded_default`] with `--set` overrides.
    pub fn embedded_default_with(sets: &[String]) -> Result<Config, ConfigError> {
        let (text, origin, base, name) = Config::embedded_source()?;
        config_with(text, origin, &base, name, sets)
    }

    /// [`Config::load`] with `--set` overrides.
    pub fn load_with(path: &Path, sets: &[String]) -> Result<Config, ConfigError> {
        let (text, origin, base, stem) = Config::file_source(path)?;
        config_with(&text, &origin, &base, &stem, sets)
    }
}

/// The config of `text` with the overrides, each validated in turn; its `overrides` hold them.
pub fn config_with(
    text: &str,
    origin: &str,
    base: &Path,
    default_name: &str,
    sets: &[String],
) -> Result<Config, ConfigError> {
    let mut cfg = Config::from_toml(text, origin, base, default_name)?;
    if sets.is_empty() {
        return Ok(cfg);
    }
    let mut table: toml::Table =
        toml::from_str(text).map_err(|e| ConfigError(format!("{origin}: {e}")))?;
    for s in sets {
        let o = Override::parse(s)?;
        set(&mut table, &o).map_err(|e| ConfigError(format!("--set {s}: {e}")))?;
        let merged = toml::to_string(&table)
            .map_err(|e| ConfigError(format!("--set {s}: cannot write the config: {e}")))?;
        let label = format!("--set {s}");
        cfg = Config::from_toml(&merged, &label, base, default_name).map_err(|e| {
            // the merged text's line numbers mean nothing to the user
            let msg = e.0;
            let msg = match msg.strip_prefix(&label) {
                Some(rest) => {
                    let rest = rest.trim_start_matches(|c: char| c == ':' || c.is_ascii_digit());
                    format!("{label} (over {origin}): {}", rest.trim_start())
                }
                None => format!("{label} (over {origin}): {msg}"),
            };
            ConfigError(msg)
        })?;
    }
    cfg.origin = format!("{origin} with --set {}", sets.join(" --set "));
    cfg.overrides = sets.to_vec();
    Ok(cfg)
}

/// The work dir of a run with overrides (when `--workdir` does not name one): the config's,
/// with the overrides in its name, so that variants of one config never share a work dir.
pub fn workdir_with(workdir: &Path, sets: &[String]) -> PathBuf {
    if sets.is_empty() {
        return workdir.to_path_buf();
    }
    let mut name = workdir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "run".into());
    for s in sets {
        name.push('+');
        name.extend(s.chars().map(|c| {
            if c.is_alphanumeric() || "=.-_,".contains(c) {
                c
            } else {
                '_'
            }
        }));
    }
    if name.chars().count() > 120 {
        let hash = crate::store::hash_json(&serde_json::json!(sets));
        name = format!(
            "{}+{}",
            name.chars().take(100).collect::<String>(),
            &hash[..8]
        );
    }
    workdir.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "[run]\nname = \"t\"\n[[data.sources]]\nname = \"m\"\nformat = \"math\"\n\
                        path = \"m.jsonl\"\n[filter]\nmax_per_problem = 2\n\
                        [filter.completions]\npath = \"c.parquet\"\n";

    fn cfg(sets: &[&str]) -> Result<Config, ConfigError> {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        config_with(FILE, "t.toml", Path::new("/cfg"), "t", &sets)
    }

    #[test]
    fn an_override_is_the_key_written_in_the_file() {
        let c = cfg(&[
            "filter.max_per_problem=5",
            "data.sources.0.limit=7",
            "filter.dedup=exact",
        ])
        .unwrap();
        let written = FILE
            .replace(
                "max_per_problem = 2",
                "max_per_problem = 5\ndedup = \"exact\"",
            )
            .replace("path = \"m.jsonl\"", "path = \"m.jsonl\"\nlimit = 7");
        let w = Config::from_toml(&written, "t.toml", Path::new("/cfg"), "t").unwrap();
        let json = |c: &Config| {
            (
                serde_json::to_value(c.filter.as_ref().unwrap()).unwrap(),
                serde_json::to_value(c.data.as_ref().unwrap()).unwrap(),
            )
        };
        assert_eq!(json(&c), json(&w));
        assert_eq!(c.overrides.len(), 3);
        assert!(
            c.origin.contains("with --set filter.max_per_problem=5"),
            "{}",
            c.origin
        );
    }

    #[test]
    fn bad_overrides_name_the_set() {
        for (set, want) in [
            ("filter.max_per_problm=5", "--set filter.max_per_problm=5 (over t.toml): unknown key `max_per_problm` in [filter]; did you mean `max_per_problem`?"),
            ("filter.max_per_problem=many", "--set filter.max_per_problem=many (over t.toml): invalid type"),
            ("filter.max_per_problem", "--set filter.max_per_problem: expected KEY=VALUE"),
            ("data.sources.3.limit=1", "`data.sources` has 1 entries (0..1), not 3"),
            ("data.sources.limit=1", "`data.sources` is a list (1 entries): name an entry by its number"),
            ("run.name.x=1", "`run.name` is a value, not a table"),
            ("=1", "the key is empty"),
        ] {
            let e = cfg(&[set]).unwrap_err().0;
            assert!(e.contains(want), "{set}: {e}");
        }
    }

    #[test]
    fn values_read_as_toml_else_as_text() {
        let o = Override::parse("sample.model=Qwen/Qwen3-4B").unwrap();
        assert_eq!(o.value, toml::Value::String("Qwen/Qwen3-4B".into()));
        assert_eq!(
            Override::parse("train.lr=2e-5").unwrap().value,
            toml::Value::Float(2e-5)
        );
        assert_eq!(
            Override::parse("sample.n = 16").unwrap().value,
            toml::Value::Integer(16)
        );
        assert_eq!(
            workdir_with(
                Path::new("runs/t"),
                &["train.lr=2e-5".into(), "sample.model=a/b".into()]
            ),
            PathBuf::from("runs/t+train.lr=2e-5+sample.model=a_b")
        );
        assert_eq!(
            workdir_with(Path::new("runs/t"), &[]),
            PathBuf::from("runs/t")
        );
    }
}

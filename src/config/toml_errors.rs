//! TOML errors phrased for a person: the line and column of a key or of serde's error, the
//! section it sits in, and the closest valid key for a misspelled one. Knows nothing of what
//! the sections mean.

use super::*;

/// Reads a section the raw parse kept as a table: [`SampleSettings`] flattens the sampling
/// parameters in, and serde's errors from inside a flattened struct name neither the key nor
/// its line. `read` names the key; this finds its line.
pub(super) fn read_section<T>(
    text: &str,
    origin: &str,
    section: &str,
    t: &toml::Table,
    read: impl Fn(&toml::Table) -> Result<T, KeyError>,
) -> Result<T, ConfigError> {
    read(t).map_err(|e| {
        let at = match e.key().and_then(|k| key_position(text, section, k)) {
            Some((line, col)) => format!("{origin}:{line}:{col}: "),
            None => format!("{origin}: "),
        };
        ConfigError(match &e {
            KeyError::Value {
                key: Some(k),
                message,
            } => format!("{at}`{section}.{k}`: {message}"),
            KeyError::Value { key: None, message } => format!("{at}[{section}]: {message}"),
            KeyError::Unknown { .. } => format!("{at}{}", e.reason_in(Some(section))),
        })
    })
}

/// Where `key` is set in the `[section]` of `text`: (line, column), from 1.
pub(super) fn key_position(text: &str, section: &str, key: &str) -> Option<(usize, usize)> {
    let mut inside = false;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with('[') {
            inside = header_name(t).as_deref() == Some(section);
            continue;
        }
        let name = t.split('=').next().unwrap_or("").trim().trim_matches('"');
        if inside && t.contains('=') && name == key {
            return Some((i + 1, line.len() - t.len() + 1));
        }
    }
    None
}

/// Rewrites a TOML/serde error as `file:line:col: message`, adding the closest valid key or value.
pub(super) fn toml_error(text: &str, origin: &str, e: &toml::de::Error) -> ConfigError {
    let (line, col) = e.span().map(|s| line_col(text, s.start)).unwrap_or((0, 0));
    let msg = plain_message(e.message().trim());
    let section = e.span().and_then(|s| enclosing_table(text, s.start));
    let mut out = if line > 0 {
        format!("{origin}:{line}:{col}: ")
    } else {
        format!("{origin}: ")
    };
    if let Some((bad, valid)) = parse_unknown(&msg) {
        let what = if msg.starts_with("unknown variant") {
            "value"
        } else {
            "key"
        };
        out.push_str(&format!("unknown {what} `{bad}`"));
        if let Some(sec) = section {
            out.push_str(&format!(" in [{sec}]"));
        }
        if let Some(best) = closest(&bad, &valid) {
            out.push_str(&format!("; did you mean `{best}`?"));
        }
        out.push_str(&format!(" (valid: {})", valid.join(", ")));
    } else {
        out.push_str(&msg);
        if let Some(sec) = section {
            out.push_str(&format!(" (in [{sec}])"));
        }
    }
    ConfigError(out)
}

/// A serde message in a config writer's words: serde names the Rust type it wanted
/// ("expected struct TrainSettings"), which a config writer never wrote; it wanted a table.
pub fn plain_message(msg: &str) -> String {
    const STRUCT: &str = "expected struct ";
    let mut out = msg.to_string();
    while let Some(i) = out.find(STRUCT) {
        let rest = &out[i + STRUCT.len()..];
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        out.replace_range(i..i + STRUCT.len() + end, "expected a table of keys");
    }
    out
}

/// From serde's "unknown field `x`, expected one of `a`, `b`" takes `x` and `[a, b]`.
pub(super) fn parse_unknown(msg: &str) -> Option<(String, Vec<String>)> {
    let rest = msg
        .strip_prefix("unknown field ")
        .or_else(|| msg.strip_prefix("unknown variant "))?;
    let mut ticks = rest.split('`').skip(1).step_by(2).map(str::to_string);
    let bad = ticks.next()?;
    Some((bad, ticks.collect()))
}

pub(super) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let col = before.rfind('\n').map(|i| offset - i).unwrap_or(offset + 1);
    (line, col)
}

/// The table that holds the key at `offset`: the nearest `[table]` / `[[array]]` header above
/// its line, or, when the key is itself in a header (`[filtr]`, `[filter.completionz]`), the
/// header's parent (`None` at the top level).
pub(super) fn enclosing_table(text: &str, offset: usize) -> Option<String> {
    let before = text.get(..offset)?;
    let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
    let line = text.get(line_start..)?.lines().next().unwrap_or("");
    if let Some(name) = header_name(line) {
        return name.rsplit_once('.').map(|(parent, _)| parent.to_string());
    }
    text.get(..line_start)?.lines().rev().find_map(header_name)
}

pub(super) fn header_name(line: &str) -> Option<String> {
    let t = line.trim();
    t.strip_prefix("[[")
        .and_then(|r| r.split("]]").next())
        .or_else(|| t.strip_prefix('[').and_then(|r| r.split(']').next()))
        .map(|s| s.trim().to_string())
}

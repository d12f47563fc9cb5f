//! Byte sizes: parsing "40 GiB" / "500MB" from configs and printing sizes for people; and the
//! one reader of a settings file (a config, a spec, a template) that refuses what is not a regular
//! file or is larger than any such file can be (`--config /dev/zero` would read forever).
//!
//! Parsing is strict on purpose: a typo in a disk size ("40 GiBB", "4O GB") is an error that names
//! the accepted units, never a silent zero. Knows nothing of where the size came from; callers add
//! the file and key to the error.

use std::path::Path;

use thiserror::Error;

#[derive(Debug, Error, PartialEq)]
pub enum ByteSizeError {
    #[error("empty size")]
    Empty,
    #[error("`{0}` has no number in front (e.g. \"40 GiB\")")]
    NoNumber(String),
    #[error(
        "`{value}` has an unknown unit `{unit}`; use one of B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"
    )]
    UnknownUnit { value: String, unit: String },
    #[error("`{0}` is too large")]
    Overflow(String),
}

const UNITS: &[(&str, u64)] = &[
    ("b", 1),
    ("kb", 1_000),
    ("mb", 1_000_000),
    ("gb", 1_000_000_000),
    ("tb", 1_000_000_000_000),
    ("k", 1 << 10),
    ("kib", 1 << 10),
    ("m", 1 << 20),
    ("mib", 1 << 20),
    ("g", 1 << 30),
    ("gib", 1 << 30),
    ("t", 1 << 40),
    ("tib", 1 << 40),
];

/// Parses "40 GiB", "1.5TB", "512MiB", "1000" (bytes).
pub fn parse_bytes(text: &str) -> Result<u64, ByteSizeError> {
    let s = text.trim();
    if s.is_empty() {
        return Err(ByteSizeError::Empty);
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let num = num.replace('_', "");
    if num.is_empty() {
        return Err(ByteSizeError::NoNumber(s.to_string()));
    }
    let value: f64 = num
        .parse()
        .map_err(|_| ByteSizeError::NoNumber(s.to_string()))?;
    let unit_lc = unit.trim().to_ascii_lowercase();
    let mult = if unit_lc.is_empty() {
        1
    } else {
        UNITS
            .iter()
            .find(|(u, _)| *u == unit_lc)
            .map(|(_, m)| *m)
            .ok_or_else(|| ByteSizeError::UnknownUnit {
                value: s.to_string(),
                unit: unit.trim().to_string(),
            })?
    };
    let bytes = value * mult as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(ByteSizeError::Overflow(s.to_string()));
    }
    Ok(bytes.round() as u64)
}

/// A size as a person wrote it ("4 GiB"), parsed once where it enters: its bytes, and the text
/// it prints and serialises as (a config's stage key keeps the spelling).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ByteSize {
    text: String,
    bytes: u64,
}

impl ByteSize {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl std::str::FromStr for ByteSize {
    type Err = ByteSizeError;

    fn from_str(text: &str) -> Result<Self, ByteSizeError> {
        Ok(ByteSize {
            text: text.to_string(),
            bytes: parse_bytes(text)?,
        })
    }
}

impl std::fmt::Display for ByteSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl serde::Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> serde::Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The largest settings file read ([`read_settings_file`]): a config, an eval set's definition,
/// a spec or a chat template. The shipped ones are under 20 KiB.
pub const MAX_SETTINGS_FILE: u64 = 4 << 20;

/// `path` is a regular file (a directory, pipe, socket or device is refused, naming the path and
/// what it is): a FIFO or device would block a read forever, a directory reads as an endless
/// error. Returns its size.
pub fn regular_file(path: &Path) -> anyhow::Result<u64> {
    let meta = std::fs::metadata(path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    if meta.is_file() {
        return Ok(meta.len());
    }
    let what = if meta.is_dir() {
        "a directory, not a file"
    } else {
        "not a regular file (a pipe, socket or device cannot be read whole or twice)"
    };
    anyhow::bail!("{}: {what}; give a file", path.display())
}

/// A settings file's text (`what` names it in errors: "config", "spec"): a regular file of at
/// most [`MAX_SETTINGS_FILE`] bytes, in UTF-8.
pub fn read_settings_file(path: &Path, what: &str) -> anyhow::Result<String> {
    let len = regular_file(path).map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
    if len > MAX_SETTINGS_FILE {
        anyhow::bail!(
            "{what} {} is {}, larger than any settings file ({} at most): is it the right file?",
            path.display(),
            format_bytes(len),
            format_bytes(MAX_SETTINGS_FILE)
        );
    }
    // read through a limit too: a file that grows after the size check is cut, not read forever
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_SETTINGS_FILE + 1).read_to_string(&mut text))
        .map_err(|e| anyhow::anyhow!("cannot read {what} {}: {e}", path.display()))?;
    if text.len() as u64 > MAX_SETTINGS_FILE {
        anyhow::bail!(
            "{what} {} grew past {} while read",
            path.display(),
            format_bytes(MAX_SETTINGS_FILE)
        );
    }
    Ok(text)
}

/// "1.5 GiB", "312 KiB", "17 B".
pub fn format_bytes(n: u64) -> String {
    const STEPS: &[&str] = &["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < STEPS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", STEPS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_files_are_regular_and_small() {
        let dir = tempfile::tempdir().unwrap();
        let e = read_settings_file(dir.path(), "config")
            .unwrap_err()
            .to_string();
        assert!(e.contains(": a directory, not a file"), "{e}");
        let e = read_settings_file(Path::new("/dev/zero"), "config")
            .unwrap_err()
            .to_string();
        assert!(e.contains("/dev/zero: not a regular file"), "{e}");
        let big = dir.path().join("big.toml");
        std::fs::write(&big, vec![b'#'; MAX_SETTINGS_FILE as usize + 1]).unwrap();
        let e = read_settings_file(&big, "config").unwrap_err().to_string();
        assert!(e.contains("larger than any settings file"), "{e}");
        let ok = dir.path().join("ok.toml");
        std::fs::write(&ok, "a = 1\n").unwrap();
        assert_eq!(read_settings_file(&ok, "config").unwrap(), "a = 1\n");
        let e = read_settings_file(&dir.path().join("none"), "config").unwrap_err();
        assert!(e.to_string().starts_with("config: cannot read"), "{e}");
    }

    #[test]
    fn parses_units() {
        assert_eq!(parse_bytes("40 GiB"), Ok(40 << 30));
        assert_eq!(parse_bytes("1.5TB"), Ok(1_500_000_000_000));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1000"), Ok(1000));
        assert_eq!(parse_bytes("2g"), Ok(2 << 30));
    }

    #[test]
    fn typos_in_disk_sizes_are_errors() {
        assert!(matches!(
            parse_bytes("40 GiBB"),
            Err(ByteSizeError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_bytes("4O GB"),
            Err(ByteSizeError::UnknownUnit { .. })
        ));
        assert!(matches!(parse_bytes("GB"), Err(ByteSizeError::NoNumber(_))));
        assert_eq!(parse_bytes(""), Err(ByteSizeError::Empty));
    }

    #[test]
    fn formats() {
        assert_eq!(format_bytes(17), "17 B");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(3 << 30), "3.0 GiB");
    }
}

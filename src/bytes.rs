//! Byte sizes: parsing "40 GiB" / "500MB" from configs and printing sizes for people.
//!
//! Parsing is strict on purpose: a typo in a disk size ("40 GiBB", "4O GB") is an error that names
//! the accepted units, never a silent zero. Knows nothing of where the size came from; callers add
//! the file and key to the error.

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

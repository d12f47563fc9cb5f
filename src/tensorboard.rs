//! TensorBoard event files, written by us (no kept crate writes the format): TFRecord framing
//! (length, masked CRC32C of the length, the record, masked CRC32C of the record) around
//! `tensorflow.Event` protos, the first holding `file_version = "brain.Event:2"`, each other a
//! `Summary` of one `simple_value` scalar.
//!
//! A writer rewrites its whole file from the scalars it is given (atomically), so a resumed
//! stage writes the same file again rather than appending steps twice. `tensorboard --logdir
//! runs/` shows every run and stage side by side; `wandb sync --sync-tensorboard` takes them to
//! W&B. Knows nothing of what the scalars mean.

use std::path::{Path, PathBuf};

use anyhow::Result;

/// The event file's name in its folder (one file per folder).
pub const FILE: &str = "events.out.tfevents.0.selfdistill";

/// One scalar at one step.
#[derive(Debug, Clone, PartialEq)]
pub struct Scalar {
    pub tag: String,
    pub step: i64,
    pub value: f64,
    /// Seconds since the Unix epoch.
    pub wall_time: f64,
}

/// CRC32C (Castagnoli), bitwise: event files are small.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// TFRecord's masked CRC.
fn masked_crc(data: &[u8]) -> u32 {
    let c = crc32c(data);
    (c.rotate_right(15)).wrapping_add(0xa282_ead8)
}

fn varint(buf: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            buf.push(b);
            return;
        }
        buf.push(b | 0x80);
    }
}

/// A length-delimited field.
fn bytes_field(buf: &mut Vec<u8>, field: u32, data: &[u8]) {
    varint(buf, ((field << 3) | 2) as u64);
    varint(buf, data.len() as u64);
    buf.extend_from_slice(data);
}

/// An `Event` with `wall_time`, `step` and either `file_version` or a one-value `Summary`.
fn event(wall_time: f64, step: i64, what: Option<(&str, f32)>) -> Vec<u8> {
    let mut e = Vec::new();
    varint(&mut e, (1 << 3) | 1); // double wall_time = 1
    e.extend_from_slice(&wall_time.to_le_bytes());
    varint(&mut e, 2 << 3); // int64 step = 2
    varint(&mut e, step as u64);
    match what {
        None => bytes_field(&mut e, 3, b"brain.Event:2"), // string file_version = 3
        Some((tag, value)) => {
            let mut v = Vec::new();
            bytes_field(&mut v, 1, tag.as_bytes()); // string tag = 1
            varint(&mut v, (2 << 3) | 5); // float simple_value = 2
            v.extend_from_slice(&value.to_le_bytes());
            let mut summary = Vec::new();
            bytes_field(&mut summary, 1, &v); // repeated Value value = 1
            bytes_field(&mut e, 5, &summary); // Summary summary = 5
        }
    }
    e
}

fn record(out: &mut Vec<u8>, data: &[u8]) {
    let len = (data.len() as u64).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
}

/// The bytes of an event file holding `scalars`.
pub fn encode(scalars: &[Scalar]) -> Vec<u8> {
    let mut out = Vec::new();
    let start = scalars.first().map_or(0.0, |s| s.wall_time);
    record(&mut out, &event(start, 0, None));
    for s in scalars {
        record(
            &mut out,
            &event(s.wall_time, s.step, Some((&s.tag, s.value as f32))),
        );
    }
    out
}

/// Writes `dir/FILE` with `scalars`, replacing what was there; returns its path.
pub fn write(dir: &Path, scalars: &[Scalar]) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(FILE);
    let bytes = encode(scalars);
    crate::store::commit_file(&path, |tmp| Ok(std::fs::write(tmp, &bytes)?))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_and_framing_match_the_references() {
        // RFC 3720's check value, and TensorFlow's masked CRC of an empty record
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        let bytes = encode(&[Scalar {
            tag: "train/loss".into(),
            step: 3,
            value: 1.5,
            wall_time: 100.0,
        }]);
        // two records: length, its crc, data, its crc
        let len0 = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        assert_eq!(
            u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
            masked_crc(&bytes[..8])
        );
        let data0 = &bytes[12..12 + len0];
        assert!(data0.ends_with(b"brain.Event:2"));
        let rest = &bytes[16 + len0..];
        let len1 = u64::from_le_bytes(rest[..8].try_into().unwrap()) as usize;
        assert_eq!(rest.len(), 16 + len1);
        assert!(rest[12..12 + len1].windows(10).any(|w| w == b"train/loss"));
    }
}

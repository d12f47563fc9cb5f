//! Content digests of big files (checkpoints): BLAKE3 over memory-mapped files on every core,
//! memoised on disk by what identifies one version of a file, so a folder is read once and not
//! on every `pipeline run`, `preflight` or `status`.
//!
//! A file's memo entry is keyed by its canonical path, device, inode, size, modification time
//! and status-change time (both in nanoseconds). Rewriting a file in place changes its times;
//! replacing it changes its inode; `touch -d` can set the modification time back but not the
//! change time. So a memo hit is the digest of the bytes that are there now. A file whose times
//! are under two seconds old is hashed but not memoised: file times tick coarsely, and a file
//! rewritten within one tick could otherwise keep the key of its old content.
//!
//! The memo lives in `$SELFDISTILL_CACHE_DIR`, else `$XDG_CACHE_HOME/selfdistill`, else
//! `~/.cache/selfdistill`, as one small file per entry (written to a temporary name, then
//! renamed, so concurrent runs never see half an entry). When no such folder can be written the
//! digests are computed every time, which is slower but never wrong.
//!
//! Knows nothing of what the files are.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use sha2::{Digest as _, Sha256};

/// The digest of a list of files, and how it was obtained.
#[derive(Debug, Clone)]
pub struct FilesDigest {
    /// BLAKE3 over each file's name and content digest, in the order given; hex.
    pub hex: String,
    /// Files read and hashed (not found in the memo).
    pub hashed_files: usize,
    /// Bytes read and hashed.
    pub hashed_bytes: u64,
    /// Files whose digest came from the memo.
    pub memo_hits: usize,
    /// Wall time of the whole call, in seconds.
    pub seconds: f64,
}

/// The memo folder, if one can be named (it is created on first write).
fn memo_dir() -> Option<PathBuf> {
    let non_empty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(d) = non_empty("SELFDISTILL_CACHE_DIR") {
        return Some(PathBuf::from(d).join("digests"));
    }
    let base = non_empty("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| non_empty("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("selfdistill").join("digests"))
}

/// The memo key of the version of `path` that `meta` describes.
fn memo_key(path: &Path, meta: &fs::Metadata) -> String {
    let id = serde_json::json!([
        path.display().to_string(),
        meta.dev(),
        meta.ino(),
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ctime(),
        meta.ctime_nsec(),
    ]);
    hex::encode(Sha256::digest(id.to_string().as_bytes()))
}

/// BLAKE3 of one file's content, hex: memory-mapped and hashed on every core when big.
pub fn hash_file_content(path: &Path) -> Result<String> {
    let mut h = blake3::Hasher::new();
    h.update_mmap_rayon(path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    Ok(h.finalize().to_hex().to_string())
}

/// One file's content digest, from the memo when this version of the file is in it. Returns the
/// digest and whether the file was read.
pub fn file_digest(path: &Path) -> Result<(String, bool)> {
    let canonical =
        fs::canonicalize(path).with_context(|| format!("cannot open {}", path.display()))?;
    let meta =
        fs::metadata(&canonical).with_context(|| format!("cannot open {}", path.display()))?;
    let entry = memo_dir().map(|d| {
        let key = memo_key(&canonical, &meta);
        d.join(&key[..2]).join(key)
    });
    if let Some(hex) = entry
        .as_ref()
        .and_then(|e| fs::read_to_string(e).ok())
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return Ok((hex, false));
    }
    let hex = hash_file_content(&canonical)?;
    // Memoise only the version that was keyed (the file may have changed while it was read),
    // and only once its times are safely in the past: file times tick in jiffies, so a file
    // rewritten within one tick of being hashed could keep its times (git's "racy clean").
    let unchanged = fs::metadata(&canonical)
        .is_ok_and(|m| memo_key(&canonical, &m) == memo_key(&canonical, &meta));
    let settled = [meta.modified(), Ok(ctime(&meta))]
        .into_iter()
        .all(|t| t.is_ok_and(|t| t.elapsed().is_ok_and(|age| age > RACY)));
    if let (Some(entry), true) = (entry, unchanged && settled) {
        let _ = write_entry(&entry, &hex); // a memo that cannot be written only costs time
    }
    Ok((hex, true))
}

/// How old a file's times must be for its digest to be memoised.
const RACY: std::time::Duration = std::time::Duration::from_secs(2);

fn ctime(meta: &fs::Metadata) -> std::time::SystemTime {
    let since = std::time::Duration::new(meta.ctime().max(0) as u64, meta.ctime_nsec() as u32);
    std::time::UNIX_EPOCH + since
}

fn write_entry(entry: &Path, hex: &str) -> std::io::Result<()> {
    let dir = entry.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        entry
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id()
    ));
    fs::write(&tmp, hex)?;
    fs::rename(&tmp, entry)
}

/// The digest of `files` (each one's name and content, in order). Says on stderr how long it
/// took when that was over a second, naming `what`.
pub fn files_digest(what: &str, files: &[PathBuf]) -> Result<FilesDigest> {
    let start = Instant::now();
    let mut all = blake3::Hasher::new();
    let (mut hashed_files, mut hashed_bytes, mut memo_hits) = (0, 0, 0);
    let size = |f: &PathBuf| fs::metadata(f).map(|m| m.len()).unwrap_or(0);
    let total: u64 = files.iter().map(size).sum();
    // a bar (or lines) only where hashing can take a while: the first run over big weights
    let mut tracker = (total > 256 << 20)
        .then(|| crate::progress::Tracker::new(format!("hash {what}"), "MB", Some(total >> 20)));
    for f in files {
        let (hex, hashed) = file_digest(f)?;
        if let Some(t) = tracker.as_mut() {
            t.inc(size(f) >> 20);
        }
        if hashed {
            hashed_files += 1;
            hashed_bytes += fs::metadata(f).map(|m| m.len()).unwrap_or(0);
        } else {
            memo_hits += 1;
        }
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        all.update(name.as_bytes());
        all.update(b"\0");
        all.update(hex.as_bytes());
        all.update(b"\n");
    }
    if let Some(t) = tracker {
        t.finish();
    }
    let seconds = start.elapsed().as_secs_f64();
    if seconds > 1.0 {
        tracing::info!(
            "hashed {what}: {hashed_files} files, {:.2} GB in {seconds:.1} s ({:.2} GB/s; remembered until they change)",
            hashed_bytes as f64 / 1e9,
            hashed_bytes as f64 / 1e9 / seconds
        );
    }
    Ok(FilesDigest {
        hex: all.finalize().to_hex().to_string(),
        hashed_files,
        hashed_bytes,
        memo_hits,
        seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The memo folder is process-wide (an environment variable): tests that use it share one.
    fn with_memo() {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            let d = std::env::temp_dir()
                .join(format!("selfdistill-digest-test-{}", std::process::id()));
            // SAFETY: set once, before any test of this module reads it.
            unsafe { std::env::set_var("SELFDISTILL_CACHE_DIR", &d) };
        });
    }

    /// Writes `bytes`, then waits until the file's times are old enough to be memoised.
    fn write_settled(path: &Path, bytes: &[u8]) {
        fs::write(path, bytes).unwrap();
        std::thread::sleep(RACY + std::time::Duration::from_millis(100));
    }

    #[test]
    fn same_sizes_different_bytes_differ_and_unchanged_files_come_from_the_memo() {
        with_memo();
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        fs::create_dir_all(&a).unwrap();
        fs::create_dir_all(&b).unwrap();
        let weights = vec![7u8; 3 << 20];
        let mut changed = weights.clone();
        changed[1 << 20] ^= 1;
        write_settled(&a.join("model.safetensors"), &weights);
        write_settled(&b.join("model.safetensors"), &changed);
        let da = files_digest("a", &[a.join("model.safetensors")]).unwrap();
        let db = files_digest("b", &[b.join("model.safetensors")]).unwrap();
        assert_ne!(da.hex, db.hex);
        assert_eq!((da.hashed_files, da.hashed_bytes), (1, 3 << 20));
        // Asked again: nothing is read, the digest is the same.
        let again = files_digest("a", &[a.join("model.safetensors")]).unwrap();
        assert_eq!((again.hashed_files, again.memo_hits), (0, 1));
        assert_eq!(again.hex, da.hex);
        // Rewritten in place with the same size: read again, and the new digest.
        fs::write(a.join("model.safetensors"), &changed).unwrap();
        let rewritten = files_digest("a", &[a.join("model.safetensors")]).unwrap();
        assert_eq!(rewritten.hashed_files, 1);
        assert_eq!(rewritten.hex, db.hex);
    }

    #[test]
    fn digest_is_blake3_of_the_content() {
        with_memo();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x");
        fs::write(&p, b"hello").unwrap();
        assert_eq!(
            hash_file_content(&p).unwrap(),
            blake3::hash(b"hello").to_hex().to_string()
        );
        assert!(file_digest(&dir.path().join("missing")).is_err());
    }
}

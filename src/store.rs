//! The work dir: one directory per stage, named by the stage's key; `manifest.json` written last
//! and atomically marks a stage done; a lock keeps two runs off one work dir.
//!
//! ```text
//! <workdir>/
//!   .lock                      held (flock) by the running `pipeline`, holds its pid@host
//!   plan.json                  the stages of the last run, in order (for `status`)
//!   stages/<stage>-<key16>/    key = hash(stage config, input keys, code version)
//!     progress.json            how far an unfinished stage got (rewritten atomically)
//!     ...outputs...            committed whole (temp file, fsync, rename)
//!     manifest.json            written last: the stage is done
//! ```
//! A directory without `manifest.json` is partial: its stage resumes from what was committed.
//! Knows nothing of what a stage computes.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub const MANIFEST: &str = "manifest.json";
pub const PROGRESS: &str = "progress.json";
pub const PLAN: &str = "plan.json";

/// An open, locked work dir.
pub struct WorkDir {
    pub root: PathBuf,
    /// Held for the life of the value; the OS drops the lock when the process dies.
    _lock: File,
}

/// Takes an exclusive lock on `path` (created if needed), waiting while another process holds
/// it (saying so once); the lock lasts as long as the returned file.
pub fn lock_waiting(path: &Path, what: &str) -> Result<File> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    match f.try_lock() {
        Ok(()) => return Ok(f),
        Err(std::fs::TryLockError::WouldBlock) => {
            tracing::info!(
                "waiting for another run that holds {what} ({})",
                path.display()
            );
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("cannot lock {}", path.display()))
        }
    }
    f.lock()
        .with_context(|| format!("cannot lock {}", path.display()))?;
    Ok(f)
}

/// Whether some process holds the lock on the file at `path` (Linux: the file's inode among
/// `/proc/locks`' flock entries); `None` where that cannot be read. A pid written in a lock file
/// may since belong to another process; the kernel's lock table cannot be stale.
pub fn lock_held(path: &Path) -> Option<bool> {
    use std::os::unix::fs::MetadataExt;
    let inode = fs::metadata(path).ok()?.ino();
    let table = fs::read_to_string("/proc/locks").ok()?;
    Some(table.lines().any(|l| {
        // `1: FLOCK  ADVISORY  WRITE 4321 00:2f:1234567 0 EOF`
        let f: Vec<&str> = l.split_whitespace().collect();
        f.iter()
            .position(|w| w.matches(':').count() == 2)
            .and_then(|i| f[i].rsplit(':').next())
            .and_then(|ino| ino.parse::<u64>().ok())
            == Some(inode)
    }))
}

impl WorkDir {
    /// Creates `root` if needed and takes its lock, or fails naming the holder's pid.
    pub fn lock(root: &Path) -> Result<WorkDir> {
        WorkDir::take(root, false)
    }

    /// Creates `root` if needed and takes its lock, waiting (and saying so) while another
    /// process holds it.
    pub fn lock_waiting(root: &Path) -> Result<WorkDir> {
        WorkDir::take(root, true)
    }

    fn take(root: &Path, wait: bool) -> Result<WorkDir> {
        fs::create_dir_all(root.join("stages"))
            .with_context(|| format!("cannot create work dir {}", root.display()))?;
        let path = root.join(".lock");
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        match f.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = f.read_to_string(&mut holder);
                // `pid@host`, said as `pid N on host`
                let holder = match holder.trim().split_once('@') {
                    Some((pid, host)) => format!("{pid} on {host}"),
                    None if holder.trim().is_empty() => "unknown".into(),
                    None => holder.trim().to_string(),
                };
                if wait {
                    tracing::info!(
                        "waiting for the pipeline (pid {holder}) that holds work dir {}",
                        root.display()
                    );
                    f.lock()
                        .with_context(|| format!("cannot lock {}", path.display()))?;
                } else {
                    bail!(
                    "work dir {} is in use by another pipeline (pid {}); wait for it or stop it \
                     (lock file {})",
                    root.display(),
                    holder,
                    path.display()
                    );
                }
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("cannot lock {}", path.display()))
            }
        }
        let record_pid = |f: &mut File| -> std::io::Result<()> {
            f.set_len(0)?;
            f.rewind()?;
            // the host too: a pid means something only there (status checks it)
            write!(f, "{}@{}", std::process::id(), crate::machine::hostname())?;
            f.sync_all()
        };
        record_pid(&mut f).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(WorkDir {
            root: root.to_path_buf(),
            _lock: f,
        })
    }

    pub fn stage_dir(&self, stage: &str, key: &str) -> PathBuf {
        stage_dir(&self.root, stage, key)
    }
}

pub fn stage_dir(root: &Path, stage: &str, key: &str) -> PathBuf {
    let short = key.get(..16).unwrap_or(key);
    root.join("stages").join(format!("{stage}-{short}"))
}

/// What a finished stage wrote, read by `status`, later stages and people.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub stage: String,
    pub key: String,
    pub code_version: u32,
    /// The stage's validated config section.
    pub config: serde_json::Value,
    pub inputs: Vec<InputRef>,
    pub outputs: Vec<OutputFile>,
    /// Rule and reason counts, in the order the stage reports them.
    pub counts: Vec<(String, u64)>,
    pub rows: u64,
    pub wall_seconds: f64,
    pub finished_unix: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct InputRef {
    pub name: String,
    /// Where it was read from (a file path or an upstream stage dir).
    pub location: String,
    /// Content hash of a file, or the key of an upstream stage.
    pub hash: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OutputFile {
    /// Relative to the stage dir.
    pub path: String,
    pub bytes: u64,
    pub rows: u64,
}

impl Manifest {
    pub fn bytes(&self) -> u64 {
        self.outputs.iter().map(|o| o.bytes).sum()
    }
}

/// How far an unfinished stage got, rewritten as it goes (`progress::Tracker`); `status` reads it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Progress {
    pub done: u64,
    pub total: Option<u64>,
    pub unit: String,
    /// Units per second since this process started (resumed units not counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<f64>,
    /// What is being done (`sample`, `eval arith_hard base`, `train`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub label: String,
    /// What else the stage says about itself (loss, tokens/s, ...).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    #[serde(default)]
    pub started_unix: u64,
    /// When this file was last written: a run whose progress stops moving is stalled or dead.
    #[serde(default)]
    pub updated_unix: u64,
    /// The process writing it, and its host (a pid means something only there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host: String,
}

/// Reads `dir/manifest.json`: `None` when absent (the stage is not done).
pub fn read_manifest(dir: &Path) -> Result<Option<Manifest>> {
    let p = dir.join(MANIFEST);
    match fs::read(&p) {
        Ok(bytes) => {
            Ok(Some(serde_json::from_slice(&bytes).with_context(|| {
                format!("corrupt manifest {}", p.display())
            })?))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", p.display())),
    }
}

pub fn read_progress(dir: &Path) -> Option<Progress> {
    let bytes = fs::read(dir.join(PROGRESS)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Writes `value` as pretty JSON to `path` atomically.
pub fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> Result<u64> {
    let bytes = serde_json::to_vec_pretty(value)?;
    commit_file(path, |tmp| {
        let mut f = File::create(tmp)?;
        f.write_all(&bytes)?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        Ok(())
    })
}

/// Checks an output file of a command before any work: not an existing directory, and not one
/// of its `inputs` (by what the paths name, links and `..` resolved: writing it would replace an
/// input, read or not yet read). `flag` names the output in the error.
pub fn check_output_file(output: &Path, inputs: &[&Path], flag: &str) -> Result<()> {
    if output.is_dir() {
        bail!(
            "{flag} {}: an existing directory; give a file name",
            output.display()
        );
    }
    let named = |p: &Path| -> Option<PathBuf> {
        if let Ok(c) = p.canonicalize() {
            return Some(c);
        }
        // not there yet: its folder's real path and its name
        let dir = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        Some(dir.canonicalize().ok()?.join(p.file_name()?))
    };
    let Some(out) = named(output) else {
        return Ok(());
    };
    if let Some(i) = inputs.iter().find(|i| named(i).as_ref() == Some(&out)) {
        bail!(
            "{flag} {} is the input {}: writing it would replace the input; give another file",
            output.display(),
            i.display()
        );
    }
    Ok(())
}

/// Has `write` fill a temp file beside `path` (`.<name>.tmp`), then renames it over `path` and
/// fsyncs the folder. Returns the committed size. A write that fails removes its temp file; a
/// leftover one from a crash is overwritten next time.
pub fn commit_file(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<u64> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    commit_file_via(path, &format!(".{name}.tmp"), write)
}

/// [`commit_file`] through the temp file named `tmp_name` beside `path` (a writer that tells
/// the format by the extension needs a temp name that keeps it).
pub fn commit_file_via(
    path: &Path,
    tmp_name: &str,
    write: impl FnOnce(&Path) -> Result<()>,
) -> Result<u64> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(tmp_name);
    if let Err(e) = write(&tmp) {
        let _ = fs::remove_file(&tmp);
        return Err(e.context(format!("cannot write {}", path.display())));
    }
    crate::fault::point(&format!("commit.{name}"));
    fs::rename(&tmp, path).with_context(|| format!("cannot commit {}", path.display()))?;
    sync_dir(dir)?;
    Ok(fs::metadata(path)?.len())
}

pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot fsync {}", dir.display()))
}

/// Removes a stage folder so that a crash midway can never leave a manifest over missing
/// outputs: one rename moves it out of `stages/` into `trash/`, then it is deleted.
pub fn discard_dir(dir: &Path) -> Result<()> {
    let root = dir
        .parent()
        .and_then(Path::parent)
        .context("a stage dir lives in <workdir>/stages/")?;
    let trash = root.join("trash");
    fs::create_dir_all(&trash).with_context(|| format!("cannot create {}", trash.display()))?;
    let name = dir.file_name().context("a stage dir has a name")?;
    let target = trash.join(format!(
        "{}-{}-{}",
        name.to_string_lossy(),
        std::process::id(),
        now_unix()
    ));
    fs::rename(dir, &target).with_context(|| format!("cannot move {} aside", dir.display()))?;
    if let Some(parent) = dir.parent() {
        sync_dir(parent)?;
    }
    fs::remove_dir_all(&target).with_context(|| format!("cannot delete {}", target.display()))?;
    // Leave no empty trash folder behind (another run's leftovers keep it, and that is fine).
    let _ = fs::remove_dir(&trash);
    Ok(())
}

/// Deletes what an interrupted `discard_dir` left in `<workdir>/trash/`.
pub fn clear_trash(root: &Path) -> Result<()> {
    let trash = root.join("trash");
    if trash.exists() {
        fs::remove_dir_all(&trash).with_context(|| format!("cannot delete {}", trash.display()))?;
    }
    Ok(())
}

/// SHA-256 of a file's bytes, hex.
pub fn hash_file(path: &Path) -> Result<String> {
    let mut f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(buf.get(..n).unwrap_or_default());
    }
    Ok(hex::encode(h.finalize()))
}

/// SHA-256 of a JSON value's canonical text, hex.
pub fn hash_json(v: &serde_json::Value) -> String {
    hex::encode(Sha256::digest(v.to_string().as_bytes()))
}

/// A seed derived from `v` (the first 8 bytes of its hash): seeded choices that differ by name
/// (a round, a source, a set) but not between runs.
pub fn hash_seed(v: &serde_json::Value) -> u64 {
    let d = Sha256::digest(v.to_string().as_bytes());
    u64::from_be_bytes(d[..8].try_into().expect("8 bytes"))
}

/// Total size of the files under `dir`.
pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_is_no_input_and_no_directory() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.jsonl");
        fs::write(&input, "{}\n").unwrap();
        let same = dir.path().join("sub/../in.jsonl");
        fs::create_dir(dir.path().join("sub")).unwrap();
        let e = check_output_file(&same, &[&input], "--output").unwrap_err();
        assert!(e.to_string().contains("is the input"), "{e}");
        let e = check_output_file(dir.path(), &[&input], "--output").unwrap_err();
        assert!(e.to_string().contains("an existing directory"), "{e}");
        check_output_file(&dir.path().join("out.jsonl"), &[&input], "--output").unwrap();
        // a link to the input is the input
        let link = dir.path().join("link.jsonl");
        std::os::unix::fs::symlink(&input, &link).unwrap();
        assert!(check_output_file(&link, &[&input], "--output").is_err());
    }

    #[test]
    fn second_lock_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let _held = WorkDir::lock(dir.path()).unwrap();
        let e = WorkDir::lock(dir.path()).err().unwrap().to_string();
        assert!(e.contains(&format!("pid {}", std::process::id())), "{e}");
    }

    #[test]
    fn lock_is_released_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        drop(WorkDir::lock(dir.path()).unwrap());
        WorkDir::lock(dir.path()).unwrap();
    }

    #[test]
    fn failed_commit_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.json");
        let r = commit_file(&p, |tmp| {
            fs::write(tmp, b"half")?;
            bail!("boom")
        });
        assert!(r.is_err());
        assert!(!p.exists());
        write_json_atomic(&p, &serde_json::json!({"a": 1})).unwrap();
        assert!(fs::read_to_string(&p).unwrap().contains("\"a\": 1"));
    }
}

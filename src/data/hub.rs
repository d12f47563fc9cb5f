//! Resolving `hf://` dataset locations to local files through `hf-hub` and its cache.
//!
//! Looks in the Hugging Face cache first (`HF_HOME`, default `~/.cache/huggingface`), downloads when
//! online, and when it cannot, says exactly what to download and where to put it. Knows nothing
//! of the file's format.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Result};
use hf_hub::{api::sync::ApiBuilder, Cache, Repo, RepoType};

use super::source::Location;

fn repo(repo_id: &str, revision: Option<&str>) -> Repo {
    match revision {
        Some(r) => Repo::with_revision(repo_id.to_string(), RepoType::Dataset, r.to_string()),
        None => Repo::new(repo_id.to_string(), RepoType::Dataset),
    }
}

fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// The local files of a location, downloading hub files when needed.
pub fn resolve(loc: &Location) -> Result<Vec<PathBuf>> {
    match loc {
        Location::Local(p) => {
            if !p.exists() {
                bail!("{} does not exist", p.display());
            }
            Ok(vec![p.clone()])
        }
        Location::Hub {
            repo: id,
            revision,
            file,
            split,
        } => {
            let files = match file {
                Some(f) => vec![f.clone()],
                None => list_split(id, revision.as_deref(), split.as_deref().unwrap_or(""))?,
            };
            files
                .iter()
                .map(|f| fetch(id, revision.as_deref(), f))
                .collect()
        }
    }
}

/// The hub cache, or an error when neither HF_HOME nor a home folder is set (hf-hub would
/// panic looking for one).
fn cache() -> Result<Cache> {
    let has_home = std::env::var_os("HF_HOME").is_some() || std::env::var_os("HOME").is_some();
    if !has_home {
        bail!("set HF_HOME (or HOME) so the Hugging Face cache has a place");
    }
    Ok(Cache::from_env())
}

fn fetch(id: &str, revision: Option<&str>, file: &str) -> Result<PathBuf> {
    let cache = cache()?;
    if let Some(p) = cache.repo(repo(id, revision)).get(file) {
        return Ok(p);
    }
    let how = format!(
        "download it on a machine with internet (`hf download --repo-type dataset {id} {file} \
         --local-dir DIR`) and point `path` at DIR/{file}, or copy it into the cache at {}",
        cache.path().display()
    );
    if offline() {
        bail!("hf://{id}/{file} is not in the local cache and HF_HUB_OFFLINE is set: {how}");
    }
    let api = ApiBuilder::from_env()
        .with_progress(false)
        .build()
        .map_err(|e| anyhow!("cannot start the hub client ({e}): {how}"))?;
    api.repo(repo(id, revision))
        .get(file)
        .map_err(|e| anyhow!("cannot download hf://{id}/{file} ({e}): {how}"))
}

/// The files of one split: from the hub's file list when online, else from the cached snapshot.
/// Files of several configs (e.g. `main/test-*` and `socratic/test-*`) are an error: name one.
fn list_split(id: &str, revision: Option<&str>, split: &str) -> Result<Vec<String>> {
    let how = format!(
        "name the file in the path instead (hf://{id}/<file>); `hf download --repo-type dataset \
         {id}` lists and fetches them"
    );
    let all = if offline() {
        cached_files(id, revision).ok_or_else(|| {
            anyhow!("hf://{id} is not in the local cache and HF_HUB_OFFLINE is set: {how}")
        })?
    } else {
        let api = ApiBuilder::from_env()
            .with_progress(false)
            .build()
            .map_err(|e| anyhow!("cannot start the hub client ({e}): {how}"))?;
        match api.repo(repo(id, revision)).info() {
            Ok(info) => info.siblings.into_iter().map(|s| s.rfilename).collect(),
            Err(e) => cached_files(id, revision)
                .ok_or_else(|| anyhow!("cannot list hf://{id} ({e}): {how}"))?,
        }
    };
    let files = split_files(all, split);
    if files.is_empty() {
        bail!("hf://{id} has no .parquet or .jsonl files for split `{split}`: {how}");
    }
    let folders: std::collections::BTreeSet<&str> = files
        .iter()
        .map(|f| f.rsplit_once('/').map(|(d, _)| d).unwrap_or(""))
        .collect();
    if folders.len() > 1 {
        bail!(
            "hf://{id} split `{split}` has files in several folders ({}): name one in the path, \
             e.g. hf://{id}/{}",
            folders.into_iter().collect::<Vec<_>>().join(", "),
            files.first().map(String::as_str).unwrap_or("")
        );
    }
    Ok(files)
}

/// The `.parquet`/`.jsonl` files of `split`: named `<split>-*`/`<split>.*` or under a `<split>/`
/// folder, sorted.
fn split_files(all: Vec<String>, split: &str) -> Vec<String> {
    let mut files: Vec<String> = all
        .into_iter()
        .filter(|f| f.ends_with(".parquet") || f.ends_with(".jsonl"))
        .filter(|f| {
            let base = f.rsplit('/').next().unwrap_or(f);
            base.starts_with(&format!("{split}-"))
                || base.starts_with(&format!("{split}."))
                || f.split('/').any(|d| d == split)
        })
        .collect();
    files.sort();
    files
}

/// Every file of the cached snapshot of `id` at `revision` (default `main`), relative paths.
fn cached_files(id: &str, revision: Option<&str>) -> Option<Vec<String>> {
    let cache = cache().ok()?;
    let r = repo(id, revision);
    let folder = cache.path().join(r.folder_name());
    let commit = std::fs::read_to_string(folder.join("refs").join(r.revision())).ok()?;
    let snapshot = folder.join("snapshots").join(commit.trim());
    let mut out = Vec::new();
    walk(&snapshot, &snapshot, &mut out);
    (!out.is_empty()).then_some(out)
}

fn walk(root: &std::path::Path, dir: &std::path::Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(root, &p, out);
        } else if let Ok(rel) = p.strip_prefix(root) {
            out.push(rel.to_string_lossy().into_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_files_match_names_and_folders() {
        let all = vec![
            "main/test-00000-of-00001.parquet".to_string(),
            "main/train-00000-of-00001.parquet".to_string(),
            "test/part-0.jsonl".to_string(),
            "README.md".to_string(),
        ];
        assert_eq!(
            split_files(all, "test"),
            vec!["main/test-00000-of-00001.parquet", "test/part-0.jsonl"]
        );
    }
}

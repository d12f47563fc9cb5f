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

/// Only the cache: `Some(paths)` when every file is already local (used by preflight).
pub fn cached(loc: &Location) -> Option<Vec<PathBuf>> {
    match loc {
        Location::Local(p) => p.exists().then(|| vec![p.clone()]),
        Location::Hub {
            repo: id,
            revision,
            file: Some(f),
            ..
        } => Cache::from_env()
            .repo(repo(id, revision.as_deref()))
            .get(f)
            .map(|p| vec![p]),
        Location::Hub { .. } => None,
    }
}

fn fetch(id: &str, revision: Option<&str>, file: &str) -> Result<PathBuf> {
    let cache = Cache::from_env();
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

fn list_split(id: &str, revision: Option<&str>, split: &str) -> Result<Vec<String>> {
    let how = format!(
        "name the file in the path instead (hf://{id}/<file>); `hf download --repo-type dataset \
         {id}` lists and fetches them"
    );
    if offline() {
        bail!("cannot list hf://{id} offline (HF_HUB_OFFLINE is set): {how}");
    }
    let api = ApiBuilder::from_env()
        .with_progress(false)
        .build()
        .map_err(|e| anyhow!("cannot start the hub client ({e}): {how}"))?;
    let info = api
        .repo(repo(id, revision))
        .info()
        .map_err(|e| anyhow!("cannot list hf://{id} ({e}): {how}"))?;
    let mut files: Vec<String> = info
        .siblings
        .into_iter()
        .map(|s| s.rfilename)
        .filter(|f| f.ends_with(".parquet") || f.ends_with(".jsonl"))
        .filter(|f| {
            let base = f.rsplit('/').next().unwrap_or(f);
            base.starts_with(&format!("{split}-"))
                || base.starts_with(&format!("{split}."))
                || f.split('/').any(|d| d == split)
        })
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("hf://{id} has no .parquet or .jsonl files for split `{split}`: {how}");
    }
    Ok(files)
}

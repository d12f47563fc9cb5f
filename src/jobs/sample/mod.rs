//! A sampling job: problems in, a completions Parquet out, resumable.
//!
//! 1) Prompts are built from the problems (chat template, raw text, or a Jinja file with
//!    `{{ problem }}`). 2) The engine samples `n` completions per problem; with gold answers, each
//!    finished sample is graded, and with `target_correct = k` a problem stops being sampled once
//!    k samples are correct. 3) Finished problems are committed in parts (every problem's samples
//!    in one part, each part written whole) under `<output>.parts/`, so a killed run resumes
//!    without duplicates or gaps: it skips the problems already committed, and every sample's
//!    tokens depend only on (seed, problem id, sample index). 4) At the end the parts are joined,
//!    in input order, into the output file (atomically).
//!
//! Knows nothing of stages or configs: the `pipeline sample` command and the sample stage call it.
//!
//! The pieces, each in its file: [`settings`] (the `[sample]` section and flags), [`prompt`]
//! (problems to prompts), [`rationalize`] (STaR's hinted second pass), [`engine`] (what the loop needs of an engine), [`memory`] (the KV
//! cache and memory estimates), [`job`] (a prepared job and its summary), [`run`] (jobs on one loaded
//! model and engine), [`feed`] (the loop), [`parts`] (committed parts and
//! the join), [`shard`] (sharding and merging shards).

pub mod engine;
pub mod feed;
pub mod job;
pub mod memory;
pub mod parts;
pub mod prompt;
pub mod rationalize;
pub mod run;
pub mod settings;
pub mod shard;

#[cfg(test)]
mod tests;

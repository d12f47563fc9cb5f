//! What the job loop needs of a sampling engine ([`SampleEngine`]): ours
//! ([`crate::sampler::engine::Engine`]) or mistral.rs's ([`crate::jobs::mistralrs`], the
//! `mistralrs` feature).
//!
//! Knows nothing of problems, parts or grading.

use anyhow::Result;

use crate::sampler::engine::{Decoder, Engine, Request, Sample};

/// What the job loop needs of a sampling engine: ours ([`Engine`]) or mistral.rs's
/// (`super::mistralrs`, the `mistralrs` feature). Requests are numbered in the order they are
/// added; a finished sample names its request.
pub trait SampleEngine {
    fn add(&mut self, req: Request) -> Result<usize>;
    /// Runs until some samples finish (or a step passes) and returns them.
    fn step(&mut self, decode: Option<Decoder>) -> Result<Vec<Sample>>;
    /// Drops the request's unfinished samples; returns how many.
    fn cancel(&mut self, request: usize) -> u64;
    fn is_idle(&self) -> bool;
    fn num_running(&self) -> usize;
    /// Fraction of the KV cache in use, where the engine says it.
    fn kv_usage(&self) -> Option<f64>;
    /// Sequences preempted so far, where the engine says it.
    fn preemptions(&self) -> Option<u64>;
    fn prompt_tokens(&self) -> u64;
    fn generated_tokens(&self) -> u64;
}

impl SampleEngine for Engine<'_> {
    fn add(&mut self, req: Request) -> Result<usize> {
        Engine::add(self, req)
    }
    fn step(&mut self, decode: Option<Decoder>) -> Result<Vec<Sample>> {
        Engine::step(self, decode)
    }
    fn cancel(&mut self, request: usize) -> u64 {
        Engine::cancel(self, request)
    }
    fn is_idle(&self) -> bool {
        Engine::is_idle(self)
    }
    fn num_running(&self) -> usize {
        Engine::num_running(self)
    }
    fn kv_usage(&self) -> Option<f64> {
        Some(Engine::kv_usage(self))
    }
    fn preemptions(&self) -> Option<u64> {
        Some(Engine::preemptions(self))
    }
    fn prompt_tokens(&self) -> u64 {
        self.stats.prompt_tokens_computed
    }
    fn generated_tokens(&self) -> u64 {
        self.stats.generated_tokens
    }
}

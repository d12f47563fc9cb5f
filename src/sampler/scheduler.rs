//! The scheduler: continuous batching under a token budget, vLLM v1's way.
//!
//! There is no prefill or decode phase. Every sequence has `num_tokens` (prompt plus generated)
//! and `num_computed` (tokens whose keys and values are in the cache); each step gives each
//! sequence up to `num_tokens - num_computed` tokens out of the step's token budget, running
//! sequences first (in arrival order), then waiting ones. A long prompt is thereby prefilled in
//! chunks, and a decoding sequence gets one token. When blocks run out, the most recently
//! admitted running sequence is preempted by recompute: its blocks are freed, `num_computed`
//! drops to 0, and it goes back to the front of the waiting queue.
//!
//! Knows nothing of the model, sampling or problems: sequences are ids, token counts and block
//! tables.

use std::collections::VecDeque;

use super::block_pool::{BlockPool, BlockTable, CopyOnWrite};

/// Index of a sequence in the engine's sequence store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub usize);

/// What the scheduler tracks of a sequence.
#[derive(Debug, Clone, Default)]
pub struct SeqState {
    pub num_tokens: usize,
    pub num_computed: usize,
    pub block_table: BlockTable,
    /// Times this sequence was preempted.
    pub preemptions: u32,
    /// Compute no token past this many until it is lifted (a recurrent model's leader stops
    /// before its prompt's last token, where its samples fork).
    pub limit: Option<usize>,
}

impl SeqState {
    /// Tokens to compute before the sequence can go on.
    fn to_compute(&self) -> usize {
        self.limit
            .map_or(self.num_tokens, |l| l.min(self.num_tokens))
            .saturating_sub(self.num_computed)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    pub block_size: usize,
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Most tokens computed in one step (all sequences together).
    pub max_num_batched_tokens: usize,
}

/// One step's work: `(sequence, tokens to compute)` in batch order, block copies to make first,
/// and the sequences preempted while scheduling it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Step {
    pub scheduled: Vec<(SeqId, usize)>,
    pub copies: Vec<CopyOnWrite>,
    pub preempted: Vec<SeqId>,
}

#[derive(Debug)]
pub struct Scheduler {
    pub cfg: SchedulerConfig,
    pub pool: BlockPool,
    running: Vec<SeqId>,
    waiting: VecDeque<SeqId>,
    pub total_preemptions: u64,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, num_blocks: usize) -> Scheduler {
        Scheduler {
            cfg,
            pool: BlockPool::new(num_blocks),
            running: Vec::new(),
            waiting: VecDeque::new(),
            total_preemptions: 0,
        }
    }

    /// Queues a new sequence (at the back).
    pub fn add(&mut self, id: SeqId) {
        self.waiting.push_back(id);
    }

    /// Queues a sequence ahead of the others (forked samples waiting on a shared prompt).
    pub fn add_front(&mut self, id: SeqId) {
        self.waiting.push_front(id);
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// Removes a finished sequence and frees its blocks.
    pub fn finish(&mut self, id: SeqId, seqs: &mut [SeqState]) {
        self.running.retain(|s| *s != id);
        self.waiting.retain(|s| *s != id);
        if let Some(s) = seqs.get_mut(id.0) {
            s.block_table.free(&mut self.pool);
        }
    }

    /// Plans one step over `seqs` (indexed by `SeqId`).
    pub fn schedule(&mut self, seqs: &mut [SeqState]) -> Step {
        let mut step = Step::default();
        let mut budget = self.cfg.max_num_batched_tokens;
        let bs = self.cfg.block_size;
        // 1) running sequences, oldest first
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let Some(s) = seqs.get(id.0) else {
                i += 1;
                continue;
            };
            let n = s.to_compute().min(budget);
            if n == 0 {
                i += 1;
                continue;
            }
            match self.reserve(id, n, seqs, &mut step) {
                true => {
                    step.scheduled.push((id, n));
                    budget -= n;
                    i += 1;
                }
                // `id` itself was preempted (it was the newest): nothing more fits.
                false => break,
            }
        }
        // 2) waiting sequences, unless this step had to preempt
        while step.preempted.is_empty() && budget > 0 && self.running.len() < self.cfg.max_num_seqs
        {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let Some(s) = seqs.get_mut(id.0) else {
                self.waiting.pop_front();
                continue;
            };
            let n = s.to_compute().min(budget);
            match s.block_table.reserve(&mut self.pool, s.num_computed, n, bs) {
                Some(cow) => {
                    step.copies.extend(cow);
                    self.waiting.pop_front();
                    self.running.push(id);
                    if n > 0 {
                        step.scheduled.push((id, n));
                        budget -= n;
                    }
                }
                None => break,
            }
        }
        step
    }

    /// Reserves `n` slots for running sequence `id`, preempting the newest running sequences
    /// until they fit. `false` when `id` itself had to be preempted.
    fn reserve(&mut self, id: SeqId, n: usize, seqs: &mut [SeqState], step: &mut Step) -> bool {
        let bs = self.cfg.block_size;
        loop {
            let Some(s) = seqs.get_mut(id.0) else {
                return false;
            };
            if let Some(cow) = s.block_table.reserve(&mut self.pool, s.num_computed, n, bs) {
                step.copies.extend(cow);
                return true;
            }
            let Some(victim) = self.running.pop() else {
                return false;
            };
            // A victim scheduled earlier in this step is unscheduled.
            step.scheduled.retain(|(v, _)| *v != victim);
            if let Some(v) = seqs.get_mut(victim.0) {
                v.block_table.free(&mut self.pool);
                v.num_computed = 0;
                v.preemptions += 1;
            }
            self.total_preemptions += 1;
            self.waiting.push_front(victim);
            step.preempted.push(victim);
            if victim == id {
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(max_num_seqs: usize, budget: usize) -> SchedulerConfig {
        SchedulerConfig {
            block_size: 4,
            max_num_seqs,
            max_num_batched_tokens: budget,
        }
    }

    fn seqs(prompts: &[usize]) -> Vec<SeqState> {
        prompts
            .iter()
            .map(|&n| SeqState {
                num_tokens: n,
                ..SeqState::default()
            })
            .collect()
    }

    /// Applies a step as the engine would: computed tokens advance; finished prompts grow by one.
    fn apply(step: &Step, seqs: &mut [SeqState]) {
        for &(id, n) in &step.scheduled {
            let s = &mut seqs[id.0];
            s.num_computed += n;
            if s.num_computed == s.num_tokens {
                s.num_tokens += 1;
            }
        }
    }

    #[test]
    fn long_prompts_are_prefilled_in_chunks_under_the_budget() {
        let mut st = seqs(&[10, 3]);
        let mut sch = Scheduler::new(cfg(8, 6), 64);
        sch.add(SeqId(0));
        sch.add(SeqId(1));
        let s1 = sch.schedule(&mut st);
        assert_eq!(s1.scheduled, vec![(SeqId(0), 6)]);
        apply(&s1, &mut st);
        let s2 = sch.schedule(&mut st);
        // Running first (the rest of the prompt), then the waiting one with what is left.
        assert_eq!(s2.scheduled, vec![(SeqId(0), 4), (SeqId(1), 2)]);
        apply(&s2, &mut st);
        let s3 = sch.schedule(&mut st);
        // A decode token for 0, the last prompt token for 1: no phases.
        assert_eq!(s3.scheduled, vec![(SeqId(0), 1), (SeqId(1), 1)]);
    }

    #[test]
    fn max_num_seqs_bounds_the_running_set() {
        let mut st = seqs(&[2, 2, 2]);
        let mut sch = Scheduler::new(cfg(2, 100), 64);
        for i in 0..3 {
            sch.add(SeqId(i));
        }
        let s = sch.schedule(&mut st);
        assert_eq!(s.scheduled.len(), 2);
        assert_eq!(sch.num_waiting(), 1);
        sch.finish(SeqId(0), &mut st);
        apply(&s, &mut st);
        let s = sch.schedule(&mut st);
        assert!(s.scheduled.contains(&(SeqId(2), 2)));
    }

    #[test]
    fn running_out_of_blocks_preempts_the_newest_by_recompute() {
        // 4 blocks of 4 slots; two sequences of 7 tokens take 2 blocks each.
        let mut st = seqs(&[7, 7]);
        let mut sch = Scheduler::new(cfg(8, 100), 4);
        sch.add(SeqId(0));
        sch.add(SeqId(1));
        let s = sch.schedule(&mut st);
        assert_eq!(s.scheduled.len(), 2);
        apply(&s, &mut st); // both now 8 tokens, 7 computed
        let s = sch.schedule(&mut st);
        assert_eq!(s.scheduled, vec![(SeqId(0), 1), (SeqId(1), 1)]);
        apply(&s, &mut st); // 9 tokens, 8 computed: the next token needs a third block each
        let s = sch.schedule(&mut st);
        assert_eq!(s.preempted, vec![SeqId(1)]);
        assert_eq!(s.scheduled, vec![(SeqId(0), 1)]);
        assert_eq!(st[1].num_computed, 0);
        assert_eq!(st[1].preemptions, 1);
        assert!(st[1].block_table.blocks.is_empty());
        assert_eq!(sch.num_waiting(), 1);
        // Once 0 finishes, 1 is recomputed from scratch (prompt and generated tokens).
        apply(&s, &mut st);
        sch.finish(SeqId(0), &mut st);
        let s = sch.schedule(&mut st);
        assert_eq!(s.scheduled, vec![(SeqId(1), 9)]);
        assert_eq!(sch.pool.num_free(), 4 - 3);
    }

    #[test]
    fn a_lone_sequence_that_cannot_fit_is_preempted_not_looped() {
        let mut st = seqs(&[9]);
        let mut sch = Scheduler::new(cfg(8, 100), 2);
        sch.add(SeqId(0));
        let s = sch.schedule(&mut st);
        assert!(s.scheduled.is_empty());
        assert_eq!(sch.num_waiting(), 1);
    }

    #[test]
    fn forked_sequences_copy_the_shared_partial_block() {
        let mut st = seqs(&[6]);
        let mut sch = Scheduler::new(cfg(8, 100), 8);
        sch.add(SeqId(0));
        let s = sch.schedule(&mut st);
        apply(&s, &mut st);
        // Fork: share the prompt's blocks, recompute the last prompt token.
        let table = st[0].block_table.fork(&mut sch.pool);
        st.push(SeqState {
            num_tokens: 6,
            num_computed: 5,
            block_table: table,
            ..SeqState::default()
        });
        sch.add_front(SeqId(1));
        let s = sch.schedule(&mut st);
        assert_eq!(s.scheduled, vec![(SeqId(0), 1), (SeqId(1), 1)]);
        assert_eq!(s.copies.len(), 1, "the shared partial block is copied once");
    }
}

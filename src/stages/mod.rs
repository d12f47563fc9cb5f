//! The stages of a pipeline and the stage cache: a validated config becomes an ordered list of
//! stages ([`plan`]), each keyed by a hash of its config section, its inputs' hashes
//! ([`resolve`]) and its code version ([`stage`]); [`runner`] executes the ones without a
//! manifest, in order, and writes each manifest last.
//!
//! Stages live one per file (`data`, `pretrain`, `sample`, `filter`, `train`, `eval`) and meet
//! only through the files named in their inputs, with one exception: the pretrain stage trains
//! through the train stage's [`train::train_into`] (pretraining is training on generated rows).
//!
//! With `run.rounds = R > 1`, sample -> filter -> train repeats R times, each round from the
//! model the round before trained, as stages named `sample-r1`, `filter-r1`, `train-r1`, ...;
//! with one round they are plain `sample`, `filter`, `train`.

pub mod board;
pub mod cost;
pub mod data;
pub mod eval;
pub mod filter;
pub mod fit;
pub mod mix;
pub mod plan;
pub mod pretrain;
pub mod resolve;
pub mod runner;
pub mod sample;
pub mod stage;
pub mod student;
pub mod train;

pub use crate::config::PRETRAINED;
pub use resolve::{
    eval_set_input, file_input, model_input, verifier_input, LocationInputs, ModelFacts, Resolve,
    NOT_DOWNLOADED,
};
pub use runner::{run, PlanRecord, PlanRecordStage, Target, STAGE_LOG};
pub use stage::{
    completion_row_bytes, expected_completion_tokens, output_file, stage_key, stage_state, Counts,
    Estimate, Plan, PlannedStage, StageKind, StageOutput, StageState, Work, ASSUMED_PROMPT_TOKENS,
    ASSUMED_TEMPLATE_TOKENS, COMPLETIONS, EVAL_METRICS, MODEL_DIR, PROBLEMS, SFT, TRAIN_STATE_DIR,
};

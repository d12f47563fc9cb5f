//! Fuzz target over answer extraction and equivalence: `selfdistill::verify::grade`
//! must never panic and must return within its bounded work on any input.
//!
//! The input is split at the first NUL byte (or in the middle when there is none) into
//! a completion and a gold answer; both halves are decoded lossily as UTF-8. The
//! target does not judge verdicts, only that grading terminates without a panic.
//! `fuzz/verify.dict` holds the tokens of the answer grammar (markers, LaTeX commands,
//! function values, times of day): `cargo +nightly fuzz run verify -- -dict=fuzz/verify.dict`.
#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use selfdistill::verify::{extract_answer, grade, is_equivalent, normalize_answer, GradeOptions};

fuzz_target!(|data: &[u8]| {
    let split = data.iter().position(|b| *b == 0).unwrap_or(data.len() / 2);
    let (left, right) = data.split_at(split);
    let right = right.strip_prefix(&[0u8]).unwrap_or(right);
    let completion = String::from_utf8_lossy(left);
    let gold = String::from_utf8_lossy(right);
    let flags = data.first().copied().unwrap_or(0);
    let opts = GradeOptions {
        last_number_fallback: flags & 1 == 1,
        thinking: flags & 2 == 2,
        time_limit: Duration::from_millis(50),
    };
    let start = Instant::now();
    let verdict = grade(&completion, &gold, &opts);
    let _ = extract_answer(&completion, &opts);
    let _ = is_equivalent(&gold, &completion, &opts);
    let _ = normalize_answer(&completion);
    assert_eq!(verdict.correct, verdict.reason.is_correct());
    // Bounded work: far more than the time limit means a hang, not a slow machine.
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "grading took {:?}",
        start.elapsed()
    );
});

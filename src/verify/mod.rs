//! Answer verification for math self-distillation: pull the final answer out of a
//! model completion and decide whether it equals a gold answer.
//!
//! Everything here is a pure function: no I/O, no global mutable state, no panics, and
//! bounded work per call (input length caps, depth-limited parsing, exponent caps and a
//! wall-clock deadline checked inside the loops).
//!
//! # Pipeline
//! 1. [`extract_answer`] ([`extract`]): the text after the last `</think>` (with
//!    [`GradeOptions::thinking`] a completion without `</think>` has no answer), then the
//!    last `\boxed{}` / `\fbox{}` / `\framebox{}`, else Minerva's
//!    `Final Answer: The final answer is x`, else GSM8K's `#### x`, else
//!    `The answer is x` / `Answer: x`, else (only with
//!    [`GradeOptions::last_number_fallback`]) the last number in the text.
//! 2. [`normalize_answer`] ([`normalize`]): one canonical string per answer.
//! 3. [`is_equivalent`] ([`equiv`]): exact string, then normalised string, then shapes
//!    (tuples, intervals, sets, matrices, equations, choices, text), then exact rationals,
//!    then symbolic expressions evaluated at several points ([`expr`]).
//!
//! # Decisions
//! * **Gold** is a bare answer: it is never extracted from, only normalised. One wrapping
//!   `\boxed{…}` (and `$…$`) around the whole gold is stripped, which is harmless.
//! * **Percent**: `50\%` equals both `50` and `0.5` (the `%` may be read as a unit or as
//!   `/100`), on either side. Without a `%` sign, `50` never equals `0.5`.
//! * **Units and decorations** (`\text{ cm}`, `^\circ`, `\$`, `dollars`, thousands
//!   separators, `x =` prefixes) are ignored: `10^\circ` equals `10`, `\$18.00` equals `18`,
//!   and a number with a unit equals the bare number (Minerva's `1.6 \mathrm{~cm}` is `1.6`).
//!   Two answers that both carry known units ([`units`]) are equal only when the units are
//!   the same after spelling (`m`, `meters`, `\mathrm{~m}`): `5\text{ m}` is not
//!   `5\text{ cm}`. Units are never converted: `100 cm` is not `1 m`.
//! * **Decimals**: a decimal equals an exact value when they are equal as rationals.
//!   A decimal with at least 4 significant digits that is the exact value correctly
//!   rounded at its last written digit is also accepted (reason `numeric`):
//!   `1.414` matches `\sqrt{2}` and `4.667` matches `\frac{14}{3}`, but `1.41`, `0.33`
//!   and `3.14` do not. Two decimals must be equal as rationals.
//! * **Symbolic** comparison evaluates both sides in complex floating point at three
//!   variable assignments and accepts a relative difference below 1e-9.
//! * **Mixed numbers**: `2\frac{1}{2}` is 5/2 (an integer directly followed by a fraction
//!   of two integers); `2\frac{\pi}{3}` stays a product.
//! * **Bare lists** `3, 5` are unordered (`5, 3` matches); parenthesised tuples and
//!   intervals are ordered and their bracket kinds must agree; `\{…\}` sets are unordered.
//! * Multiple-choice letters: `\text{(C)}`, `(C)`, `C` and `\textbf{(C)} 36` all carry `C`.
//! * **Function values**: a name directly followed by a parenthesis is an application, an
//!   opaque symbol equal only to the same name applied to equal arguments (`f(1+1)`
//!   equals `f(2)`; `f(x)` is not `f(y)`, `I(0)` is not `0`, `x(t)` is not `xt`). The name
//!   decides: after `f`, `g`, `h`, a prime (`f'(x)`), `f^{-1}`, a `\mathrm{}` /
//!   `\operatorname{}` name or an operator (`\gcd`, `\max`, ...) it is always an
//!   application; after any other letter or a Greek letter only when the parenthesis holds
//!   one atomic argument (a number, `-` a number, a variable, or an application: `I(0)`,
//!   `x(t)`, `\phi(t_0)`, `t(g(16))`) or a comma-separated list (`P(1,6)`); otherwise it
//!   is a product, as MATH writes `x(x+1)`, `c(2b-a)` and `A(1+\sqrt{B})`. `e` and `i`
//!   are constants and never applied; digits and brackets multiply (`2(x+1)`,
//!   `(a)(b)`); functions the parser knows (`\sin`, `\ln`, `\sqrt`, ...) are evaluated.
//!   The price: `g(\sin\theta-\mu\cos\theta)` (physics' `g` times a sum) only equals
//!   itself or an application with an equal argument, not its expansion.
//! * **Times of day** keep their a.m./p.m.: `4:30 \text{ p.m.}`, `\text{4:30 p.m.}`,
//!   `4:30 PM` and `16:30` are one time, `4:30 a.m.` is another, and a bare `4:30` (which
//!   does not say which half of the day) equals neither; `7 pm` is `7:00 p.m.` and does
//!   not equal the number `7`.
//!
//! A [`Verdict`] carries a [`Reason`]: `exact`, `normalized`, `rational`, `tuple`,
//! `interval`, `set`, `matrix`, `equation`, `choice`, `symbolic`, `numeric` when correct;
//! `mismatch`, `no_answer`, `unclosed_think`, `timeout` when not (stable snake_case names).
//!
//! What it does not know: it is not a CAS (no simplification beyond evaluation at
//! points, so identities that hold only on part of the domain may be accepted), it does
//! not read units (`5 cm` equals `5 m`), and an answer longer than
//! [`equiv::MAX_COMPARE_LEN`] bytes is compared as a string only.

pub mod equiv;
pub mod expr;
pub mod extract;
pub mod normalize;
pub mod units;

use std::time::{Duration, Instant};

pub use normalize::normalize_answer;

/// Knobs for extraction and comparison.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GradeOptions {
    /// When no explicit answer marker exists, take the last number of the completion.
    pub last_number_fallback: bool,
    /// The completion comes from a thinking model: only text after `</think>` counts,
    /// and a completion that never closes its thinking has no answer.
    pub thinking: bool,
    /// Wall-clock bound for one equivalence check (extraction is linear and not timed).
    pub time_limit: Duration,
}

impl Default for GradeOptions {
    fn default() -> Self {
        GradeOptions {
            last_number_fallback: false,
            thinking: false,
            time_limit: Duration::from_millis(50),
        }
    }
}

/// How an answer was found in a completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExtractMethod {
    Boxed,
    Hash,
    AnswerIs,
    FinalAnswer,
    LastNumber,
}

impl ExtractMethod {
    /// Stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            ExtractMethod::Boxed => "boxed",
            ExtractMethod::Hash => "hash",
            ExtractMethod::AnswerIs => "answer_is",
            ExtractMethod::FinalAnswer => "final_answer",
            ExtractMethod::LastNumber => "last_number",
        }
    }
}

/// An answer pulled out of a completion.
#[derive(Clone, Debug, PartialEq)]
pub struct Extracted {
    pub answer: String,
    pub method: ExtractMethod,
}

/// Why a verdict came out the way it did. The correct reasons say how the answers
/// matched; the others say why they did not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// Identical strings (after trimming).
    Exact,
    /// Identical after normalisation (units, `\left`, `\dfrac`, spacing, case of words...).
    Normalized,
    /// Equal as exact rational numbers.
    Rational,
    /// Tuples equal element by element, in order.
    Tuple,
    /// Intervals (or unions of intervals) with equal endpoints and bracket kinds.
    Interval,
    /// Sets or unordered answer lists with equal elements.
    Set,
    /// Matrices or vectors equal entry by entry.
    Matrix,
    /// Equations equal up to a nonzero factor, or inequalities equal to an interval.
    Equation,
    /// The same multiple-choice letter.
    Choice,
    /// Expressions (radicals, π, i, variables) equal under evaluation.
    Symbolic,
    /// A rounded decimal that matches the exact value at its written precision.
    Numeric,
    /// Not equivalent.
    Mismatch,
    /// The completion has no extractable answer.
    NoAnswer,
    /// Thinking mode and the completion never closed `</think>`.
    UnclosedThink,
    /// The check ran out of its time budget.
    Timeout,
}

impl Reason {
    /// Every reason, in declaration order.
    pub const ALL: &'static [Reason] = &[
        Reason::Exact,
        Reason::Normalized,
        Reason::Rational,
        Reason::Tuple,
        Reason::Interval,
        Reason::Set,
        Reason::Matrix,
        Reason::Equation,
        Reason::Choice,
        Reason::Symbolic,
        Reason::Numeric,
        Reason::Mismatch,
        Reason::NoAnswer,
        Reason::UnclosedThink,
        Reason::Timeout,
    ];

    /// Stable snake_case name (written to Parquet).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Exact => "exact",
            Reason::Normalized => "normalized",
            Reason::Rational => "rational",
            Reason::Tuple => "tuple",
            Reason::Interval => "interval",
            Reason::Set => "set",
            Reason::Matrix => "matrix",
            Reason::Equation => "equation",
            Reason::Choice => "choice",
            Reason::Symbolic => "symbolic",
            Reason::Numeric => "numeric",
            Reason::Mismatch => "mismatch",
            Reason::NoAnswer => "no_answer",
            Reason::UnclosedThink => "unclosed_think",
            Reason::Timeout => "timeout",
        }
    }

    /// Whether this reason means the answer was judged correct.
    pub fn is_correct(self) -> bool {
        !matches!(
            self,
            Reason::Mismatch | Reason::NoAnswer | Reason::UnclosedThink | Reason::Timeout
        )
    }

    /// Inverse of [`Reason::as_str`].
    pub fn parse(s: &str) -> Option<Reason> {
        Reason::ALL.iter().copied().find(|r| r.as_str() == s)
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome of grading one completion.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub correct: bool,
    pub reason: Reason,
    /// The extracted answer, when extraction succeeded.
    pub extracted: Option<String>,
}

/// A deadline plus a cheap tick counter so loops can check the clock rarely.
#[derive(Debug)]
pub struct Budget {
    deadline: Instant,
    ticks: u32,
    expired: bool,
}

impl Budget {
    /// A budget that expires `limit` from now.
    pub fn new(limit: Duration) -> Budget {
        let now = Instant::now();
        let deadline = now.checked_add(limit).unwrap_or(now);
        Budget {
            deadline,
            ticks: 0,
            expired: false,
        }
    }

    /// Count one unit of work; returns false once the deadline has passed.
    pub fn tick(&mut self) -> bool {
        if self.expired {
            return false;
        }
        self.ticks = self.ticks.wrapping_add(1);
        if self.ticks.is_multiple_of(64) && Instant::now() >= self.deadline {
            self.expired = true;
        }
        !self.expired
    }

    /// Whether the deadline has been seen to pass (checks the clock now).
    pub fn expired(&mut self) -> bool {
        if !self.expired && Instant::now() >= self.deadline {
            self.expired = true;
        }
        self.expired
    }
}

/// Find the final answer in a completion. Errors are `NoAnswer` or `UnclosedThink`.
pub fn extract_answer(completion: &str, opts: &GradeOptions) -> Result<Extracted, Reason> {
    extract::extract_answer(completion, opts)
}

/// Decide whether `pred` (an extracted answer) equals `gold` (a bare answer).
/// Returns how they matched, or `Mismatch` / `Timeout`.
pub fn is_equivalent(pred: &str, gold: &str, opts: &GradeOptions) -> Reason {
    equiv::is_equivalent(pred, gold, opts)
}

/// Extract the answer from `completion` and compare it with `gold`.
pub fn grade(completion: &str, gold: &str, opts: &GradeOptions) -> Verdict {
    match extract_answer(completion, opts) {
        Err(reason) => Verdict {
            correct: false,
            reason,
            extracted: None,
        },
        Ok(ex) => {
            let reason = is_equivalent(&ex.answer, gold, opts);
            Verdict {
                correct: reason.is_correct(),
                reason,
                extracted: Some(ex.answer),
            }
        }
    }
}

#[cfg(test)]
mod tests;

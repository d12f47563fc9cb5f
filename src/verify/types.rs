//! The verifier's vocabulary: the options a grade takes, how an answer was found, the verdict
//! and its reason, and the work budget every comparison runs under. The files of `verify`
//! import these from here; `verify/mod.rs` re-exports them and composes the steps, so no two
//! files of the verifier import each other.

use std::time::{Duration, Instant};

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
    /// The value stated by the closing sentence of a completion without a box
    /// (`So the smallest $k$ is 12.`).
    Statement,
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
            ExtractMethod::Statement => "statement",
            ExtractMethod::LastNumber => "last_number",
        }
    }
}

/// An answer pulled out of a completion.
#[derive(Clone, Debug, PartialEq)]
pub struct Extracted {
    pub answer: String,
    pub method: ExtractMethod,
    /// When the completion ends with several boxes separated only by commas, `and`, `or`,
    /// spacing or `$` (`\boxed{4}, \boxed{9}`): their contents joined by `, `, in order.
    /// [`super::grade`] reads it instead of `answer` when the gold is a list or a set.
    pub list_alternative: Option<String>,
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

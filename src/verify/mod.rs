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
pub mod eval;
pub mod expr;
pub mod extract;
pub mod normalize;
mod types;
pub mod units;

pub use normalize::normalize_answer;
pub use types::{Budget, ExtractMethod, Extracted, GradeOptions, Reason, Verdict};

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

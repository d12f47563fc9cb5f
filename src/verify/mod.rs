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
//!    last `\boxed{}` / `\fbox{}` / `\framebox{}` (unless an answer statement with a
//!    value follows it: `so the final answer is $2,310$` wins over the boxes), else
//!    Minerva's `Final Answer: The final answer is x`, else GSM8K's `#### x`, else
//!    `The answer is x` / `Answer: x`, else the value the closing sentence states
//!    (`So the smallest $k$ is 12.` gives `12`), else (only with
//!    [`GradeOptions::last_number_fallback`]) the last number in the text. Several boxes
//!    that end the completion with only separators between them (`\boxed{4}, \boxed{9}`)
//!    are also kept joined as [`Extracted::list_alternative`].
//! 2. [`normalize_answer`] ([`normalize`]): one canonical string per answer.
//! 3. [`is_equivalent`] ([`equiv`]): exact string, then differing units ([`units`]), then
//!    normalised string, then shapes (tuples, intervals, sets, matrices, equations,
//!    inequalities, choices, text), then exact rationals, then symbolic expressions
//!    evaluated at several points ([`expr`]).
//! 4. [`grade`]: when the gold is a list or a set ([`equiv::is_list_answer`]) and the
//!    completion ends with several boxes, the joined boxes are compared first; otherwise
//!    (or when they do not match) the single extracted answer.
//!
//! # Decisions
//! * **Gold** is a bare answer: it is never extracted from, only normalised. One wrapping
//!   `\boxed{…}` (and `$…$`) around the whole gold is stripped, which is harmless, and so
//!   are trailing periods and stray trailing backslashes on either side (`\boxed{B}.`,
//!   `42\`, `42.`, `42\\` are `B` and `42`).
//! * **Several boxes**: the last box is the answer, except that an answer statement with a
//!   value after it (`the final answer is`, `Answer:`, `####`, followed by math, a digit, a
//!   sign or a bracket) wins. Boxes that end the completion separated only by commas,
//!   `;`, `and`, `or`, spacing or `$` are one list answer when the gold is a list or a set
//!   (`\boxed{4}, \boxed{9}` equals `4, 9`; two boxed tuples equal a gold of two tuples);
//!   against a single gold the last box alone counts.
//! * **No box**: the closing sentence of the completion counts when it states a value
//!   (`... is/are/equals/= <value>.`): the value after its last such verb outside math (a
//!   math span, or a number up to a clause break), or without such a verb its last math
//!   span when it holds `=` (`Thus $x=5$.`). Only the last sentence of the last paragraph
//!   is read, never the middle of the reasoning; `The answer is` forms come first.
//! * **Percent**: `50\%` equals both `50` and `0.5` (the `%` may be read as a unit or as
//!   `/100`), on either side; `50 percent` and `50 per cent` are `50\%`. Without a `%`
//!   sign, `50` never equals `0.5`.
//! * **Units and decorations** (`\text{ cm}`, `^\circ`, `\$`, `dollars`, thousands
//!   separators, `x =` prefixes) are ignored: `10^\circ` equals `10`, `\$18.00` equals `18`,
//!   and a number with a unit equals the bare number (Minerva's `1.6 \mathrm{~cm}` is `1.6`).
//!   Two answers that both carry known units ([`units`]) are equal only when the units are
//!   the same after spelling (`m`, `meters`, `\mathrm{~m}`): `5\text{ m}` is not
//!   `5\text{ cm}`. Units are never converted: `100 cm` is not `1 m`, `\$7` (a leading
//!   `\$` is the unit `$`) is not `7 cents`. A degree sign with a scale is a temperature:
//!   `20^\circ\text{C}` is not `20^\circ\text{F}`, while `20^\circ` (no scale) equals
//!   both. Unknown words after a number on both sides must agree too (lower case,
//!   singular): `3 pears` is not `3 plums`; a word on one side only still equals the bare
//!   number (`5 \text{ students}` is `5`), and a known unit against an unknown word is no
//!   difference.
//! * **Thousands separators**: `2,310` and `32,\!348` are numbers; a comma followed by a
//!   space separates list items, so `300, 400` is a list and not `300400`.
//! * **Decimals**: a decimal equals an exact value when they are equal as rationals.
//!   A decimal with at least 4 significant digits that is the exact value correctly
//!   rounded at its last written digit is also accepted (reason `numeric`):
//!   `1.414` matches `\sqrt{2}` and `4.667` matches `\frac{14}{3}`, but `1.41`, `0.33`
//!   and `3.14` do not. Two decimals must be equal as rationals.
//! * **Symbolic** comparison evaluates both sides in complex floating point at three
//!   variable assignments and accepts a relative difference below 1e-9.
//! * **Mixed numbers**: `2\frac{1}{2}` is 5/2 (an integer directly followed by a fraction
//!   of two integers); `2\frac{\pi}{3}` stays a product.
//! * **Bare lists** `3, 5` are unordered (`5, 3` matches), and so are alternatives joined
//!   by `or` / `and` (`3 or 5`, `3 \text{ or } 5`); parenthesised tuples and intervals are
//!   ordered and their bracket kinds must agree (`(1;4;-3)` is the tuple `(1,4,-3)`);
//!   `\{…\}` sets, and `{…}` sets in plain braces with a comma (`{-7, 7}` equals
//!   `\pm 7`), are unordered and ignore repeated elements (`\{1,1,2\}` is `\{1,2\}`);
//!   bare lists keep their multiplicities.
//! * **Labels**: a left side that only names the value (a variable, a tuple of variables
//!   `(a,b)`, a function value `f(x)`, a length `|PQ|`, a ratio of names `AB:CD`, an angle
//!   `\angle ABC`, a segment or area name) is dropped before `=` or `\approx`:
//!   `(a,b)=(5,1)` is `(5,1)`, `AB:CD=3:7` is `3:7`, `|PQ|=2` and `y \approx 7` are the
//!   numbers. Two equations with different labels compare as equations (`x=5` is not
//!   `y=5`), and `2x=10` is not `10`.
//! * **Inequalities** are the interval of values they allow, for a variable, a subscripted
//!   or Greek variable, a function value (`0<g(t)<2` is `(0,2)`), a negated variable
//!   (`-t>-3` is `t<3`) or an absolute value (`2\le|w|\le 5` is
//!   `[-5,-2]\cup[2,5]`); strictness counts (`t<3` is not `t\le 3`).
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
//! not convert units (`100 cm` is not `1 m`, and an unknown word against a known unit is
//! not compared), and an answer longer than
//! [`equiv::MAX_COMPARE_LEN`] bytes is compared as a string only.

pub mod equiv;
pub mod eval;
pub mod expr;
pub mod extract;
pub mod normalize;
pub mod steps;
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

/// Extract the answer from `completion` and compare it with `gold`. When the completion
/// ends with several boxes and the gold is a list or a set, the joined boxes are tried
/// first (see [`Extracted::list_alternative`]).
pub fn grade(completion: &str, gold: &str, opts: &GradeOptions) -> Verdict {
    match extract_answer(completion, opts) {
        Err(reason) => Verdict {
            correct: false,
            reason,
            extracted: None,
        },
        Ok(ex) => {
            if let Some(list) = ex.list_alternative.as_deref() {
                if equiv::is_list_answer(gold) {
                    let reason = is_equivalent(list, gold, opts);
                    if reason.is_correct() {
                        return Verdict {
                            correct: true,
                            reason,
                            extracted: Some(list.to_string()),
                        };
                    }
                }
            }
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

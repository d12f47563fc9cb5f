//! Arithmetic steps stated in a completion: finds its explicit numeric equalities (`33 + 8 = 41`,
//! `3 \times 4 = 12`, `\frac{1}{2}+\frac{1}{3}=\frac{5}{6}`, chains `a = b = c`, GSM8K's
//! `<<48/2=24>>`) and evaluates both sides with the verifier's exact rational evaluator, so that
//! the filter can drop a right final answer reached through a false step.
//!
//! What counts as a claim, conservatively (a false alarm drops a good training row):
//! * an equality of two sides made of numbers, `+ - * / ^ !`, brackets, `\frac`, `\sqrt`,
//!   `\cdot`, `\times`, `\div` (and `×`, `·`, `÷`, `−`, and `x` between two numbers), one of
//!   them computing something: two bare numbers (`Day 2 = 5`) are a label, never checked;
//! * no letter, no unit, no constant such as `\pi`, no `%` and no irrational value on either side
//!   (such an equality is not checked); `\approx` and `≈` are never a claim of equality;
//! * a side cut off by words is not a side: `half of 48 = 24` checks nothing, `48 = 4 dozen`
//!   checks nothing, `2 apples + 3 apples = 5 apples` checks nothing;
//!   a side after a command (`5 \star 1 = 47`), after a word with a leading sign (`x - 4 = 5`),
//!   or next to a number broken by punctuation (`14, 400 / 80`) is not checked either; numbers
//!   with leading zeros (`0900`, a time) are not numbers here;
//! * a rounded decimal equals the exact value at its stated precision (`1/3 = 0.333`), and a
//!   computation with rounded decimals in it is true within 1% (`3.33 \times 3 = 10`);
//! * a value off by an exact power of ten (up to a million) or by 60 or 3600 is a unit
//!   changed on the way (`\$2.50 - \$2.24 = 26` cents, `5 \times 3 = 15,000` when the 5 was
//!   thousands), not a false step;
//! * `a / b/c` (a tight fraction after a division) divides by the fraction, and `a / b / c` is
//!   read both ways (`28 / 1/5 = 140`, `14 / 1 / 4 = 56`).
//!
//! Bounded: texts longer than [`MAX_TEXT`] bytes are cut, and a [`Budget`] of [`TIME_LIMIT`]
//! ends the search (nothing found is then "no false step"). Knows nothing of gold answers.

use std::time::Duration;

use num_rational::BigRational;

use super::eval::{exact, rational_to_f64};
use super::expr::parse;
use super::types::Budget;

/// The longest text searched, in bytes (longer completions are searched up to here).
pub const MAX_TEXT: usize = 200_000;
/// The time one completion may take.
pub const TIME_LIMIT: Duration = Duration::from_millis(50);

/// Words that join a number to what comes before or after it arithmetically (`half of 48`,
/// `48 = 4 dozen`): a side next to one of them is not the whole operand.
const JOINING_WORDS: &[&str] = &[
    "of",
    "times",
    "by",
    "per",
    "plus",
    "minus",
    "over",
    "divided",
    "multiplied",
    "dozen",
    "dozens",
    "hundred",
    "hundreds",
    "thousand",
    "thousands",
    "million",
    "millions",
    "billion",
    "billions",
    "trillion",
    "half",
    "halves",
    "third",
    "thirds",
    "quarter",
    "quarters",
    "percent",
    "squared",
    "cubed",
    "factorial",
    "th",
    "st",
    "nd",
    "rd",
    "each",
    "x",
    "and",
    "full",
    "whole",
    "remainder",
    "r",
];

/// The first false numeric equality `text` states, as written (`33 + 8 = 91`), if any.
pub fn false_step(text: &str) -> Option<String> {
    let text = super::extract::prefix_at_boundary(text, MAX_TEXT);
    let mut budget = Budget::new(TIME_LIMIT);
    let (annotations, rest) = gsm8k_annotations(text);
    for a in &annotations {
        let toks = tokenize(a);
        if let Some(f) = check_run(&toks, &Around::default(), &mut budget) {
            return Some(f);
        }
    }
    let toks = tokenize(&rest);
    let mut start = 0usize;
    for (i, t) in toks.iter().enumerate().chain([(toks.len(), &Tok::End)]) {
        if !matches!(t, Tok::Break(_) | Tok::End) {
            continue;
        }
        if !budget.tick() {
            return None;
        }
        let around = Around {
            before: start.checked_sub(1).and_then(|k| toks.get(k)),
            before_that: toks[..start.saturating_sub(1)]
                .iter()
                .rev()
                .find(|t| **t != Tok::Space),
            after: toks.get(i),
            after_that: toks.get(i + 1),
        };
        if let Some(f) = check_run(&toks[start..i], &around, &mut budget) {
            return Some(f);
        }
        start = i + 1;
    }
    None
}

/// GSM8K's calculator annotations `<<48/2=24>>`, and the text with each replaced by a space.
fn gsm8k_annotations(text: &str) -> (Vec<String>, String) {
    let mut found = Vec::new();
    let mut rest = String::with_capacity(text.len());
    let mut s = text;
    while let Some(i) = s.find("<<") {
        let Some(j) = s[i + 2..].find(">>") else {
            break;
        };
        rest.push_str(&s[..i]);
        rest.push(' ');
        let inner = &s[i + 2..i + 2 + j];
        if inner.len() <= 200 {
            found.push(inner.to_string());
        }
        s = &s[i + 2 + j + 2..];
    }
    rest.push_str(s);
    (found, rest)
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    /// Digits (thousands separators dropped) and whether they have a decimal point, with the
    /// number of decimal places.
    Num(String, Option<usize>),
    /// `+ - * / ^ ! ( ) { } =`.
    Op(char),
    /// `frac` or `sqrt`.
    Cmd(&'static str),
    Space,
    /// What ends a run of arithmetic: a word (lowercased), a command's name after `\\`, or
    /// another mark.
    Break(String),
    /// The end of the text (never in the token list).
    End,
}

fn tokenize(text: &str) -> Vec<Tok> {
    let chars: Vec<char> = text.chars().collect();
    let mut out: Vec<Tok> = Vec::new();
    let at = |k: usize| chars.get(k).copied();
    let mut i = 0;
    while let Some(c) = at(i) {
        // `x` between numbers is a multiplication: `3 x 4`, `3 x $5`
        let is_times_x = (c == 'x' || c == 'X')
            && !at(i + 1).is_some_and(|n| n.is_alphanumeric())
            && !i
                .checked_sub(1)
                .and_then(at)
                .is_some_and(|p| p.is_alphabetic())
            && matches!(
                out.iter().rev().find(|t| **t != Tok::Space),
                Some(Tok::Num(..) | Tok::Op(')'))
            )
            && chars[i + 1..]
                .iter()
                .find(|n| !n.is_whitespace() && **n != '$')
                .is_some_and(|n| n.is_ascii_digit() || *n == '(');
        if c.is_ascii_digit() || (c == '.' && at(i + 1).is_some_and(|n| n.is_ascii_digit())) {
            let (tok, next) = number(&chars, i);
            out.push(tok);
            i = next;
        } else if is_times_x {
            out.push(Tok::Op('*'));
            i += 1;
        } else if c.is_alphabetic() {
            let word: String = chars[i..]
                .iter()
                .take_while(|c| c.is_alphabetic())
                .collect();
            i += word.chars().count();
            out.push(Tok::Break(word.to_lowercase()));
        } else if c == '\\' {
            let name: String = chars[i + 1..]
                .iter()
                .take_while(|c| c.is_ascii_alphabetic())
                .collect();
            i += 1 + name.len();
            match name.as_str() {
                "" => {
                    // `\,` `\;` `\!` `\ ` are spaces, `\\` a line break, `\(` `\[` delimiters
                    match at(i) {
                        Some(',' | ';' | '!' | ':' | ' ' | '(' | ')' | '[' | ']') => {
                            out.push(Tok::Space)
                        }
                        other => out.push(Tok::Break(format!("\\{}", other.unwrap_or(' ')))),
                    }
                    i += 1;
                }
                "frac" | "dfrac" | "tfrac" => out.push(Tok::Cmd("frac")),
                "sqrt" => out.push(Tok::Cmd("sqrt")),
                "cdot" | "times" => out.push(Tok::Op('*')),
                "div" => out.push(Tok::Op('/')),
                "left" | "right" | "quad" | "qquad" | "displaystyle" => out.push(Tok::Space),
                // the box's braces group its content: `3 + 4 = \boxed{7}`
                "boxed" => {}
                _ => out.push(Tok::Break(format!("\\{name}"))),
            }
        } else {
            i += 1;
            let tok = match c {
                '*' if at(i) == Some('*') => {
                    // Markdown bold, not a power
                    i += 1;
                    Tok::Space
                }
                '+' | '-' | '*' | '/' | '^' | '!' | '(' | ')' | '{' | '}' | '=' => Tok::Op(c),
                '×' | '·' | '⋅' => Tok::Op('*'),
                '÷' => Tok::Op('/'),
                '−' | '–' => Tok::Op('-'),
                '$' | '&' => Tok::Space,
                c if c.is_whitespace() && c != '\n' => Tok::Space,
                other => Tok::Break(other.to_string()),
            };
            out.push(tok);
        }
    }
    out
}

/// A number at `start`: digits with `,` thousands separators (`2,310`, not `2, 310` or `2,31`)
/// and at most one decimal point.
fn number(chars: &[char], start: usize) -> (Tok, usize) {
    let mut digits = String::new();
    let mut decimals: Option<usize> = None;
    let mut i = start;
    while let Some(&c) = chars.get(i) {
        let digit_at = |k: usize| chars.get(k).is_some_and(char::is_ascii_digit);
        if c.is_ascii_digit() {
            digits.push(c);
            if let Some(d) = decimals.as_mut() {
                *d += 1;
            }
            i += 1;
        } else if let Some(skip) = thousands_separator(chars, i)
            .filter(|&k| decimals.is_none() && !digits.is_empty() && group_of_three(chars, i + k))
        {
            i += skip;
        } else if c == '.' && decimals.is_none() && digit_at(i + 1) {
            digits.push('.');
            decimals = Some(0);
            i += 1;
        } else {
            break;
        }
    }
    (Tok::Num(digits, decimals), i)
}

/// The length of a thousands separator at `i`: `,` (not `, `), LaTeX's `{,}` and `,\!`.
fn thousands_separator(chars: &[char], i: usize) -> Option<usize> {
    let at = |k: usize| chars.get(i + k).copied();
    match (at(0), at(1), at(2)) {
        (Some(','), Some('\\'), Some('!')) => Some(3),
        (Some('{'), Some(','), Some('}')) => Some(3),
        (Some(','), _, _) => Some(1),
        _ => None,
    }
}

/// Exactly three digits at `i`, not followed by a fourth.
fn group_of_three(chars: &[char], i: usize) -> bool {
    let digit_at = |k: usize| chars.get(k).is_some_and(char::is_ascii_digit);
    (0..3).all(|k| digit_at(i + k)) && !digit_at(i + 3)
}

/// A side of an equality: its text for the parser, whether it computes something, and its
/// decimal places (the coarsest of its decimals, if any).
struct Side {
    text: String,
    /// `a / b / c` read as `a / (b / c)`, when the side has such a chain.
    alt: Option<String>,
    /// As written, spaces collapsed.
    shown: String,
    computes: bool,
    decimals: Option<usize>,
}

/// The side made of `toks`, or `None` when it is not a whole arithmetic expression (empty,
/// starting or ending with an operator, unbalanced, two numbers side by side).
fn side(toks: &[Tok]) -> Option<Side> {
    let mut shown = String::new();
    for t in toks {
        match t {
            Tok::Num(d, _) => shown.push_str(d),
            Tok::Op(c) => shown.push(*c),
            Tok::Cmd(name) => {
                shown.push('\\');
                shown.push_str(name);
            }
            _ => shown.push(' '),
        }
    }
    let shown = shown.split_whitespace().collect::<Vec<_>>().join(" ");
    // a tight `b/c` between numbers is one fraction (`25 / 1/3` divides by a third)
    let tight = |k: usize| {
        matches!(toks.get(k), Some(Tok::Num(..)))
            && toks.get(k + 1) == Some(&Tok::Op('/'))
            && matches!(toks.get(k + 2), Some(Tok::Num(..)))
    };
    let mut grouped: Vec<(usize, &Tok)> = Vec::new();
    let mut k = 0;
    let mut tight_at = Vec::new();
    while k < toks.len() {
        if tight(k) {
            tight_at.push(grouped.len());
        }
        if toks[k] != Tok::Space {
            grouped.push((k, &toks[k]));
        }
        k += 1;
    }
    let toks: Vec<&Tok> = grouped.iter().map(|(_, t)| *t).collect();
    let (first, last) = (toks.first()?, toks.last()?);
    if matches!(first, Tok::Op('+' | '*' | '/' | '^' | '!' | ')' | '}')) {
        return None;
    }
    if matches!(
        last,
        Tok::Op('+' | '-' | '*' | '/' | '^' | '(' | '{') | Tok::Cmd(_)
    ) {
        return None;
    }
    let mut depth = 0i32;
    let mut text = String::new();
    let mut alt = String::new();
    let mut chain = false;
    let mut computes = false;
    let mut decimals: Option<usize> = None;
    let mut k = 0;
    while k < toks.len() {
        let t = toks[k];
        // `n / b / c`: a chain of divisions, read both ways
        let divides = k > 0 && toks[k - 1] == &Tok::Op('/');
        let pair = matches!(t, Tok::Num(..))
            && toks.get(k + 1) == Some(&&Tok::Op('/'))
            && matches!(toks.get(k + 2), Some(Tok::Num(..)));
        if pair && (tight_at.contains(&k) || divides) {
            let (Tok::Num(b, pb), Tok::Num(c, pc)) = (t, toks[k + 2]) else {
                return None;
            };
            if leading_zero(b) || leading_zero(c) {
                return None;
            }
            for p in [pb, pc].into_iter().flatten() {
                decimals = Some(decimals.map_or(*p, |q| q.min(*p)));
            }
            if k > 0 && matches!(toks[k - 1], Tok::Num(..)) {
                return None;
            }
            computes = true;
            let group = format!("({b} /{c} )");
            if tight_at.contains(&k) {
                text.push_str(&group);
            } else {
                text.push_str(&format!("{b} /{c} "));
            }
            chain |= divides && !tight_at.contains(&k);
            alt.push_str(&group);
            k += 3;
            continue;
        }
        let piece = match t {
            Tok::Num(d, places) => {
                if k > 0 && matches!(toks[k - 1], Tok::Num(..)) || leading_zero(d) {
                    return None;
                }
                if let Some(p) = places {
                    decimals = Some(decimals.map_or(*p, |q| q.min(*p)));
                }
                format!("{d} ")
            }
            Tok::Op(c) => {
                match c {
                    '(' | '{' => depth += 1,
                    ')' | '}' => depth -= 1,
                    '-' if k == 0 => {}
                    _ => computes = true,
                }
                if depth < 0 {
                    return None;
                }
                c.to_string()
            }
            Tok::Cmd(name) => {
                computes = true;
                format!("\\{name}")
            }
            _ => return None,
        };
        text.push_str(&piece);
        alt.push_str(&piece);
        k += 1;
    }
    (depth == 0).then_some(Side {
        text,
        alt: chain.then_some(alt),
        shown,
        computes,
        decimals,
    })
}

/// `0900`, `007`: a time or a code, not a number to compute with.
fn leading_zero(digits: &str) -> bool {
    digits.len() > 1 && digits.starts_with('0') && !digits.starts_with("0.")
}

/// The tokens around a run of arithmetic: the break before it and the token before that, the
/// break after it and the token after that.
#[derive(Default)]
struct Around<'a> {
    before: Option<&'a Tok>,
    before_that: Option<&'a Tok>,
    after: Option<&'a Tok>,
    after_that: Option<&'a Tok>,
}

/// Whether a break next to a run (`adjacent`: with no space between) cuts its outer side off
/// from what it belongs to.
fn cuts(b: Option<&Tok>, adjacent: bool) -> bool {
    let Some(Tok::Break(mark)) = b else {
        return false;
    };
    if JOINING_WORDS.contains(&mark.as_str()) || mark.starts_with('\\') {
        return true;
    }
    // a word, a command, `%`, `°`, a subscript, a time's colon right against a number belong
    // to it; sentence punctuation does not
    adjacent
        && !matches!(
            mark.as_str(),
            "." | "," | ";" | "?" | "\n" | "]" | "[" | "\"" | "'"
        )
}

/// A side that names rather than computes: a bare number, or a range `1-2` (ascending: `50-8`
/// is a subtraction).
fn is_label(s: &Side) -> bool {
    let range = s.shown.split_once('-').is_some_and(|(a, b)| {
        let (a, b) = (a.parse::<u64>(), b.parse::<u64>());
        matches!((a, b), (Ok(a), Ok(b)) if a < b)
    });
    !s.computes || range
}

/// Whether `t` is a word (or a command).
fn is_word(t: Option<&Tok>) -> bool {
    matches!(t, Some(Tok::Break(w)) if w.starts_with(|c: char| c.is_alphabetic() || c == '\\'))
}

/// Whether `t` is sentence punctuation.
fn is_punctuation(t: Option<&Tok>) -> bool {
    matches!(t, Some(Tok::Break(w)) if matches!(w.as_str(), "." | "," | ";"))
}

/// The first false equality of one run of arithmetic (between two breaks, see [`Around`]).
fn check_run(run: &[Tok], around: &Around, b: &mut Budget) -> Option<String> {
    let (before, after) = (around.before, around.after);
    if !run.contains(&Tok::Op('=')) {
        return None;
    }
    let parts: Vec<&[Tok]> = run.split(|t| *t == Tok::Op('=')).collect();
    if parts.len() > 32 {
        return None;
    }
    let first_tok = run.iter().find(|t| **t != Tok::Space);
    let last_tok = run.iter().rev().find(|t| **t != Tok::Space);
    let sides: Vec<Option<Side>> = parts.iter().map(|p| side(p)).collect();
    let left_cut = cuts(before, run.first() != Some(&Tok::Space))
        // `x - 4 = 5`: a sign after a word or a mark is the end of a longer expression
        || (matches!(first_tok, Some(Tok::Op('-' | '+')))
            && before.is_some()
            && !is_punctuation(before)
            && before != Some(&Tok::Break("\n".into())))
        // `14, 400 / 80`, `.8 + . 84`: a number broken by punctuation
        || (is_punctuation(before) && matches!(around.before_that, Some(Tok::Num(..) | Tok::Op(_))))
        // `Remaining 10 = 62,300/10`, `Weeks 1-2 = 96 - 70`: a bare number or a range after a
        // word is a label
        || (is_word(before) && sides.first().is_some_and(|s| s.as_ref().is_some_and(is_label)));
    let right_cut = cuts(after, run.last() != Some(&Tok::Space))
        // `0.\overline{3}`: punctuation against the number and the text goes on
        || (is_punctuation(after)
            && run.last() != Some(&Tok::Space)
            && matches!(last_tok, Some(Tok::Num(..)))
            && !matches!(around.after_that, None | Some(Tok::Space | Tok::End))
            && around.after_that != Some(&Tok::Break("\n".into())));
    // two bare numbers are a label (`Day 2 = 5`) unless a side of the chain computes
    let computes = sides.iter().flatten().any(|s| s.computes);
    if !computes {
        return None;
    }
    for k in 0..sides.len() - 1 {
        if (k == 0 && left_cut) || (k + 2 == sides.len() && right_cut) {
            continue;
        }
        let (Some(l), Some(r)) = (&sides[k], &sides[k + 1]) else {
            continue;
        };
        let (Some(lv), Some(rv)) = (value(&l.text, b), value(&r.text, b)) else {
            continue;
        };
        if lv == rv || rounded(l, r, &lv, &rv) || unit_changed(&lv, &rv) {
            continue;
        }
        // a chain of divisions, read the other way
        let other = |s: &Side, v: &BigRational, b: &mut Budget| {
            s.alt
                .as_deref()
                .and_then(|t| value(t, b))
                .unwrap_or_else(|| v.clone())
        };
        let (la, ra) = (other(l, &lv, b), other(r, &rv, b));
        if la == rv || lv == ra || la == ra {
            continue;
        }
        return Some(format!("{} = {}", l.shown, r.shown));
    }
    None
}

/// Whether two unequal values are one value at the precision written: a stated decimal
/// (a side that computes nothing) rounded at its last place (`1/3 = 0.333`), or a computation
/// with rounded decimals in it within 1% (`3.33 \times 3 = 10`).
fn rounded(l: &Side, r: &Side, lv: &BigRational, rv: &BigRational) -> bool {
    let (x, y) = (rational_to_f64(lv), rational_to_f64(rv));
    let diff = (x - y).abs();
    let stated = [l, r]
        .iter()
        .filter(|s| !s.computes)
        .filter_map(|s| s.decimals)
        .min();
    if let Some(p) = stated {
        if diff <= 0.5 * 10f64.powi(-(p.min(15) as i32)) * (1.0 + 1e-9) {
            return true;
        }
    }
    let computed_decimals = [l, r].iter().any(|s| s.computes && s.decimals.is_some());
    computed_decimals && diff <= 0.01 * x.abs().max(y.abs())
}

/// Whether two values differ by a unit changed on the way: an exact power of ten up to a
/// million (cents, percent, thousands) or 60 or 3600 (minutes, seconds).
fn unit_changed(l: &BigRational, r: &BigRational) -> bool {
    use num_traits::{Signed, Zero};
    if l.is_zero() || r.is_zero() {
        return false;
    }
    let ratio = if l.abs() > r.abs() { l / r } else { r / l };
    let factors = [10u64, 100, 1000, 10_000, 100_000, 1_000_000, 60, 3600];
    factors
        .iter()
        .any(|&f| ratio == BigRational::from_integer(f.into()))
}

/// The exact value of a side, when it is rational.
fn value(text: &str, b: &mut Budget) -> Option<BigRational> {
    let node = parse(text, b)?;
    exact(&node, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn flags(text: &str) {
        assert!(
            false_step(text).is_some(),
            "expected a false step in {text:?}"
        );
    }

    #[track_caller]
    fn passes(text: &str) {
        assert_eq!(false_step(text), None, "expected no false step in {text:?}");
    }

    #[test]
    fn false_equalities_are_found() {
        flags("She has 33 + 8 = 91 apples.");
        flags("So $3 \\times 4 = 13$.");
        flags("$\\frac{1}{2}+\\frac{1}{3}=\\frac{4}{5}$");
        flags("Then 2 * 3 = 6 = 7.");
        flags("Natalia sold 48/2 = <<48/2=25>>25 clips in May.");
        flags("**3 + 4 = 8**");
        flags("3 x 4 = 11");
        flags("$5! = 100$");
        flags("2^{10} = 1000");
        flags("1,000 + 2,000 = 4,000 people");
        flags("1/3 = 0.34");
        flags("2/3 = 0.66");
        flags("3 + 4 = \\boxed{8}");
        assert_eq!(
            false_step("So 33 + 8 = 91.").as_deref(),
            Some("33 + 8 = 91")
        );
    }

    #[test]
    fn true_equalities_and_non_claims_pass() {
        passes("She has 33 + 8 = 41 apples.");
        passes("$\\frac{1}{2}+\\frac{1}{3}=\\frac{5}{6}$");
        passes("$3 \\cdot 4 = 12$ and $12 \\div 4 = 3$");
        passes("Natalia sold 48/2 = <<48/2=24>>24 clips in May.");
        passes("1/3 = 0.333, and 2/3 = 0.67");
        passes("3.33 * 3 = 10 dollars");
        passes("$3 x $5 = $15");
        passes("x + 3 = 5, so x = 2");
        passes("2x = 10");
        passes("$\\pi r^2 = 3$");
        passes("\\sqrt{2} = 1.41");
        passes("half of 48 = 24");
        passes("48 = 4 dozen");
        passes("20% of 50 = 10");
        passes("50% = 0.5");
        passes("Day 2 = 5 apples");
        passes("2 apples + 3 apples = 5 apples");
        passes("1/3 \\approx 0.3");
        passes("1/3 ≈ 0.3");
        passes("1 + 2 + \\cdots + 10 = 55");
        passes("101_2 = 5");
        passes("2:30 + 0:45 = 3:15");
        passes("The answer is 7.");
        passes("10 000 = 5");
        passes("300, 400 = 700");
        passes("f(2) = 4");
        passes("$\\binom{5}{2} = 11$");
        // the shapes of human-written solutions (GSM8K train, MATH-500) that are not errors
        passes("60 students x 2/3 = 40 students");
        passes("There are 3/ 1/4 = 12 one-fourth miles");
        passes("he used 25 / 1/3 = 75 total decorations");
        passes("it lasts 14 / 1 / 4 = 14 * 4 = 56 washes");
        passes("0900-0130 = 0730 hours");
        passes("$2.50 - $2.24 = 26 cents more");
        passes("$5\\star 1 = 9(5)+2(1)-(5)(1)+5= 45+2-5+5=47$");
        passes("Since $90^3=729,\\!000$, it is greater");
        passes("$\\frac{3}{2}\\cdot10,\\!000/12=\\boxed{1250}$");
        passes("$$\\frac{279}{99999} = 0.\\overline{00279},$$");
        passes("$x - 15 = 49 - 15$");
        passes("40 marbles - 3 - 5 = 32 marbles");
        passes("Remaining 10 = 62,300/10 = $6230");
        passes("read 14, 400 / 80 = 180 pages");
        passes("it takes 17/3 = 5 and 2/3 loads");
        passes("$2,430 – ($1,250 + $850) = $2,430 – $2,100 = $330");
        passes("5 * 3 = $15,000 when the losses are in thousands");
        passes("The totals are 2.46 because .8 + . 84 + .82 = 2.46");
        passes("Subtract Weeks 3-4 from Weeks 1-2 = 96 - 70 = 26");
        // and real errors in them, still found
        flags("$(-4)^2 + 4 \\cdot 1 \\cdot (-1) = 20$");
        flags("He caught 200*.55=100 pounds more");
        flags("she had 50-8 = <<52-8=44>>44 bracelets");
    }

    #[test]
    fn bounded_on_long_and_hostile_input() {
        let long = "1 + 1 = 2. ".repeat(50_000);
        let t = std::time::Instant::now();
        passes(&long);
        assert!(t.elapsed() < Duration::from_secs(2));
        passes(&"(".repeat(10_000));
        passes(&format!("{} = 1", "9^".repeat(200)));
        passes("<<<<>>>>");
        passes("<<1+1=2");
    }
}

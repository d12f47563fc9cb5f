//! Equivalence of a predicted answer and a gold answer.
//!
//! The ladder: identical strings (`exact`), answers whose units differ (`mismatch`, see
//! [`super::units::units_differ`]), identical normalised strings (`normalized`), then the
//! shape of the normalised answers: matrices (`matrix`), unions of intervals and
//! intervals (`interval`, bracket kinds must agree), tuples (`tuple`, ordered; `(1;4;-3)`
//! is `(1,4,-3)`), sets and bare answer lists (`set`, unordered; a `\{…\}` set, or a
//! `{…}` in plain braces with a comma, ignores repeated elements), equations up to a
//! nonzero factor, a label and its value (`(a,b)=(5,1)` is `(5,1)`, see
//! [`super::normalize::is_label`]) and inequalities against intervals (`equation`:
//! `-t>-3` is `t<3`, `0<g(t)<2` is `(0,2)`, `2\le|w|\le5` is `[-5,-2]\cup[2,5]`),
//! multiple-choice letters (`choice`), words (case-insensitive string comparison), and
//! scalars: exact rationals (`rational`), evaluation at points (`symbolic`) and
//! written-precision decimals (`numeric`).
//! See the module documentation of [`super`] for the decisions on percent, decimals and
//! mixed numbers.
//!
//! It does not know domains, and answers longer than [`MAX_COMPARE_LEN`] bytes
//! are compared as whitespace-free strings only. Recursion over shapes is limited to
//! [`MAX_SHAPE_DEPTH`], lists to [`MAX_ITEMS`] elements, and every step ticks the budget.

use num_bigint::BigInt;
use num_complex::Complex64;
use num_rational::BigRational;
use num_traits::Signed;

use super::eval;
use super::expr::{self, Node};
use super::normalize::{is_label, normalize_answer, strip_commands, strip_outer};
use super::types::{Budget, GradeOptions, Reason};

/// Longest answer (bytes) that gets more than a string comparison.
pub const MAX_COMPARE_LEN: usize = 2048;
/// Most elements in a tuple, set or list.
pub const MAX_ITEMS: usize = 64;
/// Deepest nesting of shapes (tuples of sets of ...).
pub const MAX_SHAPE_DEPTH: usize = 4;
/// Relative tolerance of numeric evaluation.
pub const REL_TOL: f64 = 1e-9;
/// Absolute floor of the numeric tolerance.
const ABS_TOL: f64 = 1e-12;
/// Variable assignments used for symbolic comparison.
const ROUNDS: u64 = 3;

/// See the module documentation.
pub fn is_equivalent(pred: &str, gold: &str, opts: &GradeOptions) -> Reason {
    let gold_bare = strip_outer(gold);
    let pred_trim = pred.trim();
    if !pred_trim.is_empty() && (pred_trim == gold_bare || pred_trim == gold.trim()) {
        return Reason::Exact;
    }
    // both with units: the same unit, or not equal (never a silent strip of both)
    if pred.len() <= MAX_COMPARE_LEN
        && gold.len() <= MAX_COMPARE_LEN
        && super::units::units_differ(strip_outer(pred), gold_bare)
    {
        return Reason::Mismatch;
    }
    if pred.len() > MAX_COMPARE_LEN || gold.len() > MAX_COMPARE_LEN {
        let squash = |s: &str| s.split_whitespace().collect::<String>();
        return if squash(pred_trim) == squash(gold_bare) {
            Reason::Normalized
        } else {
            Reason::Mismatch
        };
    }
    let p = normalize_answer(pred);
    let g = normalize_answer(gold);
    if p.is_empty() || g.is_empty() {
        return Reason::Mismatch;
    }
    if p == g {
        return Reason::Normalized;
    }
    let mut budget = Budget::new(opts.time_limit);
    match compare(&p, &g, 0, &mut budget) {
        Some(r) => r,
        None if budget.expired() => Reason::Timeout,
        None => Reason::Mismatch,
    }
}

/// Whether `gold` is a list or a set of at least two answers (`4, 9`, `\{1,2\}`,
/// `(1,2),(3,4)`): then [`super::grade`] also tries the boxes that end a completion
/// joined as one list.
pub fn is_list_answer(gold: &str) -> bool {
    if gold.len() > MAX_COMPARE_LEN {
        return false;
    }
    let g = normalize_answer(gold);
    match shape(&g) {
        Shape::Set(v) | Shape::List(v) => v.len() >= 2,
        _ => false,
    }
}

/// Compare two normalised answers; `None` means not shown equivalent.
fn compare(p: &str, g: &str, depth: usize, b: &mut Budget) -> Option<Reason> {
    if depth > MAX_SHAPE_DEPTH || !b.tick() || p.is_empty() || g.is_empty() {
        return None;
    }
    if p == g {
        return Some(Reason::Normalized);
    }
    if let Some(r) = compare_relations(p, g, depth, b) {
        return r;
    }
    let ps = shape(p);
    let gs = shape(g);
    compare_shapes(&ps, &gs, depth, b)
}

/// Equations and inequalities. `Some(result)` when the relation decided the comparison.
fn compare_relations(p: &str, g: &str, depth: usize, b: &mut Budget) -> Option<Option<Reason>> {
    let pe = split_equation(p);
    let ge = split_equation(g);
    match (pe, ge) {
        (Some((pl, pr)), Some((gl, gr))) => {
            if simple_lhs(pl) && pl == gl {
                return Some(compare(pr, gr, depth + 1, b));
            }
            return Some(equation_equiv((pl, pr), (gl, gr), b));
        }
        (Some((pl, pr)), None) if simple_lhs(pl) || is_constant(pl, b) => {
            return Some(compare(pr, g, depth + 1, b))
        }
        (None, Some((gl, gr))) if simple_lhs(gl) => return Some(compare(p, gr, depth + 1, b)),
        _ => {}
    }
    let pi = inequality_interval(p);
    let gi = inequality_interval(g);
    if pi.is_some() || gi.is_some() {
        let pp = pi.as_deref().unwrap_or(p);
        let gg = gi.as_deref().unwrap_or(g);
        let r = compare(pp, gg, depth + 1, b);
        return Some(r.map(|r| {
            if r == Reason::Normalized {
                Reason::Equation
            } else {
                r
            }
        }));
    }
    None
}

/// The shape of a normalised answer.
#[derive(Debug)]
enum Shape {
    Matrix(Vec<Vec<String>>),
    Union(Vec<String>),
    Set(Vec<String>),
    Bracket {
        open: u8,
        close: u8,
        items: Vec<String>,
    },
    List(Vec<String>),
    Scalar(String),
}

fn shape(s: &str) -> Shape {
    if let Some(m) = matrix(s) {
        return Shape::Matrix(m);
    }
    let parts = split_top(s, "\\cup");
    if parts.len() > 1 {
        return Shape::Union(parts.into_iter().map(str::to_string).collect());
    }
    if let Some(inner) = s.strip_prefix("\\{").and_then(|x| x.strip_suffix("\\}")) {
        if encloses(s) {
            return Shape::Set(items(inner));
        }
    }
    // `{-7,7}`: a set written with plain braces (a single `{5}` is only TeX grouping)
    if let Some(inner) = s.strip_prefix('{').and_then(|x| x.strip_suffix('}')) {
        if encloses(s) && split_top(inner, ",").len() > 1 {
            return Shape::Set(items(inner));
        }
    }
    if s == "\\emptyset" {
        return Shape::Set(Vec::new());
    }
    let bytes = s.as_bytes();
    if let (Some(&open @ (b'(' | b'[')), Some(&close @ (b')' | b']'))) =
        (bytes.first(), bytes.last())
    {
        let inner = s.get(1..s.len().saturating_sub(1)).unwrap_or("");
        // `(1;4;-3)`: semicolons separate a tuple's entries too
        if encloses(s) && (split_top(inner, ",").len() > 1 || split_top(inner, ";").len() > 1) {
            return Shape::Bracket {
                open,
                close,
                items: items(inner),
            };
        }
    }
    let list = items(s);
    if list.len() > 1 {
        let intervals: Vec<String> = list.iter().filter_map(|x| inequality_interval(x)).collect();
        if intervals.len() == list.len() {
            return Shape::Union(intervals);
        }
        return Shape::List(list);
    }
    Shape::Scalar(s.to_string())
}

fn compare_shapes(ps: &Shape, gs: &Shape, depth: usize, b: &mut Budget) -> Option<Reason> {
    use Shape::*;
    let d = depth + 1;
    match (ps, gs) {
        (Matrix(a), Matrix(c)) => {
            let same_dims = a.len() == c.len() && a.iter().zip(c).all(|(x, y)| x.len() == y.len());
            let flat_a: Vec<String> = a.iter().flatten().cloned().collect();
            let flat_c: Vec<String> = c.iter().flatten().cloned().collect();
            (same_dims && ordered(&flat_a, &flat_c, d, b)).then_some(Reason::Matrix)
        }
        (
            Matrix(m),
            Bracket {
                open: b'(',
                close: b')',
                items,
            },
        )
        | (
            Bracket {
                open: b'(',
                close: b')',
                items,
            },
            Matrix(m),
        ) => {
            let vector = m.len() == 1 || m.iter().all(|r| r.len() == 1);
            let flat: Vec<String> = m.iter().flatten().cloned().collect();
            (vector && ordered(&flat, items, d, b)).then_some(Reason::Matrix)
        }
        (Union(a), Union(c)) => unordered(a, c, d, b).then_some(Reason::Interval),
        (Set(a) | List(a), Set(c) | List(c)) => {
            if unordered(a, c, d, b) {
                return Some(Reason::Set);
            }
            // a set ignores repeated elements: `\{1,1,2\}` is `\{1,2\}` (only when one is
            // written twice: otherwise the lists of the same length were compared above)
            let is_set = matches!(ps, Set(_)) || matches!(gs, Set(_));
            let repeats = |v: &[String]| {
                v.iter()
                    .enumerate()
                    .any(|(i, x)| v.iter().skip(i + 1).any(|y| x == y))
            };
            let may_repeat = a.len() != c.len() || repeats(a) || repeats(c);
            (is_set && may_repeat && same_elements(a, c, d, b)).then_some(Reason::Set)
        }
        (Set(a), Scalar(_)) | (Scalar(_), Set(a)) if a.len() == 1 => {
            let (x, y) = match (ps, gs) {
                (Set(_), Scalar(s)) => (a.first()?.as_str(), s.as_str()),
                (Scalar(s), _) => (s.as_str(), a.first()?.as_str()),
                _ => return None,
            };
            compare(x, y, d, b).map(|_| Reason::Set)
        }
        (
            Bracket {
                open: o1,
                close: c1,
                items: a,
            },
            Bracket {
                open: o2,
                close: c2,
                items: c,
            },
        ) => {
            if o1 != o2 || c1 != c2 || !ordered(a, c, d, b) {
                return None;
            }
            let tuple = *o1 == b'(' && *c1 == b')' && !a.iter().any(|x| x.contains("\\infty"));
            let square_tuple = *o1 == b'[' && *c1 == b']' && a.len() > 2;
            Some(if tuple || square_tuple {
                Reason::Tuple
            } else {
                Reason::Interval
            })
        }
        (
            Bracket {
                open: b'(',
                close: b')',
                items: a,
            },
            List(c),
        )
        | (
            List(a),
            Bracket {
                open: b'(',
                close: b')',
                items: c,
            },
        ) => ordered(a, c, d, b).then_some(Reason::Tuple),
        (Scalar(x), Scalar(y)) => scalar(x, y, b),
        _ => None,
    }
}

/// Element-wise comparison in order.
fn ordered(a: &[String], c: &[String], depth: usize, b: &mut Budget) -> bool {
    a.len() == c.len()
        && !a.is_empty()
        && a.len() <= MAX_ITEMS
        && a.iter()
            .zip(c)
            .all(|(x, y)| compare(x, y, depth, b).is_some())
}

/// Greedy one-to-one matching in any order.
fn unordered(a: &[String], c: &[String], depth: usize, b: &mut Budget) -> bool {
    if a.len() != c.len() || a.is_empty() || a.len() > MAX_ITEMS {
        return false;
    }
    let mut used = vec![false; c.len()];
    for x in a {
        let mut found = false;
        for (j, y) in c.iter().enumerate() {
            if used.get(j) == Some(&false) && compare(x, y, depth, b).is_some() {
                if let Some(u) = used.get_mut(j) {
                    *u = true;
                }
                found = true;
                break;
            }
        }
        if !found {
            return false;
        }
    }
    true
}

/// Every element of each side equals some element of the other (sets with repeats).
fn same_elements(a: &[String], c: &[String], depth: usize, b: &mut Budget) -> bool {
    !a.is_empty()
        && !c.is_empty()
        && a.len() <= MAX_ITEMS
        && c.len() <= MAX_ITEMS
        && covers(a, c, depth, b)
        && covers(c, a, depth, b)
}

/// Every element of `x` equals some element of `y`.
fn covers(x: &[String], y: &[String], depth: usize, b: &mut Budget) -> bool {
    x.iter()
        .all(|u| y.iter().any(|v| compare(u, v, depth, b).is_some()))
}

/// Whether the first character's bracket closes at the last character.
fn encloses(s: &str) -> bool {
    let bytes = s.as_bytes();
    let mut depth: i64 = 0;
    let mut i = 0;
    while let Some(&c) = bytes.get(i) {
        let escaped = c == b'\\' && matches!(bytes.get(i + 1), Some(b'{' | b'}'));
        let ch = if escaped {
            bytes.get(i + 1).copied().unwrap_or(0)
        } else {
            c
        };
        let step = if escaped { 2 } else { 1 };
        match ch {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => {
                depth -= 1;
                if depth == 0 && i + step < bytes.len() {
                    return false;
                }
            }
            _ => {}
        }
        i += step;
    }
    depth == 0
}

/// Split at top-level occurrences of `sep` (outside any bracket).
fn split_top<'a>(s: &'a str, sep: &str) -> Vec<&'a str> {
    let bytes = s.as_bytes();
    let mut parts = Vec::new();
    let mut depth: i64 = 0;
    let mut start = 0;
    let mut i = 0;
    while let Some(&c) = bytes.get(i) {
        if depth == 0 && bytes.get(i..i + sep.len()) == Some(sep.as_bytes()) {
            parts.push(s.get(start..i).unwrap_or(""));
            i += sep.len();
            start = i;
            continue;
        }
        match c {
            b'\\' => {
                match bytes.get(i + 1) {
                    Some(b'{') => depth += 1,
                    Some(b'}') => depth -= 1,
                    _ => {}
                }
                i += 1;
            }
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            _ => {}
        }
        i += 1;
    }
    parts.push(s.get(start..).unwrap_or(""));
    parts
}

/// Top-level comma (or semicolon) separated items, with `\pm` / `\mp` expanded.
fn items(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in split_top(s, ",")
        .into_iter()
        .flat_map(|p| split_top(p, ";"))
    {
        if part.is_empty() {
            continue;
        }
        if part.contains("\\pm") || part.contains("\\mp") {
            let plus = part.replace("\\pm", "+").replace("\\mp", "-");
            let minus = part.replace("\\pm", "-").replace("\\mp", "+");
            out.push(plus.replace("+-", "-").replace("--", "+"));
            out.push(minus.replace("+-", "-").replace("--", "+"));
        } else {
            out.push(part.to_string());
        }
        if out.len() > MAX_ITEMS {
            break;
        }
    }
    out
}

/// Rows and columns of a `pmatrix` / `bmatrix` / `matrix` environment.
fn matrix(s: &str) -> Option<Vec<Vec<String>>> {
    let rest = s.strip_prefix("\\begin{")?;
    let (env, body) = rest.split_once('}')?;
    if !matches!(
        env,
        "pmatrix" | "bmatrix" | "matrix" | "Bmatrix" | "smallmatrix"
    ) {
        return None;
    }
    let body = body.strip_suffix(&format!("\\end{{{env}}}"))?;
    let rows: Vec<Vec<String>> = body
        .split("\\\\")
        .filter(|r| !r.trim().is_empty())
        .map(|r| r.split('&').map(|c| c.trim().to_string()).collect())
        .collect();
    (!rows.is_empty() && rows.len() <= MAX_ITEMS).then_some(rows)
}

/// `(first, last)` sides when `s` has top-level `=` (a chain `a=b=c` gives `(a, c)`) and no
/// top-level comma (`x=1,y=2` is a list; `(a,b)=(5,1)` is one equation).
fn split_equation(s: &str) -> Option<(&str, &str)> {
    if !s.contains('=') || (s.contains(',') && split_top(s, ",").len() > 1) {
        return None;
    }
    let parts = split_top(s, "=");
    match parts.as_slice() {
        [l, .., r] if !l.is_empty() && !r.is_empty() => Some((l, r)),
        _ => None,
    }
}

/// Whether `s` parses as an expression without variables (a worked value like `\frac{12}{4}`).
fn is_constant(s: &str, b: &mut Budget) -> bool {
    expr::parse(s, b).is_some_and(|n| {
        let mut vars = Vec::new();
        eval::variables(&n, &mut vars);
        vars.is_empty()
    })
}

/// A left-hand side that only names the answer (see [`is_label`]): `x`, `a_1`, `\theta`,
/// `f(x)`, `f'(x)`, `f^{-1}(x)`, `(a,b)`, `|PQ|`, `AB:CD`.
fn simple_lhs(l: &str) -> bool {
    is_label(l)
}

/// The set of values an inequality allows, as an interval or a union of two:
/// `x<2` → `(-\infty,2)`, `a\le x<b` → `[a,b)`, `-t>-3` → `(-\infty,3)`, `0<g(t)<2` →
/// `(0,2)`, `2\le|w|\le5` → `[-5,-2]\cup[2,5]`. The bounded quantity is a variable (see
/// [`is_var`]), its negation or its absolute value (whose bounds must not start with `-`).
fn inequality_interval(s: &str) -> Option<String> {
    let (parts, ops) = split_relations(s)?;
    let less = |op: &str| op == "<" || op == "\\le";
    let incl = |op: &str| op == "\\le" || op == "\\ge";
    type Bound = Option<(String, bool)>;
    let bound = |v: &str, op: &str| -> Bound { Some((v.to_string(), incl(op))) };
    let (term, lower, upper): (&str, Bound, Bound) = match (parts.as_slice(), ops.as_slice()) {
        ([a, x], [op]) if is_term(x) && !is_term(a) => {
            if less(op) {
                (*x, bound(a, op), None)
            } else {
                (*x, None, bound(a, op))
            }
        }
        ([x, a], [op]) if is_term(x) => {
            if less(op) {
                (*x, None, bound(a, op))
            } else {
                (*x, bound(a, op), None)
            }
        }
        ([a, x, c], [o1, o2]) if is_term(x) && less(o1) == less(o2) => {
            if less(o1) {
                (*x, bound(a, o1), bound(c, o2))
            } else {
                (*x, bound(c, o2), bound(a, o1))
            }
        }
        _ => return None,
    };
    let neg = |bd: &Bound| -> Bound { bd.as_ref().map(|(v, i)| (negate(v), *i)) };
    if is_var(term) {
        return Some(interval_text(&lower, &upper));
    }
    if let Some(v) = term.strip_prefix('-') {
        // `-t>-3`: `t<3`
        return is_var(v).then(|| interval_text(&neg(&upper), &neg(&lower)));
    }
    let v = term.strip_prefix('|').and_then(|x| x.strip_suffix('|'))?;
    let nonnegative = |bd: &Bound| bd.as_ref().is_none_or(|(x, _)| !x.starts_with('-'));
    if !is_var(v) || !nonnegative(&lower) || !nonnegative(&upper) {
        return None;
    }
    match (&lower, &upper) {
        (None, Some(_)) => Some(interval_text(&neg(&upper), &upper)),
        (Some(_), None) => Some(format!(
            "{}\\cup{}",
            interval_text(&None, &neg(&lower)),
            interval_text(&lower, &None)
        )),
        (Some(_), Some(_)) => Some(format!(
            "{}\\cup{}",
            interval_text(&neg(&upper), &neg(&lower)),
            interval_text(&lower, &upper)
        )),
        (None, None) => None,
    }
}

/// `(a,b]`, `(-\infty,b)`, ... from two bounds `(value, inclusive)`; `None` is infinite.
fn interval_text(lower: &Option<(String, bool)>, upper: &Option<(String, bool)>) -> String {
    let left = match lower {
        Some((v, true)) => format!("[{v}"),
        Some((v, false)) => format!("({v}"),
        None => "(-\\infty".to_string(),
    };
    let right = match upper {
        Some((v, true)) => format!("{v}]"),
        Some((v, false)) => format!("{v})"),
        None => "\\infty)".to_string(),
    };
    format!("{left},{right}")
}

/// `-a` as text: `3` for `-3`, `-x` for `x`, `-(1-x)` for `1-x`.
fn negate(a: &str) -> String {
    let signed = |t: &str| split_top(t, "+").len() > 1 || split_top(t, "-").len() > 1;
    if let Some(r) = a.strip_prefix('-') {
        if !r.is_empty() && !signed(r) {
            return r.to_string();
        }
    }
    if signed(a) {
        format!("-({a})")
    } else {
        format!("-{a}")
    }
}

/// What an inequality may bound: a variable, `-` a variable or `|`a variable`|`.
fn is_term(x: &str) -> bool {
    is_var(x)
        || x.strip_prefix('-').is_some_and(is_var)
        || x.strip_prefix('|')
            .and_then(|v| v.strip_suffix('|'))
            .is_some_and(is_var)
}

/// A quantity an inequality bounds: a letter or a Greek letter, optionally subscripted
/// (`x`, `x_1`, `t_{10}`, `\theta`), or its value at a short argument (`g(t)`, `f(x_1)`).
fn is_var(x: &str) -> bool {
    let (head, args) = match x.find('(') {
        Some(p) => match x.get(p + 1..).and_then(|a| a.strip_suffix(')')) {
            Some(args) => (x.get(..p).unwrap_or(""), Some(args)),
            None => return false,
        },
        None => (x, None),
    };
    if let Some(a) = args {
        if a.is_empty() || a.len() > 4 || !a.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return false;
        }
    }
    let (name, sub) = match head.split_once('_') {
        Some((n, sub)) => (n, Some(sub)),
        None => (head, None),
    };
    if let Some(sub) = sub {
        let sub = sub
            .strip_prefix('{')
            .and_then(|t| t.strip_suffix('}'))
            .unwrap_or(sub);
        if sub.is_empty() || sub.len() > 3 || !sub.chars().all(|c| c.is_ascii_alphanumeric()) {
            return false;
        }
    }
    let letter = name.len() == 1 && name.chars().all(|c| c.is_ascii_alphabetic());
    letter || name.strip_prefix('\\').is_some_and(expr::is_greek)
}

/// Split at top-level `<`, `>`, `\le`, `\ge`.
fn split_relations(s: &str) -> Option<(Vec<&str>, Vec<&'static str>)> {
    let mut parts = Vec::new();
    let mut ops = Vec::new();
    let mut start = 0;
    let mut i = 0;
    let bytes = s.as_bytes();
    while i < bytes.len() {
        let rest = s.get(i..).unwrap_or("");
        let op: Option<(&'static str, usize)> = if rest.starts_with("\\le")
            && !rest
                .get(3..4)
                .is_some_and(|c| c.chars().all(|c| c.is_ascii_alphabetic()))
        {
            Some(("\\le", 3))
        } else if rest.starts_with("\\ge")
            && !rest
                .get(3..4)
                .is_some_and(|c| c.chars().all(|c| c.is_ascii_alphabetic()))
        {
            Some(("\\ge", 3))
        } else if rest.starts_with('<') {
            Some(("<", 1))
        } else if rest.starts_with('>') {
            Some((">", 1))
        } else {
            None
        };
        match op {
            Some((name, len)) => {
                parts.push(s.get(start..i)?.trim());
                ops.push(name);
                i += len;
                start = i;
            }
            None => i += 1,
        }
    }
    parts.push(s.get(start..)?.trim());
    (!ops.is_empty() && parts.iter().all(|p| !p.is_empty())).then_some((parts, ops))
}

/// Equations equal up to a nonzero constant factor: `(l1-r1) / (l2-r2)` is constant.
fn equation_equiv(p: (&str, &str), g: (&str, &str), b: &mut Budget) -> Option<Reason> {
    let diff = |l: &str, r: &str, b: &mut Budget| -> Option<Node> {
        let l = expr::parse(l, b)?;
        let r = expr::parse(r, b)?;
        Some(Node::Add(Box::new(l), Box::new(Node::Neg(Box::new(r)))))
    };
    let dp = diff(p.0, p.1, b)?;
    let dg = diff(g.0, g.1, b)?;
    let mut vars = Vec::new();
    eval::variables(&dp, &mut vars);
    eval::variables(&dg, &mut vars);
    if vars.is_empty() {
        return None;
    }
    let mut ratio: Option<Complex64> = None;
    for round in 0..ROUNDS + 1 {
        let env = |name: &str| sample_value(name, round);
        let vp = eval::numeric(&dp, &env, b)?;
        let vg = eval::numeric(&dg, &env, b)?;
        if !finite(vp) || !finite(vg) || vg.norm() < ABS_TOL || vp.norm() < ABS_TOL {
            return None;
        }
        let r = vp / vg;
        match ratio {
            None => ratio = Some(r),
            Some(r0) if close(r0, r) => {}
            Some(_) => return None,
        }
    }
    Some(Reason::Equation)
}

/// Scalars: choice letters, words, base-subscripted numbers, percent, expressions.
fn scalar(p: &str, g: &str, b: &mut Budget) -> Option<Reason> {
    if let Some(r) = choice(p, g, b) {
        return r;
    }
    if is_text(p) || is_text(g) {
        let key = |s: &str| {
            s.chars()
                .filter(|c| c.is_alphanumeric())
                .flat_map(char::to_lowercase)
                .collect::<String>()
        };
        let (kp, kg) = (key(p), key(g));
        return (!kp.is_empty() && kp == kg).then_some(Reason::Normalized);
    }
    if let Some(r) = base_subscript(p, g) {
        return r;
    }
    let (p_body, p_pct) = strip_percent(p);
    let (g_body, g_pct) = strip_percent(g);
    let pn = expr::parse(p_body, b)?;
    let gn = expr::parse(g_body, b)?;
    let (pd, gd) = (decimal_info(p_body), decimal_info(g_body));
    if let Some(r) = expr_equiv(&pn, &gn, pd, gd, b) {
        return Some(r);
    }
    let hundred = || Box::new(Node::Num(BigRational::from_integer(BigInt::from(100))));
    let shifted = |d: Option<(u32, u32)>| d.map(|(k, sig)| (k + 2, sig));
    if p_pct {
        let scaled = Node::Div(Box::new(pn.clone()), hundred());
        if let Some(r) = expr_equiv(&scaled, &gn, shifted(pd), gd, b) {
            return Some(r);
        }
    }
    if g_pct {
        let scaled = Node::Div(Box::new(gn), hundred());
        return expr_equiv(&pn, &scaled, pd, shifted(gd), b);
    }
    None
}

/// Multiple choice: `Some(result)` when either side is a choice letter.
fn choice(p: &str, g: &str, b: &mut Budget) -> Option<Option<Reason>> {
    let letter = |s: &str| s.len() == 1 && s.chars().all(|c| matches!(c, 'A'..='E'));
    let prefixed = |s: &str| -> Option<(String, String)> {
        let rest = s.strip_prefix('(')?;
        let (l, tail) = rest.split_at_checked(1)?;
        let tail = tail.strip_prefix(')')?;
        letter(l).then(|| (l.to_string(), tail.to_string()))
    };
    match (letter(p), letter(g), prefixed(p)) {
        (true, true, _) => Some(None),
        (false, true, Some((l, _))) => Some((l == g).then_some(Reason::Choice)),
        (false, false, Some((_, tail))) if !tail.is_empty() => Some(compare(&tail, g, 1, b)),
        _ => None,
    }
}

/// Whether the answer contains a word (a run of 3+ letters that is not a function or
/// an `\operatorname{name}`).
fn is_text(s: &str) -> bool {
    let free = strip_commands(&without_operator_names(s));
    free.split(|c: char| !c.is_ascii_alphabetic()).any(|w| {
        w.len() >= 3
            && ![
                "sin", "cos", "tan", "cot", "sec", "csc", "log", "exp", "arc", "sqrt", "ln",
            ]
            .iter()
            .any(|f| w.starts_with(f))
    })
}

/// `s` with the braced names of `\operatorname{name}` removed.
fn without_operator_names(s: &str) -> String {
    const OP: &str = "\\operatorname{";
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(p) = rest.find(OP) {
        out.push_str(rest.get(..p + OP.len() - 1).unwrap_or(""));
        let after = rest.get(p + OP.len()..).unwrap_or("");
        rest = after
            .find('}')
            .and_then(|q| after.get(q + 1..))
            .unwrap_or("");
    }
    out.push_str(rest);
    out
}

/// `204_5` vs `204`: the same digits where the gold names a base the prediction leaves
/// implicit (a prediction's own base must be the gold's, or 10 against a bare gold).
fn base_subscript(p: &str, g: &str) -> Option<Option<Reason>> {
    let digits = |s: &str| -> Option<(String, Option<String>)> {
        let (d, base) = match s.split_once('_') {
            Some((d, base)) => (
                d,
                Some(base.trim_matches(|c| c == '{' || c == '}').to_string()),
            ),
            None => (s, None),
        };
        let ok = !d.is_empty()
            && d.chars().all(|c| c.is_ascii_alphanumeric())
            && d.chars().any(|c| c.is_ascii_digit());
        let base_ok = base
            .as_ref()
            .is_none_or(|x| !x.is_empty() && x.chars().all(|c| c.is_ascii_digit()));
        (ok && base_ok).then(|| (d.to_ascii_uppercase(), base))
    };
    let (dp, bp) = digits(p)?;
    let (dg, bg) = digits(g)?;
    let bases_ok = match (&bp, &bg) {
        (None, None) => return None,
        (None, Some(_)) => true,
        (Some(x), None) => x == "10",
        (Some(x), Some(y)) => x == y,
    };
    Some((bases_ok && dp == dg).then_some(Reason::Normalized))
}

fn strip_percent(s: &str) -> (&str, bool) {
    match s.strip_suffix('%') {
        Some(x) => (x, true),
        None => (s, false),
    }
}

/// `(fraction digits, significant digits)` of a plain decimal literal.
fn decimal_info(s: &str) -> Option<(u32, u32)> {
    let body = s.strip_prefix('-').unwrap_or(s);
    let (int, frac) = body.split_once('.')?;
    if frac.is_empty() || !int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit()) {
        return None;
    }
    let all: String = format!("{int}{frac}");
    let sig = all.trim_start_matches('0').len();
    Some((u32::try_from(frac.len()).ok()?, u32::try_from(sig).ok()?))
}

/// Compare two parsed scalars.
fn expr_equiv(
    a: &Node,
    c: &Node,
    ad: Option<(u32, u32)>,
    cd: Option<(u32, u32)>,
    b: &mut Budget,
) -> Option<Reason> {
    let ea = eval::exact(a, b);
    let ec = eval::exact(c, b);
    if let (Some(x), Some(y)) = (&ea, &ec) {
        if x == y {
            return Some(Reason::Rational);
        }
        return rounded_exact(x, y, ad, cd).then_some(Reason::Numeric);
    }
    let mut vars = Vec::new();
    eval::variables(a, &mut vars);
    eval::variables(c, &mut vars);
    let rounds = if vars.is_empty() { 1 } else { ROUNDS };
    let mut last = None;
    let mut all_close = true;
    for round in 0..rounds {
        let env = |name: &str| sample_value(name, round);
        let va = eval::numeric(a, &env, b)?;
        let vc = eval::numeric(c, &env, b)?;
        if !(finite(va) && finite(vc) && close(va, vc)) {
            all_close = false;
        }
        last = Some((va, vc));
    }
    if all_close {
        return Some(Reason::Symbolic);
    }
    let (va, vc) = last?;
    (vars.is_empty() && rounded_float(va, vc, ad, cd)).then_some(Reason::Numeric)
}

/// One side is a decimal with ≥ 4 significant digits equal to the other rounded there.
fn rounded_exact(
    x: &BigRational,
    y: &BigRational,
    xd: Option<(u32, u32)>,
    yd: Option<(u32, u32)>,
) -> bool {
    let k = match (xd, yd) {
        (Some((k, sig)), None) | (None, Some((k, sig))) if sig >= 4 && k <= 60 => k,
        _ => return false,
    };
    let scale = BigRational::from_integer(BigInt::from(10u32).pow(k) * BigInt::from(2u32));
    ((x - y).abs() * scale) <= BigRational::from_integer(BigInt::from(1u32))
}

/// Floating-point version of [`rounded_exact`] for irrational values.
fn rounded_float(
    x: Complex64,
    y: Complex64,
    xd: Option<(u32, u32)>,
    yd: Option<(u32, u32)>,
) -> bool {
    let k = match (xd, yd) {
        (Some((k, sig)), None) | (None, Some((k, sig))) if sig >= 4 && k <= 15 => k,
        _ => return false,
    };
    if !finite(x) || !finite(y) || x.im.abs() > ABS_TOL || y.im.abs() > ABS_TOL {
        return false;
    }
    let half_ulp = 0.5 * 10f64.powi(-i32::try_from(k).unwrap_or(15));
    (x.re - y.re).abs() <= half_ulp * (1.0 + 1e-9) + ABS_TOL
}

/// A deterministic, name-dependent sample value for a variable in a given round.
fn sample_value(name: &str, round: u64) -> f64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in name.bytes() {
        h ^= u64::from(byte);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= round.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h = h.wrapping_mul(0x0100_0000_01b3);
    let unit = (h >> 11) as f64 / (1u64 << 53) as f64;
    0.55 + 1.7 * unit
}

fn finite(z: Complex64) -> bool {
    z.re.is_finite() && z.im.is_finite()
}

fn close(a: Complex64, b: Complex64) -> bool {
    let scale = a.norm().max(b.norm());
    (a - b).norm() <= REL_TOL * scale + ABS_TOL
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_from_inequalities() {
        assert_eq!(inequality_interval("x>5").as_deref(), Some("(5,\\infty)"));
        assert_eq!(
            inequality_interval("x\\le3").as_deref(),
            Some("(-\\infty,3]")
        );
        assert_eq!(inequality_interval("-2\\le x<7").as_deref(), Some("[-2,7)"));
        assert_eq!(inequality_interval("5<x").as_deref(), Some("(5,\\infty)"));
        assert_eq!(inequality_interval("\\left(1,2\\right)"), None);
    }

    #[test]
    fn splitting() {
        assert_eq!(split_top("(1,2),3", ","), vec!["(1,2)", "3"]);
        assert_eq!(split_top("\\{1,2\\},3", ","), vec!["\\{1,2\\}", "3"]);
        assert!(encloses("(1,2]"));
        assert!(!encloses("(a+5)(b+2)"));
        assert_eq!(
            items("1\\pm\\sqrt{19}"),
            vec!["1+\\sqrt{19}", "1-\\sqrt{19}"]
        );
        assert!(
            simple_lhs("x") && simple_lhs("f(x)") && simple_lhs("\\theta") && !simple_lhs("5x-7y")
        );
        assert!(simple_lhs("f'(x)") && simple_lhs("f^{-1}(x)") && !simple_lhs("x^2"));
    }
}

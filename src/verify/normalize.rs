//! Normalisation of an answer string to one canonical LaTeX-ish form.
//!
//! Removes presentation that never changes the value: `$`/`\(`/`\[` delimiters, one
//! wrapping `\boxed{}`, `\left`/`\right`/`\big`, spacing commands, `\dfrac`/`\tfrac`,
//! `\text{}`/`\mbox{}`/`\textbf{}`/`\mathrm{}` wrappers, trailing unit words, `^\circ`,
//! `\$`, thousands separators (`2,310`; never when some comma of the answer is followed by
//! a space: `300, 400` is a list), `x \in` prefixes, trailing periods and stray trailing
//! backslashes (`42.`, `42\`, `42\\`, `\boxed{B}.`) and spacing; writes
//! `\%` and `percent` / `per cent` as `%`, `\frac12` as `\frac{1}{2}`, `x^{2}` as `x^2`,
//! `.5` as `0.5`, `(C)` as `C`,
//! ` or ` / ` and ` between answers as `,`, unicode math symbols as LaTeX, a wrapped
//! name before a parenthesis (`\mathrm{Var}(X)`) as `\operatorname{Var}(X)`, and a whole
//! answer that is a time of day as `4:30\text{ p.m.}` (a.m./p.m. are never dropped as
//! units; see `clock_time`). `a \approx b` keeps `a`, unless `a` is a label ([`is_label`]
//! with a letter: `y \approx 7` is written `y=7`).
//!
//! It does not evaluate anything and keeps `x =` prefixes (the comparison decides what
//! an equation means). Inputs longer than [`MAX_NORMALIZE_LEN`] bytes only lose their
//! whitespace. Every step is a linear scan or a regex over the (capped) input, except
//! wrapper unwrapping, which is quadratic in the number of wrappers of that capped input.

use std::sync::LazyLock;

use num_bigint::BigInt;
use regex::Regex;

use super::expr::is_function_name;
use super::extract::matching_brace;

/// Longest input that is fully normalised (bytes).
pub const MAX_NORMALIZE_LEN: usize = 4096;

static THOUSANDS_RE: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$").ok());
static LEADING_DOT_RE: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(^|[^\d}])\.(\d)").ok());
static SCRIPT_BRACE_RE: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"([\^_])\{([A-Za-z0-9])\}($|[^A-Za-z0-9])").ok());
static REPEATING_RE: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(\d*)\.(\d*)\\overline\{(\d{1,30})\}").ok());
static FRAC_DD_RE: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(r"\\frac(\d)(\d)").ok());
static FRAC_D_BRACE_RE: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"\\frac(\d)\{").ok());
static FRAC_BRACE_D_RE: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"\\frac\{([^{}]*)\}(\d)").ok());
static SQRT_D_RE: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(r"\\sqrt(\d)").ok());
static SQRT_L_RE: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(r"\\sqrt ([A-Za-z])").ok());
static TEXT_SEP_RE: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r"\\(?:text|mbox|textrm|mathrm|textnormal)\s*\{\s*(?:or|and|,)\s*\}").ok()
});
static BARE_SEP_RE: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"\s+(?:or|and)\s+").ok());
static IN_PREFIX_RE: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"^[A-Za-z](?:_[A-Za-z0-9])?\\in").ok());
static CLOCK_RE: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r"^(\d{1,2})(?::([0-5]\d)(?::([0-5]\d))?)?(?:([ap])\.?m\.?)?$").ok()
});
static CHOICE_RE: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"^\(?([A-Ea-e])\)$|^\(([A-Ea-e])\)?$").ok());

/// Wrappers whose content is kept as is.
const TEXT_WRAPPERS: &[&str] = &[
    "text",
    "textbf",
    "textit",
    "textrm",
    "textnormal",
    "textsf",
    "texttt",
    "mbox",
    "mathrm",
    "mathbf",
    "mathit",
    "mathsf",
    "mathtt",
    "mathbb",
    "mathcal",
    "boldsymbol",
    "bm",
    "hbox",
    "emph",
    "underline",
];
/// Unicode symbols and their LaTeX spelling.
const UNICODE: &[(&str, &str)] = &[
    ("\u{2212}", "-"),
    ("\u{2013}", "-"),
    ("\u{00d7}", "\\times "),
    ("\u{22c5}", "\\cdot "),
    ("\u{00b7}", "\\cdot "),
    ("\u{00f7}", "\\div "),
    ("\u{03c0}", "\\pi "),
    ("\u{221a}", "\\sqrt"),
    ("\u{221e}", "\\infty "),
    ("\u{2264}", "\\le "),
    ("\u{2265}", "\\ge "),
    ("\u{2260}", "\\ne "),
    ("\u{00b0}", "^\\circ "),
    ("\u{222a}", "\\cup "),
    ("\u{2229}", "\\cap "),
    ("\u{00b1}", "\\pm "),
    ("\u{2208}", "\\in "),
    ("\u{00bd}", "\\frac{1}{2}"),
    ("\u{2009}", " "),
    ("\u{00a0}", " "),
];

/// The canonical string form of an answer (for display, dedup and comparison).
pub fn normalize_answer(s: &str) -> String {
    if s.len() > MAX_NORMALIZE_LEN {
        return s.split_whitespace().collect();
    }
    let mut t = strip_outer(s).to_string();
    for (from, to) in UNICODE {
        if t.contains(from) {
            t = t.replace(from, to);
        }
    }
    let list_commas = has_list_comma(&t);
    if let Some(time) = clock_time(&t) {
        return time;
    }
    // a value with a unit is the value (`1.6 \mathrm{~cm}`, `3\,\mathrm{m/s}`, `7 meters`)
    if let Some((value, _)) = super::units::split_unit(&t) {
        t = value;
    }
    t = rewrite_commands(&t);
    t = strip_decorations(t);
    t = separators(t);
    t = strip_text_unit(&t);
    t = unwrap_wrappers(&t);
    t = strip_bare_unit(&t);
    t = collapse_spaces(&t);
    t = canonical_forms(t, list_commas);
    t
}

/// Whether a comma is followed by whitespace (`300, 400`): then the commas separate
/// items and are never thousands separators (`2,310` and `32,\!348` have none).
fn has_list_comma(s: &str) -> bool {
    s.as_bytes()
        .windows(2)
        .any(|w| w.first() == Some(&b',') && w.get(1).is_some_and(u8::is_ascii_whitespace))
}

/// Strip whitespace, `$…$`, `\(…\)`, `\[…\]` and one `\boxed{…}` spanning the input.
pub fn strip_outer(s: &str) -> &str {
    let mut t = s.trim();
    for _ in 0..4 {
        let before = t.len();
        t = trim_trailing_junk(t);
        for (open, close) in [("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")] {
            if let Some(inner) = t.strip_prefix(open).and_then(|x| x.strip_suffix(close)) {
                t = inner.trim();
            }
        }
        for name in ["\\boxed", "\\fbox"] {
            if let Some(inner) = t.strip_prefix(name) {
                let inner = inner.trim_start();
                let b = inner.as_bytes();
                if b.first() == Some(&b'{')
                    && matching_brace(b, 0) == Some(b.len().saturating_sub(1))
                {
                    t = inner
                        .get(1..inner.len().saturating_sub(1))
                        .unwrap_or("")
                        .trim();
                }
            }
        }
        if t.len() == before {
            break;
        }
    }
    t
}

/// `s` without trailing periods and stray trailing backslashes (`42.`, `42\`, `42\\`,
/// `\boxed{B}.`). A trailing backslash never ends a value (`\}` and `\%` end in their
/// character).
fn trim_trailing_junk(s: &str) -> &str {
    let mut t = s;
    loop {
        let before = t.len();
        t = t.trim_end_matches('.').trim_end();
        t = t.trim_end_matches('\\').trim_end();
        if t.len() == before {
            return t;
        }
    }
}

/// Whether `l` (a normalised left-hand side) only names the value on the other side of
/// its `=` (or `\approx`): a name (`x`, `a_1`, `\theta`, `AB`, `\overline{AB}`), a
/// function value (`f(x)`, `f'(x)`, `f^{-1}(x)`, short arguments), a tuple of names
/// (`(a,b)`), a length (`|PQ|`), a ratio of names (`AB:CD`), an angle (`\angle ABC`) or
/// an area (`[ABC]`). `2x`, `x^2` and `5x-7y` are not labels.
pub fn is_label(l: &str) -> bool {
    if l.is_empty() || l.len() > 64 {
        return false;
    }
    if is_named_value(l) {
        return true;
    }
    let all_names = |parts: Vec<&str>| parts.len() >= 2 && parts.iter().all(|n| is_name(n));
    if let Some(inner) = l.strip_prefix('(').and_then(|x| x.strip_suffix(')')) {
        return all_names(inner.split(',').collect());
    }
    if let Some(inner) = l.strip_prefix('|').and_then(|x| x.strip_suffix('|')) {
        return is_name(inner);
    }
    if l.contains(':') {
        return all_names(l.split(':').collect());
    }
    if let Some(inner) = l.strip_prefix('[').and_then(|x| x.strip_suffix(']')) {
        return (2..=4).contains(&inner.len()) && inner.bytes().all(|b| b.is_ascii_uppercase());
    }
    for angle in ["m\\angle", "\\angle", "\\measuredangle"] {
        if let Some(rest) = l.strip_prefix(angle) {
            return is_name(rest.trim_start());
        }
    }
    false
}

/// A name: a letter, or a `\command`, then letters, digits, `_` and braces (`x`, `a_1`,
/// `x_{10}`, `\theta`, `\overline{AB}`); at most three characters without a backslash.
fn is_name(s: &str) -> bool {
    let head = s.strip_prefix('\\').unwrap_or(s);
    head.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && head
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '{' || c == '}')
        && (head.len() <= 3 || s.starts_with('\\'))
}

/// A name, primed or inverted (`f'`, `f^{-1}`), optionally applied to an argument of at
/// most three bytes (`f(x)`, `P(A)`).
fn is_named_value(l: &str) -> bool {
    let bare = l.split('(').next().unwrap_or(l);
    let bare = bare.trim_end_matches('\'');
    let bare = bare
        .strip_suffix("^{-1}")
        .or_else(|| bare.strip_suffix("^-1"))
        .unwrap_or(bare);
    let args_ok = match l.find('(') {
        Some(p) => {
            l.ends_with(')')
                && l.get(p + 1..l.len().saturating_sub(1))
                    .is_some_and(|a| a.len() <= 3)
        }
        None => true,
    };
    is_name(bare) && args_ok
}

/// A time of day in canonical form: `4:30\text{ p.m.}` for `\text{4:30 p.m.}`,
/// `4:30 PM`, `4:30:00\,\mathrm{pm}` and `16:30`; `7:00\text{ p.m.}` for `7 pm`.
///
/// The input is the whole answer: `H:MM` or `H:MM:SS` (`:00` seconds are dropped),
/// optionally followed by a.m./p.m. in any spelling, or a bare hour followed by one.
/// With a suffix the hour must be 1 to 12. Without one, hours 0 and 13 to 23 are
/// unambiguous 24-hour times and get their suffix (`0:15` is `12:15\text{ a.m.}`);
/// hours 1 to 12 stay bare (`04:30` is `4:30`), since a bare `4:30` does not say which
/// half of the day it is.
fn clock_time(t: &str) -> Option<String> {
    if !t.contains([':', 'm', 'M']) {
        return None;
    }
    let flat: String = unwrap_wrappers(&rewrite_commands(t))
        .chars()
        .filter(|c| !c.is_whitespace() && !matches!(c, '~' | '$' | '{' | '}'))
        .flat_map(char::to_lowercase)
        .collect();
    let caps = CLOCK_RE.as_ref()?.captures(&flat)?;
    let num = |k: usize| caps.get(k).and_then(|m| m.as_str().parse::<u32>().ok());
    let hour = num(1)?;
    let minutes = num(2);
    let seconds = num(3).filter(|s| *s != 0);
    let suffix = caps.get(4).map(|m| m.as_str());
    let (hour, suffix) = match suffix {
        Some(half) if (1..=12).contains(&hour) => (hour, Some(half)),
        Some(_) => return None,
        None if minutes.is_none() => return None,
        None => match hour {
            0 => (12, Some("a")),
            1..=12 => (hour, None),
            13..=23 => (hour - 12, Some("p")),
            _ => return None,
        },
    };
    let mut out = format!("{hour}:{:02}", minutes.unwrap_or(0));
    if let Some(sec) = seconds {
        out.push_str(&format!(":{sec:02}"));
    }
    if let Some(half) = suffix {
        out.push_str(&format!("\\text{{ {half}.m.}}"));
    }
    Some(out)
}

/// One pass over backslash commands: drop sizing and spacing commands, map synonyms.
fn rewrite_commands(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(p) = rest.find('\\') {
        out.push_str(rest.get(..p).unwrap_or(""));
        let after = rest.get(p + 1..).unwrap_or("");
        let name_len = after
            .bytes()
            .take_while(|b| b.is_ascii_alphabetic())
            .count();
        if name_len == 0 {
            let mut chars = after.chars();
            let c = chars.next();
            match c {
                Some('!' | ',' | ';' | ':' | '>') => {}
                Some(' ') => out.push(' '),
                Some('%') => out.push('%'),
                Some('$') => {}
                Some(c) => {
                    out.push('\\');
                    out.push(c);
                }
                None => out.push('\\'),
            }
            rest = chars.as_str();
            continue;
        }
        let name = after.get(..name_len).unwrap_or("");
        let mut tail = after.get(name_len..).unwrap_or("");
        match command_synonym(name) {
            Some("") => {
                if matches!(name, "left" | "right")
                    || name.starts_with("big")
                    || name.starts_with("Big")
                {
                    tail = tail.strip_prefix('.').unwrap_or(tail);
                }
            }
            Some(rep) => out.push_str(rep),
            None => {
                out.push('\\');
                out.push_str(name);
            }
        }
        rest = tail;
    }
    out.push_str(rest);
    out
}

/// What a command becomes: `Some("")` drops it, `None` keeps it.
fn command_synonym(name: &str) -> Option<&'static str> {
    Some(match name {
        "left" | "right" | "big" | "Big" | "bigg" | "Bigg" | "bigl" | "bigr" | "Bigl" | "Bigr"
        | "biggl" | "biggr" | "Biggl" | "Biggr" | "displaystyle" | "textstyle" | "limits"
        | "nolimits" | "middle" | "degree" | "textdollar" | "dollar" => "",
        "quad" | "qquad" | "space" | "thinspace" | "medspace" | "enspace" => " ",
        "dfrac" | "tfrac" | "cfrac" => "\\frac",
        "dbinom" | "tbinom" => "\\binom",
        "leq" | "leqslant" | "leqq" => "\\le",
        "geq" | "geqslant" | "geqq" => "\\ge",
        "neq" => "\\ne",
        "lbrace" => "\\{",
        "rbrace" => "\\}",
        "langle" => "(",
        "rangle" => ")",
        "lvert" | "rvert" | "vert" => "|",
        "cdotp" | "centerdot" => "\\cdot",
        "varnothing" => "\\emptyset",
        "bigcup" => "\\cup",
        "bigcap" => "\\cap",
        "infin" | "infinity" => "\\infty",
        "varpi" => "\\pi",
        _ => return None,
    })
}

/// Degrees, dollar signs, percent words, `{,}`.
fn strip_decorations(mut t: String) -> String {
    const DROP: &[&str] = &["^{\\circ}", "^\\circ", "{}^\\circ", "\\circ"];
    for d in DROP {
        if t.contains(d) {
            t = t.replace(d, "");
        }
    }
    if t.contains('$') {
        t = t.replace('$', "");
    }
    if t.contains("{,}") {
        t = t.replace("{,}", ",");
    }
    for w in [
        "\\text{ per cent}",
        "\\text{per cent}",
        " per cent",
        "\\text{ percent}",
        "\\text{percent}",
        " percent",
    ] {
        if t.contains(w) {
            t = t.replace(w, "%");
        }
    }
    t
}

/// `\text{ or }` and bare ` or ` / ` and ` between answers become commas.
fn separators(t: String) -> String {
    let mut t = match TEXT_SEP_RE.as_ref() {
        Some(re) if t.contains('\\') => re.replace_all(&t, ",").into_owned(),
        _ => t,
    };
    let has_text = TEXT_WRAPPERS.iter().any(|w| t.contains(&format!("\\{w}")));
    if !has_text {
        if let Some(re) = BARE_SEP_RE.as_ref() {
            if re.is_match(&t) {
                t = re.replace_all(&t, ",").into_owned();
            }
        }
    }
    t
}

/// Drop a trailing `\text{ unit words}` (plus `^2`) that follows other content.
fn strip_text_unit(s: &str) -> String {
    let body = strip_power_suffix(s.trim_end());
    if !body.ends_with('}') {
        return s.to_string();
    }
    for w in [
        "\\text",
        "\\mbox",
        "\\textrm",
        "\\mathrm",
        "\\textnormal",
        "\\textit",
    ] {
        let Some(p) = body.rfind(&format!("{w}{{")) else {
            continue;
        };
        let open = p + w.len();
        if matching_brace(body.as_bytes(), open) != Some(body.len().saturating_sub(1)) {
            continue;
        }
        let content = body
            .get(open + 1..body.len().saturating_sub(1))
            .unwrap_or("");
        let prefix = body.get(..p).unwrap_or("").trim_end();
        let unit_like = content
            .trim()
            .starts_with(|c: char| c.is_ascii_alphabetic())
            && content
                .chars()
                .all(|c| c.is_ascii_alphabetic() || c == ' ' || c == '.');
        let prefix_ok =
            prefix.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '}' || c == ')');
        if unit_like && prefix_ok && !is_half_day(content) {
            return prefix.to_string();
        }
    }
    s.to_string()
}

/// Whether `word` is an a.m./p.m. suffix (part of a time, never a unit).
fn is_half_day(word: &str) -> bool {
    let letters: String = word
        .chars()
        .filter(|c| c.is_ascii_alphabetic())
        .flat_map(|c| c.to_lowercase())
        .collect();
    letters == "am" || letters == "pm"
}

/// `s` without a trailing `^2`, `^3`, `^{2}` or `^{3}`.
fn strip_power_suffix(s: &str) -> &str {
    for suf in ["^{2}", "^{3}", "^2", "^3"] {
        if let Some(b) = s.strip_suffix(suf) {
            return b;
        }
    }
    s
}

/// Replace `\text{X}` and similar wrappers by `X`, at any depth.
fn unwrap_wrappers(s: &str) -> String {
    if !s.contains('\\') {
        return s.to_string();
    }
    let bytes = s.as_bytes();
    let mut skip_close = vec![false; bytes.len()];
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes.get(i) == Some(&b'\\') {
            let name_len = bytes
                .get(i + 1..)
                .unwrap_or(&[])
                .iter()
                .take_while(|b| b.is_ascii_alphabetic())
                .count();
            let name = s.get(i + 1..i + 1 + name_len).unwrap_or("");
            let mut j = i + 1 + name_len;
            while bytes.get(j) == Some(&b' ') {
                j += 1;
            }
            if TEXT_WRAPPERS.contains(&name) && bytes.get(j) == Some(&b'{') {
                if let Some((text, next)) = applied_name(s, name, j) {
                    out.push_str(&text);
                    i = next;
                    continue;
                }
                if let Some(close) = matching_brace(bytes, j) {
                    if let Some(slot) = skip_close.get_mut(close) {
                        *slot = true;
                    }
                    i = j + 1;
                    continue;
                }
            }
        }
        if skip_close.get(i) == Some(&true) {
            i += 1;
            continue;
        }
        let ch_len = s
            .get(i..)
            .and_then(|r| r.chars().next())
            .map_or(1, char::len_utf8);
        out.push_str(s.get(i..i + ch_len).unwrap_or(""));
        i += ch_len;
    }
    out
}

/// `\mathrm{Var}(` and similar: a wrapped name directly followed by `(` names a
/// function. Returns its spelling (`\operatorname{Var}`, or the bare name of a function
/// the parser knows, or `e` / `i`) and the index after the closing brace.
fn applied_name(s: &str, wrapper: &str, open: usize) -> Option<(String, usize)> {
    if !matches!(wrapper, "mathrm" | "textrm" | "text" | "mathit" | "mbox") {
        return None;
    }
    let close = matching_brace(s.as_bytes(), open)?;
    let content = s.get(open + 1..close)?.trim();
    let after = s.get(close + 1..)?.trim_start();
    if content.is_empty()
        || !content.bytes().all(|b| b.is_ascii_alphabetic())
        || !after.starts_with('(')
    {
        return None;
    }
    let text = if is_function_name(content) || content == "e" || content == "i" {
        content.to_string()
    } else {
        format!("\\operatorname{{{content}}}")
    };
    Some((text, close + 1))
}

/// Drop trailing unit words (`5 cm`, `18 dollars`, `12 square feet`) after a value
/// that has no free letters.
fn strip_bare_unit(s: &str) -> String {
    let t = s.trim();
    let body = strip_power_suffix(t).trim_end_matches('.');
    let word_start = body
        .char_indices()
        .rev()
        .take_while(|(_, c)| c.is_ascii_alphabetic() || *c == ' ')
        .last()
        .map(|(i, _)| i);
    let Some(ws) = word_start else {
        return t.to_string();
    };
    let words = body.get(ws..).unwrap_or("");
    let prefix = body.get(..ws).unwrap_or("");
    let letters = words.chars().filter(|c| c.is_ascii_alphabetic()).count();
    if !words.starts_with(' ') || letters < 2 || prefix.trim().is_empty() {
        return t.to_string();
    }
    let first = words.split_whitespace().next().unwrap_or("");
    let short_unit = matches!(
        first,
        "cm" | "mm"
            | "km"
            | "ft"
            | "in"
            | "kg"
            | "lb"
            | "oz"
            | "hr"
            | "yd"
            | "mi"
            | "ml"
            | "mg"
            | "st"
            | "nd"
            | "rd"
            | "th"
    );
    if (first.len() < 3 && !short_unit)
        || matches!(
            first,
            "pi" | "infty" | "inf" | "sin" | "cos" | "tan" | "log" | "or" | "and"
        )
        || is_half_day(first)
        || prefix.ends_with('\\')
    {
        return t.to_string();
    }
    let free_letters = strip_commands(prefix)
        .chars()
        .any(|c| c.is_ascii_alphabetic());
    let ends_ok = prefix
        .trim_end()
        .ends_with(|c: char| c.is_ascii_digit() || c == '}' || c == '%');
    if free_letters || !ends_ok {
        return t.to_string();
    }
    prefix.trim_end().to_string()
}

/// `s` with every `\command` name removed (used to look for free letters).
pub fn strip_commands(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut in_cmd = false;
    for c in s.chars() {
        if c == '\\' {
            in_cmd = true;
            continue;
        }
        if in_cmd && c.is_ascii_alphabetic() {
            continue;
        }
        in_cmd = false;
        out.push(c);
    }
    out
}

/// Remove whitespace, keeping one space between a command name and a following letter.
fn collapse_spaces(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut pending_space = false;
    for c in s.chars() {
        if c.is_whitespace() {
            pending_space = true;
            continue;
        }
        if pending_space && c.is_ascii_alphabetic() && ends_with_command(&out) {
            out.push(' ');
        }
        pending_space = false;
        out.push(c);
    }
    out
}

/// Whether `s` ends with `\letters`.
fn ends_with_command(s: &str) -> bool {
    let trimmed = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    trimmed.len() < s.len() && trimmed.ends_with('\\')
}

/// Thousands separators (unless `list_commas`: see [`has_list_comma`]), shorthand
/// fractions, script braces, leading dots, prefixes, trailing punctuation and
/// backslashes, choice letters, `\approx`.
fn canonical_forms(mut t: String, list_commas: bool) -> String {
    if let Some((before, after)) = t.split_once("\\approx") {
        if !before.is_empty() {
            // `y\approx 7` names its value; `6\sqrt{2}\approx 8.49` is the exact value first
            let value = after.split("\\approx").next().unwrap_or("");
            let label = is_label(before)
                && strip_commands(before)
                    .chars()
                    .any(|c| c.is_ascii_alphabetic());
            t = if label && !value.is_empty() {
                format!("{before}={value}")
            } else {
                before.to_string()
            };
        }
    }
    loop {
        let before = t.len();
        t = t
            .trim_end_matches(['.', ',', ';', ':'])
            .trim_end_matches('\\')
            .to_string();
        if t.len() == before {
            break;
        }
    }
    if t.contains("\\overline") {
        t = repeating_decimals(&t);
    }
    if !list_commas && t.contains(',') && THOUSANDS_RE.as_ref().is_some_and(|re| re.is_match(&t)) {
        t = t.replace(',', "");
    }
    if t.contains("\\frac") {
        t = regex_replace(&FRAC_DD_RE, t, r"\frac{${1}}{${2}}");
        t = regex_replace(&FRAC_D_BRACE_RE, t, r"\frac{${1}}{");
        t = regex_replace(&FRAC_BRACE_D_RE, t, r"\frac{${1}}{${2}}");
    }
    if t.contains("\\sqrt") {
        t = regex_replace(&SQRT_D_RE, t, r"\sqrt{${1}}");
        t = regex_replace(&SQRT_L_RE, t, r"\sqrt{${1}}");
    }
    if t.contains('{') {
        t = regex_replace(&SCRIPT_BRACE_RE, t, "${1}${2}${3}");
    }
    if t.contains('.') {
        t = regex_replace(&LEADING_DOT_RE, t, "${1}0.${2}");
    }
    if t.contains("\\in") {
        t = regex_replace(&IN_PREFIX_RE, t, "");
    }
    if let Some(x) = t.strip_prefix('+') {
        t = x.to_string();
    }
    if t.contains("+\\infty") {
        t = t.replace("+\\infty", "\\infty");
    }
    if t == "\\{\\}" {
        t = "\\emptyset".to_string();
    }
    if let Some(c) = CHOICE_RE.as_ref().and_then(|re| re.captures(&t)) {
        if let Some(m) = c.get(1).or_else(|| c.get(2)) {
            t = m.as_str().to_ascii_uppercase();
        }
    }
    t
}

/// `0.1\overline{6}` → `\frac{1}{6}` (at most 30 digits in each part).
fn repeating_decimals(t: &str) -> String {
    let Some(re) = REPEATING_RE.as_ref() else {
        return t.to_string();
    };
    re.replace_all(t, |c: &regex::Captures<'_>| {
        let part = |k: usize| c.get(k).map_or("", |m| m.as_str());
        let (int, fixed, rep) = (part(1), part(2), part(3));
        if int.len() > 30 || fixed.len() > 30 {
            return c.get(0).map_or(String::new(), |m| m.as_str().to_string());
        }
        let parse = |s: &str| {
            if s.is_empty() {
                BigInt::from(0u32)
            } else {
                s.parse().unwrap_or_default()
            }
        };
        let ten = BigInt::from(10u32);
        let (n, r) = (fixed.len() as u32, rep.len() as u32);
        let whole = parse(&format!("{int}{fixed}{rep}")) - parse(&format!("{int}{fixed}"));
        let den = ten.pow(n + r) - ten.pow(n);
        format!("\\frac{{{whole}}}{{{den}}}")
    })
    .into_owned()
}

/// Apply a compiled regex replacement when the regex is available.
fn regex_replace(re: &LazyLock<Option<Regex>>, t: String, rep: &str) -> String {
    match re.as_ref() {
        Some(r) if r.is_match(&t) => r.replace_all(&t, rep).into_owned(),
        _ => t,
    }
}

#[cfg(test)]
mod tests {
    use super::normalize_answer as n;

    #[test]
    fn presentation() {
        assert_eq!(
            n("\\left( 3, \\frac{\\pi}{2} \\right)"),
            "(3,\\frac{\\pi}{2})"
        );
        assert_eq!(n("\\dfrac{1}{2}"), "\\frac{1}{2}");
        assert_eq!(n("\\frac12"), "\\frac{1}{2}");
        assert_eq!(n("\\frac 34"), "\\frac{3}{4}");
        assert_eq!(n("\\frac9{19}"), "\\frac{9}{19}");
        assert_eq!(n("\\frac{270}7\\text{ degrees}"), "\\frac{270}{7}");
        assert_eq!(n("\\boxed{5}"), "5");
        assert_eq!(n("$x^{2}$"), "x^2");
        assert_eq!(n("11\\sqrt2"), "11\\sqrt{2}");
        assert_eq!(n("\\cot x"), "\\cot x");
        assert_eq!(n(".35625"), "0.35625");
        assert_eq!(n("x \\in [-2,7]"), "[-2,7]");
        assert_eq!(n("\\left\\{1,2\\right\\}"), "\\{1,2\\}");
    }

    #[test]
    fn units_and_decorations() {
        assert_eq!(n("10^\\circ"), "10");
        assert_eq!(n("90^{\\circ}"), "90");
        assert_eq!(n("50\\%"), "50%");
        assert_eq!(n("\\$18.90"), "18.90");
        assert_eq!(n("\\$32,\\!348"), "32348");
        assert_eq!(n("11,\\! 111,\\! 111,\\! 100"), "11111111100");
        assert_eq!(n("1,000"), "1000");
        assert_eq!(n("5.4 \\text{ cents}"), "5.4");
        assert_eq!(n("15\\mbox{ cm}^2"), "15");
        assert_eq!(n("864 \\mbox{ inches}^2"), "864");
        assert_eq!(n("5 cm"), "5");
        assert_eq!(n("18 dollars."), "18");
        assert_eq!(n("\\text{Evelyn}"), "Evelyn");
        assert_eq!(n("\\text{(C)}"), "C");
        assert_eq!(n("(c)"), "C");
        assert_eq!(n("3 \\text{ or } 5"), "3,5");
        assert_eq!(n("x = 3 or x = 5"), "x=3,x=5");
        assert_eq!(n("2 xy"), "2xy");
        assert_eq!(n("2\\pi r"), "2\\pi r");
        assert_eq!(n("−5"), "-5");
    }

    #[test]
    fn times_and_named_functions() {
        assert_eq!(n("\\text{4:30 p.m.}"), "4:30\\text{ p.m.}");
        assert_eq!(n("4:30 \\text{ p.m.}"), "4:30\\text{ p.m.}");
        assert_eq!(n("$4:30$ PM"), "4:30\\text{ p.m.}");
        assert_eq!(n("4:30:00 pm"), "4:30\\text{ p.m.}");
        assert_eq!(n("16:30"), "4:30\\text{ p.m.}");
        assert_eq!(n("0:05"), "12:05\\text{ a.m.}");
        assert_eq!(n("04:30"), "4:30");
        assert_eq!(n("7 A.M."), "7:00\\text{ a.m.}");
        assert_eq!(n("5 \\text{ pm}"), "5:00\\text{ p.m.}");
        assert_eq!(n("13 pm"), "13pm");
        assert_eq!(n("3:2"), "3:2");
        assert_eq!(n("\\mathrm{Var}(X)"), "\\operatorname{Var}(X)");
        assert_eq!(n("\\mathrm{I}(0)"), "\\operatorname{I}(0)");
        assert_eq!(n("\\mathrm{sin}(x)"), "sin(x)");
        assert_eq!(n("\\mathrm{Var}"), "Var");
    }
}

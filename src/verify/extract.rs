//! Extraction of the final answer from a completion.
//!
//! Order of preference: the last `\boxed{}` / `\fbox{}` / `\framebox{}` (nested braces,
//! escaped `\{ \}` ignored; an unclosed or empty box falls back to the box before it),
//! unless an answer statement that gives a value follows that box (`so the final answer is
//! $2,310$`, `Answer: 7`, `#### 7`): a statement after the last box wins over the boxes.
//! Without a box: Minerva's `Final Answer: The final answer is x`, GSM8K's `#### x`,
//! `The answer is x` / `Answer: x`, then the closing sentence when it states a value
//! (`So the smallest $k$ is 12.`: the value after the last `is` / `are` / `equals` / `=`
//! outside math, or the last math span holding an `=`; only the last sentence of the
//! completion is read), and the last number when the caller enables the fallback.
//! Several boxes at the end separated only by commas, `and`, `or`, spacing or `$`
//! (`\boxed{4}, \boxed{9}`) are also offered joined as one list answer
//! ([`Extracted::list_alternative`]); the answer itself stays the last box.
//! In thinking mode only the text after the last `</think>` is searched; without one
//! there is no answer. Outside thinking mode a `</think>` is still honoured.
//!
//! It does not judge the answer and does not normalise it beyond trimming `$`
//! delimiters and trailing punctuation of sentence-style answers. All scans are linear
//! in the completion length (a bounded number of box attempts, boxes joined into a list
//! and bytes read from the closing sentence).

use std::sync::LazyLock;

use regex::Regex;

use super::types::{ExtractMethod, Extracted, GradeOptions, Reason};

/// How many `\boxed` candidates (from the end) are tried before giving up.
const MAX_BOX_ATTEMPTS: usize = 8;
/// Longest sentence-style answer kept (bytes).
const MAX_SENTENCE_ANSWER: usize = 1024;
/// Window from the end of the text searched by the last-number fallback first.
const TAIL_WINDOW: usize = 4096;
/// Most boxes joined into one list answer.
const MAX_LIST_BOXES: usize = 16;
/// Longest box of a list answer but its last (bytes).
const MAX_LIST_ITEM: usize = 1024;
/// Longest text between two boxes of one list answer (bytes).
const MAX_LIST_GAP: usize = 200;
/// Window from the end of the text read for the closing sentence (bytes).
const STATEMENT_WINDOW: usize = 1024;
/// Longest value without math delimiters taken from a closing sentence (bytes).
const MAX_PLAIN_VALUE: usize = 80;
/// Most math spans joined into one answer (`$3$, $5$ and $7$`).
const MAX_MATH_RUN: usize = 16;

static FINAL_ANSWER_RE: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(?i)final\s+answer\s*:?\s*the\s+final\s+answer\s+is\s*:?").ok());
static ANSWER_IS_RE: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(?i)\banswer\s*(?:is\s*:?|:)|\banswer\s+would\s+be\s*:?").ok());
/// A final-answer statement after a box: `the answer is`, `the final answer is`, `Answer:` at
/// the start of a line; not `check our answer: ...` (a verification after the box).
static AFTER_BOX_RE: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r"(?im)\b(?:the|final)\s+answer\s*(?:is\s*:?|would\s+be\s*:?|:)|^[\s*#]*answer\s*(?:is\s*)?:")
        .ok()
});
static NUMBER_RE: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+").ok()
});
/// A verb that states a result, outside math: `is`, `are`, `equals`, `=`.
static VERB_RE: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(?i)\b(?:is|are|was|were|equals|becomes)\b|=").ok());

/// A box found in the text: where `\boxed` starts, where the box ends, its content.
struct BoxSpan {
    start: usize,
    end: usize,
    content: String,
}

/// See the module documentation.
pub fn extract_answer(completion: &str, opts: &GradeOptions) -> Result<Extracted, Reason> {
    let text = answer_region(completion, opts)?;
    if let Some(last) = last_box_span(text, 0, text.len()) {
        let after = text.get(last.end..).unwrap_or("");
        if let Some((answer, method)) = statement_after_box(after) {
            return Ok(Extracted {
                answer,
                method,
                list_alternative: None,
            });
        }
        let list_alternative = trailing_box_list(text, &last);
        return Ok(Extracted {
            answer: last.content,
            method: ExtractMethod::Boxed,
            list_alternative,
        });
    }
    let found = final_answer(text)
        .map(|a| (a, ExtractMethod::FinalAnswer))
        .or_else(|| hash_answer(text).map(|a| (a, ExtractMethod::Hash)))
        .or_else(|| answer_is(text).map(|a| (a, ExtractMethod::AnswerIs)))
        .or_else(|| closing_statement(text).map(|a| (a, ExtractMethod::Statement)))
        .or_else(|| {
            if opts.last_number_fallback {
                last_number(text).map(|a| (a, ExtractMethod::LastNumber))
            } else {
                None
            }
        });
    match found {
        Some((answer, method)) => Ok(Extracted {
            answer,
            method,
            list_alternative: None,
        }),
        None => Err(Reason::NoAnswer),
    }
}

/// The part of the completion that may hold the answer.
fn answer_region<'a>(completion: &'a str, opts: &GradeOptions) -> Result<&'a str, Reason> {
    const CLOSE: &str = "</think>";
    match completion.rfind(CLOSE) {
        Some(p) => Ok(completion.get(p + CLOSE.len()..).unwrap_or("")),
        None if opts.thinking => Err(Reason::UnclosedThink),
        None => Ok(completion),
    }
}

/// The content of the last well-formed, non-empty box.
pub fn last_boxed(text: &str) -> Option<String> {
    last_box_span(text, 0, text.len()).map(|b| b.content)
}

/// The last well-formed, non-empty box whose `\boxed` starts in bytes `floor..limit`.
fn last_box_span(text: &str, floor: usize, limit: usize) -> Option<BoxSpan> {
    let mut floor = floor.min(limit);
    while !text.is_char_boundary(floor) {
        floor -= 1;
    }
    let mut end = limit;
    for _ in 0..MAX_BOX_ATTEMPTS {
        let (pos, name_len) = last_box_name(text, floor, end)?;
        let after = text.get(pos + name_len..)?;
        if let Some((content, used)) = box_content(after) {
            let t = content.trim();
            if !t.is_empty() {
                return Some(BoxSpan {
                    start: pos,
                    end: pos + name_len + used,
                    content: t.to_string(),
                });
            }
        }
        end = pos;
    }
    None
}

/// Where the last `\boxed`, `\fbox` or `\framebox` in bytes `floor..end` starts, and its length:
/// one backward scan for their common `box` (three scans, one per name, cost as much as the
/// rest of grading a reference solution).
fn last_box_name(text: &str, floor: usize, end: usize) -> Option<(usize, usize)> {
    let mut at = end;
    loop {
        let p = floor + text.get(floor..at)?.rfind("box")?;
        let before = text.get(..p)?;
        let found = if before.ends_with('\\') && text.get(p..)?.starts_with("boxed") {
            Some((p - 1, "\\boxed".len()))
        } else if before.ends_with("\\f") {
            Some((p - 2, "\\fbox".len()))
        } else if before.ends_with("\\frame") {
            Some((p - 6, "\\framebox".len()))
        } else {
            None
        };
        match found {
            Some((start, len)) if start >= floor && start + len <= end => {
                return Some((start, len))
            }
            _ => at = p,
        }
    }
}

/// Parse what follows `\boxed`: `{...}` (optionally after `[..]` options or spaces), or
/// a single bare token as in `\boxed 5`. Returns the content and the bytes it took.
fn box_content(after: &str) -> Option<(&str, usize)> {
    let bytes = after.as_bytes();
    let mut i = 0;
    while bytes.get(i).is_some_and(|b| *b == b' ') {
        i += 1;
    }
    if bytes.get(i) == Some(&b'[') {
        let close = after.get(i..)?.find(']')?;
        i += close + 1;
    }
    match bytes.get(i) {
        Some(b'{') => {
            let close = matching_brace(bytes, i)?;
            Some((after.get(i + 1..close)?, close + 1))
        }
        Some(b) if i > 0 && (b.is_ascii_alphanumeric() || *b == b'-' || *b == b'\\') => {
            let rest = after.get(i..)?;
            let stop = rest
                .find(|c: char| c.is_whitespace() || c == '$' || c == '}')
                .unwrap_or(rest.len());
            let token = rest.get(..stop)?.trim_end_matches(['.', ',']);
            Some((token, i + stop))
        }
        _ => None,
    }
}

/// Index of the `}` that closes the `{` at `open`, skipping escaped characters.
/// Iterative, so arbitrarily deep nesting cannot overflow the stack.
pub fn matching_brace(bytes: &[u8], open: usize) -> Option<usize> {
    let mut depth: usize = 0;
    let mut i = open;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'\\' => i += 1,
            b'{' => depth += 1,
            b'}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// An answer statement with a value after the last box (`so the final answer is $2,310$`,
/// `Answer: 7`, `#### 7`): the last one, when its value starts like a value (math, a
/// digit, a sign or a bracket), so `so our answer is correct` is not one.
fn statement_after_box(after: &str) -> Option<(String, ExtractMethod)> {
    if !after.contains(|c: char| c.is_ascii_alphabetic() || c == '#') {
        return None;
    }
    let mut best: Option<(usize, String, ExtractMethod)> = None;
    if let Some(re) = AFTER_BOX_RE.as_ref() {
        for m in re.find_iter(after) {
            let rest = after.get(m.end()..).unwrap_or("");
            if !starts_like_value(rest) {
                continue;
            }
            if let Some(a) = sentence_answer(rest) {
                best = Some((m.start(), a, ExtractMethod::AnswerIs));
            }
        }
    }
    if let Some(p) = after.rfind("####") {
        let later = best.as_ref().is_none_or(|(s, _, _)| p > *s);
        let rest = after.get(p + 4..).unwrap_or("");
        if later && starts_like_value(rest) {
            if let Some(a) = hash_answer(after) {
                best = Some((p, a, ExtractMethod::Hash));
            }
        }
    }
    best.map(|(_, a, m)| (a, m))
}

/// Whether `rest` (after an answer marker) opens with a value: math delimiters, a digit,
/// a sign, a bracket or `\$`.
fn starts_like_value(rest: &str) -> bool {
    let r = rest.trim_start_matches([' ', '\t', '*', ':']).trim_start();
    r.starts_with(['$', '(', '[', '-', '+'])
        || r.starts_with("\\(")
        || r.starts_with("\\[")
        || r.starts_with("\\$")
        || r.starts_with(|c: char| c.is_ascii_digit())
}

/// The boxes that end the text, joined by `, ` when there are at least two and only
/// separators stand between them (see [`separators_only`]).
fn trailing_box_list(text: &str, last: &BoxSpan) -> Option<String> {
    let mut items = vec![last.content.clone()];
    let mut start = last.start;
    while items.len() < MAX_LIST_BOXES {
        // the box before ends within MAX_LIST_GAP: look no further back than its content can be
        let floor = start.saturating_sub(MAX_LIST_GAP + MAX_LIST_ITEM);
        let Some(prev) = last_box_span(text, floor, start) else {
            break;
        };
        let Some(gap) = text.get(prev.end..start) else {
            break;
        };
        if !separators_only(gap) {
            break;
        }
        start = prev.start;
        items.push(prev.content);
    }
    if items.len() < 2 {
        return None;
    }
    items.reverse();
    Some(items.join(", "))
}

/// Whether the text between two boxes only separates them: spacing, `,`, `;`, `&`, `$`,
/// `\(` `\)`, `\quad`, line breaks, and the words `and` / `or` (also inside `\text{}`).
fn separators_only(gap: &str) -> bool {
    if gap.len() > MAX_LIST_GAP {
        return false;
    }
    let mut g = gap.to_string();
    for tok in [
        "\\\\",
        "\\text{",
        "\\textrm{",
        "\\mbox{",
        "\\mathrm{",
        "\\qquad",
        "\\quad",
        "\\(",
        "\\)",
        "\\[",
        "\\]",
        "\\,",
        "\\;",
        "\\ ",
    ] {
        if g.contains(tok) {
            g = g.replace(tok, " ");
        }
    }
    g.split(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | '$' | '&' | '~' | '{' | '}'))
        .filter(|w| !w.is_empty())
        .all(|w| w.eq_ignore_ascii_case("and") || w.eq_ignore_ascii_case("or"))
}

/// Minerva format: `Final Answer: The final answer is $x$. I hope it is correct.`
fn final_answer(text: &str) -> Option<String> {
    let re = FINAL_ANSWER_RE.as_ref()?;
    let m = re.find_iter(text).last()?;
    sentence_answer(text.get(m.end()..)?)
}

/// GSM8K format: the rest of the line after the last `####`.
fn hash_answer(text: &str) -> Option<String> {
    let p = text.rfind("####")?;
    let rest = text.get(p + 4..)?;
    let line = rest.lines().next().unwrap_or("");
    let ans = clean_sentence(line);
    (!ans.is_empty()).then_some(ans)
}

/// `The answer is x`, `Answer: x`, `the final answer is x`.
fn answer_is(text: &str) -> Option<String> {
    let re = ANSWER_IS_RE.as_ref()?;
    let mut best = None;
    for m in re.find_iter(text) {
        if let Some(a) = text.get(m.end()..).and_then(sentence_answer) {
            best = Some(a);
        }
    }
    best
}

/// The answer at the start of `rest`: a `$…$` / `\(…\)` / `\[…\]` span if it opens
/// with one (with the spans that follow it joined by `, ` when only `,`, `and` or `or`
/// separate them: `$3$ or $5$`), else the rest of the line up to a sentence end.
fn sentence_answer(rest: &str) -> Option<String> {
    let rest = rest.trim_start_matches([' ', '\t', '*', ':']);
    let rest = rest.strip_prefix('\n').unwrap_or(rest).trim_start();
    let window = prefix_at_boundary(rest, MAX_SENTENCE_ANSWER);
    if let Some(ans) = math_run(window) {
        return Some(ans);
    }
    let line = window.lines().next().unwrap_or("");
    let cut = sentence_end(line);
    let ans = clean_sentence(line.get(..cut).unwrap_or(line));
    (!ans.is_empty()).then_some(ans)
}

/// The math span that opens `r`: its content and the bytes the span takes.
fn leading_math(r: &str) -> Option<(&str, usize)> {
    for (open, close) in [("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")] {
        if let Some(body) = r.strip_prefix(open) {
            if let Some(end) = find_close(body, close) {
                return Some((body.get(..end)?, open.len() + end + close.len()));
            }
        }
    }
    None
}

/// Where `close` first occurs in `body`; a single `$` escaped as `\$` does not close.
fn find_close(body: &str, close: &str) -> Option<usize> {
    if close != "$" {
        return body.find(close);
    }
    let b = body.as_bytes();
    let mut k = 0;
    while let Some(&c) = b.get(k) {
        match c {
            b'\\' => k += 2,
            b'$' => return Some(k),
            _ => k += 1,
        }
    }
    None
}

/// The math spans at the start of `rest`, joined by `, ` when only a comma, `and` or `or`
/// stands between them (`$3$, $5$ and $7$` is `3, 5, 7`). `None` when `rest` does not
/// open with a closed math span with content.
fn math_run(rest: &str) -> Option<String> {
    let mut parts: Vec<String> = Vec::new();
    let mut r = rest;
    while parts.len() < MAX_MATH_RUN {
        let Some((inner, used)) = leading_math(r) else {
            break;
        };
        let v = clean_sentence(inner);
        if !v.is_empty() {
            parts.push(v);
        }
        r = r.get(used..).unwrap_or("");
        match after_separator(r) {
            Some(next) if leading_math(next).is_some() => r = next,
            _ => break,
        }
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// The text after a list separator (`,`, `and`, `or`, `, and`) at the start of `r`.
fn after_separator(r: &str) -> Option<&str> {
    let t = r.trim_start();
    let (t, comma) = match t.strip_prefix(',') {
        Some(x) => (x.trim_start(), true),
        None => (t, false),
    };
    for w in ["and", "or"] {
        let word = t.get(..w.len()).is_some_and(|h| h.eq_ignore_ascii_case(w));
        if let Some(x) = t.get(w.len()..).filter(|_| word) {
            if x.starts_with(char::is_whitespace) {
                return Some(x.trim_start());
            }
        }
    }
    comma.then_some(t)
}

/// Byte index where a sentence ends: a `.` followed by whitespace (not a decimal point).
fn sentence_end(line: &str) -> usize {
    let b = line.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        if c == b'.' && b.get(i + 1).is_some_and(|n| n.is_ascii_whitespace()) {
            return i;
        }
    }
    line.len()
}

/// Trim spaces, `$`, `**`, and trailing sentence punctuation.
fn clean_sentence(s: &str) -> String {
    let t = s
        .trim()
        .trim_matches(|c: char| c == '$' || c == '*' || c.is_whitespace());
    let t = t.trim_end_matches(['.', ',', ';', '!']).trim();
    let t = t
        .strip_prefix("\\(")
        .and_then(|x| x.strip_suffix("\\)"))
        .unwrap_or(t);
    t.trim().to_string()
}

/// The value stated by the closing sentence of the text (no box, no answer marker):
/// `So the smallest $k$ is 12.` gives `12`, `Thus $x = 5$.` gives `x = 5`. Only the last
/// sentence of the last paragraph is read, so a value in the middle of the reasoning is
/// never taken.
fn closing_statement(text: &str) -> Option<String> {
    let tail = suffix_at_boundary(text, STATEMENT_WINDOW);
    let tail = tail.trim_end_matches(|c: char| c.is_whitespace() || c == '*');
    if tail.is_empty() {
        return None;
    }
    let para = tail
        .rfind("\n\n")
        .and_then(|p| tail.get(p + 2..))
        .unwrap_or(tail);
    statement_value(last_sentence(para))
}

/// Byte ranges of the math spans of `s` (`$…$`, `$$…$$`, `\(…\)`, `\[…\]`, delimiters
/// included; an unclosed span runs to the end). `\$` is an escaped dollar, not math.
fn math_ranges(s: &str) -> Vec<(usize, usize)> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        let (open_len, close) = match (c, b.get(i + 1)) {
            (b'\\', Some(b'(')) => (2, "\\)"),
            (b'\\', Some(b'[')) => (2, "\\]"),
            (b'\\', _) => {
                i += 2;
                continue;
            }
            (b'$', Some(b'$')) => (2, "$$"),
            (b'$', _) => (1, "$"),
            _ => {
                i += 1;
                continue;
            }
        };
        let body = i + open_len;
        let end = s
            .get(body..)
            .and_then(|r| find_close(r, close))
            .map_or(b.len(), |p| body + p + close.len());
        out.push((i, end));
        i = end.max(i + 1);
    }
    out
}

/// The last sentence of a paragraph: the text after the last `.`, `!` or `?` outside
/// math that is followed by whitespace and more text.
fn last_sentence(para: &str) -> &str {
    let ranges = math_ranges(para);
    let b = para.as_bytes();
    let mut start = 0;
    let mut r = 0;
    for (i, &c) in b.iter().enumerate() {
        while ranges.get(r).is_some_and(|&(_, e)| e <= i) {
            r += 1;
        }
        if ranges.get(r).is_some_and(|&(s, e)| s <= i && i < e) {
            continue;
        }
        if matches!(c, b'.' | b'!' | b'?')
            && b.get(i + 1).is_some_and(|n| n.is_ascii_whitespace())
            && para
                .get(i + 1..)
                .is_some_and(|rest| !rest.trim().is_empty())
        {
            start = i + 1;
        }
    }
    para.get(start..).unwrap_or(para).trim()
}

/// The value a sentence states: after its last verb outside math (`is`, `are`, `equals`,
/// `=`) that is followed by a value (a math span, a run of them, or a plain number with
/// its words: `So it is 12, which is even.` gives `12`); without such a verb, the last
/// math span when it holds an `=`.
fn statement_value(sentence: &str) -> Option<String> {
    let s = sentence.trim_end_matches(|c: char| c.is_whitespace() || matches!(c, '.' | '!' | '*'));
    let re = VERB_RE.as_ref()?;
    let ranges = math_ranges(s);
    let mut verb_ends = Vec::new();
    let mut from = 0;
    for (a, e) in ranges
        .iter()
        .copied()
        .chain(std::iter::once((s.len(), s.len())))
    {
        if let Some(seg) = s.get(from..a) {
            verb_ends.extend(re.find_iter(seg).map(|m| from + m.end()));
        }
        from = e;
    }
    if !verb_ends.is_empty() {
        return verb_ends
            .iter()
            .rev()
            .find_map(|&v| s.get(v..).and_then(value_after_verb));
    }
    let &(a, e) = ranges.last()?;
    let (inner, _) = leading_math(s.get(a..e)?)?;
    let inner = clean_sentence(inner);
    (inner.contains('=') && !inner.ends_with('=')).then_some(inner)
}

/// The value at the start of `rest` (after a verb), skipping `equal to`, `exactly` and
/// the like: a math span (or a run of them), or a plain number up to a clause break.
fn value_after_verb(rest: &str) -> Option<String> {
    const FILLERS: &[&str] = &[
        "equal to",
        "exactly",
        "given by",
        "simply",
        "therefore",
        "thus",
        "then",
        "now",
        "just",
        ":",
    ];
    let mut r = rest.trim_start();
    for _ in 0..4 {
        let before = r.len();
        for f in FILLERS {
            let head = r.get(..f.len()).is_some_and(|h| h.eq_ignore_ascii_case(f));
            if let Some(x) = r.get(f.len()..).filter(|_| head) {
                if !x.starts_with(|c: char| c.is_ascii_alphanumeric()) {
                    r = x.trim_start();
                }
            }
        }
        if r.len() == before {
            break;
        }
    }
    if leading_math(r).is_some() {
        return math_run(r);
    }
    plain_value(r)
}

/// A number at the start of `r` (`12`, `-3.5`, `\$4`, `15 percent`, `12 square units`),
/// up to a clause break (`, `, `; `, ` because`, ` which`, ...).
fn plain_value(r: &str) -> Option<String> {
    let unsigned = r.strip_prefix(['-', '+']).unwrap_or(r);
    let unsigned = unsigned.strip_prefix("\\$").unwrap_or(unsigned);
    if !unsigned.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    const STOPS: &[&str] = &[
        ", ",
        "; ",
        " (",
        " because ",
        " since ",
        " which ",
        " when ",
        " where ",
        " if ",
        " so ",
        " but ",
        " as ",
        " for ",
        " by ",
        " in total",
    ];
    let cut = STOPS
        .iter()
        .filter_map(|s| r.find(s))
        .min()
        .unwrap_or(r.len());
    let v = clean_sentence(r.get(..cut)?);
    (!v.is_empty() && v.len() <= MAX_PLAIN_VALUE).then_some(v)
}

/// The longest prefix of `s` of at most `max` bytes that ends on a char boundary.
pub fn prefix_at_boundary(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or("")
}

/// The longest suffix of `s` of at most `max` bytes that starts on a char boundary.
fn suffix_at_boundary(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while start < s.len() && !s.is_char_boundary(start) {
        start += 1;
    }
    s.get(start..).unwrap_or("")
}

/// The last number in the text (integers with thousands separators, decimals, `a/b`).
fn last_number(text: &str) -> Option<String> {
    let re = NUMBER_RE.as_ref()?;
    let tail = suffix_at_boundary(text, TAIL_WINDOW);
    let m = re
        .find_iter(tail)
        .last()
        .or_else(|| re.find_iter(text).last())?;
    Some(m.as_str().replace(' ', ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(s: &str) -> Result<Extracted, Reason> {
        extract_answer(s, &GradeOptions::default())
    }

    #[test]
    fn boxed_nested() {
        let e = ex("so $\\boxed{\\frac{1}{2}}$.").unwrap();
        assert_eq!(e.answer, "\\frac{1}{2}");
        assert_eq!(e.method, ExtractMethod::Boxed);
        assert_eq!(
            ex("\\boxed{1} then \\boxed{\\{1,2\\}}").unwrap().answer,
            "\\{1,2\\}"
        );
        assert_eq!(ex("\\fbox{7}").unwrap().answer, "7");
        assert_eq!(ex("\\framebox{025}").unwrap().answer, "025");
        assert_eq!(ex("$\\boxed 5$").unwrap().answer, "5");
        assert_eq!(ex("\\boxed{3} and then \\boxed{4").unwrap().answer, "3");
        assert_eq!(ex("\\boxed{} \\boxed{x = 5}").unwrap().answer, "x = 5");
    }

    #[test]
    fn other_forms() {
        let e =
            ex("Final Answer: The final answer is $\\frac{3}{4}$. I hope it is correct.").unwrap();
        assert_eq!(
            (e.answer.as_str(), e.method),
            ("\\frac{3}{4}", ExtractMethod::FinalAnswer)
        );
        let e = ex("She makes 9 * 2 = $<<9*2=18>>18.\n#### 18").unwrap();
        assert_eq!((e.answer.as_str(), e.method), ("18", ExtractMethod::Hash));
        let e = ex("So the answer is 3.5. Done").unwrap();
        assert_eq!(
            (e.answer.as_str(), e.method),
            ("3.5", ExtractMethod::AnswerIs)
        );
        assert_eq!(ex("The answer is: $x^2$").unwrap().answer, "x^2");
        assert_eq!(ex("**Answer:** 42").unwrap().answer, "42");
        assert_eq!(ex("we get 12 and 13"), Err(Reason::NoAnswer));
        let fb = GradeOptions {
            last_number_fallback: true,
            ..GradeOptions::default()
        };
        let e = extract_answer("we get 12 and then 1,300.5 apples", &fb).unwrap();
        assert_eq!(
            (e.answer.as_str(), e.method),
            ("1,300.5", ExtractMethod::LastNumber)
        );
    }

    #[test]
    fn boxes_lists_and_statements() {
        let e = ex("So $x = \\boxed{4}, \\boxed{9}$.").unwrap();
        assert_eq!(
            (e.answer.as_str(), e.list_alternative.as_deref()),
            ("9", Some("4, 9"))
        );
        let e = ex("\\boxed{1} \\text{ and } \\boxed{2} or \\boxed{3}").unwrap();
        assert_eq!(e.list_alternative.as_deref(), Some("1, 2, 3"));
        assert_eq!(
            ex("\\boxed{1} so \\boxed{2}").unwrap().list_alternative,
            None
        );
        assert_eq!(ex("\\boxed{2}").unwrap().list_alternative, None);
        assert_eq!(
            ex("\\boxed{\\boxed{5}}").unwrap().list_alternative,
            None,
            "a box inside a box is not a list"
        );
        let e = ex("\\boxed{210}. So the final answer is $2,310$.").unwrap();
        assert_eq!(
            (e.answer.as_str(), e.method),
            ("2,310", ExtractMethod::AnswerIs)
        );
        // a check of the answer after the box is not a statement of it (MATH-500's
        // test/number_theory/864: `We may check our answer: $17\cdot 44 = 748 = ...$`)
        let e = ex("$\\boxed{44}$.\n\nWe may check our answer: $17\\cdot 44 = 748$, so it is.");
        assert_eq!(e.unwrap().answer, "44");
        let e = ex("\\boxed{5}. Check: our answer is correct.").unwrap();
        assert_eq!((e.answer.as_str(), e.method), ("5", ExtractMethod::Boxed));
        let e = ex("\\boxed{5}\n#### 6").unwrap();
        assert_eq!((e.answer.as_str(), e.method), ("6", ExtractMethod::Hash));
        assert_eq!(ex("The answer is $3$ or $5$.").unwrap().answer, "3, 5");
        let e = ex("We simplify.\n\nSo the smallest $k$ is 12.").unwrap();
        assert_eq!(
            (e.answer.as_str(), e.method),
            ("12", ExtractMethod::Statement)
        );
        assert_eq!(ex("Hence $x = 5$.").unwrap().answer, "x = 5");
        assert_eq!(
            ex("The values are $1$, $2$ and $3$.").unwrap().answer,
            "1, 2, 3"
        );
        assert_eq!(ex("The total is 15 percent.").unwrap().answer, "15 percent");
        assert_eq!(ex("So it is 12, which is even.").unwrap().answer, "12");
        assert_eq!(ex("The sum is 7. Now we stop."), Err(Reason::NoAnswer));
        assert_eq!(ex("It is at least 12."), Err(Reason::NoAnswer));
        assert_eq!(ex("Is it 12?"), Err(Reason::NoAnswer));
    }

    #[test]
    fn thinking() {
        let t = GradeOptions {
            thinking: true,
            ..GradeOptions::default()
        };
        assert_eq!(
            extract_answer("<think>maybe \\boxed{3}", &t),
            Err(Reason::UnclosedThink)
        );
        let e = extract_answer("<think>\\boxed{3}</think> so \\boxed{4}", &t).unwrap();
        assert_eq!(e.answer, "4");
        assert_eq!(
            extract_answer("<think>\\boxed{3}</think> nothing", &t),
            Err(Reason::NoAnswer)
        );
        assert_eq!(ex("\\boxed{3}</think> \\boxed{5}").unwrap().answer, "5");
        assert_eq!(ex("<think>\\boxed{3}").unwrap().answer, "3");
    }

    #[test]
    fn adversarial() {
        let deep = format!("\\boxed{{{}{}", "{".repeat(100_000), "}".repeat(100_000));
        let _ = ex(&deep);
        let deep_closed = format!("\\boxed{{{}x{}}}", "{".repeat(100_000), "}".repeat(100_000));
        assert!(ex(&deep_closed).is_ok());
        let big = "é 1 ".repeat(250_000);
        let fb = GradeOptions {
            last_number_fallback: true,
            ..GradeOptions::default()
        };
        assert_eq!(extract_answer(&big, &fb).unwrap().answer, "1");
        let many = "\\boxed{".repeat(200_000);
        assert_eq!(ex(&many), Err(Reason::NoAnswer));
    }
}

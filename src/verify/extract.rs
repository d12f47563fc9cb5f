//! Extraction of the final answer from a completion.
//!
//! Order of preference: the last `\boxed{}` / `\fbox{}` / `\framebox{}` (nested braces,
//! escaped `\{ \}` ignored; an unclosed or empty box falls back to the box before it),
//! Minerva's `Final Answer: The final answer is x`, GSM8K's `#### x`, `The answer is x` /
//! `Answer: x`, and the last number when the caller enables the fallback.
//! In thinking mode only the text after the last `</think>` is searched; without one
//! there is no answer. Outside thinking mode a `</think>` is still honoured.
//!
//! It does not judge the answer and does not normalise it beyond trimming `$`
//! delimiters and trailing punctuation of sentence-style answers. All scans are linear
//! in the completion length (a bounded number of box attempts).

use std::sync::LazyLock;

use regex::Regex;

use super::types::{ExtractMethod, Extracted, GradeOptions, Reason};

/// How many `\boxed` candidates (from the end) are tried before giving up.
const MAX_BOX_ATTEMPTS: usize = 8;
/// Longest sentence-style answer kept (bytes).
const MAX_SENTENCE_ANSWER: usize = 1024;
/// Window from the end of the text searched by the last-number fallback first.
const TAIL_WINDOW: usize = 4096;

static FINAL_ANSWER_RE: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(?i)final\s+answer\s*:?\s*the\s+final\s+answer\s+is\s*:?").ok());
static ANSWER_IS_RE: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(?i)\banswer\s*(?:is\s*:?|:)|\banswer\s+would\s+be\s*:?").ok());
static NUMBER_RE: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+").ok()
});

/// See the module documentation.
pub fn extract_answer(completion: &str, opts: &GradeOptions) -> Result<Extracted, Reason> {
    let text = answer_region(completion, opts)?;
    let found = last_boxed(text)
        .map(|a| (a, ExtractMethod::Boxed))
        .or_else(|| final_answer(text).map(|a| (a, ExtractMethod::FinalAnswer)))
        .or_else(|| hash_answer(text).map(|a| (a, ExtractMethod::Hash)))
        .or_else(|| answer_is(text).map(|a| (a, ExtractMethod::AnswerIs)))
        .or_else(|| {
            if opts.last_number_fallback {
                last_number(text).map(|a| (a, ExtractMethod::LastNumber))
            } else {
                None
            }
        });
    match found {
        Some((answer, method)) => Ok(Extracted { answer, method }),
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
    let mut end = text.len();
    for _ in 0..MAX_BOX_ATTEMPTS {
        let head = text.get(..end)?;
        let (pos, name_len) = ["\\boxed", "\\fbox", "\\framebox"]
            .iter()
            .filter_map(|n| head.rfind(n).map(|p| (p, n.len())))
            .max_by_key(|&(p, _)| p)?;
        let after = text.get(pos + name_len..)?;
        if let Some(content) = box_content(after) {
            let t = content.trim();
            if !t.is_empty() {
                return Some(t.to_string());
            }
        }
        end = pos;
    }
    None
}

/// Parse what follows `\boxed`: `{...}` (optionally after `[..]` options or spaces), or
/// a single bare token as in `\boxed 5`.
fn box_content(after: &str) -> Option<&str> {
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
            after.get(i + 1..close)
        }
        Some(b) if i > 0 && (b.is_ascii_alphanumeric() || *b == b'-' || *b == b'\\') => {
            let rest = after.get(i..)?;
            let stop = rest
                .find(|c: char| c.is_whitespace() || c == '$' || c == '}')
                .unwrap_or(rest.len());
            rest.get(..stop).map(|s| s.trim_end_matches(['.', ',']))
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
/// with one, else the rest of the line up to a sentence end.
fn sentence_answer(rest: &str) -> Option<String> {
    let rest = rest.trim_start_matches([' ', '\t', '*', ':']);
    let rest = rest.strip_prefix('\n').unwrap_or(rest).trim_start();
    let window = prefix_at_boundary(rest, MAX_SENTENCE_ANSWER);
    let delims: [(&str, &str); 4] = [("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")];
    for (open, close) in delims {
        if let Some(inner) = window.strip_prefix(open) {
            if let Some(end) = inner.find(close) {
                let ans = clean_sentence(inner.get(..end)?);
                return (!ans.is_empty()).then_some(ans);
            }
        }
    }
    let line = window.lines().next().unwrap_or("");
    let cut = sentence_end(line);
    let ans = clean_sentence(line.get(..cut).unwrap_or(line));
    (!ans.is_empty()).then_some(ans)
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

//! Decontamination: finding training problems that are (or contain) a problem of an eval set,
//! by word n-grams after normalisation plus an exact normalised match.
//!
//! Normalisation lowercases and keeps runs of letters and digits as words; everything else
//! (punctuation, `$`, LaTeX braces and backslashes, spacing) separates them. So `$x^2+3x$` and
//! `\(x^{2} + 3x\)` are the same words `x 2 3x`. A training problem matches an eval problem when
//! they share one n-gram of words (open-r1's rule, n = 8 by default; the GPT-3 and Llama papers
//! used 13), or when their normalised words are equal, which also catches problems shorter than n
//! words (they have no n-gram at all).
//!
//! The index holds every n-gram of every eval problem as a 64-bit hash; a hit is confirmed by
//! comparing the words, so a hash collision never drops a row. Knows nothing of stages, eval
//! set definitions or file formats beyond [`read_problem_texts`].

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Result};

use super::schema::Contamination;

/// Words per n-gram unless configured (open-r1's choice).
pub const DEFAULT_NGRAM: usize = 8;

/// Fields tried, in order, for the problem text of a file that names none.
pub const PROBLEM_FIELDS: &[&str] = &["problem", "question", "Problem", "Question", "prompt"];
/// Fields tried, in order, for a row's id; else its line or row number.
pub const ID_FIELDS: &[&str] = &["problem_id", "unique_id", "id", "ID", "idx"];

/// How a training problem matched an eval problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchKind {
    /// The normalised words are equal.
    Exact,
    /// They share an n-gram of words.
    Ngram,
}

impl MatchKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MatchKind::Exact => "exact",
            MatchKind::Ngram => "ngram",
        }
    }
}

/// One eval set's problem that a training problem matched.
#[derive(Debug, Clone, PartialEq)]
pub struct Match {
    /// Index of the set, in the order given to [`Index::new`].
    pub set: usize,
    pub eval_id: String,
    pub kind: MatchKind,
    /// The shared words (the n-gram, or the whole problem for an exact match).
    pub text: String,
}

/// A named list of `(id, text)` problems to decontaminate against.
pub struct Reference {
    pub name: String,
    pub problems: Vec<(String, String)>,
}

struct Problem {
    set: usize,
    id: String,
    words: Vec<String>,
}

/// The n-grams and normalised texts of every reference problem.
pub struct Index {
    n: usize,
    names: Vec<String>,
    problems: Vec<Problem>,
    /// n-gram hash -> (problem, word offset); every occurrence, a hit is confirmed by words.
    grams: HashMap<u64, Vec<(u32, u32)>>,
    /// the normalised text -> problems
    exact: HashMap<String, Vec<u32>>,
}

/// The words of `text` after normalisation (see the module doc).
pub fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for c in text.chars() {
        if c.is_alphanumeric() {
            cur.extend(c.to_lowercase());
        } else if !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// FNV-1a of one word.
fn word_hash(w: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in w.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The hash of each n-gram of `hashes`, by start offset.
fn gram_hashes(hashes: &[u64], n: usize) -> impl Iterator<Item = u64> + '_ {
    hashes.windows(n).map(|w| {
        w.iter().fold(0x9e37_79b9_7f4a_7c15u64, |acc, &h| {
            (acc.rotate_left(23) ^ h).wrapping_mul(0xff51_afd7_ed55_8ccd)
        })
    })
}

impl Index {
    /// The index of `refs` with n-grams of `n` words (`n` >= 1).
    pub fn new(n: usize, refs: &[Reference]) -> Result<Index> {
        if n == 0 {
            bail!("the n-gram length must be at least 1");
        }
        let mut index = Index {
            n,
            names: refs.iter().map(|r| r.name.clone()).collect(),
            problems: Vec::new(),
            grams: HashMap::new(),
            exact: HashMap::new(),
        };
        for (set, r) in refs.iter().enumerate() {
            for (id, text) in &r.problems {
                let words = words(text);
                if words.is_empty() {
                    continue;
                }
                let p = index.problems.len() as u32;
                let hashes: Vec<u64> = words.iter().map(|w| word_hash(w)).collect();
                for (offset, g) in gram_hashes(&hashes, n).enumerate() {
                    index.grams.entry(g).or_default().push((p, offset as u32));
                }
                index.exact.entry(words.join(" ")).or_default().push(p);
                index.problems.push(Problem {
                    set,
                    id: id.clone(),
                    words,
                });
            }
        }
        Ok(index)
    }

    /// The n-gram length.
    pub fn n(&self) -> usize {
        self.n
    }

    /// The set names, in index order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// How many reference problems and distinct n-grams the index holds.
    pub fn size(&self) -> (usize, usize) {
        (self.problems.len(), self.grams.len())
    }

    /// The matches of training problem `problem_id` as the rows `contamination.parquet` holds,
    /// each with its set's index.
    pub fn contamination(&self, problem_id: &str, text: &str) -> Vec<(usize, Contamination)> {
        self.check(text)
            .into_iter()
            .map(|m| {
                (
                    m.set,
                    Contamination {
                        problem_id: problem_id.to_string(),
                        eval_set: self.names[m.set].clone(),
                        eval_problem_id: m.eval_id,
                        kind: m.kind.as_str().to_string(),
                        text: m.text,
                    },
                )
            })
            .collect()
    }

    /// The first match of `text` in each set it matches (exact matches first), in set order.
    pub fn check(&self, text: &str) -> Vec<Match> {
        let words = words(text);
        let joined = words.join(" ");
        let mut found: Vec<Option<Match>> = vec![None; self.names.len()];
        if let Some(ps) = self.exact.get(&joined) {
            for &p in ps {
                let prob = &self.problems[p as usize];
                found[prob.set].get_or_insert_with(|| Match {
                    set: prob.set,
                    eval_id: prob.id.clone(),
                    kind: MatchKind::Exact,
                    text: joined.clone(),
                });
            }
        }
        let hashes: Vec<u64> = words.iter().map(|w| word_hash(w)).collect();
        for (start, g) in gram_hashes(&hashes, self.n).enumerate() {
            let Some(hits) = self.grams.get(&g) else {
                continue;
            };
            let gram = &words[start..start + self.n];
            for &(p, offset) in hits {
                let prob = &self.problems[p as usize];
                if found[prob.set].is_some() {
                    continue;
                }
                let o = offset as usize;
                if prob.words[o..o + self.n] == *gram {
                    found[prob.set] = Some(Match {
                        set: prob.set,
                        eval_id: prob.id.clone(),
                        kind: MatchKind::Ngram,
                        text: gram.join(" "),
                    });
                }
            }
            if found.iter().all(Option::is_some) {
                break;
            }
        }
        found.into_iter().flatten().collect()
    }
}

/// One row of a file read by [`read_problem_texts`].
#[derive(Debug, Clone, PartialEq)]
pub struct TextRow {
    /// 1-based line (JSONL) or row (Parquet).
    pub row: usize,
    pub id: String,
    pub text: String,
}

/// The problem texts of a JSONL or Parquet file: the text from `field`, else the first of
/// [`PROBLEM_FIELDS`] the first row has; the id from the first of [`ID_FIELDS`], else the line
/// or row number. Returns the field used. A row without the field is an error that names the
/// file and line.
pub fn read_problem_texts(path: &Path, field: Option<&str>) -> Result<(String, Vec<TextRow>)> {
    let records = super::records::read_all_records(path)?;
    let Some(first) = records.first() else {
        bail!("{}: no rows", path.display());
    };
    let field = match field {
        Some(f) => f.to_string(),
        None => match PROBLEM_FIELDS
            .iter()
            .find(|f| first.fields.contains_key(**f))
        {
            Some(f) => f.to_string(),
            None => bail!(
                "{}: no problem field (tried {}; fields: {}): name it with --field",
                path.display(),
                PROBLEM_FIELDS.join(", "),
                first.fields.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        },
    };
    let id_field = ID_FIELDS.iter().find(|f| first.fields.contains_key(**f));
    let mut out = Vec::with_capacity(records.len());
    for r in &records {
        let Some(text) = super::records::field_text(&r.fields, &field) else {
            bail!("{}:{}: no field `{field}`", path.display(), r.row);
        };
        let id = id_field
            .and_then(|f| super::records::field_text(&r.fields, f))
            .unwrap_or_else(|| r.row.to_string());
        out.push(TextRow {
            row: r.row,
            id,
            text,
        });
    }
    Ok((field, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(n: usize, sets: &[(&str, &[&str])]) -> Index {
        let refs: Vec<Reference> = sets
            .iter()
            .map(|(name, texts)| Reference {
                name: name.to_string(),
                problems: texts
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (format!("{name}/{i}"), t.to_string()))
                    .collect(),
            })
            .collect();
        Index::new(n, &refs).unwrap()
    }

    #[test]
    fn normalisation_ignores_latex_spacing_and_case() {
        assert_eq!(
            words("Find $x^2+3x$, if X=4."),
            ["find", "x", "2", "3x", "if", "x", "4"]
        );
        assert_eq!(
            words("Find \\(x^{2} + 3x\\), if x = 4"),
            words("find $x^2+3x$ if X=4.")
        );
        assert!(words(" $ \\, ").is_empty());
    }

    #[test]
    fn a_shared_ngram_or_equal_text_matches_and_nothing_else() {
        let aime = "Let $N$ be the number of ordered pairs of positive integers $(a,b)$ such that \
                    $a+b=100$. Find $N$.";
        let idx = index(8, &[("aime", &[aime]), ("gsm", &["What is 2 + 3?"])]);
        // the eval problem inside a longer training problem: an 8-gram is shared
        let m = idx.check(&format!("Warm-up. {aime} Then double it."));
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].set, 0);
        assert_eq!(m[0].eval_id, "aime/0");
        assert_eq!(m[0].kind, MatchKind::Ngram);
        assert_eq!(words(&m[0].text).len(), 8);
        // reformatted: still the same words
        let m = idx.check(&aime.replace("$", "").to_uppercase());
        assert_eq!(m[0].kind, MatchKind::Exact);
        // a short problem (fewer than 8 words) matches only when equal
        let m = idx.check("what is 2+3");
        assert_eq!((m.len(), m[0].set, m[0].kind), (1, 1, MatchKind::Exact));
        assert!(idx.check("What is 2 + 4?").is_empty());
        // seven shared words are not enough
        assert!(idx
            .check("pairs of positive integers (a, b) such, unrelated")
            .is_empty());
        assert!(idx
            .check("number of ordered pairs of positive integers (a,b) such that")
            .iter()
            .any(|m| m.kind == MatchKind::Ngram));
    }

    #[test]
    fn every_set_that_matches_is_reported_once() {
        let p = "a b c d e f g h i j";
        let idx = index(
            4,
            &[
                ("one", &[p, p]),
                ("two", &["x y c d e f z"]),
                ("three", &["q"]),
            ],
        );
        let m = idx.check("c d e f g");
        assert_eq!(m.iter().map(|m| m.set).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(m[0].text, "c d e f");
        assert!(Index::new(0, &[]).is_err());
    }

    #[test]
    fn texts_come_from_the_problem_field_with_ids() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.jsonl");
        std::fs::write(
            &p,
            "{\"question\": \"What is 1+1?\", \"id\": 7}\n{\"question\": \"And 2+2?\"}\n",
        )
        .unwrap();
        let (field, rows) = read_problem_texts(&p, None).unwrap();
        assert_eq!(field, "question");
        assert_eq!(
            (rows[0].row, &*rows[0].id, &*rows[0].text),
            (1, "7", "What is 1+1?")
        );
        assert_eq!((rows[1].row, &*rows[1].id), (2, "2"));
        let e = read_problem_texts(&p, Some("problem"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("t.jsonl:1: no field `problem`"), "{e}");
        std::fs::write(&p, "{\"text\": \"x\"}\n").unwrap();
        let e = read_problem_texts(&p, None).unwrap_err().to_string();
        assert!(
            e.contains("no problem field") && e.contains("fields: text"),
            "{e}"
        );
    }
}

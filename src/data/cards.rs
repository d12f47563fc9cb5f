//! Built-in cards of the hub datasets the shipped configs and eval sets read: their rows and the
//! mean length of a problem (and of a reference solution, where the set has one) in tokens of
//! the Qwen3 tokenizer, so that preflight plans a real job's sampling and training time, GPU
//! hours and cost before anything is downloaded.
//!
//! Measured once (2026-11-26) from the published copies in `shared/data/` with the Qwen3
//! tokenizer (`tokenizer.json` of Qwen3, 151,643 BPE tokens; no special tokens added); the rows
//! are the hub file's where they differ from the copy (OlympiadBench: 674 on the hub, 675 in
//! Qwen2.5-Math's copy). A card never stands in for the data when running. Knows nothing of
//! planning.

use super::source::Location;

/// What planning needs of a dataset file.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DatasetCard {
    /// `owner/name` on the hub.
    pub repo: &'static str,
    /// The file in the repository; `None`: the set's split files (any split).
    pub file: Option<&'static str>,
    pub rows: u64,
    /// Mean tokens of a problem's text.
    pub problem_tokens: f64,
    /// Mean tokens of a reference solution, where the set has them.
    pub solution_tokens: Option<f64>,
}

pub const CARDS: &[DatasetCard] = &[
    DatasetCard {
        repo: "openai/gsm8k",
        file: Some("main/train-00000-of-00001.parquet"),
        rows: 7473,
        problem_tokens: 59.6,
        solution_tokens: Some(121.8),
    },
    DatasetCard {
        repo: "openai/gsm8k",
        file: Some("main/test-00000-of-00001.parquet"),
        rows: 1319,
        problem_tokens: 61.3,
        solution_tokens: Some(124.2),
    },
    DatasetCard {
        repo: "HuggingFaceH4/MATH-500",
        file: Some("test.jsonl"),
        rows: 500,
        problem_tokens: 70.9,
        solution_tokens: Some(219.3),
    },
    DatasetCard {
        repo: "HuggingFaceH4/aime_2024",
        file: None,
        rows: 30,
        problem_tokens: 107.1,
        solution_tokens: Some(1635.3),
    },
    DatasetCard {
        repo: "math-ai/aime25",
        file: None,
        rows: 30,
        problem_tokens: 174.0,
        solution_tokens: None,
    },
    DatasetCard {
        repo: "math-ai/amc23",
        file: None,
        rows: 40,
        problem_tokens: 84.6,
        solution_tokens: None,
    },
    DatasetCard {
        repo: "MathArena/hmmt_feb_2025",
        file: None,
        rows: 30,
        problem_tokens: 107.8,
        solution_tokens: None,
    },
    DatasetCard {
        repo: "math-ai/minervamath",
        file: None,
        rows: 272,
        problem_tokens: 131.2,
        solution_tokens: Some(148.6),
    },
    DatasetCard {
        repo: "Hothan/OlympiadBench",
        file: Some("OE_TO_maths_en_COMP/train-00000-of-00001.parquet"),
        rows: 674,
        problem_tokens: 100.0,
        solution_tokens: None,
    },
];

/// The card of a hub location (a pinned revision included: the counts do not change between
/// the revisions these sets have had); `None` for a local file or an unknown set.
pub fn card(loc: &Location) -> Option<&'static DatasetCard> {
    let Location::Hub { repo, file, .. } = loc else {
        return None;
    };
    CARDS
        .iter()
        .find(|c| c.repo == repo && (c.file.is_none() || c.file == file.as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Every hub location of a shipped config or eval set has a card, and each card's rows are
    /// the published copy's (OlympiadBench's hub split has one row fewer).
    #[test]
    fn every_shipped_hub_dataset_has_a_card_with_the_copys_rows() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut found = 0;
        for dir in ["evals", "pipelines"] {
            for e in std::fs::read_dir(root.join(dir)).unwrap() {
                let p = e.unwrap().path();
                let text = std::fs::read_to_string(&p).unwrap();
                for line in text.lines().filter(|l| l.starts_with("path = \"hf://")) {
                    let path = line.trim_start_matches("path = \"").trim_end_matches('"');
                    let loc = Location::parse(path, root, Some("test")).unwrap();
                    assert!(card(&loc).is_some(), "{}: {path} has no card", p.display());
                    found += 1;
                }
            }
        }
        assert!(found >= 9, "{found}");
        let shared = root.join("../shared/data");
        for (repo, file, extra) in [
            ("openai/gsm8k", "gsm8k_train.jsonl", 0),
            ("math-ai/aime25", "aime25.jsonl", 0),
            ("MathArena/hmmt_feb_2025", "hmmt_feb25.jsonl", 0),
            ("math-ai/minervamath", "minerva_math.jsonl", 0),
            ("Hothan/OlympiadBench", "olympiadbench_math_en.jsonl", 1),
        ] {
            let Ok(text) = std::fs::read_to_string(shared.join(file)) else {
                continue;
            };
            let rows = text.lines().filter(|l| !l.trim().is_empty()).count() as u64;
            let c = CARDS.iter().find(|c| c.repo == repo).unwrap();
            assert_eq!(c.rows + extra, rows, "{repo}");
        }
    }
}

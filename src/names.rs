//! Names a user typed (config keys, enum values, field names): the closest valid one, for the
//! "did you mean" of an error.
//!
//! Knows nothing of where the names come from.

/// The valid name nearest to `bad` by edit distance (transpositions count once), when it is
/// near enough to be a typo: at most 2 edits, or a third of the name's length.
pub fn closest(bad: &str, valid: &[String]) -> Option<String> {
    valid
        .iter()
        .map(|v| (strsim::damerau_levenshtein(bad, v), v))
        .filter(|(d, v)| *d <= 2.max(v.len() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, v)| v.clone())
}

//! Tests of [`super`] (`sampler/params.rs`).

use super::*;

/// The sampling hash of settings that set no parameter added since the hash was introduced is
/// taken over the text it always was: the `Debug` text of the parameters of then.
#[test]
fn the_first_parameters_hash_as_their_old_debug_text() {
    // `n` and `logprobs` are not in it (the job hashes `n` beside it; logprobs do not change
    // the tokens); every other parameter is, in its old order and `Debug` form
    let p = SamplingParams {
        n: 5,
        top_p: 0.95,
        min_p: 0.05,
        presence_penalty: -0.5,
        frequency_penalty: 0.25,
        stop_token_ids: vec![1, 2],
        logprobs: Some(3),
        min_new_tokens: 4,
        stop_strings: vec!["Q:".into()],
        ignore_eos: true,
        ..SamplingParams::default()
    };
    assert_eq!(
        p.hash_text(),
        "SamplingParams { temperature: 0.0, top_k: 0, top_p: 0.95, min_p: 0.05, \
         repetition_penalty: 1.0, presence_penalty: -0.5, frequency_penalty: 0.25, \
         max_new_tokens: 1024, min_new_tokens: 4, stop_token_ids: [1, 2], stop_strings: [\"Q:\"], \
         ignore_eos: true, seed: 0 }"
    );
}

/// A parameter added after the hash was introduced (`truncate_prompt_tokens`) joins the hash
/// text only when set: runs that do not set it keep their hash.
#[test]
fn a_later_parameter_changes_the_hash_only_when_set() {
    let unset = SamplingParams::default();
    assert!(!unset.hash_text().contains('|'), "{}", unset.hash_text());
    let set = SamplingParams {
        truncate_prompt_tokens: Some(5),
        ..SamplingParams::default()
    };
    assert_eq!(
        set.hash_text(),
        format!("{}|truncate_prompt_tokens=5", unset.hash_text())
    );
}

/// `keys()` (the flag ids) are the serialised names, in field order, and the defaults of the
/// flags, of an empty TOML table and of `Default` agree.
#[test]
fn keys_flags_serde_and_defaults_agree() {
    use clap::{Args, FromArgMatches};
    // every field away from its default, so that none is skipped when serialised
    let all = SamplingParams {
        n: 3,
        temperature: 0.5,
        top_p: 0.9,
        top_k: 4,
        min_p: 0.1,
        repetition_penalty: 1.2,
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        stop_token_ids: vec![1],
        logprobs: Some(1),
        max_new_tokens: 9,
        min_new_tokens: 1,
        stop_strings: vec!["x".into()],
        ignore_eos: true,
        seed: 7,
        truncate_prompt_tokens: Some(5),
    };
    let serde_json::Value::Object(fields) = serde_json::to_value(&all).unwrap() else {
        panic!("not an object");
    };
    let names: Vec<String> = fields.keys().cloned().collect();
    assert_eq!(names, SamplingParams::keys());
    let back: SamplingParams = serde_json::from_value(serde_json::Value::Object(fields)).unwrap();
    assert_eq!(back, all);
    let cmd = SamplingParams::augment_args(clap::Command::new("t"));
    let parsed = SamplingParams::from_arg_matches(&cmd.get_matches_from(["t"])).unwrap();
    assert_eq!(parsed, SamplingParams::default());
    let empty: SamplingParams = toml::from_str("").unwrap();
    assert_eq!(empty, SamplingParams::default());
    SamplingParams::default().validate().unwrap();
}

#[test]
fn validate_names_the_field() {
    assert_eq!(SamplingParams::default().validate(), Ok(()));
    let cases: Vec<(SamplingParams, &str)> = vec![
        (
            SamplingParams {
                n: 0,
                ..Default::default()
            },
            "n",
        ),
        (
            SamplingParams {
                logprobs: Some(MAX_LOGPROBS + 1),
                ..Default::default()
            },
            "logprobs",
        ),
        (
            SamplingParams {
                temperature: -0.1,
                ..Default::default()
            },
            "temperature",
        ),
        (
            SamplingParams {
                temperature: f32::NAN,
                ..Default::default()
            },
            "temperature",
        ),
        (
            SamplingParams {
                top_p: 0.0,
                ..Default::default()
            },
            "top_p",
        ),
        (
            SamplingParams {
                top_p: 1.5,
                ..Default::default()
            },
            "top_p",
        ),
        (
            SamplingParams {
                min_p: -0.1,
                ..Default::default()
            },
            "min_p",
        ),
        (
            SamplingParams {
                min_p: 1.1,
                ..Default::default()
            },
            "min_p",
        ),
        (
            SamplingParams {
                repetition_penalty: 0.0,
                ..Default::default()
            },
            "repetition_penalty",
        ),
        (
            SamplingParams {
                repetition_penalty: -1.0,
                ..Default::default()
            },
            "repetition_penalty",
        ),
        (
            SamplingParams {
                presence_penalty: f32::NAN,
                ..Default::default()
            },
            "presence_penalty",
        ),
        (
            SamplingParams {
                frequency_penalty: f32::INFINITY,
                ..Default::default()
            },
            "frequency_penalty",
        ),
        (
            SamplingParams {
                max_new_tokens: 0,
                ..Default::default()
            },
            "max_new_tokens",
        ),
        (
            SamplingParams {
                min_new_tokens: 10,
                max_new_tokens: 5,
                ..Default::default()
            },
            "min_new_tokens",
        ),
        (
            SamplingParams {
                stop_strings: vec![String::new()],
                ..Default::default()
            },
            "stop",
        ),
    ];
    for (params, field) in cases {
        let message = params.validate().expect_err(field);
        assert!(message.starts_with(field), "{field}: {message}");
    }
    let ok = SamplingParams {
        temperature: 0.7,
        top_p: 0.95,
        top_k: 20,
        min_p: 0.05,
        ..Default::default()
    };
    assert_eq!(ok.validate(), Ok(()));
}

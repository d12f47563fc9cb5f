//! Tests of the sampling job's settings, overrides and hash (`jobs/sample/`).

use super::job::sampling_hash;
use super::prompt::PromptTemplate;
use super::settings::{KeyError, SampleOverrides, SampleSettings, ENGINE_OURS};
use crate::sampler::params::SamplingParams;

/// The sampling hash `pipeline sample` wrote before the parameters were defined once (the
/// `sampling_hash` column of `pipeline sample --model /work/shared/fixtures/tiny-qwen3
/// --prompt-template raw --n 2 --temperature 0.7 --top-k 20 --stop-token-ids 7 --stop '\n\n'
/// --seed 3 --max-new-tokens 8 --repetition-penalty 1.1 --logprobs 2`): the same settings hash
/// the same.
#[test]
fn the_sampling_hash_of_existing_settings_stands() {
    let params = SamplingParams {
        n: 2,
        temperature: 0.7,
        top_k: 20,
        repetition_penalty: 1.1,
        stop_token_ids: vec![7],
        logprobs: Some(2),
        max_new_tokens: 8,
        stop_strings: vec!["\\n\\n".into()],
        seed: 3,
        ..SamplingParams::default()
    };
    let hash = |p: &SamplingParams, engine: &str| {
        sampling_hash(
            "/work/shared/fixtures/tiny-qwen3",
            p,
            &PromptTemplate::Raw,
            engine,
        )
    };
    assert_eq!(hash(&params, ENGINE_OURS), "b7c7946c99905f88");
    // logprobs do not change the tokens; n, the engine and every parameter do
    let no_logprobs = SamplingParams {
        logprobs: None,
        ..params.clone()
    };
    assert_eq!(hash(&no_logprobs, ENGINE_OURS), "b7c7946c99905f88");
    let n3 = SamplingParams {
        n: 3,
        ..params.clone()
    };
    assert_ne!(hash(&n3, ENGINE_OURS), "b7c7946c99905f88");
    assert_ne!(hash(&params, "mistralrs"), "b7c7946c99905f88");
}

/// The `[sample]` keys: the job's around the sampling parameters, in the order stage keys hash
/// them; a table's errors name the key.
#[test]
fn sample_tables_are_read_key_by_key() {
    let keys = SampleSettings::keys();
    let params = SamplingParams::keys();
    let at = keys.iter().position(|k| k == "n").unwrap();
    assert_eq!(keys[at - 1], "enable_thinking");
    assert_eq!(keys[at..at + params.len()], params[..]);
    assert_eq!(keys[at + params.len()], "max_num_seqs");
    let table = |text: &str| -> toml::Table { toml::from_str(text).unwrap() };
    let s = SampleSettings::from_table(&table("model = \"m\"\ntemperature = 0.5\nn = 4")).unwrap();
    assert_eq!((s.params.temperature, s.params.n), (0.5, 4));
    match SampleSettings::from_table(&table("temperatur = 0.5")).unwrap_err() {
        KeyError::Unknown { key, valid } => {
            assert_eq!(key, "temperatur");
            assert_eq!(valid, keys);
        }
        e => panic!("{e}"),
    }
    let e = SampleSettings::from_table(&table("n = 2\ntemperature = \"hot\"")).unwrap_err();
    assert_eq!(e.key(), Some("temperature"), "{e}");
    let e = SampleSettings::from_table(&table("max_num_seqs = -1")).unwrap_err();
    assert_eq!(e.key(), Some("max_num_seqs"), "{e}");
}

/// Overrides set only their keys, refuse `model` and unknown keys, and check values.
#[test]
fn overrides_set_their_keys_over_the_settings() {
    let table = |text: &str| -> toml::Table { toml::from_str(text).unwrap() };
    let base = SampleSettings::from_table(&table(
        "model = \"m\"\nn = 8\ntemperature = 0.6\nmax_num_seqs = 4",
    ))
    .unwrap();
    let o =
        SampleOverrides::new(table("temperature = 0\nstop = [\"x\"]\ndevice = \"cpu\"")).unwrap();
    let s = o.apply(&base).unwrap();
    assert_eq!(s.params.temperature, 0.0);
    assert_eq!(s.params.stop_strings, vec!["x".to_string()]);
    assert_eq!((s.params.n, s.max_num_seqs, s.model.as_str()), (8, 4, "m"));
    assert_eq!(SampleOverrides::default().apply(&base).unwrap(), base);
    for (bad, key) in [
        ("model = \"x\"", "model"),
        ("temprature = 1.0", "temprature"),
        ("top_k = 1.5", "top_k"),
    ] {
        let e = SampleOverrides::new(table(bad)).unwrap_err();
        assert_eq!(e.key(), Some(key), "{bad}: {e}");
    }
    // a float key hashes as its f32, however the TOML wrote it
    assert_eq!(
        SampleOverrides::typed_json("temperature", &toml::Value::Integer(1)),
        serde_json::json!(1.0f32)
    );
    assert_eq!(
        SampleOverrides::typed_json("n", &toml::Value::Integer(4)),
        serde_json::json!(4)
    );
}

/// `pipelines/reference.toml` documents every `[sample]` key.
#[test]
fn the_reference_config_documents_every_sample_key() {
    let text = include_str!("../../../pipelines/reference.toml");
    let start = text.find("\n# [sample]").expect("a [sample] section");
    let end = start
        + text[start..]
            .find("\n[filter]")
            .expect("[filter] after [sample]");
    let section = &text[start..end];
    for key in SampleSettings::keys() {
        assert!(
            section.contains(&format!("# {key} = ")) || section.contains(&format!("\n{key} = ")),
            "reference.toml does not document sample.{key}"
        );
    }
}

/// A prompt template file must read `problem` (directly or another way the template's own
/// variables show), and parse; otherwise every problem would get the same prompt.
#[test]
fn a_prompt_template_that_never_reads_the_problem_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let parse = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        PromptTemplate::parse(p.to_str().unwrap(), None, None)
    };
    assert!(parse("a.jinja", "Q: {{ problem }}\nA:").is_ok());
    assert!(parse("b.jinja", "{% set p = problem | trim %}Q: {{ p }}").is_ok());
    let e = format!(
        "{:#}",
        parse("c.jinja", "Solve the problem step by step.").unwrap_err()
    );
    assert!(
        e.contains("c.jinja") && e.contains("never reads `problem`"),
        "{e}"
    );
    let e = format!("{:#}", parse("d.jinja", "{{ problem ").unwrap_err());
    assert!(
        e.contains("d.jinja") && e.contains("not a Jinja template"),
        "{e}"
    );
}

/// A template's rendering is bounded: three nested loops of 10,000 (10^12 steps: a hang before)
/// and a string doubled 40 times (a 1 TB allocation: an abort before) each stop with an error
/// naming the file, at once; a template that loops over the problem's characters is fine.
#[test]
fn a_template_that_would_hang_or_exhaust_memory_stops_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let parse = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        PromptTemplate::parse(p.to_str().unwrap(), None, None)
    };
    let loops = "{% for a in range(10000) %}{% for b in range(10000) %}{% for c in range(10000) \
                 %}x{% endfor %}{% endfor %}{% endfor %}{{ problem }}";
    let doubling = "{% set s = namespace(v='ab') %}{% for i in range(40) %}{% set s.v = s.v ~ \
                    s.v %}{% endfor %}{{ s.v }}{{ problem }}";
    for (name, text) in [("loops.jinja", loops), ("doubling.jinja", doubling)] {
        let e = format!("{:#}", parse(name, text).unwrap_err());
        assert!(
            e.contains(name) && e.contains("rendering stopped after"),
            "{name}: {e}"
        );
    }
    assert!(parse("chars.jinja", "{% for c in problem %}{{ c }}{% endfor %}").is_ok());
    // a checkpoint's own chat template is bounded the same way, named by its file
    std::fs::write(dir.path().join("chat_template.jinja"), loops).unwrap();
    let chat = crate::model::ChatTemplate::from_dir(dir.path()).unwrap();
    let e = format!(
        "{:#}",
        chat.render(&[crate::model::Message::new("user", "1 + 1")], true, None)
            .unwrap_err()
    );
    assert!(
        e.contains("chat_template.jinja") && e.contains("rendering stopped after"),
        "{e}"
    );
}

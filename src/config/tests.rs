//! Tests of [`super`] (`config.rs`).

use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::from_toml(text, "pipelines/t.toml", Path::new("/cfg"), "t")
}

const OK: &str = r#"
[run]
name = "t"
disk_budget = "2 GiB"
[[data.sources]]
name = "math500"
format = "math"
path = "data/math500.jsonl"
[filter]
max_per_problem = 2
[filter.completions]
path = "c.parquet"
"#;

#[test]
fn valid_config_resolves_paths_against_the_config_folder() {
    let c = parse(OK).unwrap();
    assert_eq!(c.disk_budget_bytes, Some(2 << 30));
    let d = c.data.unwrap();
    assert_eq!(
        d.sources[0].location,
        Location::Local(PathBuf::from("/cfg/data/math500.jsonl"))
    );
    assert_eq!(c.workdir, PathBuf::from("runs/t"));
}

#[test]
fn misspelled_key_names_file_line_and_closest_key() {
    let bad = OK.replace("max_per_problem", "max_per_problm");
    let e = parse(&bad).unwrap_err().0;
    assert!(e.starts_with("pipelines/t.toml:10:"), "{e}");
    assert!(
        e.contains("unknown key `max_per_problm` in [filter]"),
        "{e}"
    );
    assert!(e.contains("did you mean `max_per_problem`?"), "{e}");
}

#[test]
fn sample_device_dtype_and_kv_cache_dtype_are_typed_where_they_are_read() {
    let with =
        |extra: &str| format!("{OK}[sample]\nmodel = \"m\"\nprompt_template = \"raw\"\n{extra}\n");
    assert!(parse(&with("device = \"cpu\"")).is_ok());
    assert!(parse(&with("device = \"cuda:1\"\nkv_cache_dtype = \"fp8\"")).is_ok());
    assert!(parse(&with("device = \"cuda\"\nenforce_eager = true")).is_ok());
    for (extra, want) in [
        (
            "enforce_eager = true",
            "sample.enforce_eager needs a cuda device",
        ),
        (
            "device = \"cdua\"",
            "pipelines/t.toml:16:1: `sample.device`: must be cpu, cuda or cuda:N, got `cdua`",
        ),
        ("dtype = \"bf16\"", "sample.dtype bf16 needs a cuda device"),
        (
            "kv_cache_dtype = \"fp8\"",
            "sample.kv_cache_dtype fp8 needs a cuda device",
        ),
        (
            "device = \"cuda\"\nkv_cache_dtype = \"int4\"",
            "pipelines/t.toml:17:1: `sample.kv_cache_dtype`: unknown variant `int4`, expected \
             `auto` or `fp8`",
        ),
    ] {
        let e = parse(&with(extra)).unwrap_err().0;
        assert!(e.contains(want), "{extra}: {e}");
    }
}

/// vLLM's sampling keys parse in [sample] and reach the engine; unset, they are left out of
/// the stage config (so stages configured before they existed keep their keys); bad values
/// name the key.
#[test]
fn every_sampling_parameter_is_a_sample_key() {
    let with =
        |extra: &str| format!("{OK}[sample]\nmodel = \"m\"\nprompt_template = \"raw\"\n{extra}\n");
    let c = parse(&with(
        "repetition_penalty = 1.2\npresence_penalty = -0.5\nfrequency_penalty = 0.25\n\
         stop_token_ids = [7, 9]\nlogprobs = 5",
    ))
    .unwrap();
    let s = c.sample.unwrap();
    let p = s.params.clone();
    assert_eq!(
        (
            p.repetition_penalty,
            p.presence_penalty,
            p.frequency_penalty
        ),
        (1.2, -0.5, 0.25)
    );
    assert_eq!((p.stop_token_ids, s.params.logprobs), (vec![7, 9], Some(5)));
    let plain = parse(&with("")).unwrap().sample.unwrap();
    let v = serde_json::to_value(&plain).unwrap();
    for key in [
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "stop_token_ids",
        "logprobs",
    ] {
        assert!(v.get(key).is_none(), "{key} in {v}");
    }
    for (extra, want) in [
        ("repetition_penalty = 0", "repetition_penalty must be"),
        ("logprobs = 50", "logprobs must be at most 20"),
        (
            "repetition_penaly = 1.1",
            "did you mean `repetition_penalty`?",
        ),
    ] {
        let e = parse(&with(extra)).unwrap_err().0;
        assert!(e.contains(want), "{extra}: {e}");
    }
}

#[test]
fn misspelled_enum_value_suggests_the_variant() {
    let bad = OK.replace("format = \"math\"", "format = \"maht\"");
    let e = parse(&bad).unwrap_err().0;
    assert!(e.contains("unknown value `maht`"), "{e}");
    assert!(e.contains("did you mean `math`?"), "{e}");
}

#[test]
fn disk_size_typo_is_an_error_naming_the_key() {
    let bad = OK.replace("2 GiB", "2 GiBB");
    let e = parse(&bad).unwrap_err().0;
    assert!(e.contains("`run.disk_budget`"), "{e}");
    assert!(e.contains("unknown unit"), "{e}");
}

#[test]
fn filter_without_data_is_rejected() {
    let e = parse("[filter]\n[filter.completions]\npath = \"x\"\n")
        .unwrap_err()
        .0;
    assert!(e.contains("add a [data] section"), "{e}");
}

#[test]
fn misspelled_table_is_named_as_a_top_level_key() {
    let bad = OK.replace("[filter]", "[filtr]");
    let e = parse(&bad).unwrap_err().0;
    assert!(e.contains("unknown key `filtr`"), "{e}");
    assert!(e.contains("did you mean `filter`?"), "{e}");
    assert!(!e.contains(" in ["), "{e}");
}

#[test]
fn closest_only_suggests_near_names() {
    let valid = vec!["temperature".to_string(), "top_p".to_string()];
    assert_eq!(closest("tempurature", &valid), Some("temperature".into()));
    assert_eq!(closest("zzzzzz", &valid), None);
}

/// The embedded default parses; `[pretrain]` gives the sampler, trainer and eval the
/// pretrained model, and its mistakes are named: a model given anyway, a prompt format the
/// sampler does not share, a source without solutions, zero rounds, rounds without training.
#[test]
fn pretrain_and_rounds_are_validated() {
    let c = Config::embedded_default().unwrap();
    assert_eq!(c.rounds, 2);
    assert_eq!(c.sample.as_ref().unwrap().model, PRETRAINED);
    assert_eq!(c.train.as_ref().unwrap().model.as_deref(), Some(PRETRAINED));
    assert_eq!(c.eval.as_ref().unwrap().base_model, PRETRAINED);
    let p = c.pretrain.as_ref().unwrap();
    // the tokenizer covers the sampled problems and both eval sets
    let names: Vec<&str> = p
        .tokenizer_sources
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(names, ["arith", "eval-arith_hard", "eval-arith_easy"]);

    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines");
    let bad = |from: &str, to: &str, want: &str| {
        assert!(EMBEDDED_DEFAULT.contains(from), "{from}");
        let text = EMBEDDED_DEFAULT.replacen(from, to, 1);
        let e = match Config::from_toml(&text, "t.toml", &base, "t") {
            Ok(_) => panic!("accepted: {to}"),
            Err(e) => e.0,
        };
        assert!(e.contains(want), "{want}: {e}");
    };
    bad(
        "[sample]\n",
        "[sample]\nmodel = \"Qwen/Qwen3-4B\"\n",
        "`sample.model`",
    );
    bad(
        "[train]\n",
        "[train]\nmodel = \"Qwen/Qwen3-4B\"\n",
        "`train.model`",
    );
    bad(
        "[sample]\nprompt_template = \"raw\"",
        "[sample]\nprompt_template = \"chat\"",
        "differs from `pretrain.prompt_template`",
    );
    bad("\nrounds = 2\n", "\nrounds = 0\n", "`run.rounds`");
    // a section given as a value names what was wanted, not a Rust type
    let e = parse(&format!("train = 5\n{OK}")).unwrap_err().to_string();
    assert!(
        e.contains("expected a table of keys") && !e.contains("struct"),
        "{e}"
    );
    // a huge count is refused at once (it planned without end, memory growing)
    let t = std::time::Instant::now();
    bad(
        "\nrounds = 2\n",
        "\nrounds = 1000000000\n",
        "1000000000 rounds: at most 100",
    );
    assert!(t.elapsed().as_secs() < 5);
    bad(
        "[pretrain.train]\n",
        "[pretrain.train]\nmodel = \"x\"\n",
        "pretrain.train.model",
    );
    bad(
        "format = \"arith\"\npath = \"../data/arith/pretrain.jsonl\"",
        "format = \"mapped\"\nproblem_field = \"problem\"\nanswer_field = \"answer\"\n\
         path = \"../data/arith/pretrain.jsonl\"",
        "worked solutions",
    );
    let no_train = EMBEDDED_DEFAULT
        .split("[train]")
        .next()
        .unwrap()
        .to_string()
        + "[eval]\nsets = [\"arith_hard\"]\n";
    let e = Config::from_toml(&no_train, "t.toml", &base, "t")
        .unwrap_err()
        .0;
    assert!(e.contains("`run.rounds`") && e.contains("[train]"), "{e}");
}

/// [sample] and [eval] are read key by key (the sampling parameters are flattened into them):
/// an unknown key or a bad value still names the file, the line and the key.
#[test]
fn sample_and_eval_errors_name_the_line_and_key() {
    let line_of =
        |text: &str, start: &str| text.lines().position(|l| l.starts_with(start)).unwrap() + 1;
    let sample =
        format!("{OK}[sample]\nmodel = \"m\"\nprompt_template = \"raw\"\ntemperatur = 0.5\n");
    let e = parse(&sample).unwrap_err().0;
    let want = format!(
        "pipelines/t.toml:{}:1: unknown key `temperatur` in [sample]; did you mean `temperature`?",
        line_of(&sample, "temperatur")
    );
    assert!(e.starts_with(&want), "{e}");
    let sample = format!("{OK}[sample]\nmodel = \"m\"\n  temperature = \"hot\"\n");
    let e = parse(&sample).unwrap_err().0;
    let want = format!(
        "pipelines/t.toml:{}:3: `sample.temperature`: invalid type",
        line_of(&sample, "  temperature")
    );
    assert!(e.starts_with(&want), "{e}");
    let eval = format!("{OK}[eval]\nsets = [\"x\"]\ntemprature = 1.0\n");
    let e = parse(&eval).unwrap_err().0;
    let want = format!(
        "pipelines/t.toml:{}:1: unknown key `temprature` in [eval]; did you mean `temperature`?",
        line_of(&eval, "temprature")
    );
    assert!(e.starts_with(&want), "{e}");
    assert!(
        e.contains("(valid: sets, model, limit, prompt_template"),
        "{e}"
    );
    let eval = format!("{OK}[eval]\nsets = [\"x\"]\nmodel = \"m\"\nlimit = \"all\"\n");
    let e = parse(&eval).unwrap_err().0;
    assert!(e.contains("`eval.limit`: invalid type"), "{e}");
}

#[test]
fn decontamination_keys_are_checked_at_parse_time() {
    let c = parse(OK).unwrap();
    let f = c.filter.unwrap();
    assert!(f.decontaminate && f.against.is_empty());
    assert_eq!(
        f.decontaminate_ngram,
        crate::data::decontaminate::DEFAULT_NGRAM
    );
    let with = |extra: &str| OK.replace("[filter]\n", &format!("[filter]\n{extra}\n"));
    let c = parse(&with(
        "decontaminate_ngram = 13\ndecontaminate_against = [\"aime24\", \"math-hard\"]",
    ))
    .unwrap();
    let f = c.filter.unwrap();
    let names: Vec<&str> = f.against.iter().map(|a| a.name()).collect();
    assert_eq!(names, ["aime24", "aime25", "hmmt_feb25", "olympiadbench"]);
    assert_eq!(f.decontaminate_ngram, 13);
    for (extra, want) in [
        (
            "decontaminate_ngram = 0",
            "`filter.decontaminate_ngram`: must be at least 1",
        ),
        (
            "decontaminate = false\ndecontaminate_against = [\"aime24\"]",
            "`filter.decontaminate_against`: set, but `decontaminate = false`",
        ),
        (
            "decontaminate_against = [\"aime42\"]",
            "`filter.decontaminate_against`: eval set `aime42`: no aime42.toml",
        ),
        (
            "decontaminate_against = [\"held-out.jsonl\"]",
            "`filter.decontaminate_against`: `held-out.jsonl`: no such file (/cfg/held-out.jsonl)",
        ),
    ] {
        let e = parse(&with(extra)).unwrap_err().0;
        assert!(e.contains(want), "{extra}: {e}");
    }
}

#[test]
fn gpu_hour_price_is_one_price_or_a_table_of_known_gpus() {
    let with = |v: &str| {
        OK.replace(
            "disk_budget = \"2 GiB\"\n",
            &format!("disk_budget = \"2 GiB\"\ngpu_hour_price = {v}\n"),
        )
    };
    let c = parse(&with("2")).unwrap();
    assert_eq!(c.gpu_hour_price.unwrap().for_gpu("b200"), Some(2.0));
    let c = parse(&with("{ h100 = 2.5, b200 = 6 }")).unwrap();
    let p = c.gpu_hour_price.unwrap();
    assert_eq!(
        (p.for_gpu("h100"), p.for_gpu("b200"), p.for_gpu("h200")),
        (Some(2.5), Some(6.0), None)
    );
    for (v, want) in [
        (
            "-1.0",
            "`run.gpu_hour_price`: must be a price of one GPU-hour, 0 or more, got -1",
        ),
        (
            "{ h1000 = 2.0 }",
            "`run.gpu_hour_price.h1000`: not a GPU kind (did you mean `h100`?",
        ),
        (
            "{ h200 = -3.0 }",
            "`run.gpu_hour_price.h200`: must be a price",
        ),
    ] {
        let e = parse(&with(v)).unwrap_err().0;
        assert!(e.contains(want), "{v}: {e}");
    }
}

#[test]
fn mix_and_train_from_are_checked_at_parse_time() {
    // a config with sampling, two rounds and training
    let two = r#"
[run]
name = "t"
rounds = 2
[[data.sources]]
name = "math500"
format = "math"
path = "data/math500.jsonl"
[sample]
model = "m"
[filter]
[train]
"#;
    let c = parse(&format!("{two}[mix]\naccumulate = true\n[[mix.sources]]\nname = \"r\"\nformat = \"math\"\npath = \"r.jsonl\"\nshare = 0.25\n")).unwrap();
    let m = c.mix.unwrap();
    assert!(m.accumulate && m.sources[0].share == 0.25);
    assert_eq!(c.train_from, TrainFrom::Previous);
    let c = parse(&two.replace("rounds = 2", "rounds = 2\ntrain_from = \"base\"")).unwrap();
    assert_eq!(c.train_from, TrainFrom::Base);
    for (text, want) in [
        (
            format!("{two}[mix]\n[[mix.sources]]\nname = \"r\"\nformat = \"math\"\npath = \"r.jsonl\"\nshare = 1.5\n"),
            "`mix.sources.0.share`: must be in [0, 1], got 1.5",
        ),
        (
            format!("{two}[mix]\n[[mix.sources]]\nname = \"r\"\nformat = \"math\"\npath = \"r.jsonl\"\n"),
            "`mix.sources.0.share`: missing",
        ),
        (
            format!("{two}[mix]\n[[mix.sources]]\nname = \"r\"\nformat = \"mapped\"\nproblem_field = \"q\"\nanswer_field = \"a\"\npath = \"r.jsonl\"\nshare = 0.1\n"),
            "`mix.sources.0`: the rows mixed in need worked solutions",
        ),
        (format!("{two}[mix]\n"), "`mix`: mixes nothing"),
        (
            format!("{}[mix]\naccumulate = true\n", two.replace("rounds = 2", "rounds = 1")),
            "`mix.accumulate`: keeps earlier rounds' rows, but run.rounds is 1",
        ),
        (
            two.replace("rounds = 2", "rounds = 1\ntrain_from = \"base\""),
            "`run.train_from`: \"base\" differs from \"previous\" only from round 2 on",
        ),
        (
            two.replace("rounds = 2", "rounds = 2\ntrain_from = \"bsae\""),
            "did you mean `base`?",
        ),
        (
            two.replace("rounds = 2", "rounds = 2\nresample_below = 0.0"),
            "`run.resample_below`: must be in (0, 1]",
        ),
        (
            two.replace("rounds = 2", "rounds = 1\nresample_below = 0.5"),
            "`run.resample_below`: acts from round 2 on",
        ),
        (
            two.replace("[filter]", "[filter]\nkeep_pass_rate = [0.8, 0.2]"),
            "`filter.keep_pass_rate`: [0.8, 0.2] is an empty window",
        ),
        (
            two.replace("[filter]", "[filter]\nkeep_pass_rate = [0.5]"),
            "`filter.keep_pass_rate`: must be [min, max] with both in [0, 1]",
        ),
        (
            format!("{two}[rationalize]\nhint = \"{{problem}} Show why.\"\n"),
            "`rationalize.hint: has no {answer} placeholder",
        ),
        (
            format!("{two}[rationalize]\nhint = \"The answer is {{answer}}.\"\n"),
            "`rationalize.hint: has no {problem} placeholder",
        ),
        (
            format!("{two}[rationalize]\nhint = \"{{problem}} {{answer}}\"\nn = 0\n"),
            "`rationalize.n: must be at least 1",
        ),
        (
            format!("{two}[rationalize]\nhnt = \"{{problem}} {{answer}}\"\n"),
            "unknown key `hnt` in [rationalize]; did you mean `hint`?",
        ),
        (
            format!(
                "{}[rationalize]\nhint = \"{{problem}} {{answer}}\"\n",
                two.replace("[sample]\nmodel = \"m\"\n", "")
                    .replace("rounds = 2", "rounds = 1")
                    .replace("[train]\n", "")
                    .replace("[filter]\n", "[filter]\n[filter.completions]\npath = \"c.parquet\"\n")
            ),
            "`rationalize`: samples the problems the sample stage left unsolved again",
        ),
    ] {
        let e = parse(&text).unwrap_err().0;
        assert!(e.contains(want), "{want}: {e}");
    }
    let c = parse(&format!(
        "{two}[rationalize]\nhint = \"{{problem}} (answer: {{answer}})\"\nn = 2\n"
    ))
    .unwrap();
    assert_eq!(c.rationalize.unwrap().n, Some(2));
}

//! Formats compiled over the real default model's vocabulary and driven by arbitrary logits:
//! whatever the model would prefer, the reply is what the format allows.

use std::sync::OnceLock;

use seedbar_engine::{
    tokenizer::{TokenBytes, Tokenizer},
    Model, ToolCallParser, ToolOutput,
};
use seedbar_grammar::{Format, GrammarError, ToolSchema, Vocabulary};
use serde_json::{json, Value};

/// The default model's tokenizer and end-of-reply ids.
struct Vocab {
    tokenizer: Tokenizer,
    eos_ids: Vec<u32>,
}

fn model() -> &'static Vocab {
    static VOCAB: OnceLock<Vocab> = OnceLock::new();
    VOCAB.get_or_init(|| {
        let model = Model::load(&seedbar_dev::default_model_path()).unwrap();
        Vocab {
            tokenizer: model.tokenizer.clone(),
            eos_ids: model.eos_ids.clone(),
        }
    })
}

fn vocabulary() -> &'static Vocabulary {
    static VOCABULARY: OnceLock<Vocabulary> = OnceLock::new();
    VOCABULARY.get_or_init(|| Vocabulary::new(&model().tokenizer, &model().eos_ids).unwrap())
}

/// Logits a model might give: pseudo-random, from `seed`.
fn noise(seed: u64, vocab: usize) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..vocab)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 * 8.0
        })
        .collect()
}

/// Greedy decoding of noise under `format` until an end-of-reply token.
fn drive(format: &Format, seed: u64) -> String {
    let mut constraint = vocabulary().compile(format).unwrap();
    let mut ids = Vec::new();
    for step in 0..400u64 {
        let mut logits = noise(seed * 1000 + step, 49152);
        constraint.mask().unwrap().apply(&mut logits);
        let token = (0..logits.len())
            .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
            .unwrap() as u32;
        constraint.accept(token).unwrap();
        if model().eos_ids.contains(&token) {
            return model().tokenizer.decode(&ids).unwrap();
        }
        ids.push(token);
    }
    panic!("the format never let the reply end")
}

#[test]
fn the_vocabulary_spells_text_as_the_tokenizer_writes_it() {
    let text = "Grüße, 世界! {\"a\": [1, 2.5e-3]}\n\ttabs and  spaces ✓";
    let ids = model().tokenizer.encode(text).unwrap();
    let bytes = model().tokenizer.token_bytes().unwrap();
    let spelled: Vec<u8> = ids
        .iter()
        .flat_map(|&id| match &bytes[id as usize] {
            TokenBytes::Text(b) => b.clone(),
            TokenBytes::Special(name) => panic!("text encoded to the control token {name}"),
        })
        .collect();
    assert_eq!(String::from_utf8(spelled).unwrap(), text);
    let im_end = model().tokenizer.token_to_id("<|im_end|>").unwrap();
    assert_eq!(
        bytes[im_end as usize],
        TokenBytes::Special("<|im_end|>".into())
    );
}

#[test]
fn a_schema_holds_whatever_the_logits_prefer() {
    let schema = json!({
        "type": "object",
        "properties": {
            "kind": {"const": "city"},
            "size": {"enum": ["small", "large"]},
            "where": {
                "type": "object",
                "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90}, "name": {"type": "string", "maxLength": 12}},
                "required": ["lat", "name"],
                "additionalProperties": false
            },
            "tags": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}
        },
        "required": ["kind", "size", "where", "tags"],
        "additionalProperties": false
    });
    for seed in 0..6 {
        let reply = drive(&Format::JsonSchema(schema.clone()), seed);
        let value: Value = serde_json::from_str(&reply)
            .unwrap_or_else(|e| panic!("seed {seed}: {reply:?} is not JSON: {e}"));
        assert_eq!(value["kind"], "city", "{reply}");
        assert!(
            ["small", "large"].contains(&value["size"].as_str().unwrap()),
            "{reply}"
        );
        assert!(value["where"]["lat"].is_number(), "{reply}");
        assert!(value["where"]["name"].as_str().unwrap().chars().count() <= 12);
        let tags = value["tags"].as_array().unwrap();
        assert!(tags.len() <= 3 && tags.iter().all(Value::is_i64), "{reply}");
        assert_eq!(value.as_object().unwrap().len(), 4, "{reply}");
    }
}

#[test]
fn json_mode_starts_an_object_and_ends_where_it_closes() {
    let mut constraint = vocabulary().compile(&Format::JsonObject).unwrap();
    let bytes = model().tokenizer.token_bytes().unwrap();
    let first = constraint.mask().unwrap();
    let allowed: Vec<usize> = (0..bytes.len())
        .filter(|&id| first.allows(id as u32))
        .collect();
    assert!(!allowed.is_empty());
    for id in allowed {
        assert!(
            matches!(&bytes[id], TokenBytes::Text(b) if b.starts_with(b"{")),
            "token {id} ({:?}) may open a JSON-mode reply",
            bytes[id]
        );
    }
    for token in model()
        .tokenizer
        .encode(r#"{"a": [1, {"b": null}]}"#)
        .unwrap()
    {
        assert!(constraint.mask().unwrap().allows(token));
        constraint.accept(token).unwrap();
    }
    let last = constraint.mask().unwrap();
    let open: Vec<u32> = (0..bytes.len() as u32)
        .filter(|&id| last.allows(id))
        .collect();
    let mut eos = model().eos_ids.clone();
    eos.sort_unstable();
    assert_eq!(open, eos, "a closed object only ends");
}

#[test]
fn a_forced_tool_call_is_exactly_one_call_of_a_declared_tool() {
    let tools = vec![
        ToolSchema {
            name: "get_weather".into(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"], "additionalProperties": false}),
        },
        ToolSchema {
            name: "add".into(),
            parameters: json!({"type": "object", "properties": {"a": {"type": "integer", "minimum": -1000, "maximum": 1000}, "b": {"type": "integer", "minimum": 0, "maximum": 1000}}, "required": ["a", "b"], "additionalProperties": false}),
        },
    ];
    for seed in 0..6 {
        let reply = drive(&Format::ToolCall(tools.clone()), seed);
        let calls: Vec<_> = ToolCallParser::parse(&reply)
            .into_iter()
            .map(|output| match output {
                ToolOutput::Call(call) => call,
                ToolOutput::Text(text) => panic!("text {text:?} beside the call in {reply:?}"),
            })
            .collect();
        assert_eq!(calls.len(), 1, "{reply}");
        let arguments: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        match calls[0].name.as_str() {
            "get_weather" => assert!(arguments["city"].is_string(), "{reply}"),
            "add" => assert!(
                arguments["a"].is_i64() && arguments["b"].is_i64(),
                "{reply}"
            ),
            other => panic!("called the undeclared {other}"),
        }
    }
}

#[test]
fn a_forced_call_has_only_the_arguments_its_schema_lists_unless_it_allows_more() {
    // Neither object says whether it allows other properties (JSON schema's default: it
    // does); a forced call still gets only the listed ones, at every depth.
    let tool = ToolSchema {
        name: "book".into(),
        parameters: json!({"type": "object", "properties": {
            "when": {"type": "object", "properties": {"day": {"type": "integer", "minimum": 1, "maximum": 31}}},
            "note": {"type": "string", "maxLength": 8}}}),
    };
    let listed = |value: &Value, names: &[&str]| {
        value
            .as_object()
            .is_some_and(|o| o.keys().all(|k| names.contains(&k.as_str())))
    };
    for seed in 0..8 {
        let reply = drive(&Format::ToolCall(vec![tool.clone()]), seed);
        let call: Value = serde_json::from_str(&reply).unwrap();
        let arguments = &call["arguments"];
        assert!(listed(arguments, &["when", "note"]), "{reply}");
        if let Some(when) = arguments.get("when") {
            assert!(listed(when, &["day"]), "{reply}");
        }
    }
}

#[test]
fn an_invalid_schema_is_refused_with_the_reason() {
    let bad =
        Format::JsonSchema(json!({"type": "object", "properties": {"a": {"type": "strnig"}}}));
    match vocabulary().compile(&bad) {
        Err(GrammarError::Invalid(reason)) => assert!(reason.contains("strnig"), "{reason}"),
        other => panic!("expected Invalid, got {other:?}"),
    }
}

//! Unit tests of `ollama.rs`: the Ollama lines from neutral events, without a model.

use serde_json::json;

use super::*;
use crate::generation::test_events::{call, finish, token};

fn lines(route: Route) -> ReplyLines {
    ReplyLines {
        route,
        model: "m".into(),
        seed: 3,
        prompt_tokens: 10,
        context: vec![1, 2],
    }
}

/// The lines as JSON, `created_at` checked and dropped.
fn wire(lines: Vec<String>) -> Vec<Value> {
    lines
        .iter()
        .map(|line| {
            let mut value: Value = serde_json::from_str(line).unwrap();
            let stamp = value["created_at"].take();
            assert!(humantime::parse_rfc3339(stamp.as_str().unwrap()).is_ok());
            value.as_object_mut().unwrap().remove("created_at");
            value
        })
        .collect()
}

/// An end that releases "!" after 2 tokens, with its timings.
fn ending(reason: StopReason) -> Finish {
    Finish {
        deltas: vec![Delta::Text("!".into())],
        timings: Timings {
            load: Duration::from_nanos(5),
            prompt_eval: Duration::from_nanos(10),
            eval: Duration::from_nanos(20),
            total: Duration::from_nanos(40),
        },
        ..finish(reason, 2)
    }
}

#[test]
fn chat_lines_from_neutral_events() {
    let mut chat = lines(Route::Chat);
    let mut out = chat.token(0, token(7, vec![Delta::Text("Hi".into())]));
    out.extend(chat.token(0, token(8, vec![Delta::Text(String::new())])));
    out.extend(chat.token(0, token(9, vec![Delta::ToolCall(call())])));
    out.extend(chat.finish(0, ending(StopReason::ToolCalls)));
    assert_eq!(
        wire(out),
        [
            json!({"model": "m", "message": {"role": "assistant", "content": "Hi"},
                   "done": false}),
            json!({"model": "m", "message": {"role": "assistant", "content": "",
                   "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
                   "done": false}),
            json!({"model": "m", "message": {"role": "assistant", "content": "!"},
                   "done": false}),
            json!({"model": "m", "message": {"role": "assistant", "content": ""},
                   "done": true, "done_reason": "stop", "total_duration": 40,
                   "load_duration": 5, "prompt_eval_count": 10, "prompt_eval_duration": 10,
                   "eval_count": 2, "eval_duration": 20, "seed": 3}),
        ]
    );
    assert_eq!(chat.failed("boom".into()), [r#"{"error":"boom"}"#]);
}

#[test]
fn generate_lines_end_with_the_context() {
    let mut generate = lines(Route::Generate);
    let mut out = generate.token(0, token(7, vec![Delta::Text("Hi".into())]));
    out.extend(generate.finish(0, ending(StopReason::Length)));
    let out = wire(out);
    assert_eq!(
        out[0],
        json!({"model": "m", "response": "Hi", "done": false})
    );
    assert_eq!(out[2]["done_reason"], "length");
    assert_eq!(out[2]["response"], "");
    assert_eq!(out[2]["context"], json!([1, 2, 7]));
    let whole = lines(Route::Generate).whole(Reply {
        pieces: vec![Delta::Text("Hi!".into())],
        tokens: vec![7, 8],
        ..Reply::default()
    });
    let whole = serde_json::to_value(whole).unwrap();
    assert_eq!(
        (&whole["response"], &whole["context"], &whole["done"]),
        (&json!("Hi!"), &json!([1, 2, 7, 8]), &json!(true))
    );
}

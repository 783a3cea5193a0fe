//! Unit tests of `openai.rs`: the OpenAI translation, without a model.

use seedbar_scheduler::Usage;
use serde_json::json;

use super::*;
use crate::generation::test_events::{call, finish, token};
use crate::generation::{StopReason, Timings};

fn envelope(object: &'static str) -> Envelope {
    Envelope {
        id: "chatcmpl-1".into(),
        object,
        created: 7,
        model: "m".into(),
        system_fingerprint: "fp_1".into(),
        seed: 3,
    }
}

/// Each event's data: JSON, or the text (`[DONE]`).
fn wire(events: Vec<SseMessage>) -> Vec<Value> {
    events
        .into_iter()
        .map(|e| serde_json::from_str(&e.data).unwrap_or(Value::String(e.data)))
        .collect()
}

fn chunk(choices: Value) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "m",
           "system_fingerprint": "fp_1", "seed": 3, "choices": choices})
}

fn text(text: &str) -> Vec<Delta> {
    vec![Delta::Text(text.into())]
}

fn with_logprob(token: Token) -> Token {
    Token {
        logprob: Some(logprob()),
        ..token
    }
}

fn logprob() -> Logprob {
    Logprob {
        token: "Hi".into(),
        logprob: -0.5,
        top: vec![("Hi".into(), -0.5), ("Yo".into(), -1.5)],
        offset: 4,
    }
}

#[test]
fn chat_chunks_from_neutral_events() {
    let mut stream = ChatStream {
        envelope: envelope("chat.completion.chunk"),
        choices: 1,
        calls: vec![0],
        include_usage: true,
    };
    let mut events = stream.start();
    events.extend(stream.token(0, with_logprob(token(9, text("Hi")))));
    events.extend(stream.token(0, with_logprob(token(10, text("")))));
    events.extend(stream.token(0, token(11, text(""))));
    events.extend(stream.token(0, token(12, vec![Delta::ToolCall(call())])));
    events.extend(stream.finish(0, finish(StopReason::ToolCalls, 4)));
    events.extend(stream.done(TotalUsage {
        prompt_tokens: 5,
        completion_tokens: 4,
        cached_tokens: 2,
        reasoning_tokens: 1,
    }));
    let lp = json!({"content": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105],
        "top_logprobs": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105]},
                         {"token": "Yo", "logprob": -1.5, "bytes": [89, 111]}]}]});
    let choice = |delta: Value, logprobs: Value, finish: Value| {
        chunk(json!([{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]))
    };
    assert_eq!(
        wire(events),
        [
            choice(
                json!({"role": "assistant", "content": ""}),
                json!(null),
                json!(null)
            ),
            choice(json!({"content": "Hi"}), lp.clone(), json!(null)),
            // A token whose text is held back still brings its log-probabilities.
            choice(json!({"content": ""}), lp, json!(null)),
            choice(
                json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                       "function": {"name": "f", "arguments": "{\"x\":1}"}}]}),
                json!(null),
                json!(null)
            ),
            choice(json!({}), json!(null), json!("tool_calls")),
            json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7,
                   "model": "m", "system_fingerprint": "fp_1", "seed": 3, "choices": [],
                   "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9,
                             "prompt_tokens_details": {"cached_tokens": 2},
                             "completion_tokens_details": {"reasoning_tokens": 1}}}),
            json!("[DONE]"),
        ]
    );
    let failed = wire(stream.failed("boom".into()));
    assert_eq!(
        failed,
        [
            json!({"error": {"message": "boom", "type": "server_error", "param": null,
                             "code": null}}),
            json!("[DONE]")
        ]
    );
}

#[test]
fn whole_chat_choices() {
    let reply = Reply {
        pieces: vec![Delta::ToolCall(call())],
        finish: Some((StopReason::ToolCalls, Usage::default(), Timings::default())),
        ..Reply::default()
    };
    assert_eq!(
        serde_json::to_value(chat_choice(1, reply, false)).unwrap(),
        json!({"index": 1, "logprobs": null, "finish_reason": "tool_calls",
               "message": {"role": "assistant", "content": null, "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "f", "arguments": "{\"x\":1}"}}]}})
    );
    let reply = Reply {
        pieces: vec![Delta::Text("ok".into())],
        logprobs: vec![logprob()],
        finish: Some((StopReason::Length, Usage::default(), Timings::default())),
        ..Reply::default()
    };
    let choice = serde_json::to_value(chat_choice(0, reply, true)).unwrap();
    assert_eq!(
        choice["message"],
        json!({"role": "assistant", "content": "ok"})
    );
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(choice["logprobs"]["content"][0]["token"], "Hi");
    let reply = Reply {
        pieces: vec![Delta::Reasoning("hmm".into()), Delta::Text("ok".into())],
        ..Reply::default()
    };
    assert_eq!(
        serde_json::to_value(chat_choice(0, reply, false)).unwrap()["message"],
        json!({"role": "assistant", "content": "ok", "reasoning_content": "hmm"})
    );
}

#[test]
fn thinking_streams_as_reasoning_content_deltas() {
    let mut stream = ChatStream {
        envelope: envelope("chat.completion.chunk"),
        choices: 1,
        calls: vec![0],
        include_usage: false,
    };
    let events = stream.token(
        0,
        token(
            1,
            vec![Delta::Reasoning("hmm".into()), Delta::Text("ok".into())],
        ),
    );
    let deltas: Vec<Value> = wire(events)
        .iter()
        .map(|chunk| chunk["choices"][0]["delta"].clone())
        .collect();
    assert_eq!(
        deltas,
        [
            json!({"reasoning_content": "hmm"}),
            json!({"content": "ok"})
        ]
    );
}

#[test]
fn legacy_chunks_echo_and_count_offsets_from_the_echo() {
    let mut stream = CompletionStream {
        envelope: envelope("text_completion"),
        echoes: vec!["Say".into()],
        include_usage: false,
    };
    let mut events = stream.start();
    events.extend(stream.token(0, with_logprob(token(9, text("Hi")))));
    events.extend(stream.token(0, token(10, text(""))));
    events.extend(stream.finish(0, finish(StopReason::StopString(0), 2)));
    events.extend(stream.done(TotalUsage::default()));
    let choice = |text: &str, logprobs: Value, finish: Value| {
        json!({"id": "chatcmpl-1", "object": "text_completion", "created": 7, "model": "m",
               "system_fingerprint": "fp_1", "seed": 3,
               "choices": [{"index": 0, "text": text, "logprobs": logprobs,
                            "finish_reason": finish}]})
    };
    assert_eq!(
        wire(events),
        [
            choice("Say", json!(null), json!(null)),
            choice(
                "Hi",
                json!({"tokens": ["Hi"], "token_logprobs": [-0.5],
                       "top_logprobs": [{"Hi": -0.5, "Yo": -1.5}], "text_offset": [7]}),
                json!(null)
            ),
            choice("", json!(null), json!(null)),
            choice("", json!(null), json!("stop")),
            json!("[DONE]"),
        ]
    );
}

//! Unit tests of `responses.rs`: the Responses translation, without a model.

use serde_json::json;

use super::*;
use crate::generation::{
    test_events::{call, finish, token},
    Delta,
};

fn request(body: Value) -> Result<ChatInput, ApiError> {
    serde_json::from_value::<ResponsesRequest>(body)
        .map_err(|e| ApiError::bad_param("body", e.to_string()))?
        .into_chat()
}

#[test]
fn input_items_become_template_turns_and_tools() {
    let ChatInput {
        messages: chat,
        tools,
        ..
    } = request(json!({
        "instructions": "Be brief.",
        "tools": [{"type": "function", "name": "weather", "description": "Weather now",
                   "parameters": {"type": "object"}, "strict": true}],
        "input": [
            {"role": "developer", "content": "Use tools."},
            {"role": "user", "content": [{"type": "input_text", "text": "Paris?"}]},
            {"type": "function_call", "call_id": "call_1", "name": "weather",
             "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "It is sunny."}]},
        ],
    }))
    .unwrap();
    let turns: Vec<(&str, &str)> = chat
        .iter()
        .map(|m| (m.role.as_str(), m.content.as_str()))
        .collect();
    assert_eq!(
        turns,
        [
            ("system", "Be brief."),
            ("system", "Use tools."),
            ("user", "Paris?"),
            ("assistant", ""),
            ("tool", "sunny"),
            ("assistant", "It is sunny."),
        ]
    );
    assert_eq!(
        chat[3].tool_calls,
        Some(json!([{"id": "call_1", "type": "function",
                     "function": {"name": "weather", "arguments": {"city": "Paris"}}}]))
    );
    assert_eq!(chat[4].tool_call_id.as_deref(), Some("call_1"));
    assert_eq!(
        tools,
        Some(vec![json!({"type": "function", "function": {
            "name": "weather", "description": "Weather now",
            "parameters": {"type": "object"}}})])
    );
    let chat = request(json!({"input": "Hi"})).unwrap();
    assert_eq!(chat.messages, [ChatMessage::new("user", "Hi")]);
    let chat = request(json!({"input": [
        {"role": "user", "content": "Hi"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
        {"role": "assistant", "content": "Hello"},
    ]}))
    .unwrap();
    assert_eq!(
        chat.messages,
        [
            ChatMessage::new("user", "Hi"),
            ChatMessage::new("assistant", "Hello")
        ],
        "reasoning items are left out"
    );
}

#[test]
fn stateful_requests_are_refused_and_forcing_ones_force_a_call() {
    let e = request(json!({"input": "Hi", "previous_response_id": "resp_1"})).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("previous_response_id"));
    assert!(e.message.contains("stateless"), "{}", e.message);
    let tools = json!([{"type": "function", "name": "f"}]);
    for forced in [json!("required"), json!({"type": "function", "name": "f"})] {
        let call = request(json!({"input": "Hi", "tools": tools, "tool_choice": forced}))
            .unwrap()
            .forced_call;
        let Some(seedbar_grammar::Format::ToolCall(calls)) = call else {
            panic!("{call:?} forces no call")
        };
        assert_eq!(calls[0].name, "f");
    }
    let none = request(json!({"input": "Hi", "tools": tools, "tool_choice": "none"})).unwrap();
    assert_eq!(none.tools, None);
    let e = request(json!({"input": [{"type": "function_call", "name": "f"}]})).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("input[0]"));
    assert!(e.message.contains("call_id"), "{}", e.message);
    let e = request(
        json!({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}),
    )
    .unwrap_err();
    assert_eq!(e.param.as_deref(), Some("input[0].content[0]"));
    assert!(
        e.message.contains("file_id is not supported"),
        "{}",
        e.message
    );
    assert!(request(json!({"input": [], "instructions": "x"})).is_err());
}

#[test]
fn text_format_asks_for_json_and_not_beside_a_forced_call() {
    let format = |body: Value| {
        let req: ResponsesRequest = serde_json::from_value(body).unwrap();
        req.text.format.as_ref().and_then(TextFormat::format)
    };
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    assert_eq!(
        format(json!({"input": "Hi", "text": {"format": {
            "type": "json_schema", "name": "output", "schema": schema, "strict": false}}})),
        Some(seedbar_grammar::Format::JsonSchema(schema))
    );
    assert_eq!(
        format(json!({"input": "Hi", "text": {"format": {"type": "json_object"}}})),
        Some(seedbar_grammar::Format::JsonObject)
    );
    for free in [
        json!({"format": {"type": "text"}}),
        json!({"verbosity": "low"}),
    ] {
        assert_eq!(format(json!({"input": "Hi", "text": free})), None);
    }
    assert!(serde_json::from_value::<ResponsesRequest>(
        json!({"input": "Hi", "text": {"format": {"type": "yaml"}}})
    )
    .is_err());
    let e = one_format(
        Some(seedbar_grammar::Format::JsonObject),
        Some(seedbar_grammar::Format::JsonObject),
        "text.format",
    )
    .unwrap_err();
    assert_eq!(e.param.as_deref(), Some("text.format"));
}

fn frame() -> ResponseFrame {
    ResponseFrame {
        id: "resp_abc".into(),
        created_at: 1,
        model: "m".into(),
        seed: 3,
        input_tokens: 10,
    }
}

fn translator() -> ResponseStream {
    ResponseStream {
        output: Output::new("resp_abc"),
        frame: frame(),
        sequence_number: 0,
    }
}

/// Each event's name and data.
fn wire(events: Vec<SseMessage>) -> Vec<(String, Value)> {
    events
        .into_iter()
        .map(|e| (e.name.unwrap(), serde_json::from_str(&e.data).unwrap()))
        .collect()
}

#[test]
fn neutral_events_become_numbered_item_events() {
    let mut stream = translator();
    let mut events = stream.start();
    events.extend(stream.token(0, token(1, vec![Delta::Text("Hi".into())])));
    events.extend(stream.token(0, token(2, vec![Delta::Text(" there".into())])));
    events.extend(stream.token(0, token(3, vec![Delta::ToolCall(call())])));
    events.extend(stream.finish(0, finish(StopReason::ToolCalls, 9)));
    let events = wire(events);
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (number, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], json!(name), "{data}");
        assert_eq!(data["sequence_number"], json!(number), "{data}");
    }
    assert_eq!(
        events[6].1,
        json!({"type": "response.output_text.done", "sequence_number": 6,
               "item_id": "msg_abc_0", "output_index": 0, "content_index": 0,
               "text": "Hi there"})
    );
    assert_eq!(
        events[11].1,
        json!({"type": "response.function_call_arguments.done", "sequence_number": 11,
               "item_id": "fc_abc_1", "output_index": 1, "arguments": "{\"x\":1}"})
    );
    let response = &events[13].1["response"];
    assert_eq!(response["status"], "completed", "a call is complete");
    assert_eq!(
        response["output"][1],
        json!({"type": "function_call", "id": "fc_abc_1", "call_id": "call_1",
               "name": "f", "arguments": "{\"x\":1}", "status": "completed"})
    );
    assert_eq!(
        response["usage"],
        json!({"input_tokens": 10, "output_tokens": 9, "total_tokens": 19,
               "output_tokens_details": {"reasoning_tokens": 0}})
    );
}

#[test]
fn a_cut_reply_is_incomplete_and_a_failure_is_failed() {
    let mut stream = translator();
    stream.token(0, token(1, vec![Delta::Text("ok".into())]));
    let events = wire(stream.finish(0, finish(StopReason::Length, 9)));
    let (name, last) = events.last().unwrap();
    assert_eq!(name, "response.incomplete");
    assert_eq!(
        last["response"]["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    let failed = wire(translator().failed("boom".into()));
    assert_eq!(failed[0].0, "response.failed");
    assert_eq!(
        failed[0].1["response"]["error"],
        json!({"code": "server_error", "message": "boom"})
    );
    assert_eq!(failed[0].1["response"]["status"], "failed");
}

#[test]
fn the_response_has_openais_shape() {
    let mut output = Output::new("resp_abc");
    output.push(vec![Delta::Text("ok".into())]);
    output.finish();
    let usage = Usage {
        completion_tokens: 4,
        ..Usage::default()
    };
    let response = frame().finished(output.items, StopReason::Length, &usage, 0);
    assert_eq!(
        serde_json::to_value(&response).unwrap(),
        json!({"id": "resp_abc", "object": "response", "created_at": 1,
               "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
               "error": null, "model": "m", "seed": 3,
               "output": [{"type": "message", "id": "msg_abc_0", "status": "completed",
                           "role": "assistant",
                           "content": [{"type": "output_text", "text": "ok", "annotations": []}]}],
               "usage": {"input_tokens": 10, "output_tokens": 4, "total_tokens": 14,
                         "output_tokens_details": {"reasoning_tokens": 0}}})
    );
    let mut empty = Output::new("resp_abc");
    empty.finish();
    assert_eq!(
        empty.items,
        [OutputItem::Message {
            id: "msg_abc_0".into(),
            status: Status::Completed,
            role: AssistantRole::Assistant,
            content: vec![output_text(String::new())],
        }]
    );
}

#[test]
fn thinking_comes_first_as_a_reasoning_item_with_its_own_events() {
    let mut output = Output::new("resp_1");
    let mut events = output.push(vec![Delta::Reasoning("Let me".into())]);
    events.extend(output.push(vec![
        Delta::Reasoning(" see".into()),
        Delta::Text("4".into()),
    ]));
    events.extend(output.finish());
    let names: Vec<&str> = events.iter().map(StreamEvent::name).collect();
    assert_eq!(
        names,
        [
            "response.output_item.added",
            "response.content_part.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
        ]
    );
    assert_eq!(
        serde_json::to_value(&output.items).unwrap(),
        json!([
            {"type": "reasoning", "id": "rs_1_0", "summary": [], "status": "completed",
             "content": [{"type": "reasoning_text", "text": "Let me see"}]},
            {"type": "message", "id": "msg_1_1", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": "4", "annotations": []}]}
        ])
    );
}

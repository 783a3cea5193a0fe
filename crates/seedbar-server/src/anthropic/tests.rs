//! Unit tests of `anthropic.rs`: the Anthropic translation, without a model.

use axum::http::StatusCode;
use serde_json::json;

use super::*;
use crate::generation::test_events::{call, finish, token};

fn conversation(body: Value) -> Result<ChatInput, ApiError> {
    serde_json::from_value::<Conversation>(body)
        .map_err(|e| ApiError::bad_param("body", e.to_string()))?
        .into_chat()
}

#[test]
fn a_conversation_becomes_template_turns_and_tools() {
    let ChatInput {
        messages: chat,
        tools,
        ..
    } = conversation(json!({
        "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
        "tools": [{"name": "weather", "description": "Weather now",
                   "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1",
                 "content": [{"type": "text", "text": "sunny"}]},
                {"type": "text", "text": "Thanks"}]},
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
            ("system", "Be brief.\nBe kind."),
            ("user", "Weather in Paris?"),
            ("assistant", "Let me look."),
            ("tool", "sunny"),
            ("user", "Thanks"),
        ]
    );
    assert_eq!(
        chat[2].tool_calls,
        Some(json!([{"id": "toolu_1", "type": "function",
                     "function": {"name": "weather", "arguments": {"city": "Paris"}}}]))
    );
    assert_eq!(chat[3].tool_call_id.as_deref(), Some("toolu_1"));
    assert_eq!(
        tools,
        Some(vec![json!({"type": "function", "function": {
            "name": "weather", "description": "Weather now",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})])
    );
}

#[test]
fn tool_choice_none_drops_the_tools_and_any_or_tool_forces_a_call() {
    let with_choice = |choice: Value| {
        conversation(json!({
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "tool_choice": choice,
        }))
    };
    assert!(with_choice(json!({"type": "auto"}))
        .unwrap()
        .tools
        .is_some());
    assert_eq!(with_choice(json!({"type": "none"})).unwrap().tools, None);
    for forced in [json!({"type": "any"}), json!({"type": "tool", "name": "f"})] {
        let chat = with_choice(forced).unwrap();
        assert!(chat.tools.is_some());
        let call = chat.forced_call;
        let Some(seedbar_grammar::Format::ToolCall(calls)) = call else {
            panic!("{call:?} forces no call")
        };
        assert_eq!(calls[0].name, "f");
    }
    let e = with_choice(json!({"type": "tool", "name": "g"})).unwrap_err();
    assert_eq!(e.status, StatusCode::BAD_REQUEST);
    assert!(e.message.contains("'g'"), "{}", e.message);
    let parsed: ToolChoice = serde_json::from_value(json!({"type": "tool", "name": "f"})).unwrap();
    assert_eq!(parsed, ToolChoice::Tool { name: "f".into() });
}

#[test]
fn thinking_sent_back_is_the_turns_reasoning_for_the_template_to_keep_or_drop() {
    let chat = conversation(json!({"messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "sig"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "hello"}]},
        {"role": "user", "content": "again"},
    ]}))
    .unwrap();
    let answer = ChatMessage {
        reasoning_content: Some("hmm".into()),
        ..ChatMessage::new("assistant", "hello")
    };
    assert_eq!(
        chat.messages,
        [
            ChatMessage::new("user", "hi"),
            answer,
            ChatMessage::new("user", "again"),
        ]
    );
    let e = conversation(json!({"messages": [
        {"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]}))
    .unwrap_err();
    assert!(
        e.message.contains("thinking blocks belong in assistant"),
        "{}",
        e.message
    );
}

#[test]
fn misplaced_and_unknown_blocks_are_refused() {
    let e = conversation(json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"},
        {"type": "tool_use", "id": "x", "name": "f", "input": {}}]}]}))
    .unwrap_err();
    assert_eq!(e.param.as_deref(), Some("messages[0].content[1]"));
    assert!(e.message.contains("assistant messages"), "{}", e.message);
    let e = serde_json::from_value::<Conversation>(json!({"messages": [
        {"role": "user", "content": [{"type": "document", "source": {}}]}]}))
    .unwrap_err();
    assert!(e.to_string().contains("unknown variant `document`"), "{e}");
    assert!(conversation(json!({"messages": []})).is_err());
}

/// A 1x1 PNG, base64.
const PIXEL: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC";

#[test]
fn image_blocks_become_image_parts_in_user_turns_only() {
    let image = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXEL}});
    let chat = conversation(json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"}, image.clone()]}]}))
    .unwrap();
    assert_eq!(chat.images.len(), 1);
    assert_eq!(
        (chat.images[0].image.width, chat.images[0].image.height),
        (1, 1)
    );
    let parts = chat.messages[0].parts.as_ref().unwrap();
    assert_eq!(
        parts,
        &[
            ContentPart::Text {
                text: "What is this?".into()
            },
            ContentPart::Image
        ]
    );
    let e =
        conversation(json!({"messages": [{"role": "assistant", "content": [image]}]})).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("messages[0].content[0]"));
    assert!(
        e.message.contains("image blocks belong in user messages"),
        "{}",
        e.message
    );
    let wrong_type = json!({"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": PIXEL}});
    let e =
        conversation(json!({"messages": [{"role": "user", "content": [wrong_type]}]})).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("messages[0].content[0].source"));
    assert!(
        e.message.contains("image/png but was sent as image/gif"),
        "{}",
        e.message
    );
}

#[test]
fn settings_take_max_tokens_and_stop_sequences() {
    let common: CommonFields =
        serde_json::from_value(json!({"model": "m", "temperature": 0.5, "top_k": 5})).unwrap();
    let fields: MessagesFields =
        serde_json::from_value(json!({"max_tokens": 7, "stop_sequences": ["END"]})).unwrap();
    let s = settings(&common, fields).unwrap();
    assert_eq!(
        (s.max_tokens, s.stop.as_slice(), s.sampling.top_k),
        (Some(7), ["END".to_string()].as_slice(), 5)
    );
    assert_eq!(s.sampling.temperature, 0.5);
    assert!(serde_json::from_value::<MessagesFields>(json!({})).is_err());
    let fields: MessagesFields = serde_json::from_value(json!({"max_tokens": 0})).unwrap();
    assert!(settings(&common, fields).is_err());
}

#[test]
fn thinking_turns_a_thinking_model_on_or_off_within_max_tokens() {
    let common: CommonFields = serde_json::from_value(json!({"model": "m"})).unwrap();
    let thinking = |body: Value| {
        let fields: MessagesFields = serde_json::from_value(body).unwrap();
        settings(&common, fields).map(|s| s.thinking)
    };
    assert_eq!(thinking(json!({"max_tokens": 9})).unwrap(), None);
    assert_eq!(
        thinking(json!({"max_tokens": 9, "thinking": {"type": "disabled"}})).unwrap(),
        Some(false)
    );
    let on = json!({"max_tokens": 9, "thinking": {"type": "enabled", "budget_tokens": 8}});
    assert_eq!(thinking(on).unwrap(), Some(true));
    let over = json!({"max_tokens": 9, "thinking": {"type": "enabled", "budget_tokens": 9}});
    let e = thinking(over).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("thinking.budget_tokens"));
}

fn frame() -> MessageFrame {
    MessageFrame {
        id: "msg_1".into(),
        model: "m".into(),
        seed: 3,
        input_tokens: 10,
        stops: vec!["A".into(), "B".into()],
    }
}

#[test]
fn stop_reasons() {
    let f = frame();
    let end = |reason| {
        let e = f.end(reason);
        (e.stop_reason, e.stop_sequence)
    };
    assert_eq!(end(StopReason::Stop), (MessageStop::EndTurn, None));
    assert_eq!(end(StopReason::Length), (MessageStop::MaxTokens, None));
    assert_eq!(
        end(StopReason::StopString(1)),
        (MessageStop::StopSequence, Some("B".into()))
    );
    assert_eq!(end(StopReason::ToolCalls), (MessageStop::ToolUse, None));
}

/// The `data` of each event, as JSON.
fn wire(events: Vec<SseMessage>) -> Vec<Value> {
    events
        .iter()
        .map(|event| serde_json::from_str(&event.data).unwrap())
        .collect()
}

#[test]
fn whole_replies_split_into_blocks() {
    assert_eq!(
        content_blocks(&Reply::default()),
        [OutBlock::Text { text: "".into() }]
    );
    let reply = Reply {
        pieces: vec![Delta::Text("Sure.".into()), Delta::ToolCall(call())],
        ..Reply::default()
    };
    let blocks = content_blocks(&reply);
    assert_eq!(
        blocks,
        [
            OutBlock::Text {
                text: "Sure.".into()
            },
            OutBlock::ToolUse {
                id: "toolu_1".into(),
                name: "f".into(),
                input: json!({"x": 1})
            }
        ]
    );
}

#[test]
fn neutral_events_become_anthropic_stream_events() {
    let mut stream = MessageStream {
        frame: frame(),
        blocks: BlockStream::default(),
    };
    let mut events = stream.start();
    events.extend(stream.token(0, token(1, vec![Delta::Text("Hi".into())])));
    events.extend(stream.token(0, token(2, vec![Delta::Text(String::new())])));
    events.extend(stream.token(0, token(3, vec![Delta::ToolCall(call())])));
    events.extend(stream.finish(0, finish(StopReason::ToolCalls, 4)));
    let events = wire(events);
    assert_eq!(
        events[0],
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
               "role": "assistant", "model": "m", "content": [], "stop_reason": null,
               "stop_sequence": null, "usage": {"input_tokens": 10, "output_tokens": 0},
               "seed": 3}})
    );
    assert_eq!(
        events[1],
        json!({"type": "content_block_start", "index": 0,
               "content_block": {"type": "text", "text": ""}})
    );
    assert_eq!(events[2], json!({"type": "ping"}));
    assert_eq!(
        events[3],
        json!({"type": "content_block_delta", "index": 0,
               "delta": {"type": "text_delta", "text": "Hi"}})
    );
    assert_eq!(events[4], json!({"type": "content_block_stop", "index": 0}));
    assert_eq!(
        events[5],
        json!({"type": "content_block_start", "index": 1, "content_block":
               {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}})
    );
    assert_eq!(
        events[6],
        json!({"type": "content_block_delta", "index": 1,
               "delta": {"type": "input_json_delta", "partial_json": "{\"x\":1}"}})
    );
    assert_eq!(events[7], json!({"type": "content_block_stop", "index": 1}));
    assert_eq!(
        events[8],
        json!({"type": "message_delta",
               "delta": {"stop_reason": "tool_use", "stop_sequence": null},
               "usage": {"output_tokens": 4}})
    );
    assert_eq!(events[9], json!({"type": "message_stop"}));
    assert_eq!(events.len(), 10);
}

#[test]
fn thinking_streams_as_a_signed_thinking_block_before_the_text() {
    let mut stream = MessageStream {
        frame: frame(),
        blocks: BlockStream::default(),
    };
    let mut events = stream.token(0, token(1, vec![Delta::Reasoning("Let me".into())]));
    events.extend(stream.token(0, token(2, vec![Delta::Reasoning(" see".into())])));
    events.extend(stream.token(0, token(3, vec![Delta::Text("4".into())])));
    events.extend(stream.finish(0, finish(StopReason::Stop, 3)));
    let events = wire(events);
    assert_eq!(
        events[0],
        json!({"type": "content_block_start", "index": 0,
               "content_block": {"type": "thinking", "thinking": "", "signature": ""}})
    );
    assert_eq!(
        events[2]["delta"],
        json!({"type": "thinking_delta", "thinking": "Let me"})
    );
    assert_eq!(
        events[4]["delta"],
        json!({"type": "signature_delta", "signature": signature("Let me see")})
    );
    assert_eq!(events[5], json!({"type": "content_block_stop", "index": 0}));
    assert_eq!(
        events[6]["content_block"],
        json!({"type": "text", "text": ""})
    );
    assert_eq!(
        events[7]["delta"],
        json!({"type": "text_delta", "text": "4"})
    );
    assert_eq!(events[8], json!({"type": "content_block_stop", "index": 1}));
    let whole = Reply {
        pieces: vec![
            Delta::Reasoning("Let me see".into()),
            Delta::Text("4".into()),
        ],
        ..Reply::default()
    };
    assert_eq!(
        content_blocks(&whole)[0],
        OutBlock::Thinking {
            thinking: "Let me see".into(),
            signature: signature("Let me see")
        }
    );
}

#[test]
fn an_empty_stream_still_has_a_text_block_and_a_failure_is_an_error_event() {
    let mut stream = MessageStream {
        frame: frame(),
        blocks: BlockStream::default(),
    };
    let events = wire(stream.finish(0, finish(StopReason::StopString(0), 4)));
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "content_block_start",
            "ping",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(
        events[3]["delta"],
        json!({"stop_reason": "stop_sequence", "stop_sequence": "A"})
    );
    assert_eq!(
        wire(stream.failed("boom".into())),
        [json!({"type": "error", "error": {"type": "api_error", "message": "boom"}})]
    );
}

#[test]
fn the_message_has_anthropics_shape() {
    let f = frame();
    let reply = Reply {
        pieces: vec![Delta::Text("ok".into())],
        ..Reply::default()
    };
    let usage = Usage {
        completion_tokens: 4,
        ..Usage::default()
    };
    let message = f.message(
        content_blocks(&reply),
        Some(f.end(StopReason::Length)),
        &usage,
    );
    assert_eq!(
        serde_json::to_value(&message).unwrap(),
        json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
               "content": [{"type": "text", "text": "ok"}], "stop_reason": "max_tokens",
               "stop_sequence": null, "usage": {"input_tokens": 10, "output_tokens": 4},
               "seed": 3})
    );
}

//! Unit tests of `app_api.rs`: which history a send, regenerate or edit answers, and what
//! a reply request carries.

use super::*;

fn message(id: i64, role: Role, content: &str) -> Message {
    Message {
        id,
        conversation_id: 1,
        role,
        content: content.to_string(),
        seed: None,
        sampling: None,
        status: Status::Complete,
        created_at: String::new(),
        reasoning: None,
        reasoning_ms: None,
        provenance: None,
    }
}

/// Q1, A1, Q2, an empty stopped reply, Q3, A3.
fn chat() -> Vec<Message> {
    vec![
        message(1, Role::User, "Q1"),
        message(2, Role::Assistant, "A1"),
        message(3, Role::User, "Q2"),
        message(4, Role::Assistant, ""),
        message(5, Role::User, "Q3"),
        message(6, Role::Assistant, "A3"),
    ]
}

fn body(json: &str) -> ReplyBody {
    serde_json::from_str(json).unwrap()
}

fn texts(history: &[ChatMessage]) -> Vec<String> {
    history
        .iter()
        .map(|m| format!("{}: {}", m.role, m.content))
        .collect()
}

#[test]
fn sending_answers_the_whole_chat_without_empty_replies() {
    let (history, turn) = turn(body(r#"{"content": "Q4"}"#), &chat()).unwrap();
    assert_eq!(
        texts(&history),
        [
            "user: Q1",
            "assistant: A1",
            "user: Q2",
            "user: Q3",
            "assistant: A3",
            "user: Q4"
        ]
    );
    assert!(matches!(turn, Turn::Send(c) if c == "Q4"));
}

#[test]
fn regenerating_answers_the_last_question_again() {
    let (history, turn) = turn(body(r#"{"regenerate": true}"#), &chat()).unwrap();
    assert_eq!(
        texts(&history),
        ["user: Q1", "assistant: A1", "user: Q2", "user: Q3"]
    );
    assert!(matches!(turn, Turn::Regenerate { after: 5 }));
    let error = super::turn(body(r#"{"regenerate": true}"#), &[])
        .err()
        .unwrap();
    assert_eq!(error.param.as_deref(), Some("regenerate"));
}

#[test]
fn editing_answers_the_chat_up_to_the_edited_question() {
    let (history, turn) = turn(
        body(r#"{"edit": {"message_id": 3, "content": "Q2'"}}"#),
        &chat(),
    )
    .unwrap();
    assert_eq!(texts(&history), ["user: Q1", "assistant: A1", "user: Q2'"]);
    assert!(matches!(turn, Turn::Edit { message_id: 3, .. }));
    for bad in [
        r#"{"edit": {"message_id": 2, "content": "x"}}"#,
        r#"{"edit": {"message_id": 99, "content": "x"}}"#,
    ] {
        let error = super::turn(body(bad), &chat()).err().unwrap();
        assert_eq!(error.param.as_deref(), Some("edit.message_id"));
    }
}

#[test]
fn a_request_does_exactly_one_thing_with_some_text() {
    for bad in [
        "{}",
        r#"{"content": "a", "regenerate": true}"#,
        r#"{"content": "a", "edit": {"message_id": 1, "content": "b"}}"#,
        r#"{"regenerate": false}"#,
    ] {
        let error = turn(body(bad), &chat()).err().unwrap();
        assert_eq!(error.status, StatusCode::BAD_REQUEST, "{bad}");
    }
    let empty = turn(body(r#"{"content": " \n"}"#), &chat()).err().unwrap();
    assert_eq!(empty.param.as_deref(), Some("content"));
    let empty_edit = turn(
        body(r#"{"edit": {"message_id": 1, "content": ""}}"#),
        &chat(),
    )
    .err()
    .unwrap();
    assert_eq!(empty_edit.param.as_deref(), Some("edit.content"));
}

#[test]
fn reply_settings_carry_the_seed_and_limits() {
    let settings = Settings {
        temperature: 0.8,
        top_p: 0.9,
        max_tokens: 24,
        ..Settings::for_model("m")
    };
    let sampling = generation_settings(&settings, 77);
    assert_eq!(sampling.seed, Some(77));
    assert_eq!(sampling.max_tokens, Some(24));
    assert_eq!(
        (sampling.sampling.temperature, sampling.sampling.top_p),
        (0.8, 0.9)
    );
    let hot = Settings {
        temperature: -1.0,
        ..settings
    };
    assert!(generation_settings(&hot, 1).validate("settings.").is_err());
}

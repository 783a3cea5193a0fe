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
        images: Vec::new(),
    }
}

/// The history, images and turn a request body makes of `messages` (no stored images).
fn answer(
    json: &str,
    messages: &[Message],
) -> Result<(Vec<ChatMessage>, Vec<InImage>, Turn), ApiError> {
    super::turn(body(json), messages, &HashMap::new())
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
    let (history, _, turn) = answer(r#"{"content": "Q4"}"#, &chat()).unwrap();
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
    assert!(matches!(turn, Turn::Send { content, images } if content == "Q4" && images.is_empty()));
}

#[test]
fn regenerating_answers_the_last_question_again() {
    let (history, _, turn) = answer(r#"{"regenerate": true}"#, &chat()).unwrap();
    assert_eq!(
        texts(&history),
        ["user: Q1", "assistant: A1", "user: Q2", "user: Q3"]
    );
    assert!(matches!(turn, Turn::Regenerate { after: 5 }));
    let error = answer(r#"{"regenerate": true}"#, &[]).err().unwrap();
    assert_eq!(error.param.as_deref(), Some("regenerate"));
}

#[test]
fn editing_answers_the_chat_up_to_the_edited_question() {
    let (history, _, turn) =
        answer(r#"{"edit": {"message_id": 3, "content": "Q2'"}}"#, &chat()).unwrap();
    assert_eq!(texts(&history), ["user: Q1", "assistant: A1", "user: Q2'"]);
    assert!(matches!(turn, Turn::Edit { message_id: 3, .. }));
    for bad in [
        r#"{"edit": {"message_id": 2, "content": "x"}}"#,
        r#"{"edit": {"message_id": 99, "content": "x"}}"#,
    ] {
        let error = answer(bad, &chat()).err().unwrap();
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
        let error = answer(bad, &chat()).err().unwrap();
        assert_eq!(error.status, StatusCode::BAD_REQUEST, "{bad}");
    }
    let empty = answer(r#"{"content": " \n"}"#, &chat()).err().unwrap();
    assert_eq!(empty.param.as_deref(), Some("content"));
    let empty_edit = answer(r#"{"edit": {"message_id": 1, "content": ""}}"#, &chat())
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

/// A 1x1 PNG as a data URL.
const PIXEL: &str = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC";

#[test]
fn images_go_before_their_text_and_are_kept_with_the_message() {
    let (history, images, turn) = answer(
        &format!(r#"{{"content": "What is it?", "images": ["{PIXEL}"]}}"#),
        &chat(),
    )
    .unwrap();
    assert_eq!(images.len(), 1);
    assert_eq!(
        history.last().unwrap().parts.as_deref(),
        Some(
            &[
                ContentPart::Image,
                ContentPart::Text {
                    text: "What is it?".into()
                }
            ][..]
        )
    );
    let Turn::Send { images: stored, .. } = turn else {
        panic!("a send")
    };
    assert_eq!(stored[0].media_type, "image/png");
    // A picture alone is a message; an edit keeps the edited message's pictures.
    assert!(turn_ok(&format!(
        r#"{{"content": "", "images": ["{PIXEL}"]}}"#
    )));
    let mut asked = chat();
    asked[2].images = vec![9];
    // A picture sent without text stays in the chat.
    asked[4].content = String::new();
    asked[4].images = vec![9];
    let stored = HashMap::from([(9, images::kept(PIXEL, "p").unwrap().1)]);
    let (history, images, _) = super::turn(
        body(r#"{"edit": {"message_id": 3, "content": "Q2'"}}"#),
        &asked,
        &stored,
    )
    .unwrap();
    assert_eq!(images.len(), 1);
    assert_eq!(
        history.last().unwrap().parts.as_ref().unwrap()[0],
        ContentPart::Image
    );
    let (history, images, _) =
        super::turn(body(r#"{"content": "And now?"}"#), &asked, &stored).unwrap();
    assert_eq!(images.len(), 2, "Q2's picture and the one sent alone");
    assert_eq!(history.iter().filter(|m| m.images() > 0).count(), 2);
    for (bad, param) in [
        (
            format!(r#"{{"images": ["{PIXEL}"], "regenerate": true}}"#),
            "images",
        ),
        (
            r#"{"content": "a", "images": ["https://example.test/a.png"]}"#.to_string(),
            "images[0]",
        ),
        (
            r#"{"content": "a", "images": ["data:image/png;base64,AAAA"]}"#.to_string(),
            "images[0]",
        ),
    ] {
        let error = answer(&bad, &chat()).err().unwrap();
        assert_eq!(error.param.as_deref(), Some(param), "{bad}");
    }
}

fn turn_ok(json: &str) -> bool {
    answer(json, &chat()).is_ok()
}

#[test]
fn a_starting_users_message_keeps_its_images_and_only_a_users_may() {
    let settings = Settings::for_model("m");
    let asked: StartingMessage = serde_json::from_value(serde_json::json!(
        {"role": "user", "content": "What is it?", "images": [PIXEL]}
    ))
    .unwrap();
    let stored = asked.stored(0, &settings).unwrap();
    assert_eq!(stored.images.len(), 1);
    assert_eq!(stored.images[0].media_type, "image/png");
    let answer: StartingMessage = serde_json::from_value(serde_json::json!(
        {"role": "assistant", "content": "A dot.", "images": [PIXEL]}
    ))
    .unwrap();
    let error = answer.stored(1, &settings).err().unwrap();
    assert_eq!(error.param.as_deref(), Some("messages[1].images"));
}

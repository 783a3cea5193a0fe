//! The store against real database files in a temporary folder.

use std::{
    path::PathBuf,
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use super::*;

/// A folder removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "seedbar-chats-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        TempDir(dir)
    }

    /// The database path, in a folder that does not exist yet.
    fn db(&self) -> PathBuf {
        self.0.join("data").join("seedbar.db")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn settings() -> Settings {
    Settings {
        seed: Some(42),
        system_prompt: "Be brief.".into(),
        ..Settings::for_model("SmolLM2-135M-Instruct")
    }
}

fn app_settings() -> AppSettings {
    AppSettings {
        port: 7400,
        api_key: "secret".into(),
        allowed_origins: vec!["http://localhost:5173".into()],
        show_in_dock: true,
        launch_at_login: false,
        quick_chat_shortcut: "Alt+Space".into(),
        prompt_cache_disk_gb: 3,
        unload_idle_minutes: 10,
        default_model: "Qwen3-4B".into(),
        show_menu_bar_icon: false,
        start_minimized: true,
        welcomed: true,
        fetch_image_urls: true,
        draft_models: [("Qwen3-4B".to_string(), "Qwen3-0.6B".to_string())].into(),
    }
}

/// Sending `text` alone.
fn send(text: &str) -> Turn {
    Turn::Send {
        content: text.into(),
        images: Vec::new(),
    }
}

/// A streaming reply row for a conversation with `settings()`.
fn reply_row() -> NewMessage {
    NewMessage::reply(
        42,
        settings().sampling(),
        serde_json::json!({"fingerprint": "fp_0123456789ab", "backend": "cpu"}),
    )
}

/// A conversation with a question and a finished reply.
fn conversation_with_reply(
    store: &ChatStore,
    title: &str,
    reply: &str,
) -> (Conversation, Vec<Message>) {
    let conversation = store.create(title, &settings()).unwrap();
    let (question, row) = store
        .begin_reply(conversation.id, &send("What is 2+2?"), &reply_row())
        .unwrap();
    assert_eq!(row.status, Status::Streaming);
    let answer = store
        .finish_message(row.id, &ReplyText::content(reply), Status::Complete)
        .unwrap();
    (
        store.get(conversation.id).unwrap(),
        vec![question.unwrap(), answer],
    )
}

/// `(role, content, status)` of each message of `conversation`, oldest first.
fn summary(store: &ChatStore, conversation: i64) -> Vec<(Role, String, Status)> {
    store
        .messages(conversation)
        .unwrap()
        .into_iter()
        .map(|m| (m.role, m.content, m.status))
        .collect()
}

#[test]
fn reopening_keeps_everything() {
    let dir = TempDir::new();
    let store = ChatStore::open(&dir.db()).unwrap();
    let (conversation, messages) = conversation_with_reply(&store, "Sums", "4");
    store.set_app_settings(&app_settings()).unwrap();
    drop(store);

    let store = ChatStore::open(&dir.db()).unwrap();
    assert_eq!(store.list("").unwrap(), vec![conversation.clone()]);
    assert_eq!(store.get(conversation.id).unwrap().settings, settings());
    let stored = store.messages(conversation.id).unwrap();
    assert_eq!(stored, messages);
    assert_eq!(stored[1].seed, Some(42));
    assert_eq!(stored[1].sampling, Some(settings().sampling()));
    assert_eq!(stored[1].content, "4");
    assert_eq!(store.app_settings().unwrap(), Some(app_settings()));
}

#[test]
fn a_conversation_starts_with_its_messages() {
    let dir = TempDir::new();
    let store = ChatStore::open(&dir.db()).unwrap();
    let answer = NewMessage {
        content: "Paris.".into(),
        status: Status::Complete,
        ..reply_row()
    };
    let conversation = store
        .create_with(
            "Capital",
            &settings(),
            &[NewMessage::user("Capital?"), answer],
        )
        .unwrap();
    let stored = store.messages(conversation.id).unwrap();
    let roles: Vec<_> = stored
        .iter()
        .map(|m| (m.role, m.content.as_str()))
        .collect();
    assert_eq!(
        roles,
        [(Role::User, "Capital?"), (Role::Assistant, "Paris.")]
    );
    assert_eq!(stored[1].status, Status::Complete);
    assert_eq!(stored[1].seed, Some(42));
}

#[test]
fn settings_saved_before_quick_chat_get_its_default_shortcut_and_disk_cache() {
    let old = r#"{"port":7337,"api_key":"","allowed_origins":[],"show_in_dock":false,"launch_at_login":true}"#;
    let settings: AppSettings = serde_json::from_str(old).unwrap();
    assert_eq!(settings.quick_chat_shortcut, DEFAULT_QUICK_CHAT_SHORTCUT);
    assert_eq!(settings.prompt_cache_disk_gb, DEFAULT_PROMPT_CACHE_DISK_GB);
    // The menu-bar icon shows, the window opens, the default model is chosen as before.
    assert!(settings.show_menu_bar_icon && !settings.start_minimized && !settings.welcomed);
    assert_eq!(settings.default_model, "");
    assert!(settings.launch_at_login);
}

#[test]
fn new_database_has_no_app_settings() {
    let dir = TempDir::new();
    let store = ChatStore::open(&dir.db()).unwrap();
    assert_eq!(store.app_settings().unwrap(), None);
    store.set_app_settings(&app_settings()).unwrap();
    let changed = AppSettings {
        launch_at_login: true,
        ..app_settings()
    };
    store.set_app_settings(&changed).unwrap();
    assert_eq!(store.app_settings().unwrap(), Some(changed));
}

/// Set in the child process `writes_survive_a_killed_process` starts.
const CHILD_DB: &str = "SEEDBAR_CHATS_TEST_CHILD_DB";

/// In the child: write, start a reply and checkpoint part of it, then die without
/// unwinding or closing anything.
#[test]
fn child_writes_then_aborts() {
    let Some(path) = std::env::var_os(CHILD_DB) else {
        return; // only runs as the child
    };
    let store = ChatStore::open(std::path::Path::new(&path)).unwrap();
    conversation_with_reply(&store, "Before the kill", "4");
    let conversation = store.list("").unwrap()[0].id;
    let (_, reply) = store
        .begin_reply(conversation, &send("And 3+3?"), &reply_row())
        .unwrap();
    store
        .checkpoint_reply(reply.id, &ReplyText::content("It is"))
        .unwrap();
    std::process::abort();
}

#[test]
fn writes_survive_a_killed_process() {
    let dir = TempDir::new();
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "tests::child_writes_then_aborts", "--nocapture"])
        .env(CHILD_DB, dir.db())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success(), "the child should have aborted");

    let store = ChatStore::open(&dir.db()).unwrap();
    let conversations = store.list("").unwrap();
    assert_eq!(conversations.len(), 1);
    assert_eq!(conversations[0].title, "Before the kill");
    assert_eq!(
        summary(&store, conversations[0].id),
        [
            (Role::User, "What is 2+2?".into(), Status::Complete),
            (Role::Assistant, "4".into(), Status::Complete),
            (Role::User, "And 3+3?".into(), Status::Complete),
            // The reply that was streaming when the process died, with its checkpoint.
            (Role::Assistant, "It is".into(), Status::Stopped),
        ]
    );
}

#[test]
fn an_old_database_is_migrated() {
    let dir = TempDir::new();
    std::fs::create_dir_all(dir.db().parent().unwrap()).unwrap();
    {
        let mut conn = Connection::open(dir.db()).unwrap();
        schema::migrate(&mut conn, 1).unwrap();
        conn.execute(
            "INSERT INTO conversations (title, created_at, updated_at, model, system_prompt,
                                        temperature, top_p, max_tokens, seed)
             VALUES ('From version 1', '2024-01-01T00:00:00.000Z', '2024-01-01T00:00:00.000Z',
                     'm', '', 0.5, 0.9, 100, NULL)",
            [],
        )
        .unwrap();
        assert!(conn.prepare("SELECT * FROM app_settings").is_err());
    }

    let store = ChatStore::open(&dir.db()).unwrap();
    let version: i64 = store
        .lock()
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap();
    assert_eq!(version as usize, schema::MIGRATIONS.len());
    let conversations = store.list("").unwrap();
    assert_eq!(conversations.len(), 1);
    assert_eq!(conversations[0].title, "From version 1");
    assert_eq!(conversations[0].settings.max_tokens, 100);
    store.set_app_settings(&app_settings()).unwrap();
    assert_eq!(store.app_settings().unwrap(), Some(app_settings()));
}

#[test]
fn a_newer_database_is_refused() {
    let dir = TempDir::new();
    drop(ChatStore::open(&dir.db()).unwrap());
    Connection::open(dir.db())
        .unwrap()
        .pragma_update(None, "user_version", 99)
        .unwrap();
    match ChatStore::open(&dir.db()) {
        Err(ChatError::TooNew { found: 99, known }) => assert_eq!(known, schema::MIGRATIONS.len()),
        other => panic!("expected TooNew, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn the_database_is_in_wal_mode_with_full_sync_and_foreign_keys() {
    let dir = TempDir::new();
    let store = ChatStore::open(&dir.db()).unwrap();
    let conn = store.lock();
    let pragma = |name: &str| -> String {
        conn.pragma_query_value(None, name, |row| row.get::<_, rusqlite::types::Value>(0))
            .map(|v| format!("{v:?}"))
            .unwrap()
    };
    assert_eq!(pragma("journal_mode"), "Text(\"wal\")");
    assert_eq!(pragma("synchronous"), "Integer(2)"); // FULL
    assert_eq!(pragma("foreign_keys"), "Integer(1)");
}

#[test]
fn deleting_a_conversation_deletes_its_messages() {
    let dir = TempDir::new();
    let store = ChatStore::open(&dir.db()).unwrap();
    let (gone, _) = conversation_with_reply(&store, "Gone", "4");
    let (kept, kept_messages) = conversation_with_reply(&store, "Kept", "four");
    store.delete(gone.id).unwrap();

    let count: i64 = store
        .lock()
        .query_row(
            "SELECT COUNT(*) FROM messages WHERE conversation_id = ?1",
            [gone.id],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(count, 0);
    assert!(matches!(store.get(gone.id), Err(ChatError::NoConversation(id)) if id == gone.id));
    assert!(matches!(
        store.messages(gone.id),
        Err(ChatError::NoConversation(_))
    ));
    assert!(matches!(
        store.delete(gone.id),
        Err(ChatError::NoConversation(_))
    ));
    assert!(matches!(
        store.add_message(gone.id, &NewMessage::user("hi")),
        Err(ChatError::NoConversation(_))
    ));
    assert_eq!(store.messages(kept.id).unwrap(), kept_messages);
}

#[test]
fn search_matches_titles_and_message_text() {
    let dir = TempDir::new();
    let store = ChatStore::open(&dir.db()).unwrap();
    let (paris, _) = conversation_with_reply(&store, "Trip to Paris", "Pack light.");
    let (cooking, _) =
        conversation_with_reply(&store, "Dinner", "Boil the PASTA for 100% of the time");
    let (other, _) = conversation_with_reply(&store, "Other", "1000 things");
    let ids = |q: &str| -> Vec<i64> { store.list(q).unwrap().iter().map(|c| c.id).collect() };

    assert_eq!(ids("paris"), [paris.id]); // title, any case
    assert_eq!(ids("pasta"), [cooking.id]); // message text, any case
    assert_eq!(ids("2+2"), [other.id, cooking.id, paris.id]); // every question
    assert_eq!(ids("100%"), [cooking.id]); // `%` is literal
    assert_eq!(ids("_"), Vec::<i64>::new()); // so is `_`
    assert_eq!(ids("nowhere"), Vec::<i64>::new());
    assert_eq!(ids("").len(), 3);
}

#[test]
fn the_most_recently_updated_conversation_comes_first() {
    let dir = TempDir::new();
    let store = ChatStore::open(&dir.db()).unwrap();
    let older = store.create("Older", &settings()).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    let newer = store.create("Newer", &settings()).unwrap();
    let order =
        |store: &ChatStore| -> Vec<i64> { store.list("").unwrap().iter().map(|c| c.id).collect() };
    assert_eq!(order(&store), [newer.id, older.id]);
    std::thread::sleep(Duration::from_millis(5));
    store
        .add_message(older.id, &NewMessage::user("hi"))
        .unwrap();
    assert_eq!(order(&store), [older.id, newer.id]);
    std::thread::sleep(Duration::from_millis(5));
    let renamed = store.update(newer.id, "Renamed", &settings()).unwrap();
    assert_eq!(renamed.title, "Renamed");
    assert_eq!(order(&store), [newer.id, older.id]);
}

#[test]
fn sending_stores_the_question_and_a_streaming_reply() {
    let dir = TempDir::new();
    let store = ChatStore::open(&dir.db()).unwrap();
    let conversation = store.create("Send", &settings()).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    let (question, reply) = store
        .begin_reply(conversation.id, &send("hi"), &reply_row())
        .unwrap();
    let question = question.unwrap();
    assert_eq!(
        (question.role, question.content.as_str(), question.status),
        (Role::User, "hi", Status::Complete)
    );
    assert_eq!(
        (reply.role, reply.seed, reply.status),
        (Role::Assistant, Some(42), Status::Streaming)
    );
    assert_eq!(reply.sampling, Some(settings().sampling()));
    assert_eq!(
        store.messages(conversation.id).unwrap(),
        vec![question, reply]
    );
    assert!(store.get(conversation.id).unwrap().updated_at > conversation.updated_at);
    assert!(matches!(
        store.begin_reply(999, &send("hi"), &reply_row()),
        Err(ChatError::NoConversation(999))
    ));
    let finished_row = NewMessage {
        status: Status::Complete,
        ..reply_row()
    };
    assert!(matches!(
        store.begin_reply(conversation.id, &send("hi"), &finished_row),
        Err(ChatError::Invalid(_))
    ));
}

#[test]
fn editing_a_user_message_drops_what_follows() {
    let dir = TempDir::new();
    let store = ChatStore::open(&dir.db()).unwrap();
    let (conversation, messages) = conversation_with_reply(&store, "Edit", "4");
    let (question, answer) = (&messages[0], &messages[1]);
    store
        .add_message(conversation.id, &NewMessage::user("And 3+3?"))
        .unwrap();
    let before = store.messages(conversation.id).unwrap();
    let edit = |message_id: i64| Turn::Edit {
        message_id,
        content: "What is 5+5?".into(),
    };

    // Refused turns change nothing: no edit, nothing dropped, no reply row.
    assert!(matches!(
        store.begin_reply(conversation.id, &edit(answer.id), &reply_row()),
        Err(ChatError::NotEditable { message, .. }) if message == answer.id
    ));
    let other = store.create("Other", &settings()).unwrap();
    assert!(matches!(
        store.begin_reply(other.id, &edit(question.id), &reply_row()),
        Err(ChatError::NotEditable { .. })
    ));
    assert_eq!(store.messages(conversation.id).unwrap(), before);
    assert!(store.messages(other.id).unwrap().is_empty());

    let (edited, reply) = store
        .begin_reply(conversation.id, &edit(question.id), &reply_row())
        .unwrap();
    let edited = edited.unwrap();
    assert_eq!(edited.id, question.id);
    assert_eq!(edited.content, "What is 5+5?");
    assert!(reply.id > before.last().unwrap().id, "ids are never reused");
    assert_eq!(
        store.messages(conversation.id).unwrap(),
        vec![edited, reply]
    );
}

#[test]
fn regenerating_keeps_messages_up_to_the_one_named() {
    let dir = TempDir::new();
    let store = ChatStore::open(&dir.db()).unwrap();
    let (conversation, messages) = conversation_with_reply(&store, "Redo", "4");
    let redo = Turn::Regenerate {
        after: messages[0].id,
    };
    let (user, redone) = store
        .begin_reply(conversation.id, &redo, &reply_row())
        .unwrap();
    assert_eq!(user, None);
    assert!(redone.id > messages[1].id, "ids are never reused");
    assert_eq!(
        store.messages(conversation.id).unwrap(),
        vec![messages[0].clone(), redone]
    );

    let other = store.create("Other", &settings()).unwrap();
    assert!(matches!(
        store.begin_reply(other.id, &redo, &reply_row()),
        Err(ChatError::NoMessage(id)) if id == messages[0].id
    ));
    assert!(store.messages(other.id).unwrap().is_empty());
}

#[test]
fn a_conversation_streams_one_reply_at_a_time() {
    let dir = TempDir::new();
    let store = ChatStore::open(&dir.db()).unwrap();
    let conversation = store.create("Busy", &settings()).unwrap();
    let (question, reply) = store
        .begin_reply(conversation.id, &send("hi"), &reply_row())
        .unwrap();
    let question = question.unwrap();

    let turns = [
        send("again"),
        Turn::Edit {
            message_id: question.id,
            content: "hello".into(),
        },
        Turn::Regenerate { after: question.id },
    ];
    for turn in &turns {
        let refused = store.begin_reply(conversation.id, turn, &reply_row());
        assert!(
            matches!(refused, Err(ChatError::Busy(id)) if id == conversation.id),
            "{turn:?}"
        );
    }
    assert_eq!(
        ChatError::Busy(conversation.id).to_string(),
        format!(
            "conversation {} is already writing a reply; wait for it or stop it",
            conversation.id
        )
    );
    assert_eq!(
        store.messages(conversation.id).unwrap(),
        vec![question.clone(), reply.clone()]
    );
    // Other conversations are not held up.
    let other = store.create("Other", &settings()).unwrap();
    store
        .begin_reply(other.id, &send("hi"), &reply_row())
        .unwrap();

    store
        .finish_message(reply.id, &ReplyText::content("Hello!"), Status::Stopped)
        .unwrap();
    store
        .begin_reply(conversation.id, &turns[2], &reply_row())
        .unwrap();
}

#[test]
fn checkpoints_write_a_streaming_reply_only() {
    let dir = TempDir::new();
    let store = ChatStore::open(&dir.db()).unwrap();
    let conversation = store.create("Checkpoints", &settings()).unwrap();
    let (_, reply) = store
        .begin_reply(conversation.id, &send("hi"), &reply_row())
        .unwrap();
    store
        .checkpoint_reply(reply.id, &ReplyText::content("Hel"))
        .unwrap();
    store
        .checkpoint_reply(reply.id, &ReplyText::content("Hello"))
        .unwrap();
    let streaming = &store.messages(conversation.id).unwrap()[1];
    assert_eq!(
        (streaming.content.as_str(), streaming.status),
        ("Hello", Status::Streaming)
    );

    let finished = store
        .finish_message(reply.id, &ReplyText::content("Hello!"), Status::Complete)
        .unwrap();
    store
        .checkpoint_reply(reply.id, &ReplyText::content("late"))
        .unwrap();
    store
        .checkpoint_reply(12345, &ReplyText::content("nowhere"))
        .unwrap();
    assert_eq!(store.messages(conversation.id).unwrap()[1], finished);
}

#[test]
fn a_replys_thinking_is_checkpointed_and_stored_beside_its_content() {
    let dir = TempDir::new();
    let store = ChatStore::open(&dir.db()).unwrap();
    let conversation = store.create("Thinking", &settings()).unwrap();
    let (_, reply) = store
        .begin_reply(conversation.id, &send("2+2?"), &reply_row())
        .unwrap();
    assert_eq!(
        (reply.reasoning.as_deref(), reply.reasoning_ms),
        (None, None)
    );
    let partial = ReplyText {
        content: String::new(),
        reasoning: "Two and two".into(),
        reasoning_ms: None,
    };
    store.checkpoint_reply(reply.id, &partial).unwrap();
    drop(store);
    // A process killed while the model thought keeps the thinking.
    let store = ChatStore::open(&dir.db()).unwrap();
    let stopped = &store.messages(conversation.id).unwrap()[1];
    assert_eq!(stopped.reasoning.as_deref(), Some("Two and two"));
    let whole = ReplyText {
        content: "4".into(),
        reasoning: "Two and two make four.".into(),
        reasoning_ms: Some(1250),
    };
    let finished = store
        .finish_message(reply.id, &whole, Status::Complete)
        .unwrap();
    assert_eq!(
        (
            finished.content.as_str(),
            finished.reasoning.as_deref(),
            finished.reasoning_ms
        ),
        ("4", Some("Two and two make four."), Some(1250))
    );
    let markdown = export::markdown(&store.get(conversation.id).unwrap(), &[finished], &[]);
    assert!(
        markdown.contains(
            "<details><summary>Thinking</summary>\n\nTwo and two make four.\n\n</details>\n\n4"
        ),
        "{markdown}"
    );
}

#[test]
fn finishing_records_the_status() {
    let dir = TempDir::new();
    let store = ChatStore::open(&dir.db()).unwrap();
    let conversation = store.create("Stops", &settings()).unwrap();
    let row = store.add_message(conversation.id, &reply_row()).unwrap();
    let stopped = store
        .finish_message(row.id, &ReplyText::content("Once upon"), Status::Stopped)
        .unwrap();
    assert_eq!(
        (stopped.content.as_str(), stopped.status),
        ("Once upon", Status::Stopped)
    );
    assert!(matches!(
        store.finish_message(12345, &ReplyText::content("x"), Status::Error),
        Err(ChatError::NoMessage(12345))
    ));
}

#[test]
fn seeds_too_large_for_sqlite_are_refused() {
    let dir = TempDir::new();
    let store = ChatStore::open(&dir.db()).unwrap();
    let huge = Settings {
        seed: Some(u64::MAX),
        ..settings()
    };
    assert!(matches!(
        store.create("Huge", &huge),
        Err(ChatError::Invalid(_))
    ));
    assert!(store.list("").unwrap().is_empty());
}

#[test]
fn a_settings_patch_tells_null_from_absent() {
    let base = settings();
    let keep: SettingsPatch = serde_json::from_str(r#"{"temperature": 0.2}"#).unwrap();
    let unpin: SettingsPatch = serde_json::from_str(r#"{"seed": null}"#).unwrap();
    let pin: SettingsPatch = serde_json::from_str(r#"{"seed": 7, "model": "other"}"#).unwrap();
    assert_eq!(
        base.patched(&keep),
        Settings {
            temperature: 0.2,
            ..base.clone()
        }
    );
    assert_eq!(base.patched(&unpin).seed, None);
    assert_eq!(
        (base.patched(&pin).seed, base.patched(&pin).model.as_str()),
        (Some(7), "other")
    );
    assert!(serde_json::from_str::<SettingsPatch>(r#"{"temprature": 1}"#).is_err());
}

#[test]
fn a_users_images_are_kept_in_order_with_the_message_and_go_with_it() {
    let dir = TempDir::new();
    let store = ChatStore::open(&dir.db()).unwrap();
    let conversation = store.create("Pictures", &settings()).unwrap();
    let images = vec![
        Image {
            media_type: "image/png".into(),
            data: vec![1, 2, 3],
        },
        Image {
            media_type: "image/jpeg".into(),
            data: vec![4, 5],
        },
    ];
    let (question, _) = store
        .begin_reply(
            conversation.id,
            &Turn::Send {
                content: "Which is brighter?".into(),
                images: images.clone(),
            },
            &reply_row(),
        )
        .unwrap();
    let ids = question.unwrap().images;
    assert_eq!(ids.len(), 2);
    assert_eq!(
        ids.iter()
            .map(|&id| store.image(id).unwrap())
            .collect::<Vec<_>>(),
        images
    );
    drop(store);
    // Read again from the file: kept with the message, in order.
    let store = ChatStore::open(&dir.db()).unwrap();
    let messages = store.messages(conversation.id).unwrap();
    assert_eq!(messages[0].images, ids);
    assert!(messages[1].images.is_empty());
    store.delete(conversation.id).unwrap();
    assert!(matches!(store.image(ids[0]), Err(ChatError::NoImage(_))));
}

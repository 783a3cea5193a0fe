//! Seedbar's conversations in SQLite: conversations with their settings, their messages
//! (each reply with the seed and sampling it used, and how it ended), and the app's
//! settings. One database file in the data directory, in WAL mode with `synchronous=FULL`
//! so that a write that returned survives a killed process and a power cut; schema
//! migrations are numbered through `PRAGMA user_version` (see `schema`). `export` turns a
//! conversation into Markdown or versioned JSON.

pub mod export;
mod schema;
mod types;

use std::{
    path::{Path, PathBuf},
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use rusqlite::{
    params,
    types::{FromSql, FromSqlError, FromSqlResult, ToSqlOutput, ValueRef},
    Connection, OptionalExtension, Row, ToSql, TransactionBehavior,
};

pub use types::{
    AppSettings, Conversation, Image, Message, NewMessage, ReplyText, Role, Sampling, Settings,
    SettingsPatch, Status, Turn, DEFAULT_PROMPT_CACHE_DISK_GB, DEFAULT_QUICK_CHAT_SHORTCUT,
};

/// What the store refuses or fails at.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("conversation {0} does not exist")]
    NoConversation(i64),
    /// The message does not exist (or, where a conversation is named, is not one of its).
    #[error("message {0} does not exist")]
    NoMessage(i64),
    #[error("image {0} does not exist")]
    NoImage(i64),
    #[error("message {message} is not a user message of conversation {conversation}")]
    NotEditable { conversation: i64, message: i64 },
    /// A reply of the conversation is still streaming, so another cannot start.
    #[error("conversation {0} is already writing a reply; wait for it or stop it")]
    Busy(i64),
    #[error("{0}")]
    Invalid(String),
    #[error(
        "the conversations database has schema version {found}, newer than this Seedbar \
         knows ({known}); update Seedbar"
    )]
    TooNew { found: usize, known: usize },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("conversations database: {0}")]
    Sqlite(#[from] rusqlite::Error),
}

/// The store's results.
pub type Result<T> = std::result::Result<T, ChatError>;

/// The database's file name in the data directory.
pub const DATABASE_FILE: &str = "seedbar.db";

/// How long a write waits for another process's write to finish.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Now, as RFC 3339 UTC with milliseconds (SQL).
const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

const CONVERSATION_COLUMNS: &str =
    "id, title, created_at, updated_at, model, system_prompt, temperature, top_p, max_tokens, seed";

const MESSAGE_COLUMNS: &str = "id, conversation_id, role, content, seed, model, temperature, \
     top_p, max_tokens, system_prompt, status, created_at, reasoning, reasoning_ms, provenance, \
     (SELECT group_concat(i.id) FROM message_images i WHERE i.message_id = messages.id)";

/// The conversations database. Thread-safe: one connection behind a mutex.
pub struct ChatStore {
    conn: Mutex<Connection>,
}

impl ChatStore {
    /// Open (creating it and its folder if needed) and migrate the database at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| ChatError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        let mut conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        let mode: String =
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(ChatError::Invalid(format!(
                "{}: cannot use write-ahead logging (journal mode stays {mode})",
                path.display()
            )));
        }
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        schema::migrate(&mut conn, schema::MIGRATIONS.len())?;
        // Replies still streaming belong to a process that died: they stopped there.
        conn.execute(
            "UPDATE messages SET status = 'stopped' WHERE status = 'streaming'",
            [],
        )?;
        Ok(ChatStore {
            conn: Mutex::new(conn),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Conversations, most recently updated first; a non-empty `query` keeps those whose
    /// title or some message contains it (case-insensitive for ASCII).
    pub fn list(&self, query: &str) -> Result<Vec<Conversation>> {
        let pattern = format!("%{}%", escape_like(query));
        let conn = self.lock();
        let mut statement = conn.prepare(&format!(
            "SELECT {CONVERSATION_COLUMNS} FROM conversations c
             WHERE ?1 = '' OR c.title LIKE ?2 ESCAPE '\\' OR EXISTS (
                 SELECT 1 FROM messages m
                 WHERE m.conversation_id = c.id AND m.content LIKE ?2 ESCAPE '\\')
             ORDER BY c.updated_at DESC, c.id DESC"
        ))?;
        let rows = statement.query_map(params![query, pattern], conversation)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Start an empty conversation.
    pub fn create(&self, title: &str, settings: &Settings) -> Result<Conversation> {
        self.create_with(title, settings, &[])
    }

    /// Start a conversation holding `messages` already (a quick-chat question and its
    /// answer), all in one transaction.
    pub fn create_with(
        &self,
        title: &str,
        settings: &Settings,
        messages: &[NewMessage],
    ) -> Result<Conversation> {
        let mut conn = self.lock();
        let tx = conn.transaction()?;
        tx.execute(
            &format!(
                "INSERT INTO conversations (title, created_at, updated_at, model, system_prompt,
                                            temperature, top_p, max_tokens, seed)
                 VALUES (?1, {NOW}, {NOW}, ?2, ?3, ?4, ?5, ?6, ?7)"
            ),
            params![
                title,
                settings.model,
                settings.system_prompt,
                settings.temperature,
                settings.top_p,
                settings.max_tokens,
                seed_value(settings.seed)?,
            ],
        )?;
        let id = tx.last_insert_rowid();
        for message in messages {
            insert_message(&tx, id, message)?;
        }
        let conversation = get_conversation(&tx, id)?;
        tx.commit()?;
        Ok(conversation)
    }

    /// One conversation, without its messages.
    pub fn get(&self, id: i64) -> Result<Conversation> {
        get_conversation(&self.lock(), id)
    }

    /// A conversation's messages, oldest first.
    pub fn messages(&self, conversation: i64) -> Result<Vec<Message>> {
        let conn = self.lock();
        get_conversation(&conn, conversation)?;
        let mut statement = conn.prepare(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ?1 ORDER BY id"
        ))?;
        let rows = statement.query_map([conversation], message)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Rename and set the settings of a conversation.
    pub fn update(&self, id: i64, title: &str, settings: &Settings) -> Result<Conversation> {
        let conn = self.lock();
        let changed = conn.execute(
            &format!(
                "UPDATE conversations SET title = ?2, model = ?3, system_prompt = ?4,
                     temperature = ?5, top_p = ?6, max_tokens = ?7, seed = ?8, updated_at = {NOW}
                 WHERE id = ?1"
            ),
            params![
                id,
                title,
                settings.model,
                settings.system_prompt,
                settings.temperature,
                settings.top_p,
                settings.max_tokens,
                seed_value(settings.seed)?,
            ],
        )?;
        if changed == 0 {
            return Err(ChatError::NoConversation(id));
        }
        get_conversation(&conn, id)
    }

    /// Delete a conversation and its messages.
    pub fn delete(&self, id: i64) -> Result<()> {
        let changed = self
            .lock()
            .execute("DELETE FROM conversations WHERE id = ?1", [id])?;
        if changed == 0 {
            return Err(ChatError::NoConversation(id));
        }
        Ok(())
    }

    /// Append a message; durable once this returns.
    pub fn add_message(&self, conversation: i64, new: &NewMessage) -> Result<Message> {
        let mut conn = self.lock();
        let tx = conn.transaction()?;
        get_conversation(&tx, conversation)?;
        let message = insert_message(&tx, conversation, new)?;
        touch(&tx, conversation)?;
        tx.commit()?;
        Ok(message)
    }

    /// Store what a reply request changes, in one transaction: apply `turn` to
    /// `conversation` and add the `reply` row (status `Streaming`) the answer streams into.
    /// Refused with [`ChatError::Busy`], changing nothing, while a reply of the conversation
    /// is still streaming: a conversation writes one reply at a time. Returns the user
    /// message the turn stored or edited (none when regenerating) and the reply row;
    /// durable once this returns.
    pub fn begin_reply(
        &self,
        conversation: i64,
        turn: &Turn,
        reply: &NewMessage,
    ) -> Result<(Option<Message>, Message)> {
        if reply.status != Status::Streaming {
            return Err(ChatError::Invalid(format!(
                "a reply row starts out streaming, not {}",
                reply.status.as_str()
            )));
        }
        let mut conn = self.lock();
        // Immediate: take the write lock before the check, so that another process's reply
        // cannot start between the check and the insert.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        get_conversation(&tx, conversation)?;
        let streaming: bool = tx.query_row(
            "SELECT EXISTS (SELECT 1 FROM messages WHERE conversation_id = ?1 AND status = ?2)",
            params![conversation, Status::Streaming],
            |row| row.get(0),
        )?;
        if streaming {
            return Err(ChatError::Busy(conversation));
        }
        let user = match turn {
            Turn::Send { content, images } => Some(insert_message(
                &tx,
                conversation,
                &NewMessage {
                    images: images.clone(),
                    ..NewMessage::user(content.as_str())
                },
            )?),
            Turn::Edit {
                message_id,
                content,
            } => Some(edit_user_message(&tx, conversation, *message_id, content)?),
            Turn::Regenerate { after } => {
                check_message_of(&tx, conversation, *after)?;
                delete_after(&tx, conversation, *after)?;
                None
            }
        };
        let reply = insert_message(&tx, conversation, reply)?;
        touch(&tx, conversation)?;
        tx.commit()?;
        Ok((user, reply))
    }

    /// An image a user message holds.
    pub fn image(&self, id: i64) -> Result<Image> {
        self.lock()
            .query_row(
                "SELECT media_type, data FROM message_images WHERE id = ?1",
                [id],
                |row| {
                    Ok(Image {
                        media_type: row.get(0)?,
                        data: row.get(1)?,
                    })
                },
            )
            .optional()?
            .ok_or(ChatError::NoImage(id))
    }

    /// Save the text a reply has so far while it streams, so that a process killed
    /// mid-reply leaves it behind (the next [`open`](Self::open) marks the row stopped).
    /// Does nothing to a reply that is no longer streaming.
    pub fn checkpoint_reply(&self, id: i64, text: &ReplyText) -> Result<()> {
        let (reasoning, reasoning_ms) = reasoning_values(text);
        self.lock().execute(
            "UPDATE messages SET content = ?2, reasoning = ?3, reasoning_ms = ?4
             WHERE id = ?1 AND status = ?5",
            params![id, text.content, reasoning, reasoning_ms, Status::Streaming],
        )?;
        Ok(())
    }

    /// Set a reply's final text and status; durable once this returns.
    pub fn finish_message(&self, id: i64, text: &ReplyText, status: Status) -> Result<Message> {
        let (reasoning, reasoning_ms) = reasoning_values(text);
        let mut conn = self.lock();
        let tx = conn.transaction()?;
        tx.execute(
            "UPDATE messages SET content = ?2, status = ?3, reasoning = ?4, reasoning_ms = ?5
             WHERE id = ?1",
            params![id, text.content, status, reasoning, reasoning_ms],
        )?;
        let message = get_message(&tx, id)?;
        touch(&tx, message.conversation_id)?;
        tx.commit()?;
        Ok(message)
    }

    /// The saved app settings; `None` until some are saved.
    pub fn app_settings(&self) -> Result<Option<AppSettings>> {
        let json: Option<String> = self
            .lock()
            .query_row("SELECT value FROM app_settings WHERE id = 1", [], |row| {
                row.get(0)
            })
            .optional()?;
        json.map(|json| {
            serde_json::from_str(&json)
                .map_err(|e| ChatError::Invalid(format!("the saved app settings are invalid: {e}")))
        })
        .transpose()
    }

    /// Save the app settings, replacing any saved before.
    pub fn set_app_settings(&self, settings: &AppSettings) -> Result<()> {
        let json = serde_json::to_string(settings)
            .map_err(|e| ChatError::Invalid(format!("cannot save the app settings: {e}")))?;
        self.lock().execute(
            "INSERT INTO app_settings (id, value) VALUES (1, ?1)
             ON CONFLICT (id) DO UPDATE SET value = excluded.value",
            [json],
        )?;
        Ok(())
    }
}

fn get_conversation(conn: &Connection, id: i64) -> Result<Conversation> {
    conn.query_row(
        &format!("SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE id = ?1"),
        [id],
        conversation,
    )
    .optional()?
    .ok_or(ChatError::NoConversation(id))
}

fn get_message(conn: &Connection, id: i64) -> Result<Message> {
    conn.query_row(
        &format!("SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = ?1"),
        [id],
        message,
    )
    .optional()?
    .ok_or(ChatError::NoMessage(id))
}

/// Refuse `id` unless it names a message of `conversation`.
fn check_message_of(conn: &Connection, conversation: i64, id: i64) -> Result<()> {
    let found: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM messages WHERE id = ?1 AND conversation_id = ?2)",
        [id, conversation],
        |row| row.get(0),
    )?;
    if !found {
        return Err(ChatError::NoMessage(id));
    }
    Ok(())
}

/// Add `new` to `conversation` (which the caller has checked exists).
fn insert_message(conn: &Connection, conversation: i64, new: &NewMessage) -> Result<Message> {
    let sampling = new.sampling.as_ref();
    conn.execute(
        &format!(
            "INSERT INTO messages (conversation_id, role, content, status, seed, model,
                 temperature, top_p, max_tokens, system_prompt, provenance, reasoning,
                 reasoning_ms, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, {NOW})"
        ),
        params![
            conversation,
            new.role,
            new.content,
            new.status,
            seed_value(new.seed)?,
            sampling.map(|s| &s.model),
            sampling.map(|s| s.temperature),
            sampling.map(|s| s.top_p),
            sampling.map(|s| s.max_tokens),
            sampling.map(|s| &s.system_prompt),
            new.provenance.as_ref().map(|p| p.to_string()),
            new.reasoning,
            new.reasoning_ms.map(|ms| ms.min(i64::MAX as u64) as i64),
        ],
    )?;
    let id = conn.last_insert_rowid();
    for (position, image) in new.images.iter().enumerate() {
        conn.execute(
            "INSERT INTO message_images (message_id, position, media_type, data)
             VALUES (?1, ?2, ?3, ?4)",
            params![id, position as i64, image.media_type, image.data],
        )?;
    }
    get_message(conn, id)
}

/// Replace the text of user message `id` of `conversation` and drop every message after it.
fn edit_user_message(
    conn: &Connection,
    conversation: i64,
    id: i64,
    content: &str,
) -> Result<Message> {
    let changed = conn.execute(
        "UPDATE messages SET content = ?3
         WHERE id = ?2 AND conversation_id = ?1 AND role = ?4",
        params![conversation, id, content, Role::User],
    )?;
    if changed == 0 {
        return Err(ChatError::NotEditable {
            conversation,
            message: id,
        });
    }
    delete_after(conn, conversation, id)?;
    get_message(conn, id)
}

/// Drop every message of `conversation` after `message_id`.
fn delete_after(conn: &Connection, conversation: i64, message_id: i64) -> Result<()> {
    conn.execute(
        "DELETE FROM messages WHERE conversation_id = ?1 AND id > ?2",
        [conversation, message_id],
    )?;
    Ok(())
}

/// Mark a conversation as just updated.
fn touch(conn: &Connection, conversation: i64) -> Result<()> {
    conn.execute(
        &format!("UPDATE conversations SET updated_at = {NOW} WHERE id = ?1"),
        [conversation],
    )?;
    Ok(())
}

fn conversation(row: &Row) -> rusqlite::Result<Conversation> {
    Ok(Conversation {
        id: row.get(0)?,
        title: row.get(1)?,
        created_at: row.get(2)?,
        updated_at: row.get(3)?,
        settings: Settings {
            model: row.get(4)?,
            system_prompt: row.get(5)?,
            temperature: row.get(6)?,
            top_p: row.get(7)?,
            max_tokens: row.get(8)?,
            seed: row.get::<_, Option<i64>>(9)?.map(|s| s as u64),
        },
    })
}

fn message(row: &Row) -> rusqlite::Result<Message> {
    let sampling = match row.get::<_, Option<String>>(5)? {
        Some(model) => Some(Sampling {
            model,
            temperature: row.get(6)?,
            top_p: row.get(7)?,
            max_tokens: row.get(8)?,
            system_prompt: row.get(9)?,
        }),
        None => None,
    };
    Ok(Message {
        id: row.get(0)?,
        conversation_id: row.get(1)?,
        role: row.get(2)?,
        content: row.get(3)?,
        seed: row.get::<_, Option<i64>>(4)?.map(|s| s as u64),
        sampling,
        status: row.get(10)?,
        created_at: row.get(11)?,
        reasoning: row.get(12)?,
        reasoning_ms: row.get::<_, Option<i64>>(13)?.map(|ms| ms as u64),
        // Written by this store from a JSON value: a row that does not parse has none.
        provenance: row
            .get::<_, Option<String>>(14)?
            .and_then(|text| serde_json::from_str(&text).ok()),
        // Ids grow with the position they were written in.
        images: {
            let ids = row.get::<_, Option<String>>(15)?.unwrap_or_default();
            let mut ids: Vec<i64> = ids.split(',').filter_map(|id| id.parse().ok()).collect();
            ids.sort_unstable();
            ids
        },
    })
}

/// A reply's thinking columns: none when it did not think.
fn reasoning_values(text: &ReplyText) -> (Option<&str>, Option<i64>) {
    let reasoning = Some(text.reasoning.as_str()).filter(|r| !r.is_empty());
    let ms = text.reasoning_ms.map(|ms| ms.min(i64::MAX as u64) as i64);
    (reasoning, ms)
}

/// SQLite integers are signed: seeds must fit.
fn seed_value(seed: Option<u64>) -> Result<Option<i64>> {
    seed.map(|s| i64::try_from(s).map_err(|_| ChatError::Invalid(format!("seed {s} is too large"))))
        .transpose()
}

/// `text` with LIKE's wildcards (and the escape character) escaped by `\`.
fn escape_like(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// Role and status are stored as their API names.
macro_rules! sql_text_enum {
    ($type:ty, [$($variant:path),+]) => {
        impl ToSql for $type {
            fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
                Ok(ToSqlOutput::from(self.as_str()))
            }
        }

        impl FromSql for $type {
            fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
                let text = value.as_str()?;
                [$($variant),+]
                    .into_iter()
                    .find(|v| v.as_str() == text)
                    .ok_or_else(|| FromSqlError::Other(format!("unknown value `{text}`").into()))
            }
        }
    };
}

sql_text_enum!(Role, [Role::User, Role::Assistant]);
sql_text_enum!(
    Status,
    [
        Status::Streaming,
        Status::Complete,
        Status::Stopped,
        Status::Error
    ]
);

#[cfg(test)]
mod tests;

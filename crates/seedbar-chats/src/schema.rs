//! The schema and its migrations: migration `k` (1-based) brings a database from
//! `PRAGMA user_version = k - 1` to `k`. Pending migrations run in one transaction, so a
//! database is at one version or the next, never in between. Never edit a migration that
//! has shipped: add the next one.

use rusqlite::{Connection, TransactionBehavior};

use crate::{ChatError, Result};

pub(crate) const MIGRATIONS: &[&str] = &[
    // 1: conversations with their settings; messages with the seed and sampling a reply used.
    // AUTOINCREMENT: an id is never reused, so a dropped reply's id never names another.
    "CREATE TABLE conversations (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        title TEXT NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        model TEXT NOT NULL,
        system_prompt TEXT NOT NULL,
        temperature REAL NOT NULL,
        top_p REAL NOT NULL,
        max_tokens INTEGER NOT NULL,
        seed INTEGER
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
        content TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('streaming', 'complete', 'stopped', 'error')),
        seed INTEGER,
        model TEXT,
        temperature REAL,
        top_p REAL,
        max_tokens INTEGER,
        system_prompt TEXT,
        created_at TEXT NOT NULL
    );
    CREATE INDEX messages_by_conversation ON messages (conversation_id, id);
    CREATE INDEX conversations_by_update ON conversations (updated_at);",
    // 2: the app's settings, one JSON row.
    "CREATE TABLE app_settings (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        value TEXT NOT NULL
    );",
    // 3: a reply's thinking (models that think) and how long it took.
    "ALTER TABLE messages ADD COLUMN reasoning TEXT;
    ALTER TABLE messages ADD COLUMN reasoning_ms INTEGER;",
    // 4: what fixed a reply besides its seed and sampling: its model's weights hash, the
    // engine build and the backend (JSON).
    "ALTER TABLE messages ADD COLUMN provenance TEXT;",
    // 5: the images a user message holds, in order, as they were sent.
    "CREATE TABLE message_images (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        media_type TEXT NOT NULL,
        data BLOB NOT NULL
    );
    CREATE INDEX images_by_message ON message_images (message_id, position);",
];

/// Bring the database up to version `target`; refuse one newer than this build knows.
pub(crate) fn migrate(conn: &mut Connection, target: usize) -> Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let version: i64 = tx.pragma_query_value(None, "user_version", |row| row.get(0))?;
    let version = usize::try_from(version).unwrap_or(usize::MAX);
    if version > MIGRATIONS.len() {
        return Err(ChatError::TooNew {
            found: version,
            known: MIGRATIONS.len(),
        });
    }
    for sql in &MIGRATIONS[version.min(target)..target] {
        tx.execute_batch(sql)?;
    }
    if target > version {
        tx.pragma_update(None, "user_version", target as i64)?;
    }
    tx.commit()?;
    Ok(())
}

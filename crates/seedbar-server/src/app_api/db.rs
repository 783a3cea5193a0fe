//! The app routes' access to the conversations store: blocking store calls off the async
//! threads, and the store's errors as API errors.

use axum::http::StatusCode;
use seedbar_chats::{ChatError, ChatStore};

use crate::{error::ApiError, App};

/// Run `work` on the store off the async threads (every write waits for the disk).
pub(super) async fn db<T: Send + 'static>(
    app: &App,
    work: impl FnOnce(&ChatStore) -> seedbar_chats::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    let chats = app.chats.clone();
    tokio::task::spawn_blocking(move || work(&chats))
        .await
        .map_err(ApiError::internal)?
        .map_err(chat_error)
}

pub(super) fn chat_error(error: ChatError) -> ApiError {
    let message = error.to_string();
    match error {
        ChatError::NoConversation(_) | ChatError::NoMessage(_) => {
            ApiError::new(StatusCode::NOT_FOUND, message)
        }
        ChatError::NotEditable { .. } => ApiError::bad_param("edit.message_id", message),
        ChatError::Invalid(_) => ApiError::new(StatusCode::BAD_REQUEST, message),
        ChatError::Busy(_) => ApiError {
            code: Some("reply_in_progress"),
            ..ApiError::new(StatusCode::CONFLICT, message)
        },
        _ => ApiError::internal(message),
    }
}

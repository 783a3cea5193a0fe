//! The library's remote models (`/app/remotes`): listed with where they run and what they
//! take, added by URL (the upstream probed with the key given; the key kept in the keychain,
//! never returned), removed with their key.

use std::sync::Arc;

use axum::{
    extract::{rejection::PathRejection, Path, State},
    http::StatusCode,
    Json,
};
use seedbar_remote::{NewRemote, RegistryError, Remote};
use serde::Serialize;

use super::path_param;
use crate::{error::ApiError, extract::ApiJson, App};

/// A remote as the app shows it.
#[derive(Serialize)]
pub(super) struct RemoteInfo {
    #[serde(flatten)]
    remote: Remote,
    /// The engine and the host, for people.
    owner: String,
}

impl From<Remote> for RemoteInfo {
    fn from(remote: Remote) -> Self {
        RemoteInfo {
            owner: remote.owner(),
            remote,
        }
    }
}

pub(super) async fn list(State(app): State<Arc<App>>) -> Json<Vec<RemoteInfo>> {
    Json(
        app.models
            .remotes()
            .list()
            .into_iter()
            .map(Into::into)
            .collect(),
    )
}

pub(super) async fn add(
    State(app): State<Arc<App>>,
    ApiJson(new): ApiJson<NewRemote>,
) -> Result<(StatusCode, Json<RemoteInfo>), ApiError> {
    let local: Vec<String> = app
        .models
        .installed()?
        .into_iter()
        .map(|m| m.name)
        .collect();
    let name = new.name.clone();
    let remote = app
        .models
        .remotes()
        .add_probed(new, &local)
        .await
        .map_err(refusal)?;
    app.models.forget_remote(&name);
    Ok((StatusCode::CREATED, Json(remote.into())))
}

pub(super) async fn remove(
    State(app): State<Arc<App>>,
    name: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let name = path_param(name, "name", "not a model name")?;
    app.models.remotes().remove(&name).map_err(refusal)?;
    app.models.forget_remote(&name);
    Ok(StatusCode::NO_CONTENT)
}

fn refusal(error: RegistryError) -> ApiError {
    match error {
        RegistryError::Upstream(error) => error.into(),
        RegistryError::Invalid(message) => ApiError::new(StatusCode::BAD_REQUEST, message),
        RegistryError::Taken(_) => ApiError::new(StatusCode::CONFLICT, error.to_string()),
        RegistryError::NotFound(_) => ApiError::new(StatusCode::NOT_FOUND, error.to_string()),
        RegistryError::Io { .. } => ApiError::internal(error),
    }
}

//! The JSON body extractor every POST route uses: size-limited, and its errors say which
//! field is wrong (`param`) instead of axum's plain-text rejections.

use axum::{
    body::Bytes,
    extract::{rejection::BytesRejection, FromRequest, Request},
    http::StatusCode,
};
use serde::de::DeserializeOwned;

use crate::error::{ApiError, OllamaError};

/// A JSON body parsed as `T`.
pub struct ApiJson<T>(pub T);

/// The same, for the Ollama routes: its errors come in Ollama's shape.
pub struct OllamaJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for OllamaJson<T> {
    type Rejection = OllamaError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let ApiJson(value) = ApiJson::from_request(req, state).await?;
        Ok(OllamaJson(value))
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let body = JsonBody::from_request(req, state).await?;
        body.parse().map(ApiJson)
    }
}

/// A size-checked body to parse as several views (the fields two routes share, and each
/// route's own), each view's errors naming its fields.
pub struct JsonBody(Bytes);

impl JsonBody {
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        parse(&self.0)
    }
}

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        Bytes::from_request(req, state)
            .await
            .map(JsonBody)
            .map_err(|e: BytesRejection| {
                if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "the request body is larger than this server accepts",
                    )
                } else {
                    ApiError::new(e.status(), e.body_text())
                }
            })
    }
}

/// Parse a JSON body; a type error names the field's path as `param`.
fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = inner.to_string();
        if let Some(field) = message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next())
        {
            let param = if path == "." {
                field.to_string()
            } else {
                format!("{path}.{field}")
            };
            return ApiError::bad_param(&param, format!("missing required parameter '{param}'"));
        }
        if inner.is_syntax() || inner.is_eof() || path == "." {
            not_json(inner)
        } else {
            ApiError::bad_param(&path, format!("'{path}': {inner}"))
        }
    })?;
    // Nothing but whitespace may follow the value.
    de.end().map_err(not_json)?;
    Ok(value)
}

fn not_json(error: serde_json::Error) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        format!("the request body is not valid JSON for this route: {error}"),
    )
}

//! The one error type of the HTTP layer, answered in OpenAI's JSON shape
//! (`{"error": {"message", "type", "param", "code"}}`), on the Ollama routes in Ollama's
//! (`{"error": "message"}`), and on the Anthropic routes in Anthropic's
//! (`{"type": "error", "error": {"type", "message"}}`).

use axum::{
    http::{header, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    Json,
};
use seedbar_scheduler::SubmitError;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// 400 naming the parameter at fault.
    pub fn bad_param(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param.to_string()),
            code: Some("invalid_value"),
            ..Self::new(StatusCode::BAD_REQUEST, message)
        }
    }

    pub fn unknown_model(name: &str, installed: &[String]) -> Self {
        let known = if installed.is_empty() {
            "no models are installed".to_string()
        } else {
            format!("installed: {}", installed.join(", "))
        };
        ApiError {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                format!("the model '{name}' does not exist ({known})"),
            )
        }
    }

    pub fn internal(message: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message.to_string())
    }

    /// OpenAI's `type` for this status.
    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The OpenAI error body (also sent as an SSE event when a stream fails midway).
    pub fn body(&self) -> OpenAiErrorBody {
        OpenAiErrorBody {
            error: OpenAiErrorDetail {
                message: self.message.clone(),
                kind: self.kind(),
                param: self.param.clone(),
                code: self.code,
            },
        }
    }
}

/// OpenAI's error body.
#[derive(Debug, Serialize)]
pub struct OpenAiErrorBody {
    pub error: OpenAiErrorDetail,
}

#[derive(Debug, Serialize)]
pub struct OpenAiErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status;
        closing_if_unread(status, (status, Json(self.body())).into_response())
    }
}

/// The rest of an oversized body is never read, so its connection cannot carry another
/// request: say so (`Connection: close`), or a client's next request on that connection
/// races the server closing it.
fn closing_if_unread(status: StatusCode, mut response: Response) -> Response {
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A remote engine's refusal or failure, named, with the status `UpstreamError::status` picks.
impl From<seedbar_remote::UpstreamError> for ApiError {
    fn from(error: seedbar_remote::UpstreamError) -> Self {
        use seedbar_remote::UpstreamError as E;
        let code = match &error {
            E::Unreachable { .. } => "upstream_unreachable",
            E::Timeout { .. } => "upstream_timeout",
            E::Refused {
                status: 401 | 403, ..
            } => "upstream_unauthorized",
            E::Refused { .. } | E::Broken { .. } => "upstream_error",
        };
        let status = StatusCode::from_u16(error.status()).unwrap_or(StatusCode::BAD_GATEWAY);
        ApiError {
            code: Some(code),
            ..ApiError::new(status, error.to_string())
        }
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        let message = e.to_string();
        match e {
            SubmitError::QueueFull(_) => ApiError {
                code: Some("queue_full"),
                ..Self::new(StatusCode::TOO_MANY_REQUESTS, message)
            },
            SubmitError::PromptTooLong { .. } => ApiError {
                param: Some("messages".into()),
                code: Some("context_length_exceeded"),
                ..Self::new(StatusCode::BAD_REQUEST, message)
            },
            SubmitError::Invalid(_) => Self::new(StatusCode::BAD_REQUEST, message),
            SubmitError::Stopped => Self::new(StatusCode::SERVICE_UNAVAILABLE, message),
        }
    }
}

/// The same error in Ollama's shape, for the `/api/*` routes.
pub struct OllamaError(pub ApiError);

impl From<ApiError> for OllamaError {
    fn from(e: ApiError) -> Self {
        OllamaError(e)
    }
}

/// Ollama's error body; also a stream's last line when it fails.
#[derive(Debug, Serialize)]
pub struct OllamaErrorBody {
    pub error: String,
}

impl IntoResponse for OllamaError {
    fn into_response(self) -> Response {
        let status = self.0.status;
        let body = OllamaErrorBody {
            error: self.0.message,
        };
        closing_if_unread(status, (status, Json(body)).into_response())
    }
}

/// The same error in Anthropic's shape, for the `/v1/messages` routes.
pub struct AnthropicError(pub ApiError);

/// Anthropic's error body; also the `data` of a stream's `error` event.
#[derive(Debug, Serialize, Deserialize)]
pub struct AnthropicErrorBody {
    /// Always `error`.
    #[serde(rename = "type")]
    pub kind: String,
    pub error: AnthropicErrorDetail,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct AnthropicErrorDetail {
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
}

impl AnthropicError {
    /// Anthropic's `error.type` for this status.
    fn kind(&self) -> &'static str {
        match self.0.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
            s if s.is_server_error() => "api_error",
            _ => "invalid_request_error",
        }
    }

    pub fn body(&self) -> AnthropicErrorBody {
        AnthropicErrorBody {
            kind: "error".into(),
            error: AnthropicErrorDetail {
                kind: self.kind().into(),
                message: self.0.message.clone(),
            },
        }
    }

    /// Whether `path` is an Anthropic route (whose errors, also those of the middleware,
    /// come in Anthropic's shape).
    pub fn serves(path: &str) -> bool {
        path == "/v1/messages" || path.starts_with("/v1/messages/")
    }
}

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let status = self.0.status;
        closing_if_unread(status, (status, Json(self.body())).into_response())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn anthropic_errors_name_anthropics_types() {
        let kind = |status| AnthropicError(ApiError::new(status, "m")).body().error.kind;
        assert_eq!(kind(StatusCode::BAD_REQUEST), "invalid_request_error");
        assert_eq!(kind(StatusCode::UNAUTHORIZED), "authentication_error");
        assert_eq!(kind(StatusCode::NOT_FOUND), "not_found_error");
        assert_eq!(kind(StatusCode::SERVICE_UNAVAILABLE), "overloaded_error");
        assert_eq!(kind(StatusCode::INTERNAL_SERVER_ERROR), "api_error");
        let body = serde_json::to_value(AnthropicError(ApiError::internal("boom")).body()).unwrap();
        assert_eq!(
            body,
            json!({"type": "error", "error": {"type": "api_error", "message": "boom"}})
        );
        assert!(AnthropicError::serves("/v1/messages"));
        assert!(AnthropicError::serves("/v1/messages/count_tokens"));
        assert!(!AnthropicError::serves("/v1/messagesx"));
    }
}

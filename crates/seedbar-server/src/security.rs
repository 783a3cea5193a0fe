//! What keeps a localhost server safe on a laptop: a Host-header allowlist (against DNS
//! rebinding), an optional bearer API key, and CORS closed except for configured origins
//! and the app's own window.

use std::sync::Arc;

use axum::{
    extract::{Request, State},
    http::{header, HeaderValue, Method, StatusCode},
    middleware::Next,
    response::Response,
};
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::{error::ApiError, App};

/// Origins of the Tauri app's own webview (macOS/Linux, Windows).
const APP_ORIGINS: [&str; 2] = ["tauri://localhost", "http://tauri.localhost"];

/// Host names always accepted: the loopback names.
const LOOPBACK_HOSTS: [&str; 4] = ["localhost", "127.0.0.1", "[::1]", "::1"];

/// The host part of a Host header (`name:port`, `[v6]:port`).
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        host.split_inclusive(']').next().unwrap_or(host)
    } else {
        host.rsplit_once(':').map_or(host, |(name, _)| name)
    }
}

/// Refuse requests whose Host header is not a loopback name or a configured one.
pub async fn check_host(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()))
        .unwrap_or("");
    let name = host_name(host).to_ascii_lowercase();
    let allowed = LOOPBACK_HOSTS.contains(&name.as_str())
        || app
            .config
            .allowed_hosts
            .iter()
            .any(|h| h.eq_ignore_ascii_case(&name));
    if !allowed {
        return axum::response::IntoResponse::into_response(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("the Host header '{host}' is not allowed; add it with --allow-host"),
        ));
    }
    next.run(request).await
}

/// With an API key configured, every route but `/health` and the chat UI's static files
/// needs `Authorization: Bearer KEY`.
pub async fn check_api_key(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let Some(key) = app.config.api_key.as_deref() else {
        return next.run(request).await;
    };
    if request.uri().path() == "/health"
        || request.method() == Method::OPTIONS
        || crate::ui::serves(&request)
    {
        return next.run(request).await;
    }
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .unwrap_or("");
    if !constant_time_eq(given.as_bytes(), key.as_bytes()) {
        let message = if given.is_empty() {
            "this server needs an API key: send `Authorization: Bearer <key>`"
        } else {
            "the API key is not valid"
        };
        return axum::response::IntoResponse::into_response(ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(StatusCode::UNAUTHORIZED, message)
        });
    }
    next.run(request).await
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// CORS for the app's window and the configured origins; everything else is refused.
pub fn cors(origins: &[String]) -> CorsLayer {
    let allowed: Vec<HeaderValue> = APP_ORIGINS
        .iter()
        .map(|o| o.to_string())
        .chain(origins.iter().cloned())
        .filter_map(|o| HeaderValue::from_str(&o).ok())
        .collect();
    CorsLayer::new()
        .allow_origin(AllowOrigin::list(allowed))
        .allow_methods([
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::PATCH,
            Method::DELETE,
            Method::OPTIONS,
        ])
        .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
        .expose_headers([header::HeaderName::from_static(crate::SEED_HEADER)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_drop_the_port() {
        assert_eq!(host_name("localhost:7337"), "localhost");
        assert_eq!(host_name("[::1]:7337"), "[::1]");
        assert_eq!(host_name("evil.example"), "evil.example");
    }

    #[test]
    fn keys_compare_whole() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secre"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
    }
}

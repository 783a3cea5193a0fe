//! What keeps a localhost server safe on a laptop: a Host-header allowlist (against DNS
//! rebinding), an origin policy (web pages the user opens cannot drive the server: a
//! cross-site request is refused before any handler runs, including the "simple" requests
//! browsers send without a preflight), an optional API key (`Authorization: Bearer`, or
//! Anthropic's `x-api-key`), and CORS for the origins the policy allows.

use std::sync::Arc;

use axum::{
    extract::{Request, State},
    http::{header, Method, StatusCode},
    middleware::Next,
    response::{IntoResponse, Response},
};
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

use crate::{
    error::{AnthropicError, ApiError},
    App,
};

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
        let error = ApiError::new(
            StatusCode::FORBIDDEN,
            format!("the Host header '{host}' is not allowed; add it with --allow-host"),
        );
        return refusal(&request, error);
    }
    next.run(request).await
}

/// A refusal answered before the request's body is read. That body never will be, so the
/// connection cannot carry another request: say so (`Connection: close`), or a client's
/// next request on it races the server closing it.
fn refusal(request: &Request, response: impl IntoResponse) -> Response {
    let mut response = response.into_response();
    let headers = request.headers();
    let has_body = headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|length| length != "0");
    if has_body {
        response.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
    response
}

/// Whether a browser page of `origin` may call this server, reached as `host`: the app's
/// window, the server's own pages (the chat UI it serves), or an origin the user allowed
/// (`--allow-origin`, or the app's settings).
fn origin_allowed(app: &App, origin: &str, host: &str) -> bool {
    let origin = origin.trim_end_matches('/');
    let same = |allowed: &str| allowed.trim_end_matches('/').eq_ignore_ascii_case(origin);
    APP_ORIGINS.iter().any(|o| same(o))
        || same(&format!("http://{host}"))
        || app.config.allowed_origins.iter().any(|o| same(o))
        || app.app_settings().allowed_origins.iter().any(|o| same(o))
}

/// Refuse what a web page can make a browser send: a request with an `Origin` the policy
/// does not allow, or marked `Sec-Fetch-Site: cross-site` (a no-cors fetch, an image, a
/// form), except navigations to the chat UI's pages. Browsers' bodies must be declared
/// JSON, so a "simple" `text/plain` POST never reaches a handler. Clients that are not
/// browsers (curl, SDKs, editors) send neither header and pass.
pub async fn check_origin(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let text = |name: &str| headers.get(name).and_then(|h| h.to_str().ok());
    let host = text(header::HOST.as_str()).unwrap_or("");
    let refused = match text(header::ORIGIN.as_str()) {
        Some(origin) => !origin_allowed(&app, origin, host),
        None => {
            text(SEC_FETCH_SITE) == Some("cross-site")
                && !(crate::ui::serves(&request) && text(SEC_FETCH_MODE) == Some("navigate"))
        }
    };
    if refused {
        let error = ApiError {
            code: Some("origin_not_allowed"),
            ..ApiError::new(
                StatusCode::FORBIDDEN,
                "requests from other web sites are refused; allow this origin with \
                 --allow-origin (or in Seedbar's settings) to call the API from a page",
            )
        };
        return refusal(&request, error);
    }
    let sends_body = matches!(
        *request.method(),
        Method::POST | Method::PUT | Method::PATCH
    );
    if sends_body
        && headers.contains_key(header::ORIGIN)
        && !is_json(text(header::CONTENT_TYPE.as_str()))
    {
        let error = ApiError {
            code: Some("unsupported_media_type"),
            ..ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "send the request body as JSON, with `Content-Type: application/json`",
            )
        };
        return refusal(&request, error);
    }
    next.run(request).await
}

const SEC_FETCH_SITE: &str = "sec-fetch-site";
const SEC_FETCH_MODE: &str = "sec-fetch-mode";

/// Whether a Content-Type names JSON (`application/json`, parameters allowed).
fn is_json(content_type: Option<&str>) -> bool {
    content_type
        .and_then(|t| t.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
}

/// The header Anthropic's clients send the API key in.
const X_API_KEY: &str = "x-api-key";

/// The key a request gives: `Authorization: Bearer KEY`, or else `x-api-key: KEY`.
fn given_key(headers: &header::HeaderMap) -> &str {
    let text = |name: &str| headers.get(name).and_then(|h| h.to_str().ok());
    text(header::AUTHORIZATION.as_str())
        .and_then(|h| h.strip_prefix("Bearer "))
        .or_else(|| text(X_API_KEY))
        .unwrap_or("")
}

/// With an API key configured, every route but `/health` and the chat UI's static files
/// needs it, as `Authorization: Bearer KEY` or `x-api-key: KEY`.
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
    let given = given_key(request.headers());
    if !constant_time_eq(given.as_bytes(), key.as_bytes()) {
        let message = if given.is_empty() {
            "this server needs an API key: send `Authorization: Bearer <key>` or `x-api-key: <key>`"
        } else {
            "the API key is not valid"
        };
        let error = ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(StatusCode::UNAUTHORIZED, message)
        };
        return if AnthropicError::serves(request.uri().path()) {
            refusal(&request, AnthropicError(error))
        } else {
            refusal(&request, error)
        };
    }
    next.run(request).await
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// CORS for the origins `check_origin` lets through (it runs first, so every origin seen
/// here is allowed), with whatever headers their SDKs send (the OpenAI JS SDK's
/// `x-stainless-*`).
pub fn cors() -> CorsLayer {
    CorsLayer::new()
        .allow_origin(AllowOrigin::mirror_request())
        .allow_headers(AllowHeaders::mirror_request())
        .allow_methods([
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::PATCH,
            Method::DELETE,
            Method::OPTIONS,
        ])
        .expose_headers(crate::receipt::HEADERS.map(header::HeaderName::from_static))
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
    fn a_refusal_with_an_unread_body_closes_the_connection() {
        let request = |length: Option<&str>| {
            let mut builder = axum::http::Request::builder()
                .method(Method::POST)
                .uri("/v1/x");
            if let Some(length) = length {
                builder = builder.header(header::CONTENT_LENGTH, length);
            }
            builder.body(axum::body::Body::empty()).unwrap()
        };
        let refused = |length| refusal(&request(length), StatusCode::FORBIDDEN);
        assert_eq!(refused(Some("12")).headers()[header::CONNECTION], "close");
        assert!(!refused(Some("0"))
            .headers()
            .contains_key(header::CONNECTION));
        assert!(!refused(None).headers().contains_key(header::CONNECTION));
    }

    #[test]
    fn json_content_types() {
        assert!(is_json(Some("application/json")));
        assert!(is_json(Some("Application/JSON; charset=utf-8")));
        for other in [
            None,
            Some("text/plain"),
            Some("application/jsonx"),
            Some(""),
        ] {
            assert!(!is_json(other), "{other:?}");
        }
    }

    #[test]
    fn keys_come_as_bearer_or_x_api_key() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut map = header::HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, header::HeaderValue::from_static(value));
            }
            map
        };
        assert_eq!(given_key(&headers(&[("authorization", "Bearer k1")])), "k1");
        assert_eq!(given_key(&headers(&[("x-api-key", "k2")])), "k2");
        assert_eq!(
            given_key(&headers(&[
                ("authorization", "Bearer k1"),
                ("x-api-key", "k2")
            ])),
            "k1"
        );
        assert_eq!(given_key(&headers(&[("authorization", "Basic k1")])), "");
        assert_eq!(given_key(&headers(&[])), "");
    }

    #[test]
    fn keys_compare_whole() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secre"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
    }
}

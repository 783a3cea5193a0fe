//! The chat UI, served as static files from `ServerConfig::ui_dir` for GET requests outside
//! the API's paths (which keep their JSON 404). The files need no API key: the page has to
//! load before it can ask for one. Without a UI folder, `/` says how to build it. Every UI
//! response carries a Content-Security-Policy that keeps the page to its own server, so a
//! reply a prompt injected with `<img src=https://…>` cannot send anything out.

use std::sync::Arc;

use axum::{
    extract::{Request, State},
    http::{header, HeaderValue, Method, StatusCode},
    response::{Html, IntoResponse, Response},
};
use tower_http::services::{ServeDir, ServeFile};

use crate::{error::ApiError, App};

/// Paths that belong to the API, never to the UI.
const API_PREFIXES: [&str; 5] = ["/v1", "/api", "/app", "/health", "/metrics"];

const NOT_BUILT: &str = "<!doctype html>
<html><head><meta charset=\"utf-8\"><title>Seedbar</title></head>
<body style=\"font-family: system-ui, sans-serif; max-width: 40em; margin: 4em auto\">
<h1>Seedbar is running</h1>
<p>The chat UI is not built. Build it with <code>make ui</code> (it lands in
<code>ui/dist</code>), then restart <code>seedbar serve</code> from the repository, or point
it at the files with <code>--ui-dir DIR</code> or <code>SEEDBAR_UI_DIR</code>.</p>
<p>The API is at <a href=\"/v1/models\"><code>/v1</code></a>.</p>
</body></html>
";

/// The page may load and call only its own server; no remote images, scripts, frames or
/// form targets (the same rules as the app window's, in `tauri.conf.json`).
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; connect-src 'self'; \
     img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; font-src 'self' data:; \
     object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Whether the UI answers this request: a GET or HEAD outside the API's paths.
pub fn serves(request: &Request) -> bool {
    let path = request.uri().path();
    matches!(*request.method(), Method::GET | Method::HEAD)
        && !API_PREFIXES.iter().any(|prefix| {
            path.strip_prefix(prefix)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        })
}

/// The router's fallback: UI files (unknown paths get `index.html`, for the UI's own
/// routes), else the JSON 404.
pub async fn fallback(State(app): State<Arc<App>>, request: Request) -> Response {
    if !serves(&request) {
        return crate::not_found(request).await.into_response();
    }
    let mut response = ui_file(&app, request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

async fn ui_file(app: &App, request: Request) -> Response {
    let Some(dir) = &app.config.ui_dir else {
        return match request.uri().path() {
            "/" | "/index.html" => Html(NOT_BUILT).into_response(),
            _ => crate::not_found(request).await.into_response(),
        };
    };
    let mut files = ServeDir::new(dir).fallback(ServeFile::new(dir.join("index.html")));
    match files.try_call(request).await {
        Ok(response) => response.map(axum::body::Body::new),
        Err(e) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot read the chat UI's files in {}: {e}", dir.display()),
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method, path: &str) -> Request {
        Request::builder()
            .method(method)
            .uri(path)
            .body(axum::body::Body::empty())
            .unwrap()
    }

    #[test]
    fn the_ui_serves_gets_outside_the_api() {
        for path in [
            "/",
            "/index.html",
            "/assets/app.js",
            "/chat/3",
            "/apps",
            "/v1x",
        ] {
            assert!(serves(&request(Method::GET, path)), "{path}");
        }
        assert!(serves(&request(Method::HEAD, "/")));
        for path in [
            "/v1",
            "/v1/models",
            "/api/tags",
            "/app",
            "/app/conversations",
            "/health",
            "/metrics",
            "/metrics/x",
        ] {
            assert!(!serves(&request(Method::GET, path)), "{path}");
        }
        assert!(!serves(&request(Method::POST, "/")));
        assert!(!serves(&request(Method::DELETE, "/index.html")));
    }
}

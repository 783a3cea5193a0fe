//! Fetching one URL's bytes through the process's client, within a size and a time limit:
//! what the server does for an image part given by an `http(s)` URL when fetching is
//! allowed. A body over the limit is refused as it streams, never read whole.

use std::time::Duration;

use futures_util::StreamExt;

use crate::upstream::client;

/// A fetched body and the type the server declared for it.
#[derive(Debug)]
pub struct Fetched {
    pub bytes: Vec<u8>,
    pub content_type: Option<String>,
}

/// Why a URL's bytes could not be had.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("only http and https URLs are fetched")]
    Scheme,
    #[error("the server answered {0}")]
    Status(u16),
    #[error("the body is over {0} bytes")]
    TooLarge(usize),
    #[error("no answer within {0} s")]
    Timeout(u64),
    #[error("{0}")]
    Connection(String),
}

/// GET `url` (http or https), at most `max_bytes` of body, all of it within `timeout`.
pub async fn fetch(url: &str, max_bytes: usize, timeout: Duration) -> Result<Fetched, FetchError> {
    let lower = url.to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        return Err(FetchError::Scheme);
    }
    let get = async {
        let response = client()
            .get(url)
            .send()
            .await
            .map_err(|e| FetchError::Connection(e.to_string()))?;
        if !response.status().is_success() {
            return Err(FetchError::Status(response.status().as_u16()));
        }
        if response
            .content_length()
            .is_some_and(|n| n > max_bytes as u64)
        {
            return Err(FetchError::TooLarge(max_bytes));
        }
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let mut bytes = Vec::new();
        let mut body = response.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| FetchError::Connection(e.to_string()))?;
            if bytes.len() + chunk.len() > max_bytes {
                return Err(FetchError::TooLarge(max_bytes));
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(Fetched {
            bytes,
            content_type,
        })
    };
    tokio::time::timeout(timeout, get)
        .await
        .map_err(|_| FetchError::Timeout(timeout.as_secs()))?
}

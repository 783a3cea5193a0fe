//! The exchange with an upstream over HTTP(S): a request sent in its protocol, its stream
//! read into [`Piece`]s. No byte for [`Remote::timeout_s`] gives up (the wait for the first
//! token included); a request that could not connect, or got 502–504, is sent once more
//! (nothing has streamed then); dropping the stream closes the connection, which is how
//! every engine named here learns that its client went away and frees the request's slot.

use std::{collections::VecDeque, pin::Pin, sync::OnceLock, time::Duration};

use futures_util::{stream, Stream, StreamExt};
use serde_json::Value;

use crate::{
    wire::{self, error_message, Reader},
    Ask, Piece, Remote,
};

/// How long a connection may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The wait before the one retry.
const RETRY_AFTER: Duration = Duration::from_millis(500);

/// Why an upstream gave no reply; each names the remote.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    #[error("the remote engine '{remote}' ({url}) cannot be reached: {reason}")]
    Unreachable {
        remote: String,
        url: String,
        reason: String,
    },
    #[error("the remote engine '{remote}' sent nothing for {seconds} s")]
    Timeout { remote: String, seconds: u64 },
    #[error("the remote engine '{remote}' answered {status}: {message}")]
    Refused {
        remote: String,
        status: u16,
        message: String,
    },
    #[error("the remote engine '{remote}' failed: {message}")]
    Broken { remote: String, message: String },
}

impl UpstreamError {
    /// The status Seedbar answers with: 401 for a key the upstream refused, 400 and 429 as
    /// given, 504 for a timeout, 502 for the rest (the upstream failed, not the client).
    pub fn status(&self) -> u16 {
        match self {
            UpstreamError::Timeout { .. } => 504,
            UpstreamError::Refused { status, .. } => match status {
                401 | 403 => 401,
                400 | 413 | 422 => 400,
                429 => 429,
                _ => 502,
            },
            _ => 502,
        }
    }
}

/// A reply's pieces as they stream; dropping it cancels the request upstream.
pub type Pieces = Pin<Box<dyn Stream<Item = Result<Piece, UpstreamError>> + Send>>;

/// One remote's connection settings.
pub struct Upstream {
    remote: Remote,
    key: Option<String>,
}

/// The process's client: one connection pool, TLS by rustls with ring.
pub(crate) fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        // Another part of the process may have installed one already: either serves.
        let _ = rustls::crypto::ring::default_provider().install_default();
        reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .unwrap_or_default()
    })
}

impl Upstream {
    /// `remote`, sent `key` as a bearer token where there is one.
    pub fn new(remote: &Remote, key: Option<String>) -> Upstream {
        Upstream {
            remote: remote.clone(),
            key,
        }
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(self.remote.timeout_s.max(1))
    }

    /// Ask for one reply, streamed.
    pub async fn ask(&self, ask: &Ask) -> Result<Pieces, UpstreamError> {
        let (route, body) = wire::request(&self.remote, ask);
        let response = self.send(&route, Some(&body)).await?;
        Ok(self.pieces(response))
    }

    /// The key sent, where there is one.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The JSON `route` answers: `POST body` where there is one, else `GET` (the probe's
    /// questions).
    pub async fn call(&self, route: &str, body: Option<&Value>) -> Result<Value, UpstreamError> {
        let response = self.send(route, body).await?;
        let text = self
            .within(response.text())
            .await?
            .map_err(|e| self.broken(e))?;
        serde_json::from_str(&text).map_err(|e| self.broken(e))
    }

    /// `POST route` with `body` (`GET` without), once more where it could not connect or got
    /// 502–504; a status of 400 and above is an error with the upstream's message.
    async fn send(
        &self,
        route: &str,
        body: Option<&Value>,
    ) -> Result<reqwest::Response, UpstreamError> {
        let mut retried = false;
        loop {
            let url = format!("{}{route}", self.remote.url);
            let mut request = match body {
                Some(body) => client().post(&url).json(body),
                None => client().get(&url),
            };
            if let Some(key) = &self.key {
                request = request.bearer_auth(key);
            }
            let sent = self.within(request.send()).await?;
            let transient = match &sent {
                Err(e) => e.is_connect(),
                Ok(response) => matches!(response.status().as_u16(), 502..=504),
            };
            if transient && !retried {
                retried = true;
                tokio::time::sleep(RETRY_AFTER).await;
                continue;
            }
            let response = sent.map_err(|e| UpstreamError::Unreachable {
                remote: self.remote.name.clone(),
                url: self.remote.url.clone(),
                reason: reason(&e),
            })?;
            let status = response.status().as_u16();
            if status < 400 {
                return Ok(response);
            }
            let text = self.within(response.text()).await?.unwrap_or_default();
            let message = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|body| body.get("error").map(error_message))
                .unwrap_or_else(|| text.chars().take(300).collect());
            return Err(UpstreamError::Refused {
                remote: self.remote.name.clone(),
                status,
                message,
            });
        }
    }

    /// `future`, or a timeout error when it takes longer than the remote allows.
    async fn within<T>(
        &self,
        future: impl std::future::Future<Output = T>,
    ) -> Result<T, UpstreamError> {
        tokio::time::timeout(self.timeout(), future)
            .await
            .map_err(|_| UpstreamError::Timeout {
                remote: self.remote.name.clone(),
                seconds: self.remote.timeout_s,
            })
    }

    fn broken(&self, message: impl ToString) -> UpstreamError {
        UpstreamError::Broken {
            remote: self.remote.name.clone(),
            message: message.to_string(),
        }
    }

    /// The response's pieces: each read waits at most the timeout; the stream ends after
    /// the finish or the first error.
    fn pieces(&self, response: reqwest::Response) -> Pieces {
        struct State {
            bytes: Pin<Box<dyn Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
            reader: Reader,
            ready: VecDeque<Result<Piece, UpstreamError>>,
            done: bool,
            upstream: Upstream,
        }
        let state = State {
            bytes: Box::pin(response.bytes_stream()),
            reader: Reader::new(self.remote.api),
            ready: VecDeque::new(),
            done: false,
            upstream: Upstream::new(&self.remote, None),
        };
        stream::unfold(state, |mut state| async move {
            loop {
                if let Some(piece) = state.ready.pop_front() {
                    return Some((piece, state));
                }
                if state.done {
                    return None;
                }
                let read = match state.upstream.within(state.bytes.next()).await {
                    Err(timeout) => Err(timeout),
                    Ok(Some(Ok(bytes))) => state
                        .reader
                        .push(&bytes)
                        .map_err(|e| state.upstream.broken(e)),
                    Ok(Some(Err(e))) => Err(state.upstream.broken(reason(&e))),
                    Ok(None) => {
                        state.done = true;
                        state.reader.close().map_err(|e| state.upstream.broken(e))
                    }
                };
                match read {
                    Ok(pieces) => state.ready.extend(pieces.into_iter().map(Ok)),
                    Err(error) => {
                        state.done = true;
                        state.ready.push_back(Err(error));
                    }
                }
                state.done |= state.reader.finished();
            }
        })
        .boxed()
    }
}

/// A client error's cause, as people read it (reqwest's own message names only the URL).
fn reason(error: &reqwest::Error) -> String {
    let mut reason = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        reason = format!("{reason}: {cause}");
        source = cause.source();
    }
    reason
}

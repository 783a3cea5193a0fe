//! The exchange with an upstream and the probe, against scripted HTTP servers on real
//! sockets: what each engine's answers make of a remote, which failures are retried (only
//! before anything streamed), and the timeout while a stream stalls. The end-to-end paths
//! against a real upstream are in the repository's `tests/test_remote_engines.py`.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use futures_util::StreamExt;
use seedbar_remote::{
    probe::probe, Api, Ask, AskPrompt, End, Piece, Remote, Upstream, UpstreamError,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

/// What the scripted server answers.
enum Reply {
    /// A status and a JSON body.
    Json(u16, String),
    /// 200 and these server-sent-event chunks, each after its delay; then the connection
    /// closes.
    Stream(Vec<(Duration, String)>),
}

/// A server answering each request by `answer(path, request count so far)`; its base URL.
async fn serve(answer: impl Fn(&str, usize) -> Reply + Send + Sync + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let answer = Arc::new(answer);
    let count = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let (answer, count) = (answer.clone(), count.clone());
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buffer = [0u8; 4096];
                // The head, then as much body as it announces.
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = socket.read(&mut buffer).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    request.extend_from_slice(&buffer[..n]);
                }
                let text = String::from_utf8_lossy(&request).to_string();
                let head_len = text.find("\r\n\r\n").unwrap() + 4;
                let length: usize = text
                    .lines()
                    .find_map(|l| {
                        l.to_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse().unwrap_or(0))
                    })
                    .unwrap_or(0);
                while request.len() < head_len + length {
                    let n = socket.read(&mut buffer).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    request.extend_from_slice(&buffer[..n]);
                }
                let path = text.split_whitespace().nth(1).unwrap_or("/").to_string();
                let seen = count.fetch_add(1, Ordering::SeqCst);
                match answer(&path, seen) {
                    Reply::Json(status, body) => {
                        let response = format!(
                            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = socket.write_all(response.as_bytes()).await;
                    }
                    Reply::Stream(chunks) => {
                        let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";
                        let _ = socket.write_all(head.as_bytes()).await;
                        for (delay, chunk) in chunks {
                            tokio::time::sleep(delay).await;
                            if socket.write_all(chunk.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    url
}

fn text_chunk(text: &str) -> String {
    format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n")
}

fn whole_stream() -> Vec<(Duration, String)> {
    vec![
        (Duration::ZERO, text_chunk("Hel")),
        (Duration::ZERO, text_chunk("lo")),
        (
            Duration::ZERO,
            "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n".into(),
        ),
        (Duration::ZERO, "data: [DONE]\n\n".into()),
    ]
}

fn ask() -> Ask {
    Ask::new(AskPrompt::Text("Say hello".into()), 1)
}

/// Every piece, or the first error (with the pieces before it).
async fn pieces(upstream: &Upstream) -> (Vec<Piece>, Option<UpstreamError>) {
    let mut stream = match upstream.ask(&ask()).await {
        Ok(stream) => stream,
        Err(e) => return (Vec::new(), Some(e)),
    };
    let mut got = Vec::new();
    while let Some(piece) = stream.next().await {
        match piece {
            Ok(piece) => got.push(piece),
            Err(e) => return (got, Some(e)),
        }
    }
    (got, None)
}

#[tokio::test]
async fn a_refused_key_names_the_remote_and_is_a_401() {
    let url =
        serve(|_, _| Reply::Json(401, r#"{"error":{"message":"Invalid API key"}}"#.into())).await;
    let remote = Remote::new("team-gpu", &url, Api::OpenAi, "m");
    let (_, error) = pieces(&Upstream::new(&remote, Some("bad".into()))).await;
    let error = error.unwrap();
    assert_eq!(error.status(), 401);
    assert_eq!(
        error.to_string(),
        "the remote engine 'team-gpu' answered 401: Invalid API key"
    );
}

#[tokio::test]
async fn a_503_before_anything_streamed_is_sent_once_more() {
    let url = serve(|_, seen| match seen {
        0 => Reply::Json(503, r#"{"error":"loading"}"#.into()),
        _ => Reply::Stream(whole_stream()),
    })
    .await;
    let remote = Remote::new("r", &url, Api::OpenAi, "m");
    let (got, error) = pieces(&Upstream::new(&remote, None)).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(
        got[..2],
        [Piece::Text("Hel".into()), Piece::Text("lo".into())]
    );
    assert!(matches!(got[2], Piece::Finish(f) if f.end == End::Stop));
    // Twice 503: the second is the answer.
    let url = serve(|_, _| Reply::Json(503, r#"{"error":"loading"}"#.into())).await;
    let remote = Remote::new("r", &url, Api::OpenAi, "m");
    let (_, error) = pieces(&Upstream::new(&remote, None)).await;
    assert_eq!(error.unwrap().status(), 502);
}

#[tokio::test]
async fn a_stream_cut_after_it_began_is_an_error_not_a_retry() {
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    let url = serve(move |_, _| {
        counted.fetch_add(1, Ordering::SeqCst);
        Reply::Stream(vec![(Duration::ZERO, text_chunk("Hel"))])
    })
    .await;
    let remote = Remote::new("cut", &url, Api::OpenAi, "m");
    let (got, error) = pieces(&Upstream::new(&remote, None)).await;
    assert_eq!(got, [Piece::Text("Hel".into())]);
    let error = error.unwrap().to_string();
    assert!(
        error.contains("'cut'") && error.contains("before the reply finished"),
        "{error}"
    );
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_stream_that_stalls_times_out_naming_the_remote() {
    let url = serve(|_, _| {
        Reply::Stream(vec![
            (Duration::ZERO, text_chunk("Hel")),
            (Duration::from_secs(30), text_chunk("lo")),
        ])
    })
    .await;
    let mut remote = Remote::new("slow", &url, Api::OpenAi, "m");
    remote.timeout_s = 1;
    let started = Instant::now();
    let (got, error) = pieces(&Upstream::new(&remote, None)).await;
    assert_eq!(got, [Piece::Text("Hel".into())]);
    let error = error.unwrap();
    assert_eq!(error.status(), 504);
    assert_eq!(
        error.to_string(),
        "the remote engine 'slow' sent nothing for 1 s"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// What each engine says about itself, as far as the probe asks.
fn engine(kind: &'static str) -> impl Fn(&str, usize) -> Reply + Send + Sync + 'static {
    move |path, _| {
        let json = |body: &str| Reply::Json(200, body.to_string());
        match (kind, path) {
            ("vllm", "/v1/models") => json(r#"{"data":[{"id":"qwen3-32b","owned_by":"vllm"}]}"#),
            ("vllm", "/version") => json(r#"{"version":"0.11.0"}"#),
            ("sglang", "/v1/models") => {
                json(r#"{"data":[{"id":"a","owned_by":"sglang"},{"id":"b","owned_by":"sglang"}]}"#)
            }
            ("sglang", "/get_server_info") => {
                json(r#"{"version":"0.5.2","enable_deterministic_inference":true}"#)
            }
            ("llamacpp", "/v1/models") => {
                json(r#"{"data":[{"id":"model.gguf","owned_by":"llamacpp"}]}"#)
            }
            ("llamacpp", "/props") => json(r#"{"build_info":"b6000-abc"}"#),
            ("ollama", "/api/tags") => {
                json(r#"{"models":[{"name":"llama3.2:latest"},{"name":"qwen3:8b"}]}"#)
            }
            ("ollama", "/api/version") => json(r#"{"version":"0.12.3"}"#),
            ("ollama", "/api/show") => {
                json(r#"{"capabilities":["completion","tools","thinking"]}"#)
            }
            _ => Reply::Json(404, r#"{"error":"not found"}"#.into()),
        }
    }
}

#[tokio::test]
async fn the_probe_tells_the_engines_apart() {
    let probed = |kind, api, model: &str| {
        let model = model.to_string();
        async move {
            let url = serve(engine(kind)).await;
            let mut remote = Remote::new("r", &url, api, &model);
            probe(&mut remote, None).await.map(|()| remote)
        }
    };
    let vllm = probed("vllm", Api::OpenAi, "").await.unwrap();
    assert_eq!(
        (vllm.engine.as_str(), vllm.model.as_str()),
        ("vllm", "qwen3-32b")
    );
    assert_eq!(vllm.engine_version.as_deref(), Some("0.11.0"));
    assert!(
        !vllm.identical_seeds,
        "batch invariance is not visible from outside"
    );

    let sglang = probed("sglang", Api::OpenAi, "b").await.unwrap();
    assert_eq!(
        (sglang.engine.as_str(), sglang.model.as_str()),
        ("sglang", "b")
    );
    assert!(sglang.identical_seeds, "deterministic inference is on");
    let several = probed("sglang", Api::OpenAi, "").await.unwrap_err();
    assert!(
        several.to_string().contains("name one of: a, b"),
        "{several}"
    );

    let llama = probed("llamacpp", Api::OpenAi, "").await.unwrap();
    assert_eq!(llama.engine, "llama-server");
    assert!(!llama.identical_seeds);

    let ollama = probed("ollama", Api::Ollama, "llama3.2").await.unwrap();
    assert_eq!(
        (ollama.engine.as_str(), ollama.model.as_str()),
        ("ollama", "llama3.2:latest")
    );
    assert_eq!(ollama.engine_version.as_deref(), Some("0.12.3"));
    assert!(ollama.supports.tools && ollama.supports.reasoning && !ollama.supports.images);
    assert!(!ollama.identical_seeds);
    let missing = probed("ollama", Api::Ollama, "mistral").await.unwrap_err();
    assert_eq!(missing.status(), 400);
    assert!(
        missing.to_string().contains("no model 'mistral'"),
        "{missing}"
    );
}

//! The commands that ask a running server, as `ollama ps` and `ollama stop` do: `seedbar ps`
//! lists the models in memory and until when they stay, `seedbar stop MODEL` unloads one.
//! They speak plain HTTP/1.1 to the server's Ollama routes on 127.0.0.1.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    time::{Duration, SystemTime},
};

use anyhow::{bail, Context, Result};
use seedbar_server::DEFAULT_PORT;
use serde_json::{json, Value};

/// How long a command waits for the server.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Which server to ask.
#[derive(clap::Args)]
pub struct ServerArgs {
    /// The running server's port.
    #[arg(long, env = "SEEDBAR_PORT", default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Its API key, when it needs one.
    #[arg(long, env = "SEEDBAR_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
}

impl ServerArgs {
    /// `method path` with `body`, answered with a 2xx JSON body; the server's own error
    /// message otherwise.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value> {
        let address = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(3))
            .with_context(|| {
                format!(
                    "no Seedbar server at http://{address}: start one with `seedbar serve` \
                     or the app (or pass --port)"
                )
            })?;
        stream.set_read_timeout(Some(TIMEOUT))?;
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let key = self
            .api_key
            .as_deref()
            .filter(|k| !k.is_empty())
            .map(|k| format!("Authorization: Bearer {k}\r\n"))
            .unwrap_or_default();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n{key}\r\n{body}",
            body.len()
        )?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        let (head, body) = response
            .split_once("\r\n\r\n")
            .context("the server's answer has no body")?;
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .context("the server's answer has no status")?;
        let value: Value = serde_json::from_str(body).unwrap_or(Value::String(body.into()));
        if !(200..300).contains(&status) {
            let message = value["error"]["message"]
                .as_str()
                .or(value["error"].as_str())
                .unwrap_or(body);
            bail!("{message} (HTTP {status})");
        }
        Ok(value)
    }
}

/// `seedbar ps`: the loaded models, their size and until when they stay.
pub fn ps(server: &ServerArgs) -> Result<()> {
    let running = server.call("GET", "/api/ps", None)?;
    let models = running["models"].as_array().cloned().unwrap_or_default();
    println!("{:<40} {:>10}  UNTIL", "NAME", "SIZE");
    for model in models {
        let until = model["expires_at"].as_str().unwrap_or_default();
        println!(
            "{:<40} {:>7.1} MB  {}",
            model["name"].as_str().unwrap_or_default(),
            model["size"].as_f64().unwrap_or_default() / 1e6,
            until_text(until)
        );
    }
    Ok(())
}

/// An `expires_at` for people: "forever", or how long from now.
fn until_text(expires_at: &str) -> String {
    let Ok(at) = humantime::parse_rfc3339(expires_at) else {
        return expires_at.to_string();
    };
    match at.duration_since(SystemTime::now()) {
        Ok(left) if left > Duration::from_secs(100 * 365 * 86_400) => "forever".into(),
        Ok(left) => format!("{} from now", humantime::format_duration(round(left))),
        Err(_) => "now".into(),
    }
}

fn round(duration: Duration) -> Duration {
    Duration::from_secs(duration.as_secs())
}

/// `seedbar stop MODEL`: unload it now (Ollama's `keep_alive: 0`); the next request loads it
/// again.
pub fn stop(server: &ServerArgs, model: &str) -> Result<()> {
    let body = json!({"model": model, "keep_alive": 0});
    let answer = server.call("POST", "/api/generate", Some(body))?;
    println!("unloaded {}", answer["model"].as_str().unwrap_or(model));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_reads_as_forever_or_a_time_from_now() {
        assert_eq!(until_text("9999-12-31T23:59:59Z"), "forever");
        let soon = SystemTime::now() + Duration::from_secs(301);
        let text = until_text(&humantime::format_rfc3339_seconds(soon).to_string());
        assert!(text == "5m from now" || text == "4m 59s from now", "{text}");
        assert_eq!(until_text("2001-01-01T00:00:00Z"), "now");
    }
}

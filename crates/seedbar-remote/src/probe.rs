//! What an upstream says about itself when a remote is added: that it answers (with the
//! key given), that it has the model (or which one, where it serves exactly one), which
//! engine it is and its version, what the model takes (Ollama's `capabilities`), and
//! whether the engine promises seeded identity: Seedbar always, SGLang when it runs in
//! deterministic mode; vLLM's batch invariance is not visible from outside (the user says so
//! when adding it), and llama-server and Ollama do not under concurrency.

use serde_json::{json, Value};

use crate::{Api, Remote, Upstream, UpstreamError};

/// Ask `remote`'s upstream and fill in its engine, version, model id (where it was left
/// empty and the upstream serves one model), what it supports and whether seeds are kept.
pub async fn probe(remote: &mut Remote, key: Option<String>) -> Result<(), UpstreamError> {
    let upstream = Upstream::new(remote, key);
    let refuse = |message: String| UpstreamError::Refused {
        remote: remote.name.clone(),
        status: 400,
        message,
    };
    let (ids, owner) = match remote.api {
        Api::OpenAi => {
            let listed = upstream.call("/v1/models", None).await?;
            let models = listed["data"].as_array().cloned().unwrap_or_default();
            let ids: Vec<String> = models
                .iter()
                .filter_map(|m| m["id"].as_str().map(String::from))
                .collect();
            let owner = models
                .first()
                .and_then(|m| m["owned_by"].as_str())
                .unwrap_or_default()
                .to_string();
            (ids, owner)
        }
        Api::Ollama => {
            let tags = upstream.call("/api/tags", None).await?;
            let ids = tags["models"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|m| m["name"].as_str().map(String::from))
                .collect();
            (ids, String::new())
        }
    };
    remote.model = pick_model(&remote.model, &ids).map_err(refuse)?;
    let upstream = Upstream::new(remote, upstream.key().map(String::from));
    let health = upstream.call("/health", None).await.ok();
    let is_seedbar = owner == "seedbar"
        || health.as_ref().is_some_and(|h| {
            h["status"] == "ok" && h["models"].is_array() && h["version"].is_string()
        });
    let (engine, version, identical) = if is_seedbar {
        let version = health
            .as_ref()
            .and_then(|h| h["version"].as_str())
            .map(String::from);
        ("seedbar", version, true)
    } else if remote.api == Api::Ollama {
        let version = upstream.call("/api/version", None).await.ok();
        ("ollama", text(version.as_ref(), "version"), false)
    } else {
        match owner.as_str() {
            "vllm" => {
                let version = upstream.call("/version", None).await.ok();
                ("vllm", text(version.as_ref(), "version"), false)
            }
            "sglang" => {
                let info = upstream.call("/get_server_info", None).await.ok();
                let deterministic = info
                    .as_ref()
                    .is_some_and(|i| i["enable_deterministic_inference"] == true);
                ("sglang", text(info.as_ref(), "version"), deterministic)
            }
            "llamacpp" => {
                let props = upstream.call("/props", None).await.ok();
                ("llama-server", text(props.as_ref(), "build_info"), false)
            }
            _ => ("unknown", None, false),
        }
    };
    remote.engine = engine.to_string();
    remote.engine_version = version;
    remote.identical_seeds = identical;
    if remote.api == Api::Ollama && !is_seedbar {
        let shown = upstream
            .call("/api/show", Some(&json!({"model": remote.model})))
            .await?;
        if let Some(capabilities) = shown["capabilities"].as_array() {
            let has = |c: &str| capabilities.iter().any(|x| x == c);
            remote.supports.tools = has("tools");
            remote.supports.images = has("vision");
            remote.supports.reasoning = has("thinking");
        }
    }
    Ok(())
}

/// The model id to use: `asked` where the upstream lists it (Ollama's `:latest` may be left
/// out), the only one where `asked` is empty.
fn pick_model(asked: &str, ids: &[String]) -> Result<String, String> {
    let asked = asked.trim();
    if asked.is_empty() {
        return match ids {
            [only] => Ok(only.clone()),
            [] => Err("the upstream lists no models".into()),
            _ => Err(format!(
                "the upstream serves several models; name one of: {}",
                ids.join(", ")
            )),
        };
    }
    let latest = format!("{asked}:latest");
    match ids.iter().find(|id| *id == asked || **id == latest) {
        Some(id) => Ok(id.clone()),
        // Some servers list nothing, or not every name they answer to.
        None if ids.is_empty() => Ok(asked.to_string()),
        None => Err(format!(
            "the upstream has no model '{asked}'; it has: {}",
            ids.join(", ")
        )),
    }
}

fn text(value: Option<&Value>, field: &str) -> Option<String> {
    value.and_then(|v| v[field].as_str()).map(String::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_is_the_one_asked_for_or_the_only_one() {
        let ids = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        assert_eq!(pick_model("", &ids(&["a"])).unwrap(), "a");
        assert!(pick_model("", &ids(&["a", "b"]))
            .unwrap_err()
            .contains("a, b"));
        assert_eq!(
            pick_model("llama3", &ids(&["llama3:latest"])).unwrap(),
            "llama3:latest"
        );
        assert!(pick_model("x", &ids(&["a"]))
            .unwrap_err()
            .contains("no model 'x'"));
        assert_eq!(pick_model("x", &[]).unwrap(), "x");
    }
}

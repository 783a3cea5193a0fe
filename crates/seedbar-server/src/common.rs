//! Request fields and chat-template shapes the protocols share: the sampling fields
//! OpenAI's chat and legacy completions, Anthropic's messages and the Responses API name
//! alike (`CommonFields`, with the chat template's keyword arguments), a seed as JSON gives it, and tools and earlier tool calls in the
//! shape chat templates take them whatever API declared them.

use std::collections::HashMap;

use seedbar_engine::{SamplingParams, TemplateKwargs};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{error::ApiError, extract::null_as_default, generation::Settings};

/// Fields chat and legacy completions share (and the Anthropic and Responses routes, whose
/// sampling fields have the same names).
#[derive(Deserialize)]
pub struct CommonFields {
    pub(crate) model: String,
    temperature: Option<f32>,
    top_p: Option<f32>,
    /// Not OpenAI's, but sent by many clients (llama.cpp, vLLM extensions).
    top_k: Option<usize>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    logit_bias: Option<HashMap<String, f32>>,
    seed: Option<serde_json::Number>,
    stop: Option<Stop>,
    pub(crate) max_tokens: Option<usize>,
    n: Option<usize>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub(crate) stream: bool,
    stream_options: Option<StreamOptions>,
    /// Seedbar's: `false` turns speculative decoding off (the reply is the same).
    speculative: Option<bool>,
    /// Values for the chat template (vLLM's and llama-server's extension), e.g.
    /// `{"enable_thinking": false}`.
    chat_template_kwargs: Option<TemplateKwargs>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Default)]
struct StreamOptions {
    #[serde(default, deserialize_with = "null_as_default")]
    include_usage: bool,
}

impl CommonFields {
    pub(crate) fn settings(
        &self,
        max_tokens: Option<usize>,
        logprobs: Option<usize>,
    ) -> Result<Settings, ApiError> {
        let logit_bias = self
            .logit_bias
            .iter()
            .flatten()
            .map(|(token, &bias)| {
                token.parse::<u32>().map(|t| (t, bias)).map_err(|_| {
                    ApiError::bad_param("logit_bias", format!("'{token}' is not a token id"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let defaults = SamplingParams::default();
        let settings = Settings {
            sampling: SamplingParams {
                temperature: self.temperature.unwrap_or(1.0),
                top_p: self.top_p.unwrap_or(1.0),
                top_k: self.top_k.unwrap_or(0),
                min_p: self.min_p.unwrap_or(0.0),
                repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
                presence_penalty: self.presence_penalty.unwrap_or(0.0),
                frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
                logit_bias,
                ..defaults
            },
            seed: self.seed.as_ref().map(seed_value).transpose()?,
            max_tokens,
            stop: match &self.stop {
                None => Vec::new(),
                Some(Stop::One(s)) => vec![s.clone()],
                Some(Stop::Many(v)) => v.clone(),
            },
            logprobs,
            constraint: None,
            format: None,
            speculative: self.speculative,
            thinking: None,
            template_kwargs: self.chat_template_kwargs.clone().unwrap_or_default(),
        };
        if settings.sampling.temperature > 2.0 {
            return Err(ApiError::bad_param(
                "temperature",
                format!(
                    "temperature must be in [0, 2], got {}",
                    settings.sampling.temperature
                ),
            ));
        }
        if self.stream_options.is_some() && !self.stream {
            return Err(ApiError::bad_param(
                "stream_options",
                "stream_options is only allowed when stream is true",
            ));
        }
        settings.validate("")?;
        Ok(settings)
    }

    pub(crate) fn n(&self) -> Result<usize, ApiError> {
        match self.n.unwrap_or(1) {
            n @ 1..=8 => Ok(n),
            n => Err(ApiError::bad_param(
                "n",
                format!("n must be between 1 and 8, got {n}"),
            )),
        }
    }

    pub(crate) fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }
}

/// Whether a model that thinks should, for a `reasoning_effort` (OpenAI's chat and
/// Responses name the same levels); `param` names the field in the error.
pub(crate) fn thinking_for_effort(effort: &str, param: &str) -> Result<bool, ApiError> {
    match effort {
        "none" => Ok(false),
        "minimal" | "low" | "medium" | "high" | "xhigh" => Ok(true),
        other => Err(ApiError::bad_param(
            param,
            format!("unknown reasoning effort '{other}' (none, minimal, low, medium, high)"),
        )),
    }
}

/// A seed as JSON gives it: any integer; negative ones wrap to their two's complement.
pub fn seed_value(n: &serde_json::Number) -> Result<u64, ApiError> {
    n.as_u64()
        .or_else(|| n.as_i64().map(|i| i as u64))
        .ok_or_else(|| ApiError::bad_param("seed", format!("seed must be an integer, got {n}")))
}

/// A function the model may call, as chat templates take it (an OpenAI chat `tools` entry).
#[derive(Serialize)]
struct TemplateTool {
    #[serde(rename = "type")]
    kind: &'static str,
    function: TemplateFunction,
}

#[derive(Serialize)]
struct TemplateFunction {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    parameters: Value,
}

/// The template's `tools` entry for a function other APIs declare in their own shape.
pub(crate) fn template_tool(name: String, description: Option<String>, parameters: Value) -> Value {
    let tool = TemplateTool {
        kind: "function",
        function: TemplateFunction {
            name,
            description,
            parameters,
        },
    };
    serde_json::to_value(tool).unwrap_or_default()
}

/// An assistant's earlier call as chat templates take it (`ChatMessage::tool_calls`
/// entries: OpenAI's shape with the arguments as an object).
#[derive(Serialize)]
struct TemplateCall {
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    function: TemplateCallFunction,
}

#[derive(Serialize)]
struct TemplateCallFunction {
    name: String,
    arguments: Value,
}

/// `ChatMessage::tool_calls` for calls given as `(id, name, arguments)`.
pub(crate) fn template_calls(calls: Vec<(String, String, Value)>) -> Value {
    let calls: Vec<TemplateCall> = calls
        .into_iter()
        .map(|(id, name, arguments)| TemplateCall {
            id,
            kind: "function",
            function: TemplateCallFunction { name, arguments },
        })
        .collect();
    serde_json::to_value(calls).unwrap_or_default()
}

/// Tool-call arguments as JSON text (on the wire) made an object, as templates expect;
/// text that is not JSON stays a string.
pub(crate) fn arguments_value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

pub(crate) fn arguments_as_object(mut call: Value) -> Value {
    if let Some(args) = call.pointer_mut("/function/arguments") {
        if let Some(text) = args.as_str() {
            *args = arguments_value(text);
        }
    }
    call
}

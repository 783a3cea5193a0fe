//! Structured outputs as the protocols ask for them: OpenAI's `response_format` and
//! `tool_choice`, the Responses API's `text.format`, Ollama's `format`, turned into one
//! [`Format`] and compiled into the reply's constraint (400 naming the field when a schema is
//! invalid).

use seedbar_grammar::{Format, GrammarError, ToolSchema};
use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::ApiError,
    generation::{Prompt, Served, ServedModel, Settings},
    images::InImage,
};

/// A chat request as templates see it.
#[derive(Debug)]
pub struct ChatInput {
    pub messages: Vec<seedbar_engine::ChatMessage>,
    /// The tools offered to the model (none when the tool choice is `none`).
    pub tools: Option<Vec<Value>>,
    /// The call the tool choice forces (`required`, `any` or a named function).
    pub forced_call: Option<Format>,
    /// The images of the messages' image parts, in order.
    pub images: Vec<InImage>,
}

impl ChatInput {
    /// The chat as a prompt, and the call it forces.
    pub fn into_prompt(self) -> (Prompt, Option<Format>) {
        let prompt = Prompt::Chat {
            messages: self.messages,
            tools: self.tools,
            images: self.images,
        };
        (prompt, self.forced_call)
    }
}

/// OpenAI's `response_format`.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

/// The Responses API's `text.format`: `response_format` with the schema's fields flat.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TextFormat {
    Text,
    JsonObject,
    JsonSchema(JsonSchemaFormat),
}

/// `json_schema`'s `name`, `description` and `strict` change nothing here: the schema is
/// always enforced.
#[derive(Debug, Deserialize)]
pub struct JsonSchemaFormat {
    /// OpenAI allows leaving it out (any JSON value then).
    #[serde(default)]
    pub schema: Option<Value>,
}

impl JsonSchemaFormat {
    fn format(&self) -> Format {
        Format::JsonSchema(
            self.schema
                .clone()
                .unwrap_or_else(|| Value::Object(Default::default())),
        )
    }
}

impl ResponseFormat {
    pub fn format(&self) -> Option<Format> {
        match self {
            ResponseFormat::Text => None,
            ResponseFormat::JsonObject => Some(Format::JsonObject),
            ResponseFormat::JsonSchema { json_schema } => Some(json_schema.format()),
        }
    }
}

impl TextFormat {
    pub fn format(&self) -> Option<Format> {
        match self {
            TextFormat::Text => None,
            TextFormat::JsonObject => Some(Format::JsonObject),
            TextFormat::JsonSchema(json_schema) => Some(json_schema.format()),
        }
    }
}

/// The one format a reply follows: the call a tool choice forces, or the reply format the
/// field `reply_param` asked for; 400 when a request asks for both.
pub fn one_format(
    forced_call: Option<Format>,
    reply: Option<Format>,
    reply_param: &'static str,
) -> Result<Option<(Format, &'static str)>, ApiError> {
    match (forced_call, reply) {
        (Some(_), Some(_)) => Err(ApiError::bad_param(
            reply_param,
            format!("a forced tool call (tool_choice) and a JSON {reply_param} cannot both apply"),
        )),
        (call, reply) => Ok(call
            .map(|f| (f, "tool_choice"))
            .or(reply.map(|f| (f, reply_param)))),
    }
}

/// OpenAI's `tool_choice`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ToolChoice {
    Mode(ToolMode),
    Named(NamedTool),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolMode {
    None,
    Auto,
    Required,
}

/// `{"type": "function", "function": {"name"}}`.
#[derive(Debug, Deserialize)]
pub struct NamedTool {
    pub function: FunctionName,
}

#[derive(Debug, Deserialize)]
pub struct FunctionName {
    pub name: String,
}

/// A declared tool as OpenAI's `tools` list gives it.
#[derive(Debug, Deserialize)]
struct DeclaredTool {
    function: DeclaredFunction,
}

#[derive(Debug, Deserialize)]
struct DeclaredFunction {
    name: String,
    parameters: Option<Value>,
}

impl ToolChoice {
    /// Whether the tools go into the prompt at all.
    pub fn offers_tools(&self) -> bool {
        !matches!(self, ToolChoice::Mode(ToolMode::None))
    }

    /// The forced call `required` or a named function asks for, over the declared `tools`
    /// (OpenAI's shape: `{"type": "function", "function": {"name", "parameters"}}`).
    pub fn format(&self, tools: &[Value]) -> Result<Option<Format>, ApiError> {
        if matches!(self, ToolChoice::Mode(ToolMode::None | ToolMode::Auto)) {
            return Ok(None);
        }
        let declared = tools
            .iter()
            .enumerate()
            .map(|(i, tool)| {
                DeclaredTool::deserialize(tool).map_err(|e| {
                    ApiError::bad_param(&format!("tools[{i}]"), format!("not a function tool: {e}"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let schema = |tool: &DeclaredTool| ToolSchema {
            name: tool.function.name.clone(),
            parameters: tool
                .function
                .parameters
                .clone()
                .unwrap_or_else(|| serde_json::json!({"type": "object"})),
        };
        let declared = declared.iter().map(schema).collect();
        let name = match self {
            ToolChoice::Named(named) => Some(named.function.name.as_str()),
            ToolChoice::Mode(_) => None,
        };
        forced_call(declared, name).map(Some)
    }
}

/// One call of the declared `tools` (of `name` only, when the request names one): what a
/// tool choice that forces a call demands. 400 when no declared tool qualifies.
pub fn forced_call(tools: Vec<ToolSchema>, name: Option<&str>) -> Result<Format, ApiError> {
    let forced: Vec<ToolSchema> = tools
        .into_iter()
        .filter(|tool| name.is_none_or(|name| tool.name == name))
        .collect();
    if forced.is_empty() {
        let message = match name {
            Some(name) => {
                format!("tool_choice names the function '{name}', which tools does not declare")
            }
            None => "a tool_choice that forces a call needs at least one tool in tools".into(),
        };
        return Err(ApiError::bad_param("tool_choice", message));
    }
    Ok(Format::ToolCall(forced))
}

/// Ollama's `format`: `"json"`, a JSON schema, or empty for free text.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OllamaFormat {
    Named(String),
    Schema(serde_json::Map<String, Value>),
}

impl OllamaFormat {
    pub fn format(&self) -> Result<Option<Format>, ApiError> {
        match self {
            OllamaFormat::Named(name) if name.is_empty() => Ok(None),
            OllamaFormat::Named(name) if name == "json" => Ok(Some(Format::JsonObject)),
            OllamaFormat::Named(name) => Err(ApiError::bad_param(
                "format",
                format!("unknown format '{name}': use \"json\" or a JSON schema"),
            )),
            OllamaFormat::Schema(schema) => {
                Ok(Some(Format::JsonSchema(Value::Object(schema.clone()))))
            }
        }
    }
}

/// Compile `format` (the request field that asked for it comes second) for `model` into
/// `settings` (a remote model's engine is sent the format as asked). It runs on a blocking
/// thread: the first compile for a model builds its vocabulary (every token's bytes into a
/// trie), which must not stall the async workers.
pub async fn constrain(
    settings: &mut Settings,
    model: &ServedModel,
    format: Option<(Format, &'static str)>,
) -> Result<(), ApiError> {
    let Some((format, param)) = format else {
        return Ok(());
    };
    settings.format = Some(format.clone());
    let Served::Local(model) = &model.model else {
        return Ok(());
    };
    let model = model.clone();
    let compiled = tokio::task::spawn_blocking(move || {
        model
            .vocabulary()
            .map_err(|e| ApiError::new(axum::http::StatusCode::BAD_REQUEST, e.to_string()))?
            .compile(&format)
            .map_err(|e| match e {
                GrammarError::Invalid(reason) => {
                    ApiError::bad_param(param, format!("invalid schema: {reason}"))
                }
                other => ApiError::internal(other),
            })
    })
    .await
    .map_err(ApiError::internal)?;
    settings.constraint = Some(compiled?);
    Ok(())
}

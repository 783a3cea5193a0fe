//! Structured outputs by constrained decoding: a model's vocabulary as llguidance sees it
//! ([`Vocabulary`], built once per model), the output formats requests ask for ([`Format`]:
//! any JSON object, a JSON schema, exactly one call of the declared tools) compiled into
//! [`Constraint`]s, and the per-reply state that masks each next token ([`TokenMask`]).
//!
//! A constraint follows only its own reply's tokens, so the mask a row gets depends on
//! nothing else in the batch: a seeded constrained reply stays identical whatever runs
//! beside it.
//!
//! ```no_run
//! use seedbar_grammar::{Format, Vocabulary};
//! # fn demo(model: &seedbar_engine::Model) -> Result<(), seedbar_grammar::GrammarError> {
//! let vocabulary = Vocabulary::new(&model.tokenizer, &model.eos_ids)?;
//! let schema = serde_json::json!({"type": "object", "properties": {"ok": {"type": "boolean"}}});
//! let mut constraint = vocabulary.compile(&Format::JsonSchema(schema))?;
//! let mut logits = vec![0.0f32; 49152];
//! constraint.mask()?.apply(&mut logits); // disallowed tokens are now -inf
//! constraint.accept(logits.iter().position(|l| l.is_finite()).unwrap() as u32)?;
//! # Ok(()) }
//! ```

use std::{fmt, sync::Arc};

use llguidance::{api::TopLevelGrammar, Matcher, ParserFactory};
use seedbar_engine::tokenizer::{TokenBytes, Tokenizer};
use serde_json::{json, Value};
use toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// The request's format cannot be compiled (an invalid or unsupported schema).
    #[error("{0}")]
    Invalid(String),
    /// The vocabulary cannot be described to the grammar engine.
    #[error("structured outputs are unavailable for this model: {0}")]
    Vocabulary(String),
    /// The reply left what its grammar allows (a bug, or a token the mask did not allow).
    #[error("constrained decoding failed: {0}")]
    Failed(String),
}

/// The output a request demands.
#[derive(Debug, Clone, PartialEq)]
pub enum Format {
    /// Any JSON object (OpenAI `json_object`, Ollama `"json"`).
    JsonObject,
    /// A value valid under this JSON schema.
    JsonSchema(Value),
    /// Exactly one call of one of these tools: a JSON object `{"name", "arguments"}` whose
    /// arguments follow the named tool's parameter schema (the bare-JSON call every tool-call
    /// parser of the engine reads), closed: an object schema that lists its properties and
    /// says nothing of others allows no others, so a call never wanders off into made-up
    /// arguments until `max_tokens` cuts it.
    ToolCall(Vec<ToolSchema>),
}

/// A declared function, as a forced call may use it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSchema {
    pub name: String,
    /// The arguments' JSON schema (`{"type": "object"}` when the tool declares none).
    pub parameters: Value,
}

impl Format {
    /// The JSON schema that states this format, with the layout the reply must use:
    /// standard separators and no free whitespace, which keeps small models from padding
    /// a reply with blank lines until it runs out of tokens.
    fn schema(&self) -> Value {
        let mut schema = match self {
            Format::JsonObject => json!({"type": "object"}),
            Format::JsonSchema(schema) => schema.clone(),
            Format::ToolCall(tools) => json!({"anyOf": tools.iter().map(|tool| json!({
                "type": "object",
                "properties": {"name": {"const": tool.name}, "arguments": closed(&tool.parameters)},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })).collect::<Vec<_>>()}),
        };
        if let Value::Object(fields) = &mut schema {
            fields.insert(
                "x-guidance".into(),
                json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
            );
        }
        schema
    }
}

/// `schema` with every object schema that lists `properties` and says nothing of other
/// properties (`additionalProperties`, `patternProperties`, `unevaluatedProperties`)
/// closed to them, in every subschema. Values that are data (`const`, `enum`, `default`,
/// ...) are left as they are.
fn closed(schema: &Value) -> Value {
    /// Keywords whose value is a map of names to subschemas.
    const SCHEMA_MAPS: [&str; 5] = [
        "properties",
        "patternProperties",
        "$defs",
        "definitions",
        "dependentSchemas",
    ];
    /// Keywords whose value is a subschema, or a list of them.
    const SUBSCHEMAS: [&str; 15] = [
        "items",
        "additionalItems",
        "prefixItems",
        "contains",
        "not",
        "if",
        "then",
        "else",
        "additionalProperties",
        "unevaluatedProperties",
        "unevaluatedItems",
        "propertyNames",
        "anyOf",
        "oneOf",
        "allOf",
    ];
    let Value::Object(fields) = schema else {
        return schema.clone();
    };
    let subschema = |value: &Value| match value {
        Value::Array(list) => Value::Array(list.iter().map(closed).collect()),
        value => closed(value),
    };
    let mut fields: serde_json::Map<String, Value> = fields
        .iter()
        .map(|(key, value)| {
            let value = match (key.as_str(), value) {
                (key, Value::Object(map)) if SCHEMA_MAPS.contains(&key) => Value::Object(
                    map.iter()
                        .map(|(name, sub)| (name.clone(), closed(sub)))
                        .collect(),
                ),
                (key, value) if SUBSCHEMAS.contains(&key) => subschema(value),
                (_, value) => value.clone(),
            };
            (key.clone(), value)
        })
        .collect();
    let open_to_others = [
        "additionalProperties",
        "patternProperties",
        "unevaluatedProperties",
    ]
    .iter()
    .any(|key| fields.contains_key(*key));
    if fields.contains_key("properties") && !open_to_others {
        fields.insert("additionalProperties".into(), Value::Bool(false));
    }
    Value::Object(fields)
}

/// A model's vocabulary compiled for the grammar engine (a token trie over every token's
/// bytes). Building it reads the whole vocabulary: do it once per model and share it.
#[derive(Clone)]
pub struct Vocabulary {
    factory: Arc<ParserFactory>,
    /// Every id that ends a reply (the grammar allows all of them once it may end).
    eos_ids: Arc<[u32]>,
}

impl fmt::Debug for Vocabulary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Vocabulary")
            .field("eos_ids", &self.eos_ids)
            .finish_non_exhaustive()
    }
}

impl Vocabulary {
    pub fn new(tokenizer: &Tokenizer, eos_ids: &[u32]) -> Result<Self, GrammarError> {
        let vocabulary = |e: &dyn fmt::Display| GrammarError::Vocabulary(e.to_string());
        let words: Vec<Vec<u8>> = tokenizer
            .token_bytes()
            .map_err(|e| vocabulary(&e))?
            .into_iter()
            .map(|token| match token {
                TokenBytes::Text(bytes) => bytes,
                TokenBytes::Special(name) => {
                    let mut bytes = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    bytes.extend(name.into_bytes());
                    bytes
                }
            })
            .collect();
        let &first_eos = eos_ids
            .first()
            .ok_or_else(|| vocabulary(&"the model declares no end-of-reply token"))?;
        let info = TokRxInfo::new(words.len() as u32, first_eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos_ids);
        let env: TokEnv = Arc::new(TrieOnly {
            trie,
            tokenizer: tokenizer.clone(),
        });
        let factory = ParserFactory::new_simple(&env).map_err(|e| vocabulary(&e))?;
        Ok(Vocabulary {
            factory: Arc::new(factory),
            eos_ids: eos_ids.into(),
        })
    }

    /// The constraint for one reply in `format`; an invalid schema is
    /// [`GrammarError::Invalid`] with the grammar engine's reason.
    pub fn compile(&self, format: &Format) -> Result<Constraint, GrammarError> {
        let grammar = TopLevelGrammar::from_json_schema(format.schema());
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| GrammarError::Invalid(e.to_string()))?;
        Ok(Constraint {
            matcher: Matcher::new(Ok(parser)),
            eos_ids: self.eos_ids.clone(),
        })
    }
}

/// The tokenizer environment llguidance needs: the trie, and our tokenizer for the text the
/// grammar itself writes.
struct TrieOnly {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl TokenizerEnv for TrieOnly {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, bytes: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(bytes, |text| {
            self.tokenizer.encode(text).unwrap_or_default()
        })
    }
}

/// One reply's progress through its grammar. Cloning copies the progress (a fresh clone of
/// a new constraint serves another choice of the same request).
pub struct Constraint {
    matcher: Matcher,
    eos_ids: Arc<[u32]>,
}

impl Clone for Constraint {
    fn clone(&self) -> Self {
        Constraint {
            matcher: self.matcher.deep_clone(),
            eos_ids: self.eos_ids.clone(),
        }
    }
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Constraint")
            .field("stopped", &self.matcher.is_stopped())
            .finish_non_exhaustive()
    }
}

impl Constraint {
    /// The tokens allowed next (only the end-of-reply ids once the grammar is complete).
    pub fn mask(&mut self) -> Result<TokenMask, GrammarError> {
        let mut allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| GrammarError::Failed(e.to_string()))?;
        // The engine marks one end-of-reply id; the model may end with any of its own.
        if self.eos_ids.iter().any(|&id| allowed.is_allowed(id)) {
            self.eos_ids.iter().for_each(|&id| allowed.allow_token(id));
        }
        if allowed.is_zero() {
            return Err(GrammarError::Failed(
                "no token can continue the reply".into(),
            ));
        }
        Ok(TokenMask(allowed))
    }

    /// Record the token the reply drew. End-of-reply ids end the reply and are not fed.
    pub fn accept(&mut self, token: u32) -> Result<(), GrammarError> {
        if self.eos_ids.contains(&token) {
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| GrammarError::Failed(e.to_string()))
    }
}

/// The tokens one step may draw.
#[derive(Debug, Clone)]
pub struct TokenMask(SimpleVob);

impl TokenMask {
    /// Set every disallowed logit (and any beyond the vocabulary) to -inf.
    pub fn apply(&self, logits: &mut [f32]) {
        for (id, logit) in logits.iter_mut().enumerate() {
            if id >= self.0.len() || !self.0.is_allowed(id as TokenId) {
                *logit = f32::NEG_INFINITY;
            }
        }
    }

    pub fn allows(&self, token: u32) -> bool {
        (token as usize) < self.0.len() && self.0.is_allowed(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closing_a_schema_keeps_what_it_says_of_other_properties() {
        let schema = json!({"type": "object", "properties": {
            "a": {"type": "object", "properties": {"x": {}}},
            "b": {"type": "object", "properties": {}, "additionalProperties": {"type": "integer"}},
            "c": {"type": "object", "properties": {}, "patternProperties": {"^n": {}}},
            "d": {"type": "array", "items": {"anyOf": [{"properties": {"y": {}}}, {"type": "string"}]}},
            "e": {"type": "object"},
            "properties": {"const": {"properties": {}}}}});
        let closed = closed(&schema);
        assert_eq!(closed["additionalProperties"], false);
        assert_eq!(closed["properties"]["a"]["additionalProperties"], false);
        assert_eq!(
            closed["properties"]["b"]["additionalProperties"],
            json!({"type": "integer"})
        );
        assert!(closed["properties"]["c"]
            .get("additionalProperties")
            .is_none());
        assert_eq!(
            closed["properties"]["d"]["items"]["anyOf"][0]["additionalProperties"],
            false
        );
        assert!(closed["properties"]["e"]
            .get("additionalProperties")
            .is_none());
    }
}

//! The JSON body extractor every POST route uses: size-limited, and its errors say which
//! field is wrong (`param`) instead of axum's plain-text rejections (and, where the server
//! fetches image URLs, its remote images put in before it is read); [`TextOr`], the
//! "a string or a list of typed parts" field whose errors keep saying which part is wrong;
//! and [`null_as_default`] / [`null_as_true`] for fields clients send as `null`.

use axum::{
    body::Bytes,
    extract::{rejection::BytesRejection, FromRequest, Request},
    http::StatusCode,
};
use serde::{
    de::{self, DeserializeOwned, SeqAccess, Visitor},
    Deserialize, Deserializer, Serialize,
};

use crate::{
    error::{AnthropicError, ApiError, OllamaError},
    images,
};

/// A JSON body parsed as `T`.
pub struct ApiJson<T>(pub T);

/// The same, for the Ollama routes: its errors come in Ollama's shape.
pub struct OllamaJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for OllamaJson<T> {
    type Rejection = OllamaError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let ApiJson(value) = ApiJson::from_request(req, state).await?;
        Ok(OllamaJson(value))
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let body = JsonBody::from_request(req, state).await?;
        body.parse().map(ApiJson)
    }
}

/// A size-checked body to parse as several views (the fields two routes share, and each
/// route's own), each view's errors naming its fields.
pub struct JsonBody(Bytes);

impl JsonBody {
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        parse(&self.0)
    }

    /// The body with its image parts' `http(s)` URLs fetched into data URLs
    /// ([`images::inline_remote_images`]) where `fetch` allows it; as it is otherwise (the
    /// parts are then refused as they are read) or where it is not JSON (its parse says so).
    pub async fn with_remote_images(self, fetch: bool) -> Result<JsonBody, ApiError> {
        if !fetch || !self.0.windows(4).any(|w| w.eq_ignore_ascii_case(b"http")) {
            return Ok(self);
        }
        let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(&self.0) else {
            return Ok(self);
        };
        images::inline_remote_images(&mut value).await?;
        let bytes = serde_json::to_vec(&value).map_err(ApiError::internal)?;
        Ok(JsonBody(bytes.into()))
    }
}

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        Bytes::from_request(req, state)
            .await
            .map(JsonBody)
            .map_err(|e: BytesRejection| {
                if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "the request body is larger than this server accepts",
                    )
                } else {
                    ApiError::new(e.status(), e.body_text())
                }
            })
    }
}

/// The same, for the Anthropic routes: its errors come in Anthropic's shape.
pub struct AnthropicBody(pub JsonBody);

impl<S: Send + Sync> FromRequest<S> for AnthropicBody {
    type Rejection = AnthropicError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        Ok(AnthropicBody(JsonBody::from_request(req, state).await?))
    }
}

/// Parse a JSON body; a type error names the field's path as `param`.
fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = inner.to_string();
        if let Some(field) = message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next())
        {
            let param = if path == "." {
                field.to_string()
            } else {
                format!("{path}.{field}")
            };
            return ApiError::bad_param(&param, format!("missing required parameter '{param}'"));
        }
        if inner.is_syntax() || inner.is_eof() || path == "." {
            not_json(inner)
        } else {
            ApiError::bad_param(&path, format!("'{path}': {inner}"))
        }
    })?;
    // Nothing but whitespace may follow the value.
    de.end().map_err(not_json)?;
    Ok(value)
}

fn not_json(error: serde_json::Error) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        format!("the request body is not valid JSON for this route: {error}"),
    )
}

/// A field that is a string or a list of `T` (message content: text, or typed blocks).
/// Parsed by hand rather than `#[serde(untagged)]`, so that a bad block's error says what
/// is wrong with it (an unknown `type`, a missing field) and where (`messages[0].content[1]`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum TextOr<T> {
    Text(String),
    Items(Vec<T>),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for TextOr<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextOrVisitor<T>(std::marker::PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for TextOrVisitor<T> {
            type Value = TextOr<T>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or a list of content blocks")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
                Ok(TextOr::Text(text.to_string()))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(TextOr::Items(items))
            }
        }

        deserializer.deserialize_any(TextOrVisitor(std::marker::PhantomData))
    }
}

/// For `#[serde(default, deserialize_with = "null_as_default")]`: a field sent as `null`
/// reads as one left out. Clients of every protocol send `null` for what they do not set
/// (Zed's `images`, Go and Rust clients' unset options), and the reference servers take it.
pub fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// The same for a flag that is on unless sent `false` (Ollama's `stream`): pair it with
/// `#[serde(default = "...")]` returning `true`.
pub fn null_as_true<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    Ok(Option::<bool>::deserialize(deserializer)?.unwrap_or(true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Deserialize)]
    struct Nullable {
        #[serde(default, deserialize_with = "null_as_default")]
        images: Vec<String>,
        #[serde(default = "on", deserialize_with = "null_as_true")]
        stream: bool,
    }

    fn on() -> bool {
        true
    }

    #[test]
    fn null_reads_as_left_out() {
        for body in [&br#"{}"#[..], br#"{"images": null, "stream": null}"#] {
            let read: Nullable = parse(body).unwrap();
            assert_eq!(
                read,
                Nullable {
                    images: vec![],
                    stream: true
                }
            );
        }
        let read: Nullable = parse(br#"{"images": ["a"], "stream": false}"#).unwrap();
        assert_eq!(read.images, ["a"]);
        assert!(!read.stream);
        let bad = parse::<Nullable>(br#"{"images": 3}"#).unwrap_err();
        assert_eq!(bad.param.as_deref(), Some("images"));
    }

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    enum Part {
        Text { text: String },
    }

    #[test]
    fn text_or_parts_names_the_bad_part() {
        let ok: TextOr<Part> = parse(br#""hi""#).unwrap();
        assert_eq!(ok, TextOr::Text("hi".into()));
        let ok: TextOr<Part> = parse(br#"[{"type": "text", "text": "a"}]"#).unwrap();
        assert_eq!(ok, TextOr::Items(vec![Part::Text { text: "a".into() }]));
        let bad = parse::<TextOr<Part>>(br#"[{"type": "text", "text": "a"}, {"type": "image"}]"#)
            .unwrap_err();
        assert_eq!(bad.param.as_deref(), Some("[1].type"));
        assert!(
            bad.message.contains("unknown variant `image`"),
            "{}",
            bad.message
        );
    }
}

//! Images a request sends, from each protocol's shape to what the engine takes: data URLs
//! (OpenAI, Responses), base64 with a media type (Anthropic, Ollama) and local files
//! (`file://` URLs and paths: the app runs on the user's machine). `http(s)` URLs are
//! refused unless the server allows fetching them (`seedbar serve --fetch-image-urls`, or the
//! app setting): then [`inline_remote_images`] fetches them into data URLs before a body is
//! read. Each image is checked (size, format, the declared media type) and decoded here;
//! [`for_prompt`] turns a prompt's images into the model's pixels.

use std::{io::Read, sync::Arc, time::Duration};

use base64::Engine as _;
use seedbar_chats::Image;
use seedbar_engine::ImagePrompt;
use seedbar_images::{Limits, Rgb8};
use seedbar_scheduler::PromptImage;
use serde_json::Value;

use crate::error::ApiError;

/// The most images one request may hold.
pub const MAX_IMAGES: usize = 16;

/// One decoded image of a request.
#[derive(Debug, Clone)]
pub struct InImage {
    /// Its encoded bytes' digest: the prefix caches key the image by it.
    pub digest: [u8; 32],
    pub image: Arc<Rgb8>,
}

/// The media types accepted, as they are declared.
const MEDIA_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/webp", "image/gif"];

impl InImage {
    /// Decode `bytes`, which `param` sent, declared as `media_type` where the protocol says.
    pub fn decode(bytes: &[u8], media_type: Option<&str>, param: &str) -> Result<Self, ApiError> {
        if let Some(declared) = media_type {
            let declared = declared.trim().to_ascii_lowercase();
            let declared = if declared == "image/jpg" {
                "image/jpeg".to_string()
            } else {
                declared
            };
            if !MEDIA_TYPES.contains(&declared.as_str()) {
                return Err(ApiError::bad_param(
                    param,
                    format!(
                        "the media type '{declared}' is not supported: send {}",
                        MEDIA_TYPES.join(", ")
                    ),
                ));
            }
            if let Some(actual) = seedbar_images::media_type(bytes).filter(|t| *t != declared) {
                return Err(ApiError::bad_param(
                    param,
                    format!("the image is {actual} but was sent as {declared}"),
                ));
            }
        }
        let image = seedbar_images::decode(bytes, &Limits::default())
            .map_err(|e| ApiError::bad_param(param, e.to_string()))?;
        Ok(InImage {
            digest: seedbar_images::digest(bytes),
            image: Arc::new(image),
        })
    }

    /// An image given as base64 text.
    pub fn base64(data: &str, media_type: Option<&str>, param: &str) -> Result<Self, ApiError> {
        Self::decode(&base64_bytes(data, param)?, media_type, param)
    }

    /// An image given by URL: a `data:` URL, a `file://` URL or a local path. `http(s)`
    /// URLs are refused: Seedbar does not fetch from the network.
    pub fn url(url: &str, param: &str) -> Result<Self, ApiError> {
        if url.starts_with("data:") {
            let (media_type, data) = data_url(url, param)?;
            return Self::base64(data, Some(media_type), param);
        }
        let lower = url.to_ascii_lowercase();
        if lower.starts_with("http://") || lower.starts_with("https://") {
            return Err(ApiError::bad_param(
                param,
                "images are not fetched from the network: send the image as a data URL (data:image/png;base64,...) or a local file path (or allow fetching them: the setting \"Fetch images from web addresses\", or `seedbar serve --fetch-image-urls`)",
            ));
        }
        let path = url.strip_prefix("file://").unwrap_or(url);
        if !path.starts_with('/') {
            return Err(ApiError::bad_param(
                param,
                "an image URL must be a data URL, a file:// URL or an absolute path",
            ));
        }
        let max = Limits::default().max_bytes as u64;
        let unreadable = |e: std::io::Error| {
            ApiError::bad_param(param, format!("cannot read the image file {path}: {e}"))
        };
        let file = std::fs::File::open(path).map_err(unreadable)?;
        if !file.metadata().map_err(unreadable)?.is_file() {
            return Err(ApiError::bad_param(param, format!("{path} is not a file")));
        }
        // Read one byte past the limit at most: a file that grows, or says it has no size
        // (`/proc`), cannot make it read on.
        let mut bytes = Vec::new();
        file.take(max + 1)
            .read_to_end(&mut bytes)
            .map_err(unreadable)?;
        if bytes.len() as u64 > max {
            return Err(ApiError::bad_param(
                param,
                format!("the image file is over {max} bytes; at most {max} bytes are accepted"),
            ));
        }
        Self::decode(&bytes, None, param)
    }
}

/// How long fetching one image may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);

/// `body` with each image part given by an `http(s)` URL fetched and put in as a data URL:
/// OpenAI chat's `image_url` (an object's `url` or the string), the Responses API's
/// `input_image` and Anthropic's `url` source, found by their shape anywhere in the body.
/// A URL that cannot be fetched, or whose bytes are not an image, is a 400 naming the part.
pub async fn inline_remote_images(body: &mut Value) -> Result<(), ApiError> {
    let mut found = Vec::new();
    remote_image_urls(body, String::new(), &mut found);
    let max = Limits::default().max_bytes;
    for (pointer, url) in found {
        let param = param_of(&pointer);
        let fetched = seedbar_remote::fetch::fetch(&url, max, FETCH_TIMEOUT)
            .await
            .map_err(|e| {
                ApiError::bad_param(&param, format!("cannot fetch the image at {url}: {e}"))
            })?;
        let Some(media_type) = seedbar_images::media_type(&fetched.bytes) else {
            let declared = fetched.content_type.unwrap_or_else(|| "no type".into());
            return Err(ApiError::bad_param(
                &param,
                format!("the file at {url} ({declared}) is not a PNG, JPEG, WebP or GIF image"),
            ));
        };
        let data = base64::engine::general_purpose::STANDARD.encode(&fetched.bytes);
        if let Some(slot) = body.pointer_mut(&pointer) {
            *slot = Value::String(format!("data:{media_type};base64,{data}"));
        }
    }
    Ok(())
}

/// The JSON pointers and URLs of `value`'s image parts given by `http(s)` URLs.
fn remote_image_urls(value: &Value, at: String, found: &mut Vec<(String, String)>) {
    fn remote(v: &Value) -> Option<&str> {
        v.as_str().filter(|u| {
            let lower = u.to_ascii_lowercase();
            lower.starts_with("http://") || lower.starts_with("https://")
        })
    }
    match value {
        Value::Object(fields) => {
            let url_at = match fields.get("type").and_then(Value::as_str) {
                Some("image_url") => match &fields["image_url"] {
                    Value::Object(_) => Some("/image_url/url"),
                    _ => Some("/image_url"),
                },
                Some("input_image") => Some("/image_url"),
                Some("image") if fields["source"]["type"] == "url" => Some("/source/url"),
                _ => None,
            };
            if let Some(url) = url_at.and_then(|p| value.pointer(p)).and_then(remote) {
                found.push((
                    format!("{at}{}", url_at.unwrap_or_default()),
                    url.to_string(),
                ));
            }
            for (key, field) in fields {
                let key = key.replace('~', "~0").replace('/', "~1");
                remote_image_urls(field, format!("{at}/{key}"), found);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                remote_image_urls(item, format!("{at}/{i}"), found);
            }
        }
        _ => {}
    }
}

/// A JSON pointer as a request parameter (`/messages/0/content/1/image_url/url` →
/// `messages[0].content[1].image_url.url`).
fn param_of(pointer: &str) -> String {
    let mut param = String::new();
    for part in pointer.split('/').skip(1) {
        if part.chars().all(|c| c.is_ascii_digit()) {
            param.push_str(&format!("[{part}]"));
        } else {
            if !param.is_empty() {
                param.push('.');
            }
            param.push_str(&part.replace("~1", "/").replace("~0", "~"));
        }
    }
    param
}

/// A `data:` URL's declared media type and its base64 data.
fn data_url<'a>(url: &'a str, param: &str) -> Result<(&'a str, &'a str), ApiError> {
    let rest = url.strip_prefix("data:").unwrap_or(url);
    let (header, data) = rest
        .split_once(',')
        .ok_or_else(|| ApiError::bad_param(param, "a data URL needs a ',' before its data"))?;
    let Some(media_type) = header.strip_suffix(";base64") else {
        return Err(ApiError::bad_param(
            param,
            "a data URL of an image must be base64 (data:image/png;base64,...)",
        ));
    };
    Ok((media_type, data))
}

/// The bytes base64 `data` holds, refused past the size limit before decoding.
fn base64_bytes(data: &str, param: &str) -> Result<Vec<u8>, ApiError> {
    // Base64 is 4/3 of the bytes.
    let max = Limits::default().max_bytes;
    if data.len() / 4 * 3 > max + 3 {
        return Err(ApiError::bad_param(
            param,
            format!("the image is over {max} bytes; at most {max} bytes are accepted"),
        ));
    }
    base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| ApiError::bad_param(param, format!("the image is not valid base64: {e}")))
}

/// A `data:` URL's image, checked and decoded, and as the app stores it: its encoded bytes
/// and their media type.
pub fn kept(url: &str, param: &str) -> Result<(InImage, Image), ApiError> {
    if !url.starts_with("data:") {
        return Err(ApiError::bad_param(param, "an image must be a data URL"));
    }
    let (declared, data) = data_url(url, param)?;
    let bytes = base64_bytes(data, param)?;
    let image = InImage::decode(&bytes, Some(declared), param)?;
    // Decoded, so one of the formats `media_type` names.
    let media_type = seedbar_images::media_type(&bytes).unwrap_or("image/png");
    let stored = Image {
        media_type: media_type.to_string(),
        data: bytes,
    };
    Ok((image, stored))
}

/// Refuse more than [`MAX_IMAGES`] images in a request.
pub fn check_count(images: &[InImage]) -> Result<(), ApiError> {
    if images.len() > MAX_IMAGES {
        return Err(ApiError::bad_param(
            "messages",
            format!(
                "the request holds {} images; at most {MAX_IMAGES} are accepted",
                images.len()
            ),
        ));
    }
    Ok(())
}

/// The scheduler's images for a prompt whose tokens (after `offset` tokens run before them)
/// hold `images`' soft tokens, in order: each image's pixels as the model's processor makes
/// them.
pub fn for_prompt(
    tokens: &[u32],
    offset: usize,
    images: &[InImage],
    prompt: &ImagePrompt,
) -> Result<Vec<PromptImage>, ApiError> {
    let runs = prompt.image_runs(tokens).map_err(ApiError::internal)?;
    if runs.len() != images.len() {
        return Err(ApiError::bad_param(
            "messages",
            format!(
                "the prompt holds {} images' tokens for {} images",
                runs.len(),
                images.len()
            ),
        ));
    }
    runs.into_iter()
        .zip(images)
        .map(|((at, count), image)| {
            let pixels = prompt
                .preprocessor
                .pixels(&image.image)
                .map_err(|e| ApiError::bad_param("messages", e.to_string()))?;
            let expected = prompt.tokens.of(&pixels);
            if count != expected {
                return Err(ApiError::bad_param(
                    "messages",
                    format!("an image stands on {count} image tokens; it takes {expected}"),
                ));
            }
            Ok(PromptImage {
                at: offset + at,
                digest: image.digest,
                pixels: Arc::new(pixels),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 2x1 PNG.
    fn png() -> Vec<u8> {
        let mut bytes = Vec::new();
        let mut encoder = png::Encoder::new(&mut bytes, 2, 1);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        encoder
            .write_header()
            .unwrap()
            .write_image_data(&[255, 0, 0, 0, 0, 255])
            .unwrap();
        bytes
    }

    #[test]
    fn remote_image_parts_are_found_in_every_protocols_shape() {
        let body = serde_json::json!({
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "http://not.an/image"},
                {"type": "image_url", "image_url": {"url": "https://a.test/1.png"}},
                {"type": "image_url", "image_url": "HTTP://a.test/2.png"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
                {"type": "image", "source": {"type": "url", "url": "https://a.test/3.png"}},
            ]}],
            "input": [{"content": [{"type": "input_image", "image_url": "http://a.test/4.png"}]}],
        });
        let mut found = Vec::new();
        remote_image_urls(&body, String::new(), &mut found);
        let pointers: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            pointers,
            [
                "/messages/0/content/1/image_url/url",
                "/messages/0/content/2/image_url",
                "/messages/0/content/4/source/url",
                "/input/0/content/0/image_url",
            ]
        );
        assert_eq!(
            param_of(pointers[0]),
            "messages[0].content[1].image_url.url"
        );
        assert_eq!(found[3].1, "http://a.test/4.png");
    }

    #[test]
    fn a_data_url_decodes_and_keys_by_content() {
        let data = base64::engine::general_purpose::STANDARD.encode(png());
        let a = InImage::url(&format!("data:image/png;base64,{data}"), "p").unwrap();
        assert_eq!((a.image.width, a.image.height), (2, 1));
        assert_eq!(&a.image.data[..3], &[255, 0, 0]);
        assert_eq!(a.digest, seedbar_images::digest(&png()));
    }

    #[test]
    fn bad_images_get_a_clear_400() {
        let data = base64::engine::general_purpose::STANDARD.encode(png());
        let cases = [
            (
                "https://example.test/cat.png".to_string(),
                "not fetched from the network",
            ),
            (
                format!("data:image/jpeg;base64,{data}"),
                "was sent as image/jpeg",
            ),
            (format!("data:image/bmp;base64,{data}"), "not supported"),
            (format!("data:image/png,{data}"), "must be base64"),
            ("data:image/png;base64,@@@".to_string(), "not valid base64"),
            (
                "data:image/png;base64,aGVsbG8=".to_string(),
                "format is not supported",
            ),
            ("cat.png".to_string(), "absolute path"),
            (
                "/nonexistent/cat.png".to_string(),
                "cannot read the image file",
            ),
        ];
        for (url, expected) in cases {
            let e = InImage::url(&url, "messages[0].content[1].image_url").unwrap_err();
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST, "{url}");
            assert!(e.message.contains(expected), "{url}: {}", e.message);
            assert_eq!(e.param.as_deref(), Some("messages[0].content[1].image_url"));
        }
    }
}

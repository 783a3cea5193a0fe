//! Images a request sends, from each protocol's shape to what the engine takes: data URLs
//! (OpenAI, Responses), base64 with a media type (Anthropic, Ollama) and local files
//! (`file://` URLs and paths: the app runs on the user's machine). Images are never fetched
//! from the network. Each is checked (size, format, the declared media type) and decoded
//! here; [`for_prompt`] turns a prompt's images into the model's pixels.

use std::{io::Read, sync::Arc};

use base64::Engine as _;
use seedbar_chats::Image;
use seedbar_engine::ImagePrompt;
use seedbar_images::{Limits, Rgb8};
use seedbar_scheduler::PromptImage;

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
                "images are not fetched from the network: send the image as a data URL (data:image/png;base64,...) or a local file path",
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

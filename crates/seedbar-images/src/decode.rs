//! Encoded bytes to [`Rgb8`], the way transformers' `load_image` and `convert_to_rgb` get
//! there through Pillow: the format sniffed from magic bytes, the first frame decoded by the
//! `image` crate (a JPEG's samples may differ from libjpeg-turbo's by a few levels: the two
//! decoders' IDCT and upsampling round differently), the EXIF orientation applied as `PIL.ImageOps.exif_transpose` does (with its
//! fallback to an XMP `tiff:Orientation`), transparency composited over white with
//! `PIL.Image.alpha_composite`'s integer rounding, grayscale expanded, and 16-bit samples
//! narrowed the way Pillow's PNG reader does.

use std::io::Cursor;

use image::metadata::Orientation;
use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, RgbImage};

use crate::Rgb8;

/// Limits on what [`decode`] accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most encoded bytes.
    pub max_bytes: usize,
    /// The most decoded pixels, width × height.
    pub max_pixels: u64,
}

impl Default for Limits {
    /// 20 MiB encoded, 50 megapixels decoded.
    fn default() -> Self {
        Limits {
            max_bytes: 20 << 20,
            max_pixels: 50_000_000,
        }
    }
}

/// Why an image could not be decoded; the messages are written for the user who sent it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImageError {
    #[error("the image is empty")]
    Empty,
    #[error("the image is {bytes} bytes; at most {max} bytes are accepted")]
    TooLarge { bytes: usize, max: usize },
    #[error("the image is {width}×{height} pixels; at most {max} pixels are accepted")]
    TooManyPixels { width: u32, height: u32, max: u64 },
    #[error("the image format is not supported: send PNG, JPEG, WebP or GIF")]
    UnsupportedFormat,
    #[error("the image could not be decoded: {0}")]
    Corrupt(String),
}

/// Bytes a decoder may allocate per pixel of the image: the widest decoded layout (16-bit
/// RGBA, 8 bytes) with room for a decoder's working copy.
const DECODER_BYTES_PER_PIXEL: u64 = 16;

/// Sniffs the format from magic bytes (PNG, JPEG, WebP, GIF — its first frame), decodes,
/// applies the EXIF orientation, and converts to RGB as transformers' `convert_to_rgb` does:
/// an image with alpha is composited over a white background, grayscale is expanded.
pub fn decode(bytes: &[u8], limits: &Limits) -> Result<Rgb8, ImageError> {
    if bytes.is_empty() {
        return Err(ImageError::Empty);
    }
    if bytes.len() > limits.max_bytes {
        return Err(ImageError::TooLarge {
            bytes: bytes.len(),
            max: limits.max_bytes,
        });
    }
    let decoded = match Format::sniff(bytes).ok_or(ImageError::UnsupportedFormat)? {
        // The decoder fills a cut-off JPEG in with gray; Pillow refuses it, and so do we.
        Format::Jpeg if !bytes.windows(2).any(|w| w == [0xFF, 0xD9]) => {
            return Err(ImageError::Corrupt(
                "the JPEG data ends early (it has no end marker)".into(),
            ))
        }
        Format::Jpeg => decode_with_image_crate(bytes, ImageFormat::Jpeg, limits)?,
        Format::Png => decode_with_image_crate(bytes, ImageFormat::Png, limits)?,
        Format::WebP => decode_with_image_crate(bytes, ImageFormat::WebP, limits)?,
        Format::Gif => decode_with_image_crate(bytes, ImageFormat::Gif, limits)?,
    };
    let orientation = orientation(decoded.exif.as_deref(), decoded.xmp.as_deref());
    Ok(orient(decoded.image, orientation))
}

/// A decoded image with the metadata that can orient it.
struct Decoded {
    image: Rgb8,
    /// EXIF data: a TIFF header and what follows, possibly behind `Exif\0\0`.
    exif: Option<Vec<u8>>,
    /// An XMP packet.
    xmp: Option<Vec<u8>>,
}

/// Decode with the `image` crate, keeping the EXIF and XMP metadata.
fn decode_with_image_crate(
    bytes: &[u8],
    format: ImageFormat,
    limits: &Limits,
) -> Result<Decoded, ImageError> {
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    let mut decoder_limits = image::Limits::default();
    decoder_limits.max_alloc = Some(limits.max_pixels.saturating_mul(DECODER_BYTES_PER_PIXEL));
    reader.limits(decoder_limits);
    let mut decoder = reader.into_decoder().map_err(corrupt)?;
    let (width, height) = decoder.dimensions();
    if u64::from(width) * u64::from(height) > limits.max_pixels {
        return Err(ImageError::TooManyPixels {
            width,
            height,
            max: limits.max_pixels,
        });
    }
    let exif = decoder.exif_metadata().map_err(corrupt)?;
    let xmp = decoder.xmp_metadata().map_err(corrupt)?;
    let image = DynamicImage::from_decoder(decoder).map_err(corrupt)?;
    Ok(Decoded {
        image: to_rgb(image),
        exif,
        xmp,
    })
}

/// The orientation `PIL.Image.getexif` reports: the EXIF tag if there is one, else the
/// first `tiff:Orientation` in the XMP packet.
fn orientation(exif: Option<&[u8]>, xmp: Option<&[u8]>) -> Orientation {
    let from_exif = exif.and_then(|exif| {
        let tiff = exif.strip_prefix(b"Exif\0\0").unwrap_or(exif);
        Orientation::from_exif_chunk(tiff)
    });
    from_exif
        .or_else(|| xmp.and_then(xmp_orientation))
        .unwrap_or(Orientation::NoTransforms)
}

fn xmp_orientation(xmp: &[u8]) -> Option<Orientation> {
    const TAG: &[u8] = b"tiff:Orientation";
    let mut rest = xmp;
    while let Some(found) = rest.windows(TAG.len()).position(|window| window == TAG) {
        rest = &rest[found + TAG.len()..];
        let digit = match rest {
            [b'=', b'"', digit, ..] | [b'>', digit, ..] if digit.is_ascii_digit() => *digit,
            _ => continue,
        };
        return Orientation::from_exif(digit - b'0');
    }
    None
}

fn orient(image: Rgb8, orientation: Orientation) -> Rgb8 {
    if orientation == Orientation::NoTransforms {
        return image;
    }
    let buffer = RgbImage::from_raw(image.width, image.height, image.data)
        .expect("decoded images hold width × height pixels");
    let mut oriented = DynamicImage::ImageRgb8(buffer);
    oriented.apply_orientation(orientation);
    let oriented = oriented.into_rgb8();
    Rgb8 {
        width: oriented.width(),
        height: oriented.height(),
        data: oriented.into_raw(),
    }
}

fn corrupt(error: image::ImageError) -> ImageError {
    ImageError::Corrupt(error.to_string())
}

/// The media type the bytes' magic says: `image/png`, `image/jpeg`, `image/webp` or
/// `image/gif`; `None` for anything else.
pub fn media_type(bytes: &[u8]) -> Option<&'static str> {
    Format::sniff(bytes).map(Format::media_type)
}

/// The formats [`decode`] accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Png,
    Jpeg,
    WebP,
    Gif,
}

impl Format {
    fn sniff(bytes: &[u8]) -> Option<Self> {
        if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some(Format::Png)
        } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
            Some(Format::Jpeg)
        } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
            Some(Format::Gif)
        } else if bytes.len() >= 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP" {
            Some(Format::WebP)
        } else {
            None
        }
    }

    fn media_type(self) -> &'static str {
        match self {
            Format::Png => "image/png",
            Format::Jpeg => "image/jpeg",
            Format::WebP => "image/webp",
            Format::Gif => "image/gif",
        }
    }
}

/// Pillow's modes as RGB: 16-bit colour and alpha keep their high byte (Pillow reads PNGs'
/// `RGB;16B`, `RGBA;16B` and `LA;16B` that way); 16-bit grayscale opens as `I;16`, whose
/// conversion to RGB clips at 255 rather than scaling.
fn to_rgb(image: DynamicImage) -> Rgb8 {
    let (width, height) = (image.width(), image.height());
    let data = match image {
        DynamicImage::ImageRgb8(rgb) => rgb.into_raw(),
        DynamicImage::ImageLuma8(gray) => gray.into_raw().iter().flat_map(|&v| [v; 3]).collect(),
        DynamicImage::ImageRgba8(rgba) => rgba
            .as_raw()
            .chunks_exact(4)
            .flat_map(|p| over_white([p[0], p[1], p[2]], p[3]))
            .collect(),
        DynamicImage::ImageLumaA8(gray_alpha) => gray_alpha
            .as_raw()
            .chunks_exact(2)
            .flat_map(|p| over_white([p[0]; 3], p[1]))
            .collect(),
        DynamicImage::ImageRgb16(rgb) => rgb.as_raw().iter().map(|&v| high_byte(v)).collect(),
        DynamicImage::ImageLuma16(gray) => gray
            .as_raw()
            .iter()
            .flat_map(|&v| [v.min(255) as u8; 3])
            .collect(),
        DynamicImage::ImageRgba16(rgba) => rgba
            .as_raw()
            .chunks_exact(4)
            .flat_map(|p| over_white([p[0], p[1], p[2]].map(high_byte), high_byte(p[3])))
            .collect(),
        DynamicImage::ImageLumaA16(gray_alpha) => gray_alpha
            .as_raw()
            .chunks_exact(2)
            .flat_map(|p| over_white([high_byte(p[0]); 3], high_byte(p[1])))
            .collect(),
        // Floating-point layouts come only from codecs this crate does not enable.
        other => other.to_rgb8().into_raw(),
    };
    Rgb8 {
        width,
        height,
        data,
    }
}

fn high_byte(sample: u16) -> u8 {
    (sample >> 8) as u8
}

/// Bits of fraction in `PIL.Image.alpha_composite`'s fixed-point blend.
const COMPOSITE_PRECISION_BITS: u32 = 7;

/// One pixel composited over opaque white with Pillow's integer arithmetic
/// (`ImagingAlphaComposite`): with an opaque background the source weight is `alpha << 7`
/// and the background's `(255 - alpha) << 7`, and the sum is divided by 255 with rounding by
/// Pillow's shift trick.
pub(crate) fn over_white(rgb: [u8; 3], alpha: u8) -> [u8; 3] {
    if alpha == 0 {
        return [255; 3];
    }
    let source_weight = u32::from(alpha) << COMPOSITE_PRECISION_BITS;
    let white_weight = (255 << COMPOSITE_PRECISION_BITS) - source_weight;
    rgb.map(|channel| {
        let blended = u32::from(channel) * source_weight
            + 255 * white_weight
            + (0x80 << COMPOSITE_PRECISION_BITS);
        let divided_by_255 = ((blended >> 8) + blended) >> 8;
        (divided_by_255 >> COMPOSITE_PRECISION_BITS) as u8
    })
}

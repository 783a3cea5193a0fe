//! Images for vision-language models: decoding what a request sends (PNG, JPEG, WebP, GIF)
//! into 8-bit RGB ([`decode`], [`Rgb8`]) and turning that into the pixel tensor a model's
//! vision tower takes ([`Preprocessor::pixels`], [`Pixels`]), bit for bit what the Hugging
//! Face image processors' PIL backend gives for the same file and `preprocessor_config.json`
//! (a JPEG's decoded samples may differ from libjpeg-turbo's by a few levels: [`decode`]).
//!
//! The steps follow transformers: `load_image` applies the EXIF orientation, `convert_to_rgb`
//! composites transparency over white, Pillow's resampling resizes (reimplemented here in
//! [`resample`], fixed point included), and the rescale and normalisation keep numpy's
//! float64/float32 order of operations. [`digest`] keys caches of the results by content.
//!
//! ```no_run
//! use seedbar_images::{decode, Limits, Preprocessor};
//! # fn demo(bytes: &[u8]) -> Result<(), Box<dyn std::error::Error>> {
//! let preprocessor = Preprocessor::read("model/preprocessor_config.json".as_ref())?;
//! let image = decode(bytes, &Limits::default())?;
//! let pixels = preprocessor.pixels(&image)?; // [3, height, width] float32
//! assert_eq!(pixels.data.len(), 3 * pixels.height * pixels.width);
//! # Ok(()) }
//! ```

mod decode;
mod preprocess;
pub mod resample;

#[cfg(test)]
mod tests;

pub use decode::{decode, media_type, ImageError, Limits};
pub use preprocess::{ConfigError, PixelBudget, Pixels, Preprocessor, Resize, Size, SizeError};
pub use resample::Filter;

use sha2::{Digest, Sha256};

/// An image decoded to 8-bit RGB, row-major, 3 bytes a pixel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rgb8 {
    pub width: u32,
    pub height: u32,
    pub data: Vec<u8>,
}

/// A content digest of the encoded bytes (SHA-256), to key caches of decoded or preprocessed
/// images.
pub fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

//! A model's `preprocessor_config.json` ([`Preprocessor`]) and the pixel tensor it makes of
//! an image ([`Pixels`]): resize with Pillow's filters, then rescale and normalise with the
//! float types and order of transformers' PIL backend — the rescale multiplies in float64
//! and rounds to float32 (`image_transforms.rescale`), the normalisation subtracts the mean
//! and divides by the standard deviation in float32 (`image_transforms.normalize`).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::resample::{resize, Filter};
use crate::Rgb8;

/// The output size of a resize, in pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct Size {
    pub height: u32,
    pub width: u32,
}

/// What a model's `preprocessor_config.json` says about resizing and normalising. Keys the
/// file leaves out take transformers' usual defaults: every step on, `rescale_factor` 1/255.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Preprocessor {
    /// The fixed output size (`{"height": …, "width": …}`).
    pub size: Size,
    /// Pillow's filter code: 2 bilinear, 3 bicubic.
    pub resample: Filter,
    #[serde(default = "enabled")]
    pub do_resize: bool,
    #[serde(default = "enabled")]
    pub do_rescale: bool,
    #[serde(default = "one_255th")]
    pub rescale_factor: f64,
    #[serde(default = "enabled")]
    pub do_normalize: bool,
    pub image_mean: [f64; 3],
    pub image_std: [f64; 3],
}

fn enabled() -> bool {
    true
}

fn one_255th() -> f64 {
    1.0 / 255.0
}

/// Why a `preprocessor_config.json` could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the image preprocessor config is not usable: {0}")]
    Invalid(#[from] serde_json::Error),
    #[error("the image preprocessor config asks for an empty size {width}×{height}")]
    EmptySize { width: u32, height: u32 },
}

/// Pixel values channel-first, `[3, height, width]` float32, as the HF processor's
/// `pixel_values[0]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Pixels {
    pub height: usize,
    pub width: usize,
    pub data: Vec<f32>,
}

impl Preprocessor {
    /// Reads a `preprocessor_config.json`.
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let json = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_json(&json)
    }

    /// Parses the text of a `preprocessor_config.json`; keys it does not use are ignored.
    pub fn from_json(json: &str) -> Result<Self, ConfigError> {
        let preprocessor: Preprocessor = serde_json::from_str(json)?;
        let Size { width, height } = preprocessor.size;
        if width == 0 || height == 0 {
            return Err(ConfigError::EmptySize { width, height });
        }
        Ok(preprocessor)
    }

    /// The pixel tensor for `image`: resized (if `do_resize`), rescaled, normalised.
    pub fn pixels(&self, image: &Rgb8) -> Pixels {
        let resized;
        let image = if self.do_resize {
            resized = resize(image, self.size.width, self.size.height, self.resample);
            &resized
        } else {
            image
        };
        let values = self.byte_values();
        let plane = image.width as usize * image.height as usize;
        let mut data = vec![0.0; 3 * plane];
        for (channel, channel_plane) in data.chunks_exact_mut(plane).enumerate() {
            let samples = image.data.iter().skip(channel).step_by(3);
            for (value, &sample) in channel_plane.iter_mut().zip(samples) {
                *value = values[channel][usize::from(sample)];
            }
        }
        Pixels {
            height: image.height as usize,
            width: image.width as usize,
            data,
        }
    }

    /// The value each byte becomes in each channel; every pixel goes through the same
    /// arithmetic, so a table of 3 × 256 holds all of it.
    fn byte_values(&self) -> [[f32; 256]; 3] {
        std::array::from_fn(|channel| {
            let mean = self.image_mean[channel] as f32;
            let std = self.image_std[channel] as f32;
            std::array::from_fn(|byte| {
                let value = if self.do_rescale {
                    (byte as f64 * self.rescale_factor) as f32
                } else {
                    byte as f32
                };
                if self.do_normalize {
                    (value - mean) / std
                } else {
                    value
                }
            })
        })
    }
}

//! A model's `preprocessor_config.json` ([`Preprocessor`]) and the pixel tensor it makes of
//! an image ([`Pixels`]): resize with Pillow's filters, then rescale and normalise with the
//! float types and order of transformers' PIL backend — the rescale multiplies in float64
//! and rounds to float32 (`image_transforms.rescale`), the normalisation subtracts the mean
//! and divides by the standard deviation in float32 (`image_transforms.normalize`).
//!
//! The size is fixed (SigLIP's `size: {height, width}`) or follows the image within a pixel
//! budget (Qwen2-VL's `min_pixels`/`max_pixels`: each side rounded to a multiple of the
//! patch grid, [`PixelBudget::size_of`]).

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

/// The output size of a resize: fixed, or the image's own within a pixel budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resize {
    Fixed(Size),
    Budget(PixelBudget),
}

/// Qwen2-VL's dynamic resolution (transformers' `smart_resize`): both sides multiples of
/// `factor` (a patch times the merge size), the area within `min_pixels..=max_pixels`, the
/// aspect ratio kept as closely as that allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PixelBudget {
    pub factor: u32,
    pub min_pixels: u64,
    pub max_pixels: u64,
}

/// The widest aspect ratio a pixel budget takes (transformers refuses wider images).
const MAX_ASPECT: u32 = 200;

impl PixelBudget {
    /// The size an image of `width`×`height` is resized to; an error for an image more than
    /// 200 times as wide as high (or the reverse).
    pub fn size_of(&self, width: u32, height: u32) -> Result<Size, SizeError> {
        let (w, h) = (u64::from(width.max(1)), u64::from(height.max(1)));
        if w.max(h) > u64::from(MAX_ASPECT) * w.min(h) {
            return Err(SizeError::Aspect { width, height });
        }
        let f = f64::from(self.factor);
        let at_least_one = |units: f64| (units.max(1.0) as u32) * self.factor;
        // Python's `round` (ties to even), as transformers rounds: a side under half a
        // factor rounds to 0, and the minimum then scales the picture up.
        let (mut hb, mut wb) = (
            (h as f64 / f).round_ties_even() as u32 * self.factor,
            (w as f64 / f).round_ties_even() as u32 * self.factor,
        );
        let area = |a: u32, b: u32| u64::from(a) * u64::from(b);
        if area(hb, wb) > self.max_pixels {
            let beta = ((h * w) as f64 / self.max_pixels as f64).sqrt();
            hb = at_least_one((h as f64 / beta / f).floor());
            wb = at_least_one((w as f64 / beta / f).floor());
        } else if area(hb, wb) < self.min_pixels {
            let beta = (self.min_pixels as f64 / (h * w) as f64).sqrt();
            hb = at_least_one((h as f64 * beta / f).ceil());
            wb = at_least_one((w as f64 * beta / f).ceil());
        }
        Ok(Size {
            height: hb.max(self.factor),
            width: wb.max(self.factor),
        })
    }
}

/// Why an image cannot be resized as a model's processor asks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("the image is {width}x{height} pixels; this model takes images at most {MAX_ASPECT} times as wide as high (or as high as wide)")]
    Aspect { width: u32, height: u32 },
}

/// What a model's `preprocessor_config.json` says about resizing and normalising. Keys the
/// file leaves out take transformers' usual defaults: every step on, `rescale_factor` 1/255,
/// bicubic resampling.
#[derive(Debug, Clone, PartialEq)]
pub struct Preprocessor {
    pub resize: Resize,
    /// Pillow's filter code: 2 bilinear, 3 bicubic.
    pub resample: Filter,
    pub do_resize: bool,
    pub do_rescale: bool,
    pub rescale_factor: f64,
    pub do_normalize: bool,
    pub image_mean: [f64; 3],
    pub image_std: [f64; 3],
}

/// The file's keys, before the size is settled.
#[derive(Deserialize)]
struct Config {
    #[serde(default)]
    size: Option<serde_json::Value>,
    #[serde(default)]
    min_pixels: Option<u64>,
    #[serde(default)]
    max_pixels: Option<u64>,
    #[serde(default)]
    patch_size: Option<u32>,
    #[serde(default)]
    merge_size: Option<u32>,
    #[serde(default = "bicubic")]
    resample: Filter,
    #[serde(default = "enabled")]
    do_resize: bool,
    #[serde(default = "enabled")]
    do_rescale: bool,
    #[serde(default = "one_255th")]
    rescale_factor: f64,
    #[serde(default = "enabled")]
    do_normalize: bool,
    image_mean: [f64; 3],
    image_std: [f64; 3],
}

fn enabled() -> bool {
    true
}

fn one_255th() -> f64 {
    1.0 / 255.0
}

fn bicubic() -> Filter {
    Filter::Bicubic
}

impl Config {
    /// A fixed `size`, or Qwen2-VL's budget (a `patch_size` and `merge_size`, the bounds
    /// from `min_pixels`/`max_pixels` or `size`'s `shortest_edge`/`longest_edge`, which
    /// newer files write, else transformers' defaults).
    fn resize(&self) -> Result<Resize, ConfigError> {
        let edge = |key: &str| {
            self.size
                .as_ref()
                .and_then(|s| s.get(key))
                .and_then(serde_json::Value::as_u64)
        };
        if let (Some(patch), Some(merge)) = (self.patch_size, self.merge_size) {
            let budget = PixelBudget {
                factor: patch * merge,
                min_pixels: self.min_pixels.or(edge("shortest_edge")).unwrap_or(56 * 56),
                max_pixels: self
                    .max_pixels
                    .or(edge("longest_edge"))
                    .unwrap_or(28 * 28 * 1280),
            };
            if budget.factor == 0 || budget.min_pixels > budget.max_pixels {
                return Err(ConfigError::Budget(budget));
            }
            return Ok(Resize::Budget(budget));
        }
        let size: Size = serde_json::from_value(self.size.clone().unwrap_or_default())?;
        if size.width == 0 || size.height == 0 {
            return Err(ConfigError::EmptySize {
                width: size.width,
                height: size.height,
            });
        }
        Ok(Resize::Fixed(size))
    }
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
    #[error("the image preprocessor config's pixel budget is not usable: {0:?}")]
    Budget(PixelBudget),
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
        let config: Config = serde_json::from_str(json)?;
        Ok(Preprocessor {
            resize: config.resize()?,
            resample: config.resample,
            do_resize: config.do_resize,
            do_rescale: config.do_rescale,
            rescale_factor: config.rescale_factor,
            do_normalize: config.do_normalize,
            image_mean: config.image_mean,
            image_std: config.image_std,
        })
    }

    /// The size [`pixels`](Self::pixels) gives an image of `width`×`height`.
    pub fn size_of(&self, width: u32, height: u32) -> Result<Size, SizeError> {
        match self.resize {
            _ if !self.do_resize => Ok(Size { height, width }),
            Resize::Fixed(size) => Ok(size),
            Resize::Budget(budget) => budget.size_of(width, height),
        }
    }

    /// The pixel tensor for `image`: resized (if `do_resize`), rescaled, normalised.
    pub fn pixels(&self, image: &Rgb8) -> Result<Pixels, SizeError> {
        let Size { width, height } = self.size_of(image.width, image.height)?;
        let resized;
        let image = if (width, height) != (image.width, image.height) {
            resized = resize(image, width, height, self.resample);
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
        Ok(Pixels {
            height: image.height as usize,
            width: image.width as usize,
            data,
        })
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

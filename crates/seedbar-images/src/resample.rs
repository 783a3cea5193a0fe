//! Pillow's resampling of 8-bit images (`Image.resize`, `ImagingResample` in libImaging),
//! reimplemented so that the bytes come out the same: per-axis coefficients computed in
//! double precision, normalised to sum 1 and then turned into 22-bit fixed point, a
//! horizontal pass over only the source rows the vertical pass reads, then the vertical
//! pass (the other way round where Pillow 13 does: [`vertical_first`]); an axis whose size
//! does not change is not resampled.

use serde::Deserialize;

use crate::Rgb8;

/// A resampling filter, by the code Pillow and `preprocessor_config.json` give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "u8")]
pub enum Filter {
    /// `PIL.Image.Resampling.BILINEAR` (2): a triangle of support 1.
    Bilinear,
    /// `PIL.Image.Resampling.BICUBIC` (3): Keys' cubic with a = -0.5, support 2.
    Bicubic,
}

impl TryFrom<u8> for Filter {
    type Error = String;

    fn try_from(code: u8) -> Result<Self, Self::Error> {
        match code {
            2 => Ok(Filter::Bilinear),
            3 => Ok(Filter::Bicubic),
            other => Err(format!(
                "resample {other} is not supported: use 2 (bilinear) or 3 (bicubic)"
            )),
        }
    }
}

/// The bicubic filter's `a`.
const BICUBIC_A: f64 = -0.5;

impl Filter {
    /// How far from its center the filter reaches, in source pixels at scale 1.
    fn support(self) -> f64 {
        match self {
            Filter::Bilinear => 1.0,
            Filter::Bicubic => 2.0,
        }
    }

    /// The filter's weight at distance `x`, evaluated in Pillow's order of operations.
    fn weight(self, x: f64) -> f64 {
        let x = x.abs();
        match self {
            Filter::Bilinear if x < 1.0 => 1.0 - x,
            Filter::Bicubic if x < 1.0 => ((BICUBIC_A + 2.0) * x - (BICUBIC_A + 3.0)) * x * x + 1.0,
            Filter::Bicubic if x < 2.0 => (((x - 5.0) * x + 8.0) * x - 4.0) * BICUBIC_A,
            _ => 0.0,
        }
    }
}

/// Fraction bits of the fixed-point weights: 8 bits of result, 2 for overflow of the
/// accumulator (filters have negative lobes), the rest of an `i32`.
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// One half in that fixed point, where every weighted sum starts.
const HALF: i32 = 1 << (PRECISION_BITS - 1);

/// The weights of one axis: for each output position, the first source index it reads, how
/// many it reads, and that many fixed-point weights (at `position * window_capacity`).
struct AxisWeights {
    windows: Vec<(usize, usize)>,
    window_capacity: usize,
    weights: Vec<i32>,
}

impl AxisWeights {
    /// Pillow's `precompute_coeffs` followed by `normalize_coeffs_8bpc`.
    fn new(in_size: usize, out_size: usize, filter: Filter) -> Self {
        let scale = in_size as f64 / out_size as f64;
        let filter_scale = scale.max(1.0);
        let support = filter.support() * filter_scale;
        let window_capacity = support.ceil() as usize * 2 + 1;
        let inverse_filter_scale = 1.0 / filter_scale;

        let mut windows = Vec::with_capacity(out_size);
        let mut weights = vec![0; out_size * window_capacity];
        let mut window = Vec::with_capacity(window_capacity);
        for (position, fixed) in weights.chunks_exact_mut(window_capacity).enumerate() {
            let center = (position as f64 + 0.5) * scale;
            // Truncation toward zero, as C's `(int)` cast; then clamped to the image.
            let first = ((center - support + 0.5) as i64).max(0) as usize;
            let end = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
            window.clear();
            window.extend((first..end).map(|source| {
                filter.weight((source as f64 - center + 0.5) * inverse_filter_scale)
            }));
            let total: f64 = window.iter().sum();
            for (slot, &weight) in fixed.iter_mut().zip(&window) {
                let normalized = if total != 0.0 { weight / total } else { weight };
                *slot = to_fixed_point(normalized);
            }
            windows.push((first, end - first));
        }
        AxisWeights {
            windows,
            window_capacity,
            weights,
        }
    }

    fn window(&self, position: usize) -> (usize, &[i32]) {
        let (first, len) = self.windows[position];
        let start = position * self.window_capacity;
        (first, &self.weights[start..start + len])
    }
}

/// Rounds half away from zero, as Pillow's `(int)(±0.5 + w * (1 << PRECISION_BITS))`.
fn to_fixed_point(weight: f64) -> i32 {
    let scaled = weight * f64::from(1u32 << PRECISION_BITS);
    if weight < 0.0 {
        (-0.5 + scaled) as i32
    } else {
        (0.5 + scaled) as i32
    }
}

/// A fixed-point sum back to a byte: shifted down and clipped. Sums start at [`HALF`],
/// so the shift rounds.
fn to_byte(sum: i32) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Whether Pillow 13 resizes `in_w`×`in_h` to `out_w`×`out_h` vertical pass first: where the
/// height shrinks, by more than twice as many pixels as the width does ("If height is scaled
/// down significantly more than width, resize vertically first"). Found against Pillow 13.0
/// itself (`tests/test_image_processor.py` checks it on every order that changes the bytes).
fn vertical_first(in_w: u32, in_h: u32, out_w: u32, out_h: u32) -> bool {
    let shrink = |from: u32, to: u32| i64::from(from) - i64::from(to);
    out_h < in_h && shrink(in_h, out_h) > 2 * shrink(in_w, out_w)
}

/// Resizes an RGB image to `width` × `height` with Pillow's bytes.
///
/// # Panics
/// If `width` or `height` is zero (Pillow refuses them too).
pub fn resize(image: &Rgb8, width: u32, height: u32, filter: Filter) -> Rgb8 {
    assert!(width > 0 && height > 0, "cannot resize to {width}×{height}");
    let (in_width, in_height) = (image.width as usize, image.height as usize);
    let (out_width, out_height) = (width as usize, height as usize);
    let resize_rows = out_width != in_width;
    let resize_columns = out_height != in_height;

    let horizontal = AxisWeights::new(in_width, out_width, filter);
    let vertical = AxisWeights::new(in_height, out_height, filter);
    if resize_rows && resize_columns && vertical_first(image.width, image.height, width, height) {
        let data = resample_columns(&image.data, in_width, 0, &vertical, out_height);
        let shortened = Rgb8 {
            width: image.width,
            height,
            data,
        };
        return Rgb8 {
            width,
            height,
            data: resample_rows(&shortened, 0..out_height, out_width, &horizontal),
        };
    }
    // The horizontal pass resamples only the source rows the vertical pass reads.
    let first_row = vertical.windows[0].0;
    let (last_first, last_len) = vertical.windows[out_height - 1];
    let rows = if resize_rows && resize_columns {
        first_row..last_first + last_len
    } else {
        0..in_height
    };

    let horizontal_output;
    let mut source = &image.data[..];
    let mut row_offset = 0;
    if resize_rows {
        horizontal_output = resample_rows(image, rows.clone(), out_width, &horizontal);
        source = &horizontal_output;
        row_offset = rows.start;
    }
    let data = if resize_columns {
        resample_columns(source, out_width, row_offset, &vertical, out_height)
    } else {
        source.to_vec()
    };
    Rgb8 {
        width,
        height,
        data,
    }
}

/// The horizontal pass over `rows` of `image`, by `weights` (its columns to `out_width`).
fn resample_rows(
    image: &Rgb8,
    rows: std::ops::Range<usize>,
    out_width: usize,
    weights: &AxisWeights,
) -> Vec<u8> {
    let in_stride = image.width as usize * 3;
    let mut output = Vec::with_capacity(rows.len() * out_width * 3);
    for row in rows {
        let source = &image.data[row * in_stride..(row + 1) * in_stride];
        for column in 0..out_width {
            let (first, window) = weights.window(column);
            let pixels = source[first * 3..].chunks_exact(3);
            let mut sums = [HALF; 3];
            for (pixel, &weight) in pixels.zip(window) {
                for (sum, &sample) in sums.iter_mut().zip(pixel) {
                    *sum += i32::from(sample) * weight;
                }
            }
            output.extend(sums.map(to_byte));
        }
    }
    output
}

/// The vertical pass over `source`, rows of `width` RGB pixels whose first row is source
/// row `row_offset`.
fn resample_columns(
    source: &[u8],
    width: usize,
    row_offset: usize,
    weights: &AxisWeights,
    out_height: usize,
) -> Vec<u8> {
    let stride = width * 3;
    let mut output = Vec::with_capacity(out_height * stride);
    let mut sums = vec![HALF; stride];
    for row in 0..out_height {
        let (first, window) = weights.window(row);
        let first = first - row_offset;
        sums.fill(HALF);
        for (source_row, &weight) in source[first * stride..].chunks_exact(stride).zip(window) {
            for (sum, &sample) in sums.iter_mut().zip(source_row) {
                *sum += i32::from(sample) * weight;
            }
        }
        output.extend(sums.iter().map(|&sum| to_byte(sum)));
    }
    output
}

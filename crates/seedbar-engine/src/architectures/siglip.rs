//! SigLIP's vision encoder, Gemma 3's image tower: the image cut into square patches, each
//! embedded by one product (the checkpoint's convolution, whose stride is its size), learnt
//! position embeddings, pre-norm encoder layers (LayerNorm, attention of every patch to every
//! patch, a GELU-tanh MLP) and a final LayerNorm. An image is encoded alone, at the size its
//! processor fixes, so its features are a function of its pixels only.

use mlx_rs::{Array, Dtype};
use seedbar_images::Pixels;
use serde::Deserialize;

use crate::{
    error::{EngineError, Result},
    layers::{LayerNorm, SelfAttention},
    step::plan::Products,
    weights::{Linear, Matrix, WeightMap},
};

/// `vision_config` of a checkpoint (Hugging Face's `SiglipVisionConfig` defaults).
#[derive(Debug, Clone, Deserialize)]
pub struct SiglipConfig {
    #[serde(default = "defaults::hidden")]
    pub hidden_size: i32,
    #[serde(default = "defaults::intermediate")]
    pub intermediate_size: i32,
    #[serde(default = "defaults::layers")]
    pub num_hidden_layers: i32,
    #[serde(default = "defaults::heads")]
    pub num_attention_heads: i32,
    #[serde(default = "defaults::patch")]
    pub patch_size: i32,
    #[serde(default = "defaults::image")]
    pub image_size: i32,
    #[serde(default = "defaults::channels")]
    pub num_channels: i32,
    #[serde(default = "defaults::eps")]
    pub layer_norm_eps: f32,
}

mod defaults {
    pub fn hidden() -> i32 {
        768
    }
    pub fn intermediate() -> i32 {
        3072
    }
    pub fn layers() -> i32 {
        12
    }
    pub fn heads() -> i32 {
        12
    }
    pub fn patch() -> i32 {
        16
    }
    pub fn image() -> i32 {
        224
    }
    pub fn channels() -> i32 {
        3
    }
    pub fn eps() -> f32 {
        1e-6
    }
}

impl SiglipConfig {
    /// Patches along each side of the image.
    pub fn patches_per_side(&self) -> i32 {
        self.image_size / self.patch_size
    }

    fn check(&self) -> Result<()> {
        let sizes = [
            self.hidden_size,
            self.intermediate_size,
            self.num_hidden_layers,
            self.num_attention_heads,
            self.patch_size,
            self.image_size,
        ];
        if sizes.iter().any(|&s| s <= 0)
            || self.num_channels != 3
            || self.hidden_size % self.num_attention_heads != 0
            || self.image_size % self.patch_size != 0
        {
            return Err(EngineError::bad_file(
                "config.json",
                format!("vision_config is not a SigLIP tower Seedbar runs: {self:?}"),
            ));
        }
        Ok(())
    }
}

/// One pre-norm encoder layer.
struct Layer {
    norm1: LayerNorm,
    attention: SelfAttention,
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

impl Layer {
    fn forward(&self, x: &Array) -> Result<Array> {
        let h = x.add(self.attention.forward(&self.norm1.forward(x)?, None)?)?;
        let up = self
            .fc1
            .forward(&self.norm2.forward(&h)?, Products::Matmul)?;
        let mlp = self
            .fc2
            .forward(&mlx_rs::nn::gelu_approximate(&up)?, Products::Matmul)?;
        Ok(h.add(mlp)?)
    }
}

/// The loaded tower.
pub struct Siglip {
    config: SiglipConfig,
    /// The patch convolution as a product over a patch's `(row, column, channel)` values.
    patch: Linear,
    /// `[patches, D]`.
    positions: Array,
    layers: Vec<Layer>,
    post_norm: LayerNorm,
    dtype: Dtype,
}

impl Siglip {
    /// The tower stored under `prefix` (`vision_tower.vision_model`).
    pub fn load(config: SiglipConfig, weights: &mut WeightMap, prefix: &str) -> Result<Self> {
        config.check()?;
        let (d, ff, eps) = (
            config.hidden_size,
            config.intermediate_size,
            config.layer_norm_eps,
        );
        let p = config.patch_size;
        let patch_name = format!("{prefix}.embeddings.patch_embedding");
        let kernel = patch_kernel(weights.take(&format!("{patch_name}.weight"))?, d, p)?
            .as_dtype(weights.compute_dtype())?;
        // Now, on the loading thread: the engine thread cannot run its work.
        kernel.eval()?;
        let patch = Linear {
            weight: Matrix::Dense(kernel),
            bias: Some(weights.vector(&format!("{patch_name}.bias"), d)?),
        };
        let count = config.patches_per_side() * config.patches_per_side();
        let positions = weights.dense(
            &format!("{prefix}.embeddings.position_embedding.weight"),
            &[count, d],
        )?;
        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                let at = |name: &str| format!("{prefix}.encoder.layers.{i}.{name}");
                Ok(Layer {
                    norm1: LayerNorm::load(weights, &at("layer_norm1"), d, eps)?,
                    attention: SelfAttention::load(
                        weights,
                        [
                            &at("self_attn.q_proj"),
                            &at("self_attn.k_proj"),
                            &at("self_attn.v_proj"),
                            &at("self_attn.out_proj"),
                        ],
                        d,
                        config.num_attention_heads,
                    )?,
                    norm2: LayerNorm::load(weights, &at("layer_norm2"), d, eps)?,
                    fc1: weights.linear(&at("mlp.fc1"), d, ff, true)?,
                    fc2: weights.linear(&at("mlp.fc2"), ff, d, true)?,
                })
            })
            .collect::<Result<_>>()?;
        let post_norm = LayerNorm::load(weights, &format!("{prefix}.post_layernorm"), d, eps)?;
        Ok(Siglip {
            dtype: weights.compute_dtype(),
            config,
            patch,
            positions,
            layers,
            post_norm,
        })
    }

    /// The last hidden states of `pixels` (`[1, patches, D]`, patches row by row).
    pub fn forward(&self, pixels: &Pixels) -> Result<Array> {
        let side = self.config.image_size as usize;
        if pixels.height != side || pixels.width != side {
            return Err(EngineError::InvalidRequest(format!(
                "the image is {}x{} pixels; this model's tower takes {side}x{side}",
                pixels.width, pixels.height
            )));
        }
        let p = self.config.patch_size as usize;
        let patches = patch_rows(pixels, p);
        let n = (side / p) * (side / p);
        let x =
            Array::from_slice(&patches, &[1, n as i32, (p * p * 3) as i32]).as_dtype(self.dtype)?;
        let mut h = self
            .patch
            .forward(&x, Products::Matmul)?
            .add(&self.positions)?;
        for layer in &self.layers {
            h = layer.forward(&h)?;
        }
        self.post_norm.forward(&h)
    }
}

/// The patch convolution's kernel as a `[D, p * p * 3]` matrix over `(row, column, channel)`:
/// MLX checkpoints store it `[D, p, p, 3]`, PyTorch ones `[D, 3, p, p]`.
fn patch_kernel(kernel: Array, d: i32, p: i32) -> Result<Array> {
    let kernel = match kernel.shape() {
        [o, kh, kw, 3] if *o == d && *kh == p && *kw == p => kernel,
        [o, 3, kh, kw] if *o == d && *kh == p && *kw == p => {
            kernel.transpose_axes(&[0, 2, 3, 1])?
        }
        shape => {
            return Err(EngineError::WrongShape {
                name: "patch_embedding.weight".into(),
                expected: vec![d, p, p, 3],
                actual: shape.to_vec(),
            })
        }
    };
    Ok(kernel.reshape(&[d, p * p * 3])?)
}

/// Each `p`×`p` patch of channel-first `pixels` as one row of `(row, column, channel)` values,
/// patches row by row: the convolution's input windows.
fn patch_rows(pixels: &Pixels, p: usize) -> Vec<f32> {
    let (h, w) = (pixels.height, pixels.width);
    let mut rows = Vec::with_capacity(3 * h * w);
    for py in 0..h / p {
        for px in 0..w / p {
            for ky in 0..p {
                for kx in 0..p {
                    let at = (py * p + ky) * w + px * p + kx;
                    rows.extend((0..3).map(|c| pixels.data[c * h * w + at]));
                }
            }
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_rows_are_the_convolutions_windows() {
        // A 4x4 image of 2x2 patches.
        let pixels = crate::architectures::numbered_pixels();
        let rows = patch_rows(&pixels, 2);
        assert_eq!(rows.len(), 48);
        // The second patch (top right): rows 0-1, columns 2-3, channels interleaved.
        let second = &rows[12..24];
        assert_eq!(
            second,
            &[2., 102., 202., 3., 103., 203., 12., 112., 212., 13., 113., 213.]
        );
    }
}

//! Qwen2.5-VL's vision tower: an image at its own resolution (a multiple of 28 pixels a side,
//! within the processor's pixel budget) cut into 14×14 patches, each embedded by one
//! product (the checkpoint's 3-D convolution over two copies of the image, its stride its
//! size); 2-D RoPE by each patch's row and column; pre-norm blocks (RMS norms, attention
//! within 8×8-patch windows except in the full-attention blocks, a SiLU-gated MLP with
//! biases); then the merger: each 2×2 of patches, RMS-normed, becomes one token of the
//! decoder's width through a GELU MLP. The decoder places those tokens on the image's grid
//! with multimodal RoPE (`step::positions`).
//!
//! Patches run in the processor's order: 2×2 blocks row by row, each block's four patches
//! row by row, so a block's patches are adjacent for the merger. Window attention reorders
//! whole blocks into 4×4-block windows and back. An image is encoded alone, so its tokens
//! are a function of its pixels only.

use mlx_rs::{
    fast::{self, ScaledDotProductAttentionMask},
    ops,
    ops::indexing::IndexOp,
    Array, Dtype,
};
use seedbar_images::Pixels;
use serde::Deserialize;

use super::decoder::RmsNorm;
use crate::{
    error::{EngineError, Result},
    layers::rotate_halves,
    step::plan::Products,
    weights::{Linear, Matrix, WeightMap},
};

/// `vision_config` of a Qwen2.5-VL checkpoint (transformers' defaults).
#[derive(Debug, Clone, Deserialize)]
pub struct TowerConfig {
    #[serde(default = "defaults::depth")]
    pub depth: usize,
    #[serde(default = "defaults::hidden")]
    pub hidden_size: i32,
    #[serde(default = "defaults::intermediate")]
    pub intermediate_size: i32,
    #[serde(default = "defaults::heads")]
    pub num_heads: i32,
    #[serde(default = "defaults::out_hidden")]
    pub out_hidden_size: i32,
    #[serde(default = "defaults::patch")]
    pub patch_size: i32,
    #[serde(default = "defaults::merge")]
    pub spatial_merge_size: i32,
    #[serde(default = "defaults::temporal")]
    pub temporal_patch_size: i32,
    #[serde(default = "defaults::window")]
    pub window_size: i32,
    #[serde(default = "defaults::full_attention")]
    pub fullatt_block_indexes: Vec<usize>,
}

mod defaults {
    pub fn depth() -> usize {
        32
    }
    pub fn hidden() -> i32 {
        1280
    }
    pub fn intermediate() -> i32 {
        3420
    }
    pub fn heads() -> i32 {
        16
    }
    pub fn out_hidden() -> i32 {
        3584
    }
    pub fn patch() -> i32 {
        14
    }
    pub fn merge() -> i32 {
        2
    }
    pub fn temporal() -> i32 {
        2
    }
    pub fn window() -> i32 {
        112
    }
    pub fn full_attention() -> Vec<usize> {
        vec![7, 15, 23, 31]
    }
}

impl TowerConfig {
    /// Pixels a side of one merged token (a patch times the merge size).
    pub fn token_side(&self) -> usize {
        (self.patch_size * self.spatial_merge_size) as usize
    }

    /// Merged tokens a side of one attention window.
    fn window_blocks(&self) -> usize {
        (self.window_size / self.spatial_merge_size / self.patch_size).max(1) as usize
    }

    fn check(&self) -> Result<()> {
        let sizes = [
            self.hidden_size,
            self.intermediate_size,
            self.num_heads,
            self.out_hidden_size,
            self.patch_size,
            self.spatial_merge_size,
            self.temporal_patch_size,
        ];
        let head_dim = self.hidden_size / self.num_heads.max(1);
        if sizes.iter().any(|&s| s <= 0)
            || self.depth == 0
            || self.hidden_size % self.num_heads != 0
            || head_dim % 4 != 0
        {
            return Err(EngineError::bad_file(
                "config.json",
                format!("vision_config is not a Qwen2.5-VL tower Seedbar runs: {self:?}"),
            ));
        }
        Ok(())
    }
}

/// One pre-norm block.
struct Block {
    norm1: RmsNorm,
    qkv: Linear,
    proj: Linear,
    norm2: RmsNorm,
    gate: Linear,
    up: Linear,
    down: Linear,
    /// Attends over the whole image, not within windows.
    full: bool,
}

/// The loaded tower.
pub struct Qwen2VlTower {
    config: TowerConfig,
    /// The patch convolution as a product over a patch's `(time, row, column, channel)`
    /// values.
    patch: Linear,
    blocks: Vec<Block>,
    merge_norm: RmsNorm,
    merge_in: Linear,
    merge_out: Linear,
    dtype: Dtype,
}

/// The weights' RMS norms take this epsilon (fixed in the model's code, not its config).
const NORM_EPS: f32 = 1e-6;

impl Qwen2VlTower {
    /// The tower stored under `prefix` (`vision_tower`).
    pub fn load(config: TowerConfig, weights: &mut WeightMap, prefix: &str) -> Result<Self> {
        config.check()?;
        let (d, ff) = (config.hidden_size, config.intermediate_size);
        let norm = |weights: &mut WeightMap, name: &str| {
            RmsNorm::load(weights, &format!("{name}.weight"), d, NORM_EPS, false)
        };
        let kernel = patch_kernel(
            weights.take(&format!("{prefix}.patch_embed.proj.weight"))?,
            &config,
        )?
        .as_dtype(weights.compute_dtype())?;
        // Now, on the loading thread: the engine thread cannot run its work.
        kernel.eval()?;
        let blocks = (0..config.depth)
            .map(|i| {
                let at = |name: &str| format!("{prefix}.blocks.{i}.{name}");
                Ok(Block {
                    norm1: norm(weights, &at("norm1"))?,
                    qkv: weights.linear(&at("attn.qkv"), d, 3 * d, true)?,
                    proj: weights.linear(&at("attn.proj"), d, d, true)?,
                    norm2: norm(weights, &at("norm2"))?,
                    gate: weights.linear(&at("mlp.gate_proj"), d, ff, true)?,
                    up: weights.linear(&at("mlp.up_proj"), d, ff, true)?,
                    down: weights.linear(&at("mlp.down_proj"), ff, d, true)?,
                    full: config.fullatt_block_indexes.contains(&i),
                })
            })
            .collect::<Result<_>>()?;
        let merged = d * config.spatial_merge_size * config.spatial_merge_size;
        Ok(Qwen2VlTower {
            merge_norm: norm(weights, &format!("{prefix}.merger.ln_q"))?,
            merge_in: weights.linear(&format!("{prefix}.merger.mlp.0"), merged, merged, true)?,
            merge_out: weights.linear(
                &format!("{prefix}.merger.mlp.2"),
                merged,
                config.out_hidden_size,
                true,
            )?,
            patch: Linear {
                weight: Matrix::Dense(kernel),
                bias: None,
            },
            blocks,
            dtype: weights.compute_dtype(),
            config,
        })
    }

    /// The merged grid `pixels` make: (rows, columns) of decoder tokens.
    pub fn grid(&self, pixels: &Pixels) -> Result<(usize, usize)> {
        let side = self.config.token_side();
        if !pixels.height.is_multiple_of(side)
            || !pixels.width.is_multiple_of(side)
            || pixels.height == 0
        {
            return Err(EngineError::InvalidRequest(format!(
                "the image is {}x{} pixels; this model's tower takes multiples of {side}",
                pixels.width, pixels.height
            )));
        }
        Ok((pixels.height / side, pixels.width / side))
    }

    /// The image's tokens, `[rows · columns, out_hidden_size]`, row by row of its grid.
    pub fn forward(&self, pixels: &Pixels) -> Result<Array> {
        let (rows, cols) = self.grid(pixels)?;
        let c = &self.config;
        let (p, m, t) = (
            c.patch_size as usize,
            c.spatial_merge_size as usize,
            c.temporal_patch_size as usize,
        );
        let n = rows * cols * m * m;
        let width = t * p * p * 3;
        let x = Array::from_slice(&patch_rows(pixels, p, m, t), &[n as i32, width as i32])
            .as_dtype(self.dtype)?;
        let h = self.patch.forward(&x, Products::Matmul)?;
        // Whole blocks of m·m patches into window order; the windows' token counts.
        let (order, windows) = window_order(rows, cols, c.window_blocks());
        let unit = (m * m) as i32;
        let d = c.hidden_size;
        let take_blocks = |a: &Array, order: &[i32]| -> Result<Array> {
            let width = a.shape()[1];
            let blocks = a.reshape(&[-1, unit, width])?;
            let picked = blocks.take_axis(Array::from_slice(order, &[order.len() as i32]), 0)?;
            Ok(picked.reshape(&[-1, width])?)
        };
        let mut h = take_blocks(&h, &order)?;
        let (cos, sin) = self.rotation(cols, &order)?;
        let window_lens: Vec<usize> = windows.iter().map(|w| w * (m * m)).collect();
        let whole = [n];
        for block in &self.blocks {
            let spans: &[usize] = if block.full { &whole } else { &window_lens };
            let attended = self.attend(block, &block.norm1.forward(&h)?, &cos, &sin, spans)?;
            h = h.add(attended)?;
            let x = block.norm2.forward(&h)?;
            let gate = block.gate.forward(&x, Products::Matmul)?;
            let up = block.up.forward(&x, Products::Matmul)?;
            let mlp = block
                .down
                .forward(&mlx_rs::nn::silu(&gate)?.multiply(&up)?, Products::Matmul)?;
            h = h.add(mlp)?;
        }
        let merged = self.merge_norm.forward(&h)?.reshape(&[-1, d * unit])?;
        let merged = mlx_rs::nn::gelu(&self.merge_in.forward(&merged, Products::Matmul)?)?;
        let merged = self.merge_out.forward(&merged, Products::Matmul)?;
        // Back to the grid's order: token `u` was the `order⁻¹[u]`-th in window order.
        let mut inverse = vec![0i32; order.len()];
        for (k, &u) in order.iter().enumerate() {
            inverse[u as usize] = k as i32;
        }
        Ok(merged.take_axis(Array::from_slice(&inverse, &[inverse.len() as i32]), 0)?)
    }

    /// The 2-D rotation of each patch (in window order) as cosines and sines
    /// (`[1, n, 1, head_dim / 2]`): the first half of the pairs by the patch's row, the
    /// second by its column, each at frequencies `10000^(-2j / (head_dim / 2))`.
    fn rotation(&self, cols: usize, order: &[i32]) -> Result<(Array, Array)> {
        let c = &self.config;
        let m = c.spatial_merge_size as usize;
        let quarter = (c.hidden_size / c.num_heads / 4) as usize;
        let inv_freqs: Vec<f32> = (0..quarter)
            .map(|j| 1.0 / 10_000f32.powf((2 * j) as f32 / (2 * quarter) as f32))
            .collect();
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for &u in order {
            let (block_row, block_col) = (u as usize / cols, u as usize % cols);
            for k in 0..m * m {
                let row = (block_row * m + k / m) as f32;
                let col = (block_col * m + k % m) as f32;
                for position in [row, col] {
                    for f in &inv_freqs {
                        let (s, c) = (position * f).sin_cos();
                        cos.push(c);
                        sin.push(s);
                    }
                }
            }
        }
        let n = (order.len() * m * m) as i32;
        let table =
            |v: &[f32]| Array::from_slice(v, &[1, n, 1, 2 * quarter as i32]).as_dtype(self.dtype);
        Ok((table(&cos)?, table(&sin)?))
    }

    /// Self-attention of `x` (`[n, D]`) within consecutive spans of `spans` tokens: spans of
    /// one length run as one batched call.
    fn attend(
        &self,
        block: &Block,
        x: &Array,
        cos: &Array,
        sin: &Array,
        spans: &[usize],
    ) -> Result<Array> {
        let c = &self.config;
        let (heads, d) = (c.num_heads, c.hidden_size);
        let head_dim = d / heads;
        let n = x.shape()[0];
        // `[1, n, heads, hd]`, rotated (rotation is per token and head).
        let qkv = block
            .qkv
            .forward(x, Products::Matmul)?
            .reshape(&[1, n, 3, heads, head_dim])?;
        let part = |k: i32| qkv.index((.., .., k, .., ..));
        let q = rotate_halves(&part(0), cos, sin, head_dim)?;
        let k = rotate_halves(&part(1), cos, sin, head_dim)?;
        let v = part(2);
        let scale = (head_dim as f32).powf(-0.5);
        let mut outs = Vec::new();
        let mut start = 0usize;
        let mut i = 0;
        while i < spans.len() {
            let len = spans[i];
            let same = spans[i..].iter().take_while(|&&l| l == len).count();
            let end = start + same * len;
            // `[same, heads, len, hd]`.
            let windows = |a: &Array| -> Result<Array> {
                Ok(a.index((.., start as i32..end as i32, .., ..))
                    .reshape(&[same as i32, len as i32, heads, head_dim])?
                    .transpose_axes(&[0, 2, 1, 3])?)
            };
            let out = fast::scaled_dot_product_attention(
                windows(&q)?,
                windows(&k)?,
                windows(&v)?,
                scale,
                None::<ScaledDotProductAttentionMask>,
                None,
            )?;
            outs.push(out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[-1, d])?);
            start = end;
            i += same;
        }
        let attended = ops::concatenate(&outs, 0)?;
        block.proj.forward(&attended, Products::Matmul)
    }
}

/// The patch convolution's kernel as a `[D, t·p·p·3]` matrix over `(time, row, column,
/// channel)`: MLX checkpoints store it `[D, t, p, p, 3]`, PyTorch ones `[D, 3, t, p, p]`.
fn patch_kernel(kernel: Array, c: &TowerConfig) -> Result<Array> {
    let (d, p, t) = (c.hidden_size, c.patch_size, c.temporal_patch_size);
    let kernel = match kernel.shape() {
        [o, kt, kh, kw, 3] if (*o, *kt, *kh, *kw) == (d, t, p, p) => kernel,
        [o, 3, kt, kh, kw] if (*o, *kt, *kh, *kw) == (d, t, p, p) => {
            kernel.transpose_axes(&[0, 2, 3, 4, 1])?
        }
        shape => {
            return Err(EngineError::WrongShape {
                name: "patch_embed.proj.weight".into(),
                expected: vec![d, t, p, p, 3],
                actual: shape.to_vec(),
            })
        }
    };
    Ok(kernel.reshape(&[d, t * p * p * 3])?)
}

/// Each `p`×`p` patch of channel-first `pixels` as one row of `(time, row, column,
/// channel)` values (the image repeated over `t` time steps, as the processor pads a still
/// image), in the processor's order: `m`×`m` blocks row by row, a block's patches row by row.
fn patch_rows(pixels: &Pixels, p: usize, m: usize, t: usize) -> Vec<f32> {
    let (h, w) = (pixels.height, pixels.width);
    let plane = h * w;
    let mut rows = Vec::with_capacity(3 * plane * t);
    for block_row in 0..h / (p * m) {
        for block_col in 0..w / (p * m) {
            for k in 0..m * m {
                let (y0, x0) = ((block_row * m + k / m) * p, (block_col * m + k % m) * p);
                for _ in 0..t {
                    for ky in 0..p {
                        for kx in 0..p {
                            let at = (y0 + ky) * w + x0 + kx;
                            rows.extend((0..3).map(|c| pixels.data[c * plane + at]));
                        }
                    }
                }
            }
        }
    }
    rows
}

/// The merged tokens (`rows × cols`, row by row) in window order — windows of
/// `side × side` tokens row by row, each window's tokens row by row — and each window's
/// token count (windows at the right and bottom edges are cut short).
fn window_order(rows: usize, cols: usize, side: usize) -> (Vec<i32>, Vec<usize>) {
    let mut order = Vec::with_capacity(rows * cols);
    let mut windows = Vec::new();
    for wr in (0..rows).step_by(side) {
        for wc in (0..cols).step_by(side) {
            let before = order.len();
            for r in wr..(wr + side).min(rows) {
                for c in wc..(wc + side).min(cols) {
                    order.push((r * cols + c) as i32);
                }
            }
            windows.push(order.len() - before);
        }
    }
    (order, windows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_cover_the_grid_in_blocks() {
        // A 3x5 grid in windows of 2x2: [0,1,5,6], [2,3,7,8], [4,9], [10,11], [12,13], [14].
        let (order, windows) = window_order(3, 5, 2);
        assert_eq!(order, [0, 1, 5, 6, 2, 3, 7, 8, 4, 9, 10, 11, 12, 13, 14]);
        assert_eq!(windows, [4, 4, 2, 2, 2, 1]);
    }

    #[test]
    fn patch_rows_follow_the_processors_block_order() {
        // A 4x4 image, patches of 1, blocks of 2x2, two time steps.
        let pixels = crate::architectures::numbered_pixels();
        let rows = patch_rows(&pixels, 1, 2, 2);
        assert_eq!(rows.len(), 16 * 2 * 3);
        let patch = |k: usize| &rows[k * 6..k * 6 + 3];
        // Block (0, 0): (0,0), (0,1), (1,0), (1,1); then block (0, 1) from (0, 2).
        assert_eq!(patch(2), [10., 110., 210.]);
        assert_eq!(patch(4), [2., 102., 202.]);
        // Block (1, 0)'s last patch: (3, 1). Each patch twice (two time steps).
        assert_eq!(patch(11), [31., 131., 231.]);
        assert_eq!(&rows[3..6], patch(0));
    }
}

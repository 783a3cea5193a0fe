//! Named tensors of a checkpoint and the two layer kinds built from them: linear projections
//! and embeddings, dense or MLX affine-quantized (bits and group size read off the shapes);
//! and the shard files a safetensors index names, which must lie inside the model folder.

use std::{
    collections::{BTreeSet, HashMap},
    path::{Component, Path, PathBuf},
    sync::Arc,
};

use mlx_rs::{
    ops::{self, indexing::IndexOp},
    Array, Dtype,
};
use seedbar_kernels::{Activations, MlxAffine, QuantizedMatrix, Unsupported};
use serde_json::Value;

use crate::{
    error::{EngineError, Result},
    step::{
        plan::Products,
        row_products::{self, AffineQuantized},
    },
};

mod projections;
pub use projections::Projections;

/// The shard files the `weight_map` of `index` (a parsed `model.safetensors.index.json` in
/// the model folder `dir`) names. Each must be a relative path of plain names, so an index
/// cannot make the loader read files elsewhere. Symlinks the folder itself holds are
/// followed (a Hugging Face cache snapshot links its files into the cache's blobs).
pub(crate) fn index_shards(dir: &Path, index: &Path, json: &Value) -> Result<BTreeSet<PathBuf>> {
    let names: BTreeSet<&str> = json["weight_map"]
        .as_object()
        .ok_or_else(|| EngineError::bad_file(index, "no `weight_map`"))?
        .values()
        .filter_map(Value::as_str)
        .collect();
    names
        .into_iter()
        .map(|name| {
            let relative = Path::new(name);
            if name.is_empty()
                || !relative
                    .components()
                    .all(|c| matches!(c, Component::Normal(_)))
            {
                return Err(EngineError::bad_file(
                    index,
                    format!(
                        "`weight_map` names `{name}`, which is not a plain relative path; \
                         shards must be files inside the model folder"
                    ),
                ));
            }
            let path = dir.join(relative);
            if !path.is_file() {
                return Err(EngineError::MissingFile { path });
            }
            Ok(path)
        })
        .collect()
}

/// The group sizes MLX's quantized ops take (a GGUF's Q6_K has groups of 16, which only the
/// CPU kernels take).
const MLX_GROUP_SIZES: [i32; 3] = [32, 64, 128];

/// How weights are held in memory once loaded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadOptions {
    /// Expand quantized weights to dense at load. On MLX's CPU backend dense f32 matmuls run
    /// on OpenBLAS (multi-threaded) while quantized ones are a plain loop: several times faster.
    pub dequantize: bool,
    /// The dtype activations and dense weights are computed in.
    pub compute_dtype: Dtype,
    /// How the CPU kernels read a quantized product's input; `None`: as the checkpoint's
    /// own engine does: a GGUF file's as llama.cpp, int8 per block of 32 (set where
    /// `Model` loads a GGUF), anything else as mlx-lm, float (`WeightMap`'s default).
    pub activations: Option<Activations>,
}

/// The floating dtype a checkpoint's tensors are stored in: bfloat16 where any is and none
/// is float16, float16 where any is, else float32 (or `None` without floats).
pub fn stored_float(tensors: &HashMap<String, Array>) -> Option<Dtype> {
    let has = |dtype| tensors.values().any(|t| t.dtype() == dtype);
    [Dtype::Float16, Dtype::Bfloat16, Dtype::Float32]
        .into_iter()
        .find(|&dtype| has(dtype))
}

impl LoadOptions {
    /// These options for a checkpoint `stored` in that floating dtype: where a GPU computes
    /// in float16 ([`for_default_device`](Self::for_default_device)), a bfloat16 checkpoint
    /// computes in bfloat16, as mlx-lm does (float16's range is narrower than what such a
    /// model's activations may reach: Gemma's do).
    pub fn for_stored(self, stored: Option<Dtype>) -> Self {
        match stored {
            Some(Dtype::Bfloat16) if self.compute_dtype == Dtype::Float16 && !self.dequantize => {
                LoadOptions {
                    compute_dtype: Dtype::Bfloat16,
                    ..self
                }
            }
            _ => self,
        }
    }

    /// CPU: dense f32 (see DESIGN.md section 8). GPU: keep quantized weights, compute in f16
    /// ([`for_stored`](Self::for_stored): a bfloat16 checkpoint in bfloat16).
    pub fn for_default_device() -> Self {
        if crate::runtime::default_device_is_gpu() {
            LoadOptions {
                dequantize: false,
                compute_dtype: Dtype::Float16,
                activations: None,
            }
        } else {
            LoadOptions {
                dequantize: true,
                compute_dtype: Dtype::Float32,
                activations: None,
            }
        }
    }
}

/// A checkpoint's tensors by name; layers take what they need and shapes are checked.
pub struct WeightMap {
    tensors: HashMap<String, Array>,
    options: LoadOptions,
}

impl WeightMap {
    pub fn new(tensors: HashMap<String, Array>, options: LoadOptions) -> Self {
        WeightMap { tensors, options }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn take(&mut self, name: &str) -> Result<Array> {
        self.tensors
            .remove(name)
            .ok_or_else(|| EngineError::MissingTensor {
                name: name.to_string(),
            })
    }

    fn take_shaped(&mut self, name: &str, expected: &[i32]) -> Result<Array> {
        let array = self.take(name)?;
        check_shape(name, &array, expected)?;
        Ok(array)
    }

    /// A 1-D norm weight of `size` elements, in the compute dtype.
    pub fn vector(&mut self, name: &str, size: i32) -> Result<Array> {
        self.dense(name, &[size])
    }

    /// The dense tensor `name` of `shape`, in the compute dtype.
    pub fn dense(&mut self, name: &str, shape: &[i32]) -> Result<Array> {
        materialize(
            self.take_shaped(name, shape)?
                .as_dtype(self.options.compute_dtype)?,
        )
    }

    /// The dtype activations and dense weights are computed in.
    pub fn compute_dtype(&self) -> Dtype {
        self.options.compute_dtype
    }

    /// The projection stored under `prefix` (`prefix.weight`, optional `.scales`/`.biases`
    /// when quantized, `.bias` when `bias`), mapping `input` features to `output`.
    pub fn linear(&mut self, prefix: &str, input: i32, output: i32, bias: bool) -> Result<Linear> {
        let weight = self.matrix(prefix, output, input)?;
        let bias = if bias {
            Some(self.vector(&format!("{prefix}.bias"), output)?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }

    /// Projections stored as one under `prefix` (rows of each end to end, as Phi-3's
    /// `qkv_proj` and `gate_up_proj`), split at load into `outputs[i]` rows each.
    pub fn fused_linear<const N: usize>(
        &mut self,
        prefix: &str,
        input: i32,
        outputs: [i32; N],
        bias: bool,
    ) -> Result<[Linear; N]> {
        let whole = self.linear(prefix, input, outputs.iter().sum(), bias)?;
        let mut start = 0;
        let parts = outputs
            .iter()
            .map(|&rows| {
                let part = start..start + rows;
                start += rows;
                Ok(Linear {
                    weight: whole.weight.rows(part.clone())?,
                    bias: whole
                        .bias
                        .as_ref()
                        .map(|b| materialize(b.index(part)))
                        .transpose()?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(parts.try_into().expect("one part per output"))
    }

    /// The embedding table under `prefix`: `rows` tokens of `width` features.
    pub fn embedding(&mut self, prefix: &str, rows: i32, width: i32) -> Result<Embedding> {
        Ok(Embedding {
            table: self.matrix(prefix, rows, width)?,
        })
    }

    fn matrix(&mut self, prefix: &str, rows: i32, cols: i32) -> Result<Matrix> {
        self.load_matrix(prefix, rows, cols, true)
    }

    /// The `[rows, cols]` matrix under `prefix`; on the CPU a quantized one is packed for the
    /// CPU kernels when `pack` (and they hold its format), dequantized otherwise.
    fn load_matrix(&mut self, prefix: &str, rows: i32, cols: i32, pack: bool) -> Result<Matrix> {
        let weight_name = format!("{prefix}.weight");
        let scales_name = format!("{prefix}.scales");
        if !self.contains(&scales_name) {
            let weight = self
                .take_shaped(&weight_name, &[rows, cols])?
                .as_dtype(self.options.compute_dtype)?;
            return Ok(Matrix::Dense(materialize(weight)?));
        }
        let weight = self.take(&weight_name)?;
        let scales = self.take(&scales_name)?;
        let biases = self.take(&format!("{prefix}.biases"))?;
        let packed_cols = weight.shape().get(1).copied().unwrap_or(0);
        let groups = scales.shape().get(1).copied().unwrap_or(0);
        let bits = packed_cols * 32 / cols.max(1);
        if weight.dtype() != Dtype::Uint32
            || groups == 0
            || cols % groups != 0
            || !matches!(bits, 2 | 3 | 4 | 5 | 6 | 8)
            || packed_cols * 32 != bits * cols
        {
            return Err(EngineError::WrongShape {
                name: weight_name,
                expected: vec![rows, cols],
                actual: weight.shape().to_vec(),
            });
        }
        check_shape(&weight_name, &weight, &[rows, packed_cols])?;
        check_shape(&scales_name, &scales, &[rows, groups])?;
        let quantized = Quantized {
            weight: materialize(weight)?,
            scales: materialize(scales.as_dtype(self.options.compute_dtype)?)?,
            biases: materialize(biases.as_dtype(self.options.compute_dtype)?)?,
            group_size: cols / groups,
            bits,
        };
        if !self.options.dequantize && MLX_GROUP_SIZES.contains(&quantized.group_size) {
            return Ok(Matrix::Quantized(quantized));
        }
        if pack {
            let activations = self.options.activations.unwrap_or(Activations::Float);
            match quantized.packed(rows, cols, activations)? {
                Ok(packed) => return Ok(Matrix::Packed(Arc::new(packed))),
                Err(reason) => tracing::debug!(name = weight_name, %reason, "dequantized"),
            }
        }
        let dense = if MLX_GROUP_SIZES.contains(&quantized.group_size) {
            quantized.dequantize(self.options.compute_dtype)?
        } else {
            // Groups MLX does not take (Q6_K's 16): the same `fma(q, scale, bias)` on the host.
            let host = quantized
                .packed(rows, cols, Activations::Float)?
                .map_err(|_| EngineError::WrongShape {
                    name: weight_name.clone(),
                    expected: vec![rows, cols],
                    actual: quantized.weight.shape().to_vec(),
                })?;
            let values: Vec<f32> = (0..rows as usize)
                .flat_map(|r| host.dequantize_row(r))
                .collect();
            Array::from_slice(&values, &[rows, cols]).as_dtype(self.options.compute_dtype)?
        };
        Ok(Matrix::Dense(materialize(dense)?))
    }

    /// A mixture of experts' `count` projections of `input` to `output` features: stacked
    /// under `stacked` (`[count, output, input]`, as mlx-lm saves them) or one per expert
    /// under `per_expert(e)` (as Hugging Face checkpoints store them), dense or quantized.
    pub fn experts(
        &mut self,
        stacked: &str,
        per_expert: impl Fn(usize) -> String,
        count: usize,
        input: i32,
        output: i32,
    ) -> Result<ExpertMatrices> {
        let name = |e: usize| format!("{stacked}.{e}");
        let prefixes: Vec<String> = if self.contains(&format!("{stacked}.weight")) {
            // Each expert's slice under a name of its own, so `matrix` checks and converts
            // it as it does any projection.
            for part in ["weight", "scales", "biases"] {
                let whole = format!("{stacked}.{part}");
                if !self.contains(&whole) {
                    continue;
                }
                let array = self.take(&whole)?;
                if array.shape().first() != Some(&(count as i32)) {
                    return Err(EngineError::WrongShape {
                        name: whole,
                        expected: vec![count as i32, output, input],
                        actual: array.shape().to_vec(),
                    });
                }
                for e in 0..count {
                    let slice = array.index(e as i32);
                    self.tensors.insert(format!("{}.{part}", name(e)), slice);
                }
            }
            (0..count).map(name).collect()
        } else {
            (0..count).map(per_expert).collect()
        };
        let matrices = prefixes
            .iter()
            // MLX's gather kernels take MLX arrays: experts are never packed.
            .map(|p| self.load_matrix(p, output, input, false))
            .collect::<Result<Vec<_>>>()?;
        ExpertMatrices::stack(&matrices, stacked)
    }

    /// Names nobody took: a checkpoint with extra tensors is fine, but tell the log.
    pub fn leftover_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.tensors.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }
}

/// Evaluate now: weights are read lazily on the loading thread's stream, and the engine
/// runs on its own thread, which cannot evaluate work queued on another thread's stream.
fn materialize(array: Array) -> Result<Array> {
    array.eval()?;
    Ok(array)
}

fn check_shape(name: &str, array: &Array, expected: &[i32]) -> Result<()> {
    if array.shape() != expected {
        return Err(EngineError::WrongShape {
            name: name.to_string(),
            expected: expected.to_vec(),
            actual: array.shape().to_vec(),
        });
    }
    Ok(())
}

/// MLX affine quantization: packed `weight` rows with per-group `scales` and `biases`.
#[derive(Debug, Clone)]
pub struct Quantized {
    pub weight: Array,
    pub scales: Array,
    pub biases: Array,
    pub group_size: i32,
    pub bits: i32,
}

impl Quantized {
    /// The same matrix for the CPU kernels of `seedbar_kernels` (2 to 8 bits), for products
    /// over `activations` where they hold its format that way, else over float ones; the
    /// inner error is a format those kernels do not hold.
    fn packed(
        &self,
        rows: i32,
        cols: i32,
        activations: Activations,
    ) -> Result<std::result::Result<QuantizedMatrix, Unsupported>> {
        let floats = |a: &Array| -> Result<Vec<f32>> {
            let a = materialize(a.as_dtype(Dtype::Float32)?)?;
            Ok(a.try_as_slice::<f32>()?.to_vec())
        };
        let (scales, biases) = (floats(&self.scales)?, floats(&self.biases)?);
        let mlx = MlxAffine {
            words: self.weight.try_as_slice::<u32>()?,
            scales: &scales,
            biases: &biases,
            rows: rows as usize,
            cols: cols as usize,
            group_size: self.group_size as usize,
            bits: self.bits as u32,
        };
        Ok(match QuantizedMatrix::from_mlx_affine(mlx, activations) {
            Err(Unsupported::Int8 { .. }) => {
                QuantizedMatrix::from_mlx_affine(mlx, Activations::Float)
            }
            held => held,
        })
    }

    /// Elements per row of the dequantized matrix.
    fn cols(&self) -> i32 {
        self.weight.shape()[1] * 32 / self.bits
    }

    fn dequantize(&self, dtype: Dtype) -> Result<Array> {
        let dense = ops::dequantize(
            &self.weight,
            &self.scales,
            &self.biases,
            self.group_size,
            self.bits,
        )?;
        Ok(dense.as_dtype(dtype)?)
    }
}

/// A `[rows, cols]` weight matrix, dense or quantized.
#[derive(Debug, Clone)]
pub enum Matrix {
    Dense(Array),
    Quantized(Quantized),
    /// 4- or 8-bit weights on MLX's CPU backend, multiplied by `seedbar_kernels`'s kernels:
    /// they read the quantized bytes (MLX's CPU quantized matmul is a scalar loop, dense f32
    /// reads 6-8x more), and each output row depends on its own input row alone.
    Packed(Arc<QuantizedMatrix>),
}

impl Matrix {
    fn dense(&self) -> Option<&Array> {
        match self {
            Matrix::Dense(w) => Some(w),
            Matrix::Quantized(_) | Matrix::Packed(_) => None,
        }
    }

    fn quantized(&self) -> Option<&Quantized> {
        match self {
            Matrix::Quantized(q) => Some(q),
            Matrix::Dense(_) | Matrix::Packed(_) => None,
        }
    }

    /// `matrices` joined by `join` (of their weights, and of a quantized matrix's scales and
    /// biases): `None` unless all are dense or all quantized alike.
    fn joined(
        matrices: &[&Matrix],
        join: impl Fn(Vec<&Array>) -> Result<Array>,
    ) -> Result<Option<Matrix>> {
        let dense: Option<Vec<&Array>> = matrices.iter().map(|m| m.dense()).collect();
        if let Some(dense) = dense {
            return Ok(Some(Matrix::Dense(join(dense)?)));
        }
        let quantized: Option<Vec<&Quantized>> = matrices.iter().map(|m| m.quantized()).collect();
        let Some((first, quantized)) = quantized.as_ref().and_then(|q| Some((*q.first()?, q)))
        else {
            return Ok(None);
        };
        if quantized
            .iter()
            .any(|q| (q.bits, q.group_size) != (first.bits, first.group_size))
        {
            return Ok(None);
        }
        let part = |f: fn(&Quantized) -> &Array| quantized.iter().map(|q| f(q)).collect();
        Ok(Some(Matrix::Quantized(Quantized {
            weight: join(part(|q| &q.weight))?,
            scales: join(part(|q| &q.scales))?,
            biases: join(part(|q| &q.biases))?,
            ..first.clone()
        })))
    }

    /// Rows `range` of the matrix, as a matrix of their own.
    fn rows(&self, range: std::ops::Range<i32>) -> Result<Matrix> {
        let rows = |a: &Array| materialize(a.index((range.clone(), ..)));
        Ok(match self {
            Matrix::Dense(w) => Matrix::Dense(rows(w)?),
            Matrix::Quantized(q) => Matrix::Quantized(Quantized {
                weight: rows(&q.weight)?,
                scales: rows(&q.scales)?,
                biases: rows(&q.biases)?,
                ..q.clone()
            }),
            Matrix::Packed(p) => Matrix::Packed(Arc::new(
                p.slice_rows(range.start as usize..range.end as usize),
            )),
        })
    }

    /// `x @ self.T`, a dense product of few rows through the row kernel where `products`
    /// asks.
    fn matmul_transposed(&self, x: &Array, products: Products) -> Result<Array> {
        Ok(match self {
            Matrix::Dense(w)
                if products == Products::RowWise
                    && x.size() as i32 / w.shape()[1] <= row_products::MAX_ROWS =>
            {
                row_products::product(x, w)?
            }
            Matrix::Dense(w) => x.matmul(w.t())?,
            Matrix::Packed(p) => {
                // The kernel runs now, on the host: the input is evaluated here.
                let x = x.as_dtype(Dtype::Float32)?.contiguous()?;
                let rows = x.size() / p.cols();
                let y = p.matmul_transposed(x.try_as_slice::<f32>()?, rows);
                let mut shape = x.shape().to_vec();
                *shape.last_mut().expect("a matrix input") = p.rows() as i32;
                Array::from_slice(&y, &shape)
            }
            Matrix::Quantized(q)
                if products == Products::RowWise
                    && x.size() as i32 / q.cols() <= row_products::MAX_ROWS =>
            {
                row_products::quantized_product(
                    x,
                    AffineQuantized {
                        weight: &q.weight,
                        scales: &q.scales,
                        biases: &q.biases,
                        group_size: q.group_size,
                        bits: q.bits,
                    },
                )?
            }
            Matrix::Quantized(q) => ops::quantized_matmul(
                x,
                &q.weight,
                &q.scales,
                &q.biases,
                true,
                q.group_size,
                q.bits,
            )?,
        })
    }
}

/// A mixture of experts' projections stacked along a leading expert axis (a [`Matrix`] of
/// `[E, rows, cols]` arrays), applied through MLX's gather kernels: each (token, expert)
/// pair is a product of its own, so a row's result depends only on the row.
#[derive(Debug, Clone)]
pub struct ExpertMatrices(Matrix);

impl ExpertMatrices {
    /// One stack of `matrices` (all dense or all quantized alike); `name` for errors.
    fn stack(matrices: &[Matrix], name: &str) -> Result<Self> {
        let stacked = |parts: Vec<&Array>| materialize(ops::stack(&parts, 0)?);
        let matrices: Vec<&Matrix> = matrices.iter().collect();
        Matrix::joined(&matrices, stacked)?
            .map(ExpertMatrices)
            .ok_or_else(|| EngineError::bad_file(name, "experts are not all quantized alike"))
    }

    /// `x[..., 1, cols]` times each routed expert's matrix transposed: `indices[...]` names
    /// the experts (x broadcast over them), giving `[..., 1, rows]`.
    pub fn gather(&self, x: &Array, indices: &Array) -> Result<Array> {
        Ok(match &self.0 {
            Matrix::Dense(w) => ops::gather_mm(x, w.swap_axes(-1, -2)?, None, indices, false)?,
            Matrix::Quantized(q) => ops::gather_qmm(
                x,
                &q.weight,
                &q.scales,
                &q.biases,
                None,
                indices,
                true,
                q.group_size,
                q.bits,
                false,
            )?,
            // `stack` builds dense or quantized stacks only.
            Matrix::Packed(_) => {
                return Err(EngineError::Mlx("experts cannot run packed".to_string()))
            }
        })
    }
}

/// `y = x W^T + b`
#[derive(Debug, Clone)]
pub struct Linear {
    pub weight: Matrix,
    pub bias: Option<Array>,
}

impl Linear {
    pub fn forward(&self, x: &Array, products: Products) -> Result<Array> {
        let y = self.weight.matmul_transposed(x, products)?;
        Ok(match &self.bias {
            Some(b) => y.add(b)?,
            None => y,
        })
    }

    /// `x W^T + b` for `m` rows of host floats (`[m, cols]`, row-major) through the CPU
    /// kernels; only a packed weight runs here.
    pub fn forward_host(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        let Matrix::Packed(w) = &self.weight else {
            return Err(EngineError::Mlx(
                "a host product needs packed weights".to_string(),
            ));
        };
        let mut y = w.matmul_transposed(x, m);
        if let Some(b) = &self.bias {
            let b = b.try_as_slice::<f32>()?;
            for row in y.chunks_exact_mut(b.len()) {
                for (v, b) in row.iter_mut().zip(b) {
                    *v += b;
                }
            }
        }
        Ok(y)
    }
}

/// Token embeddings; also usable as the output projection when embeddings are tied.
#[derive(Debug, Clone)]
pub struct Embedding {
    pub table: Matrix,
}

impl Embedding {
    pub fn forward(&self, tokens: &Array, dtype: Dtype) -> Result<Array> {
        Ok(match &self.table {
            Matrix::Dense(w) => w.take_axis(tokens, 0)?,
            Matrix::Quantized(q) => {
                let rows = |a: &Array| a.take_axis(tokens, 0);
                Quantized {
                    weight: rows(&q.weight)?,
                    scales: rows(&q.scales)?,
                    biases: rows(&q.biases)?,
                    ..q.clone()
                }
                .dequantize(dtype)?
            }
            Matrix::Packed(p) => {
                let ids = tokens.as_dtype(Dtype::Uint32)?;
                let mut values = Vec::with_capacity(ids.size() * p.cols());
                for &id in ids.try_as_slice::<u32>()? {
                    if id as usize >= p.rows() {
                        return Err(EngineError::InvalidRequest(format!(
                            "token id {id} is outside the vocabulary ({} tokens)",
                            p.rows()
                        )));
                    }
                    values.extend(p.dequantize_row(id as usize));
                }
                let mut shape = tokens.shape().to_vec();
                shape.push(p.cols() as i32);
                Array::from_slice(&values, &shape).as_dtype(dtype)?
            }
        })
    }

    pub fn as_linear(&self) -> Linear {
        Linear {
            weight: self.table.clone(),
            bias: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model folder inside a scratch folder, both removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let root =
                std::env::temp_dir().join(format!("seedbar-weights-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(root.join("model/shards")).unwrap();
            for file in ["model/shards/a.safetensors", "outside.safetensors"] {
                std::fs::write(root.join(file), b"").unwrap();
            }
            Scratch(root)
        }

        fn model(&self) -> PathBuf {
            self.0.join("model")
        }

        /// `index_shards` for an index whose weight map names `files`.
        fn shards(&self, files: &[&str]) -> Result<BTreeSet<PathBuf>> {
            let weight_map: serde_json::Map<String, Value> = files
                .iter()
                .enumerate()
                .map(|(i, f)| (format!("tensor{i}"), Value::from(*f)))
                .collect();
            let json = serde_json::json!({ "weight_map": weight_map });
            let model = self.model();
            index_shards(&model, &model.join("model.safetensors.index.json"), &json)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn shards_inside_the_model_folder_are_found_once_each() {
        let scratch = Scratch::new("inside");
        let shards = scratch
            .shards(&["shards/a.safetensors", "shards/a.safetensors"])
            .unwrap();
        let expected = scratch.model().join("shards/a.safetensors");
        assert_eq!(shards.into_iter().collect::<Vec<_>>(), [expected]);
        assert!(matches!(
            scratch.shards(&["b.safetensors"]),
            Err(EngineError::MissingFile { path }) if path == scratch.model().join("b.safetensors")
        ));
    }

    #[test]
    fn the_folders_own_symlinks_are_followed() {
        let scratch = Scratch::new("linked");
        // As in a Hugging Face cache snapshot (Seedbar runs on Unix: macOS, Linux).
        std::os::unix::fs::symlink(
            scratch.0.join("outside.safetensors"),
            scratch.model().join("link.safetensors"),
        )
        .unwrap();
        assert_eq!(scratch.shards(&["link.safetensors"]).unwrap().len(), 1);
    }

    #[test]
    fn shards_outside_the_model_folder_are_refused_by_name() {
        let scratch = Scratch::new("outside");
        let bad = [
            "../outside.safetensors",
            "/etc/passwd",
            "shards/../../x",
            "./a",
            "",
        ];
        for name in bad {
            let err = scratch
                .shards(&["shards/a.safetensors", name])
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!("`weight_map` names `{name}`"))
                    && err.contains("model.safetensors.index.json"),
                "{name}: {err}"
            );
        }
    }

    #[test]
    fn a_gpu_computes_a_bfloat16_checkpoint_in_bfloat16() {
        let tensors = |dtypes: &[Dtype]| -> HashMap<String, Array> {
            dtypes
                .iter()
                .enumerate()
                .map(|(i, &d)| {
                    (
                        format!("t{i}"),
                        Array::from_slice(&[1.0f32], &[1]).as_dtype(d).unwrap(),
                    )
                })
                .collect()
        };
        let stored = |dtypes: &[Dtype]| stored_float(&tensors(dtypes));
        assert_eq!(
            stored(&[Dtype::Uint32, Dtype::Bfloat16]),
            Some(Dtype::Bfloat16)
        );
        assert_eq!(
            stored(&[Dtype::Bfloat16, Dtype::Float16]),
            Some(Dtype::Float16)
        );
        assert_eq!(stored(&[Dtype::Float32]), Some(Dtype::Float32));
        assert_eq!(stored(&[Dtype::Uint32]), None);
        let gpu = LoadOptions {
            dequantize: false,
            compute_dtype: Dtype::Float16,
            activations: None,
        };
        let cpu = LoadOptions {
            dequantize: true,
            compute_dtype: Dtype::Float32,
            activations: None,
        };
        let bf16 = Some(Dtype::Bfloat16);
        assert_eq!(gpu.for_stored(bf16).compute_dtype, Dtype::Bfloat16);
        assert_eq!(
            gpu.for_stored(Some(Dtype::Float32)).compute_dtype,
            Dtype::Float16
        );
        assert_eq!(cpu.for_stored(bf16).compute_dtype, Dtype::Float32);
    }
}

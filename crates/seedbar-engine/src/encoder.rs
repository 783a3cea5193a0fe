//! Sentence embeddings from a BERT-family encoder, as sentence-transformers checkpoints such as
//! all-MiniLM-L6-v2 hold them. This module owns the whole way from text to vector:
//!
//! - the checkpoint: `config.json` (`model_type: bert`), `tokenizer.json`, the safetensors
//!   (through [`WeightMap`], names with or without a `bert.` prefix), and the
//!   sentence-transformers files `modules.json`, the pooling module's `config.json` and
//!   `sentence_bert_config.json`;
//! - the network: word + position + token-type embeddings and their LayerNorm, then N
//!   bidirectional self-attention layers whose padding mask hides padded keys, each followed
//!   by a GELU MLP, both sub-blocks post-LN (`LayerNorm(x + sublayer(x))`) as BERT does;
//! - pooling as the checkpoint says: the mean over the real (unpadded) tokens, or the
//!   `[CLS]` token; then L2 normalization when `modules.json` lists `Normalize`.
//!
//! Inputs are texts or token ids. A text is tokenized with its `[CLS]`/`[SEP]`; token ids are
//! the model's input exactly as given (so the ids a tokenizer gives for a text, specials
//! included, embed as that text). The length rule: an input holds at most
//! [`EmbeddingModel::max_tokens`] tokens (sentence-transformers' `max_seq_length`, capped at
//! the position table; the table's size when the checkpoint names none). A longer input is
//! refused, or with [`Truncation::Cut`] cut to its first `max_tokens` tokens (a text keeps its
//! closing `[SEP]`, as sentence-transformers truncates). A batch runs in chunks of inputs of
//! similar length, each padded to its longest; padding does not change a row's vector.
//! Weights and activations are f32 on every device: the model is small, and f16 would move
//! the vectors.

use std::path::Path;

use mlx_rs::{ops, ops::indexing::IndexOp, Array, Dtype};
use serde::Deserialize;

use crate::{
    error::{EngineError, Result},
    layers::{LayerNorm, SelfAttention},
    model::{read_json, read_safetensors},
    step::plan::Products,
    tokenizer::Tokenizer,
    weights::{Embedding, Linear, LoadOptions, WeightMap},
};

/// Inputs run together in one forward pass at most.
const CHUNK: usize = 32;

/// `config.json` of a BERT encoder; field names as transformers writes them.
#[derive(Debug, Clone, Deserialize)]
pub struct EncoderConfig {
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub intermediate_size: i32,
    pub max_position_embeddings: i32,
    #[serde(default = "two")]
    pub type_vocab_size: i32,
    #[serde(default = "bert_eps")]
    pub layer_norm_eps: f32,
    #[serde(default = "gelu_name")]
    pub hidden_act: String,
    #[serde(default)]
    pub pad_token_id: u32,
}

impl EncoderConfig {
    /// `dir`'s `config.json`, checked to be a BERT encoder this module runs; and the raw
    /// JSON, for what a task head adds (`architectures`, `id2label`).
    pub(crate) fn read(dir: &Path) -> Result<(Self, serde_json::Value)> {
        let config_path = dir.join("config.json");
        let raw = read_json(&config_path)?.ok_or_else(|| EngineError::MissingFile {
            path: config_path.clone(),
        })?;
        if !crate::config::is_encoder(&raw) {
            return Err(EngineError::bad_file(
                &config_path,
                format!(
                    "model_type {} is not an encoder Seedbar runs (bert)",
                    raw["model_type"]
                ),
            ));
        }
        let config: EncoderConfig = serde_json::from_value(raw.clone())
            .map_err(|e| EngineError::bad_file(&config_path, format!("invalid config: {e}")))?;
        if config.hidden_act != "gelu" {
            return Err(EngineError::bad_file(
                &config_path,
                format!(
                    "hidden_act `{}` is not supported (gelu is)",
                    config.hidden_act
                ),
            ));
        }
        Ok((config, raw))
    }
}

/// An encoder checkpoint's weights in `dir`, f32 (quantized ones dequantized).
pub(crate) fn encoder_weights(dir: &Path) -> Result<WeightMap> {
    let options = LoadOptions {
        dequantize: true,
        compute_dtype: Dtype::Float32,
        activations: None,
    };
    Ok(WeightMap::new(read_safetensors(dir)?, options))
}

fn two() -> i32 {
    2
}
fn bert_eps() -> f32 {
    1e-12
}
fn gelu_name() -> String {
    "gelu".into()
}

/// How token vectors become one vector per input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over the input's real tokens.
    Mean,
    /// The first token's (`[CLS]`).
    Cls,
}

/// What happens to an input longer than [`EmbeddingModel::max_tokens`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Truncation {
    /// Refuse it ([`EngineError::InvalidRequest`]).
    Refuse,
    /// Keep its first `max_tokens` tokens (a text keeps its closing `[SEP]`).
    Cut,
}

/// One input to embed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EmbeddingInput {
    Text(String),
    Tokens(Vec<u32>),
}

/// Vectors in input order, and the tokens they took.
#[derive(Debug, Clone)]
pub struct Embeddings {
    pub vectors: Vec<Vec<f32>>,
    pub tokens: usize,
}

/// A loaded encoder with its tokenizer and length limit.
pub struct EmbeddingModel {
    encoder: Encoder,
    tokenizer: Tokenizer,
    max_tokens: usize,
    vocab_size: usize,
}

impl EmbeddingModel {
    /// Load the sentence-transformers (or plain BERT) checkpoint in `dir`.
    pub fn load(dir: &Path) -> Result<Self> {
        let (config, _) = EncoderConfig::read(dir)?;
        let (pooling, normalize) = sentence_transformer_modules(dir)?;
        let max_seq_length = read_json(&dir.join("sentence_bert_config.json"))?
            .and_then(|c| c["max_seq_length"].as_u64())
            .map_or(usize::MAX, |n| n as usize);
        let mut weights = encoder_weights(dir)?;
        let bert = Bert::load(&config, &mut weights)?;
        Ok(EmbeddingModel {
            encoder: Encoder {
                bert,
                pooling,
                normalize,
                pad_id: config.pad_token_id,
            },
            tokenizer: Tokenizer::from_file(&dir.join("tokenizer.json"))?,
            max_tokens: max_seq_length.min(config.max_position_embeddings as usize),
            vocab_size: config.vocab_size as usize,
        })
    }

    /// The length of every vector.
    pub fn dimensions(&self) -> usize {
        self.encoder.bert.hidden as usize
    }

    /// The most tokens one input may hold.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// One vector per input, in order. Empty inputs, unknown token ids and (unless cut)
    /// inputs over [`max_tokens`](Self::max_tokens) are refused, naming the input.
    pub fn embed(&self, inputs: &[EmbeddingInput], truncation: Truncation) -> Result<Embeddings> {
        if inputs.is_empty() {
            return Err(EngineError::InvalidRequest(
                "there is nothing to embed".into(),
            ));
        }
        let batch = inputs
            .iter()
            .enumerate()
            .map(|(i, input)| self.tokens(i, input, truncation))
            .collect::<Result<Vec<_>>>()?;
        Ok(Embeddings {
            tokens: batch.iter().map(Vec::len).sum(),
            vectors: self.encoder.embed(&batch)?,
        })
    }

    /// The model's input for `input` (number `index` of the request), checked.
    fn tokens(
        &self,
        index: usize,
        input: &EmbeddingInput,
        truncation: Truncation,
    ) -> Result<Vec<u32>> {
        let invalid = |why: String| EngineError::InvalidRequest(format!("input {index} {why}"));
        let mut ids = match input {
            EmbeddingInput::Text(text) if text.is_empty() => {
                return Err(invalid("is an empty string".into()))
            }
            EmbeddingInput::Text(text) => self.tokenizer.encode_with_special_tokens(text)?,
            EmbeddingInput::Tokens(ids) if ids.is_empty() => {
                return Err(invalid("is an empty list of tokens".into()))
            }
            EmbeddingInput::Tokens(ids) => {
                if let Some(bad) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
                    return Err(invalid(format!(
                        "holds token {bad}, outside the vocabulary of {} tokens",
                        self.vocab_size
                    )));
                }
                ids.clone()
            }
        };
        if ids.len() > self.max_tokens {
            if truncation == Truncation::Refuse {
                return Err(invalid(format!(
                    "has {} tokens; this model takes at most {}",
                    ids.len(),
                    self.max_tokens
                )));
            }
            let last = ids[ids.len() - 1];
            ids.truncate(self.max_tokens);
            if matches!(input, EmbeddingInput::Text(_)) {
                ids[self.max_tokens - 1] = last;
            }
        }
        Ok(ids)
    }
}

/// `modules.json`: the pooling its Pooling module's config names, and whether a Normalize
/// module follows. A checkpoint without one is pooled by mean, unnormalized (as
/// sentence-transformers wraps a plain BERT).
fn sentence_transformer_modules(dir: &Path) -> Result<(Pooling, bool)> {
    #[derive(Deserialize)]
    struct Module {
        #[serde(rename = "type")]
        kind: String,
        #[serde(default)]
        path: String,
    }
    let path = dir.join("modules.json");
    let Some(json) = read_json(&path)? else {
        return Ok((Pooling::Mean, false));
    };
    let modules: Vec<Module> = serde_json::from_value(json)
        .map_err(|e| EngineError::bad_file(&path, format!("invalid modules.json: {e}")))?;
    let (mut pooling, mut normalize) = (Pooling::Mean, false);
    for module in modules {
        match module.kind.rsplit('.').next().unwrap_or("") {
            "Transformer" => {}
            "Normalize" => normalize = true,
            "Pooling" => pooling = pooling_mode(&dir.join(&module.path).join("config.json"))?,
            other => {
                return Err(EngineError::bad_file(
                    &path,
                    format!("the sentence-transformers module `{other}` is not supported"),
                ))
            }
        }
    }
    Ok((pooling, normalize))
}

fn pooling_mode(path: &Path) -> Result<Pooling> {
    let config = read_json(path)?.ok_or_else(|| EngineError::MissingFile {
        path: path.to_path_buf(),
    })?;
    let on = |key: &str| config[key].as_bool().unwrap_or(false);
    let others = [
        "pooling_mode_max_tokens",
        "pooling_mode_mean_sqrt_len_tokens",
        "pooling_mode_weightedmean_tokens",
        "pooling_mode_lasttoken",
    ];
    match (on("pooling_mode_mean_tokens"), on("pooling_mode_cls_token")) {
        _ if others.iter().any(|k| on(k)) => {}
        (true, false) => return Ok(Pooling::Mean),
        (false, true) => return Ok(Pooling::Cls),
        _ => {}
    }
    Err(EngineError::bad_file(
        path,
        "only mean or CLS pooling (one of them) is supported",
    ))
}

/// The network and what turns its token vectors into one vector per input.
struct Encoder {
    bert: Bert,
    pooling: Pooling,
    normalize: bool,
    pad_id: u32,
}

impl Encoder {
    /// One vector per id list, in order (see [`by_length`]).
    fn embed(&self, batch: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        by_length(batch, |rows| self.embed_padded(rows))
    }

    fn embed_padded(&self, rows: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let (ids, lengths) = padded(rows, self.pad_id);
        let hidden = self.bert.forward(&ids, None, &lengths)?;
        let mut pooled = pool(&hidden, &lengths, self.pooling)?;
        if self.normalize {
            pooled = l2_normalize(&pooled)?;
        }
        pooled.eval()?;
        let dims = self.bert.hidden as usize;
        Ok(pooled
            .as_slice::<f32>()
            .chunks(dims)
            .map(<[f32]>::to_vec)
            .collect())
    }
}

/// `run` over `batch`'s rows shortest first, in chunks of at most [`CHUNK`] (so that padding
/// each chunk to its longest row wastes little); its results back in `batch`'s order.
pub(crate) fn by_length<T: Default + Clone>(
    batch: &[Vec<u32>],
    mut run: impl FnMut(&[&[u32]]) -> Result<Vec<T>>,
) -> Result<Vec<T>> {
    let mut order: Vec<usize> = (0..batch.len()).collect();
    order.sort_by_key(|&i| batch[i].len());
    let mut results = vec![T::default(); batch.len()];
    for chunk in order.chunks(CHUNK) {
        let rows: Vec<&[u32]> = chunk.iter().map(|&i| batch[i].as_slice()).collect();
        for (&i, result) in chunk.iter().zip(run(&rows)?) {
            results[i] = result;
        }
    }
    Ok(results)
}

/// `rows` padded with `pad` to the longest (`[B, L]`), and each row's length.
pub(crate) fn padded(rows: &[&[u32]], pad: u32) -> (Array, Vec<usize>) {
    let width = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    let lengths: Vec<usize> = rows.iter().map(|r| r.len()).collect();
    let mut ids = vec![pad; rows.len() * width];
    for (row, tokens) in ids.chunks_mut(width.max(1)).zip(rows) {
        row[..tokens.len()].copy_from_slice(tokens);
    }
    (
        Array::from_slice(&ids, &[rows.len() as i32, width as i32]),
        lengths,
    )
}

/// `[B, L]`: `real` at each row's first `lengths[b]` positions, `padding` after.
pub(crate) fn per_token(lengths: &[usize], width: usize, real: f32, padding: f32) -> Array {
    let values: Vec<f32> = lengths
        .iter()
        .flat_map(|&n| (0..width).map(move |i| if i < n { real } else { padding }))
        .collect();
    Array::from_slice(&values, &[lengths.len() as i32, width as i32])
}

/// One vector per row of `hidden` (`[B, L, D]`) whose first `lengths[b]` tokens are real.
fn pool(hidden: &Array, lengths: &[usize], pooling: Pooling) -> Result<Array> {
    Ok(match pooling {
        Pooling::Cls => hidden.index((.., 0, ..)).contiguous()?,
        Pooling::Mean => {
            let width = hidden.shape()[1] as usize;
            let mask = per_token(lengths, width, 1.0, 0.0).expand_dims(-1)?;
            let counts: Vec<f32> = lengths.iter().map(|&n| n.max(1) as f32).collect();
            let counts = Array::from_slice(&counts, &[lengths.len() as i32, 1]);
            hidden
                .multiply(&mask)?
                .sum_axis(1, false)?
                .divide(&counts)?
        }
    })
}

/// Rows scaled to unit length (a zero row stays zero), as torch's `F.normalize`.
fn l2_normalize(x: &Array) -> Result<Array> {
    let norm = x.square()?.sum_axis(-1, true)?.sqrt()?;
    Ok(x.divide(&ops::maximum(&norm, Array::from_f32(1e-12))?)?)
}

/// One encoder layer: self-attention, then the MLP, each added to its input and normed.
struct Layer {
    attention: SelfAttention,
    attention_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
}

impl Layer {
    fn load(weights: &mut WeightMap, prefix: &str, c: &EncoderConfig) -> Result<Self> {
        let (d, ff, eps) = (c.hidden_size, c.intermediate_size, c.layer_norm_eps);
        let name = |name: &str| format!("{prefix}.{name}");
        Ok(Layer {
            attention: SelfAttention::load(
                weights,
                [
                    &name("attention.self.query"),
                    &name("attention.self.key"),
                    &name("attention.self.value"),
                    &name("attention.output.dense"),
                ],
                d,
                c.num_attention_heads,
            )?,
            intermediate: weights.linear(&name("intermediate.dense"), d, ff, true)?,
            output: weights.linear(&name("output.dense"), ff, d, true)?,
            attention_norm: LayerNorm::load(weights, &name("attention.output.LayerNorm"), d, eps)?,
            output_norm: LayerNorm::load(weights, &name("output.LayerNorm"), d, eps)?,
        })
    }

    /// `x`: `[B, L, D]`; `key_mask`: `[B, 1, 1, L]`, 0 for real keys and -inf for padding.
    fn forward(&self, x: &Array, key_mask: &Array) -> Result<Array> {
        let x = self
            .attention_norm
            .forward(&x.add(self.attention.forward(x, Some(key_mask))?)?)?;
        let mlp = self.output.forward(
            &gelu(&self.intermediate.forward(&x, Products::Matmul)?)?,
            Products::Matmul,
        )?;
        self.output_norm.forward(&x.add(mlp)?)
    }
}

/// BERT's exact GELU: `x * (1 + erf(x / sqrt 2)) / 2`.
fn gelu(x: &Array) -> Result<Array> {
    let erf = ops::erf(x.multiply(Array::from_f32(std::f32::consts::FRAC_1_SQRT_2))?)?;
    Ok(x.multiply(erf.add(Array::from_f32(1.0))?)?
        .multiply(Array::from_f32(0.5))?)
}

/// The BERT network: embeddings, their norm and the encoder layers (also a cross-encoder's,
/// see `reranker`).
pub(crate) struct Bert {
    word: Embedding,
    position: Embedding,
    token_type: Embedding,
    norm: LayerNorm,
    layers: Vec<Layer>,
    pub(crate) hidden: i32,
}

impl Bert {
    pub(crate) fn load(c: &EncoderConfig, weights: &mut WeightMap) -> Result<Self> {
        if c.num_attention_heads <= 0 || c.hidden_size % c.num_attention_heads != 0 {
            return Err(EngineError::InvalidRequest(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                c.hidden_size, c.num_attention_heads
            )));
        }
        // Checkpoints saved from a task head (BertForMaskedLM, ...) prefix the encoder.
        let root = if weights.contains("bert.embeddings.word_embeddings.weight") {
            "bert."
        } else {
            ""
        };
        let d = c.hidden_size;
        let embeddings = format!("{root}embeddings");
        let bert = Bert {
            word: weights.embedding(&format!("{embeddings}.word_embeddings"), c.vocab_size, d)?,
            position: weights.embedding(
                &format!("{embeddings}.position_embeddings"),
                c.max_position_embeddings,
                d,
            )?,
            token_type: weights.embedding(
                &format!("{embeddings}.token_type_embeddings"),
                c.type_vocab_size,
                d,
            )?,
            norm: LayerNorm::load(
                weights,
                &format!("{embeddings}.LayerNorm"),
                d,
                c.layer_norm_eps,
            )?,
            layers: (0..c.num_hidden_layers)
                .map(|i| Layer::load(weights, &format!("{root}encoder.layer.{i}"), c))
                .collect::<Result<_>>()?,
            hidden: d,
        };
        let leftover = weights.leftover_names();
        if !leftover.is_empty() {
            tracing::debug!(?leftover, "encoder weights not used");
        }
        Ok(bert)
    }

    /// The last hidden states (`[B, L, D]`) of `ids` (`[B, L]`, row `b` real for its first
    /// `lengths[b]` tokens) whose token types are `types` (`[B, L]`; all 0 when `None`).
    pub(crate) fn forward(
        &self,
        ids: &Array,
        types: Option<&Array>,
        lengths: &[usize],
    ) -> Result<Array> {
        let width = ids.shape()[1];
        let positions: Vec<i32> = (0..width).collect();
        let positions = Array::from_slice(&positions, &[width]);
        let first_type = Array::from_slice(&[0i32], &[1]);
        let dtype = Dtype::Float32;
        let x = self
            .word
            .forward(ids, dtype)?
            .add(self.position.forward(&positions, dtype)?)?
            .add(
                self.token_type
                    .forward(types.unwrap_or(&first_type), dtype)?,
            )?;
        let mut x = self.norm.forward(&x)?;
        // 0 where a key is real, -inf where it is padding: padded keys get no weight.
        let key_mask = per_token(lengths, width as usize, 0.0, f32::NEG_INFINITY).reshape(&[
            lengths.len() as i32,
            1,
            1,
            width,
        ])?;
        for layer in &self.layers {
            x = layer.forward(&x, &key_mask)?;
        }
        Ok(x)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Deterministic values in [-scale, scale): a hash of (seed, index), no RNG.
    fn values(seed: u64, n: usize, scale: f32) -> Vec<f32> {
        (0..n as u64)
            .map(|i| {
                let h = (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i)
                    .wrapping_mul(0xBF58_476D_1CE4_E5B9);
                let unit = (h >> 40) as f32 / (1u64 << 24) as f32;
                (unit * 2.0 - 1.0) * scale
            })
            .collect()
    }

    fn tiny_config() -> EncoderConfig {
        serde_json::from_value(serde_json::json!({
            "vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 32,
            "max_position_embeddings": 24,
        }))
        .unwrap()
    }

    /// A random-weight encoder of `tiny_config`'s shapes.
    fn tiny_encoder(pooling: Pooling, normalize: bool) -> Encoder {
        let c = tiny_config();
        let (d, ff) = (c.hidden_size, c.intermediate_size);
        let mut shapes: Vec<(String, Vec<i32>)> = vec![
            (
                "embeddings.word_embeddings.weight".into(),
                vec![c.vocab_size, d],
            ),
            (
                "embeddings.position_embeddings.weight".into(),
                vec![c.max_position_embeddings, d],
            ),
            ("embeddings.token_type_embeddings.weight".into(), vec![2, d]),
            ("embeddings.LayerNorm.weight".into(), vec![d]),
            ("embeddings.LayerNorm.bias".into(), vec![d]),
        ];
        for i in 0..c.num_hidden_layers {
            let p = format!("encoder.layer.{i}");
            for (name, out, input) in [
                ("attention.self.query", d, d),
                ("attention.self.key", d, d),
                ("attention.self.value", d, d),
                ("attention.output.dense", d, d),
                ("intermediate.dense", ff, d),
                ("output.dense", d, ff),
            ] {
                shapes.push((format!("{p}.{name}.weight"), vec![out, input]));
                shapes.push((format!("{p}.{name}.bias"), vec![out]));
            }
            for norm in ["attention.output.LayerNorm", "output.LayerNorm"] {
                shapes.push((format!("{p}.{norm}.weight"), vec![d]));
                shapes.push((format!("{p}.{norm}.bias"), vec![d]));
            }
        }
        let tensors: HashMap<String, Array> = shapes
            .into_iter()
            .enumerate()
            .map(|(seed, (name, shape))| {
                let n = shape.iter().product::<i32>() as usize;
                let mut v = values(seed as u64, n, 0.5);
                if name.ends_with("LayerNorm.weight") {
                    v.iter_mut().for_each(|x| *x += 1.0);
                }
                (name, Array::from_slice(&v, &shape))
            })
            .collect();
        let options = LoadOptions {
            dequantize: true,
            compute_dtype: Dtype::Float32,
            activations: None,
        };
        let bert = Bert::load(&c, &mut WeightMap::new(tensors, options)).unwrap();
        Encoder {
            bert,
            pooling,
            normalize,
            pad_id: 0,
        }
    }

    #[test]
    fn mean_pooling_averages_only_the_real_tokens_and_normalize_gives_unit_rows() {
        // Two rows of three 2-d tokens; the second has one real token.
        let hidden = Array::from_slice(
            &[
                1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 10.0, 20.0, 99.0, 99.0, -7.0, 7.0,
            ],
            &[2, 3, 2],
        );
        let mean = pool(&hidden, &[3, 1], Pooling::Mean).unwrap();
        assert_eq!(mean.as_slice::<f32>(), [3.0, 4.0, 10.0, 20.0]);
        let cls = pool(&hidden, &[3, 1], Pooling::Cls).unwrap();
        assert_eq!(cls.as_slice::<f32>(), [1.0, 2.0, 10.0, 20.0]);
        let unit = l2_normalize(&Array::from_slice(&[3.0f32, 4.0, 0.0, 0.0], &[2, 2])).unwrap();
        assert_eq!(unit.as_slice::<f32>(), [0.6, 0.8, 0.0, 0.0]);
    }

    #[test]
    fn padding_a_batch_does_not_change_a_rows_vector() {
        for (pooling, normalize) in [(Pooling::Mean, true), (Pooling::Cls, false)] {
            let encoder = tiny_encoder(pooling, normalize);
            let short: Vec<u32> = vec![1, 7, 3, 9, 2];
            let long: Vec<u32> = (0..19).map(|i| (i * 7 % 39) + 1).collect();
            let alone = encoder
                .embed(std::slice::from_ref(&short))
                .unwrap()
                .remove(0);
            let batched = encoder.embed(&[long.clone(), short, long]).unwrap();
            assert_eq!(batched.len(), 3);
            assert_eq!(alone.len(), 16);
            let worst = alone
                .iter()
                .zip(&batched[1])
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(worst <= 1e-5, "{pooling:?}: padded row moved by {worst}");
            let same = batched[0]
                .iter()
                .zip(&batched[2])
                .all(|(a, b)| (a - b).abs() <= 1e-6);
            assert!(same, "one input, two rows of a batch: {batched:?}");
            assert_ne!(batched[0], batched[1]);
            if normalize {
                let norm: f32 = alone.iter().map(|x| x * x).sum::<f32>().sqrt();
                assert!((norm - 1.0).abs() < 1e-5, "{norm}");
            }
        }
    }

    #[test]
    fn the_padding_mask_hides_padded_keys() {
        // Without the mask the padded row would attend to the pad tokens: a different pad id
        // would then change it.
        let mut encoder = tiny_encoder(Pooling::Mean, false);
        let batch = [vec![4u32, 5, 6], (1..15).collect()];
        let with_zero = encoder.embed(&batch).unwrap();
        encoder.pad_id = 33;
        let with_other = encoder.embed(&batch).unwrap();
        for (a, b) in with_zero[0].iter().zip(&with_other[0]) {
            assert!((a - b).abs() <= 1e-6, "{a} vs {b}");
        }
    }
}

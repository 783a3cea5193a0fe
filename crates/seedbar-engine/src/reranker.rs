//! Relevance scores from a cross-encoder: a BERT checkpoint with a sequence-classification
//! head of one label (`BertForSequenceClassification`, as sentence-transformers'
//! cross-encoders such as ms-marco-MiniLM write it). A query and a document run together as
//! one input, `[CLS] query [SEP] document [SEP]` with token types 0 and 1 (the tokenizer's
//! post-processor says how); the `[CLS]` vector goes through the pooler (dense, tanh) and the
//! classifier to one logit, and the score is its sigmoid, as sentence-transformers'
//! `CrossEncoder.predict` gives it. A pair longer than the model's positions is cut at the
//! end, its closing `[SEP]` kept. The encoder layers are `encoder`'s.

use std::path::Path;

use mlx_rs::{ops, ops::indexing::IndexOp};
use serde_json::Value;

use crate::{
    encoder::{by_length, encoder_weights, padded, Bert, EncoderConfig},
    error::{EngineError, Result},
    step::plan::Products,
    tokenizer::Tokenizer,
    weights::Linear,
};

/// Whether a `config.json` holds a sequence-classification checkpoint (a reranker).
pub fn is_reranker(config: &Value) -> bool {
    config["architectures"].as_array().is_some_and(|names| {
        names.iter().any(|n| {
            n.as_str()
                .is_some_and(|n| n.ends_with("ForSequenceClassification"))
        })
    })
}

/// Each document's score against the query, in the documents' order, and the tokens read.
#[derive(Debug, Clone)]
pub struct Scores {
    pub scores: Vec<f32>,
    pub tokens: usize,
}

/// A loaded cross-encoder with its tokenizer and length limit.
pub struct Reranker {
    bert: Bert,
    pooler: Linear,
    classifier: Linear,
    tokenizer: Tokenizer,
    max_tokens: usize,
    pad_id: u32,
}

impl Reranker {
    /// Load the cross-encoder checkpoint in `dir`.
    pub fn load(dir: &Path) -> Result<Self> {
        let (config, raw) = EncoderConfig::read(dir)?;
        let config_path = dir.join("config.json");
        if !is_reranker(&raw) {
            return Err(EngineError::bad_file(
                &config_path,
                "not a sequence-classification (reranker) checkpoint",
            ));
        }
        let labels = raw["id2label"].as_object().map_or(1, |labels| labels.len());
        if labels != 1 {
            return Err(EngineError::bad_file(
                &config_path,
                format!("{labels} labels: a reranker gives one relevance score"),
            ));
        }
        let mut weights = encoder_weights(dir)?;
        let bert = Bert::load(&config, &mut weights)?;
        let d = config.hidden_size;
        let root = if weights.contains("bert.pooler.dense.weight") {
            "bert."
        } else {
            ""
        };
        Ok(Reranker {
            pooler: weights.linear(&format!("{root}pooler.dense"), d, d, true)?,
            classifier: weights.linear("classifier", d, 1, true)?,
            bert,
            tokenizer: Tokenizer::from_file(&dir.join("tokenizer.json"))?,
            max_tokens: config.max_position_embeddings as usize,
            pad_id: config.pad_token_id,
        })
    }

    /// The most tokens a query and document take together (longer pairs are cut).
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Each of `documents`' relevance to `query`, in `(0, 1)`.
    pub fn score(&self, query: &str, documents: &[String]) -> Result<Scores> {
        let mut ids = Vec::with_capacity(documents.len());
        let mut types = Vec::with_capacity(documents.len());
        for document in documents {
            let (mut pair, mut pair_types) = self.tokenizer.encode_pair(query, document)?;
            if pair.len() > self.max_tokens {
                let (sep, sep_type) = (pair[pair.len() - 1], pair_types[pair.len() - 1]);
                pair.truncate(self.max_tokens - 1);
                pair_types.truncate(self.max_tokens - 1);
                pair.push(sep);
                pair_types.push(sep_type);
            }
            ids.push(pair);
            types.push(pair_types);
        }
        let tokens = ids.iter().map(Vec::len).sum();
        // Rows carry their types after their ids, so one length order serves both.
        let rows: Vec<Vec<u32>> = ids
            .iter()
            .zip(&types)
            .map(|(i, t)| [i.as_slice(), t.as_slice()].concat())
            .collect();
        let scores = by_length(&rows, |chunk| {
            let halves: Vec<(&[u32], &[u32])> = chunk
                .iter()
                .map(|row| row.split_at(row.len() / 2))
                .collect();
            let id_rows: Vec<&[u32]> = halves.iter().map(|(i, _)| *i).collect();
            let type_rows: Vec<&[u32]> = halves.iter().map(|(_, t)| *t).collect();
            self.score_padded(&id_rows, &type_rows)
        })?;
        Ok(Scores { scores, tokens })
    }

    fn score_padded(&self, ids: &[&[u32]], types: &[&[u32]]) -> Result<Vec<f32>> {
        let (ids, lengths) = padded(ids, self.pad_id);
        let (types, _) = padded(types, 0);
        let hidden = self.bert.forward(&ids, Some(&types), &lengths)?;
        let first = hidden.index((.., 0, ..));
        let pooled = ops::tanh(&self.pooler.forward(&first, Products::Matmul)?)?;
        let logits = self.classifier.forward(&pooled, Products::Matmul)?;
        let scores = ops::sigmoid(&logits)?;
        scores.eval()?;
        Ok(scores.as_slice::<f32>().to_vec())
    }
}
